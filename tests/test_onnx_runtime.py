"""common.onnx_runtime: the export's root cause, the session's settings, the kernels a run ran."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from common.onnx_runtime import OPTIMIZATION_LEVELS, kernels_ran, onnx_export, runner, session


@pytest.fixture(scope="module")
def qdq_conv(tmp_path_factory):
    """A QDQ graph written by hand: Q → DQ → Conv (int8 weights, per channel) → Q → DQ."""
    rng = np.random.default_rng(0)
    weight = rng.integers(-127, 128, size=(4, 2, 3, 3), dtype=np.int8)
    constants = [
        numpy_helper.from_array(weight, "w_int8"),
        numpy_helper.from_array(np.full(4, 0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zero"),
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_zero"),
        numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["y", "y_scale", "y_zero"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zero"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 6, 6])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    path = tmp_path_factory.mktemp("onnx") / "qdq_conv.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("optimization", "kernel"),
    [("none", "Conv"), ("basic", "Conv"), ("extended", "QLinearConv"), ("all", "QLinearConv")],
    ids=["as written", "basic", "extended fuses", "all fuses"],
)
def test_the_profile_names_the_conv_kernel_each_level_runs(qdq_conv, optimization, kernel):
    ran = kernels_ran(qdq_conv, (torch.randn(1, 2, 6, 6),), optimization=optimization)
    assert ran[kernel] == 1, dict(ran)
    assert not {"Conv", "QLinearConv"} - {kernel} & set(ran), dict(ran)


def test_kernels_ran_leaves_no_profile_behind(qdq_conv):
    kernels_ran(qdq_conv, (torch.randn(1, 2, 6, 6),))
    assert not list(qdq_conv.parent.glob("*profile*.json"))


def test_the_fused_and_the_written_graph_agree_within_one_output_step(qdq_conv):
    x = torch.randn(1, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    fused = runner(session(qdq_conv))(x)
    written = runner(session(qdq_conv, optimization="none"))(x)
    assert fused.shape == (1, 4, 6, 6)
    assert (fused - written).abs().max().item() <= 0.05 + 1e-6, "one step of y_scale"


def test_session_names_the_levels_it_knows(qdq_conv):
    with pytest.raises(ValueError, match="one of: none, basic, extended, all"):
        session(qdq_conv, optimization="fast")
    assert list(OPTIMIZATION_LEVELS) == ["none", "basic", "extended", "all"]


def test_session_uses_the_threads_it_is_given(qdq_conv):
    options = session(qdq_conv, threads=1).get_session_options()
    assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 1


class Doubled(torch.nn.Module):
    def forward(self, x):
        return torch.ops.onnx_runtime_test.doubled(x)


@pytest.fixture(scope="module")
def untranslatable_op():
    library = torch.library.Library("onnx_runtime_test", "DEF")
    library.define("doubled(Tensor x) -> Tensor")
    library.impl("doubled", lambda x: x * 2, "CompositeExplicitAutograd")
    library.impl("doubled", lambda x: torch.empty_like(x), "Meta")
    yield torch.ops.onnx_runtime_test.doubled.default
    library._destroy()


def test_an_op_without_translation_raises_the_dispatch_error_itself(untranslatable_op):
    with pytest.raises(torch.onnx.errors.OnnxExporterError) as caught:
        onnx_export(Doubled(), (torch.ones(2),))
    assert type(caught.value).__name__ == "DispatchError"
    assert str(caught.value).startswith("No ONNX function found for <OpOverload(op='onnx_")


def test_a_translation_table_exports_the_op(untranslatable_op, tmp_path):
    from onnxscript import opset20 as op

    def doubled(x):
        return op.Add(x, x)

    program = onnx_export(Doubled(), (torch.ones(2),), translations={untranslatable_op: doubled})
    program.save(tmp_path / "doubled.onnx")
    out = runner(session(tmp_path / "doubled.onnx", threads=1))(torch.arange(2.0))
    assert torch.equal(out, torch.tensor([0.0, 2.0]))
