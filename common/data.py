"""Real data for the accuracy lessons: scikit-learn's bundled digits and a CNN trained on them."""

import contextlib
from pathlib import Path

import torch
from torch import nn

from common.cache import cached_path
from common.cpu import describe
from common.digest import digest

__all__ = [
    "SPLITS",
    "DigitsCNN",
    "accuracy",
    "digits",
    "export_digits_model",
    "fit",
    "train_digits_cnn",
    "train_digits_vit",
    "train_pass",
]

#: Images per split. The 1,797 digits are shuffled once (seed 0) and cut in this order.
SPLITS = {"train": 1097, "calibration": 200, "test": 500}
#: Epochs ``train_digits_cnn`` trains for by default.
EPOCHS = 6
#: Epochs ``train_digits_vit`` trains for by default, and its learning rate.
VIT_EPOCHS = 20
_VIT_LEARNING_RATE = 3e-3
_BATCH = 32
_LEARNING_RATE = 3e-3
# Training code and cache key: any edit to this file trains afresh.
_SOURCE = Path(__file__)


class DigitsCNN(nn.Module):
    """Three conv + BatchNorm + ReLU blocks and two linear layers, for 1×8×8 digit images.

    conv1 (1→8) → conv2 (8→16) → 2×2 max pool → conv3 (16→16) → fc1 (256→32) → fc2 (32→10),
    every width but the input's and the output's multiplied by ``width``. Every activation
    has its own ``nn.ReLU`` (PT2E annotates each use separately).

    Args:
        width: multiplies the channels and fc1's features. 1 (the default) is the course's
            small model; int8 kernels need wider layers to pay (the quickstart uses 8:
            64 and 128 channels fill 64-byte int8 vectors).
    """

    def __init__(self, width: int = 1):
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        c1, c2, features = 8 * width, 16 * width, 32 * width
        self.conv1 = nn.Conv2d(1, c1, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(c2, c2, kernel_size=3, padding=1)
        self.bn3 = nn.BatchNorm2d(c2)
        self.relu3 = nn.ReLU()
        self.fc1 = nn.Linear(c2 * 4 * 4, features)
        self.relu4 = nn.ReLU()
        self.fc2 = nn.Linear(features, 10)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.relu2(self.bn2(self.conv2(x))))
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.fc2(self.relu4(self.fc1(torch.flatten(x, 1))))


def digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(images, labels)`` of one split of scikit-learn's bundled digits.

    The data ships inside scikit-learn (no download). Pixels 0..16 are scaled to 0..1.

    Args:
        split: ``"train"``, ``"calibration"`` or ``"test"`` (sizes in :data:`SPLITS`).

    Returns:
        tuple: ``images``, float32 of shape ``(N, 1, 8, 8)``, and ``labels``, int64 of shape
        ``(N,)``. The same split gives the same tensors in every process.

    Raises:
        ValueError: if ``split`` is not one of the three names.

    >>> images, labels = digits("test")
    >>> images.shape, labels.shape
    (torch.Size([500, 1, 8, 8]), torch.Size([500]))
    >>> digits("validation")
    Traceback (most recent call last):
    ...
    ValueError: unknown split 'validation' (one of: train, calibration, test)
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (one of: {', '.join(SPLITS)})")
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    start = 0
    for name, size in SPLITS.items():
        if name == split:
            chosen = order[start : start + size]
            return images[chosen], labels[chosen]
        start += size
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _reproducible():
    """One thread and deterministic algorithms while training, the caller's settings after.

    Float sums split over threads round differently, so the thread count would change the
    weights; one thread also trains this small model fastest.
    """
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    rng = torch.random.get_rng_state()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)


def fit(model: nn.Module, *, epochs: int, seed: int = 0, lr: float = _LEARNING_RATE) -> list:
    """Train ``model`` on the train split with Adam and cross-entropy, deterministically.

    The model is trained in the mode it is in: call ``model.train()`` first (or, for an
    exported model, ``move_exported_model_to_train``). Batches of 32 come in an order drawn
    from ``seed``; training runs on one thread with deterministic algorithms, and the caller's
    thread count and RNG state are restored afterwards.

    Args:
        model: any module mapping ``(N, 1, 8, 8)`` images to 10 logits, including an
            exported ``GraphModule`` with a dynamic batch dimension.
        epochs: passes over the train split, at least 1.
        seed: picks the order of the batches.
        lr: Adam's learning rate.

    Returns:
        list: the mean training loss of each epoch.

    Raises:
        ValueError: if ``epochs`` is not a positive integer.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    _, labels = digits("train")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    with _reproducible():
        for _ in range(epochs):
            order = torch.randperm(len(labels), generator=generator)
            losses.append(train_pass(model, optimizer, order))
    return losses


def train_pass(model: nn.Module, optimizer: torch.optim.Optimizer, order: torch.Tensor) -> float:
    """One pass over the train split's images in ``order``, in batches of 32: cross-entropy,
    backward, ``optimizer.step()``; the mean loss. The one training loop of ``fit`` and of
    ``common.qat.train_epoch``; run it inside their one-thread, deterministic settings."""
    images, labels = digits("train")
    total = 0.0
    for start in range(0, len(order), _BATCH):
        batch = order[start : start + _BATCH]
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(batch)
    return total / len(order)


def train_digits_cnn(
    *, width: int = 1, seed: int = 0, epochs: int = EPOCHS, cache: bool = True
) -> DigitsCNN:
    """Return a :class:`DigitsCNN` of ``width`` trained on the train split, in eval mode.

    Training is deterministic per kernel path: the same ``seed`` and ``epochs`` give the same
    weights bit for bit in any process whose CPU takes the same float kernels
    (``common.cpu.describe().kernel_path``; AVX2 and AVX-512 kernels round differently, so
    they train slightly different weights). The weights are kept in the course's cache
    (``build/cache/`` in a source checkout, ``common.cache.cache_folder``), keyed by this
    module's source, the stack's versions, the kernel path and the arguments, so later calls
    (other lessons, the other language's build, the tests) load them instead of training
    again.

    Args:
        width: the model's width multiplier (:class:`DigitsCNN`).
        seed: seeds the initial weights and the order of the batches.
        epochs: passes over the train split.
        cache: set ``False`` to train afresh and leave the cache alone.

    Returns:
        DigitsCNN: the trained model, in eval mode.

    Raises:
        ValueError: if ``width`` or ``epochs`` is not a positive integer or ``seed`` not an
            integer.
    """
    name = f"digits_cnn-{digest(_SOURCE)}" + (f"-w{width}" if width != 1 else "")
    return _trained(lambda: DigitsCNN(width), name, seed=seed, epochs=epochs, cache=cache)


def _trained(make, name: str, *, seed, epochs, cache: bool, lr: float = _LEARNING_RATE):
    """``make()`` seeded, then its weights from the course's cache or trained and kept there.

    The file is ``weights/<name>-<kernel path>-s<seed>-e<epochs>.pt`` in
    ``common.cache.cache_folder()`` (``name`` holds a digest of the source and the stack):
    float kernels of different ISAs round differently, so they train different weights.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    with _reproducible():
        torch.manual_seed(seed)  # nn layers draw their initial weights from the global RNG
        model = make()
    if not cache:
        fit(model.train(), epochs=epochs, seed=seed, lr=lr)
        return model.eval()

    def train(path: Path) -> None:
        fit(model.train(), epochs=epochs, seed=seed, lr=lr)
        torch.save(model.state_dict(), path)

    kernels = describe().kernel_path
    path = cached_path("weights", f"{name}-{kernels}-s{seed}-e{epochs}.pt", train)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def export_digits_model(model: nn.Module) -> torch.fx.GraphModule:
    """Export a digits model with a dynamic batch dimension; return its ``GraphModule``.

    ``torch.export`` would otherwise fix the batch size to that of the example, and the
    lessons feed the same graph calibration sets, test sets and training batches of
    different sizes.

    Args:
        model: a module taking ``(N, 1, 8, 8)`` images, in the mode it should be exported in.

    Returns:
        torch.fx.GraphModule: ``torch.export.export(...).module()`` accepting any batch size.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"export_digits_model needs an nn.Module, got {type(model).__name__}")
    example = (digits("calibration")[0][:2],)
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, example, dynamic_shapes=({0: batch},))
    return program.module()


def accuracy(model: nn.Module, split: str = "test") -> float:
    """Return the fraction of ``split``'s images that ``model`` classifies correctly.

    The whole split goes through ``model`` as one batch, under ``torch.no_grad()``.

    Args:
        model: a module (eager or exported with a dynamic batch) returning 10 logits per image.
        split: ``"train"``, ``"calibration"`` or ``"test"``.

    Returns:
        float: correct / total, between 0 and 1.

    Raises:
        ValueError: if ``split`` is unknown.
    """
    images, labels = digits(split)
    with torch.no_grad():
        predicted = model(images).argmax(dim=1)
    return (predicted == labels).float().mean().item()


def train_digits_vit(
    *, attention: str = "sdpa", seed: int = 0, epochs: int = VIT_EPOCHS, cache: bool = True
):
    """Return a :class:`common.models.DigitsViT` trained on the train split, in eval mode.

    Deterministic as :func:`train_digits_cnn`: the same arguments give the same weights bit
    for bit on the same kernel path. The weights are kept in the course's cache (as
    :func:`train_digits_cnn`'s), keyed by the source of this module and of ``common.models``,
    the stack's versions, the CPU's kernel path (``common.cpu.describe().kernel_path``:
    float kernels of different ISAs round differently) and the arguments.

    Args:
        attention: ``"sdpa"`` (separate q/k/v linears) or ``"mha"``
            (``nn.MultiheadAttention``), see :data:`common.models.ATTENTION_STYLES`.
        seed: seeds the initial weights and the order of the batches.
        epochs: passes over the train split.
        cache: set ``False`` to train afresh and leave the cache alone.

    Returns:
        DigitsViT: the trained model, in eval mode.

    Raises:
        ValueError: if ``attention`` is unknown, ``seed`` is not an integer or ``epochs`` not
            a positive integer.
    """
    from common import models

    return _trained(
        lambda: models.DigitsViT(attention=attention),
        f"digits_vit_{attention}-{digest(_SOURCE, Path(models.__file__))}",
        seed=seed,
        epochs=epochs,
        cache=cache,
        lr=_VIT_LEARNING_RATE,
    )
