"""
M01-3 How an observer turns statistics into qparams
===================================================

An observer does two things: while data flows through it, it records statistics; when
``convert_pt2e`` asks, ``calculate_qparams()`` turns them into a scale and a zero point. For a
MinMax observer the statistics are a minimum and a maximum and the formula fits in five lines;
a per-channel observer applies the same formula channel by channel; a histogram observer
first searches for a narrower range that trades a few clipped extremes for a finer grid. This
lesson feeds all four the same activations and recomputes their qparams by hand.

**What you will learn**

- The exact MinMax formula, affine and symmetric, including ``eps``, and its per-channel form
- Which observers the x86 quantizer puts on activations and weights, and why activations
  stay per tensor
- What the histogram observer does differently, and what it costs and buys

**Prerequisites**:
:ref:`M01-2 · q/dq nodes and their numbers
<sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# Setup
# -----
# The observers live in ``torchao.quantization.pt2e.observer``. The data is real: the output
# of ``small_cnn``'s conv and BatchNorm, before the ReLU, on the four calibration batches of
# M01-1: 4 × 8 images of 8 channels × 16 × 16 = 65,536 values.

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e.observer import (
    HistogramObserver,
    MinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

Q = torch.ops.quantized_decomposed
EPS = 2**-12
model = get_model("small_cnn")
with torch.no_grad():
    batches = [model.bn(model.conv(example_inputs(8, seed=seed)[0])) for seed in range(4)]
data = torch.cat(batches)
print(f"data: {tuple(data.shape)}, {data.numel()} values, {data.min():.4f}..{data.max():.4f}")

# %%
# ``same`` is a strict equality; ``round_trip`` quantizes and dequantizes with an observer's
# qparams, per tensor or per channel.


def same(a, b):
    """Equal values, dtype and shape: stricter than torch.equal, which ignores the dtype."""
    return torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape


def round_trip(obs, values):
    """``values`` quantized with ``obs``'s qparams and dequantized again."""
    scale, zero_point = obs.calculate_qparams()
    if obs.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine):
        args = (scale, zero_point, obs.ch_axis, obs.quant_min, obs.quant_max, obs.dtype)
        return Q.dequantize_per_channel.default(
            Q.quantize_per_channel.default(values, *args), *args
        )
    args = (float(scale), int(zero_point), obs.quant_min, obs.quant_max, obs.dtype)
    return Q.dequantize_per_tensor.default(Q.quantize_per_tensor.default(values, *args), *args)


# %%
# Step 1 — The observers the x86 quantizer uses
# ---------------------------------------------
# ``prepare_pt2e`` with ``X86InductorQuantizer`` puts a ``HistogramObserver`` on every
# activation edge and a ``PerChannelMinMaxObserver`` on every weight (M01-1).

prepared = prepare_pt2e(export_module(model, example_inputs(8)), x86_quantizer())
observer_nodes = [
    node
    for node in prepared.graph.nodes
    if node.op == "call_module" and isinstance(prepared.get_submodule(node.target), ObserverBase)
]
draw(prepared, highlight=[n.name for n in observer_nodes], title="Step 1: the x86 observers")

# %%
# Their settings: activations are ``uint8`` 0..255, affine, one scale for the whole tensor;
# weights are ``int8`` -128..127, symmetric, per output channel (``ch_axis=0``). Both use
# ``eps = 2**-12`` as the smallest allowed scale. The observers built below use exactly these
# settings.

for node in observer_nodes:
    obs = prepared.get_submodule(node.target)
    print(f"{node.args[0].name:>12}: {type(obs).__name__:<24} {obs.dtype} {obs.qscheme}")
    print(f"{'':>14}quant_min={obs.quant_min}, quant_max={obs.quant_max}, eps={obs.eps.item()}")
    assert obs.eps.item() == EPS, "eps = 2**-12"
    if node.args[0].op == "get_attr":
        assert isinstance(obs, PerChannelMinMaxObserver) and obs.ch_axis == 0, (
            "weights: per channel"
        )
        settings = (torch.int8, torch.per_channel_symmetric, -128, 127)
    else:
        assert isinstance(obs, HistogramObserver), "activations: a histogram observer"
        settings = (torch.uint8, torch.per_tensor_affine, 0, 255)
    assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == settings, "these settings"

# %%
# Step 2 — Feed four observers the same data
# ------------------------------------------
# Two per-tensor MinMax observers, affine (like the activations) and symmetric (like the
# weights, but one scale for the whole tensor); a per-channel MinMax observer over the channel
# axis of these activations (axis 1), symmetric like the weights; and the histogram observer
# of the activations.

observers = {
    "minmax affine": MinMaxObserver(
        dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255, eps=EPS
    ),
    "minmax symmetric": MinMaxObserver(
        dtype=torch.int8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127, eps=EPS
    ),
    "per-channel": PerChannelMinMaxObserver(
        ch_axis=1,
        dtype=torch.int8,
        qscheme=torch.per_channel_symmetric,
        quant_min=-128,
        quant_max=127,
        eps=EPS,
    ),
    "histogram": HistogramObserver(
        dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255, eps=EPS
    ),
}
for batch in batches:
    for obs in observers.values():
        obs(batch)

# %%
# The statistics a MinMax observer keeps are the running minimum and maximum, exactly the
# minimum and maximum of everything it saw. The per-channel one keeps them per channel; the
# histogram observer keeps them too, next to its 2048-bin histogram.

per_channel_min, per_channel_max = data.transpose(0, 1).flatten(1).aminmax(dim=1)
for name in ("minmax affine", "minmax symmetric", "histogram"):
    assert same(observers[name].min_val, data.min()), f"{name}: the minimum of all it saw"
    assert same(observers[name].max_val, data.max()), f"{name}: the maximum of all it saw"
assert same(observers["per-channel"].min_val, per_channel_min), "one minimum per channel"
assert same(observers["per-channel"].max_val, per_channel_max), "one maximum per channel"
assert observers["histogram"].histogram.numel() == 2048, "a 2048-bin histogram"
print(f"per-channel max: {[round(v, 3) for v in per_channel_max.tolist()]}")
print(f"histogram: {observers['histogram'].histogram.numel()} bins")

# %%
# Step 3 — MinMax, affine and symmetric, by hand
# ----------------------------------------------
# ``_calculate_qparams`` in ``observer.py`` first stretches the range to include 0 (zero must
# be exactly representable). Affine quantization: the range is split into
# ``quant_max - quant_min`` steps and the zero point is the integer that lands on 0. Symmetric
# quantization: the range is made symmetric around 0 and the zero point is 0 (for int8).
# In both, the scale is at least ``eps``. The function below copies the library's operations
# in the library's order.


def qparams_by_hand(min_val, max_val, quant_min, quant_max, symmetric):
    """MinMax scale and zero point, as _calculate_qparams computes them for int8 and uint8."""
    min_neg = torch.min(min_val, torch.zeros_like(min_val))
    max_pos = torch.max(max_val, torch.zeros_like(max_val))
    eps = torch.tensor([EPS])
    if symmetric:
        max_pos = torch.max(-min_neg, max_pos)
        scale = torch.max(max_pos / (float(quant_max - quant_min) / 2), eps)
        zero_point = torch.zeros(min_neg.shape, dtype=torch.int64)
    else:
        scale = torch.max((max_pos - min_neg) / float(quant_max - quant_min), eps)
        zero_point = quant_min - torch.round(min_neg / scale).to(torch.int)
        zero_point = torch.clamp(zero_point, quant_min, quant_max)
    return scale.reshape(-1), zero_point.reshape(-1)


# %%
# The hand function gives the library's numbers, dtype included:

for name, symmetric in (("minmax affine", False), ("minmax symmetric", True)):
    obs = observers[name]
    scale, zero_point = obs.calculate_qparams()
    hand = qparams_by_hand(obs.min_val, obs.max_val, obs.quant_min, obs.quant_max, symmetric)
    print(
        f"{name:<17} scale={scale.item():.6f} zero_point={zero_point.item():>3} {zero_point.dtype}"
    )
    assert same(hand[0], scale) and same(hand[1], zero_point), f"{name}: by hand == library"

# %%
# For the same data, the symmetric scale can never be smaller than the affine one: it covers
# ``-max(|min|, max)..max(|min|, max)``, which contains ``min..max``. On data that is all
# positive (after a ReLU) the symmetric grid wastes its negative half: its scale is twice the
# affine one. That is why activations use affine.

affine_scale = observers["minmax affine"].calculate_qparams()[0]
symmetric_scale = observers["minmax symmetric"].calculate_qparams()[0]
relu_min, relu_max = data.relu().min(), data.relu().max()
relu_ratio = (
    qparams_by_hand(relu_min, relu_max, -128, 127, True)[0]
    / qparams_by_hand(relu_min, relu_max, 0, 255, False)[0]
)
print(f"symmetric / affine scale = {(symmetric_scale / affine_scale).item():.4f}")
print(f"after a ReLU:              {relu_ratio.item():.4f}")
assert symmetric_scale >= affine_scale, "the symmetric scale is never the smaller one"
torch.testing.assert_close(
    relu_ratio,
    torch.tensor([2.0]),
    rtol=1e-6,
    atol=0,
    msg="after a ReLU the symmetric scale is twice the affine one",
)

# %%
# Step 4 — Per-channel MinMax by hand
# -----------------------------------
# The per-channel observer calls the same ``_calculate_qparams`` with a minimum and a maximum
# per channel; every operation in it is elementwise, so the hand function works unchanged on
# the per-channel vectors.

obs = observers["per-channel"]
scales, zero_points = obs.calculate_qparams()
hand_scales, hand_zero_points = qparams_by_hand(obs.min_val, obs.max_val, -128, 127, True)
print(f"scales: {[round(v, 5) for v in scales.tolist()]}")
assert same(hand_scales, scales) and same(hand_zero_points, zero_points), "by hand == library"

# %%
# Each channel gets a grid fitted to its own range, so no channel's scale exceeds the
# per-tensor symmetric scale, and the channel that holds the largest magnitude gets exactly
# that scale. Narrow channels get a much finer grid.

widest = int(torch.max(-per_channel_min, per_channel_max).argmax())
print(f"per-tensor symmetric scale: {symmetric_scale.item():.5f}")
finest, widest_scale = scales.min().item(), scales[widest].item()
print(f"per-channel: finest {finest:.5f}, widest (channel {widest}) {widest_scale:.5f}")
assert (scales <= symmetric_scale).all(), "no channel's scale exceeds the per-tensor one"
assert scales[widest] == symmetric_scale, "the widest channel's scale is the per-tensor one"

# %%
# Drawn: each channel's range (bars) against the per-tensor symmetric range (dashed), and each
# channel's scale against the per-tensor scale.

channels = range(len(scales))
fig, (ranges, steps) = plt.subplots(1, 2, figsize=(10, 3.6))
ranges.bar(channels, (per_channel_max - per_channel_min).numpy(), bottom=per_channel_min.numpy())
limit = symmetric_scale.item() * 127.5
ranges.axhline(limit, color="gray", linestyle="--", label="per-tensor symmetric range")
ranges.axhline(-limit, color="gray", linestyle="--")
ranges.set(title="Range of each channel", xlabel="channel", ylabel="value", ylim=(-4, 5.5))
ranges.legend(loc="upper center")
steps.bar(channels, scales.numpy(), label="per-channel scale")
steps.axhline(symmetric_scale.item(), color="gray", linestyle="--", label="per-tensor scale")
steps.set(title="Scale of each channel", xlabel="channel", ylabel="scale", ylim=(0, 0.04))
steps.legend(loc="upper center", ncols=2)
fig.tight_layout()

# %%
# ``eps`` only matters when a range is (almost) empty: a channel that is all zeros would get
# scale 0, and dividing by it would fail. It gets ``eps`` instead:

dead = PerChannelMinMaxObserver(
    ch_axis=0,
    dtype=torch.int8,
    qscheme=torch.per_channel_symmetric,
    quant_min=-128,
    quant_max=127,
    eps=EPS,
)
dead(torch.stack([torch.zeros(5), torch.linspace(-1, 1, 5)]))
dead_scales, _ = dead.calculate_qparams()
print(f"scales with an all-zero channel 0: {dead_scales.tolist()}")
assert dead_scales[0] == EPS, "an all-zero channel gets scale eps"
assert same(dead_scales, qparams_by_hand(dead.min_val, dead.max_val, -128, 127, True)[0]), (
    "the hand formula does the same"
)

# %%
# .. warning::
#    Per-channel quantization of an *activation*, as done here for the comparison, is not
#    what int8 kernels run. A conv or linear sums over its input channels, and those are the
#    activation's channels. With one activation scale, the kernel sums int8 × int8 products
#    in an integer accumulator and multiplies the sum once by ``x_scale × w_scale[out]``
#    (weights are per *output* channel, an axis that is not summed). A scale per input
#    channel sits inside the sum and cannot be taken out. Hence the x86 quantizer's choice in
#    step 1.
#
# On 8 channels of 32 pixels and a 4 × 8 weight: with a per-tensor activation, one integer
# sum and one rescale per output give what the q/dq graph computes; with per-channel
# activation scales, even the best single factor leaves an error.

pixels = data[:, :, 0, 0]  # 32 pixels × 8 channels, the axis a linear layer sums over
weight = torch.linspace(-1, 1, 32).reshape(8, 4).T
w_scales = weight.abs().amax(dim=1) / 127.5
w_int = torch.round(weight / w_scales[:, None])
for name in ("minmax symmetric", "per-channel"):
    x_scales, _ = observers[name].calculate_qparams()
    x_int = torch.round(pixels / x_scales).clamp(-128, 127)
    simulated = (x_int * x_scales) @ (w_int * w_scales[:, None]).T  # what q/dq computes
    integer_sum = (x_int @ w_int.T) * w_scales  # what an int8 kernel can compute
    best = (simulated * integer_sum).sum() / integer_sum.pow(2).sum()  # least-squares factor
    relative = ((best * integer_sum - simulated).norm() / simulated.norm()).item()
    print(f"{name:<17} one rescale after the integer sum: relative error {relative:.2e}")
    assert (relative < 1e-6) == (name == "minmax symmetric"), "exact only for one scale"

# %%
# Step 5 — The histogram observer
# -------------------------------
# The histogram observer saw the same minimum and maximum, yet it returns a different scale
# and zero point. ``calculate_qparams`` first runs a search over its histogram
# (``_non_linear_param_search``, an internal method) for a narrower range that lowers an
# estimate of the squared quantization error, then applies the very same formula to it:

hist = observers["histogram"]
new_min, new_max = hist._non_linear_param_search()
scale, zero_point = hist.calculate_qparams()
hand = qparams_by_hand(new_min, new_max, 0, 255, False)
print(f"recorded range {hist.min_val:.4f}..{hist.max_val:.4f}")
print(f"searched range {new_min:.4f}..{new_max:.4f}")
assert same(hand[0], scale) and same(hand[1], zero_point), "same formula, narrower range"
assert hist.min_val <= new_min and new_max < hist.max_val, "the search only narrows"

# %%
# The search is a greedy walk that shrinks the range from whichever end is sparser,
# estimating the error from bin counts, and stops at the first step that makes the estimate
# worse. It is not reproduced here line by line; its outcome is what matters. Quantize the
# data with each observer's qparams and compare the mean squared error:

rows = {}
for name, obs in observers.items():
    scale, zero_point = obs.calculate_qparams()
    mse = (round_trip(obs, data) - data).pow(2).mean().item()
    rows[name] = (scale, zero_point, mse)
    scale_text = (
        f"{scale.min():.5f}..{scale.max():.5f}" if scale.numel() > 1 else f"{scale.item():.5f}"
    )
    kind = f"{obs.dtype}, {obs.qscheme}".replace("torch.", "")
    print(f"{name:<17} {kind:<32} scale {scale_text:<16} mean sq. error {mse:.3e}")

# %%
# Compare like with like. The histogram observer against MinMax affine (both ``uint8``,
# affine, per tensor): its grid covers less than the data's range, mostly at the top, where
# the values are sparsest; the few values outside are clipped, and in exchange its step is
# finer for all the others. On this data the trade pays off. Per-channel against MinMax
# symmetric (both ``int8``, symmetric): a grid per channel beats one for the whole tensor.

hist_scale, hist_zero_point, hist_mse = rows["histogram"]
low = (0 - hist_zero_point.item()) * hist_scale.item()
high = (255 - hist_zero_point.item()) * hist_scale.item()
n_below, n_above = int((data < low).sum()), int((data > high).sum())
print(f"histogram grid {low:.4f}..{high:.4f}: {n_below} values below, {n_above} above")
assert 0 < n_below + n_above < data.numel() * 1e-3, "a handful of extremes is clipped"
assert hist.max_val - high > low - hist.min_val, "the range is trimmed mostly at the top"
assert hist_scale < rows["minmax affine"][0], "the step is finer"
assert hist_mse < rows["minmax affine"][2], "and the total error is lower on this data"
assert rows["per-channel"][2] < rows["minmax symmetric"][2], "per channel beats per tensor"

# %%
# The histogram the observer keeps, on a log scale so that the sparse tails show, with the
# range MinMax uses and the narrower one the search chose:

edges = torch.linspace(hist.min_val.item(), hist.max_val.item(), hist.bins + 1)
fig, ax = plt.subplots(figsize=(10, 3.6))
ax.stairs(hist.histogram.numpy(), edges.numpy(), fill=True, label="histogram (2048 bins)")
ax.axvspan(hist.min_val.item(), hist.max_val.item(), color="gray", alpha=0.15, label="MinMax range")
ax.axvline(low, color="tab:red", linestyle="--", label="histogram observer's range")
ax.axvline(high, color="tab:red", linestyle="--")
ax.set(title="What the histogram observer keeps", xlabel="value", ylabel="count", yscale="log")
ax.legend(loc="upper left")
fig.tight_layout()

# %%
# It is a search driven by an estimate, not a guarantee: on other data MinMax can do better
# (exercise 2).
#
# Summary
# -------
# ==================  =====================================================================
# observer            qparams from its statistics
# ==================  =====================================================================
# MinMax, affine      ``scale = max(range / (quant_max - quant_min), eps)`` over a range
#                     stretched to include 0; ``zero_point = quant_min - round(min / scale)``
# MinMax, symmetric   ``scale = max(max(|min|, max) / ((quant_max - quant_min) / 2), eps)``;
#                     ``zero_point = 0`` for int8
# per-channel         the same formula, channel by channel (for weights; int8 kernels take
#                     one scale per activation tensor)
# histogram           searches a narrower range first, then the affine formula
# ==================  =====================================================================
#
# M01 is complete: you can read what PT2E puts in a graph and recompute every number in it.
#
# Exercises
# ---------
# 1. Build a MinMax affine observer over 0..127 instead of 0..255 (``reduce_range``, used on
#    CPUs without VNNI) and feed it the same batches. Predict its scale relative to the
#    0..255 one.
#
#    .. dropdown:: Solution
#
#       The same range split into 127 steps instead of 255: the scale grows by 255 / 127.
#
#       .. code-block:: python
#
#          reduced = MinMaxObserver(
#              dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=127
#          )
#          for batch in batches:
#              reduced(batch)
#          full_scale = observers["minmax affine"].calculate_qparams()[0]
#          ratio = reduced.calculate_qparams()[0] / full_scale
#          print(f"{ratio.item():.6f} vs 255 / 127 = {255 / 127:.6f}")
#          torch.testing.assert_close(ratio, torch.tensor([255 / 127]), rtol=1e-6, atol=0)
#
# 2. Feed a MinMax affine and a histogram observer (both ``uint8`` 0..255, as above) 2048
#    values -1.0 and 2048 values 1.0. Which one gives the lower mean squared error?
#
#    .. dropdown:: Solution
#
#       MinMax. Both ends hold half the data, so nothing should be clipped; the histogram
#       search, which works from bin estimates, still moves an end, and its error is higher.
#
#       .. code-block:: python
#
#          spikes = torch.cat([torch.full((2048,), -1.0), torch.full((2048,), 1.0)])
#          pair = {
#              "minmax": MinMaxObserver(
#                  dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255
#              ),
#              "histogram": HistogramObserver(
#                  dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255
#              ),
#          }
#          errors = {}
#          for name, obs in pair.items():
#              obs(spikes)
#              errors[name] = (round_trip(obs, spikes) - spikes).pow(2).mean().item()
#          print(errors)
#          assert errors["minmax"] < errors["histogram"], "the search is not a guarantee"
#
# 3. Calibrate ``prepared`` from step 1 with ``common.pt2e.calibrate`` and read the weight
#    observer of the conv. Predict its scales from the weight it observed.
#
#    .. dropdown:: Solution
#
#       Symmetric int8 per output channel: ``max|w| / 127.5`` for each output channel of the
#       BatchNorm-folded weight, exactly what ``qparams_by_hand`` computes from its record.
#
#       .. code-block:: python
#
#          from common.pt2e import calibrate
#
#          calibrate(prepared)
#          (weight_node,) = [n for n in observer_nodes if n.args[0].name == "conv_weight"]
#          weight_observer = prepared.get_submodule(weight_node.target)
#          folded = prepared.conv.weight
#          w_scales, _ = weight_observer.calculate_qparams()
#          hand_scales, _ = qparams_by_hand(
#              folded.amin(dim=(1, 2, 3)), folded.amax(dim=(1, 2, 3)), -128, 127, True
#          )
#          print([round(v, 5) for v in w_scales.tolist()])
#          assert same(w_scales, hand_scales), "max|w| / 127.5 per output channel"
#
# Further reading
# ---------------
# - `PT2E quantization overview (torchao) <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `PyTorch 2 Export quantization with the X86 backend (torchao) <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_x86_inductor.html>`_
# - :ref:`Troubleshooting: prepare and convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# M02 writes ``prepare`` and ``convert`` by hand and proves them equal to torchao's, starting
# with what a quantizer writes into the graph:
# :ref:`M02-1 · what a quantizer writes
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`.
