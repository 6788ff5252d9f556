"""
M03-5 PT2E to ONNX Runtime
==========================

A PT2E int8 model is not tied to PyTorch's kernels. ``torch.onnx.export(..., dynamo=True)``
writes the converted model as an ONNX graph in the **QDQ format**: each quantize node becomes a
``QuantizeLinear``, each dequantize node a ``DequantizeLinear``, and the float ops between
them stay as they are. ONNX Runtime then does what lowering does in PyTorch: when it loads the
graph, it fuses each ``DequantizeLinear → Conv → QuantizeLinear`` group into one int8 kernel.
This lesson exports ``conv_net``, runs it on ONNX Runtime's CPU provider, reads the int8
kernels it ran from its profile, writes the exporter a translation for the ops it refuses,
and times ONNX Runtime against PyTorch's compiled int8.

**What you will learn**

- Exporting a converted model as a QDQ ONNX graph, and what ONNX Runtime fuses it into
- Reading the kernels a session ran from ONNX Runtime's profile
- Writing the exporter a translation for a q/dq op it has none for

**Prerequisites**:
:ref:`M03-1 · the lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`
(q/dq groups become int8 ops), :ref:`M03-3 · speed and size
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>` (``race``),
:ref:`M05-2 · static vs dynamic int8 <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`
(``choose_qparams``). It needs ``onnx``, ``onnxscript`` and ``onnxruntime``.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``conv_net`` from the zoo, quantized with ``X86InductorQuantizer``'s defaults and calibrated
# on four batches, as in M03-3. Why the x86 quantizer and not XNNPACK's: its scheme is the one
# ONNX Runtime's x86 int8 kernels are written for — uint8 activations with a zero point, int8
# weights per output channel ("U8S8") — and it keeps ExecuTorch out of this lesson. XNNPACK's
# symmetric int8 activations export the same way.

import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from common.cpu import describe
from common.digest import digest
from common.expect import expect_error
from common.models import example_inputs, get_model, input_shape
from common.onnx_runtime import kernels_ran, onnx_export, runner, session
from common.pt2e import export_module, op_counts, quiet, x86_quantizer
from common.timing import race
from common.viz import draw

quiet()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

BATCH = 8
shape = input_shape("conv_net")
x = example_inputs(BATCH, shape=shape)
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=shape))
int8_model = convert_pt2e(prepared)
folder = Path(tempfile.mkdtemp())  # where this lesson writes its files
qdq = [n.name for n in int8_model.graph.nodes if "quantize_per" in str(n.target)]
draw(int8_model, highlight=qdq, title="conv_net after convert: the q/dq graph to export")

# %%
# Step 1 — Export the q/dq model to ONNX
# --------------------------------------
# ``onnx_export`` calls ``torch.onnx.export(model, args, dynamo=True)`` (the exporter that
# starts from ``torch.export``) and keeps its progress lines off the page. The exporter
# translates each ATen op through a table of ONNX functions (onnxscript's ``torch_lib``).
# For PT2E's q/dq ops that table was long incomplete: ``dequantize_per_channel``, the
# weights' dequantize, had no entry, and the export stopped on it (pytorch/pytorch#143954).
# microsoft/onnxscript#2389 asked for it, and the onnxscript pinned here (0.7.2) has it: the
# static model exports whole. Every q/dq node of the graph becomes one ONNX node, the
# per-channel ones with ``axis=0`` (one scale per output channel).

program = onnx_export(int8_model, x)
onnx_path = folder / "conv_net_int8.onnx"
program.save(onnx_path)
model = onnx.load(onnx_path)
ops = [node.op_type for node in model.graph.node]
print({op: ops.count(op) for op in dict.fromkeys(ops)})
counts = op_counts(int8_model)
assert ops.count("QuantizeLinear") == counts["quantize_per_tensor.default"], "one Q per quantize"
dequantize = counts["dequantize_per_tensor.default"] + counts["dequantize_per_channel.default"]
assert ops.count("DequantizeLinear") == dequantize, "one DQ per dequantize"

# %%
# The weights are int8 initializers of the ONNX file, read by a ``DequantizeLinear`` with one
# scale per output channel; the activations' scales are scalars.

per_channel = [
    n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.attribute[0].i == 0
]
weights = {i.name: i for i in model.graph.initializer}
for node in per_channel[:2]:
    weight, scale = weights[node.input[0]], weights[node.input[1]]
    dtype = onnx.TensorProto.DataType.Name(weight.data_type)
    print(f"{node.name}: {dtype} {list(weight.dims)}, {scale.dims[0]} scales, axis=0")
assert len(per_channel) == counts["dequantize_per_channel.default"] == 6, "4 convs, 2 linears"

# %%
# Step 2 — Run it on ONNX Runtime
# -------------------------------
# ``session`` opens the file on the CPU provider with the course's thread count. Its outputs
# are compared with the q/dq model's on new images. The two do not compute alike: ONNX
# Runtime adds int8 × int8 products in int32 and requantizes, the q/dq model runs float
# convs on dequantized values, so a value close to a rounding boundary can land one step
# apart. On a CPU with VNNI the logits stay within one int8 step of their range (range / 255).
# Without VNNI, ONNX Runtime's u8 × s8 kernels add pairs of products in 16 bits, which can
# saturate (ONNX Runtime's quantization guide says so, and suggests ``reduce_range``; oneDNN
# has the same limit, M03-1): there the difference is printed, not asserted.

images = example_inputs(BATCH, seed=7, shape=shape)
onnx_int8 = runner(session(onnx_path))
with torch.no_grad():
    reference = int8_model(*images)
difference = (onnx_int8(*images) - reference).abs().max().item()
step = ((reference.max() - reference.min()) / 255).item()
print(f"largest difference {difference:.2e}, one step of the logits {step:.2e}")
if describe().vnni:
    assert difference <= step, "ONNX Runtime within one int8 step of the q/dq model"
else:
    print(f"no VNNI: {difference / step:.2f} steps, not asserted (16-bit pair sums)")

# %%
# Which kernels ran? ONNX Runtime writes a profile when the session asks for one
# (``SessionOptions.enable_profiling``): a JSON list of events, one per node per call, each
# naming the kernel (``op_name``) and the provider. ``kernels_ran`` reads it. With graph
# optimizations off, the file runs as written: float ``Conv`` and ``Gemm`` between Q and DQ
# nodes, the same simulation as the q/dq model.

as_written = kernels_ran(onnx_path, images, optimization="none")
print(dict(as_written))
assert as_written["Conv"] == 4 and "QLinearConv" not in as_written, "float convs, as written"

# %%
# With ONNX Runtime's default level, its QDQ fusions rewrite the graph when the session is
# created: each ``DQ → Conv → (Relu) → Q`` group becomes a ``QLinearConv`` (the ReLU goes:
# the output's zero point and clamp do its work), the average pool a ``QLinearAveragePool``,
# and the first linear a ``QGemm``. Its layout pass also moves the int8 convs to
# channels-last (the two ``Transpose``). The last linear, whose output stays float (the
# quantizer puts no quantize after it), is left as written: a float ``Gemm`` on dequantized
# values.

optimized = kernels_ran(onnx_path, images)
print(dict(optimized))
assert optimized["QLinearConv"] == 4 and "Conv" not in optimized, "the four convs run int8"
assert optimized["QGemm"] == 1 and optimized["Gemm"] == 1, "one int8 linear, one float"

# %%
# Step 3 — A q/dq op the exporter refuses
# ---------------------------------------
# A dynamic int8 model (M05-2) computes its activations' scale and zero point at run time:
# its graph holds ``choose_qparams.tensor``, and ``quantize_per_tensor.tensor`` takes the
# scale as a tensor. onnxscript has no translation of the first one, and the export stops on
# it, with the error of pytorch/pytorch#143954 for another op. (``onnx_export`` raises the
# error at the bottom of the exporter's chain: ``torch.onnx.export`` wraps it.)

from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

dynamic_config = get_default_x86_inductor_quantization_config(is_dynamic=True)
prepared = prepare_pt2e(
    export_module(get_model("conv_net"), x), X86InductorQuantizer().set_global(dynamic_config)
)
with torch.no_grad():
    prepared(*x)  # the weights' observers
dynamic_int8 = convert_pt2e(prepared)
print({op: n for op, n in op_counts(dynamic_int8).items() if "quantize" in op or "qparams" in op})
refused = "No ONNX function found for <OpOverload(op='quantized_decomposed.choose_qparams'"
with expect_error(torch.onnx.errors.OnnxExporterError, match=refused):
    onnx_export(dynamic_int8, x)

# %%
# ``custom_translation_table`` maps a torch op to a Python function that writes its ONNX
# nodes with onnxscript's ``opset20``. ONNX has the op: ``DynamicQuantizeLinear`` computes
# uint8 qparams from the tensor's min and max (widened to include 0) as
# ``choose_qparams.tensor`` does for the x86 quantizer's 0…255 range. Its scale and zero
# point are cast to the types PyTorch's graph declares (float64, int64). The tensor
# overloads of quantize and dequantize need a translation too: onnxscript's reads the zero
# point as a Python number, not a tensor.

from onnxscript import opset20 as op
from onnxscript.ir import DataType

qd = torch.ops.quantized_decomposed


def choose_qparams(x, quant_min: int, quant_max: int, eps: float, dtype: int):
    """choose_qparams.tensor → DynamicQuantizeLinear's scale and zero point (uint8)."""
    _, scale, zero_point = op.DynamicQuantizeLinear(x)
    return op.Cast(scale, to=DataType.DOUBLE), op.Cast(zero_point, to=DataType.INT64)


def quantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
    """quantize_per_tensor.tensor → QuantizeLinear, qparams cast to ONNX's types."""
    return op.QuantizeLinear(x, op.Cast(scale, to=DataType.FLOAT), op.Cast(zero_point, to=dtype))


def dequantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype=-1):
    """dequantize_per_tensor.tensor → DequantizeLinear."""
    scale = op.Cast(scale, to=DataType.FLOAT)
    return op.DequantizeLinear(x, scale, op.Cast(zero_point, to=dtype))


translations = {
    qd.choose_qparams.tensor: choose_qparams,
    qd.quantize_per_tensor.tensor: quantize,
    qd.dequantize_per_tensor.tensor: dequantize,
}
dynamic_path = folder / "conv_net_dynamic.onnx"
onnx_export(dynamic_int8, x, translations=translations).save(dynamic_path)
dynamic_ops = [node.op_type for node in onnx.load(dynamic_path).graph.node]
print({op: dynamic_ops.count(op) for op in dict.fromkeys(dynamic_ops)})
choose = op_counts(dynamic_int8)["choose_qparams.tensor"]
assert dynamic_ops.count("DynamicQuantizeLinear") == choose, "one per choose_qparams"

# %%
# It runs, and computes what the q/dq model computes. But the profile shows what ONNX
# Runtime made of it: float convs. Its QDQ fusions look for a scale and zero point that are
# constants of the graph; here they are computed at run time, so no group fuses and the
# dynamic model runs as a simulation, plus the cost of the min/max pass. For dynamic int8,
# ONNX Runtime has other ops (``ConvInteger``, ``MatMulInteger``, written by its own
# ``quantize_dynamic``), which a QDQ graph does not contain.

with torch.no_grad():
    dynamic_reference = dynamic_int8(*images)
dynamic_out = runner(session(dynamic_path))(*images)
dynamic_difference = (dynamic_out - dynamic_reference).abs().max().item()
print(f"largest difference {dynamic_difference:.2e}")
assert dynamic_difference <= step, "the translation computes what the q/dq model computes"
dynamic_ran = kernels_ran(dynamic_path, images)
print(dict(dynamic_ran))
assert "QLinearConv" not in dynamic_ran and "ConvInteger" not in dynamic_ran, "no int8 conv"

# %%
# Step 4 — Time ONNX Runtime against PyTorch's compiled int8
# ----------------------------------------------------------
# The same static int8 model, two runtimes on the same CPU: ``race`` compiles the q/dq model
# with freezing (M03-3) and times it in the same interleaved rounds as the ONNX Runtime
# session, on the same thread count. ONNX Runtime's int8 kernels (its MLAS library) and
# oneDNN's use VNNI where the CPU has it; without it both multiply u8 × s8 pairs with
# ``vpmaddubsw``, which adds two products in 16 bits and can saturate (``reduce_range``,
# M04-2). The numbers are this CPU's, under this load: printed, never asserted.

print(describe().verdict)
raced = race(
    {"PyTorch int8 (compiled)": int8_model},
    images,
    also={"ONNX Runtime int8": onnx_int8},
    also_key=digest(onnx_path, "onnxruntime"),
)
print(raced.table())

# %%
# Summary
# -------
#
# ============================  ==============================  ==========================
# the q/dq op                   in the ONNX graph               what ONNX Runtime runs
# ============================  ==============================  ==========================
# ``quantize_per_tensor``       ``QuantizeLinear``              fused: ``QLinearConv``,
# ``dequantize_per_tensor``     ``DequantizeLinear``            ``QGemm``,
# ``dequantize_per_channel``    ``DequantizeLinear`` (axis 0)   ``QLinearAveragePool``
# ``choose_qparams.tensor``     refused; translated:            float ``Conv`` between
#                               ``DynamicQuantizeLinear``       run-time Q/DQ
# ============================  ==============================  ==========================
#
# - ``torch.onnx.export(..., dynamo=True)`` writes a static PT2E model as a QDQ graph;
#   ONNX Runtime fuses its groups into int8 kernels when the session is created.
# - The profile (``enable_profiling``) says what ran; the file says only what was asked.
# - ``custom_translation_table`` gives the exporter an op it lacks, in a few lines of
#   onnxscript; whether the result runs int8 is ONNX Runtime's decision, read in its profile.
#
# Exercises
# ---------
# 1. Open the static model's session at ONNX Runtime's ``"basic"`` level. Predict which
#    kernels run: are the QDQ fusions basic optimizations?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          basic = kernels_ran(onnx_path, images, optimization="basic")
#          print(dict(basic))
#          # Basic optimizations fold constants and remove redundant nodes; the QDQ fusions
#          # are "extended" ones: the convs still run float.
#          assert basic["Conv"] == 4 and "QLinearConv" not in basic
#          extended = kernels_ran(onnx_path, images, optimization="extended")
#          assert extended["QLinearConv"] == 4
#
# 2. Convert with ``fold_quantize=False`` (M01-2): the weights stay float in the graph, each
#    behind a ``quantize_per_channel``. Predict the ONNX file's size, and whether ONNX Runtime
#    still runs int8 convs.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
#          with torch.no_grad():
#              for seed in range(4):
#                  prepared(*example_inputs(BATCH, seed=seed, shape=shape))
#          unfolded_path = folder / "conv_net_unfolded.onnx"
#          onnx_export(convert_pt2e(prepared, fold_quantize=False), x).save(unfolded_path)
#          print(f"{unfolded_path.stat().st_size / onnx_path.stat().st_size:.1f}× the size")
#          assert unfolded_path.stat().st_size > 3 * onnx_path.stat().st_size, "float weights"
#          # The session folds the constant Q (+ Clip) of each weight into an int8 constant:
#          # the same fused kernels run.
#          assert kernels_ran(unfolded_path, images) == optimized
#
# Further reading
# ---------------
# - `torch.onnx: the dynamo-based exporter and custom_translation_table
#   <https://docs.pytorch.org/docs/stable/onnx_export.html>`_
# - `ONNX Runtime: quantizing models (QDQ format, U8S8 and S8S8)
#   <https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html>`_
# - `ONNX Runtime: profiling tools
#   <https://onnxruntime.ai/docs/performance/tune-performance/profiling-tools.html>`_
#
# Next
# ----
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`:
# is the int8 model still accurate?
