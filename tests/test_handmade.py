"""common.handmade against torchao: the same graphs, qparams and bit-identical outputs.

The matrix: every model x (course quantizer, X86InductorQuantizer, ExecuTorch's
XNNPACKQuantizer, the model's own category quantizer) x (non-strict, strict export). Where
torchao itself fails, handmade must fail alike.
"""

import collections
import copy
import warnings

import pytest
import torch
from torch import nn

from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer

from conftest import ON_THE_PATTERN_WORKER, pattern_key

quiet()

from torchao.quantization.pt2e.observer import MinMaxObserver, PlaceholderObserver  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
)
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade  # noqa: E402
from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer  # noqa: E402

# deepcopy of an exported GraphModule warns inside torch (quiet() silences it, pytest resets it).
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning")

aten = torch.ops.aten
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


class ResidualInPlace(nn.Module):
    """ResNet code as people write it: ``out += identity`` (aten.add_), and an in-place mul_."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        identity = torch.relu(self.stem(x))
        out = self.conv(identity)
        out += identity
        out *= identity
        return torch.relu(out)


class ConvSigmoid(nn.Module):
    """conv -> sigmoid: a bias to quantize in int32, an output with fixed qparams."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))


class SamePaddingTransposeBN(nn.Module):
    """BatchNorm after a padding="same" conv (aten.conv2d.padding) and after a transposed conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding="same")
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn_up = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn_up(self.up(torch.relu(self.bn(self.conv(x)))))


class TransposeBN(nn.Module):
    """conv-transpose -> BatchNorm alone (the x86 quantizer refuses conv2d.padding)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.up(torch.relu(self.conv(x))))


class UnfoldedBN(nn.Module):
    """BatchNorms that stay in float: one with no conv before it, one after a 3-D linear
    (torchao does not fold that one and warns)."""

    def __init__(self):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(C)
        self.conv = nn.Conv2d(C, 4, 3, padding=1)
        self.fc = nn.Linear(W, W)
        self.bn = nn.BatchNorm1d(4 * H)

    def forward(self, x):
        return self.bn(self.fc(self.conv(self.bn_in(x)).flatten(1, 2)))


class TransposedWeight(nn.Module):
    """The linear reads ``weight.t()``: folding must quantize a computed constant."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(C * H * W, 10) * 0.02)

    def forward(self, x):
        return torch.nn.functional.linear(x.flatten(1), self.weight.t())


class BufferMutation(nn.Module):
    """Buffers updated in forward (a call counter, a running statistic) next to a conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("last_mean", torch.zeros(()))
        self.register_buffer("gain", torch.ones(8, 1, 1))

    def forward(self, x):
        self.calls.add_(1)
        y = torch.relu(self.conv(x)) * self.gain
        self.last_mean.copy_(y.mean())
        self.gain.copy_(self.gain * 1.0)
        return y


class ReusedReLU(nn.Module):
    """One nn.ReLU called twice: X86InductorQuantizer fails on it after non-strict export."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


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
    "residual_in_place": ResidualInPlace,
    "conv_sigmoid": ConvSigmoid,
    "same_padding_transpose_bn": SamePaddingTransposeBN,
    "transpose_bn": TransposeBN,
    "unfolded_bn": UnfoldedBN,
    "transposed_weight": TransposedWeight,
    "buffer_mutation": BufferMutation,
    "reused_relu": ReusedReLU,
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


# --- Quantizers for the categories the course and x86 quantizers do not reach ---------------


def _annotate(node, inputs=None, output=None):
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map=inputs or {}, output_qspec=output, _annotated=True
    )


def _add_input(node, source, spec):
    node.meta["quantization_annotation"].input_qspec_map[source] = spec


class InPlaceQuantizer(CourseQuantizer):
    """Also quantizes the in-place residual ``add_`` and ``mul_`` (inputs and output)."""

    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.nodes:
            if node.target in (aten.add_.Tensor, aten.mul_.Tensor):
                a, b = node.args[:2]
                _annotate(node, {a: ACTIVATION_SPEC, b: ACTIVATION_SPEC}, ACTIVATION_SPEC)
        return model


class FloatBiasQuantizer(CourseQuantizer):
    """Watches each conv bias with a float32 PlaceholderObserver, which convert drops."""

    def annotate(self, model):
        super().annotate(model)
        spec = QuantizationSpec(dtype=torch.float32, observer_or_fake_quant_ctr=PlaceholderObserver)
        for node in model.graph.find_nodes(op="call_function", target=aten.conv2d.default):
            _add_input(node, node.args[2], spec)
        return model


def _bias_qparams(observers):
    activation, weight = observers
    return activation.calculate_qparams()[0] * weight.calculate_qparams()[0], torch.zeros(
        weight.calculate_qparams()[1].shape, dtype=torch.int32
    )


class Int32BiasQuantizer(CourseQuantizer):
    """int32 bias with scale = input scale x weight scale (DerivedQuantizationSpec)."""

    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.conv2d.default):
            x, weight, bias = node.args[:3]
            spec = DerivedQuantizationSpec(
                derived_from=[(x, node), (weight, node)],
                derive_qparams_fn=_bias_qparams,
                dtype=torch.int32,
                quant_min=-(2**31),
                quant_max=2**31 - 1,
                qscheme=torch.per_channel_symmetric,
                ch_axis=0,
            )
            _add_input(node, bias, spec)
        return model


class FixedSigmoidQuantizer(CourseQuantizer):
    """sigmoid's output lies in [0, 1]: fixed scale 1/256, zero point 0, uint8."""

    def annotate(self, model):
        super().annotate(model)
        fixed = FixedQParamsQuantizationSpec(
            dtype=torch.uint8, scale=1 / 256, zero_point=0, quant_min=0, quant_max=255
        )
        for node in model.graph.find_nodes(op="call_function", target=aten.sigmoid.default):
            _annotate(node, {node.args[0]: ACTIVATION_SPEC}, fixed)
        return model


class FP16Quantizer(Quantizer):
    """conv/linear inputs, weights and outputs as float16 round trips."""

    def annotate(self, model):
        spec = QuantizationSpec(dtype=torch.float16, observer_or_fake_quant_ctr=PlaceholderObserver)
        for node in model.graph.nodes:
            if node.target in (aten.conv2d.default, aten.linear.default):
                _annotate(node, {node.args[0]: spec, node.args[1]: spec}, spec)
        return model

    def validate(self, model):
        pass


class LinearWeightQuantizer(Quantizer):
    """linear input and weight edge in int8, whatever computes the weight."""

    def annotate(self, model):
        for node in model.graph.find_nodes(op="call_function", target=aten.linear.default):
            x, weight = node.args[:2]
            _annotate(node, {x: ACTIVATION_SPEC, weight: WEIGHT_SPEC}, ACTIVATION_SPEC)
        return model

    def validate(self, model):
        pass


def dynamic_x86():
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return X86InductorQuantizer().set_global(config)


def xnnpack(**options):
    """ExecuTorch's XNNPACKQuantizer, per-channel weights (imported here: executorch is slow)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=True, **options)
    return XNNPACKQuantizer().set_global(config)


def xnnpack_dynamic():
    return xnnpack(is_dynamic=True)


QUANTIZERS = {
    "course": CourseQuantizer,
    "x86": x86_quantizer,
    "xnnpack": xnnpack,
    "xnnpack_dynamic": xnnpack_dynamic,
    "in_place": InPlaceQuantizer,
    "float_bias": FloatBiasQuantizer,
    "int32_bias": Int32BiasQuantizer,
    "fixed_sigmoid": FixedSigmoidQuantizer,
    "fp16": FP16Quantizer,
    "x86_dynamic": dynamic_x86,
    "linear_weight": LinearWeightQuantizer,
}
# Every model meets the course and x86 quantizers; these also meet their category's own.
OWN_QUANTIZERS = {
    "residual_in_place": ["in_place"],
    "conv_sigmoid": ["float_bias", "int32_bias", "fixed_sigmoid"],
    "mlp": ["x86_dynamic", "xnnpack_dynamic", "fp16"],
    "transposed_weight": ["linear_weight", "x86_dynamic", "fp16"],
    "residual": ["xnnpack_dynamic"],
    "batched_linear": ["xnnpack_dynamic"],
}
EXPORTS = {"nonstrict": False, "strict": True}
# Where torchao itself raises, handmade must raise the same error (it runs the same annotate).
TORCHAO_FAILS = {
    ("same_padding_transpose_bn", "x86"): (ValueError, "is not an aten conv2d operator"),
    ("reused_relu", "x86", "nonstrict"): (ValueError, "more than one output node"),
}
# With a BatchNorm left in the graph, torchao's convert_pt2e exports its QAT conv-bn patterns
# to look for them (~15 s, once per test worker: tests/conftest.py); these cases run unless
# deselected with -m "not slow".
SLOW_MODELS = {"unfolded_bn"}
SLOW = [pytest.mark.slow, ON_THE_PATTERN_WORKER]
MATRIX = [
    pytest.param(m, q, e, id=f"{m}-{q}-{e}", marks=SLOW if m in SLOW_MODELS else [])
    for m in (*MODEL_NAMES, *TEST_MODELS)
    for q in ("course", "x86", "xnnpack", *OWN_QUANTIZERS.get(m, ()))
    for e in EXPORTS
]


def torchao_failure(model_name, quantizer_name, export):
    return TORCHAO_FAILS.get((model_name, quantizer_name)) or TORCHAO_FAILS.get(
        (model_name, quantizer_name, export)
    )


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


_EXPORTED = {}


def exported(model_name, export="nonstrict"):
    """A fresh copy of the model's exported GraphModule (each model is exported once per mode)."""
    if (model_name, export) not in _EXPORTED:
        program = torch.export.export(build(model_name), example_inputs(2), strict=EXPORTS[export])
        _EXPORTED[model_name, export] = program.module()
    return copy.deepcopy(_EXPORTED[model_name, export])


def prepare_both(model_name, quantizer_name, export="nonstrict"):
    """(torchao's, handmade's) prepared and calibrated models, and the BN warnings of each."""
    pair, notes = [], []
    for prepare in (prepare_pt2e, handmade.prepare):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prepared = prepare(exported(model_name, export), QUANTIZERS[quantizer_name]())
        notes.append([str(w.message) for w in caught if "fusing" in str(w.message)])
        calibrate(prepared, batches=1)
        pair.append(prepared)
    return (*pair, notes)


def assert_same_state(mine, expected):
    assert mine.state_dict().keys() == expected.state_dict().keys()
    for key, value in expected.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value), f"{key} differs"


@pytest.mark.parametrize(("model_name", "quantizer_name", "export"), MATRIX)
def test_matches_torchao_bit_for_bit(model_name, quantizer_name, export):
    """prepare and convert give torchao's code, observers, state dict and outputs exactly."""
    if failure := torchao_failure(model_name, quantizer_name, export):
        for prepare in (prepare_pt2e, handmade.prepare):
            with pytest.raises(failure[0], match=failure[1]):
                prepare(exported(model_name, export), QUANTIZERS[quantizer_name]())
        return
    theirs, ours, (their_notes, our_notes) = prepare_both(model_name, quantizer_name, export)
    ours.graph.lint()
    assert ours.code == theirs.code, "the observed graphs differ"
    assert our_notes == their_notes, "the same BatchNorm warnings"
    assert observers(ours).keys() == observers(theirs).keys()
    for name, observer in observers(theirs).items():
        assert type(observers(ours)[name]) is type(observer)
        assert_same_state(observers(ours)[name], observer)
    expected, mine = convert_pt2e(theirs), handmade.convert(ours)
    mine.graph.lint()
    assert call_function_targets(mine) == call_function_targets(expected)
    assert mine.code == expected.code, "the converted graphs differ"
    assert_same_state(mine, expected)
    x = example_inputs(2, seed=100)
    assert torch.equal(mine(*x), expected(*x)), "outputs differ"


def test_matrix_covers_the_interesting_cases():
    """The test models really exercise what each category is about."""
    theirs, _, _ = prepare_both("relu6_two_users", "x86")
    converted = convert_pt2e(theirs)
    dq_users = [len(n.users) for n in converted.graph.nodes if "dequantize" in str(n.target)]
    assert max(dq_users) == 1, "every dequantize has one user after duplication"
    theirs, ours, _ = prepare_both("cat_branches", "course")
    shared = [n for n, m in theirs.named_modules(remove_duplicate=False) if "activation" in n]
    assert len(shared) > len(set(map(id, observers(theirs).values()))), "cat shares observers"
    _, ours, _ = prepare_both("conv_bn", "course")
    assert hasattr(ours.conv2, "weight_bias"), "folding bn into a bias-free conv adds a bias"
    _, ours, notes = prepare_both("unfolded_bn", "course")
    assert notes[1] and "Not fusing linear+bn" in notes[1][0], "3-D linear + BN: a warning"
    assert ours.code.count("aten.batch_norm") == 2, "and both BatchNorms stay"
    _, ours, _ = prepare_both("same_padding_transpose_bn", "course")
    assert "batch_norm" not in ours.code, "BN after conv2d.padding and conv_transpose is folded"
    _, ours, _ = prepare_both("residual_in_place", "in_place")
    assert "add_" in str(call_function_targets(handmade.convert(ours))), "add_ is quantized"
    _, ours, _ = prepare_both("conv_sigmoid", "int32_bias")
    assert "torch.int32" in handmade.convert(ours).code, "an int32 bias"
    _, ours, _ = prepare_both("mlp", "x86_dynamic")
    assert "choose_qparams" in handmade.convert(ours).code, "dynamic quantization"
    _, ours, _ = prepare_both("transposed_weight", "linear_weight")
    converted = handmade.convert(ours)
    assert not converted.graph.find_nodes(op="get_attr", target="weight"), "t(weight) is folded"
    assert converted._frozen_param0.dtype == torch.int8, "into an int8 constant"
    _, ours, _ = prepare_both("buffer_mutation", "x86")
    calls = ours.calls.clone()
    assert torch.equal(handmade.convert(ours).calls, calls + 1), "folding runs add_, as torchao"


def test_convert_accepts_torchaos_prepared_model_and_vice_versa():
    x = example_inputs(2, seed=7)
    theirs, ours, _ = prepare_both("small_cnn", "course")
    assert torch.equal(handmade.convert(theirs)(*x), convert_pt2e(ours)(*x))


@pytest.mark.parametrize(
    ("model_name", "quantizer_name"),
    [("conv_bn_relu", "x86"), ("transposed_weight", "linear_weight")],
)
def test_fold_quantize_false_keeps_the_weight_quantize(model_name, quantizer_name):
    theirs, ours, _ = prepare_both(model_name, quantizer_name)
    expected, mine = (
        convert_pt2e(theirs, fold_quantize=False),
        handmade.convert(ours, fold_quantize=False),
    )
    assert mine.code == expected.code
    assert "quantize_per_channel" in str(call_function_targets(mine))
    x = example_inputs(2)
    assert torch.equal(mine(*x), expected(*x))


# --- Bad input: errors that name the problem and the way out ----------------------------------


class MalformedQuantizer(CourseQuantizer):
    """Keys its input_qspec_map by a name instead of the input Node."""

    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.conv2d.default):
            _add_input(node, "x", ACTIVATION_SPEC)
        return model


def test_malformed_annotation_is_named():
    with pytest.raises(Exception, match="Expected input_edge to have type"):
        prepare_pt2e(exported("conv_relu"), MalformedQuantizer())
    with pytest.raises(TypeError, match=r"annotation of node 'conv2d'.*'x' \(str\)") as error:
        handmade.prepare(exported("conv_relu"), MalformedQuantizer())
    assert "input_qspec_map={node.args[0]: spec}" in str(error.value), "it says how to fix it"


BAD_INPUT = [
    pytest.param(
        lambda: handmade.prepare(get_model("conv_relu"), CourseQuantizer()),
        "got ConvReLU; export it first: torch.export.export(model, args).module()",
        id="prepare-eager-module",
    ),
    pytest.param(
        lambda: handmade.prepare(
            torch.export.export(get_model("conv_relu"), example_inputs(2)), CourseQuantizer()
        ),
        "got the ExportedProgram itself; pass torch.export.export(model, args).module()",
        id="prepare-exported-program",
    ),
    pytest.param(
        lambda: handmade.prepare(exported("conv_relu"), None),
        "needs a torchao Quantizer",
        id="prepare-no-quantizer",
    ),
    pytest.param(
        lambda: handmade.prepare(exported("conv_relu"), CourseQuantizer),
        "got the class CourseQuantizer; write CourseQuantizer()",
        id="prepare-quantizer-class",
    ),
    pytest.param(
        lambda: handmade.convert(get_model("conv_relu")),
        "got ConvReLU; export it first",
        id="convert-eager-module",
    ),
]


@pytest.mark.parametrize(("call", "words"), BAD_INPUT)
def test_bad_input_gets_a_clear_type_error(call, words):
    with pytest.raises(TypeError) as error:
        call()
    assert words in str(error.value)


def test_convert_of_a_never_prepared_graph_says_to_prepare_first():
    with pytest.raises(ValueError, match="never prepared; run model = prepare"):
        handmade.convert(exported("conv_relu"))


def test_torchaos_own_errors_on_the_same_input_are_attribute_errors():
    """Why the checks above exist: torchao gives an AttributeError on an eager module."""
    with pytest.raises(AttributeError, match="object has no attribute 'meta'"):
        prepare_pt2e(get_model("conv_relu"), CourseQuantizer())


# --- What handmade refuses, loudly ------------------------------------------------------------


class SharedWeightBN(nn.Module):
    """One conv applied twice, each time followed by its own BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, C, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(C)
        self.bn2 = nn.BatchNorm2d(C)

    def forward(self, x):
        return self.bn2(self.conv(self.bn1(self.conv(x))))


class Cond(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda y: self.conv(y), lambda y: self.conv(-y), (x,))


UNSUPPORTED = [
    pytest.param(SharedWeightBN, "conv2d_1", "shared by two conv", id="shared-weight-bn"),
    pytest.param(Cond, "cond", "higher-order ops", id="higher-order-op"),
]


@pytest.mark.parametrize(("model_cls", "node", "words"), UNSUPPORTED)
def test_unsupported_patterns_raise_naming_the_node(model_cls, node, words):
    gm = export_module(model_cls().eval(), example_inputs(2))
    with pytest.raises(NotImplementedError, match=words) as error:
        handmade.prepare(gm, CourseQuantizer())
    assert f"node {node!r}" in str(error.value)
    assert "torchao" in str(error.value), "the message says what to use instead"


class SelfConvertingObserver(MinMaxObserver):
    def convert(self, model, node):
        raise AssertionError("not called")


def test_self_converting_observer_in_convert_names_the_node():
    ours = handmade.prepare(exported("conv_relu"), CourseQuantizer())
    calibrate(ours, batches=1)
    name = next(iter(observers(ours)))
    ours.add_submodule(name, SelfConvertingObserver())
    with pytest.raises(NotImplementedError, match=f"node {name!r}"):
        handmade.convert(ours)


def test_course_quantizer_specs_are_what_the_docs_say():
    assert (ACTIVATION_SPEC.dtype, ACTIVATION_SPEC.qscheme) == (torch.int8, torch.per_tensor_affine)
    assert (WEIGHT_SPEC.qscheme, WEIGHT_SPEC.ch_axis) == (torch.per_channel_symmetric, 0)


def test_torchaos_pattern_graphs_from_the_tests_cache_are_freshly_exported_ones(
    torchao_patterns_exported_once,
):
    """conftest.py lets each test worker export torchao's pattern graphs once: a pattern
    asked for again (a new closure over the same flags) gets a copy of the same graph, and
    patterns with other flags get their own."""
    from torchao.quantization.pt2e import qat_utils

    cached = torchao_patterns_exported_once
    x = (torch.randn(1, 1, 3, 3), torch.randn(1, 1, 1, 1), *torch.randn(4, 1))
    codes = []
    for per_channel, bias in ((True, True), (False, False)):
        flags = (per_channel, bias, bias)
        kwargs = qat_utils._get_quantized_conv_bn_example_inputs_kwargs(*flags, False)

        def pattern(flags=flags):
            return qat_utils._get_quantized_qat_conv_bn_pattern(*flags, nn.functional.conv2d, False)

        assert pattern_key(pattern(), x, False, **kwargs) is not None, "it can be cached"
        known = len(cached.exported)
        first = cached(pattern(), x, False, **kwargs)
        again = cached(pattern(), x, False, **kwargs)
        assert len(cached.exported) <= known + 1, "asked for twice, exported at most once"
        fresh = cached.export_pattern(pattern(), x, False, **kwargs)
        assert again is not first, "every call gets its own copy"
        assert first.code == again.code == fresh.code
        codes.append(fresh.code)
    assert codes[0] != codes[1], "other flags, another pattern"
