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
- Which observers the x86 quantizer puts on activations and weights, and with which settings
- What the histogram observer does differently, and what it costs and buys

**Prerequisites**: M01-2 (q/dq nodes and their numbers).
"""

# %%
# Setup
# -----
# The observers live in ``torchao.quantization.pt2e.observer``. The data is real: the output
# of ``small_cnn``'s conv and BatchNorm, before the ReLU, on the four calibration batches of
# M01-1: 4 × 8 images of 8 channels × 16 × 16 = 65,536 values.

import torch

from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.observer import (  # noqa: E402
    HistogramObserver,
    MinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e  # noqa: E402

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
with torch.no_grad():
    batches = [model.bn(model.conv(example_inputs(8, seed=seed)[0])) for seed in range(4)]
data = torch.cat(batches)
print(f"data: {tuple(data.shape)}, {data.numel()} values, {data.min():.4f}..{data.max():.4f}")


def same(a, b):
    """Equal values, dtype and shape: stricter than torch.equal, which ignores the dtype."""
    return torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape


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
# Their settings: activations are ``uint8`` 0..255 with an affine zero point; weights are
# ``int8`` -128..127, symmetric, per output channel (``ch_axis=0``). Both use
# ``eps = 2**-12`` as the smallest allowed scale. The observers built below use exactly these
# settings.

EPS = 2**-12
for node in observer_nodes:
    obs = prepared.get_submodule(node.target)
    print(f"{node.args[0].name:>12}: {type(obs).__name__:<24} {obs.dtype} {obs.qscheme}")
    print(f"{'':>14}quant_min={obs.quant_min}, quant_max={obs.quant_max}, eps={obs.eps.item()}")
    assert obs.eps.item() == EPS
    if isinstance(obs, HistogramObserver):
        assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == (
            torch.uint8,
            torch.per_tensor_affine,
            0,
            255,
        )
    else:
        assert isinstance(obs, PerChannelMinMaxObserver) and obs.ch_axis == 0
        assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == (
            torch.int8,
            torch.per_channel_symmetric,
            -128,
            127,
        )

# %%
# Step 2 — Feed four observers the same data
# ------------------------------------------
# Two per-tensor MinMax observers, affine (like the activations) and symmetric (like the
# weights, but one scale for the whole tensor); a per-channel MinMax observer over the channel
# axis of these activations (axis 1); and the histogram observer of the activations.

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
    assert same(observers[name].min_val, data.min()) and same(observers[name].max_val, data.max())
assert same(observers["per-channel"].min_val, per_channel_min), "one minimum per channel"
assert same(observers["per-channel"].max_val, per_channel_max), "one maximum per channel"
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
# ``-max(|min|, max)..max(|min|, max)``, which contains ``min..max``. On data that is mostly
# positive (after a ReLU) it would waste almost half of the grid, which is why activations use
# affine.

affine_scale = observers["minmax affine"].calculate_qparams()[0]
symmetric_scale = observers["minmax symmetric"].calculate_qparams()[0]
print(f"symmetric / affine scale = {(symmetric_scale / affine_scale).item():.4f}")
assert symmetric_scale >= affine_scale

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
assert (scales <= symmetric_scale).all() and scales[widest] == symmetric_scale

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
assert dead_scales[0] == EPS and same(
    dead_scales, qparams_by_hand(dead.min_val, dead.max_val, -128, 127, True)[0]
)

# %%
# Step 5 — The histogram observer
# -------------------------------
# The histogram observer saw the same minimum and maximum, yet it returns a different scale
# and zero point. ``calculate_qparams`` first runs a search over its histogram
# (``_non_linear_param_search``, an internal method) for the range with the smallest
# estimated squared quantization error, then applies the very same formula to that range:

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
# data with each observer's qparams and compare:

rows = {}
for name, obs in observers.items():
    scale, zero_point = obs.calculate_qparams()
    if name == "per-channel":
        q = Q.quantize_per_channel.default(data, scale, zero_point, 1, -128, 127, torch.int8)
        restored = Q.dequantize_per_channel.default(q, scale, zero_point, 1, -128, 127, torch.int8)
    else:
        qmin, qmax, dtype = obs.quant_min, obs.quant_max, obs.dtype
        args = (float(scale), int(zero_point), qmin, qmax, dtype)
        restored = Q.dequantize_per_tensor.default(
            Q.quantize_per_tensor.default(data, *args), *args
        )
    rows[name] = (scale, zero_point, (restored - data).pow(2).mean().item())

# %%
print("observer                     scale  zero point  mean sq. error")
for name, (scale, zero_point, mse) in rows.items():
    scale_text = (
        f"{scale.min():.5f}..{scale.max():.5f}" if scale.numel() > 1 else f"{scale.item():.5f}"
    )
    zp_text = f"0 ×{zero_point.numel()}" if zero_point.numel() > 1 else str(zero_point.item())
    print(f"{name:<17} {scale_text:>16} {zp_text:>11} {mse:>15.3e}")

# %%
# What the histogram observer bought and paid: its grid covers less than the data's range
# (mostly at the top, where the values are sparsest), so the few values outside are clipped,
# and in exchange its step is finer for all the others. On this data the trade pays off: the
# mean squared error is lower than with the MinMax range. It is a search driven by an
# estimate, not a guarantee, and it trims only rare extremes at the ends. Per-channel does
# better still by giving each channel its own grid.

hist_scale, hist_zero_point, hist_mse = rows["histogram"]
low = (0 - hist_zero_point.item()) * hist_scale.item()
high = (255 - hist_zero_point.item()) * hist_scale.item()
n_clipped = int(((data < low) | (data > high)).sum())
print(f"histogram grid covers {low:.4f}..{high:.4f}: {n_clipped} of {data.numel()} values outside")
assert 0 < n_clipped < data.numel() * 1e-3, "a handful of extremes is clipped"
assert hist_scale < rows["minmax affine"][0], "the step is finer"
assert hist_mse < rows["minmax affine"][2], "and the total error is lower on this data"
assert rows["per-channel"][2] < hist_mse, "per-channel fits each channel better still"

# %%
# Summary
# -------
# ==================  =====================================================================
# observer            qparams from its statistics
# ==================  =====================================================================
# MinMax, affine      ``scale = max(range / (quant_max - quant_min), eps)`` over a range
#                     stretched to include 0; ``zero_point = quant_min - round(min / scale)``
# MinMax, symmetric   ``scale = max(max(|min|, max) / ((quant_max - quant_min) / 2), eps)``;
#                     ``zero_point = 0`` for int8
# per-channel         the same formula, channel by channel
# histogram           searches a narrower range first, then the affine formula
# ==================  =====================================================================
#
# M01 is complete: you can read what PT2E puts in a graph and recompute every number in it.
# M02 writes ``prepare`` and ``convert`` by hand and proves them equal to torchao's.
