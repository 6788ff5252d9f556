"""
M01-2 q/dq nodes and their numbers
==================================

A converted graph stores its quantization in plain sight. A per-tensor quantize/dequantize
node carries its scale, zero point, range and dtype as Python constants in ``args``; a
per-channel one reads its scales and zero points from buffers through ``get_attr`` nodes.
The ops themselves are one line of arithmetic each. This lesson reads every number out of
the graph ``convert_pt2e`` produced for ``small_cnn`` and recomputes every quantize and
dequantize by hand, bit for bit.

**What you will learn**

- Where a q/dq node keeps its scale, zero point, range and dtype, per tensor and per channel
- The exact arithmetic of ``quantize_per_tensor``, ``dequantize_per_tensor`` and their
  per-channel twins, and why the order of operations matters
- What the int8 weight constant left by ``fold_quantize=True`` is, and what a round trip loses

**Prerequisites**:
:ref:`M01-1 · the PT2E flow <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# Setup
# -----
# The flow of M01-1 in five lines: export, prepare, calibrate, then convert twice, with and
# without ``fold_quantize``. ``Q`` is the namespace of the q/dq ops; torchao registers it
# when its PT2E modules are imported.

import copy

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
x = example_inputs(8)
prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
calibrate(prepared)
converted = convert_pt2e(copy.deepcopy(prepared))
unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)

# %%
# Two small helpers find nodes.

from common.pt2e import node_named


def nodes_calling(gm, op):
    """The call_function nodes of ``gm`` whose target is ``op``, in graph order."""
    return [node for node in gm.graph.nodes if node.op == "call_function" and node.target == op]


# %%
# Step 1 — Find the q/dq nodes
# ----------------------------
# A q/dq node is a ``call_function`` whose target is one of the ``quantized_decomposed`` ops.
# Every ``quantize_per_tensor`` is read by exactly one ``dequantize_per_tensor``, and the pair
# shares the same numbers: ``args[1:]`` are equal.

quantizes = nodes_calling(converted, Q.quantize_per_tensor.default)
dequantizes = nodes_calling(converted, Q.dequantize_per_tensor.default)
for q in quantizes:
    (dq,) = q.users
    print(f"{q.args[0].name:>10} → {q.name} → {dq.name}")
    assert dq.target == Q.dequantize_per_tensor.default, "a quantize is read by a dequantize"
    assert dq.args[1:] == q.args[1:], "with the same numbers"
assert len(dequantizes) == len(quantizes), "each quantize has its dequantize"
draw(
    converted, highlight=[n.name for n in quantizes + dequantizes], title="Step 1: per-tensor q/dq"
)

# %%
# Step 2 — Per-tensor numbers are Python constants
# ------------------------------------------------
# ``quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype)``: after the
# input node come five plain Python values, not nodes. Activations are ``uint8`` over the
# type's whole range, 0..255.

for q in quantizes:
    _, scale, zero_point, quant_min, quant_max, dtype = q.args
    print(f"{q.name:<30} {scale!r:<22} {zero_point:>4}  {quant_min}..{quant_max}  {dtype}")
    assert isinstance(scale, float) and isinstance(zero_point, int), "Python numbers"
    assert dtype == torch.uint8, "activations are uint8"
    assert (quant_min, quant_max) == (0, torch.iinfo(dtype).max), "over the whole range, 0..255"

# %%
# Where do the numbers come from? From the observer that sat on the same edge in the
# prepared graph: ``convert_pt2e`` calls its ``calculate_qparams()`` (M01-3) and turns the
# float32 scale into a Python float. So every scale in the graph is a float32 number, even
# though Python stores it as a double: turning it into a float32 tensor and back loses nothing.

observer_on = {
    node.args[0].name: prepared.get_submodule(node.target)
    for node in prepared.graph.nodes
    if node.op == "call_module" and node.target.startswith("activation_post_process")
}
for q in quantizes:
    scale_t, zero_point_t = observer_on[q.args[0].name].calculate_qparams()
    assert q.args[1] == float(scale_t) and q.args[2] == int(zero_point_t), "the observer's qparams"
    assert scale_t.dtype == torch.float32, "computed in float32"
    assert torch.tensor(q.args[1]).item() == q.args[1], "and exactly a float32 value"
scale_t, zero_point_t = observer_on["x"].calculate_qparams()
print(f"observer on x: scale={scale_t}, zero_point={zero_point_t}")

# %%
# Step 3 — Per-channel numbers are buffers
# ----------------------------------------
# Weights are quantized per output channel: one scale and one zero point per channel, too many
# for Python constants. ``dequantize_per_channel(input, scales, zero_points, axis, quant_min,
# quant_max, dtype)`` reads them from buffers through ``get_attr`` nodes (drawn inside its
# label as ‹name›); ``axis`` says which dimension is the channel.

weight_dqs = nodes_calling(converted, Q.dequantize_per_channel.default)
draw(converted, highlight=[n.name for n in weight_dqs], title="Step 3: per-channel dequantize")

# %%
# The x86 quantizer quantizes weights to ``int8`` over -128..127, symmetric: every zero point
# is 0. The scales are ``float32``, the zero points ``int64``, one per output channel.

for dq in weight_dqs:
    int8_weight, scales, zero_points, axis, quant_min, quant_max, dtype = dq.args
    assert {int8_weight.op, scales.op, zero_points.op} == {"get_attr"}, "three get_attr nodes"
    s, z = getattr(converted, scales.target), getattr(converted, zero_points.target)
    w = getattr(converted, int8_weight.target)
    print(f"{dq.name}  axis={axis}  {quant_min}..{quant_max}  {dtype}")
    print(f"    ‹{scales.target}› {s.dtype} {tuple(s.shape)}  ‹{zero_points.target}› {z.dtype}")
    assert s.dtype == torch.float32 and z.dtype == torch.int64, "float32 scales, int64 zero points"
    assert not z.any(), "every zero point is 0"
    assert s.shape == z.shape == (w.shape[axis],) and axis == 0, "one pair per output channel"
    assert (quant_min, quant_max, dtype) == (-128, 127, torch.int8), "int8 over -128..127"
    assert w.dtype == torch.int8, "the weight is stored as int8"

# %%
# Step 4 — quantize_per_tensor by hand
# ------------------------------------
# The op, in ``torch/ao/quantization/fx/_decomposed.py`` (imported by torchao), does five
# things in this order: multiply by ``1.0 / scale``, round to the nearest integer (halves go
# to the even neighbour), add the zero point, clamp to ``quant_min..quant_max``, cast.
# Rounding and clamping are where information is thrown away. Dequantize casts to float32,
# subtracts the zero point and multiplies by the scale.


def quantize_by_hand(x, scale, zero_point, quant_min, quant_max, dtype):
    """Scale, round, shift, clamp, cast: quantize_per_tensor's arithmetic, in its order."""
    return torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max).to(dtype)


def dequantize_by_hand(q, scale, zero_point):
    """Cast, shift back, scale: dequantize_per_tensor's arithmetic, in its order."""
    return (q.to(torch.float32) - zero_point) * scale


# %%
# ``torch.round`` sends a value exactly half-way between two integers to the even one:

halves = torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]))
print(f"torch.round([0.5, 1.5, 2.5, -0.5, -1.5]) = {halves.tolist()}")
assert halves.tolist() == [0, 2, 2, 0, -2], "round half to even"

# %%
# To check the hand version against real data, run the converted graph with
# ``torch.fx.Interpreter`` and keep every node's value (``garbage_collect_values=False``).
# Then each q/dq node's input and output are at hand. A few input values, step by step:

interpreter = torch.fx.Interpreter(converted, garbage_collect_values=False)
with torch.no_grad():
    interpreter.run(*x)
value = interpreter.env
q = quantizes[0]
_, scale, zero_point, quant_min, quant_max, dtype = q.args
sample = value[q.args[0]].flatten()[:6]
print(f"x               {[round(v, 4) for v in sample.tolist()]}")
print(f"x * (1/scale)   {[round(v, 3) for v in (sample * (1.0 / scale)).tolist()]}")
shifted = torch.round(sample * (1.0 / scale)) + zero_point
print(f"round + zp      {shifted.tolist()}  (zero_point={zero_point})")
print(f"q               {value[q].flatten()[:6].tolist()}")
(dq,) = q.users
print(f"dequantize(q)   {[round(v, 4) for v in value[dq].flatten()[:6].tolist()]}")

# %%
# On every per-tensor q/dq node of the graph, the hand computation equals the op's output
# bit for bit (``torch.equal``, not ``allclose``):

for q in quantizes:
    (dq,) = q.users
    _, scale, zero_point, *_ = q.args
    hand_q = quantize_by_hand(value[q.args[0]], *q.args[1:])
    assert torch.equal(hand_q, value[q]), f"{q.name}: quantize by hand == the op"
    hand_dq = dequantize_by_hand(value[q], scale, zero_point)
    assert torch.equal(hand_dq, value[dq]), f"{dq.name}: dequantize by hand == the op"
    assert value[q].dtype == torch.uint8 and value[dq].dtype == torch.float32, "uint8, float32"
print(f"{len(quantizes)} quantize and {len(quantizes)} dequantize nodes reproduced exactly")

# %%
# Step 5 — Why the order matters
# ------------------------------
# ``x / scale`` looks like the same thing as ``x * (1.0 / scale)``, but ``1.0 / scale`` is
# rounded before the multiplication, so the two can disagree by one unit in the last place.
# That only matters where it decides a rounding: at the half-way points between two grid
# values. Take float32 numbers at and right next to each half-way point of the input's grid:

_, scale, zero_point, quant_min, quant_max, dtype = quantizes[0].args
levels = torch.arange(quant_min, quant_max, dtype=torch.float64)
halfway = ((levels - zero_point + 0.5) * scale).float()
near = torch.cat([halfway, halfway.nextafter(halfway + 1), halfway.nextafter(halfway - 1)])
by_op = Q.quantize_per_tensor.default(near, scale, zero_point, quant_min, quant_max, dtype)
by_division = torch.clamp(torch.round(near / scale) + zero_point, quant_min, quant_max).to(dtype)
differ = int((by_division != by_op).sum())
print(f"{near.numel()} values near half-way points: x / scale disagrees with the op on {differ}")
hand = quantize_by_hand(near, scale, zero_point, quant_min, quant_max, dtype)
assert torch.equal(hand, by_op), "multiplying by 1.0 / scale is the op's arithmetic"
assert differ > 0, "dividing by scale is not"

# %%
# Step 6 — The per-channel pair by hand
# -------------------------------------
# Per channel, the arithmetic is the same with one scale and zero point per slice along
# ``axis``; the op reshapes them so they broadcast over the other dimensions. One difference
# in dtypes: here ``1.0 / scales`` is a float32 tensor, not a Python number.


def quantize_per_channel_by_hand(w, scales, zero_points, axis, quant_min, quant_max, dtype):
    """quantize_per_channel's arithmetic: scales and zero points broadcast along ``axis``."""
    shape = [1] * w.dim()
    shape[axis] = -1
    scaled = torch.round(w * (1.0 / scales.view(shape))) + zero_points.view(shape)
    return torch.clamp(scaled, quant_min, quant_max).to(dtype)


def dequantize_per_channel_by_hand(q, scales, zero_points, axis):
    """dequantize_per_channel's arithmetic: int8 - int64 is int64, times float32 is float32."""
    shape = [1] * q.dim()
    shape[axis] = -1
    return ((q - zero_points.view(shape)) * scales.view(shape)).to(torch.float32)


# %%
# The graph converted with ``fold_quantize=False`` still runs ``quantize_per_channel`` on the
# float weight, so both ops can be checked on its values.

interpreter = torch.fx.Interpreter(unfolded, garbage_collect_values=False)
with torch.no_grad():
    interpreter.run(*x)
unfolded_value = interpreter.env
weight_qs = nodes_calling(unfolded, Q.quantize_per_channel.default)
for q in weight_qs:
    (dq,) = q.users
    w, scales, zero_points = (unfolded_value[node] for node in q.args[:3])
    axis, quant_min, quant_max, dtype = q.args[3:]
    hand_q = quantize_per_channel_by_hand(w, scales, zero_points, axis, quant_min, quant_max, dtype)
    hand_dq = dequantize_per_channel_by_hand(hand_q, scales, zero_points, axis)
    assert torch.equal(hand_q, unfolded_value[q]), f"{q.name}: by hand == the op"
    assert torch.equal(hand_dq, unfolded_value[dq]), f"{dq.name}: by hand == the op"
print(f"{len(weight_qs)} quantize_per_channel and their dequantize reproduced exactly")

# %%
# Step 7 — The int8 constant that fold_quantize=True leaves
# ---------------------------------------------------------
# In the folded graph the ``quantize_per_channel`` node is gone. In its place is a ``get_attr``
# node that kept the old node's name but reads an int8 buffer ``_frozen_param*``, computed at
# convert time. It is exactly the float weight quantized by hand with the same buffers:

for layer in ("conv2d", "linear"):
    folded_dq = node_named(converted, layer).args[1]
    unfolded_q = node_named(unfolded, layer).args[1].args[0]
    constant = value[folded_dq.args[0]]
    float_weight = unfolded_value[unfolded_q.args[0]]
    scales, zero_points = (value[node] for node in folded_dq.args[1:3])
    hand = quantize_per_channel_by_hand(float_weight, scales, zero_points, *folded_dq.args[3:])
    print(f"{layer:<7} {folded_dq.args[0].name} → ‹{folded_dq.args[0].target}› {constant.dtype}")
    assert folded_dq.args[0].op == "get_attr", "a get_attr node took the quantize's place"
    assert folded_dq.args[0].name == unfolded_q.name, "under the quantize node's name"
    assert constant.dtype == torch.int8, "it reads an int8 constant"
    assert torch.equal(constant, hand), "the folded constant is the hand-quantized weight"
    dequantized = dequantize_per_channel_by_hand(constant, scales, zero_points, 0)
    assert torch.equal(dequantized, value[folded_dq]), "and its dequantize matches the graph's"

# %%
# That float weight is the BatchNorm-folded one from ``prepare_pt2e`` (M01-1), not the eager
# model's: quantizing ``model.conv.weight`` would give other integers.

conv_dq = node_named(converted, "conv2d").args[1]
int8_weight, scales, zero_points = (value[node] for node in conv_dq.args[:3])
eager = quantize_per_channel_by_hand(model.conv.weight, scales, zero_points, *conv_dq.args[3:])
print(f"integers that differ: {int((eager != int8_weight).sum())} of {eager.numel()}")
assert not torch.equal(eager, int8_weight), "the eager weight is not what got quantized"

# %%
# Step 8 — What a q/dq round trip loses
# -------------------------------------
# A value inside the grid's range, ``(quant_min - zero_point) * scale`` to
# ``(quant_max - zero_point) * scale``, comes back from quantize → dequantize off by at most
# half a step (``scale / 2``); the asserted bound adds 1e-6 for float32 rounding in the
# arithmetic. A value outside is clamped to the nearest end: the observer chose a range that
# leaves some calibration values out (M01-3 shows why).

q = quantizes[0]
(dq,) = q.users
_, scale, zero_point, quant_min, quant_max, dtype = q.args
original, restored = value[q.args[0]], value[dq]
low, high = (quant_min - zero_point) * scale, (quant_max - zero_point) * scale
inside = (original >= low) & (original <= high)
error = restored - original
print(f"range {low:.4f}..{high:.4f}; {int((~inside).sum())} of {original.numel()} values outside")
print(f"inside: max error {error[inside].abs().max():.6f} (scale / 2 = {scale / 2:.6f})")
print(f"outside: max error {error[~inside].abs().max():.6f}")
ends = dequantize_by_hand(torch.tensor([quant_min, quant_max], dtype=dtype), scale, zero_point)
assert error[inside].abs().max() <= scale / 2 + 1e-6, "half a step inside the range"
assert (~inside).any(), "some calibration values lie outside the range"
assert torch.isin(restored[~inside], ends).all(), "and come back clamped to an end"

# %%
# The same, drawn. Left, the error of every value of the batch in steps of the grid: a band of
# ±0.5 step across the grid's range; the values beyond its ends (red) are clamped to an end,
# and an error larger than one step is drawn at the chart's edge. Right, six steps around 0:
# the round trip is a staircase, each value moved to the nearest grid point.

steps = (error / scale).flatten()
xs = torch.linspace(-3 * scale, 3 * scale, 601)
stairs = dequantize_by_hand(quantize_by_hand(xs, *q.args[1:]), scale, zero_point)
fig, (every, around_zero) = plt.subplots(1, 2, figsize=(10, 3.6))
kept = inside.flatten()
every.scatter(original.flatten()[kept].numpy(), steps[kept].numpy(), s=2, label="inside")
every.scatter(
    original.flatten()[~kept].numpy(),
    steps[~kept].clamp(-1, 1).numpy(),
    s=12,
    color="tab:red",
    label="clamped",
)
every.axhline(0.5, color="gray", linestyle="--", label="±0.5 step")
every.axhline(-0.5, color="gray", linestyle="--")
every.set(
    title="Round-trip error of every x", xlabel="x", ylabel="error (steps)", ylim=(-1.05, 1.4)
)
every.legend(loc="upper center", ncols=3)
around_zero.plot(xs.numpy(), xs.numpy(), color="gray", linestyle="--", label="x")
around_zero.plot(xs.numpy(), stairs.numpy(), label="dequantize(quantize(x))")
around_zero.set(title="Six steps around 0", xlabel="x", ylabel="after the round trip")
around_zero.legend(loc="upper left")
fig.tight_layout()

# %%
# Summary
# -------
# A per-tensor q/dq pair keeps ``scale`` (a float32 value as a Python float), ``zero_point``,
# ``quant_min``, ``quant_max`` and ``dtype`` in its ``args``; a per-channel one reads
# ``_scale_*`` and ``_zero_point_*`` buffers and has an ``axis``. Quantize is
# ``clamp(round(x * (1.0 / scale)) + zero_point).to(dtype)`` and dequantize
# ``(q.to(float32) - zero_point) * scale``, and written in exactly that order they match the
# ops bit for bit. A round trip moves a value inside the grid's range by at most half a step
# and clamps a value outside it to the nearest end.
#
# Exercises
# ---------
# 1. Quantize ``[0.5, 1.5, 2.5, -0.5, -1.5]`` with ``Q.quantize_per_tensor.default``, scale
#    1.0, zero point 0, int8 over -128..127. Predict the integers.
#
#    .. dropdown:: Solution
#
#       With scale 1.0 the op only rounds, and every value is a half: each goes to the even
#       neighbour.
#
#       .. code-block:: python
#
#          halves_q = Q.quantize_per_tensor.default(
#              torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]), 1.0, 0, -128, 127, torch.int8
#          )
#          print(halves_q.tolist())
#          assert halves_q.tolist() == [0, 2, 2, 0, -2], "half to even, as torch.round"
#
# 2. Quantize the input ``x`` as ``int8`` over -128..127 instead of ``uint8`` over 0..255,
#    with the same scale and the zero point lowered by 128. Predict the integers and the
#    dequantized values.
#
#    .. dropdown:: Solution
#
#       The integers are the uint8 ones minus 128, and the dequantized values are identical:
#       shifting the grid and its zero point together changes nothing but the storage type.
#
#       .. code-block:: python
#
#          q = quantizes[0]
#          _, scale, zero_point, *_ = q.args
#          data = value[q.args[0]]
#          as_uint8 = Q.quantize_per_tensor.default(data, scale, zero_point, 0, 255, torch.uint8)
#          as_int8 = Q.quantize_per_tensor.default(
#              data, scale, zero_point - 128, -128, 127, torch.int8
#          )
#          assert torch.equal(as_int8.int() + 128, as_uint8.int()), "the integers minus 128"
#          back_uint8 = dequantize_by_hand(as_uint8, scale, zero_point)
#          back_int8 = dequantize_by_hand(as_int8, scale, zero_point - 128)
#          assert torch.equal(back_int8, back_uint8), "the same float values"
#
# 3. Round-trip the float weights of the ``fold_quantize=False`` graph through their
#    per-channel q/dq pair. Predict each channel's largest error, in steps of its own scale.
#
#    .. dropdown:: Solution
#
#       Half a step in every channel, up to float32 rounding. The symmetric int8 scale is
#       ``max|w| / 127.5``, so a channel's largest magnitude lands exactly half-way, at ±127.5:
#       it is rounded or clamped to -128 or 127, half a step away. Nothing is further.
#
#       .. code-block:: python
#
#          for q in weight_qs:
#              (dq,) = q.users
#              w, scales = unfolded_value[q.args[0]], unfolded_value[q.args[1]]
#              worst = (unfolded_value[dq] - w).abs().flatten(1).amax(dim=1) / scales
#              print(f"{q.name}: {[round(v, 5) for v in worst.tolist()]}")
#              assert torch.allclose(worst, torch.full_like(worst, 0.5), atol=1e-4), "½ step"
#
# Further reading
# ---------------
# - `PT2E quantization overview (torchao) <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `PyTorch 2 Export post-training quantization (torchao) <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_ptq.html>`_
#
# Next
# ----
# Where the scale and zero point come from:
# :ref:`M01-3 · how an observer turns statistics into qparams
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`.
