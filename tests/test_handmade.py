"""common.handmade against torchao: the same graphs, qparams and bit-identical outputs."""

import collections
import copy

import pytest
import torch
from torch import nn

from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer

quiet()

from torchao.quantization.pt2e.observer import PlaceholderObserver  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    DerivedQuantizationSpec,
    QuantizationAnnotation,
)
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade  # noqa: E402
from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer  # noqa: E402

# deepcopy of an exported GraphModule warns inside torch (quiet() silences it, pytest resets it).
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning")

C, H, W = 3, 16, 16  # the zoo's image shape: every test model takes example_inputs(...)


# --- Test-only models: layer kinds common in real CNNs and MLPs that the zoo does not have ------


class ConvNoBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1, bias=False)

    def forward(self, x):
        return torch.relu(self.conv(x))


class StridedDepthwise(nn.Module):
    """Stride 2, then a depthwise conv (groups == channels), then a 1x1 pointwise conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 16, 1)

    def forward(self, x):
        return self.pointwise(torch.relu(self.depthwise(torch.relu(self.stem(x)))))


class ConvBN(nn.Module):
    """conv -> bn with no relu, and a bias-free conv -> bn (folding must create the bias)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(self.bn1(self.conv1(x)))))


class MLP(nn.Module):
    """flatten -> (linear -> relu) x 2 -> linear."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(C * H * W, 64),
            nn.ReLU(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )

    def forward(self, x):
        return self.layers(x)


class LinearBN(nn.Module):
    """2-D linear -> BatchNorm1d, folded like conv -> bn."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(C * H * W, 32)
        self.bn = nn.BatchNorm1d(32)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(torch.flatten(x, 1)))))


class Residual(nn.Module):
    """A ResNet basic block: conv-bn-relu, conv-bn, + skip, relu."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(x + y)


class Pools(nn.Module):
    """avg pool and adaptive avg pool between convs, then a classifier head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.gap(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class ReLU6Hardtanh(nn.Module):
    """MobileNet's relu6 (a hardtanh in the graph) after a conv, and a max pool with 2 users."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)
        self.act = nn.ReLU6()
        self.pool = nn.MaxPool2d(2)
        self.left = nn.Conv2d(8, 8, 1)
        self.right = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = self.pool(self.act(self.conv(x)))
        return self.left(x) * self.right(x)


class CatBranches(nn.Module):
    """Inception-style: the input feeds two convs, their outputs are concatenated."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(C, 4, 1)
        self.b = nn.Conv2d(C, 4, 3, padding=1)
        self.mix = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.mix(torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1))


class BatchedLinear(nn.Module):
    """Linear on a 3-D input (batch, tokens, features), as in transformers' MLP blocks."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(C * W, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        tokens = x.permute(0, 2, 1, 3).reshape(x.shape[0], H, C * W)
        return self.fc2(torch.relu(self.fc1(tokens)))


class Conv1d(nn.Module):
    """conv1d over the flattened image rows, and a conv whose output has two users."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(C, 8, 5, padding=2)
        self.proj = nn.Conv1d(8, 8, 1)

    def forward(self, x):
        y = self.conv(x.flatten(2))
        return self.proj(y) + torch.relu(y)


TEST_MODELS = {
    "conv_no_bias": ConvNoBias,
    "strided_depthwise": StridedDepthwise,
    "conv_bn": ConvBN,
    "mlp": MLP,
    "linear_bn": LinearBN,
    "residual": Residual,
    "pools": Pools,
    "relu6_two_users": ReLU6Hardtanh,
    "cat_branches": CatBranches,
    "batched_linear": BatchedLinear,
    "conv1d": Conv1d,
}


def build(name: str) -> nn.Module:
    """A zoo model, or a test-only model with seeded weights and trained-looking BatchNorm."""
    if name in MODEL_NAMES:
        return get_model(name)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = TEST_MODELS[name]()
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
                n = module.num_features
                with torch.no_grad():
                    module.running_mean.copy_(torch.randn(n) * 0.1)
                    module.running_var.copy_(torch.rand(n) + 0.5)
                    module.weight.copy_(torch.rand(n) + 0.5)
                    module.bias.copy_(torch.randn(n) * 0.1)
    return model.eval()


QUANTIZERS = {"course": CourseQuantizer, "x86": x86_quantizer}
MATRIX = [(m, q) for m in (*MODEL_NAMES, *TEST_MODELS) for q in QUANTIZERS]


def call_function_targets(gm) -> collections.Counter:
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def observers(gm) -> dict:
    return {
        name: module
        for name, module in gm.named_modules(remove_duplicate=False)
        if handmade.is_observer_node(
            gm, next(iter(gm.graph.find_nodes(op="call_module", target=name)), None)
        )
    }


@pytest.fixture(scope="module")
def both_prepared():
    """model x quantizer -> (torchao's prepared, handmade's prepared), calibrated identically."""
    cache = {}

    def get(model_name, quantizer_name):
        if (model_name, quantizer_name) not in cache:
            pair = []
            for prepare in (prepare_pt2e, handmade.prepare):
                gm = export_module(build(model_name), example_inputs(8))
                prepared = prepare(gm, QUANTIZERS[quantizer_name]())
                calibrate(prepared)
                pair.append(prepared)
            cache[model_name, quantizer_name] = tuple(pair)
        # convert edits its input in place: every test gets its own copies.
        return copy.deepcopy(cache[model_name, quantizer_name])

    return get


@pytest.mark.parametrize(("model_name", "quantizer_name"), MATRIX)
def test_prepare_matches_torchao(both_prepared, model_name, quantizer_name):
    theirs, ours = both_prepared(model_name, quantizer_name)
    ours.graph.lint()
    assert ours.code == theirs.code, "the observed graphs differ"
    if quantizer_name == "course":
        assert observers(theirs), "the case observes nothing: a useless test"
    assert observers(ours).keys() == observers(theirs).keys()
    for name, observer in observers(theirs).items():
        for mine, expected in zip(
            observers(ours)[name].calculate_qparams(), observer.calculate_qparams(), strict=True
        ):
            assert torch.equal(mine, expected), f"{name}: qparams differ"


@pytest.mark.parametrize(("model_name", "quantizer_name"), MATRIX)
def test_convert_matches_torchao_bit_for_bit(both_prepared, model_name, quantizer_name):
    theirs, ours = both_prepared(model_name, quantizer_name)
    expected = convert_pt2e(theirs)
    mine = handmade.convert(ours)
    mine.graph.lint()
    assert call_function_targets(mine) == call_function_targets(expected)
    assert mine.code == expected.code, "the converted graphs differ"
    assert mine.state_dict().keys() == expected.state_dict().keys()
    for key, value in expected.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value), f"{key} differs"
    for seed in (0, 100):
        x = example_inputs(8, seed=seed)
        assert torch.equal(mine(*x), expected(*x)), "outputs differ"


def test_matrix_covers_the_interesting_cases(both_prepared):
    """The test models really exercise sharing, dequantize duplication and bias creation."""
    theirs, _ = both_prepared("relu6_two_users", "x86")
    converted = convert_pt2e(theirs)
    dq_users = [len(n.users) for n in converted.graph.nodes if "dequantize" in str(n.target)]
    assert max(dq_users) == 1, "every dequantize has one user after duplication"
    theirs, _ = both_prepared("cat_branches", "course")
    shared = [n for n, m in theirs.named_modules(remove_duplicate=False) if "activation" in n]
    assert len(shared) > len(set(map(id, observers(theirs).values()))), "cat shares observers"
    _, ours = both_prepared("conv_bn", "course")
    assert hasattr(ours.conv2, "weight_bias"), "folding bn into a bias-free conv adds a bias"


def test_convert_accepts_torchaos_prepared_model_and_vice_versa(both_prepared):
    x = example_inputs(8, seed=7)
    theirs, ours = both_prepared("small_cnn", "course")
    assert torch.equal(handmade.convert(theirs)(*x), convert_pt2e(ours)(*x))


def test_fold_quantize_false_keeps_the_weight_quantize(both_prepared):
    theirs, ours = both_prepared("conv_bn_relu", "x86")
    expected, mine = (
        convert_pt2e(theirs, fold_quantize=False),
        handmade.convert(ours, fold_quantize=False),
    )
    assert mine.code == expected.code
    assert "quantize_per_channel" in str(call_function_targets(mine))
    x = example_inputs(8)
    assert torch.equal(mine(*x), expected(*x))


# --- What handmade refuses, loudly ------------------------------------------------------------


class BNFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(C)
        self.conv = nn.Conv2d(C, 8, 3)

    def forward(self, x):
        return self.conv(self.bn(x))


class BatchedLinearBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(W, W)
        self.bn = nn.BatchNorm1d(C * H)

    def forward(self, x):
        return self.bn(self.fc(x.flatten(1, 2)))


class ConvTransposeBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(C, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.up(x))


class BiasQuantizer(CourseQuantizer):
    """The course quantizer plus an int32 bias derived from the input and weight scales."""

    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.nodes:
            if node.target == torch.ops.aten.conv2d.default and len(node.args) > 2:
                x, w, bias = node.args[:3]
                spec = DerivedQuantizationSpec(
                    derived_from=[(x, node), (w, node)],
                    derive_qparams_fn=lambda obs: (obs[0].scale * obs[1].scale, obs[1].zero_point),
                    dtype=torch.int32,
                    quant_min=-(2**31),
                    quant_max=2**31 - 1,
                    qscheme=torch.per_channel_symmetric,
                    ch_axis=0,
                )
                annotation = node.meta["quantization_annotation"]
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    {**annotation.input_qspec_map, bias: spec},
                    annotation.output_qspec,
                    _annotated=True,
                )
        return model


def dynamic_x86():
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return X86InductorQuantizer().set_global(config)


UNSUPPORTED = [
    # (model, quantizer, the node the message must name, words the message must contain)
    (BNFirst, CourseQuantizer, "batch_norm", "batch norm"),
    (BatchedLinearBN, CourseQuantizer, "batch_norm", "batch norm"),
    (ConvTransposeBN, CourseQuantizer, "batch_norm", "batch norm"),
    (lambda: get_model("conv_relu"), BiasQuantizer, "conv2d", "DerivedQuantizationSpec"),
    (lambda: get_model("linear_relu"), dynamic_x86, "linear", "dynamic"),
]


@pytest.mark.parametrize(("make_model", "make_quantizer", "node", "words"), UNSUPPORTED)
def test_unsupported_patterns_raise_naming_the_node(make_model, make_quantizer, node, words):
    gm = export_module(make_model().eval(), example_inputs(8))
    with pytest.raises(NotImplementedError, match=words) as error:
        handmade.prepare(gm, make_quantizer())
    assert f"node {node!r}" in str(error.value)
    assert "torchao" in str(error.value), "the message says what to use instead"


def test_unsupported_observer_in_convert_names_the_node():
    ours = handmade.prepare(
        export_module(get_model("conv_relu"), example_inputs(8)), CourseQuantizer()
    )
    calibrate(ours)
    name = next(iter(observers(ours)))
    ours.add_submodule(name, PlaceholderObserver(dtype=torch.float16))
    with pytest.raises(NotImplementedError, match=f"node {name!r}"):
        handmade.convert(ours)


def test_course_quantizer_specs_are_what_the_docs_say():
    assert (ACTIVATION_SPEC.dtype, ACTIVATION_SPEC.qscheme) == (torch.int8, torch.per_tensor_affine)
    assert (WEIGHT_SPEC.qscheme, WEIGHT_SPEC.ch_axis) == (torch.per_channel_symmetric, 0)
