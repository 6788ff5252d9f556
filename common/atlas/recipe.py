"""What one atlas entry is and how it runs: :class:`Entry` (its model, its input, the nodes of
its op, its calibration), the input shapes, and the two context models many rows share.

This file is part of ``run_cached``'s key (a change here recomputes every entry); the rows
themselves (``entries.py``) are not: a new row computes only itself.
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from common.graph import base_name


@dataclass(frozen=True)
class Entry:
    """One op of the atlas and the small model that holds it.

    The backends' run readers (``common.backends``) ask the entry itself for its input
    (:meth:`example_args`), its op's nodes (:meth:`holds`) and its int8 model
    (:meth:`quantized`): they import nothing of ``common.atlas``.

    Attributes:
        name: the row's name, the op as readers search for it (``max_pool2d``,
            ``add · after linear`` for a second context of one op).
        ops: the aten ops that stand for it in the graphs (``max_pool2d`` also matches the
            ``max_pool2d_with_indices`` it decomposes into).
        where: where the model puts it, in English (:func:`common.atlas.placement` says it in
            the lesson's language).
        build: a function returning the model, in eval mode, seeded.
        shape: the example input's shape (``embedding`` takes indices below 50).
        shared: an op that moves or picks values without computing new ones (pooling by max,
            cat, layout ops): int8 passes through it with the same scale and zero point.
    """

    name: str
    ops: tuple
    where: str
    build: Callable[[], nn.Module]
    shape: tuple
    shared: bool = False

    @property
    def op(self) -> str:
        """The aten op's name (``add`` for ``add · after linear``)."""
        return self.name.split(" ")[0]

    def example_args(self, *, seed: int = 0) -> tuple:
        """Random values of the entry's shape (indices below 50 for ``embedding``)."""
        generator = torch.Generator().manual_seed(seed)
        if self.op == "embedding":
            return (torch.randint(0, 50, self.shape, generator=generator),)
        return (torch.randn(self.shape, generator=generator),)

    def holds(self, node) -> bool:
        """Whether ``node`` stands for the entry's op (a call of one of :attr:`ops`)."""
        if node.op != "call_function":
            return False
        name = base_name(node.target)
        return any(name.lstrip("_").startswith(op) for op in self.ops)

    def quantized(self, quantizer, *, fold_quantize: bool = True):
        """Export the entry's model, prepare it for ``quantizer``, calibrate on 2 batches,
        convert."""
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        args = self.example_args()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # x86's "input of maxpool2d is not quantized, skip"
            exported = torch.export.export(self.build(), args).module()
            prepared = prepare_pt2e(exported, quantizer)
            for seed in range(2):
                prepared(*self.example_args(seed=seed))
            return convert_pt2e(prepared, fold_quantize=fold_quantize)


def example_args(item: Entry, *, seed: int = 0) -> tuple:
    """The example input of an entry: random values of its shape (indices for ``embedding``)."""
    return item.example_args(seed=seed)


# --- The shapes and the context models many rows share ----------------------------------------

IMAGE = (2, 8, 8, 8)
SEQUENCE = (2, 6, 16)
TOKENS = (12, 16)
SIGNAL = (2, 8, 16)


class BetweenConvs(nn.Module):
    """conv 3×3 → op → conv 1×1, on 8 channels."""

    def __init__(self, op: nn.Module, channels_after: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.op = op
        self.conv2 = nn.Conv2d(channels_after, 8, 1)

    def forward(self, x):
        return self.conv2(self.op(self.conv1(x)))


class BetweenLinears(nn.Module):
    """linear → op → linear, on 16 features of a (batch, tokens, 16) sequence."""

    def __init__(self, op: nn.Module, features_after: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.op = op
        self.fc2 = nn.Linear(features_after, 16)

    def forward(self, x):
        return self.fc2(self.op(self.fc1(x)))
