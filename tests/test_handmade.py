"""common.handmade against torchao: the same graphs, qparams and bit-identical outputs.

The matrix: every model x (course quantizer, X86InductorQuantizer, ExecuTorch's
XNNPACKQuantizer, the model's own category quantizer) x (non-strict, strict export), and M05's
transformers with the x86 quantizer, static and dynamic. Where torchao itself fails, handmade
must fail alike.
"""

import copy
import warnings

import pytest
import torch
from graphs import TEST_MODELS, C, build, call_function_targets
from marks import ON_THE_PATTERN_WORKER
from torch import nn

from common.models import MODEL_NAMES, TRANSFORMER_NAMES, example_inputs, get_model, input_shape
from common.pt2e import calibrate, export_module, quiet, x86_quantizer

from pattern_graphs import pattern_key

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
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
]

aten = torch.ops.aten


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
# M05's digits ViT in both attention styles (class token, SDPA, 3-D linears, LayerNorm).
TRANSFORMERS = {"vit_mha": ["x86", "x86_dynamic"], "vit_sdpa": ["x86", "x86_dynamic"]}
MATRIX = [
    *(
        pytest.param(m, q, e, id=f"{m}-{q}-{e}", marks=SLOW if m in SLOW_MODELS else [])
        for m in (*MODEL_NAMES, *TEST_MODELS)
        for q in ("course", "x86", "xnnpack", *OWN_QUANTIZERS.get(m, ()))
        for e in EXPORTS
    ),
    *(pytest.param(m, q, "nonstrict", id=f"{m}-{q}") for m, qs in TRANSFORMERS.items() for q in qs),
]


def sample(model_name, batch=2, seed=0):
    """A batch in the model's own input shape (the zoo's images, or a transformer's)."""
    if model_name in TRANSFORMER_NAMES:
        return example_inputs(batch, seed=seed, shape=input_shape(model_name))
    return example_inputs(batch, seed=seed)


def torchao_failure(model_name, quantizer_name, export):
    return TORCHAO_FAILS.get((model_name, quantizer_name)) or TORCHAO_FAILS.get(
        (model_name, quantizer_name, export)
    )


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
        program = torch.export.export(build(model_name), sample(model_name), strict=EXPORTS[export])
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
        with torch.no_grad():
            prepared(*sample(model_name))  # as calibrate(prepared, batches=1)
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
    x = sample(model_name, seed=100)
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
