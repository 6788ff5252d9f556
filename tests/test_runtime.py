"""common.runtime: what a ``.pte`` does on the ExecuTorch runtime, read by ``operators_run``
(an ETDump) and ``load_check`` (each method loaded in a child process)."""

import contextlib
import io

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
from common.runtime import load_check, operators_run  # noqa: E402

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
