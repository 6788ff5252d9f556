"""
M04-3 Quantization-aware training
=================================

M04-2 fixed the outlier model by changing the recipe. When the recipe is fixed, say a backend
that only has per-tensor weights, change the weights instead: quantization-aware training (QAT)
fine-tunes the model with the int8 rounding already in its forward pass, so training learns
weights that survive it. ``prepare_qat_pt2e`` puts fake-quantize modules where
``prepare_pt2e`` puts observers and keeps BatchNorm alive for training, ``convert_pt2e``
folds it away at the end. Two epochs win back what post-training quantization lost.

**What you will learn**

- What ``prepare_qat_pt2e`` does beyond ``prepare_pt2e``: fake quantize, conv + BatchNorm
- Why ``model.train()`` fails on an exported model, and what to call instead
- fp32 / PTQ / QAT accuracy on the same model and test set

**Prerequisites**: :ref:`M04-2 · Fixing it <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>`,
:ref:`M01-1 · The PT2E flow end to end
<sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The digits CNN with M04-2's planted outlier channel, and one recipe for PTQ and QAT alike:
# the x86 defaults except for per-tensor weights. For QAT the weight's observer is a
# ``FusedMovingAvgObsFakeQuantize`` (observe *and* round) around a moving-average MinMax.

import copy
import time
from collections import Counter
from dataclasses import replace

import matplotlib.pyplot as plt
import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval

from common.charts import use_course_style
from common.data import accuracy, digits, export_digits_model, fit, train_digits_cnn
from common.expect import expect_error
from common.pt2e import quiet
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e import (
    FakeQuantizeBase,
    FusedMovingAvgObsFakeQuantize,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    ObserverBase,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

calibration_images, _ = digits("calibration")
model = train_digits_cnn()
outlier = copy.deepcopy(model)
with torch.no_grad():  # M04-2, step 1: channel 0 × 100 in, × 1/100 out
    outlier.bn1.weight[0] *= 100
    outlier.bn1.bias[0] *= 100
    outlier.conv2.weight[:, 0] /= 100


def fold_batch_norm(model):
    """A copy of ``model`` whose BatchNorms are folded into their convs (BN becomes Identity)."""
    folded = copy.deepcopy(model)
    for conv, bn in (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")):
        setattr(folded, conv, fuse_conv_bn_eval(getattr(folded, conv), getattr(folded, bn)))
        setattr(folded, bn, torch.nn.Identity())
    return folded


def per_tensor_recipe(*, is_qat):
    """The x86 default config, with per-tensor symmetric weights."""
    base = get_default_x86_inductor_quantization_config(is_qat=is_qat)
    observer = MinMaxObserver.with_args(eps=2**-12)
    if is_qat:
        observer = FusedMovingAvgObsFakeQuantize.with_args(
            observer=MovingAverageMinMaxObserver, eps=2**-12
        )
    weight = replace(
        base.weight, qscheme=torch.per_tensor_symmetric, observer_or_fake_quant_ctr=observer
    )
    return replace(base, weight=weight)


def census(gm):
    """Count a graph's call_module nodes by module kind and its call_function nodes by op."""
    counts = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            if isinstance(module, FakeQuantizeBase):
                counts["fake quantize"] += 1
            elif isinstance(module, ObserverBase):
                counts["observer"] += 1
        elif node.op == "call_function":
            counts[node.target.__name__.split(".")[0]] += 1
    return counts


# %%
# Step 1 — The baseline: PTQ with per-tensor weights
# --------------------------------------------------
# Post-training quantization (PTQ), calibrated on all 200 calibration images.

prepared = prepare_pt2e(
    export_digits_model(outlier), X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=False))
)
with torch.no_grad():
    prepared(calibration_images)
ptq_model = convert_pt2e(prepared)
fp32_accuracy, ptq_accuracy = accuracy(outlier), accuracy(ptq_model)
print(f"fp32 {fp32_accuracy:.1%}   PTQ {ptq_accuracy:.1%}")
assert ptq_accuracy < fp32_accuracy - 0.10, "per-tensor PTQ loses more than 10 points"

# %%
# Step 2 — prepare_qat_pt2e
# -------------------------
# QAT exports the model in *train* mode. BatchNorm is the layer that cares, and torchao
# handles it (see the note below); here BatchNorm is first folded into the convs, with the
# statistics it has, so the graph holds convs only. ``prepare_qat_pt2e`` takes the same
# quantizer with the QAT config and returns the graph drawn below, its fake-quantize modules
# highlighted (drawn like observers).

started = time.perf_counter()
qat_model = prepare_qat_pt2e(
    export_digits_model(fold_batch_norm(outlier).train()),
    X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
)
print(f"prepare_qat_pt2e: {time.perf_counter() - started:.1f} s")
counts = census(qat_model)
print(dict(counts))
fake_quantize = [
    n.name
    for n in qat_model.graph.nodes
    if n.op == "call_module" and isinstance(qat_model.get_submodule(n.target), FakeQuantizeBase)
]
assert counts["observer"] == 0 and counts["fake quantize"] == len(fake_quantize) == 12
draw(qat_model, highlight=fake_quantize, title="Step 2: after prepare_qat_pt2e")

# %%
# What ``prepare_qat_pt2e`` does beyond ``prepare_pt2e``, first: **fake quantize instead of
# observers**. Each module records statistics like an observer, and also rounds its input to
# the int8 grid and back, in float, so training sees the rounding. Backward lets the gradient
# through the rounding as if it were not there (the straight-through estimator). The fake
# quantize on the input ``x`` shows it: its output is on the grid of its scale, not the input.

input_node = next(
    n for n in qat_model.graph.nodes if n.name in fake_quantize and n.args[0].op == "placeholder"
)
# A copy: calling the model's own module would add x to the statistics it trains with.
input_fq = copy.deepcopy(qat_model.get_submodule(input_node.target))
x = calibration_images[:4]
with torch.no_grad():
    rounded = input_fq(x)
steps = rounded / input_fq.scale + input_fq.zero_point
print(
    f"{input_node.name}: scale {input_fq.scale.item():.6f}, "
    f"{(rounded != x).float().mean():.0%} of the pixels moved"
)
assert not torch.equal(rounded, x), "fake quantize changes values"
torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3)

# %%
# .. note::
#
#    Second: **conv + BatchNorm kept, not folded.** ``prepare_pt2e`` folds BatchNorm into the
#    conv. On a model exported with its BatchNorms, ``prepare_qat_pt2e`` keeps each one, in
#    training mode, and rewrites each conv + BatchNorm into a subgraph that scales the conv's
#    weight by γ/√(running_var + ε) *before* the weight's fake quantize (so the weight that is
#    rounded is the folded one), divides the conv's output back, and applies BatchNorm with
#    the batch's statistics. ``convert_pt2e`` then folds each BatchNorm into its conv.
#    torchao finds these subgraphs by exporting many small pattern graphs, at prepare and
#    again at convert; on this shared two-core machine that took more than a minute, so this
#    page folds BatchNorm first. Exercise 2 runs the BatchNorm path and times it.
#
# Third: **no train() or eval()**, step 3.

# %%
# Step 3 — Train with fake quantization
# -------------------------------------
# An exported model does not know ``train()`` and ``eval()``: a BatchNorm or a dropout in its
# graph is one op whose training flag is an argument, and the graph that
# ``prepare_qat_pt2e`` returns refuses both calls. ``move_exported_model_to_train`` and
# ``move_exported_model_to_eval`` rewrite those arguments in the graph instead.

with expect_error(NotImplementedError, match="move_exported_model_to_train"):
    qat_model.train()
move_exported_model_to_train(qat_model)
started = time.perf_counter()
losses = fit(qat_model, epochs=2, lr=1e-3)
seconds = time.perf_counter() - started
print(f"2 epochs of QAT in {seconds:.1f} s, losses {[round(v, 4) for v in losses]}")
move_exported_model_to_eval(qat_model)
print(f"fake-quantized model in eval mode: {accuracy(qat_model):.1%}")

# %%
# Step 4 — convert_pt2e: fake quantize → q/dq
# --------------------------------------------
# ``convert_pt2e`` turns every fake quantize into q/dq nodes, with the scale and zero point
# it ended training with; the weights become int8 constants. The result has the shape of the
# PTQ model of step 1: the same quantize nodes, no fake quantize left.

started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e: {time.perf_counter() - started:.1f} s")
after = census(converted)
print(dict(after))
assert after["fake quantize"] == 0, "no fake quantize left"
assert after["quantize_per_tensor"] == census(ptq_model)["quantize_per_tensor"], "as after PTQ"
draw(converted, title="Step 4: the QAT model after convert_pt2e")

# %%
# Step 5 — fp32, PTQ and QAT on the test set
# ------------------------------------------
# Same model, same per-tensor recipe, same 500 test images.

qat_accuracy = accuracy(converted)
table = {"fp32": fp32_accuracy, "PTQ (per-tensor)": ptq_accuracy, "QAT (per-tensor)": qat_accuracy}
for label, value in table.items():
    print(f"{label:<18}{value:>7.1%}")
assert qat_accuracy > ptq_accuracy + 0.10, "QAT wins back more than 10 points"
assert qat_accuracy > fp32_accuracy - 0.05, "and ends within 5 points of fp32"

fig, ax = plt.subplots(figsize=(6, 3))
ax.bar(list(table), [v * 100 for v in table.values()], color=["#999999", "#c44e52", "#4c72b0"])
ax.set_ylabel("test accuracy (%)")
ax.set_ylim(0, 100)
ax.set_title("Per-tensor int8: PTQ vs QAT")
fig.tight_layout()

# %%
# Summary
# -------
# - QAT = ``prepare_qat_pt2e`` → train with fake quantization → ``convert_pt2e``.
# - ``prepare_qat_pt2e`` puts fake quantize (observe + round, straight-through gradient) where
#   ``prepare_pt2e`` puts observers, and keeps conv + BatchNorm as a subgraph that
#   fake-quantizes the folded weight; ``convert_pt2e`` folds BatchNorm at the end (costly
#   here, so this page folded it first).
# - Switch modes with ``move_exported_model_to_train`` / ``move_exported_model_to_eval``.
#
# Exercises
# ---------
# 1. After QAT, does channel 0 still dominate the first conv's per-tensor int8 weight? Do the
#    other channels now use more than one step (int8 values beyond -1..1)? Predict both.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          conv = next(n for n in converted.graph.nodes if n.name == "conv2d")
#          int8_weight = getattr(converted, conv.args[1].args[0].target)
#          peaks = int8_weight.abs().amax(dim=(1, 2, 3))
#          print(f"int8 peaks per channel: {peaks.tolist()}")
#          assert peaks.argmax() == 0, "channel 0 still has the largest weights"
#          assert peaks[1:].max() <= 1, "the others still round to -1, 0 or 1"
#          # QAT did not rescue conv1: the layers after it learned to live with its rounding.
#
# 2. Run the BatchNorm path: export ``outlier`` (not folded) in train mode, call
#    ``prepare_qat_pt2e``, train one epoch, convert. Predict how many ``batch_norm`` nodes
#    the prepared graph has, and how many the converted one.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          started = time.perf_counter()
#          with_bn = prepare_qat_pt2e(
#              export_digits_model(copy.deepcopy(outlier).train()),
#              X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
#          )
#          print(f"prepare: {time.perf_counter() - started:.1f} s, {dict(census(with_bn))}")
#          assert census(with_bn)["batch_norm"] == 3, "kept, in training mode"
#          move_exported_model_to_train(with_bn)
#          fit(with_bn, epochs=1, lr=1e-3)
#          move_exported_model_to_eval(with_bn)
#          started = time.perf_counter()
#          folded_at_convert = convert_pt2e(with_bn)
#          print(f"convert: {time.perf_counter() - started:.1f} s")
#          assert census(folded_at_convert)["batch_norm"] == 0, "folded by convert_pt2e"
#          print(f"accuracy: {accuracy(folded_at_convert):.1%}")
#
# Further reading
# ---------------
# - `torchao: PT2E quantization-aware training
#   <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_qat.html>`_
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_
#
# Next
# ----
# This is the end of M04. The course map, on the site's front page, lists every module.
