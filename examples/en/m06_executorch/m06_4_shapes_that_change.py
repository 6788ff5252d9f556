"""
M06-4 Shapes that change: a bounded dynamic batch
=================================================

A phone's keyword spotter hears one clip at a time, or four when the user talks fast; a
server batches whatever arrived. This lesson exports one int8 model with a **bounded** batch,
``Dim("batch", min=1, max=4)``, and follows that bound to three targets: ``torch.compile``,
an AOTInductor package and a ``.pte`` on the ExecuTorch runtime. Each runs batch 1 and batch 4
with int8 kernels, proven where it runs, and each says something different about batch 5.

**What you will learn**

- How a ``Dim(min, max)`` travels from ``torch.export`` through quantization to each target
- How to prove int8 ran: the profiler on a compiled model and on a loaded package, the ETDump
  of a ``.pte``
- What the bound costs on the edge (memory planned for the largest batch) and what happens
  past it

**Prerequisites**:
:ref:`M03-4 · Shipping an int8 model <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`,
:ref:`M06-3 · The .pte, inside out <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# A keyword spotter: two 2-D convs over a clip's 49 × 10 MFCC features (49 frames of 10
# coefficients), a linear to 12 keywords. It is exported once, on an example batch of 2 (a
# batch of 1 would specialise, M00-1), with the batch declared dynamic between 1 and 4.

import contextlib
import io
import os
import subprocess
import sys
import warnings

import torch
from torch import nn
from torch.export import Dim

from common.aoti import compiled_package, kernel_calls, kernels_ran
from common.expect import expect_error
from common.kernels import kernels_run
from common.numerics import sqnr
from common.pt2e import quiet, x86_quantizer
from common.viz import draw

quiet()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about (M03-3).
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import _get_extended_header
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import delegated, to_executorch, xnnpack_quantizer
from common.runtime import operators_run

qd = torch.ops.quantized_decomposed
FRAMES, COEFFICIENTS, KEYWORDS, MAX_BATCH = 49, 10, 12, 4


class Spotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, (5, 3), padding=(2, 1))
        self.conv2 = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32 * 25 * 5, KEYWORDS)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def clips(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(
        batch, 1, FRAMES, COEFFICIENTS, generator=torch.Generator().manual_seed(seed)
    )


torch.manual_seed(0)
model = Spotter().eval()
example = (clips(2),)
dynamic_shapes = {"x": {0: Dim("batch", min=1, max=MAX_BATCH)}}
exported = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)


def quantized(quantizer) -> torch.fx.GraphModule:
    """The exported graph prepared, calibrated on batches of every size 1..4, converted."""
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for size in range(1, MAX_BATCH + 1):
            prepared(clips(size, seed=size))
    return convert_pt2e(prepared)


x86_model = quantized(x86_quantizer())  # for torch.compile and AOTInductor (M03)
edge_model = quantized(xnnpack_quantizer())  # for the .pte (M06)

# %%
# Step 1 — The bound is in the graph
# ----------------------------------
# Export turned the batch into a symbol, ``s0`` or similar, with a range: the program's
# ``range_constraints``. Every node's shape is written with it, and so is the quantized graph
# calibrated on four batch sizes: a single graph serves them all.

(batch_symbol, batch_range), *_ = exported.range_constraints.items()
print(f"{batch_symbol}: {batch_range}")
placeholder = next(n for n in edge_model.graph.nodes if n.op == "placeholder")
print(f"the quantized graph's input: {tuple(placeholder.meta['val'].shape)}")
assert (batch_range.lower, batch_range.upper) == (1, MAX_BATCH), "the Dim's min and max"
assert not isinstance(placeholder.meta["val"].shape[0], int), "the batch is a symbol"

# %%
# An exported model checks its input against that range when called: batch 1 and 4 run, and
# batch 5 is refused by the guard on the upper bound, as this small program exported in a
# child process shows:

for size in (1, MAX_BATCH):
    assert edge_model(clips(size)).shape == (size, KEYWORDS), "each size inside the range runs"
GUARDED = f"""
import torch
from torch.export import Dim
class Net(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x)
model = Net({COEFFICIENTS}, 2)
bound = {{"x": {{0: Dim("batch", min=1, max={MAX_BATCH})}}}}
program = torch.export.export(model, (torch.randn(2, {COEFFICIENTS}),), dynamic_shapes=bound)
program.module()(torch.randn({MAX_BATCH + 1}, {COEFFICIENTS}))
"""
child = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True)
guard_error = child.stderr.strip().splitlines()[-1]
print(guard_error)
assert guard_error == "AssertionError: Guard failed: x.size()[0] <= 4", "the upper bound"
draw(edge_model, title="Spotter, int8 (XNNPACK), batch 1..4")

# %%
# Here, though, the q/dq model runs batch 5 without a word. torch leaves the check out of
# ``.module()`` when any file on the call stack has ``executorch`` or ``torchao`` in its path
# (``_ok_to_generate_guards_fn`` in ``torch/export/_unlift.py``), and this page lives in
# ``m06_executorch/``. A script of yours named ``executorch_demo.py`` loses its guards the
# same way; what it runs past the bound is then what the float graph computes.

guarded = bool(edge_model.graph.find_nodes(op="call_module", target="_guards_fn"))
print(f"_guards_fn in this page's q/dq model: {guarded}")
if guarded:  # run from a path without "executorch"
    with expect_error(AssertionError, match="Guard failed: x.size()[0] <= 4"):
        edge_model(clips(MAX_BATCH + 1))
else:
    assert edge_model(clips(MAX_BATCH + 1)).shape == (5, KEYWORDS), "batch 5 runs, unchecked"

# %%
# Step 2 — torch.compile: one compile per batch size
# --------------------------------------------------
# ``torch.compile`` does not read the export's ``Dim``: it traces the model again, and with
# ``dynamic=False`` it compiles once per batch size it meets, each time with freezing (M03-3)
# and each one int8. The profiler shows the kernels each size ran (``kernels_run``, M03-4).

torch._dynamo.reset()
torch._inductor.config.freezing = True  # for the process: a recompile keeps it (m99_3)
compiles = torch._dynamo.utils.counters["stats"]
before = compiles["unique_graphs"]
with torch.no_grad():
    compiled = torch.compile(x86_model, dynamic=False)
    ran = {}
    for size in (1, MAX_BATCH):
        compiled(clips(size))  # the compile for this size
        ran[size] = kernels_run(compiled, (clips(size, seed=1),))
        print(f"batch {size}: {ran[size].summary}")
new_graphs = compiles["unique_graphs"] - before
print(f"graphs compiled: {new_graphs}")
assert new_graphs == 2, "one compile for batch 1, one for batch 4"
assert all(r.int8 and not r.float for r in ran.values()), "int8 convs and linear at both sizes"

# %%
# With ``dynamic=True`` it would compile one graph with a symbolic batch; on this int8 model
# that graph fails at its first call, with the stride assertion of
# :ref:`Troubleshooting: lowering and speed
# <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>` (inductor checks
# the int8 conv's output for one layout and gets another). A few batch sizes compiled each,
# or padded to, is the way for ``torch.compile``.

torch._dynamo.reset()
with torch.no_grad():
    symbolic = torch.compile(x86_model, dynamic=True)
    with expect_error(AssertionError, match="expected size"):
        symbolic(clips(2))

# %%
# Step 3 — AOTInductor: one package for the whole range
# -----------------------------------------------------
# ``aoti_compile_and_package`` takes the ``ExportedProgram`` and its range: one package
# serves every batch from 1 to 4. ``compiled_package`` (M03-4) compiles it with freezing and,
# with ``kernel_profile=True``, has inductor wrap each kernel call in a profiler record. The
# generated C++ calls two int8 convs and an int8 linear; ``kernels_ran`` shows that the loaded
# package ran them, at batch 1 and at batch 4.

x86_program = torch.export.export(x86_model, example, dynamic_shapes=dynamic_shapes)
package = compiled_package(x86_program, "spotter_int8_batch_1_4", kernel_profile=True)
calls = kernel_calls(package)
print(f"in the package's C++: {dict(calls)}")
runner = torch._inductor.aoti_load_package(str(package))
at_run_time = {size: kernels_ran(runner, (clips(size),)) for size in (1, MAX_BATCH)}
for size, kernels in at_run_time.items():
    print(f"batch {size}, at run time: {dict(kernels)}")
int8_kernels = {"qconv_pointwise": 2, "qlinear_pointwise": 1}
assert all(kernels == int8_kernels for kernels in at_run_time.values()), "int8 at 1 and at 4"

# %%
# The profiler proves int8 ran, not that it ran right. Against the q/dq model, the package's
# outputs at batch 3 have an SQNR near 0 dB: noise, with no error. It is the int8 conv with a
# symbolic batch again: where ``torch.compile`` stopped on inductor's stride check (Step 2),
# the package has no such check and computes on (torch 2.13, torchao 0.18).

package_sqnr = sqnr(x86_model(clips(3)), runner(clips(3))).item()
print(f"SQNR, the dynamic package against the q/dq model: {package_sqnr:.1f} dB")
assert package_sqnr < 10, "wrong numbers, silently"

# %%
# The way out that keeps one package: compile it for the largest batch, static, and pad a
# smaller batch to it with zeros (each sample is computed on its own, so the padding changes no
# other output). Its outputs are then the q/dq model's up to int8 rounding, and it runs the
# same int8 kernels.

static_program = torch.export.export(x86_model, (clips(MAX_BATCH),))
static_package = compiled_package(static_program, "spotter_int8_batch_4", kernel_profile=True)
static_runner = torch._inductor.aoti_load_package(str(static_package))


def padded(batch: torch.Tensor) -> torch.Tensor:
    filler = batch.new_zeros(MAX_BATCH - batch.shape[0], *batch.shape[1:])
    return static_runner(torch.cat([batch, filler]))[: batch.shape[0]]


for size in (1, 3):
    padded_sqnr = sqnr(x86_model(clips(size)), padded(clips(size))).item()
    print(f"batch {size}, padded to {MAX_BATCH}: SQNR {padded_sqnr:.1f} dB")
    assert padded_sqnr > 30, "the q/dq model's numbers"
assert kernels_ran(static_runner, (clips(MAX_BATCH),)) == int8_kernels, "the same int8 kernels"

# %%
# Past the bound, the dynamic package does not refuse by default: batch 5 runs. A package checks its
# inputs against its shapes only when ``AOTI_RUNTIME_CHECK_INPUTS=1`` is set in the
# environment of the process that runs it, as in this child process:

assert runner(clips(MAX_BATCH + 1)).shape == (MAX_BATCH + 1, KEYWORDS), "batch 5 runs, unchecked"
CHECKED = f"""
import torch
runner = torch._inductor.aoti_load_package({str(package)!r})
runner(torch.randn({MAX_BATCH + 1}, 1, {FRAMES}, {COEFFICIENTS}))
"""
env = {**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"}
child = subprocess.run([sys.executable, "-c", CHECKED], env=env, capture_output=True, text=True)
refusal = [line for line in child.stderr.splitlines() if "Error" in line][-1]
print(refusal)
assert child.returncode != 0 and "4" in refusal, "checked, batch 5 is refused"

# %%
# Step 4 — A .pte: the runtime at batch 1 and 4
# ---------------------------------------------
# ``common.edge.to_executorch`` takes the same ``dynamic_shapes`` and hands them to
# ``torch.export``; the XNNPACK delegates are compiled for a batch between 1 and 4. The
# ``.pte`` runs at both ends within one output step of the q/dq model.

program = to_executorch(
    edge_model, example, partitioner=XnnpackPartitioner(), dynamic_shapes=dynamic_shapes
)
with contextlib.redirect_stderr(io.StringIO()):  # the runtime's CPU-info log (M06-3)
    loaded = Runtime.get().load_program(program.buffer)
    forward = loaded.load_method("forward")  # ``loaded`` lives as long as ``forward`` runs
step = [n for n in edge_model.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
for size in (1, MAX_BATCH):
    out = forward.execute([clips(size)])[0]
    steps = ((out - edge_model(clips(size))).abs() / step).round().max().item()
    print(f"batch {size}: output {tuple(out.shape)}, {steps:.0f} output steps from the q/dq model")
    assert out.shape == (size, KEYWORDS) and steps <= 1, "within one step of the q/dq model"

# %%
# Which operators ran? ``operators_run`` runs the ``.pte`` once with an **ETDump** (M06-3) and
# reads the profiling events the runtime records for each XNNPACK operator, named by XNNPACK
# with its data types: ``QC8`` is int8 with per-channel int8 weights, ``QS8`` int8, ``X8`` a
# move of int8 bytes (the layout changes around the convs). No float operator, and no portable
# kernel: the whole graph ran in XNNPACK, in int8, at both sizes.

for size in (1, MAX_BATCH):
    operators = operators_run(program.buffer, [clips(size)])
    print(f"batch {size}:\n{operators.summary}")
    assert operators.int8 and not operators.float_only and not operators.portable, "all int8"

# %%
# Step 5 — Memory planned for the largest batch
# ---------------------------------------------
# ExecuTorch plans the place of every tensor between instructions in one arena, ahead of time
# (M06-2), and a dynamic tensor gets room for its upper bound: the plan's input is stored with
# the largest shape. A static ``.pte`` at batch 1 needs about a quarter of one at batch 4.
#
# The dynamic ``.pte`` needs far more than either, for a reason of its own: ``flatten`` with a
# symbolic batch is a view to ``[s0, 4000]``, and XNNPACK takes views to fixed shapes only
# (M06-2's partitioner: ``_view``). The graph is cut in two delegates around it, and the
# second conv's float output crosses between them through the arena, planned at batch 4:
# 4 × 32 × 25 × 5 × 4 bytes. The bound is what the phone pays for: keep it tight, and look at
# what a symbolic shape leaves outside the delegates.


def plan_of(pte: bytes):
    header = _get_extended_header(pte)
    return _flatbuffer_to_program(pte[: header.program_size]).execution_plan[0]


dynamic_plan = plan_of(program.buffer)
static = {
    size: to_executorch(edge_model, (clips(size),), partitioner=XnnpackPartitioner())
    for size in (1, MAX_BATCH)
}
arena = {
    "dynamic 1..4": dynamic_plan.non_const_buffer_sizes[1],
    **{f"static {n}": plan_of(p.buffer).non_const_buffer_sizes[1] for n, p in static.items()},
}
delegates = {
    "dynamic 1..4": len(delegated(program.exported_program())),
    **{f"static {n}": len(delegated(p.exported_program())) for n, p in static.items()},
}
print(f"planned input: {dynamic_plan.values[dynamic_plan.inputs[0]].val.sizes}")
for name, size in arena.items():
    print(f"{name:13} arena {size:9,} bytes, {delegates[name]} delegate(s)")
assert dynamic_plan.values[dynamic_plan.inputs[0]].val.sizes == [MAX_BATCH, 1, FRAMES, COEFFICIENTS]
assert arena["static 4"] > 3 * arena["static 1"], "a static arena grows with the batch"
assert delegates == {"dynamic 1..4": 2, "static 1": 1, "static 4": 1}, "the flatten splits it"
conv_output = MAX_BATCH * 32 * 25 * 5 * 4  # float32, planned at batch 4
assert conv_output < arena["dynamic 1..4"] < conv_output + arena["static 4"], "and costs that"

# %%
# Step 6 — Batch 5 on the runtime
# -------------------------------
# Past the bound the runtime refuses the input before anything runs: ``set_inputs`` cannot
# resize the planned input tensor, whose capacity is 4 × 1 × 49 × 10 = 1,960 elements. The
# Python error carries only a code (``0x10``, ``InvalidArgument``); the runtime's log says why.

log = io.StringIO()
with expect_error(RuntimeError, match="method->set_inputs() for method 'forward' failed"):
    with contextlib.redirect_stderr(log):
        forward.execute([clips(MAX_BATCH + 1)])
resize = [line for line in log.getvalue().splitlines() if "Attempted to resize" in line]
print(resize[0])
assert f"{MAX_BATCH * FRAMES * COEFFICIENTS} elements" in resize[0], "the capacity of batch 4"
assert forward.execute([clips(2)])[0].shape == (2, KEYWORDS), "and the method still runs after"

# %%
# Summary
# -------
# ============================  ========================  =================================
# target                        batch 1 to 4              batch 5
# ============================  ========================  =================================
# q/dq model (export's Dim)     one graph                 ``Guard failed: x.size()[0] <= 4``
# ``torch.compile``             one compile per size      compiles a fifth graph
# AOTInductor package           int8 kernels, but noise;  runs, unchecked
#                               pad to a static 4
# ``.pte`` on ExecuTorch        one program, arena for 4  ``set_inputs() ... 0x10``
# ============================  ========================  =================================
#
# - Export on a batch ≥ 2 with ``Dim("batch", min=1, max=N)``, calibrate with several sizes;
#   ``to_executorch(..., dynamic_shapes=...)`` carries the range to the ``.pte``.
# - Prove int8 where it runs: ``kernels_run`` (compiled), ``kernels_ran`` on a package compiled
#   with ``kernel_profile=True``, ``operators_run`` (the ``.pte``'s ETDump); and check the
#   numbers too: a dynamic AOTInductor package ran int8 kernels and gave noise. A package
#   checks its input shapes only under ``AOTI_RUNTIME_CHECK_INPUTS=1``.
#
# Exercises
# ---------
# 1. Raise the bound to 8 (export, quantize and lower again: the q/dq model keeps the bound it
#    was exported with). Predict the new ``.pte``'s arena against the ``dynamic 1..4`` one.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          eight = {"x": {0: Dim("batch", min=1, max=8)}}
#          # the q/dq model keeps its export's bound (<= 4): start from the float model
#          prepared = prepare_pt2e(
#              torch.export.export(model, example, dynamic_shapes=eight).module(),
#              xnnpack_quantizer(),
#          )
#          for size in (1, 8):
#              prepared(clips(size))
#          wider = to_executorch(
#              convert_pt2e(prepared),
#              example,
#              partitioner=XnnpackPartitioner(),
#              dynamic_shapes=eight,
#          )
#          wider_arena = plan_of(wider.buffer).non_const_buffer_sizes[1]
#          print(f"{wider_arena:,} bytes")
#          assert wider_arena > 1.9 * arena["dynamic 1..4"], "about twice: planned for 8"
#
# 2. Run ``operators_run`` on a batch of 3, a size never used to build or check the ``.pte``.
#    Predict the int8 operators.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          three = operators_run(program.buffer, [clips(3)])
#          assert three.int8 == operators_run(program.buffer, [clips(1)]).int8, "the same"
#
# Further reading
# ---------------
# - `torch.export: dynamic shapes
#   <https://docs.pytorch.org/docs/stable/export.html#expressing-dynamism>`_
# - `ExecuTorch: memory planning
#   <https://docs.pytorch.org/executorch/stable/compiler-memory-planning.html>`_
# - `AOTInductor <https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html>`_
#
# Next
# ----
# The errors at the bound, and the ones ExecuTorch users report most, are on
# :ref:`Troubleshooting: ExecuTorch and XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`.
