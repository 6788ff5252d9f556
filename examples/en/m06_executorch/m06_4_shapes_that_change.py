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
import inspect
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
# The q/dq model may lose that guard, though. When a file on the call stack has
# ``executorch`` or ``torchao`` in its path (``_ok_to_generate_guards_fn`` in
# ``torch/export/_unlift.py``), ``.module()`` checks the range in a hook on the module instead
# of a ``_guards_fn`` node in its graph, and ``prepare_pt2e`` and ``convert_pt2e`` return new
# graph modules, without the hook. This page runs from a folder named ``m06_executorch/`` (in
# the site's build, in the tests, in a clone of the course): its q/dq model runs batch 5
# without a word. A copy run as a notebook from another folder keeps the node, and refuses.
# Which case this run is:

on_such_path = any(
    word in frame.filename for frame in inspect.stack(0) for word in ("executorch", "torchao")
)
guarded = bool(edge_model.graph.find_nodes(op="call_module", target="_guards_fn"))
try:
    batch_5 = f"runs, output {tuple(edge_model(clips(MAX_BATCH + 1)).shape)}"
except AssertionError as error:
    batch_5 = f"{type(error).__name__}: {error}"
print(f"executorch/torchao on the stack: {on_such_path}; _guards_fn: {guarded}; {batch_5}")
assert guarded != on_such_path, "a _guards_fn node exactly when no such path calls .module()"
expected = (
    "runs, output (5, 12)" if on_such_path else "AssertionError: Guard failed: x.size()[0] <= 4"
)
assert batch_5 == expected, "unchecked from such a path, refused from any other"

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
# With ``dynamic=True`` it would compile one graph with a symbolic batch; on this model that
# graph fails at its first call, with the stride assertion of
# :ref:`Troubleshooting: lowering and speed
# <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`. The trigger is ``conv1``:
# an int8 conv whose input has **one channel** (a clip's MFCCs, a grey image). With a symbolic
# batch, inductor declares its output contiguous (NCHW, stride 490 across the 32 channels),
# while oneDNN's int8 conv writes it channels-last (NHWC, stride 1), and the compiled code's
# check of the strides stops it (``_prepare_convolution_fusion_create`` in
# ``torch/_inductor/mkldnn_ir.py``; torch 2.13, torchao 0.18). For this model, a few batch
# sizes compiled each, or padded to, is the way for ``torch.compile``.

torch._dynamo.reset()
with torch.no_grad():
    symbolic = torch.compile(x86_model, dynamic=True)
    with expect_error(AssertionError, match="expected size 32==32, stride 1==490 at dim=1"):
        symbolic(clips(2))

# %%
# Step 3 — AOTInductor: one package for the whole range
# -----------------------------------------------------
# ``aoti_compile_and_package`` takes the ``ExportedProgram`` and its range: one package
# serves every batch from 1 to 4. ``compiled_package`` (M03-4) compiles it with freezing and,
# with ``kernel_profile=True``, has inductor wrap each kernel call in a profiler record. The
# generated C++ calls two int8 convs and an int8 linear; ``kernels_ran`` shows that the loaded
# package ran them, at batch 1 and at batch 4. (``check=False``: ``compiled_package`` compares
# a package's outputs with its program's before handing it out, and would refuse this one.)

x86_program = torch.export.export(x86_model, example, dynamic_shapes=dynamic_shapes)
package = compiled_package(x86_program, "spotter_int8_batch_1_4", kernel_profile=True, check=False)
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
# outputs at batch 3 have an SQNR near 0 dB: noise, with no error. It is Step 2's bug: the
# package declares ``conv1``'s output contiguous, oneDNN writes it channels-last, and the ReLU
# loop inductor generated after it reads it in the declared layout.

package_sqnr = sqnr(x86_model(clips(3)), runner(clips(3))).item()
print(f"SQNR, the dynamic package against the q/dq model: {package_sqnr:.1f} dB")
assert package_sqnr < 10, "wrong numbers, silently"

# %%
# The stride check that stopped ``torch.compile`` is compiled into the package too, but off: it
# runs only when ``AOTI_RUNTIME_CHECK_INPUTS=1`` is set in the environment of the process
# that loads the package. ``checked`` runs a package in a child process with it set.


def checked(path, sizes) -> dict[int, str]:
    """Each batch size run through a package in a child with AOTI_RUNTIME_CHECK_INPUTS=1:
    "ran", or the first line of the error."""
    code = f"""
import torch
runner = torch._inductor.aoti_load_package({str(path)!r})
for size in {tuple(sizes)!r}:
    try:
        runner(torch.randn(size, 1, {FRAMES}, {COEFFICIENTS}))
        print("ran")
    except RuntimeError as error:
        print(str(error).splitlines()[0])
"""
    env = {**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"}
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return dict(zip(sizes, child.stdout.splitlines(), strict=True))


# %%
# With the check on, the package refuses batch 3, inside the bound, with Step 2's stride
# error, and batch 5 for the bound. Without it, batch 5 runs.

refusals = checked(package, (3, MAX_BATCH + 1))
for size, line in refusals.items():
    print(f"batch {size}: {line}")
assert refusals[3].startswith("expected size 32==32, stride 1==490 at dim=1"), "the layout"
assert refusals[5].endswith("expected to be <= 4, but got: 5"), "checked, batch 5 is refused"
assert runner(clips(MAX_BATCH + 1)).shape == (MAX_BATCH + 1, KEYWORDS), "unchecked, it runs"

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
# The way out that keeps the dynamic batch: leave the one-channel conv float
# (``set_module_name_qconfig("conv1", None)``). A float conv is not prepacked under a symbolic
# batch and writes the layout inductor declares; ``conv2`` and the linear stay int8. Its
# package matches its q/dq model, passes ``compiled_package``'s check, and runs batch 3 with
# ``AOTI_RUNTIME_CHECK_INPUTS=1``.

stem_float = quantized(x86_quantizer().set_module_name_qconfig("conv1", None))
stem_program = torch.export.export(stem_float, example, dynamic_shapes=dynamic_shapes)
stem_package = compiled_package(stem_program, "spotter_conv1_float_1_4", kernel_profile=True)
stem_runner = torch._inductor.aoti_load_package(str(stem_package))
stem_sqnr = sqnr(stem_float(clips(3)), stem_runner(clips(3))).item()
print(f"batch 3: SQNR {stem_sqnr:.1f} dB; {dict(kernels_ran(stem_runner, (clips(3),)))}")
assert stem_sqnr > 30, "the q/dq model's numbers, with a dynamic batch"
assert kernels_ran(stem_runner, (clips(3),))["qconv_pointwise"] == 1, "conv2 int8, conv1 float"
assert checked(stem_package, (3,)) == {3: "ran"}, "the stride check passes"

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
# ExecuTorch plans ahead of time, in one arena (M06-2), the tensors it holds between
# instructions: the program's input and output, and what crosses between delegates. Inside a
# delegate, XNNPACK keeps the convs' activations in a workspace of its own, outside the plan.
# A dynamic tensor gets room for its upper bound: the plan's input is stored with the largest
# shape. A static ``.pte``'s arena holds its input and output, so batch 4's is about four
# times batch 1's, and smaller than ``conv1``'s int8 output alone (4 × 32 × 49 × 10 bytes).
#
# The dynamic ``.pte``'s arena is far larger, for a reason of its own: ``flatten`` with a
# symbolic batch is a view to ``[s0, 4000]``, and XNNPACK takes views to fixed shapes only
# (M06-2's partitioner: ``_view``). The graph is cut in two delegates around it, and the
# second conv's float output crosses between them through the arena, planned at batch 4:
# 4 × 32 × 25 × 5 × 4 bytes. The bound sets what the plan reserves: keep it tight, and look
# at what a symbolic shape leaves outside the delegates.


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
input_output = MAX_BATCH * (FRAMES * COEFFICIENTS + KEYWORDS) * 4  # float32 in and out
conv1_int8 = MAX_BATCH * 32 * FRAMES * COEFFICIENTS  # one byte an element
assert input_output <= arena["static 4"] < conv1_int8, "input and output; no conv activation"
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
# AOTInductor package           int8 kernels, but noise   runs, unchecked
#                               (one-channel ``conv1``);
#                               pad to a static 4, or
#                               leave ``conv1`` float
# ``.pte`` on ExecuTorch        one program, arena for 4  ``set_inputs() ... 0x10``
# ============================  ========================  =================================
#
# - Export on a batch ≥ 2 with ``Dim("batch", min=1, max=N)``, calibrate with several sizes;
#   ``to_executorch(..., dynamic_shapes=...)`` carries the range to the ``.pte``.
# - Prove int8 where it runs: ``kernels_run`` (compiled), ``kernels_ran`` on a package compiled
#   with ``kernel_profile=True``, ``operators_run`` (the ``.pte``'s ETDump); and check the
#   numbers too: a dynamic AOTInductor package ran int8 kernels and gave noise, since its
#   first int8 conv reads one channel (torch 2.13). ``compiled_package`` compares a package
#   with its program before handing it out.
# - A package checks its input shapes, and its kernels' output strides, only under
#   ``AOTI_RUNTIME_CHECK_INPUTS=1``: that refuses batch 5, and this package at batch 3 too.
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
# 2. Widen the stem instead: give the spotter three input channels (the MFCCs with their
#    deltas and delta-deltas, ``nn.Conv2d(3, 32, (5, 3), padding=(2, 1))``), every conv int8.
#    Predict whether ``compiled_package`` accepts its dynamic package, and how that package's
#    outputs at batch 3 compare with those of a static package compiled for batch 3.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          wide = Spotter().eval()
#          wide.conv1 = nn.Conv2d(3, 32, (5, 3), padding=(2, 1))
#          wide_clips = [torch.randn(size, 3, FRAMES, COEFFICIENTS) for size in (2, 3)]
#          wide_export = torch.export.export(
#              wide, (wide_clips[0],), dynamic_shapes=dynamic_shapes
#          )
#          prepared = prepare_pt2e(wide_export.module(), x86_quantizer())
#          for batch in wide_clips:
#              prepared(batch)
#          wide_int8 = convert_pt2e(prepared)
#          wide_program = torch.export.export(
#              wide_int8, (wide_clips[0],), dynamic_shapes=dynamic_shapes
#          )
#          wide_runner = torch._inductor.aoti_load_package(
#              str(compiled_package(wide_program, "spotter_3_channels_1_4"))  # checked
#          )
#          three = torch.export.export(wide_int8, (wide_clips[1],))  # static, batch 3
#          three_runner = torch._inductor.aoti_load_package(
#              str(compiled_package(three, "spotter_3_channels_3"))
#          )
#          dynamic_out = wide_runner(wide_clips[1])
#          print(f"{sqnr(wide_int8(wide_clips[1]), dynamic_out).item():.1f} dB")
#          assert torch.equal(dynamic_out, three_runner(wide_clips[1])), (
#              "three channels: the static package's numbers, bit for bit"
#          )
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
# :ref:`M06-5 · int8 in, int8 out
# <sphx_glr_lessons_m06_executorch_m06_5_int8_inputs_and_outputs.py>` takes the last float off
# the program's edges: a ``.pte`` whose input and output are int8.
#
# The errors at the bound, and the ones ExecuTorch users report most, are on
# :ref:`Troubleshooting: ExecuTorch and XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`.
