"""
Quickstart: a trained model to int8 in one page
===============================================

A small CNN trained on real handwritten digits goes through PT2E quantization — export,
``X86InductorQuantizer``, calibration, ``convert_pt2e`` — and ``torch.compile`` with freezing
turns it into real int8 kernels. Then it is measured against the float model: accuracy on 500
images it never saw, speed on this CPU, and size on disk. Every line of this page is a module of
the course: each step links to the lesson that explains it.

**What you will learn**

- The whole PT2E flow in six steps, and which lesson explains each one
- What int8 gives a small model on this CPU: accuracy, speed and size, measured

**Prerequisites**: none; PyTorch basics. ``torch.compile`` needs a C++ compiler (``g++``).
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Step 1 — Train a float model
# ----------------------------
# ``common.data`` holds scikit-learn's bundled handwritten digits (8×8 pixels, no download)
# and a CNN trained on them deterministically; the weights are cached under ``build/``.
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# introduces them.

import io
import warnings
import zipfile

import torch
from torch._dynamo.utils import counters

from common.data import accuracy, digits, export_digits_model, train_digits_cnn
from common.pt2e import quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw

quiet()  # the stack's known import noise (torchao's CUDA-only kernels, deprecations)
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

model = train_digits_cnn()
images, labels = digits("test")

# %%
# Step 2 — Export, prepare, calibrate, convert
# --------------------------------------------
# ``torch.export`` turns the model into a graph
# (:ref:`M00-1 · getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`).
# ``prepare_pt2e`` asks the quantizer what to quantize and inserts observers
# (:ref:`M01-1 · the PT2E flow <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`,
# :ref:`M02-1 · what a quantizer writes
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`); 200 calibration images
# give them their ranges
# (:ref:`M01-3 · observers <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`);
# ``convert_pt2e`` turns the observers into quantize/dequantize nodes with int8 weights
# (:ref:`M01-2 · q/dq numbers <sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`,
# :ref:`M02-3 · convert by hand <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`).

prepared = prepare_pt2e(export_digits_model(model), x86_quantizer())
with torch.no_grad():
    prepared(digits("calibration")[0])
int8_model = convert_pt2e(prepared)
qdq = [n.name for n in int8_model.graph.nodes if "quantize_per" in str(n.target)]
draw(int8_model, highlight=qdq, title="The int8 model: quantize/dequantize around every layer")

# %%
# Step 3 — Compile with freezing
# ------------------------------
# The converted graph only *simulates* int8: its convs still run in float between the q/dq
# nodes. ``torch.compile`` with **freezing** treats the weights as constants, so inductor can
# replace each dq → conv → q group by a oneDNN int8 kernel
# (:ref:`M03-1 · the lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`);
# without freezing it does not, and int8 is no faster than float
# (:ref:`M03-3 · speed and size <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`).
# The float model is compiled the same way, for a fair race. The first call compiles.

torch._inductor.config.freezing = True
fast_fp32, fast_int8 = torch.compile(model), torch.compile(int8_model)
counters.clear()
int8_accuracy = accuracy(fast_int8)
packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
print(f"int8 convs inductor packed for oneDNN: {packed}")
assert packed == 3, "with freezing, all three convs run as oneDNN int8 kernels"

# %%
# Step 4 — Accuracy
# -----------------
# Both models classify the 500 test images.
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# finds where int8 loses precision, and
# :ref:`M04-2 · fixing it <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>` what to do when it
# costs too much.

fp32_accuracy = accuracy(fast_fp32)
print(f"test accuracy: fp32 {fp32_accuracy:.1%}, int8 {int8_accuracy:.1%}")
assert abs(int8_accuracy - fp32_accuracy) <= 0.01, "int8 costs at most one point here"

# %%
# Step 5 — Speed
# --------------
# Both compiled models run the 500 images as one batch, in interleaved rounds, one thread on
# a machine of two cores (M03-3 explains why). The numbers belong to the CPU the page ran on,
# described below the table: with **VNNI** (or AMX) oneDNN multiplies int8 several times
# faster than float; without it the lead stays modest. And this model is tiny (8×8 images),
# so overheads weigh as much as arithmetic: M03-3 times a bigger one.

timings = compare_speed({"fp32": fast_fp32, "int8": fast_int8}, (images,))
print(timings.table())
print(f"int8 takes {1 / timings.ratio('fp32', 'int8'):.2f}× the time of fp32")

# %%
# Step 6 — Size
# -------------
# ``torch.export.save`` writes the program and its weights into one zip file. The int8
# weights take one byte instead of four (plus a scale per output channel); the description
# of the graph, which has more nodes in int8, is stored beside them. ``saved`` exports a
# fresh ``GraphModule`` on one image, so the file keeps only the weights the graph reads
# (M03-3) and a small example input.


def saved(model) -> tuple[int, int]:
    """(file bytes, weight bytes) of ``model`` saved with ``torch.export.save``."""
    lean, buffer = torch.fx.GraphModule(model, model.graph), io.BytesIO()
    torch.export.save(torch.export.export(lean, (images[:1].clone(),)), buffer)
    entries = zipfile.ZipFile(buffer).infolist()
    weights = sum(e.file_size for e in entries if "/data/weights/weight_" in e.filename)
    return buffer.getbuffer().nbytes, weights


fp32_file, fp32_weights = saved(export_digits_model(model))
int8_file, int8_weights = saved(int8_model)
print(f"fp32: file {fp32_file / 1e3:.0f} kB, weights {fp32_weights / 1e3:.1f} kB")
print(f"int8: file {int8_file / 1e3:.0f} kB, weights {int8_weights / 1e3:.1f} kB")
assert int8_weights <= 0.35 * fp32_weights, "int8 weights take about a quarter of the bytes"

# %%
# Summary
# -------
# Six steps take a trained model to int8: export, prepare with a quantizer, calibrate,
# convert, then compile with freezing for real int8 kernels. The rest of the course opens
# each step: what the graph looks like after it (M00, M01), how to do it by hand (M02), what
# the compiler makes of it (M03), how to keep the accuracy (M04).
#
# - Saving and serving the int8 model, with AOTInductor:
#   :ref:`M03-4 · shipping an int8 model <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`.
# - Start the course from the graph up:
#   :ref:`M00-1 · getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.

# sphinx_gallery_start_ignore
# The next page of the build runs in this process: leave inductor as it was found.
torch._inductor.config.freezing = False
# sphinx_gallery_end_ignore
