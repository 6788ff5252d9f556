"""The op atlas: one small model per op, through every quantizer that runs here, to what ran it.

Each :class:`Entry` is a model built around one op the way real models meet it (between two
convs, after a linear, as a classifier head). :func:`run_entry` quantizes it with each
quantizer and follows it to where it runs:

- **x86** (``X86InductorQuantizer``): ``lower_pt2e_quantized_to_x86`` (inductor's freezing
  passes), the lowered graph run once under :func:`common.kernels.kernels_run`: the oneDNN
  kernel the op runs in (with the op as its post-op when fused), or the loop inductor writes
  for it, on uint8 (dequantize → op → quantize) or float values.
- **XNNPACK** (``XNNPACKQuantizer``): ``to_edge_transform_and_lower`` with ExecuTorch's
  ``XnnpackPartitioner``: the op inside an XNNPACK delegate, or left to the portable
  kernels, with the constraint XNNPACK's partitioner logged for it.
- **OpenVINO** (``OpenVINOQuantizer``): the q/dq program converted and compiled for the CPU
  plugin; the runtime model's ``runtimePrecision`` of the layers that hold the op.
- **Arm** (``ArmInductorQuantizer``): what it annotates only: nothing runs its int8 graph on
  an x86 machine.

The annotation of each op is read from the converted graph: ``int8`` (its inputs are
dequantized int8 and, unless it is a conv, linear or matmul, its output is quantized again),
``int8 shared`` (the same scale and zero point out as in: max-pool, cat, layout ops),
``int8 fused`` (it reads the float output of the int8 conv or linear before it, its own output
quantized: a post-op), or ``float``. The results are plain data (``dict``), so a page may
cache them.
"""

import contextlib
import copy
import io
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ENTRIES",
    "IMAGE",
    "QUANTIZERS",
    "TOKENS",
    "BetweenConvs",
    "BetweenLinears",
    "Entry",
    "annotation",
    "entry",
    "example_args",
    "make_quantizer",
    "nodes_of",
    "openvino_runs",
    "quantize",
    "reported",
    "run_cached",
    "run_entry",
    "x86_compiled",
    "x86_runs",
    "xnnpack_runs",
]

# As imported: the reading code run_cached's key names (the compiled runs have their own key).
_SOURCE = Path(__file__).read_text().split("\n\n\n# --- Compiled x86 runs")[0] + "\n"

#: The quantizers of the atlas, in its columns' order.
QUANTIZERS = ("x86", "xnnpack", "openvino", "arm")

_Q = "quantize_per_tensor"
_DQ = ("dequantize_per_tensor", "dequantize_per_channel")
#: Ops whose value is computed from int8 inputs even when their output is left float.
_COMPUTE = {
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "linear",
    "matmul",
    "bmm",
    "scaled_dot_product_attention",
    "embedding",
    "lstm",
    "gru",
}


@dataclass(frozen=True)
class Entry:
    """One op of the atlas and the small model that holds it.

    Attributes:
        name: the row's name, the op as readers search for it (``max_pool2d``,
            ``add · after linear`` for a second context of one op).
        ops: the aten ops that stand for it in the graphs (``max_pool2d`` also matches the
            ``max_pool2d_with_indices`` it decomposes into).
        where: where the model puts it (English; the pages say it in their language).
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


# --- The models: the op between the layers it meets in real models --------------------------

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


class _Head(nn.Module):
    """conv → op (to one vector per image) → linear: a classifier's head."""

    def __init__(self, op: nn.Module):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.op = op
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.op(self.conv(x)))


class _Lambda(nn.Module):
    """A function as a module (``torch.flatten(x, 1)``, ``x.mean((2, 3))``)."""

    def __init__(self, function: Callable, label: str):
        super().__init__()
        self.function, self.label = function, label

    def forward(self, x):
        return self.function(x)

    def extra_repr(self) -> str:
        return self.label


class _TwoConvs(nn.Module):
    """Two convs on one input, combined by the op (``mul``, ``cat``, ``sub``), then a conv."""

    def __init__(self, combine: Callable, channels_after: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.combine = combine
        self.conv3 = nn.Conv2d(channels_after, 8, 1)

    def forward(self, x):
        return self.conv3(self.combine(self.conv1(x), self.conv2(x)))


class _Residual(nn.Module):
    """x + layer(x), then a ReLU and a conv (a ResNet block's end; a transformer's FFN)."""

    def __init__(self, layer: nn.Module, after: nn.Module):
        super().__init__()
        self.layer, self.relu, self.after = layer, nn.ReLU(), after

    def forward(self, x):
        return self.after(self.relu(self.layer(x) + x))


class _Attention(nn.Module):
    """q, k, v linears; the op; an output linear."""

    def __init__(self, kind: str):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(16, 16) for _ in range(4))
        self.kind = kind

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.kind == "sdpa":
            return self.out(F.scaled_dot_product_attention(q, k, v))
        if self.kind == "bmm":
            return self.out(torch.bmm(torch.bmm(q, k.transpose(1, 2)), v))
        return self.out(torch.matmul(torch.matmul(q, k.transpose(1, 2)), v))


class _LayerScale(nn.Module):
    """conv → a learned per-channel scale (ConvNeXt's layer scale) → conv."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.gamma = nn.Parameter(torch.full((8, 1, 1), 0.1))

    def forward(self, x):
        return self.conv2(self.gamma * self.conv1(x))


class _Split(nn.Module):
    """conv → split in two along channels → a conv on each half, added."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.left, self.right = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 1)

    def forward(self, x):
        a, b = torch.split(self.conv(x), 4, dim=1)
        return self.left(a) + self.right(b)


class _Recurrent(nn.Module):
    """linear → LSTM or GRU → linear on its outputs."""

    def __init__(self, cell: type):
        super().__init__()
        self.fc1, self.rnn, self.fc2 = (
            nn.Linear(16, 16),
            cell(16, 16, batch_first=True),
            nn.Linear(16, 16),
        )

    def forward(self, x):
        return self.fc2(self.rnn(self.fc1(x))[0])


class _Embedding(nn.Module):
    """embedding → linear (a token classifier's first layers)."""

    def __init__(self):
        super().__init__()
        self.embed, self.fc = nn.Embedding(50, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(self.embed(x))


class _Signal(nn.Module):
    """conv1d (+ ReLU) → op → linear: a 1-D keyword spotter's end."""

    def __init__(self, op: nn.Module, features: int):
        super().__init__()
        self.conv, self.relu, self.op = nn.Conv1d(8, 8, 3, padding=1), nn.ReLU(), op
        self.fc = nn.Linear(features, 4)

    def forward(self, x):
        return self.fc(self.op(self.relu(self.conv(x))))


class _Permute(nn.Module):
    """conv → permute to channels-last → linear (ConvNeXt's pointwise layers)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(8, 8, 7, padding=3, groups=8), nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.conv(x).permute(0, 2, 3, 1))


class _Transpose(nn.Module):
    """linear → transpose(1, 2) → conv1d (a conformer's feed-forward into its conv module)."""

    def __init__(self):
        super().__init__()
        self.fc, self.conv = nn.Linear(16, 16), nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.conv(self.fc(x).transpose(1, 2))


class _Gate(nn.Module):
    """conv → gate(conv) * the conv's output → conv: a squeeze-excitation style gate."""

    def __init__(self, gate: nn.Module):
        super().__init__()
        self.conv1, self.squeeze, self.gate = (
            nn.Conv2d(8, 8, 3, padding=1),
            nn.Conv2d(8, 8, 1),
            gate,
        )
        self.conv2 = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = self.conv1(x)
        return self.conv2(y * self.gate(self.squeeze(y)))


def _lam(function: Callable, label: str) -> nn.Module:
    return _Lambda(function, label)


def _spec(name, ops, where, build, shape=IMAGE, *, shared=False) -> Entry:
    def seeded():
        torch.manual_seed(0)
        return build().eval()

    return Entry(name, tuple(ops), where, seeded, shape, shared)


#: The atlas's rows, grouped: compute ops, binary ops, pass-through ops, reductions,
#: activations, norms, resampling, layout ops, recurrent layers.
ENTRIES: tuple = (
    # compute
    _spec("conv1d", ["conv1d"], "alone", lambda: nn.Conv1d(8, 8, 3, padding=1), SIGNAL),
    _spec("conv2d", ["conv2d"], "alone", lambda: nn.Conv2d(8, 8, 3, padding=1)),
    _spec(
        "conv2d · depthwise",
        ["conv2d"],
        "groups = channels (MobileNet, ConvNeXt)",
        lambda: nn.Conv2d(8, 8, 7, padding=3, groups=8),
    ),
    _spec(
        "conv_transpose2d",
        ["conv_transpose2d", "convolution_transpose"],
        "between convs, k = stride = 2 (U-Net's up path)",
        lambda: BetweenConvs(nn.ConvTranspose2d(8, 8, 2, stride=2)),
    ),
    _spec("linear", ["linear"], "alone", lambda: nn.Linear(16, 16), TOKENS),
    _spec(
        "matmul", ["matmul", "bmm"], "q @ kᵀ @ v of linears", lambda: _Attention("matmul"), SEQUENCE
    ),
    _spec("bmm", ["bmm"], "q @ kᵀ @ v of linears", lambda: _Attention("bmm"), SEQUENCE),
    _spec(
        "scaled_dot_product_attention",
        ["scaled_dot_product_attention"],
        "on q, k, v linears",
        lambda: _Attention("sdpa"),
        SEQUENCE,
    ),
    _spec("embedding", ["embedding"], "before a linear", _Embedding, (12,)),
    # binary
    _spec(
        "add · after conv",
        ["add"],
        "conv(x) + x, then ReLU (ResNet)",
        lambda: _Residual(nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)),
    ),
    _spec(
        "add · after linear",
        ["add"],
        "linear(x) + x, then ReLU (a transformer's residual)",
        lambda: _Residual(nn.Linear(16, 16), nn.Linear(16, 16)),
        TOKENS,
    ),
    _spec("sub", ["sub"], "conv(x) − conv(x)", lambda: _TwoConvs(torch.sub)),
    _spec("mul", ["mul"], "conv(x) × conv(x)", lambda: _TwoConvs(torch.mul)),
    _spec("mul · layer scale", ["mul"], "γ × conv(x) (ConvNeXt)", _LayerScale),
    _spec(
        "div",
        ["div"],
        "conv(x) / 2 between convs",
        lambda: BetweenConvs(_lam(lambda t: t / 2, "/ 2")),
    ),
    _spec(
        "cat",
        ["cat"],
        "two convs' outputs (U-Net's skip)",
        lambda: _TwoConvs(lambda a, b: torch.cat([a, b], 1), 16),
        shared=True,
    ),
    # pooling and reductions
    _spec(
        "max_pool2d",
        ["max_pool2d"],
        "conv → ReLU → max-pool → conv (ResNet's stem)",
        lambda: BetweenConvs(nn.Sequential(nn.ReLU(), nn.MaxPool2d(2))),
        shared=True,
    ),
    _spec(
        "avg_pool2d",
        ["avg_pool2d"],
        "between convs (DenseNet)",
        lambda: BetweenConvs(nn.AvgPool2d(2)),
    ),
    _spec(
        "adaptive_avg_pool2d",
        ["adaptive_avg_pool2d", "_adaptive_avg_pool2d"],
        "conv → pool → flatten → linear (ResNet's head)",
        lambda: _Head(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())),
    ),
    _spec(
        "mean · H, W",
        ["mean"],
        "conv → x.mean((2, 3)) → linear (a head)",
        lambda: _Head(_lam(lambda t: t.mean((2, 3)), "mean((2, 3))")),
    ),
    _spec(
        "mean · keepdim",
        ["mean"],
        "conv → x.mean((2, 3), keepdim=True) → conv",
        lambda: BetweenConvs(_lam(lambda t: t.mean((2, 3), keepdim=True), "mean keepdim")),
    ),
    _spec(
        "mean · last axis",
        ["mean"],
        "conv1d → ReLU → x.mean(-1) → linear (a keyword spotter)",
        lambda: _Signal(_lam(lambda t: t.mean(-1), "mean(-1)"), 8),
        SIGNAL,
    ),
    _spec(
        "sum",
        ["sum"],
        "conv → x.sum((2, 3)) → linear",
        lambda: _Head(_lam(lambda t: t.sum((2, 3)), "sum((2, 3))")),
    ),
    # activations
    _spec("relu", ["relu"], "between convs", lambda: BetweenConvs(nn.ReLU())),
    _spec(
        "relu · after linear",
        ["relu"],
        "between linears (an MLP)",
        lambda: BetweenLinears(nn.ReLU()),
        TOKENS,
    ),
    _spec(
        "hardtanh",
        ["hardtanh"],
        "nn.ReLU6 between convs (MobileNetV2)",
        lambda: BetweenConvs(nn.ReLU6()),
    ),
    _spec(
        "leaky_relu",
        ["leaky_relu"],
        "between convs (YOLOv3)",
        lambda: BetweenConvs(nn.LeakyReLU(0.1)),
    ),
    _spec(
        "gelu",
        ["gelu"],
        "between linears (a transformer's FFN)",
        lambda: BetweenLinears(nn.GELU()),
        TOKENS,
    ),
    _spec("gelu · after conv", ["gelu"], "between convs", lambda: BetweenConvs(nn.GELU())),
    _spec("silu", ["silu"], "between convs (EfficientNet)", lambda: BetweenConvs(nn.SiLU())),
    _spec("mish", ["mish"], "between convs (YOLOv4)", lambda: BetweenConvs(nn.Mish())),
    _spec(
        "hardswish",
        ["hardswish"],
        "between convs (MobileNetV3)",
        lambda: BetweenConvs(nn.Hardswish()),
    ),
    _spec(
        "hardsigmoid",
        ["hardsigmoid"],
        "an SE gate: y × hardsigmoid(conv(y)) (MobileNetV3)",
        lambda: _Gate(nn.Hardsigmoid()),
    ),
    _spec(
        "sigmoid",
        ["sigmoid"],
        "an SE gate: y × sigmoid(conv(y)) (EfficientNet)",
        lambda: _Gate(nn.Sigmoid()),
    ),
    _spec("tanh", ["tanh"], "between linears", lambda: BetweenLinears(nn.Tanh()), TOKENS),
    _spec(
        "softmax",
        ["softmax"],
        "between linears, last axis",
        lambda: BetweenLinears(nn.Softmax(-1)),
        TOKENS,
    ),
    _spec(
        "clamp",
        ["clamp"],
        "x.clamp(-1, 1) between convs",
        lambda: BetweenConvs(_lam(lambda t: t.clamp(-1, 1), "clamp(-1, 1)")),
    ),
    # norms
    _spec(
        "layer_norm",
        ["layer_norm"],
        "between linears (a transformer)",
        lambda: BetweenLinears(nn.LayerNorm(16)),
        TOKENS,
    ),
    _spec("group_norm", ["group_norm"], "between convs", lambda: BetweenConvs(nn.GroupNorm(2, 8))),
    _spec(
        "batch_norm",
        ["batch_norm"],
        "conv → ReLU → BatchNorm → conv (not foldable)",
        lambda: BetweenConvs(nn.Sequential(nn.ReLU(), nn.BatchNorm2d(8))),
    ),
    # resampling
    _spec(
        "upsample_nearest2d",
        ["upsample_nearest2d"],
        "between convs (U-Net, FPN)",
        lambda: BetweenConvs(nn.Upsample(scale_factor=2, mode="nearest")),
    ),
    _spec(
        "upsample_bilinear2d",
        ["upsample_bilinear2d"],
        "between convs (segmentation heads)",
        lambda: BetweenConvs(nn.Upsample(scale_factor=2, mode="bilinear")),
    ),
    _spec(
        "pixel_shuffle",
        ["pixel_shuffle"],
        "between convs (super-resolution)",
        lambda: BetweenConvs(nn.PixelShuffle(2), 2),
    ),
    # layout and slicing
    _spec(
        "pad",
        ["pad", "constant_pad_nd"],
        "F.pad between convs",
        lambda: BetweenConvs(_lam(lambda t: F.pad(t, (1, 1, 1, 1)), "pad 1"), 8),
    ),
    _spec(
        "flatten",
        ["flatten"],
        "conv → flatten → linear",
        lambda: nn.Sequential(nn.Conv2d(8, 2, 3, padding=1), nn.Flatten(), nn.Linear(128, 4)),
        shared=True,
    ),
    _spec(
        "reshape",
        ["reshape", "view"],
        "between linears",
        lambda: BetweenLinears(_lam(lambda t: t.reshape(12, 4, 4).reshape(12, 16), "reshape")),
        TOKENS,
        shared=True,
    ),
    _spec("permute", ["permute"], "conv → permute → linear (ConvNeXt)", _Permute, shared=True),
    _spec(
        "transpose",
        ["transpose"],
        "linear → transpose → conv1d (Conformer)",
        _Transpose,
        SEQUENCE,
        shared=True,
    ),
    _spec(
        "slice",
        ["slice"],
        "conv → x[:, :, 1:-1] → conv",
        lambda: BetweenConvs(_lam(lambda t: t[:, :, 1:-1], "[:, :, 1:-1]")),
        shared=True,
    ),
    _spec("split", ["split"], "conv → split → a conv on each half", _Split, shared=True),
    _spec(
        "dropout",
        ["dropout"],
        "eval-mode dropout between linears",
        lambda: BetweenLinears(nn.Dropout(0.1)),
        TOKENS,
        shared=True,
    ),
    # recurrent
    _spec("lstm", ["lstm"], "between linears", lambda: _Recurrent(nn.LSTM), SEQUENCE),
    _spec("gru", ["gru"], "between linears", lambda: _Recurrent(nn.GRU), SEQUENCE),
)


def entry(name: str) -> Entry:
    """The entry of that name.

    Raises:
        KeyError: naming the entries, if there is none of that name.
    """
    for found in ENTRIES:
        if found.name == name:
            return found
    raise KeyError(f"no atlas entry {name!r} (one of: {', '.join(e.name for e in ENTRIES)})")


def example_args(item: Entry, *, seed: int = 0) -> tuple:
    """The example input of an entry: random values of its shape (indices for ``embedding``)."""
    generator = torch.Generator().manual_seed(seed)
    if item.op == "embedding":
        return (torch.randint(0, 50, item.shape, generator=generator),)
    return (torch.randn(item.shape, generator=generator),)


# --- Reading graphs ---------------------------------------------------------------------------


def _name(node) -> str:
    """The op's name without namespace or overload (``max_pool2d_with_indices``)."""
    target = node.target
    if hasattr(target, "_overloadpacket"):
        return target._overloadpacket.__name__
    return getattr(target, "__name__", str(target)).split(".")[-1]


def _matches(item: Entry, node) -> bool:
    if node.op != "call_function":
        return False
    name = _name(node)
    return any(name.lstrip("_").startswith(op) for op in item.ops)


def nodes_of(item: Entry, graph: torch.fx.Graph) -> list:
    """The nodes of ``graph`` that stand for the entry's op (see ``Entry.ops``)."""
    return [node for node in graph.nodes if _matches(item, node)]


def _is(node, names) -> bool:
    names = (names,) if isinstance(names, str) else names
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and _name(node) in names


def _tensor_inputs(node) -> list:
    """The values an op computes on: its node arguments but constants (weights, biases, the
    qparams); a conv's or linear's weight is ``args[1]``, read apart."""
    found = []
    for arg in node.args:
        for a in arg if isinstance(arg, list | tuple) else [arg]:
            if isinstance(a, torch.fx.Node) and a.op != "get_attr":
                found.append(a)
    if _name(node) in ("conv1d", "conv2d", "conv_transpose2d", "linear", "convolution"):
        found = found[:1]
    return found


def _int8_compute(node) -> bool:
    """A conv/linear/matmul whose inputs are all dequantized int8."""
    inputs = _tensor_inputs(node)
    return _name(node) in _COMPUTE and bool(inputs) and all(_is(a, _DQ) for a in inputs)


def _users_through_getitem(node) -> list:
    users = []
    for user in node.users:
        users += list(user.users) if _is(user, "getitem") else [user]
    return users


def annotation(item: Entry, converted: torch.fx.GraphModule) -> str:
    """The op's status in a converted (q/dq) graph: ``int8``, ``int8 shared``, ``int8 fused``
    or ``float``; several nodes of the op: the least quantized of them."""
    order = ("float", "int8 fused", "int8", "int8 shared")
    statuses = [_node_status(item, n) for n in converted.graph.nodes if _matches(item, n)]
    if not statuses:
        raise ValueError(f"{item.name}: no node of {item.ops} in the converted graph")
    return min(statuses, key=order.index)


#: Activations a quantizer fuses into the op before them: an op's output quantized after one
#: of these counts as quantized (XNNPACK's add + ReLU, x86's linear + add + ReLU).
_TAIL = ("relu", "relu_", "hardtanh", "hardtanh_")


def _quantized_after(node) -> bool:
    users = _users_through_getitem(node)
    if len(users) == 1 and _is(users[0], _TAIL) and _annotated(users[0]):
        users = _users_through_getitem(users[0])
    return bool(users) and all(_is(u, _Q) for u in users)


def _annotated(node) -> bool:
    """The quantizer annotated the node itself (part of a pattern), not only its neighbours."""
    annotation = node.meta.get("quantization_annotation")
    if annotation is None:
        return False
    return bool(annotation.input_qspec_map) or annotation.output_qspec is not None


def _node_status(item: Entry, node) -> str:
    inputs = _tensor_inputs(node)
    out_q = _quantized_after(node)
    in_q = bool(inputs) and all(_is(a, _DQ) for a in inputs)
    if _name(node) in _COMPUTE:
        if item.op == "embedding":  # the table (its weight) int8, the indices as they are
            return "int8" if _is(node.args[0], _DQ) else "float"
        weights = [a for a in node.args[1:2] if isinstance(a, torch.fx.Node)]
        if _name(node) in ("conv1d", "conv2d", "conv_transpose2d", "linear"):
            in_q = in_q and all(_is(w, _DQ) for w in weights)
        return "int8" if in_q else "float"
    if in_q and out_q and _annotated(node):
        users = _users_through_getitem(node)
        same = item.shared and all(inputs[0].args[1:3] == u.args[1:3] for u in users)
        return "int8 shared" if same else "int8"
    fed = [a for a in inputs if not _is(a, _DQ)]
    direct = fed and _int8_compute(fed[0]) and len(fed[0].users) == 1
    if out_q and direct and _annotated(node):  # a post-op of the int8 conv or linear
        return "int8 fused"
    return "float"


# --- The quantizers -----------------------------------------------------------------------


def make_quantizer(name: str):
    """A new quantizer of the atlas by column name (``x86``, ``xnnpack``, ``openvino``, ``arm``).

    Raises:
        ValueError: naming the columns, for another name.
    """
    from common.edge import xnnpack_quantizer
    from common.pt2e import x86_quantizer

    if name == "x86":
        return x86_quantizer()
    if name == "xnnpack":
        return xnnpack_quantizer()
    if name == "openvino":
        from executorch.backends.openvino.quantizer import OpenVINOQuantizer

        return OpenVINOQuantizer()
    if name == "arm":
        from torchao.quantization.pt2e.quantizer.arm_inductor_quantizer import (
            ArmInductorQuantizer,
            get_default_arm_inductor_quantization_config,
        )

        return ArmInductorQuantizer().set_global(get_default_arm_inductor_quantization_config())
    raise ValueError(f"unknown quantizer {name!r} (one of: {', '.join(QUANTIZERS)})")


def quantize(item: Entry, quantizer_name: str, *, fold_quantize: bool = True):
    """Export the entry's model, prepare, calibrate on 2 batches, convert."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    args = example_args(item)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # x86's "input of maxpool2d is not quantized, skip"
        exported = torch.export.export(item.build(), args).module()
        prepared = prepare_pt2e(exported, make_quantizer(quantizer_name))
        for seed in range(2):
            prepared(*example_args(item, seed=seed))
        return convert_pt2e(prepared, fold_quantize=fold_quantize)


# --- Where it runs ------------------------------------------------------------------------


def _post_op(node) -> str:
    """A oneDNN int8 node's post-ops, ``relu``, ``gelu``, ``sum`` (binary), joined by ``+``."""
    return "+".join(a for a in node.args if isinstance(a, str) and a not in ("none", ""))


#: The names oneDNN gives each op as a post-op attribute.
_POST_OP_NAMES = {
    "relu": ("relu",),
    "hardtanh": ("hardtanh",),
    "leaky_relu": ("leaky_relu",),
    "gelu": ("gelu",),
    "silu": ("swish", "silu"),
    "hardswish": ("hardswish",),
    "tanh": ("tanh",),
    "add": ("sum", "add"),
    "sub": ("sum", "add"),
}


def x86_runs(item: Entry, converted) -> dict:
    """Lower the x86 graph (``lower_pt2e_quantized_to_x86``), run it once under ``kernels_run``.

    Where the lowered graph cannot run eagerly (a conv with a fused add whose extra input is
    not channels-last: oneDNN's "accum tensor must be contiguous"), the converted model is
    compiled instead (``torch.compile`` with freezing) and that run is read.

    Returns:
        dict: ``int8`` and ``float`` the kernels the profiler saw; ``post_ops`` the post-ops
        oneDNN ran fused into each int8 kernel (``{"onednn::qconv_pointwise": ["relu"]}``, from
        its verbose log of the same call); ``path`` ``lowered`` or ``compiled``; ``op`` where
        the op ran: ``fused: qconv_pointwise+relu`` (a post-op), ``oneDNN: qlinear_pointwise``,
        ``loop u8→u8`` (between a dequantize and a quantize: inductor computes it in one loop
        from and to uint8), ``fp32: aten::bmm`` (a float kernel), ``loop fp32`` or ``absent``.
    """
    from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86

    from common.kernels import kernels_run

    args = example_args(item)
    path = "lowered"
    with torch.no_grad():
        lowered = lower_pt2e_quantized_to_x86(copy.deepcopy(converted), args)
        try:
            ran = kernels_run(lowered, args)
        except RuntimeError as error:
            if "must be contiguous" not in str(error):
                raise
            path = "compiled"
            with torch._inductor.config.patch(freezing=True):
                compiled = torch.compile(copy.deepcopy(converted))
                compiled(*args)  # the compile, with freezing in force
                ran = kernels_run(compiled, args)
    post_ops = {k: sorted(v) for k, v in (ran.post_ops or {}).items()}
    kernels = sorted(
        f"{k.split('::')[1]}+{'+'.join(ops)}" if ops else k.split("::")[1]
        for k, ops in post_ops.items()
    )
    mine = [n for n in lowered.graph.nodes if _matches(item, n)]
    if item.op in ("conv1d", "conv2d", "linear"):
        float_kernels = ", ".join(sorted(ran.float))
        where = "oneDNN: " + ", ".join(kernels) if kernels else f"fp32: {float_kernels}"
    elif not mine:
        names = _POST_OP_NAMES.get(item.op, ())
        fused = [k for k in kernels if any(p in k.split("+")[1:] for p in names)]
        where = f"fused: {fused[0]}" if fused else "absent"
    elif all(_reads_and_writes_u8(n) for n in mine):
        where = "loop u8→u8"
    else:
        where = _float_kernel(ran, mine)
    return {
        "int8": dict(ran.int8),
        "float": dict(ran.float),
        "post_ops": post_ops,
        "path": path,
        "op": where,
    }


def _reads_and_writes_u8(node) -> bool:
    inputs = _tensor_inputs(node)
    users = _users_through_getitem(node)
    return (
        bool(inputs)
        and all(_is(a, "dequantize_per_tensor") for a in inputs)
        and bool(users)
        and all(_is(u, "quantize_per_tensor") for u in users)
    )


def _float_kernel(ran, mine=()) -> str:
    """``fp32: aten::bmm`` when the op is one of the float kernels the profiler names."""
    for node in mine:
        for kernel in ran.float:
            if kernel.split("::")[1].lstrip("_").startswith(_name(node).lstrip("_")[:12]):
                return f"fp32: {kernel}"
    return "loop fp32"


class _Why(logging.Handler):
    """Collects XNNPACK's ``WhyNoPartition`` records: the constraint that refused each node."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, str] = {}

    def emit(self, record):
        why = record.msg
        node, reason = getattr(why, "node", None), getattr(why, "reason", None)
        if node is not None and reason:
            self.reasons.setdefault(node.name, reason)


_NOT_THE_OP = {
    "getitem",
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "dequantize_per_channel",
    "view_copy",
    "permute_copy",
    "_clone_dim_order",
    "_to_dim_order_copy",
}


def xnnpack_runs(item: Entry, converted, *, partitioner=None) -> dict:
    """Lower the XNNPACK graph with ``XnnpackPartitioner`` (or ``partitioner``).

    Returns:
        dict: ``delegated`` whether every node of the op runs inside an XNNPACK delegate;
        ``inside`` the op's nodes in delegates, ``portable`` those left to the portable
        kernels (edge names; for an op the edge graph decomposed, the compute left outside);
        ``why`` XNNPACK's logged constraint for the first of them (``""``: XNNPACK has no
        config for that op, so it logged none); ``delegates`` each delegate's node names.
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from common.edge import delegated

    # Each config module logs through its own logger, below this one.
    logger = logging.getLogger("executorch.backends.xnnpack.partition.config")
    handler, level, propagate = _Why(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the records go to the handler only, not to the page
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            program = torch.export.export(converted, example_args(item))
            partitioners = [partitioner or XnnpackPartitioner()]
            edge = to_edge_transform_and_lower(program, partitioner=partitioners)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    lowered = edge.exported_program()
    delegates = delegated(lowered)
    names = [_EDGE_NAMES.get(op, op) for op in item.ops]
    inside = [n for found in delegates.values() for n in found if any(op in n for op in names)]
    outside = [
        n
        for n in lowered.graph.nodes
        if n.op == "call_function"
        and not n.name.startswith("executorch_call_delegate")
        and _name(n) not in _NOT_THE_OP
    ]
    mine = [n for n in outside if _matches(item, n)] or ([] if inside else outside)
    why = next((handler.reasons[n.name] for n in mine if n.name in handler.reasons), "")
    return {
        "delegated": not mine,
        "inside": sorted(set(inside)),
        "portable": sorted({_name(n) for n in mine}),
        "why": why,
        "delegates": delegates,
    }


#: How the edge graph names the compute ops inside a delegate (``aten_convolution_default``).
_EDGE_NAMES = {
    "conv1d": "convolution",
    "conv2d": "convolution",
    "conv_transpose2d": "convolution",
    "matmul": "bmm",
}

#: OpenVINO's runtime layer type for the compute ops, whose aten name the runtime model
#: does not keep (a conv is ``aten.convolution``, as the context's convs are).
_OPENVINO_LAYER = {
    "conv1d": "Convolution",
    "conv2d": "Convolution",
    "conv_transpose2d": "Deconvolution",
    "linear": "FullyConnected",
}


def openvino_runs(item: Entry, unfolded) -> dict:
    """Compile the OpenVINO q/dq program (weights not folded) for the CPU plugin.

    Returns:
        dict: ``precisions``: the ``runtimePrecision`` of each runtime layer that holds the
        op, ``{layerType: precision}``.
    """
    import openvino as ov

    with contextlib.redirect_stderr(io.StringIO()):
        model = ov.convert_model(torch.export.export(unfolded, example_args(item)))
        compiled = ov.Core().compile_model(model, "CPU")
    precisions = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str)
        original = info["originalLayersNames"].astype(str).split(",")
        layers = [name.split("/")[1] for name in original if name.count("/") >= 2]
        wanted = _OPENVINO_LAYER.get(item.op)
        if kind in ("Const", "Convert", "Reorder", "Input", "Output"):
            continue
        if (kind == wanted) if wanted else any(_aten_matches(item, layer) for layer in layers):
            precisions[kind] = info["runtimePrecision"].astype(str)
    return {"precisions": precisions}


def _aten_matches(item: Entry, layer: str) -> bool:
    if not layer.startswith("aten."):
        return False
    name = layer.split(".")[1].lstrip("_")
    return any(name.startswith(op) for op in item.ops)


def _error(error: Exception) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"


def reported(item: Entry, quantizer_name: str) -> dict:
    """``common.coverage``'s report on the entry's op (``every_op=True``): its status and the
    reason the quantizer's rules give, in English and in Chinese; several nodes of the op:
    the least quantized of them."""
    from common.coverage import coverage

    order = ("float", "int8 fused", "int8 dynamic", "int8 static", "int8 shared")
    args = example_args(item)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(item.build(), args).module()
        report = coverage(exported, make_quantizer(quantizer_name), every_op=True)
    mine = {node.name for node in nodes_of(item, exported.graph)}
    ops = sorted((o for o in report.ops if o.node in mine), key=lambda o: order.index(o.status))
    if not ops:
        return {"status": "not reported", "reason": {"en": "", "zh_TW": ""}}
    return {
        "status": ops[0].status,
        "reason": {lang: ops[0].reason_in(lang) for lang in ("en", "zh_TW")},
    }


def run_entry(item: Entry) -> dict:
    """Everything the atlas knows about one entry, as plain data.

    A quantizer or backend that fails on the model leaves ``error`` (``"<type>: <first
    line>"``) where its result would be.

    Returns:
        dict: per quantizer, ``annotation`` (:func:`annotation` of the converted graph),
        ``coverage`` (:func:`reported`: the status and reason the page shows); and for ``x86``,
        ``xnnpack`` and ``openvino`` what ran (:func:`x86_runs`, :func:`xnnpack_runs`,
        :func:`openvino_runs`).
    """
    runs = {"x86": x86_runs, "xnnpack": xnnpack_runs, "openvino": openvino_runs}
    result = {}
    for name in QUANTIZERS:
        result[name] = found = {}
        try:
            converted = quantize(item, name, fold_quantize=name != "openvino")
            found["annotation"] = annotation(item, converted)
        except Exception as error:  # a quantizer refusing the model is a fate too
            found.update(annotation="error", error=_error(error))
            continue
        found["coverage"] = reported(item, name)
        if name in runs:
            try:
                found.update(runs[name](item, converted))
            except Exception as error:  # so is a backend refusing it
                found["error"] = _error(error)
    return result


def run_cached(item: Entry) -> dict:
    """:func:`run_entry`, kept in the course's cache (``common.lesson.cached``).

    The key names what produced the result: the entry (its name, ops, input shape and its
    model: code and weights), this module's reading code (everything below the models), the
    installed stack (torch, torchao, ExecuTorch, NNCF, OpenVINO) and the CPU's kernel path
    (OpenVINO's CPU plugin picks its float precision by it). It holds no timing.
    """
    from importlib.metadata import version

    from common.cpu import describe
    from common.lesson import cached, digest

    reading = _SOURCE[_SOURCE.index("# --- Reading graphs") :]
    stack = [version("nncf"), version("openvino"), describe().kernel_path]
    model = item.build()
    key = digest(item.name, list(item.ops), list(item.shape), model, reading, stack)
    return cached("op_atlas", key, lambda: run_entry(item))


# --- Compiled x86 runs ------------------------------------------------------------------------


def x86_compiled(item: Entry) -> dict:
    """The entry's x86 model compiled (``torch.compile`` with freezing), read with ``kernels_run``.

    ``lower_pt2e_quantized_to_x86`` runs inductor's freezing passes only: they prepack the
    int8 convs and linears and fuse a ReLU, while the other unary post-ops (GELU, SiLU,
    Hardswish, Tanh, ReLU6) are fused by the passes a compile runs after them. For an op the
    quantizer fused, this is what ran. Kept in the cache (kind ``op_atlas_compiled``), keyed
    by the model, this function's code and the stack.

    Returns:
        dict: ``int8`` and ``float`` kernels, ``post_ops`` per oneDNN kernel.
    """
    import inspect
    from importlib.metadata import version

    from common.cpu import describe
    from common.lesson import cached, digest

    def run() -> dict:
        from common.kernels import kernels_run

        converted = quantize(item, "x86")
        args = example_args(item)
        with (
            torch.no_grad(),
            torch._inductor.config.patch(freezing=True),
            warnings.catch_warnings(),
        ):
            # inductor's int8 lowering copies a zero point with torch.tensor(tensor): a warning
            warnings.filterwarnings("ignore", "To copy construct from a tensor", UserWarning)
            compiled = torch.compile(converted)
            compiled(*args)  # the compile, with freezing in force
            ran = kernels_run(compiled, args)
        post_ops = {k: sorted(v) for k, v in (ran.post_ops or {}).items()}
        return {"int8": dict(ran.int8), "float": dict(ran.float), "post_ops": post_ops}

    stack = [version("nncf"), version("openvino"), describe().kernel_path]
    code = inspect.getsource(x86_compiled) + inspect.getsource(quantize)
    key = digest(item.name, list(item.ops), list(item.shape), item.build(), code, stack)
    return cached("op_atlas_compiled", key, run)
