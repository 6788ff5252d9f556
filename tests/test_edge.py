"""common.edge.CoursePartitioner against XnnpackPartitioner: same partitions, equal outputs.

The matrix: every zoo model and every M02 test model, quantized with XNNPACKQuantizer
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

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (  # noqa: E402
    XnnpackPartitioner,
)
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (  # noqa: E402
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.backends.xnnpack.utils.quant_utils import IS_IMPLICIT_Q_DQ_TAG  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from executorch.exir.backend.partitioner import Partitioner  # noqa: E402
from executorch.runtime import Runtime  # noqa: E402
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


EXTRA_MODELS = {"global_mean_head": GlobalMeanHead, "strided_max_pool": StridedMaxPool}
# XNNPACK's own lowering fails on this after partitioning (preprocess), with these words.
XNNPACK_FAILS = {"buffer_mutation": "ChannelsLastTaggedReshapePass"}
# CoursePartitioner refuses these, naming the node (XNNPACK fails on it too, in preprocess:
# "Weight and Input should both be quantized").
COURSE_REFUSES = {"unfolded_bn": "_native_batch_norm_legit_no_training"}
MATRIX = [*MODEL_NAMES, *LARGE_MODEL_NAMES, *TEST_MODELS, *EXTRA_MODELS]


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


class _Partitioned(Exception):
    """Stops to_edge_transform_and_lower once both partitioners have tagged the graph."""


class BothPartitioners(Partitioner):
    """Inside one ``to_edge_transform_and_lower``: asks both partitioners which ops to keep
    whole, then tags the edge graph with each in turn, keeps what each tagged, and stops
    (the delegates' compilation, the slow part, is left to the runtime test)."""

    def __init__(self):
        super().__init__()
        self.xnnpack, self.course = XnnpackPartitioner(), edge.CoursePartitioner()
        self.tagged = {}

    def ops_to_not_decompose(self, program):
        theirs, their_filter = self.xnnpack.ops_to_not_decompose(program)
        mine, my_filter = self.course.ops_to_not_decompose(program)
        nodes = [n for n in program.graph.nodes if n.op == "call_function"]
        self.kept_whole = {  # the ops of this graph each keeps whole, and on which nodes
            "xnnpack": [(n.name, n.target in theirs and their_filter(n)) for n in nodes],
            "course": [(n.name, n.target in mine and my_filter(n)) for n in nodes],
        }
        return theirs, their_filter

    def partition(self, program):
        for name, partitioner in (("xnnpack", self.xnnpack), ("course", self.course)):
            for node in program.graph.nodes:  # each starts from the untagged graph
                node.meta.pop("delegation_tag", None)
                node.meta.pop(IS_IMPLICIT_Q_DQ_TAG, None)
            partitioner.partition(program)
            groups = {}
            for node in program.graph.nodes:
                if "delegation_tag" in node.meta:
                    groups.setdefault(node.meta["delegation_tag"], set()).add(node.name)
            folded = {n.name for n in program.graph.nodes if n.meta.get(IS_IMPLICIT_Q_DQ_TAG)}
            self.tagged[name] = (sorted(sorted(g) for g in groups.values()), folded)
        raise _Partitioned


def run(buffer: bytes, x) -> torch.Tensor:
    with contextlib.redirect_stderr(io.StringIO()):  # the runtime's [cpuinfo_utils.cpp] lines
        method = Runtime.get().load_program(buffer).load_method("forward")
    return method.execute([*x])[0]


# A BatchNorm left in the graph makes torchao export its patterns: on their worker (marks.py).
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=ON_THE_PATTERN_WORKER) if n == "unfolded_bn" else n for n in MATRIX],
)
def test_course_partitioner_tags_exactly_what_xnnpack_tags(name):
    program = torch.export.export(quantized(name), inputs(name))
    both = BothPartitioners()
    if name in COURSE_REFUSES:
        with pytest.raises(NotImplementedError, match=COURSE_REFUSES[name]) as refused:
            to_edge_transform_and_lower(program, partitioner=[both])
        assert "(node '" in str(refused.value), "the error names the node"
        return
    with pytest.raises(_Partitioned):
        to_edge_transform_and_lower(program, partitioner=[both])
    assert both.kept_whole["course"] == both.kept_whole["xnnpack"], "different ops kept whole"
    (their_partitions, their_folded), (my_partitions, my_folded) = (
        both.tagged["xnnpack"],
        both.tagged["course"],
    )
    assert my_partitions == their_partitions, "the partitions differ"
    assert my_folded == their_folded, "different q/dq nodes are folded into int8 tensors"


def test_a_table_without_xnnpacks_constraint_is_caught(monkeypatch):
    """Dropping mean.dim's keepdim constraint delegates a mean XNNPACK leaves portable."""
    monkeypatch.setitem(edge.SUPPORTED, "mean.dim", edge.Op(int8=True))
    program = torch.export.export(quantized("global_mean_head"), inputs("global_mean_head"))
    both = BothPartitioners()
    with pytest.raises(_Partitioned):
        to_edge_transform_and_lower(program, partitioner=[both])
    assert both.tagged["course"][0] != both.tagged["xnnpack"][0], "the matrix test would fail"


# The runtime comparison lowers each model twice, to the end: the zoo, the models that keep
# nodes on the portable kernels, and the M02 test models with ops the zoo lacks.
RUNTIME = [
    *MODEL_NAMES,
    *EXTRA_MODELS,
    "residual",
    "pools",
    "relu6_two_users",
    "cat_branches",
    "batched_linear",
    "conv_sigmoid",
    "transpose_bn",
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
@pytest.mark.parametrize("name", RUNTIME)
def test_both_programs_give_equal_outputs_on_the_executorch_runtime(both_lowered, name):
    theirs, mine = both_lowered(name)
    assert edge.delegated(mine.exported_program()) == edge.delegated(theirs.exported_program())
    # to_executorch plans memory in place: once per program.
    their_buffer, my_buffer = theirs.to_executorch().buffer, mine.to_executorch().buffer
    for seed in (0, 100):
        x = inputs(name, seed)
        assert torch.equal(run(my_buffer, x), run(their_buffer, x)), "runtime outputs differ"


@pytest.mark.parametrize(("name", "words"), XNNPACK_FAILS.items())
def test_where_xnnpack_fails_the_course_partitioner_fails_alike(name, words):
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


class Hardswish(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return nn.functional.hardswish(self.conv(x))


class Softmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)


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
    (Hardswish, xnnpack, "hardswish", "does not know hardswish.default"),
    (TwoConvs, all_but("conv2d"), "aten_convolution_default", "float weight"),
    (Softmax, xnnpack, "aten__softmax_default", "does not know _softmax.default"),
    (
        lambda: build("linear_relu"),
        lambda: xnnpack(is_dynamic=True),
        "quantized_decomposed_choose_qparams",
        "does not know choose_qparams",
    ),
]


@pytest.mark.parametrize(("make_model", "make_quantizer", "node", "words"), REFUSED)
def test_unknown_or_float_nodes_raise_naming_the_node(make_model, make_quantizer, node, words):
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
