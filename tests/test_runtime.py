"""common.runtime: what a ``.pte`` does on the ExecuTorch runtime, read by ``operators_run``
(an ETDump) and ``load_check`` (each method loaded in a child process)."""

import contextlib
import io
import re
from collections import Counter

import pytest
import torch
from torch import nn

from common.pt2e import export_module, quiet

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (  # noqa: E402
    XnnpackPartitioner,
)
from executorch.runtime import Runtime  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

from common import edge  # noqa: E402
from common.runtime import OperatorsRun, load_check, operators_run  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
]


# --- A bounded dynamic batch (M06-4), on a 1-D model the lessons never use ----------------------


class DilatedSpotter(nn.Module):
    """Held out: a dilated 1-D conv, a grouped one with a hardtanh, a linear over time steps."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Conv1d(6, 16, 3, dilation=2, padding=2)
        self.grouped = nn.Conv1d(16, 16, 5, groups=4, stride=2)
        self.head = nn.Linear(16 * 22, 5)

    def forward(self, x):
        x = torch.relu(self.wide(x))
        x = nn.functional.hardtanh(self.grouped(x))
        return self.head(x.flatten(1))


def test_a_bounded_dynamic_batch_runs_at_both_ends_and_refuses_the_next():
    from torch.export import Dim

    batch = {"x": {0: Dim("batch", min=1, max=4)}}
    torch.manual_seed(0)
    model = DilatedSpotter().eval()
    x = (torch.randn(2, 6, 48),)  # a batch of 1 would specialise: export on 2
    prepared = prepare_pt2e(
        torch.export.export(model, x, dynamic_shapes=batch).module(), edge.xnnpack_quantizer()
    )
    with torch.no_grad():
        for size in (1, 2, 3, 4):
            prepared(torch.randn(size, 6, 48))
    qdq = convert_pt2e(prepared)
    program = edge.to_executorch(qdq, x, partitioner=XnnpackPartitioner(), dynamic_shapes=batch)
    step = [
        n
        for n in qdq.graph.nodes
        if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default
    ][-1].args[1]
    with contextlib.redirect_stderr(io.StringIO()):
        loaded = Runtime.get().load_program(program.buffer)  # kept alive while the method runs
        forward = loaded.load_method("forward")
    for size in (1, 4):
        inputs = torch.randn(size, 6, 48)
        out = forward.execute([inputs])[0]
        assert out.shape == (size, 5)
        steps = ((out - qdq(inputs)).abs() / step).round().max().item()
        assert steps <= 1, f"batch {size}: {steps} output steps from the q/dq model"
    with (
        pytest.raises(RuntimeError, match=r"set_inputs\(\)"),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        forward.execute([torch.randn(5, 6, 48)])
    with pytest.raises(AssertionError, match=r"Guard failed: x.size\(\)\[0\] <= 4"):
        qdq(torch.randn(5, 6, 48))
    run = operators_run(program.buffer, [torch.randn(3, 6, 48)])
    assert run.int8 and not run.float_only and not run.portable, run.summary_in("en")


# --- What an ETDump event says, and what it does not: a float op inside an int8 delegate ------


class HardswishAfterEach(nn.Module):
    """linear -> hardswish -> linear -> hardswish. XNNPACKQuantizer annotates no hardswish:
    the first sits between two int8 linears (a dequantize before it, a quantize after), the
    second reads the last linear's dequantized output and is the model's output, in float."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x):
        return nn.functional.hardswish(self.fc2(nn.functional.hardswish(self.fc1(x))))


def hardswish_program(*, int8: bool):
    torch.manual_seed(0)
    rows = (torch.randn(4, 16),)
    graph = export_module(HardswishAfterEach().eval(), rows)
    if int8:
        graph = prepare_pt2e(graph, edge.xnnpack_quantizer())
        graph(*rows)
        graph = convert_pt2e(graph)
    return graph, edge.to_executorch(graph, rows, partitioner=XnnpackPartitioner()), rows


def only_chinese_prose(summary: str, run: OperatorsRun) -> str:
    """``summary`` without its op names, XNNPACK, int8, portable kernel and the counts."""
    for name in sorted([*run.xnnpack, *run.portable], key=len, reverse=True):
        summary = summary.replace(name, "")
    for word in ("XNNPACK", "int8", "portable kernel"):
        summary = summary.replace(word, "")
    return re.sub(r"×\d+", "", summary)


def test_a_float_hardswish_inside_an_int8_delegate_is_listed_not_dropped():
    """The old summary said "XNNPACK float: none" here: the ETDump's event for the float
    hardswish is named "HardSwish (NC)", with no data type, and was dropped."""
    qdq, program, rows = hardswish_program(int8=True)
    hardswishes = [n for n in qdq.graph.nodes if n.target == torch.ops.aten.hardswish.default]
    dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    assert [h.args[0].target for h in hardswishes] == [dequantize, dequantize]
    assert [next(iter(h.users)).target for h in hardswishes] == [quantize, "output"]
    assert len(edge.delegated(program.exported_program())) == 1, "one delegate holds it all"

    run = operators_run(program.buffer, rows)
    english = run.summary_in("en")
    assert not run.portable, english
    # the float hardswish: its name says no data type
    assert run.untyped == {"HardSwish (NC)": 1} and not run.float_only, english
    # the hardswish between the int8 linears: a lookup table on int8 data, no float island
    assert run.int8 == {"Fully Connected (NC, QS8, QC8W) GEMM": 2, "Invalid Unary Op": 1}
    assert run.conversions == {"Convert (NC)": 2}, "the input's quantize, the output's dequantize"
    kinds = (run.int8, run.float_only, run.untyped, run.conversions)
    assert sum(kinds, Counter()) == run.xnnpack, "every operator in exactly one kind"
    assert "XNNPACK float: none" not in english and "HardSwish (NC) ×1" in english, english
    assert english.splitlines()[1:3] == [
        "XNNPACK float: unknown (no name says float; see the next line)",
        "XNNPACK int8 or float (the name does not say): HardSwish (NC) ×1",
    ]
    chinese = run.summary_in("zh_TW")
    assert "HardSwish (NC) ×1" in chinese and "XNNPACK 浮點數：無" not in chinese, chinese
    assert not re.search(r"[A-Za-z]", only_chinese_prose(chinese, run)), chinese
    assert "Fully Connected (NC, QS8, QC8W) GEMM ×2、Invalid Unary Op ×1" in chinese

    float_run = operators_run(hardswish_program(int8=False)[1].buffer, rows)
    assert float_run.float_only == {"Fully Connected (NC, F32) GEMM": 2}, float_run.xnnpack
    assert float_run.untyped == {"HardSwish (NC)": 2} and not float_run.int8
    assert "XNNPACK float: Fully Connected (NC, F32) GEMM ×2" in float_run.summary_in("en")


def test_the_chinese_summary_is_chinese_but_for_the_names():
    run = OperatorsRun(
        Counter({"Convolution (NHWC, QC8) IGEMM": 2, "Max Pooling (NHWC, S8)": 1}),
        Counter({"mean.out": 1}),
    )
    assert run.int8 == run.xnnpack, "S8 is int8"
    chinese = run.summary_in("zh_TW")
    assert chinese.splitlines() == [
        "XNNPACK int8：Convolution (NHWC, QC8) IGEMM ×2、Max Pooling (NHWC, S8) ×1",
        "XNNPACK 浮點數：無",
        "portable kernel：mean.out ×1",
    ]
    assert not re.search(r"[A-Za-z]", only_chinese_prose(chinese, run)), chinese


def test_load_check_names_the_node_xnnpack_refuses():
    class Transposed(nn.Module):  # t() between two scales: m99_5
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.column = nn.Parameter(torch.randn(8, 1) * 5)

        def forward(self, x):
            return torch.cat([self.column, self.fc(x).t()], 1)

    torch.manual_seed(0)
    rows = (torch.randn(4, 8),)
    prepared = prepare_pt2e(export_module(Transposed(), rows), edge.xnnpack_quantizer())
    prepared(*rows)
    program = edge.to_executorch(convert_pt2e(prepared), rows, partitioner=XnnpackPartitioner())
    check = load_check(program)
    assert not check.loads and "Failed to load method forward" in check.errors["forward"]
    (refusal,) = check.refused
    assert refusal.op == "permute_copy.default" and "static transpose" in refusal.xnnpack
    with pytest.raises(TypeError, match="to_executorch"):
        load_check(program.exported_program())


def test_a_load_check_that_loads_says_so_in_the_lessons_language():
    from common import lesson
    from common.runtime import LoadCheck

    check = LoadCheck(loads=True, errors={}, refused=(), log="")
    assert str(check) == "loads"
    lesson.start(lang="zh_TW", name="m99_5_test")
    try:
        assert str(check) == "可以載入"
    finally:
        lesson.stop()
