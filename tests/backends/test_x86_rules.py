"""common.backends.x86.rules: why X86InductorQuantizer (torchao 0.18) leaves an op float, read
from its source, and the words it says it with. The models and quantizers are test_coverage's.
"""

import re

import pytest
import torch
from test_coverage import QUANTIZERS, TOKENS, assert_both_languages, exported, held_out, x86
from torch import nn

from common.backends.x86.rules import _TEXTS, X86_UNARY_FUSIONS
from common.coverage import coverage, words
from common.pt2e import export_module

# coverage() silences these for its own call only; the tests' own prepare_pt2e calls, too.
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script_method`:DeprecationWarning"),
]


# (model, quantizer, node) -> a piece of the reason x86's rules give for the float op.
REASONS = [
    ("squeeze_excite", "x86", "mul", "mul of shapes [2, 8, 8, 8] and [2, 8, 1, 1]"),
    ("matmul_head", "x86", "matmul", "not default_quantizable_ops"),
    ("matmul_head", "x86", "bmm", "aten.bmm is not in the quantizer's op set"),
    (
        "encoder_layer",
        "x86",
        "linear",
        "F.linear called inside MultiheadAttention, not an nn.Linear",
    ),
    ("encoder_layer", "x86", "add", "no conv or linear feeds this one directly"),
    (
        "encoder_layer",
        "x86",
        "scaled_dot_product_attention",
        "aten.scaled_dot_product_attention is not in the quantizer's op set",
    ),
]


@pytest.mark.parametrize(("model", "quantizer", "node", "reason"), REASONS, ids=str)
def test_a_float_op_says_why(model, quantizer, node, reason):
    gm, _ = exported(model)
    op = coverage(gm, QUANTIZERS[quantizer]())[node]
    assert not op.int8 and reason in op.reason, op.reason


def test_a_none_config_keeps_its_module_float():
    gm, _ = exported("matmul_head")
    quantizer = x86().set_module_name_qconfig("proj", None)
    op = coverage(gm, quantizer)["linear"]
    assert not op.int8 and "None config" in op.reason


# (model, quantizer, node) -> status and a piece of its reason: each one's true cause.
HELD_OUT_REASONS = [
    ("convnext", "x86", "layer_norm", "float", "aten.layer_norm is not in the quantizer's op set"),
    ("convnext", "x86", "mean", "float", "aten.mean is not in the quantizer's op set"),
    ("unet", "x86", "conv_transpose2d", "float", "aten.conv_transpose2d is not in the quantizer"),
    ("unet", "x86", "cat", "float", "every input comes from a quantized op"),
    ("unet", "x86", "upsample_nearest2d", "float", "not in the quantizer's op set"),
    ("keyword_spotter", "x86", "mean", "float", "aten.mean is not in the quantizer's op set"),
]


@pytest.mark.parametrize(("name", "quantizer", "node", "status", "reason"), HELD_OUT_REASONS)
def test_held_out_ops_get_their_true_reason(name, quantizer, node, status, reason):
    graph, _ = held_out(name)
    op = coverage(graph, QUANTIZERS[quantizer](), every_op=True)[node]
    assert op.status == status and reason in op.reason, op


def test_the_x86_cat_is_int8_when_every_input_is():
    """Its rule read from propagation: the second cat's inputs are the upsample (float) and
    a fused ReLU's output, the first's a float transposed conv's; the report names them."""
    graph, _ = held_out("unet")
    report = coverage(graph, x86(), every_op=True)
    assert report["cat"].reason.endswith("float input: conv_transpose2d")
    assert report["cat_1"].reason.endswith("float input: upsample_nearest2d")


def test_an_eval_mode_dropout_before_the_add_is_named():
    """nn.TransformerEncoderLayer's _ff_block ends dropout2(linear2(...)): a non-strict export
    keeps the eval-mode dropout node between linear2 and the add."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    report = coverage(export_module(layer, TOKENS), x86())
    add = report["add_1"]
    assert not add.int8 and "eval-mode dropout (dropout_2) from linear_3" in add.reason


def test_the_fused_activations_are_the_installed_x86_quantizers():
    import inspect

    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

    conv = inspect.getsource(X86InductorQuantizer._annotate_conv2d_unary)
    linear = inspect.getsource(X86InductorQuantizer._annotate_linear_unary)
    modules = {"relu": "ReLU", "hardtanh": "Hardtanh", "hardswish": "Hardswish", "silu": "SiLU"}
    modules |= {"leaky_relu": "LeakyReLU", "tanh": "Tanh", "gelu": "GELU"}
    for name in X86_UNARY_FUSIONS["conv2d"]:
        assert f"[torch.nn.Conv2d, torch.nn.{modules[name]}]" in conv
    assert "[torch.nn.Conv1d, torch.nn.ReLU]" in conv
    start = linear.index("postop_list")
    postops = linear[start : linear.index("]", start)]
    assert {f"torch.nn.{modules[n]}" for n in X86_UNARY_FUSIONS["linear"]} == set(
        re.findall(r"torch\.nn\.\w+", postops)
    )


class LinearThenFunctionalRelu(nn.Module):
    """The relu as ``nn.TransformerEncoderLayer`` calls its activation: a function, no module."""

    def __init__(self, module: bool):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(16, 16)
        self.relu = nn.ReLU() if module else None

    def forward(self, x):
        y = self.linear(x)
        return self.relu(y) if self.relu is not None else torch.nn.functional.relu(y)


@pytest.mark.parametrize("module", [True, False], ids=["nn.ReLU", "F.relu"])
def test_a_relu_after_a_linear_fuses_only_as_a_module_call(module):
    """x86's linear + relu pattern reads each node's module (find_sequential_partitions): the
    same graph ops, fused with nn.ReLU, float with F.relu, whose reason names the fix."""
    args = (torch.randn(4, 16),)
    graph = export_module(LinearThenFunctionalRelu(module).eval(), args)
    relu = coverage(graph, x86(), every_op=True)["relu"]
    if module:
        assert relu.status == "int8 fused", relu.reason
    else:
        assert relu.status == "float"
        assert "function called inside LinearThenFunctionalRelu" in relu.reason
        assert "nn.ReLU()" in relu.reason


def test_the_encoder_layers_relu_is_float_because_it_is_a_function_call():
    graph, _ = exported("encoder_layer")
    relu = coverage(graph, x86(), every_op=True)["relu"]
    assert relu.status == "float"
    assert "function called inside TransformerEncoderLayer" in relu.reason


@pytest.mark.parametrize("key", sorted(_TEXTS), ids=str)
def test_each_of_x86s_texts_has_both_languages_with_the_same_fields(key):
    assert_both_languages(key, _TEXTS[key])
    assert key not in words._TEXTS, "a key of x86's words is one of the neutral words"
