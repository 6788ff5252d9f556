"""A tiny deterministic model zoo: every model takes the same image batch."""

import torch
from torch import nn

__all__ = ["IMAGE_SHAPE", "MODEL_NAMES", "example_inputs", "get_model"]

#: (channels, height, width) of the images every zoo model accepts.
IMAGE_SHAPE = (3, 16, 16)
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


_ZOO = {
    "conv_relu": ConvReLU,
    "conv_bn_relu": ConvBNReLU,
    "linear_relu": LinearReLU,
    "small_cnn": SmallCNN,
}
#: The names :func:`get_model` accepts.
MODEL_NAMES = tuple(_ZOO)


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
    >>> get_model("resnet")
    Traceback (most recent call last):
    ...
    ValueError: unknown model 'resnet' (one of: conv_relu, conv_bn_relu, linear_relu, small_cnn)
    """
    if name not in _ZOO:
        raise ValueError(f"unknown model {name!r} (one of: {', '.join(MODEL_NAMES)})")
    cpu_rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(_SEED)  # nn layers draw their init from the global RNG
        model = _ZOO[name]()
    finally:
        torch.random.set_rng_state(cpu_rng)
    _randomize_batch_norm(model, torch.Generator().manual_seed(_SEED + 1))
    return model.eval()


def example_inputs(batch: int = 1, *, seed: int = 0) -> tuple[torch.Tensor]:
    """Return ``(images,)``: a deterministic batch every zoo model accepts.

    Args:
        batch: number of images, a positive integer.
        seed: picks the batch; different seeds give different images
            (calibration uses several).

    Returns:
        tuple[torch.Tensor]: one float32 tensor of shape ``(batch, *IMAGE_SHAPE)``.

    Raises:
        ValueError: if ``batch`` is not a positive integer.

    >>> example_inputs(4)[0].shape
    torch.Size([4, 3, 16, 16])
    >>> example_inputs(0)
    Traceback (most recent call last):
    ...
    ValueError: batch must be a positive integer, got 0
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    generator = torch.Generator().manual_seed(1000 + seed)
    return (torch.randn(batch, *IMAGE_SHAPE, generator=generator),)
