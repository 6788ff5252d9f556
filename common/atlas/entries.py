"""The atlas's rows: one small model per op, the op between the layers it meets in real models
(data; ``recipe.py`` says how a row runs)."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from common.atlas.recipe import IMAGE, SEQUENCE, SIGNAL, TOKENS, BetweenConvs, BetweenLinears, Entry
from common.lesson import lesson_language

# --- The models: the op between the layers it meets in real models --------------------------


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


class _Unrolled(nn.Module):
    """linear → tanh, then one ``nn.Linear`` at each of two steps, a tanh after each
    (``h = tanh(W h)``): a recurrent cell unrolled with ``nn.Linear``, its weight read at every
    step. ``steps`` holds the one module twice; a copy per step shares nothing."""

    def __init__(self):
        super().__init__()
        self.fc, cell = nn.Linear(16, 16), nn.Linear(16, 16)
        self.steps = nn.ModuleList([cell, cell])

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        for step in self.steps:
            h = torch.tanh(step(h))
        return h


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


class _SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``: a Llama-style feed-forward, its mul between two linears of
    one shape (common.language_model's ``FeedForward``, small)."""

    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
        self.w2 = nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _RMSNorm(nn.Module):
    """``x * rsqrt(mean(x²) + eps) * weight``: an RMSNorm written out as Llama writes it
    (common.language_model's ``RMSNorm``): a ``pow``, a ``mean``, an ``rsqrt``, two ``mul``."""

    def __init__(self, dim: int = 16, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _Rotary(nn.Module):
    """linear → rotary positions → linear: each (even, odd) pair of features rotated by its
    position's angle (common.language_model's ``_rotate``), ``cos`` and ``sin`` of shape
    (positions, features / 2) broadcast over the batch."""

    def __init__(self, positions: int = 6):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)
        frequencies = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
        angles = torch.outer(torch.arange(positions).float(), frequencies)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        x = self.fc1(x)
        even, odd = x[..., 0::2], x[..., 1::2]
        cos, sin = self.cos, self.sin
        x = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
        return self.fc2(x)


class _KVCache(nn.Module):
    """linear → written into a cache buffer at given positions (``index_copy_``, in place, as
    common.language_model's attention writes its keys and values) → linear on the whole
    cache. The positions are a buffer, and no parameter asks for gradients: the write is an
    inference-time update of a buffer."""

    def __init__(self, length: int = 8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)
        self.register_buffer("cache", torch.zeros(2, length, 16), persistent=False)
        self.register_buffer("positions", torch.arange(6), persistent=False)
        self.requires_grad_(False)

    def forward(self, x):
        self.cache.index_copy_(1, self.positions, self.fc1(x))
        return self.fc2(self.cache)


def _lam(function: Callable, label: str) -> nn.Module:
    return _Lambda(function, label)


def _spec(name, ops, where, build, shape=IMAGE, *, shared=False) -> Entry:
    def seeded():
        torch.manual_seed(0)
        return build().eval()

    return Entry(name, tuple(ops), where, seeded, shape, shared)


#: The atlas's rows, grouped: compute ops, binary ops, pass-through ops, reductions,
#: activations, norms, resampling, layout ops, recurrent layers, a KV cache's write.
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
        "linear · weight shared",
        ["linear"],
        "after a linear, one nn.Linear at two steps (an unrolled recurrent cell)",
        _Unrolled,
        TOKENS,
    ),
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
        "mul · SwiGLU",
        ["mul"],
        "silu(w1 x) × w3 x → w2 (Llama's feed-forward)",
        _SwiGLU,
        TOKENS,
    ),
    _spec(
        "mul · rotary",
        ["mul"],
        "between linears, each feature pair × cos, sin of its position (Llama's rotary)",
        _Rotary,
        SEQUENCE,
    ),
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
        "leaky_relu · after linear",
        ["leaky_relu"],
        "between linears",
        lambda: BetweenLinears(nn.LeakyReLU(0.1)),
        TOKENS,
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
        "rms_norm · as Llama writes it",
        ["pow", "mean", "rsqrt"],
        "x * rsqrt(mean(x²) + eps) * weight between linears (Llama's RMSNorm)",
        lambda: BetweenLinears(_RMSNorm()),
        SEQUENCE,
    ),
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
    # a KV cache
    _spec(
        "index_copy_ · KV cache",
        ["index_copy", "index_put"],
        "linear → a cache buffer, written in place at 6 of 8 positions → linear (Llama)",
        _KVCache,
        SEQUENCE,
    ),
)


#: Where each row puts its op, in Chinese, by the entry's (English) ``where``: the zh_TW pages
#: show these (:func:`placement`).
_WHERE_ZH_TW = {
    "alone": "單獨一層",
    "after a linear, one nn.Linear at two steps (an unrolled recurrent cell)": (
        "接在一個 linear 之後，同一個 nn.Linear 用在兩個步驟（展開的遞迴單元）"
    ),
    "groups = channels (MobileNet, ConvNeXt)": "groups = 通道數（MobileNet、ConvNeXt）",
    "between convs, k = stride = 2 (U-Net's up path)": (
        "兩個 conv 之間，k = stride = 2（U-Net 的上行路徑）"
    ),
    "q @ kᵀ @ v of linears": "由 linear 算出的 q @ kᵀ @ v",
    "on q, k, v linears": "作用在 linear 算出的 q、k、v 上",
    "before a linear": "接在一個 linear 之前",
    "conv(x) + x, then ReLU (ResNet)": "conv(x) + x，再接 ReLU（ResNet）",
    "linear(x) + x, then ReLU (a transformer's residual)": (
        "linear(x) + x，再接 ReLU（Transformer 的殘差）"
    ),
    "conv(x) − conv(x)": "conv(x) − conv(x)",
    "conv(x) × conv(x)": "conv(x) × conv(x)",
    "γ × conv(x) (ConvNeXt)": "γ × conv(x)（ConvNeXt）",
    "silu(w1 x) × w3 x → w2 (Llama's feed-forward)": "silu(w1 x) × w3 x → w2（Llama 的前饋層）",
    "between linears, each feature pair × cos, sin of its position (Llama's rotary)": (
        "兩個 linear 之間，每組特徵乘上所在位置的 cos、sin（Llama 的旋轉位置編碼）"
    ),
    "conv(x) / 2 between convs": "兩個 conv 之間的 conv(x) / 2",
    "two convs' outputs (U-Net's skip)": "兩個 conv 的輸出（U-Net 的 skip connection）",
    "conv → ReLU → max-pool → conv (ResNet's stem)": (
        "conv → ReLU → max-pool → conv（ResNet 的 stem）"
    ),
    "between convs (DenseNet)": "兩個 conv 之間（DenseNet）",
    "conv → pool → flatten → linear (ResNet's head)": (
        "conv → pool → flatten → linear（ResNet 的分類頭）"
    ),
    "conv → x.mean((2, 3)) → linear (a head)": "conv → x.mean((2, 3)) → linear（分類頭）",
    "conv → x.mean((2, 3), keepdim=True) → conv": "conv → x.mean((2, 3), keepdim=True) → conv",
    "conv1d → ReLU → x.mean(-1) → linear (a keyword spotter)": (
        "conv1d → ReLU → x.mean(-1) → linear（關鍵字偵測模型）"
    ),
    "conv → x.sum((2, 3)) → linear": "conv → x.sum((2, 3)) → linear",
    "between convs": "兩個 conv 之間",
    "between linears (an MLP)": "兩個 linear 之間（MLP）",
    "nn.ReLU6 between convs (MobileNetV2)": "兩個 conv 之間的 nn.ReLU6（MobileNetV2）",
    "between convs (YOLOv3)": "兩個 conv 之間（YOLOv3）",
    "between linears (a transformer's FFN)": "兩個 linear 之間（Transformer 的 FFN）",
    "between convs (EfficientNet)": "兩個 conv 之間（EfficientNet）",
    "between convs (YOLOv4)": "兩個 conv 之間（YOLOv4）",
    "between convs (MobileNetV3)": "兩個 conv 之間（MobileNetV3）",
    "an SE gate: y × hardsigmoid(conv(y)) (MobileNetV3)": (
        "SE 閘門：y × hardsigmoid(conv(y))（MobileNetV3）"
    ),
    "an SE gate: y × sigmoid(conv(y)) (EfficientNet)": (
        "SE 閘門：y × sigmoid(conv(y))（EfficientNet）"
    ),
    "between linears": "兩個 linear 之間",
    "between linears, last axis": "兩個 linear 之間，沿最後一軸",
    "x.clamp(-1, 1) between convs": "兩個 conv 之間的 x.clamp(-1, 1)",
    "between linears (a transformer)": "兩個 linear 之間（Transformer）",
    "x * rsqrt(mean(x²) + eps) * weight between linears (Llama's RMSNorm)": (
        "兩個 linear 之間的 x * rsqrt(mean(x²) + eps) * weight（Llama 的 RMSNorm）"
    ),
    "conv → ReLU → BatchNorm → conv (not foldable)": "conv → ReLU → BatchNorm → conv（無法折疊）",
    "between convs (U-Net, FPN)": "兩個 conv 之間（U-Net、FPN）",
    "between convs (segmentation heads)": "兩個 conv 之間（分割模型的輸出頭）",
    "between convs (super-resolution)": "兩個 conv 之間（超解析度）",
    "F.pad between convs": "兩個 conv 之間的 F.pad",
    "conv → flatten → linear": "conv → flatten → linear",
    "conv → permute → linear (ConvNeXt)": "conv → permute → linear（ConvNeXt）",
    "linear → transpose → conv1d (Conformer)": "linear → transpose → conv1d（Conformer）",
    "conv → x[:, :, 1:-1] → conv": "conv → x[:, :, 1:-1] → conv",
    "conv → split → a conv on each half": "conv → split → 兩半各接一個 conv",
    "eval-mode dropout between linears": "兩個 linear 之間、eval 模式的 dropout",
    "linear → a cache buffer, written in place at 6 of 8 positions → linear (Llama)": (
        "linear → 就地寫入快取 buffer 8 個位置中的 6 個 → linear（Llama）"
    ),
}


def placement(item: Entry, lang: str | None = None) -> str:
    """Where ``item``'s model puts its op, in ``lang``.

    Args:
        item: an atlas entry (one of :data:`ENTRIES`, or one a page makes: its ``where`` is
            shown as written when the atlas has no translation of it).
        lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
            omitted.

    Returns:
        str: the entry's ``where``, in Chinese for ``zh_TW``.

    >>> placement(entry("cat"), "zh_TW")
    '兩個 conv 的輸出（U-Net 的 skip connection）'
    """
    lang = lang or lesson_language()
    return _WHERE_ZH_TW.get(item.where, item.where) if lang == "zh_TW" else item.where


def entry(name: str) -> Entry:
    """The entry of that name.

    Raises:
        KeyError: naming the entries, if there is none of that name.
    """
    for found in ENTRIES:
        if found.name == name:
            return found
    raise KeyError(f"no atlas entry {name!r} (one of: {', '.join(e.name for e in ENTRIES)})")
