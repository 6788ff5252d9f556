"""torchvision's architectures, written as torchvision 0.28 writes them, for M07.

Readers bring torchvision models; torchvision 0.28, the release paired with torch 2.13, does not
import beside the course's CPU build of torch 2.13.0 (``RuntimeError: operator torchvision::nms
does not exist``; PyPI has only the CUDA builds), and PyTorch's CPU wheel index is not reachable
here. So each architecture is rewritten from ``torchvision/models/<name>.py``: the same blocks,
module names, layer counts and channel widths, and the same habits of real model code that trip
quantizers: a ``self.relu`` called at two or three places (ResNet), an in-place residual
``out += identity``, hardswish and hardsigmoid (MobileNetV3), SiLU and squeeze-excitation
(EfficientNet), ``F.adaptive_avg_pool2d`` (MobileNetV2) and ``nn.MultiheadAttention`` (ViT).
Weights are PyTorch's default initialisation from a fixed seed with trained-looking BatchNorm
statistics (``common.models.get_model``); nothing is downloaded.

Each ``forward`` keeps torchvision's statement order, since a quantizer reads the graph in that
order: ResNet's blocks compute the downsample after ``bn2`` / ``bn3``, just before the add, so
``X86InductorQuantizer`` fuses ``conv2`` (``conv3``) into the add, as on a real torchvision
export (``tests/test_vision_models.py``). Also as torchvision writes them: MobileNetV3's
BatchNorm (``eps=0.001, momentum=0.01``), EfficientNet's ``StochasticDepth`` (the identity in
eval), ViT's ``MLPBlock``, zero ``class_token`` and shape checks. What differs, none of it
changing what a quantizer annotates: torchvision's weight initialisations (kaiming, normal,
ViT's zero ``heads.head``, which here would make every logit 0), the two ``InvertedResidual``
classes' names (``InvertedResidualV2`` / ``InvertedResidualV3`` here, since both live in one
module), and ``vit_tiny``, which is not a torchvision builder (see :class:`VisionTransformer`).

>>> from common.models import example_inputs, get_model, input_shape
>>> get_model("resnet18")(*example_inputs(2, shape=input_shape("resnet18"))).shape
torch.Size([2, 1000])
"""

from collections import OrderedDict
from functools import partial

import torch
from torch import nn

__all__ = ["ARCHITECTURES", "IMAGE_SHAPE"]

#: One image's shape for every architecture here: small enough for a build, large enough that
#: every stage of the CNNs keeps a feature map of at least 2 x 2.
IMAGE_SHAPE = (3, 64, 64)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's rounding of channel counts (MobileNet, EfficientNet's squeeze sizes)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), BatchNorm, activation or none."""

    def __init__(
        self,
        cin,
        cout,
        kernel_size=3,
        stride=1,
        groups=1,
        activation_layer=nn.ReLU,
        norm_layer=nn.BatchNorm2d,
    ):
        layers = [
            nn.Conv2d(
                cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False
            ),
            norm_layer(cout),
        ]
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation: pool, fc1, activation, fc2, gate, times the input."""

    def __init__(self, channels, squeezed, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


# --- ResNet (torchvision/models/resnet.py) ---------------------------------------------------


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)  # called twice, as torchvision's block calls it
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        # torchvision's order: the residual branch first, the downsample last, just before the
        # add. X86InductorQuantizer fuses into the add the first conv that feeds it in graph
        # order, so this order is what makes conv2, not the downsample conv, the fused one.
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)  # called three times
        self.downsample = downsample

    def forward(self, x):
        identity = x  # the downsample after bn3, as in BasicBlock
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- MobileNetV2 (torchvision/models/mobilenetv2.py) -----------------------------------------


class InvertedResidualV2(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = round(inp * expand_ratio)
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden, 1, activation_layer=nn.ReLU6))
        layers += [
            Conv2dNormActivation(hidden, hidden, 3, stride, hidden, activation_layer=nn.ReLU6),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # expansion t, channels c, repeats n, first stride s
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip

    def __init__(self, num_classes=1000, width_mult=1.0, inverted_residual_setting=None):
        # width_mult and inverted_residual_setting as torchvision's: channels scaled and
        # rounded to multiples of 8 (the last conv keeps 1280 below 1.0), the stages given.
        super().__init__()
        stem = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        features = [Conv2dNormActivation(3, stem, 3, 2, activation_layer=nn.ReLU6)]
        channels = stem
        for t, c, n, s in inverted_residual_setting or self.SETTINGS:
            for i in range(n):
                out = _make_divisible(c * width_mult)
                features.append(InvertedResidualV2(channels, out, s if i == 0 else 1, t))
                channels = out
        features.append(Conv2dNormActivation(channels, last, 1, activation_layer=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# --- MobileNetV3 (torchvision/models/mobilenetv3.py) -----------------------------------------


#: MobileNetV3's BatchNorm, as torchvision builds it (mobilenetv3.py: ``eps=0.001, momentum=0.01``).
_V3_NORM = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)


class InvertedResidualV3(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, use_se, use_hs, stride):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        conv = partial(
            Conv2dNormActivation,
            activation_layer=nn.Hardswish if use_hs else nn.ReLU,
            norm_layer=_V3_NORM,
        )
        layers = []
        if expanded != cin:
            layers.append(conv(cin, expanded, 1))
        layers.append(conv(expanded, expanded, kernel, stride, expanded))
        if use_se:
            squeezed = _make_divisible(expanded // 4)
            layers.append(SqueezeExcitation(expanded, squeezed, scale_activation=nn.Hardsigmoid))
        layers.append(conv(expanded, cout, 1, activation_layer=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


class MobileNetV3(nn.Module):
    # mobilenet_v3_small: input, kernel, expanded, output, squeeze-excitation, hardswish, stride
    SMALL = ((16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2),
             (24, 3, 88, 24, False, False, 1), (24, 5, 96, 40, True, True, 2),
             (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
             (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1),
             (48, 5, 288, 96, True, True, 2), (96, 5, 576, 96, True, True, 1),
             (96, 5, 576, 96, True, True, 1))  # fmt: skip

    def __init__(self, num_classes=1000, last_channel=1024):
        super().__init__()
        conv = partial(Conv2dNormActivation, activation_layer=nn.Hardswish, norm_layer=_V3_NORM)
        layers = [conv(3, 16, 3, 2)]
        layers += [InvertedResidualV3(*setting) for setting in self.SMALL]
        layers.append(conv(96, 576, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(576, last_channel),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2, inplace=True),
            nn.Linear(last_channel, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# --- EfficientNet-B0 (torchvision/models/efficientnet.py) ------------------------------------


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth: drops whole rows of the residual branch in training; the
    identity in eval, so an exported graph has no node for it."""

    def __init__(self, p: float, mode: str = "row"):
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, input):
        if not self.training or self.p == 0.0:
            return input
        survival_rate = 1.0 - self.p
        size = [input.shape[0]] + [1] * (input.ndim - 1) if self.mode == "row" else [1]
        noise = torch.empty(size, dtype=input.dtype, device=input.device).bernoulli_(survival_rate)
        return input * noise.div_(survival_rate) if survival_rate > 0.0 else input * noise

    def extra_repr(self):
        return f"p={self.p}, mode={self.mode}"


class MBConv(nn.Module):
    def __init__(self, expand_ratio, kernel, stride, cin, cout, stochastic_depth_prob=0.0):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        expanded = _make_divisible(cin * expand_ratio)
        layers = []
        if expanded != cin:
            layers.append(Conv2dNormActivation(cin, expanded, 1, activation_layer=nn.SiLU))
        layers.append(
            Conv2dNormActivation(
                expanded, expanded, kernel, stride, expanded, activation_layer=nn.SiLU
            )
        )
        silu = partial(nn.SiLU, inplace=True)
        layers.append(SqueezeExcitation(expanded, max(1, cin // 4), activation=silu))
        layers.append(Conv2dNormActivation(expanded, cout, 1, activation_layer=None))
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob, "row")

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += x
        return result


class EfficientNet(nn.Module):
    # efficientnet_b0: expand ratio, kernel, stride, input, output, layers
    B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
          (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))  # fmt: skip

    def __init__(self, num_classes=1000, stochastic_depth_prob=0.2):
        super().__init__()
        layers = [Conv2dNormActivation(3, 32, 3, 2, activation_layer=nn.SiLU)]
        total, block_id = sum(setting[-1] for setting in self.B0), 0
        for expand, kernel, stride, cin, cout, repeats in self.B0:
            stage = []
            for i in range(repeats):  # the drop rate grows linearly with the block's index
                p = stochastic_depth_prob * block_id / total
                stage.append(MBConv(expand, kernel, stride if i == 0 else 1, cin, cout, p))
                cin, block_id = cout, block_id + 1
            layers.append(nn.Sequential(*stage))
        layers.append(Conv2dNormActivation(320, 1280, 1, activation_layer=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# --- VisionTransformer (torchvision/models/vision_transformer.py) ----------------------------


class MLPBlock(nn.Sequential):
    """torchvision's MLPBlock: linear, GELU, dropout, linear, dropout (indices 0 to 4)."""

    def __init__(self, in_dim, mlp_dim, dropout=0.0):
        super().__init__(
            nn.Linear(in_dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, in_dim),
            nn.Dropout(dropout),
        )


class EncoderBlock(nn.Module):
    def __init__(self, num_heads, hidden_dim, mlp_dim):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = MLPBlock(hidden_dim, mlp_dim)

    def forward(self, input):
        torch._assert(
            input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}"
        )
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    def __init__(self, seq_length, num_layers, num_heads, hidden_dim, mlp_dim):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, seq_length, hidden_dim) * 0.02)
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(
            OrderedDict(
                (f"encoder_layer_{i}", EncoderBlock(num_heads, hidden_dim, mlp_dim))
                for i in range(num_layers)
            )
        )
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

    def forward(self, input):
        torch._assert(
            input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}"
        )
        return self.ln(self.layers(self.dropout(input + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """torchvision's ViT; ``vit_tiny`` is ViT-B/16's code at the tiny configuration (DeiT-Ti:
    width 192, 3 heads, MLP 768), 4 layers instead of 12, patches of 8 for 64 x 64 images."""

    def __init__(
        self,
        image_size=64,
        patch_size=8,
        num_layers=4,
        num_heads=3,
        hidden_dim=192,
        mlp_dim=768,
        num_classes=1000,
    ):
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim = image_size, patch_size, hidden_dim
        self.conv_proj = nn.Conv2d(3, hidden_dim, patch_size, patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        seq_length = (image_size // patch_size) ** 2 + 1
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden_dim, num_classes)))

    def forward(self, x):
        n, _, h, w = x.shape
        p = self.patch_size
        torch._assert(
            h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!"
        )
        torch._assert(
            w == self.image_size, f"Wrong image width! Expected {self.image_size} but got {w}!"
        )
        x = self.conv_proj(x).reshape(n, self.hidden_dim, (h // p) * (w // p)).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


#: Each architecture's builder, by the name torchvision gives its builder (``vit_tiny`` is the
#: course's own name: torchvision has no ViT this small, see :class:`VisionTransformer`);
#: ``get_model`` builds them with the course's fixed seed (``common.models.VISION_NAMES``).
ARCHITECTURES = {
    "resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2]),
    "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3]),
    "mobilenet_v2": MobileNetV2,
    "mobilenet_v3_small": MobileNetV3,
    "efficientnet_b0": EfficientNet,
    "vit_tiny": VisionTransformer,
}
