"""
M06-3 The .pte, inside out
==========================

``to_executorch()`` ends in a ``.pte`` file: the one artefact a phone app loads. This lesson
opens it with ExecuTorch's own reader and finds, in its bytes, the graph it came from: an
execution plan of three instructions, one portable operator, two XNNPACK payloads and the
int8 weights. Then it runs the file on the ExecuTorch runtime, measures how far its outputs
are from the q/dq model and where the gap comes from (ExecuTorch's devtools), and how fast
and how small it is next to float and to the x86 int8 model.

**What you will learn**

- What a ``.pte`` holds and how each part maps back to the graph
- How to run it with ``executorch.runtime.Runtime`` and compare it with the q/dq model
- How to find where the numbers diverge with an ETDump and the Inspector

**Prerequisites**:
:ref:`M06-2 · Lowering to ExecuTorch
<sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`,
:ref:`M03-3 · Speed and size, measured
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``conv_net`` (four 3×3 convs of 64–128 channels on 28×28 images, an average pool to 7×7
# and two linears), quantized with ``XNNPACKQuantizer`` and calibrated on four batches.

import contextlib
import io
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from common.cache import cached_path
from common.charts import pad, use_course_style
from common.digest import digest
from common.models import example_inputs, get_model, input_shape
from common.numerics import sqnr
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import race, timing_threads
from common.viz import draw

quiet()
use_course_style()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about (M03-3).
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.devtools import Inspector
from executorch.exir import to_edge_transform_and_lower
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import _get_extended_header
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

qd = torch.ops.quantized_decomposed
# How the printed lines and the charts name what is timed and saved (the code uses the keys).
LABELS = {
    "fp32 compiled": "fp32, compile + freezing",
    "x86 compiled": "x86 int8, compile + freezing",
    "fp32 eager": "fp32 eager",
    "pte run": "ExecuTorch XNNPACK int8",
    "fp32 saved": "fp32, torch.export.save",
    "qdq saved": "int8 q/dq, torch.export.save",
    "pte file": "int8, .pte",
}
BATCH, SHAPE = 2, input_shape("conv_net")
x = example_inputs(BATCH, shape=SHAPE)
float_model = export_module(get_model("conv_net"), x)


def quantized(quantizer):
    prepared = prepare_pt2e(export_module(get_model("conv_net"), x), quantizer)
    with torch.no_grad():
        for seed in range(4):
            prepared(*example_inputs(BATCH, seed=seed, shape=SHAPE))
    return convert_pt2e(prepared)


# XNNPACK's thread pool gets the timing thread count, as torch does (Step 6). Resetting it
# once a method is loaded is unsafe (hence the name): do it first.
with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
    warnings.filterwarnings("ignore", message="This API is experimental")
    portable_lib._unsafe_reset_threadpool(timing_threads())

xnnpack_config = get_symmetric_quantization_config(is_per_channel=True)
qdq_model = quantized(XNNPACKQuantizer().set_global(xnnpack_config))

# %%
# ``lowered`` does what M06-2 did — ``to_edge_transform_and_lower`` with
# ``XnnpackPartitioner``, then ``to_executorch()`` — and also asks for an **ETRecord**
# (``generate_etrecord=True``), the record of the graphs the devtools compare against in
# Step 5. Lowering takes seconds, so the ``.pte`` and the ETRecord are kept in
# ``build/cache/``, under a name made of everything that produced them.


def lowered(model) -> tuple[bytes, Path]:
    def lower(folder: Path) -> None:
        exported = torch.export.export(model, x)
        xnnpack = [XnnpackPartitioner()]
        edge = to_edge_transform_and_lower(exported, partitioner=xnnpack, generate_etrecord=True)
        program = edge.to_executorch()
        record = program.get_etrecord()
        record.update_representative_inputs([x])
        folder.mkdir()
        record.save(str(folder / "etrecord.bin"))
        (folder / "model.pte").write_bytes(program.buffer)

    folder = cached_path("executorch", f"m06_3-conv_net-{digest(model)}", lower)
    return (folder / "model.pte").read_bytes(), folder / "etrecord.bin"


pte_bytes, etrecord_path = lowered(qdq_model)
print(f".pte: {len(pte_bytes):,} bytes")

# %%
# Step 1 — The file's layout
# --------------------------
# A ``.pte`` is a FlatBuffer (the ``Program`` of ``executorch/schema/program.fbs``) followed
# by **segments**: raw, aligned byte ranges the program points into. An extended header after
# the FlatBuffer's first 8 bytes says where each part starts. ExecuTorch's serializer reads it
# with ``_get_extended_header`` and ``_flatbuffer_to_program`` (private names: the file
# format is public, its Python reader is not).

header = _get_extended_header(pte_bytes)
program = _flatbuffer_to_program(pte_bytes[: header.program_size])
plan = program.execution_plan[0]
print(f"magic {pte_bytes[4:8]!r} / header {header.magic!r}")
print(f"{pad('FlatBuffer program:', 20)}bytes 0–{header.program_size:,}")
print(f"{pad('segments:', 20)}bytes {header.segment_base_offset:,}–{len(pte_bytes):,}")
assert header.segment_base_offset + header.segment_data_size == len(pte_bytes), "nothing else"
assert [p.name for p in program.execution_plan] == ["forward"], "one method: forward"

# %%
# Step 2 — The execution plan
# ---------------------------
# ``forward`` is a list of **values** (every tensor, int and list the method touches) and a
# **chain** of instructions that read and write them by index. The instructions are what
# M06-2's graph said: a delegate call, the one portable kernel, another delegate call. In the
# q/dq graph, the portable kernel is the average pool (highlighted): the convs before it went
# into one delegate, the linears after it into another.

for instruction in plan.chains[0].instructions:
    call = instruction.instr_args
    if type(call).__name__ == "KernelCall":
        op = plan.operators[call.op_index]
        print(f"KernelCall   {op.name}.{op.overload}  values {call.args}")
    else:
        print(f"DelegateCall {plan.delegates[call.delegate_index].id}  values {call.args}")
kinds = [type(i.instr_args).__name__ for i in plan.chains[0].instructions]
assert kinds == ["DelegateCall", "KernelCall", "DelegateCall"], "convs | pool | linears"
assert [(o.name, o.overload) for o in plan.operators] == [("aten::_adaptive_avg_pool2d", "out")]
pools = qdq_model.graph.find_nodes(
    op="call_function", target=torch.ops.aten.adaptive_avg_pool2d.default
)
assert len(pools) == 1, "the graph's one average pool is the one portable kernel"
draw(qdq_model, highlight=[n.name for n in pools], title="conv_net: the portable kernel")

# %%
# The method's inputs and outputs are values too, with the shapes of the exported graph, and
# ``non_const_buffer_sizes`` is the arena that memory planning (M06-2) computed for every
# tensor between instructions. The largest one crossing from the first delegate to the pool
# is the float output of the last conv: 2 × 128 × 28 × 28 × 4 bytes.

inputs = [plan.values[i].val.sizes for i in plan.inputs]
outputs = [plan.values[i].val.sizes for i in plan.outputs]
arena = plan.non_const_buffer_sizes[1]
print(f"inputs {inputs}, outputs {outputs}, planned arena {arena:,} bytes")
assert inputs == [list(x[0].shape)] and outputs == [[BATCH, 10]], "the exported shapes"
assert arena >= BATCH * 128 * 28 * 28 * 4, "the conv output the pool reads fits in the arena"

# %%
# Step 3 — Delegate payloads and the weights
# ------------------------------------------
# Each delegate is an id (``XnnpackBackend``) and a reference to a segment: the payload, an
# XNNPACK graph in its own FlatBuffer, which the backend compiles when the method loads. The
# weights are not in the payloads: XNNPACK stores them as **named data**, segments with a key,
# so that two methods or delegates can share one copy.

segments = [pte_bytes[header.segment_base_offset + s.offset :][: s.size] for s in program.segments]
payloads = {d.processed.index: d.id for d in plan.delegates}
named = {entry.segment_index: entry.key for entry in program.named_data}
for index, segment in enumerate(segments):
    role = payloads.get(index) or ("named data" if index in named else "constant segment")
    print(f"segment {index:2}  {len(segment):>9,} bytes  {role}")
assert all(segments[i][4:8] == b"XH00" for i in payloads), "XNNPACK payloads start with XH00"

# %%
# The largest named blobs are exactly the int8 weights of the q/dq graph (one byte per
# weight); the small ones are per-channel scales and biases. The **constant segment**, where
# portable kernels find their constants, is empty: no portable op reads a weight.

weights = sorted(t.numel() for n, t in qdq_model.named_buffers() if n.startswith("_frozen"))
named_sizes = sorted(len(segments[i]) for i in named)
print(f"int8 weights {weights}\nlargest named data {named_sizes[-len(weights) :]}")
assert named_sizes[-len(weights) :] == weights, "the weights, one byte each"
assert len(segments[program.constant_segment.segment_index]) == 0, "no portable constants"

# %%
# Step 4 — Run it on the ExecuTorch runtime
# -----------------------------------------
# ``Runtime.get().load_program(...)`` parses the file; ``load_method`` lets XNNPACK compile
# its payloads; ``execute`` runs the chain. Keep the ``Program`` in a variable for as long as
# its methods run: a ``Method`` does not keep it alive, and a method loaded from a ``Program``
# that no variable holds crashes the process when it runs. (The runtime logs what it reads
# about the CPU to stderr on first use; ``redirect_stderr`` keeps that off the page.)

with contextlib.redirect_stderr(io.StringIO()):
    program = Runtime.get().load_program(pte_bytes)
    forward = program.load_method("forward")  # a Method does not keep its Program alive: hold both
out = forward.execute([x[0]])[0]
expected = qdq_model(*x)
last_q = [n for n in qdq_model.graph.nodes if n.target == qd.quantize_per_tensor.default][-1]
step = last_q.args[1]  # the scale of the model's int8 output
steps_off = ((out - expected).abs() / step).round()
output_sqnr = sqnr(expected, out).item()
print(f"output steps apart: max {steps_off.max():.0f}, on {(steps_off > 0).float().mean():.1%}")
print(f"SQNR against the q/dq model: {output_sqnr:.1f} dB")

# %%
# The outputs are not ``torch.equal``, and should not be expected to be. XNNPACK multiplies
# int8 by int8 into an exact int32 sum and **requantizes** it to int8 in fp32: on x86 its qs8
# GEMM and conv kernels (the ``REQUANTIZATION == "FP32"`` templates) turn the sum into a
# float, multiply it by one precomputed scale per output channel (input scale × weight scale
# ÷ output scale) and round. The q/dq graph dequantizes first, sums float products (in another
# order, each rounded to fp32) and divides by the output scale. Both round once per layer, but
# not quite the same number: a value near a rounding boundary lands one step away, and one
# step in a layer moves the next layer's sums a little. A bound of two output steps and 40 dB
# holds that with margin.

assert steps_off.max() <= 2, "at most two output steps from the q/dq model"
assert output_sqnr > 40, "and far closer to it than int8 is to float"

# %%
# Step 5 — Where the numbers diverge: ETDump and the Inspector
# ------------------------------------------------------------
# The runtime on PyPI is built with its event tracer, so it can record an **ETDump**: load
# the program with ``enable_etdump=True`` and a debug buffer, run it once, write the dump.
# ``Inspector`` joins the dump with the ETRecord, runs the recorded graph in Python on the
# same inputs, and ``calculate_numeric_gap`` compares every output the runtime logged with
# its twin.

with contextlib.redirect_stderr(io.StringIO()):
    traced = Runtime.get().load_program(pte_bytes, enable_etdump=True, debug_buffer_size=1 << 21)
    traced.load_method("forward").execute([x[0]])
dump, buffer = [Path(tempfile.mkdtemp()) / name for name in ("run.etdp", "run.bin")]
traced.write_etdump_result_to_file(str(dump), str(buffer))
with warnings.catch_warnings():
    # The Inspector's own notes: kwargs it does not record, tensors it reads from bytes.
    warnings.filterwarnings("ignore", message="Unsupported kwarg encountered")
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    inspector = Inspector(
        etdump_path=str(dump), etrecord=str(etrecord_path), debug_buffer_path=str(buffer)
    )
    gaps = inspector.calculate_numeric_gap("SNR")
for _, row in gaps.iterrows():
    print(f"{' + '.join(row['runtime_ops']):52} SNR {row['gap'][0]:5.1f} dB")

# %%
# The runtime logs one output per delegate call, not per layer: inside a delegate XNNPACK
# runs its own graph, and the event tracer sees only what comes out. So the Inspector says
# *which delegate* the gap comes from. Here it is born in the first one, the four convs; the
# average pool then blurs the one-step differences of a 128 × 28 × 28 map, and the last row's
# SNR is the final output's.

first, last = gaps["gap"].iloc[0][0], gaps["gap"].iloc[-1][0]
assert list(gaps["runtime_ops"].iloc[0]) == ["DELEGATE_CALL"], "the first row: the conv delegate"
assert abs(last - output_sqnr) < 0.5, "the last row is the output against the q/dq model"

# %%
# Step 6 — Speed
# --------------
# Four ways to run float or int8 on this CPU, timed in interleaved rounds on one thread
# (XNNPACK's thread pool is set to the same count): float and the x86 int8 model, both
# compiled with freezing by ``race`` (M03-3), float eager, and the ``.pte`` on the ExecuTorch
# runtime. Like with like: the compiled pair, and eager float beside the runtime, which runs
# XNNPACK's kernels as they are. XNNPACK is written for ARM first; on x86 it picks AVX2 or
# AVX-512 kernels itself, from the CPU, and ignores ``ONEDNN_MAX_CPU_ISA`` and
# ``ATEN_CPU_CAPABILITY``: the CPU line under the table (oneDNN's int8 path) describes the
# compiled rows, not XNNPACK's.

x86_model = quantized(x86_quantizer())
timings = race(
    {LABELS["fp32 compiled"]: float_model, LABELS["x86 compiled"]: x86_model},
    x,
    also={
        LABELS["fp32 eager"]: float_model,
        LABELS["pte run"]: lambda image: forward.execute([image])[0],
    },
    also_key=digest(pte_bytes),
)
print(timings.table())
ran = timings.kernels[LABELS["x86 compiled"]]
assert ran.int8 and not ran.float, "the compiled x86 int8 model ran oneDNN int8 kernels only"

# %%
# Step 7 — Size
# -------------
# ``torch.export.save`` of the float program, of the q/dq program (int8 weights, as in M03-3)
# and the ``.pte``: the weights dominate all three.


def saved_bytes(model) -> int:
    buffer = io.BytesIO()
    lean = torch.fx.GraphModule(model, model.graph)  # only what the graph reads (M03-3)
    torch.export.save(torch.export.export(lean, x), buffer)
    return buffer.getbuffer().nbytes


sizes = {
    "fp32 saved": saved_bytes(float_model),
    "qdq saved": saved_bytes(qdq_model),
    "pte file": len(pte_bytes),
}
fig, ax = plt.subplots(figsize=(6.4, 2.4))
ax.barh(
    [LABELS[k] for k in sizes],
    [s / 1e3 for s in sizes.values()],
    color=["#94a3b8", "#2563eb", "#16a34a"],
)
ax.invert_yaxis()
ax.set_xlabel("kB")
ax.set_title("conv_net on disk")
fig.tight_layout()
for key, size in sizes.items():
    print(f"{pad(LABELS[key], 30)} {size / 1e3:8.0f} kB")
assert sizes["pte file"] < 0.3 * sizes["fp32 saved"], "a quarter, plus scales"

# %%
# Summary
# -------
# - A ``.pte`` is a FlatBuffer program (execution plans, operators, delegates) plus segments:
#   XNNPACK payloads and the weights as named data, 1 byte per int8 weight.
# - ``Runtime`` runs it from Python; its outputs are within two output steps of the q/dq
#   model: XNNPACK sums in int32 and requantizes in fp32, the q/dq graph sums in fp32.
# - An ETDump and the Inspector locate a numeric gap per delegate call, not inside one.
#
# Exercises
# ---------
# 1. How many bytes does the method's memory arena need (``plan.non_const_buffer_sizes[1]``:
#    index 0 is reserved, the planned tensors live in buffer 1), and which tensor sets it?
#    Predict from the three instructions which float tensors must be alive at the same time;
#    then find, in ``plan.values``, the planned tensor whose offset plus size is largest.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          import math
#
#          from executorch.exir.scalar_type import ScalarType
#
#          planned = {
#              index: value.val
#              for index, value in enumerate(plan.values)
#              if getattr(value.val, "allocation_info", None) is not None
#          }
#          assert all(t.scalar_type == ScalarType.FLOAT for t in planned.values()), "float32 only"
#          offset = {index: t.allocation_info.memory_offset_low for index, t in planned.items()}
#          end = {index: offset[index] + 4 * math.prod(t.sizes) for index, t in planned.items()}
#          for index, t in planned.items():
#              print(f"value {index}: {t.sizes} at {offset[index]:,}, ends at {end[index]:,}")
#          last = max(end, key=end.get)
#          pool = plan.chains[0].instructions[1].instr_args  # the KernelCall between the delegates
#          arena = plan.non_const_buffer_sizes[1]
#          print(f"largest end {end[last]:,} bytes, arena {arena:,} bytes")
#          assert last == pool.args[-1], "the pool's output, placed after the conv output it reads"
#          assert end[last] == 4 * BATCH * 128 * (28 * 28 + 7 * 7), "both float maps side by side"
#          assert arena == end[last] + 64, "plus the 64 bytes memory planning adds for XNNPACK"
#          # The image is dead once the first delegate has run: the pool's output takes its bytes.
#          assert offset[pool.args[-1]] == offset[plan.inputs[0]], "where the image was"
#
# 2. Predict what share of the ``.pte`` the int8 weights take.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          share = sum(weights) / len(pte_bytes)
#          print(f"{share:.1%}")
#          assert share > 0.95, "a few kB of program, payloads, scales and biases besides"
#
# 3. Run ``forward`` on a batch of three images. Predict: does the runtime accept it?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#
#          with expect_error(RuntimeError), contextlib.redirect_stderr(io.StringIO()):
#              forward.execute([example_inputs(3, shape=SHAPE)[0]])
#          # The shapes were fixed at export and the arena planned for them: export with
#          # dynamic_shapes to accept other batch sizes.
#
# Further reading
# ---------------
# - `ExecuTorch: Runtime Python API
#   <https://docs.pytorch.org/executorch/stable/runtime-python-api-reference.html>`_
# - `ExecuTorch: Inspector APIs
#   <https://docs.pytorch.org/executorch/stable/model-inspector.html>`_
#
# Next
# ----
# :ref:`M06-4 · Shapes that change <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`
# lets the batch size vary up to a bound and follows that bound to the ``.pte``;
# :ref:`M04-1 · Measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# is the float-versus-int8 side of the numbers.
