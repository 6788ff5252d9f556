"""M04-4's real architecture and a QAT run that can stop and resume in another process.

A QAT run resumed from a checkpoint must rebuild the prepared model *the same way* as the run
that saved it: the same model, the same example input, the same quantizer. The pieces that
must not differ between the two processes live here, so the lesson and the fresh process it
starts call the same code:

- ``digits_mobilenet_v2()``: torchvision's MobileNetV2 (``common.vision_models``) at half
  width and five stages, a one-channel stem, behind a 4× nearest upscale (8×8 digits → 32×32);
  ``train_digits_mobilenet_v2()`` trains it, cached as ``common.data``'s models are.
- ``qat_quantizer()``: ``XNNPACKQuantizer`` with the QAT config, per-tensor weights.
- ``prepare(model)``: export in train mode with a dynamic batch, ``prepare_qat_pt2e``.
- ``train_epoch(model, optimizer, epoch)``: one deterministic epoch (one thread, the batch
  order drawn from ``epoch``).
- ``fine_tune_float(model, learning_rates)``: the float control of a QAT run, the same schedule
  in float, with its accuracy on the validation split after every epoch; cached.
- ``freeze_batch_norm(gm)``: every BatchNorm on its running statistics (``batch_norms(gm)``).
- ``fingerprint(*state_dicts)``: a hash of every tensor, to compare two runs bit for bit.
"""

import copy
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from common.cache import cached_path
from common.cpu import describe
from common.data import (
    _reproducible,
    _trained,
    accuracy,
    digits,
    export_digits_model,
    train_pass,
)
from common.digest import digest
from common.vision_models import MobileNetV2

__all__ = [
    "EPOCHS",
    "SIZE",
    "STAGES",
    "WIDTH",
    "batch_norms",
    "digits_mobilenet_v2",
    "fine_tune_float",
    "fingerprint",
    "freeze_batch_norm",
    "prepare",
    "qat_quantizer",
    "train_digits_mobilenet_v2",
    "train_epoch",
]

#: The upscaled image's side: 8×8 digits → 32×32, nearest neighbour.
SIZE = 32
#: MobileNetV2's ``width_mult``.
WIDTH = 0.5
#: MobileNetV2's stages (expansion t, channels c, repeats n, first stride s): torchvision's
#: first five, each repeated at most twice, so one thread trains it in seconds per epoch.
STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 2, 2), (6, 96, 1, 1))
#: Float epochs ``train_digits_mobilenet_v2`` trains for by default.
EPOCHS = 8
_SOURCES = (Path(__file__), Path(__file__).with_name("data.py"))
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def digits_mobilenet_v2() -> nn.Sequential:
    """A MobileNetV2 for ``(N, 1, 8, 8)`` digits: ``upscale`` (4× nearest) then ``net``.

    ``net`` is ``common.vision_models.MobileNetV2(10, WIDTH, STAGES)`` whose first conv takes
    one channel (the digits are grey), as one adapts a torchvision model to grey images.
    """
    net = MobileNetV2(num_classes=10, width_mult=WIDTH, inverted_residual_setting=STAGES)
    stem = net.features[0][0]
    net.features[0][0] = nn.Conv2d(1, stem.out_channels, 3, 2, 1, bias=False)
    return nn.Sequential(OrderedDict(upscale=nn.Upsample(scale_factor=SIZE // 8), net=net))


def train_digits_mobilenet_v2(
    *, seed: int = 0, epochs: int = EPOCHS, cache: bool = True
) -> nn.Sequential:
    """Return :func:`digits_mobilenet_v2` trained on the digits' train split, in eval mode.

    Deterministic and cached as ``common.data.train_digits_cnn``: keyed by this module's and
    ``common.data``'s source (the architecture and the training), the stack, the CPU's kernel
    path and the arguments.
    """
    from common import vision_models

    name = f"digits_mobilenet_v2-{digest(*_SOURCES, Path(vision_models.__file__))}"
    # The classifier's dropout draws from the global RNG while training: seeded here, else
    # the weights would depend on what the process drew before.
    rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return _trained(digits_mobilenet_v2, name, seed=seed, epochs=epochs, cache=cache)
    finally:
        torch.random.set_rng_state(rng)


def qat_quantizer():
    """``XNNPACKQuantizer`` with ExecuTorch's symmetric QAT config, one scale per weight tensor."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=False, is_qat=True)
    return XNNPACKQuantizer().set_global(config)


def prepare(model: nn.Module, quantizer=None) -> torch.fx.GraphModule:
    """Export a copy of ``model`` in train mode (dynamic batch) and ``prepare_qat_pt2e`` it.

    Args:
        model: a digits model; it is copied, not changed.
        quantizer: by default :func:`qat_quantizer`'s.
    """
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    exported = export_digits_model(copy.deepcopy(model).train())
    return prepare_qat_pt2e(exported, quantizer or qat_quantizer())


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> float:
    """One epoch over the train split in batches of 32, in an order drawn from ``epoch``.

    One thread and deterministic algorithms (``common.data.fit``'s settings), and the global
    RNG, which dropout draws from, seeded with ``epoch`` (the caller's state restored after):
    the same state in, on the same kernel path, gives the same state out bit for bit, in any
    process. Returns the mean loss.
    """
    _, labels = digits("train")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
    with _reproducible():
        torch.manual_seed(epoch)
        return train_pass(model, optimizer, order)


def fine_tune_float(
    model: nn.Module, learning_rates: Sequence[float], *, frozen_from: int = 1, cache: bool = True
) -> tuple[nn.Module, list[float]]:
    """The float control of a QAT run: a copy of ``model`` fine-tuned in float on its schedule.

    One :func:`train_epoch` per learning rate (epoch ``i`` at ``learning_rates[i]``, Adam, the
    QAT run's batches and dropout draws), every BatchNorm on its running statistics, and
    keeping them, from epoch ``frozen_from`` on (what :func:`freeze_batch_norm` does to the
    prepared graph). After each epoch the copy's accuracy on the calibration split is
    measured: the validation split, whose labels no training step reads.

    Deterministic and cached as :func:`train_digits_mobilenet_v2`: keyed by ``model`` (its code
    and weights), the schedule, this module's and ``common.data``'s source, the stack and the
    CPU's kernel path.

    Args:
        model: a trained digits model; it is copied, not changed.
        learning_rates: one per epoch.
        frozen_from: the first epoch (counted from 0) with every BatchNorm frozen.
        cache: set ``False`` to train afresh and leave the cache alone.

    Returns:
        tuple: the fine-tuned copy, in eval mode, and its validation accuracy after each epoch.

    Raises:
        ValueError: if ``learning_rates`` is empty or ``frozen_from`` is not an epoch of it.

    >>> fine_tune_float(nn.Linear(64, 10), [])
    Traceback (most recent call last):
    ...
    ValueError: learning_rates is empty: give one learning rate per epoch
    """
    rates = [float(rate) for rate in learning_rates]
    if not rates:
        raise ValueError("learning_rates is empty: give one learning rate per epoch")
    if isinstance(frozen_from, bool) or frozen_from not in range(len(rates) + 1):
        last = len(rates)
        raise ValueError(f"frozen_from must be an epoch from 0 to {last}, got {frozen_from!r}")
    tuned = copy.deepcopy(model)

    def train() -> list[float]:
        optimizer = torch.optim.Adam(tuned.parameters(), lr=rates[0])
        validation = []
        for epoch, rate in enumerate(rates):
            for group in optimizer.param_groups:
                group["lr"] = rate
            tuned.train()  # every BatchNorm too: frozen again below, each epoch
            for module in tuned.modules():
                if isinstance(module, _BATCH_NORMS) and epoch >= frozen_from:
                    module.eval()
            train_epoch(tuned, optimizer, epoch=epoch)
            validation.append(accuracy(tuned.eval(), "calibration"))
        return validation

    if not cache:
        return tuned, train()

    def make(path: Path) -> None:
        validation = train()
        torch.save({"state": tuned.state_dict(), "validation": validation}, path)

    key = digest(model, rates, frozen_from, *_SOURCES)
    path = cached_path("weights", f"float_fine_tune-{key}-{describe().kernel_path}.pt", make)
    saved = torch.load(path, weights_only=True)
    tuned.load_state_dict(saved["state"])
    return tuned.eval(), saved["validation"]


def batch_norms(gm: torch.fx.GraphModule) -> list:
    """The graph's BatchNorm nodes; args: input, weight, bias, mean, var, training, ..."""
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.batch_norm.default]


def freeze_batch_norm(gm: torch.fx.GraphModule) -> None:
    """Make every BatchNorm of ``gm`` normalize with, and keep, its running statistics.

    The flag is an argument in the graph, not a buffer: a checkpoint does not hold it, so a
    resumed run applies it again (as M04-3's ``freeze_batch_norm``).
    """
    for node in batch_norms(gm):
        node.args = (*node.args[:5], False, *node.args[6:])
    gm.recompile()


def fingerprint(*state_dicts: dict) -> str:
    """SHA-256 of every key and every tensor's bytes (nested dicts and lists walked in order)."""
    sha = hashlib.sha256()

    def walk(value):
        if isinstance(value, torch.Tensor):
            sha.update(str((value.dtype, tuple(value.shape))).encode())
            sha.update(
                value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
            )
        elif isinstance(value, dict):
            for key in value:
                sha.update(repr(key).encode())
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        else:
            sha.update(repr(value).encode())

    for state in state_dicts:
        walk(state)
    return sha.hexdigest()
