"""
M04-3 Quantization-aware training
=================================

M04-2 fixed the outlier model by changing the recipe or the weights by hand. Quantization-aware
training (QAT) lets training change the weights: it fine-tunes the model with the int8
rounding already in its forward pass. ``prepare_qat_pt2e`` puts fake-quantize modules where
``prepare_pt2e`` puts observers and keeps BatchNorm alive for training; ``convert_pt2e`` folds
it away at the end. QAT needs a schedule, and this page runs it: observers and BatchNorm
statistics update first, both are frozen for the last epoch, and the observers are switched
off before any evaluation, so the test set, which scores the model, never sets a scale. How
much of what PTQ lost QAT wins back is printed at the end, measured.

**What you will learn**

- What ``prepare_qat_pt2e`` does beyond ``prepare_pt2e``: fake quantize with a clipped
  straight-through gradient, conv + BatchNorm kept for training
- The QAT schedule: ``move_exported_model_to_train/eval``, BatchNorm statistics frozen,
  ``disable_observer`` before evaluating
- fp32 / PTQ / QAT accuracy on a test set that never touched a scale

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

from common.charts import use_course_style
from common.cpu import describe
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
    disable_observer,
    enable_observer,
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
print(describe().verdict)

# %%
# Helpers: ``per_tensor_recipe`` is the recipe; ``census`` counts a graph's nodes by kind;
# ``scales`` reads every fake quantize's scale; ``batch_norms`` finds the BatchNorm nodes,
# ``running_means`` reads their statistics, and ``freeze_batch_norm`` sets their ``training``
# argument to False, so they normalize with their running statistics and stop updating them
# (torchao's QAT tutorial does the same).


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


def scales(gm):
    """{fake quantize name: a copy of its scale}."""
    return {
        name: module.scale.clone()
        for name, module in gm.named_modules()
        if isinstance(module, FakeQuantizeBase)
    }


def batch_norms(gm):
    """The graph's BatchNorm nodes; args: input, weight, bias, mean, var, training, ..."""
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.batch_norm.default]


def running_means(gm):
    """A copy of every BatchNorm's running mean (its statistics live as buffers)."""
    return [gm.get_buffer(node.args[3].target).clone() for node in batch_norms(gm)]


def freeze_batch_norm(gm):
    """Make every BatchNorm of ``gm`` use, and keep, its running statistics."""
    for node in batch_norms(gm):
        node.args = (*node.args[:5], False, *node.args[6:])
    gm.recompile()


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
assert ptq_accuracy < fp32_accuracy - 0.03, "per-tensor PTQ loses more than 3 points"

# %%
# Step 2 — prepare_qat_pt2e
# -------------------------
# QAT exports the model in *train* mode, BatchNorms included. ``prepare_qat_pt2e`` takes the
# same quantizer with the QAT config and returns the graph drawn below, its fake-quantize
# modules highlighted (drawn like observers). It finds each conv + BatchNorm by matching
# pattern graphs that torchao exports on the spot, which is why it takes a while; the time is
# printed with the thread count, since it depends on the machine and its load.

started = time.perf_counter()
qat_model = prepare_qat_pt2e(
    export_digits_model(copy.deepcopy(outlier).train()),
    X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
)
print(
    f"prepare_qat_pt2e: {time.perf_counter() - started:.1f} s on {torch.get_num_threads()} threads"
)
counts = census(qat_model)
print(dict(counts))
fake_quantize = [
    n.name
    for n in qat_model.graph.nodes
    if n.op == "call_module" and isinstance(qat_model.get_submodule(n.target), FakeQuantizeBase)
]
assert counts["observer"] == 0 and counts["fake quantize"] == len(fake_quantize)
assert counts["batch_norm"] == 3, "the three BatchNorms stay, for training"
draw(qat_model, highlight=fake_quantize, title="Step 2: after prepare_qat_pt2e")

# %%
# What ``prepare_qat_pt2e`` does beyond ``prepare_pt2e``, first: **fake quantize instead of
# observers**. Each module records statistics like an observer, and also rounds its input to
# the int8 grid and back, in float, so training sees the rounding. The fake quantize on the
# input ``x`` shows it: its output is on the grid of its scale, not the input.

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
# Backward, the rounding has no useful gradient (zero almost everywhere), so fake quantize
# uses the **straight-through estimator**, clipped: the gradient passes through unchanged
# where the value lands inside the int8 range, and is zero where it is clamped to the range's
# ends. Feed values from below to beyond the range and look at the gradient.

input_fq.apply(disable_observer)  # the copy's range stays as it is
probe = torch.linspace(-0.5, 1.5, 9, requires_grad=True)
input_fq(probe).sum().backward()
grid = torch.round(probe.detach() / input_fq.scale) + input_fq.zero_point
inside = (grid >= input_fq.quant_min) & (grid <= input_fq.quant_max)
print("input  " + " ".join(f"{v:5.2f}" for v in probe.tolist()))
print("grad   " + " ".join(f"{v:5.0f}" for v in probe.grad.tolist()))
assert torch.equal(probe.grad, inside.float()), "1 inside the range, 0 where clamped"
assert 0 < inside.sum() < len(probe), "both cases occur"

# %%
# .. note::
#
#    Second: **conv + BatchNorm kept, not folded.** ``prepare_pt2e`` folds BatchNorm into the
#    conv. ``prepare_qat_pt2e`` keeps each one, in training mode, and rewrites each
#    conv + BatchNorm into a subgraph that scales the conv's weight by γ/√(running_var + ε)
#    *before* the weight's fake quantize (so the weight that is rounded is the folded one),
#    divides the conv's output back, and applies BatchNorm with the batch's statistics.
#    ``convert_pt2e`` then folds each BatchNorm into its conv.
#
# Third: **no train() or eval()**, step 3.

# %%
# Step 3 — Train on the QAT schedule
# ----------------------------------
# An exported model does not know ``train()`` and ``eval()``: a BatchNorm or a dropout in its
# graph is one op whose training flag is an argument, and the graph that
# ``prepare_qat_pt2e`` returns refuses both calls. ``move_exported_model_to_train`` and
# ``move_exported_model_to_eval`` rewrite those arguments in the graph instead. Two epochs
# with everything updating: the weights, the observers inside the fake quantizes, the
# BatchNorm statistics.

with expect_error(NotImplementedError, match="move_exported_model_to_train"):
    qat_model.train()
move_exported_model_to_train(qat_model)
started = time.perf_counter()
losses = fit(qat_model, epochs=2, lr=1e-3)
print(f"2 epochs in {time.perf_counter() - started:.1f} s (fit trains on one thread)")

# %%
# The last epoch runs frozen, the usual QAT schedule (torchvision's QAT recipe freezes
# BatchNorm statistics and then the observers near the end): ``disable_observer`` stops every
# fake quantize from updating its scale and zero point (it still rounds), and
# ``freeze_batch_norm`` makes BatchNorm use its running statistics. The weights still learn;
# the scales and the statistics they were computed from hold still.

qat_model.apply(disable_observer)
freeze_batch_norm(qat_model)
trained_scales = scales(qat_model)
statistics = running_means(qat_model)
weights = copy.deepcopy(qat_model.state_dict())
started = time.perf_counter()
losses += fit(qat_model, epochs=1, lr=1e-3, seed=1)
seconds = time.perf_counter() - started
print(f"last epoch in {seconds:.1f} s, losses {[round(v, 4) for v in losses]}")
assert all(torch.equal(trained_scales[n], s) for n, s in scales(qat_model).items()), "frozen"
means = running_means(qat_model)
assert all(torch.equal(a, b) for a, b in zip(statistics, means, strict=True)), "BN frozen"
assert any(not torch.equal(weights[k], v) for k, v in qat_model.state_dict().items())

# %%
# Step 4 — Evaluate without touching the scales
# ---------------------------------------------
# Evaluation must not teach the model anything. ``move_exported_model_to_eval`` switches the
# BatchNorms to inference; it does not switch the observers off. To show what that would
# cost, a copy gets its observers back on (``enable_observer``), as they would be had step 3
# not disabled them. Both are scored on the test split, 500 images that neither training nor
# the scales saw.

move_exported_model_to_eval(qat_model)
leaky = copy.deepcopy(qat_model)
leaky.apply(enable_observer)
qat_fq_accuracy = accuracy(qat_model)
accuracy(leaky)
after, leaked = scales(qat_model), scales(leaky)
print(f"{'fake quantize':<28}{'trained':>10}{'observers off':>15}{'observers on':>14}")
for name, value in trained_scales.items():
    print(f"{name:<28}{value.item():>10.5f}{after[name].item():>15.5f}{leaked[name].item():>14.5f}")
moved = sum(not torch.equal(trained_scales[n], leaked[n]) for n in trained_scales)
print(f"evaluation moved {moved} of {len(trained_scales)} scales with the observers on, 0 off")
assert all(torch.equal(trained_scales[n], after[n]) for n in after), "no scale changes"
assert moved > 0, "with the observers on, the test set rewrites scales"

# %%
# Step 5 — convert_pt2e: fake quantize → q/dq
# --------------------------------------------
# ``convert_pt2e`` turns every fake quantize into q/dq nodes, with the scale and zero point
# it ended training with, folds each BatchNorm into its conv, and makes the weights int8
# constants. The result has the shape of the PTQ model of step 1: the same quantize nodes,
# no fake quantize and no BatchNorm left.

started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e: {time.perf_counter() - started:.1f} s on {torch.get_num_threads()} threads")
counts = census(converted)
print(dict(counts))
assert counts["fake quantize"] == 0 and counts["batch_norm"] == 0, "rounded and folded"
assert counts["quantize_per_tensor"] == census(ptq_model)["quantize_per_tensor"], "as after PTQ"
draw(converted, title="Step 5: the QAT model after convert_pt2e")

# %%
# Step 6 — fp32, PTQ and QAT on the test set
# ------------------------------------------
# Same model, same per-tensor recipe, same 500 test images. The numbers below are this
# build's. What is asserted, that QAT wins back at least half of what PTQ lost, held on the
# trainings checked before it was written (seeds 0 and 3 natively, seed 0 under AVX2
# kernels); how close QAT comes to fp32 varied with the seed, so it is printed, not asserted.

qat_accuracy = accuracy(converted)
table = {"fp32": fp32_accuracy, "PTQ (per-tensor)": ptq_accuracy, "QAT (per-tensor)": qat_accuracy}
for label, value in table.items():
    print(f"{label:<18}{value:>7.1%}")
lost, won = fp32_accuracy - ptq_accuracy, qat_accuracy - ptq_accuracy
print(f"PTQ lost {lost * 100:.1f} points; QAT won back {won * 100:.1f} of them")
assert won > lost / 2, "QAT wins back at least half of what PTQ lost"
# sphinx_gallery_start_ignore
from common.results import publish  # the landing page's figures

publish("fp32_accuracy", fp32_accuracy)
publish("ptq_accuracy", ptq_accuracy)
publish("qat_accuracy", qat_accuracy)
# sphinx_gallery_end_ignore

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
# - ``prepare_qat_pt2e`` puts fake quantize (observe + round; gradient straight through
#   inside the range, zero outside) where ``prepare_pt2e`` puts observers, and keeps
#   conv + BatchNorm as a subgraph that fake-quantizes the folded weight; ``convert_pt2e``
#   folds BatchNorm at the end.
# - The schedule: train with everything updating, then freeze BatchNorm statistics and
#   observers (``disable_observer``) for the last epoch; switch modes with
#   ``move_exported_model_to_train`` / ``move_exported_model_to_eval``; never evaluate with
#   the observers on, or the evaluation data sets the scales.
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
#          conv2d = torch.ops.aten.conv2d.default
#          conv = next(n for n in converted.graph.nodes if n.target is conv2d)
#          int8_weight = getattr(converted, conv.args[1].args[0].target)
#          peaks = int8_weight.abs().amax(dim=(1, 2, 3))
#          print(f"int8 peaks per channel: {peaks.tolist()}")
#          assert peaks.argmax() == 0, "channel 0 still has the largest weights"
#          assert peaks[1:].max() <= 2, "the others still use a step or two"
#          # QAT did not rescue conv1: the layers after it learned to live with its rounding.
#
# 2. Forget ``move_exported_model_to_eval``: score a copy of the model in train mode, its
#    observers still off. Predict: do the scales move? Do the BatchNorm statistics?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          forgot = copy.deepcopy(leaky)  # step 5 turned qat_model itself into the int8 model
#          forgot.apply(disable_observer)
#          move_exported_model_to_train(forgot)  # BatchNorm back to batch statistics
#          held, before = scales(forgot), running_means(forgot)
#          accuracy(forgot)
#          assert all(torch.equal(held[n], s) for n, s in scales(forgot).items()), "scales held"
#          now = running_means(forgot)
#          assert not any(torch.equal(a, b) for a, b in zip(before, now)), "BN learned the test set"
#          print("scales held; the BatchNorm statistics moved to the test set's")
#
# 3. ``leaky`` is still the QAT graph (step 4 copied it before convert). Predict the bias each
#    of its convs runs with: its own, or something else? And where does its own bias go?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          aten = torch.ops.aten
#          for conv in leaky.graph.find_nodes(op="call_function", target=aten.conv2d.default):
#              zeros, own_bias = conv.args[2], conv.args[2].args[0]
#              (divide,) = conv.users  # the output, divided by γ/√(running_var + ε)
#              (add,) = divide.users
#              (batch_norm,) = add.users
#              print(f"{conv.name}: bias {zeros.name}; {own_bias.name} added by {add.name}")
#              assert zeros.target == aten.zeros_like.default, "the conv adds a bias of zeros"
#              assert divide.target == aten.div.Tensor and add.target == aten.add.Tensor
#              assert add.args[1].args[0] is own_bias, "its own bias: added after the division"
#              assert batch_norm.target == aten.batch_norm.default, "then BatchNorm"
#          # Dividing the output by γ/√(var + ε) undoes the scaled weight; a bias inside the
#          # conv would be divided too, so it goes in after the division.
#
# Further reading
# ---------------
# - `torchao: PT2E quantization-aware training
#   <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_qat.html>`_
# - `torchvision's QAT reference script (observer and BatchNorm freezing)
#   <https://github.com/pytorch/vision/blob/main/references/classification/train_quantization.py>`_
#
# Next
# ----
# :ref:`M04-4 · QAT on a real architecture
# <sphx_glr_lessons_m04_accuracy_m04_4_qat_real_architecture.py>` takes the same schedule to
# torchvision's MobileNetV2, quantized for a phone, and resumes it from a checkpoint in a fresh
# process.
