"""common.backends.xnnpack.rules: why ExecuTorch's XNNPACKQuantizer (1.5.1) leaves an op float,
which ops XnnpackPartitioner refuses, and the words they say it with. The models and quantizers
are test_coverage's.
"""

import pytest
import torch
from test_coverage import QUANTIZERS, assert_both_languages, converted, exported, held_out, xnnpack

from common.backends.xnnpack.rules import _TEXTS, XnnpackRules
from common.coverage import coverage, words
from common.coverage.classify import _rules_for

# coverage() silences these for its own call only; the tests' own prepare_pt2e calls, too.
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script_method`:DeprecationWarning"),
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
]


# (model, quantizer, node) -> a piece of the reason XNNPACK's rules give for the float op.
REASONS = [
    ("matmul_head", "xnnpack", "bmm", "aten.bmm is in none of the quantizer's patterns"),
    (
        "sdpa_block",
        "xnnpack",
        "scaled_dot_product_attention",
        "aten.scaled_dot_product_attention is in none of the quantizer's patterns",
    ),
    ("encoder_layer", "xnnpack_dynamic", "add", "annotates only linear and conv"),
    ("residual", "xnnpack_dynamic", "conv2d", "followed by a ReLU"),
    ("squeeze_excite", "xnnpack_dynamic", "conv2d", "followed by a ReLU"),
]


@pytest.mark.parametrize(("model", "quantizer", "node", "reason"), REASONS, ids=str)
def test_a_float_op_says_why(model, quantizer, node, reason):
    gm, _ = exported(model)
    op = coverage(gm, QUANTIZERS[quantizer]())[node]
    assert not op.int8 and reason in op.reason, op.reason


# (model, quantizer, node) -> status and a piece of its reason: each one's true cause.
HELD_OUT_REASONS = [
    ("convnext", "xnnpack", "gelu", "float", "aten.gelu is in none of the quantizer's patterns"),
    ("convnext", "xnnpack", "layer_norm", "float", "in none of the quantizer's patterns"),
    ("convnext", "xnnpack", "mean", "float", "mean.dim only supports keepdim=True"),
    ("unet", "xnnpack", "upsample_nearest2d", "float", "in none of the quantizer's patterns"),
    ("keyword_spotter", "xnnpack", "mean", "float", "mean.dim only supports averaging 4D"),
]


@pytest.mark.parametrize(("name", "quantizer", "node", "status", "reason"), HELD_OUT_REASONS)
def test_held_out_ops_get_their_true_reason(name, quantizer, node, status, reason):
    graph, _ = held_out(name)
    op = coverage(graph, QUANTIZERS[quantizer](), every_op=True)[node]
    assert op.status == status and reason in op.reason, op


def test_xnnpack_leaves_what_its_partitioner_refuses_outside_its_delegates():
    """The report's refusals are the lowered program's: the refused means stay outside the
    XNNPACK delegates, every int8 op of the report is inside one."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    for name in ("keyword_spotter", "unet"):
        graph, args = held_out(name)
        report = coverage(graph, xnnpack(), every_op=True)
        program = torch.export.export(converted(graph, xnnpack(), args), args)
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        outside = {
            n.target.__name__.removeprefix("aten.").split(".")[0]
            for n in lowered.exported_program().graph.nodes
            if n.op == "call_function" and "quantize" not in n.target.__name__
        } - {"executorch_call_delegate", "getitem"}
        refused = {op.op for op in report.ops if "partitioner refuses" in op.reason}
        assert refused <= outside, (refused, outside)
        edge = {"conv1d": "convolution", "conv2d": "convolution", "conv_transpose2d": "convolution"}
        int8 = {edge.get(op.op, op.op) for op in report.ops if op.int8}
        assert not int8 & outside, (int8, outside)
    assert refused == set() and "mean" not in outside  # the U-Net has no mean
    assert "upsample_nearest2d" in outside, "float, and XNNPACK has no nearest upsample"


def test_an_xnnpack_quantizer_gets_xnnpacks_rules():
    assert type(_rules_for(xnnpack(), None)) is XnnpackRules


@pytest.mark.parametrize("key", sorted(_TEXTS), ids=str)
def test_each_of_xnnpacks_texts_has_both_languages_with_the_same_fields(key):
    assert_both_languages(key, _TEXTS[key])
    assert key not in words._TEXTS, "a key of XNNPACK's words is one of the neutral words"
