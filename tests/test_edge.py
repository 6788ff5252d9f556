"""common.edge.CoursePartitioner against XnnpackPartitioner: same partitions, equal outputs.

The matrix: every zoo model, every M02 test model and miniatures of torchvision's
architectures held out from the table's writing, quantized with XNNPACKQuantizer
(per-channel int8 weights, int8 activations), lowered by ``to_edge_transform_and_lower`` once
with each partitioner. Both must tag the same nodes into the same partitions, mark the same
quantize/dequantize nodes as folded into XNNPACK's int8 tensors, and give ``torch.equal``
outputs on the ExecuTorch runtime. Where XNNPACK itself fails after partitioning, the course
partitioner must have partitioned alike and fail alike.
"""

import contextlib
import io

import pytest
import torch
from graphs import TEST_MODELS, TwoConvs, build
from marks import ON_THE_PATTERN_WORKER
from torch import nn

from common.models import LARGE_MODEL_NAMES, MODEL_NAMES, example_inputs, get_model, input_shape
from common.pt2e import calibrate, export_module, quiet
from common.vision_models import BasicBlock

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (  # noqa: E402
    XnnpackPartitioner,
)
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (  # noqa: E402
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from executorch.exir.backend.partitioner import Partitioner  # noqa: E402
from executorch.runtime import Runtime  # noqa: E402
from graphs import BothPartitioners, Partitioned  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

from common import edge  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
    pytest.mark.filterwarnings("ignore:Not fusing linear\\+bn:UserWarning"),
]


class GlobalMeanHead(nn.Module):
    """conv -> relu -> mean over H, W without keepdim -> linear: the mean stays portable."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class StridedMaxPool(nn.Module):
    """A max pool whose stride exceeds its kernel: XNNPACK refuses it, so it decomposes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, stride=3)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


# --- Held out: torchvision's architectures in miniature ----------------------------------------
# torchvision 0.28 does not import beside this torch, so each is its blocks as torchvision writes
# them (torchvision/models/<name>.py), a few channels wide, for the zoo's 3 x 16 x 16 images.


def conv_bn(cin, cout, kernel=3, stride=1, groups=1, act=nn.ReLU):
    """torchvision's Conv2dNormActivation: conv (no bias), BatchNorm, activation (or none)."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)]
    layers.append(nn.BatchNorm2d(cout))
    return nn.Sequential(*layers, *([act()] if act else []))


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation: adaptive pool, fc, act, fc, gate, times the input."""

    def __init__(self, channels, squeezed, act=nn.ReLU, gate=nn.Hardsigmoid):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        scale = nn.functional.adaptive_avg_pool2d(x, 1)
        return self.gate(self.fc2(self.act(self.fc1(scale)))) * x


class MobileNetV3(nn.Module):
    """Hardswish stem, an inverted residual with depthwise conv and hardsigmoid SE, a head
    of adaptive pool, linear, hardswish, dropout, linear."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 16, stride=2, act=nn.Hardswish)
        self.block = nn.Sequential(
            conv_bn(16, 32, 1, act=nn.Hardswish),
            conv_bn(32, 32, 3, groups=32, act=nn.Hardswish),
            SqueezeExcitation(32, 8),
            conv_bn(32, 16, 1, act=None),
        )
        self.last = conv_bn(16, 48, 1, act=nn.Hardswish)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(48, 32), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(32, 10)
        )

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.classifier(torch.flatten(self.pool(self.last(x)), 1))


def channel_shuffle(x, groups: int):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    return torch.transpose(x, 1, 2).contiguous().view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's InvertedResidual: stride 1 splits the channels (chunk) and keeps one
    half; stride 2 runs both branches on the whole input. Then cat and channel shuffle."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.branch1 = nn.Sequential(
                conv_bn(cin, cin, 3, stride, groups=cin, act=None), conv_bn(cin, half, 1)
            )
        self.branch2 = nn.Sequential(
            conv_bn(cin if stride > 1 else half, half, 1),
            conv_bn(half, half, 3, stride, groups=half, act=None),
            conv_bn(half, half, 1),
        )

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """conv, max pool, a stride-2 and a stride-1 unit, conv, mean over H and W, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = conv_bn(3, 8, stride=2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.stage = nn.Sequential(ShuffleUnit(8, 16, 2), ShuffleUnit(16, 16, 1))
        self.conv5 = conv_bn(16, 32, 1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv5(self.stage(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))


class SplitShuffle(nn.Module):
    """A channel split with torch.split into unequal parts, one branch each, cat, shuffle."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 12)
        self.a, self.b = conv_bn(4, 4), conv_bn(8, 8, groups=8)

    def forward(self, x):
        a, b = torch.split(self.stem(x), [4, 8], dim=1)
        return channel_shuffle(torch.cat([self.a(a), self.b(b)], dim=1), 3)


def basic_block(cin, cout, stride=1):
    """ResNet's BasicBlock (common.vision_models): one nn.ReLU called twice, out += identity."""
    downsample = None
    if stride != 1 or cin != cout:
        downsample = nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
        )
    return BasicBlock(cin, cout, stride, downsample)


class ResNet(nn.Module):
    """Stem conv, BN, ReLU, max pool 3/2/1, two BasicBlocks (one downsampling), pool, fc."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 8), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(basic_block(8, 8), basic_block(8, 16, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(self.layers(self.stem(x))), 1))


class EfficientNet(nn.Module):
    """MBConv: expand with SiLU, depthwise with SiLU, SE (SiLU, sigmoid), project, + skip;
    a SiLU head, adaptive pool, dropout, linear."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 16, stride=2, act=nn.SiLU)
        self.block = nn.Sequential(
            conv_bn(16, 64, 1, act=nn.SiLU),
            conv_bn(64, 64, 3, groups=64, act=nn.SiLU),
            SqueezeExcitation(64, 4, act=nn.SiLU, gate=nn.Sigmoid),
            conv_bn(64, 16, 1, act=None),
        )
        self.head = conv_bn(16, 32, 1, act=nn.SiLU)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, 10))

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)  # stochastic depth is the identity in eval
        return self.classifier(torch.flatten(self.avgpool(self.head(x)), 1))


class ViT(nn.Module):
    """torchvision's VisionTransformer: patch conv, class token, position embedding, one
    encoder block (LayerNorm, nn.MultiheadAttention, MLP with GELU), LayerNorm, head."""

    def __init__(self, dim=32, patch=4):
        super().__init__()
        self.patch = patch
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, (16 // patch) ** 2 + 1, dim) * 0.02)
        self.ln_1, self.ln_2, self.ln = (nn.LayerNorm(dim) for _ in range(3))
        self.attention = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))
        self.heads = nn.Linear(dim, 10)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, -1, (x.shape[2] // self.patch) ** 2).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self.pos_embedding
        y = self.ln_1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        x = x + self.mlp(self.ln_2(x))
        return self.heads(self.ln(x)[:, 0])


class DenseNet(nn.Module):
    """A dense block (each layer's BN-ReLU-conv output concatenated to its input), a
    transition (BN, ReLU, 1x1 conv, avg pool 2), ReLU, adaptive pool, linear."""

    def __init__(self, growth=8):
        super().__init__()
        self.conv0 = conv_bn(3, 16)
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.BatchNorm2d(16 + i * growth),
                nn.ReLU(),
                nn.Conv2d(16 + i * growth, growth, 3, padding=1, bias=False),
            )
            for i in range(2)
        )
        self.transition = nn.Sequential(
            nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 1, bias=False), nn.AvgPool2d(2, 2)
        )
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        features = [self.conv0(x)]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        x = torch.relu(self.transition(torch.cat(features, 1)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class SqueezeNet(nn.Module):
    """Fire modules (squeeze 1x1, expand 1x1 and 3x3, cat) between ceil-mode max pools."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 2)
        self.pool = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.squeeze = nn.Conv2d(16, 4, 1)
        self.expand1, self.expand3 = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3, padding=1)
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(16, 10, 1), nn.ReLU())

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        s = torch.relu(self.squeeze(x))
        x = torch.cat([torch.relu(self.expand1(s)), torch.relu(self.expand3(s))], 1)
        x = self.classifier(x)
        return torch.flatten(nn.functional.adaptive_avg_pool2d(x, (1, 1)), 1)


HELD_OUT = {
    "mobilenet_v3": MobileNetV3,
    "shufflenet_v2": ShuffleNetV2,
    "split_shuffle": SplitShuffle,
    "resnet": ResNet,
    "efficientnet": EfficientNet,
    "vit": ViT,
    "densenet": DenseNet,
    "squeezenet": SqueezeNet,
}


class ChannelSoftmax(nn.Module):
    """A softmax over the channels of an image (dim 1 of 4): XNNPACK's is for the last dim only."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.softmax(y, dim=1) * torch.softmax(y, dim=-1)


class Between(nn.Module):
    """conv -> ``op`` -> conv: an op XNNPACK constrains, between two int8 convs."""

    def __init__(self, op):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.op = op

    def forward(self, x):
        return self.conv2(self.op(self.conv1(x)))


def strided_slice():
    """Every second column: XNNPACK slices with step 1 only, so this one stays portable."""
    return Between(lambda t: t[..., ::2])


def cropping_pad():
    """A negative pad crops: XNNPACK's pad only pads, so this one stays portable."""
    return Between(lambda t: nn.functional.pad(t, (-1, -1, -1, -1)))


def zero_pad():
    """A zero pad of H and W: XNNPACK runs it in float (or in the conv it feeds: see below)."""
    return Between(lambda t: nn.functional.pad(t, (1, 1, 1, 1)))


def column_slice():
    """Columns 2 to 10 of W: an int8 slice, its scale and zero point its input's."""
    return Between(lambda t: t[..., 2:10])


EXTRA_MODELS = {
    "global_mean_head": GlobalMeanHead,
    "strided_max_pool": StridedMaxPool,
    "channel_softmax": ChannelSoftmax,
    "strided_slice": strided_slice,
    "cropping_pad": cropping_pad,
    "zero_pad": zero_pad,
    "column_slice": column_slice,
    **HELD_OUT,
}
# XNNPACK's own lowering fails on these after partitioning (preprocess), with these words
# (unfolded_bn: both partitioners delegate its float batch norms, and preprocess refuses one).
XNNPACK_FAILS = {
    "buffer_mutation": "ChannelsLastTaggedReshapePass",
    "unfolded_bn": "Weight and Input should both be quantized",
}
MATRIX = [*MODEL_NAMES, *LARGE_MODEL_NAMES, *TEST_MODELS, *EXTRA_MODELS]
# A BatchNorm left in the graph makes torchao export its patterns: on their worker (marks.py).
UNFOLDED_BN = {"unfolded_bn", "densenet"}


def on_their_worker(names):
    return [pytest.param(n, marks=ON_THE_PATTERN_WORKER) if n in UNFOLDED_BN else n for n in names]


def inputs(name: str, seed: int = 0) -> tuple:
    shape = input_shape(name) if name in LARGE_MODEL_NAMES else input_shape("conv_relu")
    return example_inputs(2, seed=seed, shape=shape)


def make(name: str) -> nn.Module:
    if name in EXTRA_MODELS:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return EXTRA_MODELS[name]().eval()
    return get_model(name) if name in LARGE_MODEL_NAMES else build(name)


def quantized(name: str, quantizer=None) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_module(make(name), inputs(name)), quantizer or xnnpack())
    with torch.no_grad():
        for seed in range(2):
            prepared(*inputs(name, seed))
    return convert_pt2e(prepared)


def xnnpack(**config):
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(**config))


def run(buffer: bytes, x) -> torch.Tensor:
    with contextlib.redirect_stderr(io.StringIO()):  # the runtime's [cpuinfo_utils.cpp] lines
        program = Runtime.get().load_program(buffer)  # a Method does not keep its Program alive
        method = program.load_method("forward")
    return method.execute([*x])[0]


def assert_both_agree(program) -> BothPartitioners:
    """Partition ``program`` with both; they keep the same ops whole, tag the same partitions
    and fold the same q/dq nodes."""
    both = BothPartitioners()
    with pytest.raises(Partitioned):
        to_edge_transform_and_lower(program, partitioner=[both])
    assert both.refused is None, f"CoursePartitioner refused it: {both.refused}"
    assert both.kept_whole["course"] == both.kept_whole["xnnpack"], "different ops kept whole"
    (their_partitions, their_folded), (my_partitions, my_folded) = (
        both.tagged["xnnpack"],
        both.tagged["course"],
    )
    assert my_partitions == their_partitions, "the partitions differ"
    assert my_folded == their_folded, "different q/dq nodes are folded into int8 tensors"
    return both


def tagged(both: BothPartitioners, node: str) -> bool:
    return any(node in partition for partition in both.tagged["course"][0])


@pytest.mark.parametrize("name", on_their_worker(MATRIX))
def test_course_partitioner_tags_exactly_what_xnnpack_tags(name):
    assert_both_agree(torch.export.export(quantized(name), inputs(name)))


@pytest.mark.parametrize(
    ("name", "node", "delegated"),
    [
        ("strided_slice", "aten_slice_copy_tensor", False),
        ("cropping_pad", "aten_constant_pad_nd_default", False),
        ("zero_pad", "aten_constant_pad_nd_default", True),
        ("column_slice", "aten_slice_copy_tensor", True),
    ],
)
def test_the_constraints_keep_what_xnnpack_keeps_off(name, node, delegated):
    """The matrix test's models for a constraint: the op is delegated, or not, as said."""
    both = assert_both_agree(torch.export.export(quantized(name), inputs(name)))
    assert tagged(both, node) == delegated


def without_quantize_after(model: torch.fx.GraphModule, op: str) -> torch.fx.GraphModule:
    """``model`` with the quantize/dequantize pair after the ``op`` node removed: the op's
    float output goes straight to its user (a graph XNNPACKQuantizer does not make)."""
    (node,) = [n for n in model.graph.nodes if n.op == "call_function" and op in str(n.target)]
    (quantize,) = node.users
    (dequantize,) = quantize.users
    dequantize.replace_all_uses_with(node)
    model.graph.erase_node(dequantize)
    model.graph.erase_node(quantize)
    model.recompile()
    return model


def with_scale_after(model: torch.fx.GraphModule, op: str, factor: float):
    """``model`` with the scale of the quantize/dequantize pair after ``op`` times ``factor``."""
    (node,) = [n for n in model.graph.nodes if n.op == "call_function" and op in str(n.target)]
    (quantize,) = node.users
    (dequantize,) = quantize.users
    for q in (quantize, dequantize):
        q.args = (q.args[0], q.args[1] * factor, *q.args[2:])
    model.recompile()
    return model


def differs(program) -> bool:
    both = BothPartitioners()
    with pytest.raises(Partitioned):
        to_edge_transform_and_lower(program, partitioner=[both])
    return both.tagged["course"] != both.tagged["xnnpack"]


def test_a_zero_pad_read_by_an_int8_conv_alone_joins_the_conv(monkeypatch):
    """dequantize -> pad -> conv: XNNPACK makes the pad the conv's padding, the dequantize
    before it folded into the int8 conv; both partitioners take the pad into the conv's
    pattern (without that rule, the course's would differ)."""
    model = without_quantize_after(quantized("zero_pad"), "pad")
    program = torch.export.export(model, inputs("zero_pad"))
    both = assert_both_agree(program)
    assert tagged(both, "aten_constant_pad_nd_default")
    monkeypatch.setattr(edge, "_conv_absorbs", lambda pad: False)
    assert differs(program), "the test reaches the rule"


def test_an_int8_slice_that_rescales_is_left_out(monkeypatch):
    """XNNPACK's int8 slice keeps its input's scale: a quantize with another scale after it
    keeps the slice off XNNPACK, for both partitioners (without that constraint, the
    course's would differ)."""
    model = with_scale_after(quantized("column_slice"), "slice", 2.0)
    program = torch.export.export(model, inputs("column_slice"))
    both = assert_both_agree(program)
    assert not tagged(both, "aten_slice_copy_tensor")
    monkeypatch.setitem(edge.SUPPORTED, "slice_copy.Tensor", edge.Op(int8=True))
    assert differs(program), "the test reaches the constraint"


def test_a_layer_left_float_is_a_float_gemm_for_both():
    """XNNPACKQuantizer leaves the first conv float: both delegate it as a float conv, with
    its constant weight and bias and the ReLU after it."""
    program = refused_program(TwoConvs(), all_but("conv2d")())
    both = assert_both_agree(program)
    assert tagged(both, "aten_convolution_default") and tagged(both, "aten_relu_default")


def test_a_table_without_xnnpacks_constraint_is_caught(monkeypatch):
    """Dropping mean.dim's keepdim constraint delegates a mean XNNPACK leaves portable."""
    monkeypatch.setitem(edge.SUPPORTED, "mean.dim", edge.Op(int8=True))
    program = torch.export.export(quantized("global_mean_head"), inputs("global_mean_head"))
    both = BothPartitioners()
    with pytest.raises(Partitioned):
        to_edge_transform_and_lower(program, partitioner=[both])
    assert both.tagged["course"][0] != both.tagged["xnnpack"][0], "the matrix test would fail"


# The runtime comparison lowers each model twice, to the end: the zoo, the models that keep
# nodes on the portable kernels, the M02 test models with ops the zoo lacks, and the held-out
# models whose ops only they have.
RUNTIME = [
    *MODEL_NAMES,
    "global_mean_head",
    "strided_max_pool",
    "residual",
    "pools",
    "relu6_two_users",
    "cat_branches",
    "batched_linear",
    "conv_sigmoid",
    "transpose_bn",
    # held out: hardswish and a delegated batch norm; split, layer norm, select portable
    "mobilenet_v3",
    "shufflenet_v2",
    "vit",
    "densenet",
]


@pytest.fixture(scope="module")
def both_lowered():
    cache = {}

    def get(name):
        if name not in cache:
            program = torch.export.export(quantized(name), inputs(name))
            cache[name] = [
                to_edge_transform_and_lower(program, partitioner=[p])
                for p in (XnnpackPartitioner(), edge.CoursePartitioner())
            ]
        return cache[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", on_their_worker(RUNTIME))
def test_both_programs_give_equal_outputs_on_the_executorch_runtime(both_lowered, name):
    theirs, mine = both_lowered(name)
    assert edge.delegated(mine.exported_program()) == edge.delegated(theirs.exported_program())
    # to_executorch plans memory in place: once per program.
    their_buffer, my_buffer = theirs.to_executorch().buffer, mine.to_executorch().buffer
    for seed in (0, 100):
        x = inputs(name, seed)
        assert torch.equal(run(my_buffer, x), run(their_buffer, x)), "runtime outputs differ"


@pytest.mark.parametrize("name", on_their_worker(XNNPACK_FAILS))
def test_where_xnnpack_fails_the_course_partitioner_fails_alike(name):
    words = XNNPACK_FAILS[name]
    program = torch.export.export(quantized(name), inputs(name))
    for partitioner in (XnnpackPartitioner(), edge.CoursePartitioner()):
        with pytest.raises(Exception, match=words):
            to_edge_transform_and_lower(program, partitioner=[partitioner])


@pytest.mark.slow
def test_matrix_has_delegates_and_portable_nodes(both_lowered):
    """The matrix reaches both outcomes: a model fully delegated, one with a portable node."""
    full, _ = both_lowered("conv_relu")
    split, _ = both_lowered("global_mean_head")
    assert len(edge.delegated(full.exported_program())) == 1
    portable = [
        n.name
        for n in split.exported_program().graph.nodes
        if n.op == "call_function" and "mean" in str(n.target)
    ]
    assert portable and len(edge.delegated(split.exported_program())) == 2


# --- What CoursePartitioner refuses, loudly --------------------------------------------------


class PReLU(nn.Module):
    """XNNPACK keeps prelu whole (a float op); the table does not know it."""

    def __init__(self):
        super().__init__()
        self.conv, self.act = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8)

    def forward(self, x):
        return self.act(self.conv(x))


class CumSum(nn.Module):
    """A cumulative sum after a conv: an op neither table lists."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return torch.cumsum(self.conv(x), dim=1)


def refused_program(model, quantizer):
    x = example_inputs(2)
    prepared = prepare_pt2e(export_module(model.eval(), x), quantizer)
    calibrate(prepared)
    return torch.export.export(convert_pt2e(prepared), x)


def all_but(node_name):
    """XNNPACKQuantizer's global config on every node except ``node_name`` (left in float)."""
    return lambda: xnnpack(is_per_channel=True).set_filter_function(lambda n: n.name != node_name)


REFUSED = [
    # (model, quantizer, the node the message names, words it must contain)
    (PReLU, xnnpack, "prelu", "does not know prelu.default"),
    (CumSum, xnnpack, "aten_cumsum_default", "does not know cumsum.default"),
    (
        lambda: build("linear_relu"),
        lambda: xnnpack(is_dynamic=True),
        "quantized_decomposed_choose_qparams",
        "does not know choose_qparams",
    ),
]


@pytest.mark.parametrize(("make_model", "make_quantizer", "node", "words"), REFUSED)
def test_unknown_nodes_raise_naming_the_node(make_model, make_quantizer, node, words):
    program = refused_program(make_model(), make_quantizer())
    with pytest.raises(NotImplementedError, match=words) as refused:
        to_edge_transform_and_lower(program, partitioner=[edge.CoursePartitioner()])
    assert f"'{node}" in str(refused.value), "the error names the node"


def test_a_float_graph_is_refused_with_the_way_to_quantize_it():
    x = example_inputs(2)
    program = torch.export.export(get_model("conv_relu"), x)
    with pytest.raises(ValueError, match="no quantize or dequantize node") as refused:
        to_edge_transform_and_lower(program, partitioner=[edge.CoursePartitioner()])
    assert "xnnpack_quantizer()" in str(refused.value) and "XnnpackPartitioner" in str(
        refused.value
    )


def test_a_uint8_graph_is_refused_pointing_to_the_x86_lowering():
    from common.pt2e import x86_quantizer

    program = refused_program(get_model("conv_relu"), x86_quantizer())
    with pytest.raises(ValueError, match="int8 activations") as refused:
        to_edge_transform_and_lower(program, partitioner=[edge.CoursePartitioner()])
    assert "torch.uint8" in str(refused.value)


def test_graph_module_and_exported_program_are_not_mixed_up():
    x = example_inputs(2)
    model = quantized("conv_relu")
    program = torch.export.export(model, x)
    with pytest.raises(TypeError, match="expects an ExportedProgram, got a GraphModule") as e:
        edge.CoursePartitioner().partition(model)
    assert "torch.export.export(gm" in str(e.value), "the message says how to get one"
    with pytest.raises(TypeError, match="expects the GraphModule") as e:
        edge.to_executorch(program, x)
    assert "program.module()" in str(e.value), "the message says how to get one"


def test_to_executorch_defaults_to_the_course_partitioner():
    x = example_inputs(2)
    manager = edge.to_executorch(quantized("conv_relu"), x)
    (names,) = edge.delegated(manager.exported_program()).values()
    assert "aten_convolution_default" in names


def test_course_partitioner_is_an_executorch_partitioner():
    assert isinstance(edge.CoursePartitioner(), Partitioner)
    assert set(edge.SUPPORTED) >= {"convolution.default", "linear.default", "mean.dim"}


def test_lower_names_the_x86_lowering_only():
    assert not hasattr(edge, "lower"), "ExecuTorch's lowering is edge.to_executorch"


class MeanThenNorm(nn.Module):
    """A conv, a mean without keepdim (XNNPACK's mean config refuses it), a layer norm (no
    config at all), then a linear."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(3, 8, 3), nn.LayerNorm(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x).relu().mean(dim=(2, 3))))


def test_left_outside_names_each_op_outside_the_delegates_and_why():
    x = (torch.randn(1, 3, 8, 8),)
    prepared = prepare_pt2e(export_module(MeanThenNorm().eval(), x), edge.xnnpack_quantizer())
    prepared(*x)
    program = torch.export.export(convert_pt2e(prepared), x)
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    outside = edge.left_outside(lowered.exported_program())
    mean = [reason for reason in outside.values() if reason.startswith("mean.dim: ")]
    norm = [reason for reason in outside.values() if reason.startswith("native_layer_norm")]
    assert len(mean) == 1 and "keepdim" in mean[0], outside
    assert norm == [f"native_layer_norm.default: {edge.PORTABLE['native_layer_norm.default']}"]
    assert not any(r.startswith(("convolution", "linear")) for r in outside.values()), outside
    everything = to_edge_transform_and_lower(
        torch.export.export(TwoConvs().eval(), (torch.randn(1, 3, 8, 8),)),
        partitioner=[XnnpackPartitioner()],
    )
    assert edge.left_outside(everything.exported_program()) == {}, "a float conv net: all in"
