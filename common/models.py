"""A tiny deterministic model zoo: small CNNs on 3x16x16 images, transformers, larger models,
and torchvision's architectures (``VISION_NAMES``, written in ``common.vision_models``)."""

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from common import vision_models

__all__ = [
    "ATTENTION_STYLES",
    "IMAGE_SHAPE",
    "LARGE_MODEL_NAMES",
    "MODEL_NAMES",
    "TRANSFORMER_NAMES",
    "VISION_NAMES",
    "DigitsViT",
    "Encoder",
    "EncoderBlock",
    "SelfAttention",
    "example_inputs",
    "get_model",
    "input_shape",
]

#: (channels, height, width) of the images every model of ``MODEL_NAMES`` accepts.
IMAGE_SHAPE = (3, 16, 16)
# The larger model's images: big enough for int8 kernels to beat float ones (M03-3).
LARGE_IMAGE_SHAPE = (3, 28, 28)
_SEED = 0


class ConvReLU(nn.Module):
    """conv -> relu."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv(x))


class ConvBNReLU(nn.Module):
    """conv -> batch norm -> relu, the pattern PT2E folds and fuses."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class LinearReLU(nn.Module):
    """flatten the image -> linear -> relu."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2], 10)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.linear(torch.flatten(x, 1)))


class SmallCNN(nn.Module):
    """conv -> bn -> relu -> max pool -> flatten -> linear: a classifier in miniature."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * (IMAGE_SHAPE[1] // 2) * (IMAGE_SHAPE[2] // 2), 10)

    def forward(self, x):
        x = self.pool(self.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class ConvNet(nn.Module):
    """Four 3x3 conv -> relu layers (3 -> 64 -> 128 -> 128 -> 128 channels) at 28x28, average
    pool to 7x7, then a two-layer classifier: enough arithmetic per layer for int8 kernels to
    pay off, and weights (1.2 M) that dwarf a saved program's fixed overhead (M03-3)."""

    def __init__(self):
        super().__init__()
        widths = (3, 64, 128, 128, 128)
        layers = []
        for c_in, c_out in itertools.pairwise(widths):
            layers += [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(widths[-1] * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# --- Transformers (M05) -------------------------------------------------------------------------

#: The two ways an encoder block can write its attention: ``"mha"``, ``nn.MultiheadAttention``
#: (one packed ``in_proj_weight``), and ``"sdpa"``, separate q/k/v ``nn.Linear`` layers and
#: ``F.scaled_dot_product_attention``, as most modern model code does.
ATTENTION_STYLES = ("mha", "sdpa")


class SelfAttention(nn.Module):
    """Multi-head self-attention from separate q/k/v ``nn.Linear`` layers and SDPA."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, tokens, dim = x.shape

        def split(t):  # (n, tokens, dim) -> (n, heads, tokens, dim // heads)
            return t.view(n, tokens, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(n, tokens, dim))


class EncoderBlock(nn.Module):
    """A pre-norm encoder block: ``x + attn(norm1(x))``, then ``x + fc2(gelu(fc1(norm2(x))))``.

    ``attention`` is one of :data:`ATTENTION_STYLES`.
    """

    def __init__(self, dim: int, heads: int, hidden: int, *, attention: str):
        super().__init__()
        _check_attention(attention)
        self.norm1 = nn.LayerNorm(dim)
        if attention == "mha":
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        else:
            self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.norm1(x)
        if isinstance(self.attn, nn.MultiheadAttention):
            h = self.attn(h, h, h, need_weights=False)[0]
        else:
            h = self.attn(h)
        x = x + h
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


def _check_attention(attention: str) -> None:
    if attention not in ATTENTION_STYLES:
        raise ValueError(
            f"unknown attention style {attention!r} (one of: {', '.join(ATTENTION_STYLES)})"
        )


class DigitsViT(nn.Module):
    """A ViT-style classifier for 1×8×8 digit images.

    A 2×2 conv with stride 2 cuts the image into 16 patches (the patch embedding, 1 → 32
    channels); a learned class token goes in front and learned position embeddings are added;
    two pre-norm :class:`EncoderBlock` (4 heads, MLP 64), a final LayerNorm, and a linear head
    on the class token give 10 logits.
    """

    def __init__(self, *, attention: str = "sdpa", dim: int = 32, depth: int = 2):
        super().__init__()
        _check_attention(attention)
        self.patch_embed = nn.Conv2d(1, dim, kernel_size=2, stride=2)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + 16, dim) * 0.02)
        self.blocks = nn.Sequential(
            *(EncoderBlock(dim, 4, 2 * dim, attention=attention) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (n, 16, dim)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class Encoder(nn.Module):
    """Four pre-norm SDPA encoder blocks, d_model 256, 4 heads, MLP 1024, on 64 tokens.

    Random weights, big enough for int8 kernels to matter in timing (M05-3); it takes
    ``(batch, 64, 256)`` token embeddings.
    """

    def __init__(self, *, attention: str = "sdpa", dim: int = 256, depth: int = 4):
        super().__init__()
        self.blocks = nn.Sequential(
            *(EncoderBlock(dim, 4, 4 * dim, attention=attention) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.blocks(x))


_ZOO = {
    "conv_relu": ConvReLU,
    "conv_bn_relu": ConvBNReLU,
    "linear_relu": LinearReLU,
    "small_cnn": SmallCNN,
}
#: The small models :func:`get_model` accepts, which every whole-zoo test and lesson loops over;
#: they take ``IMAGE_SHAPE`` images.
MODEL_NAMES = tuple(_ZOO)
# Models too slow for those loops, each with its own image shape (see input_shape).
_LARGE = {"conv_net": (ConvNet, LARGE_IMAGE_SHAPE)}
LARGE_MODEL_NAMES = tuple(_LARGE)
# One sample of the M05 transformers: a digit image, or 64 tokens of 256 numbers.
_DIGITS_SHAPE = (1, 8, 8)
_ENCODER_SHAPE = (64, 256)
_TRANSFORMERS = {
    "vit_mha": (lambda: DigitsViT(attention="mha"), _DIGITS_SHAPE),
    "vit_sdpa": (lambda: DigitsViT(attention="sdpa"), _DIGITS_SHAPE),
    "encoder": (Encoder, _ENCODER_SHAPE),
}
#: The transformers of M05 (random weights): the digits ViT in both attention styles and the
#: larger encoder for timing; each takes its own input shape (see :func:`input_shape`).
TRANSFORMER_NAMES = tuple(_TRANSFORMERS)
_VISION = {
    name: (build, vision_models.IMAGE_SHAPE) for name, build in vision_models.ARCHITECTURES.items()
}
#: torchvision's architectures at full size (ResNet18/50, MobileNetV2/V3, EfficientNet-B0, a
#: small ViT), for M07: each takes ``input_shape(name)`` = 3 x 64 x 64 images, 1000 classes.
VISION_NAMES = tuple(_VISION)
_OTHERS = {**_LARGE, **_TRANSFORMERS, **_VISION}


def _randomize_batch_norm(model: nn.Module, generator: torch.Generator) -> None:
    # Fresh BatchNorm has mean 0 / var 1 / weight 1 / bias 0, so folding it into the conv
    # would change nothing visible. Trained-looking statistics make the folding real.
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            with torch.no_grad():
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(n, generator=generator) * 0.1)


def get_model(name: str) -> nn.Module:
    """Return a fresh zoo model in eval mode with deterministic weights.

    The global RNG is left untouched: weights come from a private seeded generator.

    Args:
        name: one of :data:`MODEL_NAMES`, :data:`LARGE_MODEL_NAMES`, :data:`TRANSFORMER_NAMES`
            or :data:`VISION_NAMES`.

    Returns:
        nn.Module: a new model; two calls with the same name give equal weights.

    Raises:
        ValueError: if ``name`` is not a zoo model; the message lists the valid names.

    >>> get_model("conv_relu").conv.weight.shape
    torch.Size([8, 3, 3, 3])
    >>> get_model("resnet")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown model 'resnet' (one of: conv_relu, conv_bn_relu, linear_relu, ...)
    """
    _check_name(name)
    cpu_rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(_SEED)  # nn layers draw their init from the global RNG
        model = _ZOO[name]() if name in _ZOO else _OTHERS[name][0]()
    finally:
        torch.random.set_rng_state(cpu_rng)
    _randomize_batch_norm(model, torch.Generator().manual_seed(_SEED + 1))
    return model.eval()


def _check_name(name: str) -> None:
    if name not in _ZOO and name not in _OTHERS:
        names = ", ".join((*MODEL_NAMES, *LARGE_MODEL_NAMES, *TRANSFORMER_NAMES, *VISION_NAMES))
        raise ValueError(f"unknown model {name!r} (one of: {names})")


def input_shape(name: str) -> tuple[int, ...]:
    """The shape of one sample model ``name`` takes: (channels, height, width), or (tokens, dim).

    >>> input_shape("small_cnn"), input_shape("conv_net")
    ((3, 16, 16), (3, 28, 28))
    >>> input_shape("vit_sdpa"), input_shape("encoder")
    ((1, 8, 8), (64, 256))
    """
    _check_name(name)
    return _OTHERS[name][1] if name in _OTHERS else IMAGE_SHAPE


def example_inputs(
    batch: int = 1, *, seed: int = 0, shape: tuple[int, ...] = IMAGE_SHAPE
) -> tuple[torch.Tensor]:
    """Return ``(images,)``: a deterministic batch of images.

    Args:
        batch: number of images, a positive integer.
        seed: picks the batch; different seeds give different images
            (calibration uses several).
        shape: one sample's shape, (channels, height, width) for images; the default suits
            every model of ``MODEL_NAMES``, ``input_shape(name)`` gives any model's.

    Returns:
        tuple[torch.Tensor]: one float32 tensor of shape ``(batch, *shape)``.

    Raises:
        ValueError: if ``batch`` is not a positive integer.

    >>> example_inputs(4)[0].shape
    torch.Size([4, 3, 16, 16])
    >>> example_inputs(2, shape=input_shape("conv_net"))[0].shape
    torch.Size([2, 3, 28, 28])
    >>> example_inputs(0)
    Traceback (most recent call last):
    ...
    ValueError: batch must be a positive integer, got 0
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    generator = torch.Generator().manual_seed(1000 + seed)
    return (torch.randn(batch, *shape, generator=generator),)
