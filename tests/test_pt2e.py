"""common.pt2e: export, calibration, counting and finding nodes, quieter logs."""

import logging
import warnings

import pytest
import torch

from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import calibrate, export_module, node_named, op_counts, quiet


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_export_matches_eager(name):
    model, args = get_model(name), example_inputs(2)
    gm = export_module(model, args)
    assert isinstance(gm, torch.fx.GraphModule)
    with torch.no_grad():
        assert torch.equal(gm(*args), model(*args))


def test_export_refuses_a_non_module():
    with pytest.raises(TypeError, match=r"export_module needs an nn\.Module, got function"):
        export_module(lambda x: x, example_inputs(1))


def test_export_failure_says_what_to_do():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(RuntimeError, match=r"torch\.export could not trace DataDependent") as info:
        export_module(DataDependent(), example_inputs(1))
    assert "torch.cond" in str(info.value)


def test_calibrate_feeds_the_batch_size_the_model_was_exported_with():
    gm = export_module(get_model("conv_relu"), example_inputs(3))
    seen = []
    gm.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    calibrate(gm, batches=2)
    assert seen == [3, 3]


def test_calibrate_asks_for_the_batch_when_the_graph_does_not_tell():
    gm = torch.fx.symbolic_trace(get_model("conv_relu"))  # no example values recorded
    with pytest.raises(ValueError, match=r"pass it: calibrate\(model, batch=N\)"):
        calibrate(gm)


def test_quiet_drops_only_the_known_noise(caplog):
    quiet()
    quiet()  # idempotent: one filter per logger, however often it is called
    torchao_logger = logging.getLogger("torchao")
    assert len(torchao_logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="torchao"):
        torchao_logger.warning("Failed to load /x/_C_cutlass.so: nope")
        torchao_logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet()
        warnings.warn("`torch.jit.script_method` is deprecated.", DeprecationWarning, stacklevel=1)
        warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]


class SplitAdd(torch.nn.Module):
    def forward(self, x):
        first, second = torch.split(x.relu(), 2)
        return first + second


def test_op_counts_names_each_operator_by_namespace_op_and_overload():
    program = torch.export.export(SplitAdd(), (torch.ones(4),))
    counts = op_counts(program.module())
    assert counts == {
        "aten.relu.default": 1,
        "aten.split.Tensor": 1,
        "<built-in function getitem>": 2,
        "aten.add.Tensor": 1,
    }
    assert op_counts(program) == counts, "an ExportedProgram's graph counts alike"
    assert counts["aten.conv2d.default"] == 0, "a Counter: a missing op counts 0"


def twice(x):
    return 2 * x


def test_op_counts_names_a_python_function_by_module_and_name_not_by_address():
    graph = torch.fx.Graph()
    graph.output(graph.call_function(twice, (graph.placeholder("x"),)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert op_counts(gm) == {f"{__name__}.twice": 1}


def test_op_counts_writes_the_qdq_ops_without_their_namespace():
    quiet()
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from common.pt2e import x86_quantizer

    x = example_inputs(2)
    prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
    calibrate(prepared)
    converted = convert_pt2e(prepared)
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    counts = op_counts(converted)
    assert counts["quantize_per_tensor.default"] == len(
        converted.graph.find_nodes(op="call_function", target=quantize)
    )
    assert counts["quantize_per_tensor.default"] > 0 and counts["aten.conv2d.default"] == 1
    assert not [name for name in counts if name.startswith("quantized_decomposed.")]


@pytest.mark.parametrize("helper", [op_counts, lambda model: node_named(model, "conv2d")])
def test_graph_helpers_refuse_a_model_that_is_not_exported(helper):
    with pytest.raises(TypeError, match=r"export the model first: export_module\(model, args\)"):
        helper(get_model("conv_relu"))


def test_node_named_finds_the_node_the_graph_prints_under_that_name():
    gm = export_module(get_model("conv_relu"), example_inputs(2))
    conv = node_named(gm, "conv2d")
    assert conv.target is torch.ops.aten.conv2d.default
    assert node_named(gm, "relu").args == (conv,)


def test_an_unknown_node_name_gets_the_close_names_or_the_first_ones():
    gm = export_module(get_model("conv_relu"), example_inputs(2))
    with pytest.raises(ValueError, match=r"named 'relu_1' in this graph; close names: relu "):
        node_named(gm, "relu_1")
    with pytest.raises(ValueError, match=r"'tanh' in this graph; its nodes: conv_weight, "):
        node_named(gm, "tanh")
