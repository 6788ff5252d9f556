"""
M06-5 int8 in, int8 out
=======================

A quantized ``.pte`` still takes float and returns float: its first op quantizes the input and
its last one dequantizes the output. A microcontroller whose sensor gives integers, or a camera
pipeline that already holds int8, wants neither. ExecuTorch's ``quantize_input`` and
``quantize_output`` remove the two ops, and return the scale and zero point that the caller now
applies itself. This lesson makes such a ``.pte`` (**int8 I/O**), runs it, and reproduces the
mistakes its users report: reading the int8 output as the value, feeding it float, feeding it
int8 without the input's scale.

**What you will learn**

- How ``quantize_input`` / ``quantize_output`` make a program's input and output int8, and why
  they run before the partitioner
- How to feed and read an int8 ``.pte``: quantize with the input's scale and zero point,
  dequantize with the output's
- What the wrong readings look like on the runtime, and the one line that fixes each

**Prerequisites**:
:ref:`M01-2 · q/dq nodes and their numbers
<sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`,
:ref:`M06-3 · The .pte, inside out <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``small_cnn`` (conv, batch norm, ReLU, max-pool and a linear to 10 classes, on 3 × 16 × 16
# images), quantized with ``XNNPACKQuantizer`` (static int8 activations) and calibrated on four
# batches.

import contextlib
import io

import torch

from common.expect import expect_error
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.passes.quantize_io_pass import QuantizeInputs, quantize_input, quantize_output
from executorch.exir.scalar_type import ScalarType
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import xnnpack_quantizer
from common.runtime import operators_run

qd = torch.ops.quantized_decomposed
BATCH, SHAPE = 2, input_shape("small_cnn")
x = example_inputs(BATCH, shape=SHAPE)
prepared = prepare_pt2e(export_module(get_model("small_cnn"), x), xnnpack_quantizer())
with torch.no_grad():
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=SHAPE))
qdq_model = convert_pt2e(prepared)

# %%
# Two helpers: ``loaded`` loads a ``.pte`` on the ExecuTorch runtime and returns the
# ``Program`` with its ``forward`` (hold both: a method does not keep its program alive,
# M06-3); ``io_types`` reads the data types of the method's input and output from its
# ``MethodMeta``, by the runtime's names (``Float`` is float32, ``Char`` is int8).


def loaded(pte: bytes):
    with contextlib.redirect_stderr(io.StringIO()):  # the runtime's CPU-info log (M06-3)
        program = Runtime.get().load_program(pte)
        return program, program.load_method("forward")


def io_types(program) -> tuple[str, str]:
    meta = program.metadata("forward")
    types = (meta.input_tensor_meta(0).dtype(), meta.output_tensor_meta(0).dtype())
    return tuple(ScalarType(t).name.capitalize() for t in types)


# %%
# Step 1 — The float edges of a quantized program
# -----------------------------------------------
# Export the converted model again, as every lowering starts. The image ``x`` has one user,
# a ``quantize_per_tensor`` with the input's scale and zero point; the program returns a
# ``dequantize_per_tensor`` with the output's (highlighted). Everything between runs on int8;
# these two ops are the float edges.

program = torch.export.export(qdq_model, x)
graph = program.graph_module.graph
image = next(n for n in graph.nodes if n.op == "placeholder" and n.name == "x")
q_in, dq_out = next(iter(image.users)), graph.output_node().args[0][0]
print(f"input:  {q_in.name}{tuple(q_in.args[1:])}")
print(f"output: {dq_out.name}{tuple(dq_out.args[1:])}")
assert q_in.target == qd.quantize_per_tensor.default, "the image is quantized first"
assert dq_out.target == qd.dequantize_per_tensor.default, "the output is dequantized last"
draw(program.graph_module, highlight=[q_in.name, dq_out.name], title="small_cnn: float edges")

# %%
# Lowered as it is (M06-2, M06-3), this program gives the **float I/O** ``.pte``: the
# reference for the rest of the lesson. ``XnnpackPartitioner`` takes the whole graph, the two
# float edges included: the top-level graph that is left reads ``x`` into one delegate call.
# ExecuTorch's ``QuantizeInputs`` pass, which looks for the input's quantize in that top-level
# graph, finds the delegate instead: after lowering it is too late.

edge = to_edge_transform_and_lower(
    torch.export.export(qdq_model, x), partitioner=[XnnpackPartitioner()]
)
with expect_error(Exception, match="'QuantizeInputs' pass") as caught:
    edge.transform([QuantizeInputs(edge, [0])])
print(f"  caused by {type(caught.error.__cause__).__name__}: {caught.error.__cause__}")
assert "executorch_call_delegate" in str(caught.error.__cause__), "the q is in the delegate"
float_pte = edge.to_executorch().buffer

# %%
# Step 2 — Remove them before lowering
# ------------------------------------
# ``quantize_input(program, 0)`` and ``quantize_output(program, 0)`` are the functions the
# ``QuantizeInputs`` and ``QuantizeOutputs`` passes call, and they take an exported program
# too, before any partitioner. Each edits the graph in place and returns the removed op's
# arguments: ``(scale, zero_point, quant_min, quant_max, dtype)``, what the caller needs to do
# that op's job itself. After both, the quantize and the dequantize are gone: ``x``, now an
# int8 input, feeds the first dequantize, and the program returns the last quantize's int8
# (highlighted).

input_qparams = quantize_input(program, 0)
output_qparams = quantize_output(program, 0)
print(f"quantize_input  -> {input_qparams}\nquantize_output -> {output_qparams}")
assert input_qparams == tuple(q_in.args[1:]), "the removed quantize's own arguments"
assert output_qparams == tuple(dq_out.args[1:]), "the removed dequantize's own arguments"
dq_in, q_out = next(iter(image.users)), graph.output_node().args[0][0]
assert dq_in.target == qd.dequantize_per_tensor.default, "x feeds a dequantize"
assert q_out.target == qd.quantize_per_tensor.default, "the program returns a quantize"
assert image.meta["val"].dtype == torch.int8, "x is now an int8 input"
draw(program.graph_module, highlight=[dq_in.name, q_out.name], title="small_cnn: int8 I/O")

# %%
# Step 3 — Lower it: int8 I/O
# ---------------------------
# The edited program lowers as any other. The ``.pte``'s own metadata says what it takes and
# returns: ``Char`` (int8) where the float I/O ``.pte`` says ``Float``. The input now needs a
# quarter of the bytes, which counts where the caller's buffer is the microcontroller's RAM.

int8_pte = (
    to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
)
float_program, float_forward = loaded(float_pte)
int8_program, int8_forward = loaded(int8_pte)
input_bytes = []
for name, loaded_program in (("float I/O", float_program), ("int8 I/O", int8_program)):
    kinds = io_types(loaded_program)
    input_bytes.append(loaded_program.metadata("forward").input_tensor_meta(0).nbytes())
    print(f"{name}: input {kinds[0]} ({input_bytes[-1]:,} bytes), output {kinds[1]}")
assert io_types(float_program) == ("Float", "Float"), "float in, float out"
assert io_types(int8_program) == ("Char", "Char"), "int8 in, int8 out"
assert input_bytes[1] * 4 == input_bytes[0], "the int8 input: a quarter of the bytes"

# %%
# The same int8 kernels run in both; what the int8 I/O ``.pte`` no longer runs are the two
# ``Convert (NC)`` operators (``operators_run``, M06-4): XNNPACK's quantize of the float input
# and dequantize of the float output.

x_int8 = qd.quantize_per_tensor.default(x[0], *input_qparams)
ran_float, ran_int8 = operators_run(float_pte, [x[0]]), operators_run(int8_pte, [x_int8])
print(f"float I/O:\n{ran_float.summary}\n\nint8 I/O:\n{ran_int8.summary}")
assert ran_float.conversions == {"Convert (NC)": 2}, "float I/O: the input's q, the output's dq"
assert not ran_int8.conversions, "int8 I/O: no conversion left"
assert ran_int8.int8 == ran_float.int8, "the same int8 operators in both"

# %%
# Step 4 — Run it: quantize in, dequantize out
# --------------------------------------------
# The caller does the two removed ops. ``input_qparams`` are exactly the quantize op's
# arguments, so ``quantize_per_tensor(x, *input_qparams)`` is the input (on a microcontroller:
# ``q = clamp(round(x / scale) + zero_point, -128, 127)``), and the output comes back to float
# as ``(q − zero_point) × scale``. The result matches the float I/O ``.pte`` within one step of
# the output's scale.

out_int8 = int8_forward.execute([x_int8])[0]
value = qd.dequantize_per_tensor.default(out_int8, *output_qparams)
expected = float_forward.execute([x[0]])[0]
out_scale, out_zero_point = output_qparams[:2]
steps = ((value - expected).abs() / out_scale).round()
print(f"output {out_int8.dtype}, at most {steps.max():.0f} steps from the float I/O .pte")
print(f"identical: {torch.equal(value, expected)}")
torch.testing.assert_close(value, expected, atol=out_scale, rtol=0)  # one output step

# %%
# Step 5 — The wrong reading: the int8 is not the value
# -----------------------------------------------------
# The report in pytorch/executorch#16244: a model that printed 2.0 printed 1 once its output
# was int8. What a program with int8 I/O returns is a code, not the value: read as a number it
# means nothing, and the output's zero point and scale turn it into the value.

print(f"raw int8:     {out_int8[0].tolist()}")
print(f"dequantized:  {[round(v, 3) for v in value[0].tolist()]}")
print(f"({out_int8[0, 0]} - {out_zero_point}) × {out_scale:.5f} = {value[0, 0]:.4f}")
assert not torch.allclose(out_int8.float(), expected, atol=1), "the raw int8 is not the value"
assert torch.equal((out_int8.float() - out_zero_point) * out_scale, value), "(q − zp) × scale"

# %%
# A half fix, multiplying by the scale alone, puts every value the same number of steps off:
# the zero point.

no_zero_point = out_int8.float() * out_scale
offsets = ((no_zero_point - value) / out_scale).round().int().unique()
print(f"q × scale is off by {offsets.tolist()} steps (zero point {out_zero_point})")
assert offsets.tolist() == [out_zero_point], "off by the zero point, everywhere"

# %%
# Step 6 — Feeding it wrong
# -------------------------
# Float into the int8 ``.pte``: the runtime refuses the input before running anything. The
# Python error says only ``error 0x12`` (``InvalidArgument``); the runtime's log says why.

with contextlib.redirect_stderr(io.StringIO()) as log, expect_error(RuntimeError, match="0x12"):
    int8_forward.execute([x[0]])
reason = next(line for line in log.getvalue().splitlines() if "Input 0" in line)
print(f"  runtime log: {reason}")
assert "expected Char but was Float" in reason, "the runtime checks the input's data type"

# %%
# int8 without the input's scale and zero point runs, and is wrong. ``x.to(torch.int8)``
# truncates the image to the integers -3 to 3, where the model expects ``x / scale + zp``: a
# range of a few steps instead of about 250. Nothing fails; the output is far from the value.

cast = x[0].to(torch.int8)
wrong = qd.dequantize_per_tensor.default(int8_forward.execute([cast])[0], *output_qparams)
wrong_steps = ((wrong - expected).abs() / out_scale).round()
print(f"cast input {cast.min()}..{cast.max()}, quantized input {x_int8.min()}..{x_int8.max()}")
print(f"output up to {wrong_steps.max():.0f} steps from the float I/O .pte")
assert wrong_steps.max() > 10, "a cast is not a quantize: far from the value"

# %%
# Summary
# -------
# - A quantized ``.pte`` is float at its edges: a quantize after the input, a dequantize before
#   the output. ``quantize_input`` / ``quantize_output`` remove them from the exported program
#   *before* lowering (after it, the ``QuantizeInputs`` pass finds a delegate call) and return
#   ``(scale, zero_point, quant_min, quant_max, dtype)``.
# - The int8 I/O ``.pte`` says ``Char`` in its metadata, runs no ``Convert`` and matches the
#   float I/O ``.pte`` within one output step, when the caller quantizes the input with the
#   input's parameters and dequantizes the output with the output's.
# - Its output is an int8 code: ``(q − zero_point) × scale`` is the value. Float input is
#   refused (``expected Char but was Float``); a cast instead of a quantize runs, and is wrong.
#
# Exercises
# ---------
# 1. Remove only the output's dequantize. Predict the program's input and output types and how
#    many ``Convert (NC)`` XNNPACK runs.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          half = torch.export.export(qdq_model, x)
#          quantize_output(half, 0)
#          half_pte = to_edge_transform_and_lower(
#              half, partitioner=[XnnpackPartitioner()]
#          ).to_executorch().buffer
#          half_program, _ = loaded(half_pte)
#          print(io_types(half_program))
#          assert io_types(half_program) == ("Float", "Char"), "float in, int8 out"
#          ran = operators_run(half_pte, [x[0]])
#          assert ran.conversions == {"Convert (NC)": 1}, "only the input's quantize"
#
# 2. A C++ caller cannot import the scale from Python. Store the four numbers in the ``.pte``
#    as constant methods (``constant_methods=``, named as ``QuantizeInputs`` names them with
#    ``get_config_method_name``). Predict the methods the ``.pte`` then has and what
#    ``forward_output0_zp`` returns.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from executorch.exir.passes.quantize_io_pass import get_config_method_name
#
#          again = torch.export.export(qdq_model, x)
#          found = {"input": quantize_input(again, 0), "output": quantize_output(again, 0)}
#          constants = {
#              get_config_method_name("forward", side, 0, key): found[side][i]
#              for side in found
#              for i, key in enumerate(["scale", "zp"])
#          }
#          kept_pte = to_edge_transform_and_lower(
#              again, partitioner=[XnnpackPartitioner()], constant_methods=constants
#          ).to_executorch().buffer
#          kept_program, _ = loaded(kept_pte)
#          print(sorted(kept_program.method_names))
#          assert kept_program.method_names == {"forward", *constants}, "forward and four numbers"
#          zp = kept_program.load_method("forward_output0_zp").execute([])[0]
#          assert zp == out_zero_point, "the output's zero point, read from the .pte"
#
# 3. A classifier reads only the class with the largest output. Predict: does the raw int8
#    output give the same classes as the dequantized one? Does its softmax give the same
#    probabilities?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          assert torch.equal(out_int8.argmax(1), value.argmax(1)), "scale > 0 keeps the order"
#          raw_p, p = out_int8.float().softmax(1), value.softmax(1)
#          print(f"largest probability: raw {raw_p.max():.3f}, dequantized {p.max():.3f}")
#          assert not torch.allclose(raw_p, p, atol=0.01), "softmax needs the values"
#
# Further reading
# ---------------
# - `ExecuTorch: Runtime Python API
#   <https://docs.pytorch.org/executorch/stable/runtime-python-api-reference.html>`_
# - `pytorch/executorch#4729: Add support for int8 input/output
#   <https://github.com/pytorch/executorch/issues/4729>`_, the request that led to these
#   functions, from microcontroller users
#
# Next
# ----
# The errors ExecuTorch users report most are on
# :ref:`Troubleshooting: ExecuTorch and XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`.
