"""
M04-1 Measuring the error
=========================

Until now every model of the course had random weights and was calibrated on noise. Here a
small CNN is trained on real handwritten digits, quantized to int8 with
``X86InductorQuantizer``'s defaults, and scored on 500 test images it never saw. Accuracy says
*whether* int8 costs something; the signal-to-quantization-noise ratio (SQNR) of every node
says *where*. You compute it by hand, node by node, and torchao's numeric debugger computes the
same numbers to the last bit.

**What you will learn**

- How to measure int8 accuracy on real data, and why one number is not enough
- Per-layer SQNR: the formula, and how to pair the nodes of a float and a quantized graph
- torchao's numeric debugger, and the BatchNorm trap it falls into

**Prerequisites**: :ref:`M01-1 · The PT2E flow end to end
<sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`, :ref:`M02-3 · convert by hand
<sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`; :ref:`M03-3 · speed and size
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>` (why int8 at all).
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``common.data`` holds the real data: scikit-learn's handwritten digits (1,797 images of
# 8×8 pixels, shipped inside the package, no download), cut once into a train split, a
# calibration set and a test set. ``train_digits_cnn`` trains a small CNN on the train split,
# on one thread with fixed seeds, so every build on this kind of CPU gets the same weights bit
# for bit. "This kind" means the same float kernels: AVX2 and AVX-512 kernels round sums
# differently and train slightly different weights, so the weights are cached per kernel path
# (``describe().kernel_path``), and every assert below holds on either path.

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.cpu import describe
from common.data import SPLITS, accuracy, digits, export_digits_model, train_digits_cnn
from common.numerics import DIGITS_CONV_BN, fold_batch_norm_modules, record, sqnr
from common.pt2e import quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

test_images, test_labels = digits("test")
calibration_images, _ = digits("calibration")
print(f"splits: {SPLITS}")
print(describe().verdict)


# %%
# Helpers: ``hand_sqnr`` is the formula of step 3, written out here because it is this
# lesson's subject. ``record`` (run a graph with ``torch.fx.Interpreter``, keep every node's
# output under its name), ``fold_batch_norm_modules`` (fold each BatchNorm module into the
# conv before it, in the eager model; ``DIGITS_CONV_BN`` names this model's pairs) and
# ``sqnr`` come from ``common.numerics``, where M04-2 finds them too.


def hand_sqnr(signal, noisy):
    """20·log10(‖signal‖ / ‖signal − noisy‖), in dB."""
    return 20 * torch.log10(
        torch.linalg.vector_norm(signal) / torch.linalg.vector_norm(signal - noisy)
    )


def quantize(gm):
    """PT2E with the x86 defaults, calibrated on the 200 calibration images."""
    prepared = prepare_pt2e(gm, x86_quantizer())
    with torch.no_grad():
        prepared(calibration_images)
    return convert_pt2e(prepared)


# %%
# Step 1 — Train the float model
# ------------------------------
# Six epochs over 1,097 training images. The first call trains and stores the weights under
# ``build/cache/`` (one file per kernel path); later calls (the other lessons, the other
# language's build) load them.

model = train_digits_cnn()
print(f"weights trained with the {describe().kernel_path} kernels")
fp32_accuracy = accuracy(model)
print(f"fp32 test accuracy: {fp32_accuracy:.1%} of {len(test_labels)} images")
assert fp32_accuracy > 0.95, "a small CNN reads 8×8 digits well"

# %%
# Step 2 — Quantize with the defaults and score it
# ------------------------------------------------
# ``export_digits_model`` exports with a dynamic batch dimension, so one graph takes the 200
# calibration images and the 500 test images. Then the PT2E flow of M01-1.

int8_model = quantize(export_digits_model(model))
int8_accuracy = accuracy(int8_model)
with torch.no_grad():
    changed = (model(test_images).argmax(1) != int8_model(test_images).argmax(1)).sum().item()
print(f"fp32 {fp32_accuracy:.1%}   int8 {int8_accuracy:.1%}   predictions changed: {changed}")
assert abs(int8_accuracy - fp32_accuracy) <= 0.01, "the defaults cost at most 1 point here"
# sphinx_gallery_start_ignore
from common.results import publish  # the landing page's figures

publish("test_images", len(test_labels))
publish("fp32_accuracy", fp32_accuracy)
publish("int8_accuracy", int8_accuracy)
# sphinx_gallery_end_ignore
draw(int8_model, title="Step 2: the int8 digits model (X86InductorQuantizer defaults)")

# %%
# Step 3 — SQNR by hand, node by node
# -----------------------------------
# Accuracy counts only the images that flip. SQNR measures how far every intermediate tensor
# moved: with ``x`` a node's output in one graph and ``x̂`` in the other,
# ``SQNR = 20·log10(‖x‖ / ‖x − x̂‖)`` dB.
# Each 6 dB halves the error; 40 dB means an error of 1 % of the signal.
#
# ``convert_pt2e`` keeps the names of the original nodes, so pairing them is a lookup by name.
# But ``prepare_pt2e`` folded the BatchNorms into the convs, so the float graph's ``conv2d``
# (before BatchNorm) and the int8 graph's ``conv2d`` (BatchNorm included) compute different
# things. Folding BatchNorm in the eager model first makes the float graph comparable.

folded = fold_batch_norm_modules(model, pairs=DIGITS_CONV_BN)
with torch.no_grad():
    torch.testing.assert_close(folded(test_images), model(test_images), rtol=0, atol=1e-4)
float_graph = export_digits_model(folded)
float_outputs = record(float_graph, test_images)
int8_outputs = record(int8_model, test_images)
layers = [n.name for n in float_graph.graph.nodes if n.op == "call_function"]
by_hand = {name: hand_sqnr(int8_outputs[name], float_outputs[name]).item() for name in layers}
for name, value in by_hand.items():
    print(f"{name:>12}  {value:6.2f} dB")

# %%
# The order of the arguments matters a little: the numeric debugger of step 4 passes the
# *quantized* tensor as the signal, so ``by_hand`` did too. With the float tensor as the
# signal, as textbooks write it, no node moves by more than 0.05 dB. The other lessons use
# ``common.numerics.sqnr``, which is torchao's ``compute_error``: the numbers are the same, bit
# for bit.

textbook = {name: hand_sqnr(float_outputs[name], int8_outputs[name]).item() for name in layers}
gap = max(abs(textbook[name] - by_hand[name]) for name in layers)
print(f"largest difference between the two conventions: {gap:.4f} dB")
assert gap < 0.05, "at these SQNRs the choice of signal hardly matters"
assert all(
    by_hand[name] == sqnr(int8_outputs[name], float_outputs[name]).item() for name in layers
), "the shared sqnr is this one"

# %%
# Step 4 — torchao's numeric debugger
# -----------------------------------
# The debugger does the same with four calls: ``generate_numeric_debug_handle`` marks the
# exported program, ``prepare_for_propagation_comparison`` puts a logger after every node of
# a copy, ``extract_results_from_loggers`` collects what they saw, and ``compare_results``
# pairs the nodes. The float and the int8 model must come from the same marked export.
# ``debugger_sqnr`` makes the four calls for a float model and its int8 version; this step
# calls it twice.


def debugger_sqnr(float_model):
    """Each node's SQNR from the numeric debugger: ``float_model`` against its int8 version."""
    batch = torch.export.Dim("batch")
    program = torch.export.export(float_model, (test_images[:2],), dynamic_shapes=({0: batch},))
    generate_numeric_debug_handle(program)
    marked = program.module()
    float_logged = prepare_for_propagation_comparison(marked)  # a copy: ``marked`` stays clean
    int8_logged = prepare_for_propagation_comparison(quantize(marked))
    with torch.no_grad():
        float_logged(test_images)
        int8_logged(test_images)
    comparison = compare_results(
        extract_results_from_loggers(float_logged), extract_results_from_loggers(int8_logged)
    )
    return {info.name: summary.results[0].sqnr.item() for info, summary in comparison.items()}


# %%
# The folded model against its int8 version, as compared by hand in step 3:

debugger = debugger_sqnr(folded)
print(f"{len(debugger)} nodes compared: {list(debugger)}")

# %%
# The debugger pairs a node of the int8 graph with the float node it came from (it follows
# ``node.meta["from_node"]`` back to the export, and names the pair after the original node).
# It compared exactly the nodes compared by hand, and found exactly the same SQNRs.

assert set(debugger) == set(by_hand), "the same nodes"
assert all(debugger[name] == by_hand[name] for name in by_hand), "the same numbers, bit for bit"
print("debugger == by hand for every node")

# %%
# The BatchNorm trap. Give the debugger the model *with* BatchNorm, as you would at first: it
# still pairs ``conv2d`` with ``conv2d``, and reports an SQNR no quantizer could cause. The
# low numbers are BatchNorm, not int8.

trap = debugger_sqnr(model)
print(
    f"conv2d: {trap['conv2d']:.2f} dB with BatchNorm in the float model, "
    f"{by_hand['conv2d']:.2f} dB with it folded"
)
assert trap["conv2d"] < 10 < by_hand["conv2d"], "an unfolded reference makes conv2d look broken"

# %%
# Step 5 — Chart the SQNR per node
# --------------------------------
# SQNR is not a running total that only falls: it is lowest after the third conv
# (``conv2d_2``) and higher again after the two linear layers. The lowest bar is the node to
# look at first when accuracy drops; M04-2 shows why one number per tensor can still mislead.

worst = min(by_hand, key=by_hand.get)
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.bar(layers, [by_hand[name] for name in layers], color="#4c72b0")
ax.bar([worst], [by_hand[worst]], color="#c44e52")
ax.set_ylabel("SQNR (dB)")
ax.set_title("SQNR per node, int8 vs float, 500 test images")
ax.tick_params(axis="x", rotation=45)
fig.tight_layout()
print(f"worst node: {worst} at {by_hand[worst]:.2f} dB")
assert worst == "conv2d_2" and by_hand["linear"] > by_hand[worst], "lowest at the third conv"


# %%
# Summary
# -------
# - int8 with the x86 defaults keeps this model's accuracy: accuracy is the verdict, not the
#   diagnosis.
# - SQNR, 20·log10(‖x‖/‖x − x̂‖), measures every node; pair the nodes by name after folding
#   BatchNorm in the float model.
# - torchao's numeric debugger (``generate_numeric_debug_handle``,
#   ``prepare_for_propagation_comparison``, ``extract_results_from_loggers``,
#   ``compare_results``) gives the same numbers, and the same BatchNorm trap.
#
# Exercises
# ---------
# 1. Calibrate on the first 8 calibration images instead of 200. Predict: does the accuracy
#    move by more than a point? Does the worst SQNR rise or fall?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          prepared = prepare_pt2e(export_digits_model(model), x86_quantizer())
#          with torch.no_grad():
#              prepared(calibration_images[:8])
#          small = convert_pt2e(prepared)
#          small_outputs = record(small, test_images)
#          small_sqnr = {n: sqnr(small_outputs[n], float_outputs[n]).item() for n in layers}
#          print(f"accuracy {accuracy(small):.1%}, worst {min(small_sqnr.values()):.2f} dB")
#          assert abs(accuracy(small) - int8_accuracy) <= 0.01, "8 images are enough here"
#          assert min(small_sqnr.values()) < min(by_hand.values()), "but the noise grows"
#
# 2. How much of the error at ``conv2d`` (the first conv) is the weights' own rounding? Compute
#    the SQNR of ``folded.conv1.weight`` against its per-channel int8 version. Predict: above or
#    below the node's SQNR?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          weight = folded.conv1.weight.detach()
#          scale = weight.abs().amax(dim=(1, 2, 3), keepdim=True) / 127.5
#          rounded = torch.clamp(torch.round(weight / scale), -128, 127) * scale
#          weight_sqnr = sqnr(weight, rounded).item()
#          print(f"weights alone: {weight_sqnr:.2f} dB, node: {by_hand['conv2d']:.2f} dB")
#          assert weight_sqnr > by_hand["conv2d"], "the input's rounding adds to the weights'"
#
# Further reading
# ---------------
# - `torchao: PT2E quantization <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `torch.export: dynamic shapes <https://docs.pytorch.org/docs/stable/export.html>`_
#
# Next
# ----
# The defaults lose nothing here. :ref:`M04-2 · Fixing it
# <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>` starts from a recipe that does lose
# accuracy, finds the culprit with these tools, and measures every fix.
