"""A tiny deterministic model zoo: small models on 3x16x16 images, one larger for timing."""

import itertools

import torch
from torch import nn

__all__ = [
    "IMAGE_SHAPE",
    "LARGE_MODEL_NAMES",
    "MODEL_NAMES",
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
        name: one of :data:`MODEL_NAMES`.

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
        model = _ZOO[name]() if name in _ZOO else _LARGE[name][0]()
    finally:
        torch.random.set_rng_state(cpu_rng)
    _randomize_batch_norm(model, torch.Generator().manual_seed(_SEED + 1))
    return model.eval()


def _check_name(name: str) -> None:
    if name not in _ZOO and name not in _LARGE:
        names = ", ".join((*MODEL_NAMES, *LARGE_MODEL_NAMES))
        raise ValueError(f"unknown model {name!r} (one of: {names})")


def input_shape(name: str) -> tuple[int, int, int]:
    """The (channels, height, width) of the images model ``name`` takes.

    >>> input_shape("small_cnn"), input_shape("conv_net")
    ((3, 16, 16), (3, 28, 28))
    """
    _check_name(name)
    return _LARGE[name][1] if name in _LARGE else IMAGE_SHAPE


def example_inputs(
    batch: int = 1, *, seed: int = 0, shape: tuple[int, int, int] = IMAGE_SHAPE
) -> tuple[torch.Tensor]:
    """Return ``(images,)``: a deterministic batch of images.

    Args:
        batch: number of images, a positive integer.
        seed: picks the batch; different seeds give different images
            (calibration uses several).
        shape: (channels, height, width); the default suits every model of ``MODEL_NAMES``,
            ``input_shape(name)`` gives any model's.

    Returns:
        tuple[torch.Tensor]: one float32 tensor of shape ``(batch, *IMAGE_SHAPE)``.

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
