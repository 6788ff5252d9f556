"""
M04-3 Quantization-aware training
=================================

M04-2 fixed the outlier model by changing the recipe. When the recipe is fixed, say a backend
that only has per-tensor weights, change the weights instead: quantization-aware training (QAT)
fine-tunes the model with the int8 rounding already in its forward pass, so training learns
weights that survive it. ``prepare_qat_pt2e`` puts fake-quantize modules where
``prepare_pt2e`` puts observers, keeps BatchNorm alive with batch statistics, and
``convert_pt2e`` folds it away at the end. Two epochs win back what post-training
quantization lost.

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

prepared = prepare_pt2e(export_digits_model(outlier), X86InductorQuantizer().set_global(
    per_tensor_recipe(is_qat=False)))
with torch.no_grad():
    prepared(calibration_images)
ptq_model = convert_pt2e(prepared)
fp32_accuracy, ptq_accuracy = accuracy(outlier), accuracy(ptq_model)
print(f"fp32 {fp32_accuracy:.1%}   PTQ {ptq_accuracy:.1%}")
assert ptq_accuracy < fp32_accuracy - 0.10, "per-tensor PTQ loses more than 10 points"

# %%
# Step 2 — prepare_qat_pt2e
# -------------------------
# QAT starts from a model exported in *train* mode, so its BatchNorms use the statistics of
# each batch. ``prepare_qat_pt2e`` takes the same quantizer (with the QAT config) and returns
# the graph drawn below; fake-quantize modules are drawn like observers, highlighted here.

started = time.perf_counter()
qat_model = prepare_qat_pt2e(
    export_digits_model(copy.deepcopy(outlier).train()),
    X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
)
print(f"prepare_qat_pt2e: {time.perf_counter() - started:.1f} s")
counts = census(qat_model)
print(dict(counts))
fake_quantize = [
    n.name for n in qat_model.graph.nodes
    if n.op == "call_module" and isinstance(qat_model.get_submodule(n.target), FakeQuantizeBase)
]
draw(qat_model, highlight=fake_quantize, title="Step 2: after prepare_qat_pt2e")

# %%
# What ``prepare_qat_pt2e`` does beyond ``prepare_pt2e``:
#
# 1. **Fake quantize instead of observers.** Each module records statistics like an observer,
#    but also rounds its input to the int8 grid and back in the forward pass, so training sees
#    the rounding. Its backward passes the gradient straight through the rounding.
# 2. **conv + BatchNorm kept, not folded.** ``prepare_pt2e`` folds BatchNorm into the conv.
#    Here BatchNorm stays (three ``batch_norm`` nodes, in training mode), and each conv's weight
#    is first scaled by γ/√(running_var + ε) (the ``mul``) so the *folded* weight is what gets
#    fake-quantized; the conv's output is divided back (``div``) before BatchNorm.
# 3. **No train()/eval().** The returned graph refuses them (step 3).

assert counts["observer"] == 0 and counts["fake quantize"] == 12
assert counts["batch_norm"] == 3, "one BatchNorm per conv, still there"
for n in qat_model.graph.nodes:
    if n.op == "call_function" and n.target.__name__.startswith("conv2d"):
        weight_fq = qat_model.get_submodule(n.args[1].target)
        assert isinstance(weight_fq, FakeQuantizeBase), "every conv reads a fake-quantized weight"
        assert n.args[1].args[0].target.__name__.startswith("mul"), "of the BN-scaled weight"

x = calibration_images[:4]
input_fq = qat_model.get_submodule(next(n for n in qat_model.graph.nodes if n.op == "placeholder").next.target)
with torch.no_grad():
    rounded = input_fq(x)
steps = (rounded / input_fq.scale - input_fq.zero_point)
print(f"input fake quantize: scale {input_fq.scale.item():.6f}, changed {(rounded != x).float().mean():.0%} of the pixels")
assert not torch.equal(rounded, x) and torch.equal(steps, steps.round()), "on the grid, not equal"

# %%
# Step 3 — Train with fake quantization
# -------------------------------------
# An exported model does not know ``train()`` and ``eval()``: its BatchNorm is one
# ``batch_norm`` op whose training flag is an argument. ``move_exported_model_to_train`` and
# ``move_exported_model_to_eval`` rewrite that argument (and dropout's) in the graph.

with expect_error(NotImplementedError, match="move_exported_model_to_train"):
    qat_model.train()
move_exported_model_to_train(qat_model)
started = time.perf_counter()
losses = fit(qat_model, epochs=2, lr=1e-3)
print(f"2 epochs of QAT in {time.perf_counter() - started:.1f} s, losses {[round(v, 4) for v in losses]}")
move_exported_model_to_eval(qat_model)
print(f"fake-quantized model in eval mode: {accuracy(qat_model):.1%}")

# %%
# Step 4 — convert_pt2e: fold BatchNorm, fake quantize → q/dq
# ----------------------------------------------------------
# ``convert_pt2e`` first turns every fake quantize into q/dq nodes, then recognizes the QAT
# conv + BatchNorm subgraphs and folds each BatchNorm into its conv, with the running
# statistics learned during training. The result has the shape of a PTQ model.

started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e: {time.perf_counter() - started:.1f} s")
after = census(converted)
print(dict(after))
assert after["batch_norm"] == 0 and after["fake quantize"] == 0, "BatchNorm folded, no fake quantize"
assert after["conv2d"] == 3 and after["quantize_per_tensor"] == census(ptq_model)["quantize_per_tensor"]
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
#   fake-quantizes the folded weight; ``convert_pt2e`` folds BatchNorm at the end.
# - Switch modes with ``move_exported_model_to_train`` / ``move_exported_model_to_eval``.
#
# Exercises
# ---------
# 1. After ``convert_pt2e``, is the first conv's int8 weight still dominated by channel 0?
#    Predict the ratio of channel 0's largest weight to the others' after QAT.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          conv = next(n for n in converted.graph.nodes if n.name.startswith("conv2d"))
#          weight = conv.args[1]  # the dequantize of the int8 weight
#          values = converted.get_submodule("")  # the GraphModule itself
#          int8 = getattr(values, weight.args[0].target)
#          peaks = int8.abs().amax(dim=(1, 2, 3)).float()
#          print(f"int8 peaks per channel: {peaks.tolist()}")
#          assert peaks[0] == 127, "channel 0 still sets the scale"
#          assert peaks[1:].max() > 1, "but the others now use more than one step"
#
# 2. Train for one epoch instead of two. Predict: still more than 10 points above PTQ?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          short = prepare_qat_pt2e(
#              export_digits_model(copy.deepcopy(outlier).train()),
#              X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
#          )
#          move_exported_model_to_train(short)
#          fit(short, epochs=1, lr=1e-3)
#          move_exported_model_to_eval(short)
#          one_epoch = accuracy(convert_pt2e(short))
#          print(f"one epoch: {one_epoch:.1%}")
#          assert one_epoch > ptq_accuracy + 0.10
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
