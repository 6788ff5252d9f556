"""common.lowering against torchao's lower_pt2e_quantized_to_x86: same ops, constants, outputs.

The matrix is every zoo model and every M02 test model, quantized with X86InductorQuantizer
(the quantizer the x86 lowering is written for; the course quantizer's int8 activations are
lowered too, but oneDNN's int8 conv on this kind of CPU takes uint8 only, so they cannot run).
"""

import collections

import pytest
import torch
from graphs import TEST_MODELS, TwoConvs, build, call_function_targets
from marks import ON_THE_PATTERN_WORKER
from torch import nn

from common.models import (
    LARGE_MODEL_NAMES,
    MODEL_NAMES,
    TRANSFORMER_NAMES,
    example_inputs,
    get_model,
    input_shape,
)
from common.pt2e import calibrate, export_module, quiet, x86_quantizer

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade, lowering  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
    ON_THE_PATTERN_WORKER,  # one worker lowers the matrix once (tests/marks.py)
]


# --- Models that reach the int8-output residual add, which the zoo and M02's models do not ----


class ResidualThenConv(nn.Module):
    """A basic block whose output is quantized for the next conv: the int8-output sum."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.head(torch.relu(self.conv2(torch.relu(self.conv1(x))) + x))


class ResidualNoRelu(nn.Module):
    """conv + skip with nothing after the add: the float-output sum without relu."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.body(x) + x


EXTRA_MODELS = {"residual_then_conv": ResidualThenConv, "residual_no_relu": ResidualNoRelu}
# The M02 test models that do not reach a lowering (the x86 quantizer refuses them) or hold a
# pattern common.lowering refuses by name (test_unlowered_test_models_are_refused_by_name).
X86_REFUSES = {"same_padding_transpose_bn", "reused_relu"}
LOWERING_REFUSES = {
    "transpose_bn": "float 2-D/3-D convolution",  # a conv-transpose, packed for mkldnn
    "transposed_weight": "a float linear",  # weight.t() folded: inductor packs it for mkl
    "buffer_mutation": "an op on constants only",  # the buffer's update
    # nn.MultiheadAttention transposes to (tokens, batch, dim): its float in_proj is a bmm (M05-1)
    "vit_mha": "a linear over a non-contiguous 3-D input",
}
MATRIX = [
    *MODEL_NAMES,
    *LARGE_MODEL_NAMES,
    *(name for name in TEST_MODELS if name not in X86_REFUSES | LOWERING_REFUSES.keys()),
    *EXTRA_MODELS,
    # M05: a class token (an op on constants only), position embeddings, 3-D linears, SDPA
    # (the encoder adds nothing new and costs a lowering of 24 linears)
    "vit_sdpa",
]


def inputs(name: str, seed: int = 0) -> tuple:
    """The batch a matrix model is exported, calibrated and compared with (the large one: 2)."""
    if name in LARGE_MODEL_NAMES or name in TRANSFORMER_NAMES:
        return example_inputs(2, seed=seed, shape=input_shape(name))
    return example_inputs(8, seed=seed)


def quantized(name: str, quantizer=None) -> torch.fx.GraphModule:
    if name in EXTRA_MODELS:
        model = EXTRA_MODELS[name]().eval()
    else:
        large = name in LARGE_MODEL_NAMES or name in TRANSFORMER_NAMES
        model = get_model(name) if large else build(name)
    prepared = prepare_pt2e(export_module(model, inputs(name)), quantizer or x86_quantizer())
    with torch.no_grad():
        for seed in range(4):  # as common.pt2e.calibrate, in the model's own image shape
            prepared(*inputs(name, seed))
    return convert_pt2e(prepared)


def dense(t: torch.Tensor) -> torch.Tensor:
    """A prepacked weight is an opaque mkldnn tensor; to_dense reads its values back."""
    return t.to_dense() if t.layout == torch._mkldnn else t


@pytest.fixture(scope="module")
def both_lowered():
    cache = {}

    def get(name):
        if name not in cache:
            model, x = quantized(name), inputs(name)
            cache[name] = (lower_pt2e_quantized_to_x86(model, x), lowering.lower(model, x))
        return cache[name]

    return get


@pytest.mark.parametrize("name", MATRIX)
def test_lower_matches_torchao_bit_for_bit(both_lowered, name):
    theirs, mine = both_lowered(name)
    mine.graph.lint()
    assert call_function_targets(mine) == call_function_targets(theirs), "the ops differ"
    ours, expected = mine.state_dict(), theirs.state_dict()
    assert ours.keys() == expected.keys(), "the constants differ"
    for key, value in expected.items():
        assert ours[key].layout == value.layout and ours[key].dtype == value.dtype, key
        assert torch.equal(dense(ours[key]), dense(value)), f"{key} differs"
    # small_cnn's lowered graph fails to run as torchao returns it (M03-1): fix both alike.
    lowering.reshape_views(theirs)
    lowering.reshape_views(mine)
    for seed in (0, 100):
        x = inputs(name, seed)
        assert torch.equal(mine(*x), theirs(*x)), "outputs differ"


@pytest.mark.parametrize(("name", "words"), LOWERING_REFUSES.items())
def test_unlowered_test_models_are_refused_by_name(name, words):
    model = quantized(name)
    with pytest.raises(NotImplementedError, match=words) as refused:
        lowering.lower(model, inputs(name))
    assert "(node '" in str(refused.value), "the error names the node"


def test_matrix_reaches_every_rewrite(both_lowered):
    """Every op the lowering can write appears somewhere in the matrix."""
    seen = collections.Counter()
    for name in MATRIX:
        for node in both_lowered(name)[1].graph.nodes:
            if node.op == "call_function" and "onednn" in str(node.target):
                out_dtype = node.args[14] if node.target == lowering.QCONV_ADD else node.args[-4]
                unary = node.args[-3]
                seen[(str(node.target).split(".")[1], str(out_dtype), unary)] += 1
    dtypes = {(op, dtype) for op, dtype, _ in seen}
    assert {
        ("qconv_pointwise", "torch.uint8"),
        ("qconv_pointwise", "torch.float32"),
        ("qconv2d_pointwise", "torch.uint8"),
        ("qconv2d_pointwise", "torch.float32"),
        ("qlinear_pointwise", "torch.uint8"),
        ("qlinear_pointwise", "torch.float32"),
    } <= dtypes, seen
    assert {unary for *_, unary in seen} == {"none", "relu"}


def test_small_cnn_lowered_fails_until_views_become_reshapes():
    model, x = quantized("small_cnn"), example_inputs(8)
    lowered = lower_pt2e_quantized_to_x86(model, x)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        lowered(*x)
    assert lowering.reshape_views(lowered) == ["view"]
    assert torch.equal(lowered(*x), lowered(*x))


def test_lower_accepts_handmade_convert():
    x = example_inputs(8)
    ours = handmade.prepare(export_module(build("small_cnn"), x), x86_quantizer())
    calibrate(ours)
    theirs = quantized("small_cnn")
    a, b = lowering.lower(handmade.convert(ours), x), lowering.lower(theirs, x)
    lowering.reshape_views(a)
    lowering.reshape_views(b)
    assert torch.equal(a(*x), b(*x))


def test_lower_has_one_name():
    assert not hasattr(handmade, "lower"), "lower lives in common.lowering only"


# --- What common.lowering refuses, loudly -----------------------------------------------------


class LinearAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        rows = x.flatten(0, 2)
        return self.fc(rows) + rows


def first_conv_left_float():
    config = get_default_x86_inductor_quantization_config()
    return X86InductorQuantizer().set_global(config).set_module_name_qconfig("a", None)


def dynamic_x86():
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return X86InductorQuantizer().set_global(config)


UNSUPPORTED = [
    # (model, quantizer, the node the message must name, words the message must contain)
    (LinearAdd, x86_quantizer, "add", "qlinear binary"),
    (TwoConvs, first_conv_left_float, "convolution", "float 2-D/3-D convolution"),
    (lambda: build("linear_relu"), dynamic_x86, "quantize_per_tensor", "dynamic quantization"),
]


@pytest.mark.parametrize(("make_model", "make_quantizer", "node", "words"), UNSUPPORTED)
def test_unsupported_patterns_raise_naming_the_node(make_model, make_quantizer, node, words):
    x = example_inputs(8)
    prepared = prepare_pt2e(export_module(make_model().eval(), x), make_quantizer())
    calibrate(prepared)
    model = convert_pt2e(prepared)
    lower_pt2e_quantized_to_x86(model, x)  # torchao lowers it: the refusal is ours alone
    with pytest.raises(NotImplementedError, match=words) as error:
        lowering.lower(model, x)
    assert f"node '{node}" in str(error.value)
    assert "lower_pt2e_quantized_to_x86" in str(error.value), "the message says what to use"
