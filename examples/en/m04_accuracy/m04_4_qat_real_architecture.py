"""
M04-4 QAT on a real architecture
================================

M04-3 ran the QAT schedule on a three-conv CNN. This page runs it on torchvision's MobileNetV2
(depthwise convs, a BatchNorm after every conv, ReLU6), as ExecuTorch's ``XNNPACKQuantizer``
quantizes it for a phone: per-tensor int8 PTQ loses accuracy and QAT wins most of it back,
measured against the float model fine-tuned on the same schedule; a QAT run is saved part-way
and resumed bit for bit in a fresh process, and the QAT model runs as a ``.pte`` on the
ExecuTorch runtime.

**What you will learn**

- The BatchNorm handling QAT on MobileNetV2 needs: statistics updating, then frozen; what
  ``convert_pt2e`` folds
- What a QAT checkpoint holds, how to resume it in another process (in which order), and what
  breaks it; what QAT buys, against a float control picked on a validation split
- ``XNNPACKQuantizer`` with ``is_qat=True``, lowered to a ``.pte``

**Prerequisites**: :ref:`M04-3 · Quantization-aware training
<sphx_glr_lessons_m04_accuracy_m04_3_qat.py>`, :ref:`M06-2 · Lowering to ExecuTorch
<sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``common.qat.digits_mobilenet_v2`` is ``common.vision_models.MobileNetV2`` (torchvision's
# code) at ``width_mult=0.5`` with its first five stages, a one-channel first conv, behind a 4×
# nearest upscale: 8×8 digits become 32×32 images. It is trained for 8 epochs on one thread,
# deterministically, and cached by the code, the stack and the CPU's kernel path.

import contextlib
import copy
import io
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from common.charts import pad, use_course_style
from common.cpu import ISA_PATHS, describe, run_under_isa
from common.data import accuracy, digits, export_digits_model
from common.expect import expect_error
from common.pt2e import quiet
from common.qat import (
    batch_norms,
    fine_tune_float,
    fingerprint,
    freeze_batch_norm,
    prepare,
    qat_quantizer,
    train_digits_mobilenet_v2,
    train_epoch,
)
from common.viz import draw

quiet()
use_course_style()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.runtime import Runtime
from torchao.quantization.pt2e import (
    FakeQuantizeBase,
    disable_observer,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common.edge import to_executorch

print(describe().verdict)
trained = train_digits_mobilenet_v2()
trained_accuracy = accuracy(trained)

# %%
# Trained on 1,097 digits, this small MobileNetV2 quantizes well: its BatchNorm-folded
# weights and activations have no channel far larger than the rest. ImageNet-trained
# MobileNetV2s do (Nagel et al., *Data-free quantization*, 2019: per-tensor int8 PTQ of
# MobileNetV2 falls to chance). So, as M04-2 did, one such channel is planted, without changing
# what the model computes: channel 0 of the first block's output is multiplied by 100 (its
# BatchNorm's γ and β) and divided by 100 where the next conv reads it. The float model is the
# same; its int8 model is not.

FACTOR = 100
model = copy.deepcopy(trained)
with torch.no_grad():
    block_out = model.net.features[1].conv[2]  # the BatchNorm after block 1's projection
    block_out.weight[0] *= FACTOR
    block_out.bias[0] *= FACTOR
    model.net.features[2].conv[0][0].weight[:, 0] /= FACTOR  # block 2's expansion conv
fp32_accuracy = accuracy(model)
print(f"fp32 {trained_accuracy:.1%} trained, {fp32_accuracy:.1%} with the outlier channel")
assert abs(fp32_accuracy - trained_accuracy) <= 0.002, "the same function, in float"

# %%
# The QAT run's schedule below (four epochs, their learning rates) was picked on a validation
# split, never on the test split: the 200 calibration images, whose labels no training step
# reads. ``validation_accuracy`` measures a prepared model there after each epoch, on a copy
# moved to eval with its observers off: the training graph, BatchNorm on each batch's own
# statistics, is not the model one ships.


def validation_accuracy(gm: torch.fx.GraphModule) -> float:
    """A prepared model's accuracy on the validation split, measured on an eval-mode copy."""
    evaluated = copy.deepcopy(gm)
    evaluated.apply(disable_observer)  # evaluating must not move the scales
    move_exported_model_to_eval(evaluated)
    return accuracy(evaluated, "calibration")


# %%
# Step 1 — PTQ for the phone, per-tensor
# --------------------------------------
# ExecuTorch's ``XNNPACKQuantizer`` with per-tensor weights (``is_per_channel=False``),
# calibrated on the 200 calibration images. One scale per tensor is the recipe where the
# outlier costs most: every other channel of that activation gets a few int8 steps.

started = time.perf_counter()
ptq_prepared = prepare_pt2e(
    export_digits_model(model),
    XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False)),
)
with torch.no_grad():
    ptq_prepared(digits("calibration")[0])
ptq_model = convert_pt2e(ptq_prepared)
ptq_accuracy = accuracy(ptq_model)
print(f"PTQ {ptq_accuracy:.1%} ({time.perf_counter() - started:.0f} s)")
assert ptq_accuracy < fp32_accuracy - 0.03, "per-tensor PTQ loses more than 3 points"

# %%
# Step 2 — prepare_qat_pt2e with the QAT config
# ---------------------------------------------
# ``common.qat.prepare`` exports a copy in train mode with a dynamic batch and calls
# ``prepare_qat_pt2e`` with ``get_symmetric_quantization_config(is_per_channel=False,
# is_qat=True)``. Every BatchNorm stays in the graph, for training: MobileNetV2 has one after
# each conv.

started = time.perf_counter()
qat_model = prepare(model)
print(f"prepare_qat_pt2e: {time.perf_counter() - started:.0f} s")
modules = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
named = qat_model.named_modules(remove_duplicate=False)  # a shared fake quantize: each name
fake_quantize = [n for n, m in named if isinstance(m, FakeQuantizeBase)]
print(f"{len(batch_norms(qat_model))} BatchNorms in the graph ({modules} in the model)")
print(f"{len(fake_quantize)} fake quantize modules")
assert len(batch_norms(qat_model)) == modules

# %%
# The whole graph is long; one block shows what every conv became. Here is stage 2's second
# inverted residual block (expand 1×1, depthwise 3×3, project 1×1, plus its input), prepared
# alone the same way. Each conv's weight is multiplied by ``γ / √(running_var + ε)`` before
# its fake quantize, so the int8 grid it trains on is the one of the weight ``convert_pt2e``
# will fold; the conv's output is divided by it again, and the BatchNorm (highlighted)
# normalizes it: with the batch's own statistics while they update, with the running ones
# once frozen.

block = model.net.features[3]
channels = block.conv[0][0].in_channels
one_block = prepare_qat_pt2e(
    torch.export.export(copy.deepcopy(block).train(), (torch.randn(2, channels, 8, 8),)).module(),
    qat_quantizer(),
)
norms = [n.name for n in batch_norms(one_block)]
draw(one_block, highlight=norms, title="Step 2: one inverted residual block, prepared for QAT")
assert len(norms) == 3, "one BatchNorm per conv of the block"

# %%
# Step 3 — Epoch 1: everything updates; save a checkpoint
# -------------------------------------------------------
# Four epochs of QAT, one learning rate each. The first trains with the observers and the
# BatchNorm statistics updating (learning rate 3e-4, a tenth of the float training's: the
# model is already trained). The statistics move with the weights; how far the running
# variances moved is printed, with the validation accuracy. Then the run is saved as a
# checkpoint: the prepared model's ``state_dict`` and the optimizer's.

LEARNING_RATES = (3e-4, 3e-4, 1e-4, 3e-5)  # per epoch: one updating, three frozen
move_exported_model_to_train(qat_model)
optimizer = torch.optim.Adam(qat_model.parameters(), lr=LEARNING_RATES[0])
variances = [qat_model.get_buffer(n.args[4].target).clone() for n in batch_norms(qat_model)]
started = time.perf_counter()
losses = [train_epoch(qat_model, optimizer, epoch=0)]
seconds = time.perf_counter() - started
validation = [validation_accuracy(qat_model)]
print(f"epoch 1: loss {losses[0]:.4f}, validation {validation[0]:.1%} ({seconds:.0f} s)")
moved = [
    ((qat_model.get_buffer(n.args[4].target) - before).abs() / before).max().item()
    for n, before in zip(batch_norms(qat_model), variances, strict=True)
]
median = sorted(moved)[len(moved) // 2]
print(f"running variances moved by up to {max(moved):.0%} (median layer {median:.0%})")
assert max(moved) > 0.01, "the statistics follow the weights while they update"

folder = Path(tempfile.mkdtemp())
checkpoint = {"model": qat_model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}
torch.save(checkpoint, folder / "qat.pt")
state = checkpoint["model"]
kinds = {
    "parameters": sum(k in dict(qat_model.named_parameters()) for k in state),
    "BatchNorm statistics": sum(k.endswith(("running_mean", "running_var")) for k in state),
    "fake quantize scales": sum(k.endswith(".scale") for k in state),
    "fake quantize zero points": sum(k.endswith(".zero_point") for k in state),
    "observer min/max": sum(k.endswith(("min_val", "max_val")) for k in state),
}
for kind, count in kinds.items():
    print(f"{pad(kind, 28)}{count:>5}")
assert kinds["fake quantize scales"] == len(fake_quantize) > 0
assert kinds["BatchNorm statistics"] == 2 * modules

# %%
# Step 4 — Epochs 2 to 4: observers and BatchNorm statistics frozen
# ------------------------------------------------------------------
# The next epochs freeze both, as in M04-3: the scales stop moving, and every BatchNorm
# normalizes with the running statistics that ``convert_pt2e`` will fold into its conv, so
# the weights train against the fold the int8 model will have. ``disable_observer`` is a
# buffer (in the checkpoint); the BatchNorm freeze is an argument in the graph (not in it).
# The learning rate falls by about three each epoch, as fine-tuning schedules do: the last
# epochs take small steps. Each epoch prints its validation accuracy: the figures this
# schedule was picked on.

qat_model.apply(disable_observer)
freeze_batch_norm(qat_model)
scales = {k: v.clone() for k, v in qat_model.state_dict().items() if k.endswith(".scale")}
means = [qat_model.get_buffer(n.args[3].target).clone() for n in batch_norms(qat_model)]
for epoch in range(1, len(LEARNING_RATES)):
    for group in optimizer.param_groups:
        group["lr"] = LEARNING_RATES[epoch]
    losses.append(train_epoch(qat_model, optimizer, epoch=epoch))
    validation.append(validation_accuracy(qat_model))
    rate, loss, acc = LEARNING_RATES[epoch], losses[-1], validation[-1]
    print(f"epoch {epoch + 1}: learning rate {rate:.0e}, loss {loss:.4f}, validation {acc:.1%}")
    if epoch == 1:  # what the resumed run below must reproduce
        uninterrupted = fingerprint(qat_model.state_dict(), optimizer.state_dict())
after = qat_model.state_dict()
assert all(torch.equal(after[k], v) for k, v in scales.items()), "scales frozen"
now = [qat_model.get_buffer(n.args[3].target) for n in batch_norms(qat_model)]
assert all(torch.equal(a, b) for a, b in zip(means, now, strict=True)), "statistics frozen"

# %%
# Step 5 — Resume in a fresh process
# ----------------------------------
# A prepared QAT model cannot go through ``torch.export.save`` (its fake quantize modules are
# modules, not ops), and preparing again from the float model starts the scales and
# statistics afresh. What works: rebuild the prepared model *the same way* (same model code,
# same example input, same quantizer; its untrained weights do not matter, the checkpoint
# overwrites them), load both state dicts, apply the schedule's graph changes again, continue.
# The script below runs in a new Python: epoch 2 from the checkpoint, then a hash of every
# tensor of the model and the optimizer, to compare with the hash the run above took after
# its epoch 2.

RESUME = f"""
import torch
from torchao.quantization.pt2e import disable_observer, move_exported_model_to_train
from common.qat import digits_mobilenet_v2, fingerprint, freeze_batch_norm, prepare, train_epoch

checkpoint = torch.load({str(folder / "qat.pt")!r}, weights_only=True)
model = prepare(digits_mobilenet_v2())
model.load_state_dict(checkpoint["model"])
move_exported_model_to_train(model)
optimizer = torch.optim.Adam(model.parameters())
optimizer.load_state_dict(checkpoint["optimizer"])
model.apply(disable_observer)
freeze_batch_norm(model)
epoch = checkpoint["epoch"]
for group in optimizer.param_groups:
    group["lr"] = {LEARNING_RATES}[epoch]
train_epoch(model, optimizer, epoch=epoch)
result = fingerprint(model.state_dict(), optimizer.state_dict())
"""
print(RESUME)
started = time.perf_counter()
# the fresh process takes this one's float kernels: a cap set by ISA_PATHS' variables too
capped = [isa for isa, cap in ISA_PATHS.items() if cap.items() <= os.environ.items()]
resumed = run_under_isa(capped[0] if capped else "native", RESUME)["result"]
print(f"uninterrupted {uninterrupted[:16]}…\nresumed       {resumed[:16]}…")
print(f"(the fresh process took {time.perf_counter() - started:.0f} s)")
assert resumed == uninterrupted, "bit for bit"

# %%
# The script's order matters: ``move_exported_model_to_train`` before ``freeze_batch_norm``.
# On a freshly prepared graph, ``move_exported_model_to_train`` rewrites every BatchNorm to
# train mode (``training=True``): a freeze applied before it is undone without a word, and the
# resumed run would train on batch statistics. On a graph already in train mode the call does
# nothing; the run above made that move before its first epoch. Step 2's block, freshly
# prepared, in both orders, and the ``training`` flag of each of its BatchNorms:

wrong, right = copy.deepcopy(one_block), copy.deepcopy(one_block)
freeze_batch_norm(wrong)
move_exported_model_to_train(wrong)  # undoes the freeze
move_exported_model_to_train(right)
freeze_batch_norm(right)
for order, gm in (("freeze, then to train", wrong), ("to train, then freeze", right)):
    print(f"{pad(order, 24)}training = {[n.args[5] for n in batch_norms(gm)]}")
assert all(n.args[5] for n in batch_norms(wrong)), "the freeze undone: batch statistics"
assert not any(n.args[5] for n in batch_norms(right)), "frozen: running statistics"

# %%
# What breaks it: anything that changes the prepared graph changes its keys. The x86
# quantizer, for one, makes fewer fake quantizes, so the checkpoint has keys x86's graph lacks
# and no longer loads (a different example input or dynamic shape changes the graph the same
# way). The error names only those keys. Of the keys both have, 52 differ in shape: x86's
# weight observers are per-channel (``MovingAveragePerChannelMinMaxObserver``, one minimum
# and maximum per output channel), this checkpoint's per-tensor, and on load they take the
# checkpoint's shape and values without an error: even the load refused here has resized
# them. So matching keys are not enough: compare the fake quantizes' ``qscheme`` too.

other = prepare(
    model,
    X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True)),
)
saved, theirs = checkpoint["model"], other.state_dict()
shared = set(saved) & set(theirs)
reshaped = [k for k in shared if saved[k].shape != theirs[k].shape]
with expect_error(RuntimeError, match="state_dict") as caught:
    other.load_state_dict(saved)
extra = set(saved) ^ set(theirs)
print(f"{len(extra)} keys only one side has; {len(reshaped)} shared keys of another shape")
assert extra and len(reshaped) == 52 and "size mismatch" not in str(caught.error)
loaded = other.state_dict()
assert all(torch.equal(loaded[k], saved[k]) for k in reshaped), "refused, yet resized"

# %%
# Step 6 — convert_pt2e folds every BatchNorm
# -------------------------------------------
# ``convert_pt2e`` turns fake quantizes into q/dq and folds each BatchNorm into its conv with
# the frozen running statistics: the int8 weight of the first conv times its scale is
# ``w · γ / √(running_var + ε)`` to within half a step, once clamped to the int8 range (the
# scale froze after epoch 1; a weight that grew past it later is clamped).

move_exported_model_to_eval(qat_model)
qat_fq_accuracy = accuracy(qat_model)
before = {k: v.clone() for k, v in qat_model.state_dict().items()}
started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e: {time.perf_counter() - started:.0f} s")
print(f"BatchNorms: {len(variances)} before, {len(batch_norms(converted))} after")
assert not batch_norms(converted), "all folded"
conv = next(n for n in converted.graph.nodes if n.target is torch.ops.aten.conv2d.default)
int8_weight = getattr(converted, conv.args[1].args[0].target)
step = conv.args[1].args[1]
gamma = before["net.features.0.1.weight"] / torch.sqrt(
    before["net.features.0.1.running_var"] + 1e-5
)
folded = before["net.features.0.0.weight"] * gamma.reshape(-1, 1, 1, 1)
low, high = conv.args[1].args[3] * step, conv.args[1].args[4] * step  # the int8 range
clamped = ((folded < low) | (folded > high)).sum().item()
error = (int8_weight.float() * step - folded.clamp(low, high)).abs().max().item()
print(f"first conv: int8 × {step:.5f} vs the folded weight, max error {error / step:.2f} steps")
print(f"{clamped} weights grew past the frozen range after epoch 1 and were clamped")
assert error <= step / 2 + 1e-6

# %%
# Step 7 — The QAT model on a phone's runtime
# -------------------------------------------
# The q/dq model, lowered as in M06 (``XnnpackPartitioner``: it delegates the upscale too), is
# a ``.pte``. The ExecuTorch runtime classifies the 500 test images one at a time.

qat_accuracy = accuracy(converted)
print(f"fake quantize, BatchNorm apart: {qat_fq_accuracy:.1%}; q/dq, folded: {qat_accuracy:.1%}")
assert abs(qat_accuracy - qat_fq_accuracy) <= 0.02, "folding keeps what QAT trained"
images, labels = digits("test")
started = time.perf_counter()
pte = to_executorch(converted, (images[:1],), partitioner=XnnpackPartitioner()).buffer
print(f"lowered to a {len(pte) / 1024:.0f} KiB .pte in {time.perf_counter() - started:.0f} s")
with contextlib.redirect_stderr(io.StringIO()):  # the runtime's CPU-probing log lines
    program = Runtime.get().load_program(pte)
    method = program.load_method("forward")  # a Method does not keep its Program alive
predicted = torch.cat([method.execute([image[None]])[0] for image in images]).argmax(dim=1)
with torch.no_grad():
    reference = converted(images).argmax(dim=1)
pte_accuracy = (predicted == labels).float().mean().item()
agree = (predicted == reference).sum().item()
print(f"q/dq {qat_accuracy:.1%}, .pte {pte_accuracy:.1%}; same class for {agree} of {len(labels)}")
assert abs(pte_accuracy - qat_accuracy) <= 0.01 and agree >= 0.98 * len(labels)

# %%
# Not every class agrees: XNNPACK computes each int8 conv with integer accumulators and
# requantizes once, while the q/dq model computes in float between a dequantize and a
# quantize, so an output can land one int8 step apart. Behind a per-tensor scale stretched by
# the outlier, one step is wide enough to flip a few close calls.

# %%
# Step 8 — The float control: the same epochs in float
# ----------------------------------------------------
# QAT trained the model four epochs more than fp32 had, and part of what it gains may be that
# training, not the fake quantizes. The control is the fp32 model fine-tuned in float on the
# same schedule: the same four epochs, batches and learning rates, BatchNorm frozen after the
# first (``common.qat.fine_tune_float``; its weights are cached as the float model's are,
# keyed by what made them). Its validation accuracy after each epoch, beside QAT's:

tuned, tuned_validation = fine_tune_float(model, LEARNING_RATES)
for epoch, (ours, control) in enumerate(zip(validation, tuned_validation, strict=True)):
    print(f"epoch {epoch + 1}: validation accuracy, QAT {ours:.1%}, float fine-tune {control:.1%}")
tuned_accuracy = accuracy(tuned)

# %%
# Step 9 — fp32, the float fine-tune, PTQ and QAT
# -----------------------------------------------
# The same 500 test images for all four; the numbers are this build's. PTQ is measured
# against fp32, the model it quantizes; QAT against the float fine-tune, trained as long.
# Asserted, with margins that held on several seeds and on both kernel paths: QAT above PTQ by
# more than three points, and QAT wins back at least two thirds of the way from PTQ to the
# float fine-tune. The rest is what per-tensor int8 still costs after QAT. How much that is
# depends on the float model, and another kernel path trains another one (the weights are
# cached per path): the four figures move by a few of the 500 images.

table = {
    "fp32": fp32_accuracy,
    "fp32, same epochs": tuned_accuracy,
    "PTQ (per-tensor)": ptq_accuracy,
    "QAT (per-tensor)": qat_accuracy,
}
for label, value in table.items():
    print(f"{pad(label, 20)}{value:>7.1%}")
assert qat_accuracy > ptq_accuracy + 0.03, "QAT above PTQ, by more than three points"
won, way = qat_accuracy - ptq_accuracy, tuned_accuracy - ptq_accuracy
print(f"QAT won back {won / way:.0%} of the way from PTQ to the float fine-tune")
assert won >= 2 / 3 * way, "QAT wins back two thirds of the way to the float fine-tune"
# sphinx_gallery_start_ignore
from common.results import publish  # the landing page's figures

publish("fp32_accuracy", fp32_accuracy)
publish("fp32_tuned_accuracy", tuned_accuracy)
publish("ptq_accuracy", ptq_accuracy)
publish("qat_accuracy", qat_accuracy)
# sphinx_gallery_end_ignore

fig, ax = plt.subplots(figsize=(6, 3))
colors = ["#999999", "#555555", "#c44e52", "#4c72b0"]
ax.bar(list(table), [v * 100 for v in table.values()], color=colors)
ax.set_ylabel("test accuracy (%)")
ax.set_ylim(0, 100)
ax.set_title("MobileNetV2, per-tensor int8 (XNNPACK)")
fig.tight_layout()

# %%
# One image is 0.2 points, and the difference of two accuracies is itself a difference of
# two counts: the images QAT gets right that the other model gets wrong, minus the reverse.
# Both counts, on the same test images:

with torch.no_grad():
    right = {
        "PTQ": ptq_model(images).argmax(dim=1) == labels,
        "the float fine-tune": tuned(images).argmax(dim=1) == labels,
    }
for rival, correct in right.items():
    gained = (reference.eq(labels) & ~correct).sum().item()
    lost = (~reference.eq(labels) & correct).sum().item()
    print(f"QAT vs {rival}: {gained} images right that {rival} gets wrong, {lost} the reverse")

# %%
# Summary
# -------
# - On MobileNetV2 the QAT schedule is M04-3's: an epoch with observers and BatchNorm
#   statistics updating, then both frozen, with a falling learning rate; ``convert_pt2e``
#   folds every BatchNorm with the frozen statistics.
# - A QAT checkpoint is the prepared model's ``state_dict`` (weights, BatchNorm statistics,
#   fake quantize scales, zero points, observer state) and the optimizer's. Resume by
#   preparing the same way, loading both, moving the graph to train, and only then applying
#   the schedule's graph changes again: the move undoes a BatchNorm freeze made before it.
#   Matching keys are not enough: compare the fake quantizes' ``qscheme``.
# - Measure QAT against the float model fine-tuned on the same schedule, and pick the
#   schedule on a validation split: here QAT wins back most of the way from PTQ to that
#   control, and the rest is what per-tensor int8 still costs.
# - ``XNNPACKQuantizer`` with ``is_qat=True`` lowers to a ``.pte`` like PTQ's model.
#
# Exercises
# ---------
# 1. How many of the checkpoint's fake quantizes were frozen when it was saved? Predict.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          saved = torch.load(folder / "qat.pt", weights_only=True)["model"]
#          enabled = [v for k, v in saved.items() if k.endswith("observer_enabled")]
#          print(f"{sum(int(v) for v in enabled)} of {len(enabled)} observing")
#          assert enabled and all(int(v) == 1 for v in enabled), "saved before the freeze"
#
# 2. Adam keeps two running averages per parameter. How many tensors does the checkpoint's
#    optimizer state hold, and how do their shapes compare with the parameters'? Predict.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          saved = torch.load(folder / "qat.pt", weights_only=True)["optimizer"]["state"]
#          averages = [s[k] for s in saved.values() for k in ("exp_avg", "exp_avg_sq")]
#          print(f"{len(saved)} parameters, {len(averages)} running averages")
#          assert len(saved) == kinds["parameters"] and len(averages) == 2 * len(saved)
#          assert all(s["exp_avg"].shape == s["exp_avg_sq"].shape for s in saved.values())
#
# Next
# ----
# The course map, on the site's front page, lists every module.
