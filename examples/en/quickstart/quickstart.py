"""
Quickstart: a trained model to int8 in one page
===============================================

A CNN trained on real handwritten digits goes through PT2E quantization — export,
``X86InductorQuantizer``, calibration, ``convert_pt2e`` — and ``torch.compile`` with freezing
turns it into real int8 kernels. Then it is measured against the float model: accuracy on 500
images it never saw, speed on this CPU (with the kernels each model really ran), and size on
disk. Every step of this page is a module of the course: each step links to the lesson that
explains it, and a checklist at the end lists the traps that make int8 no faster than float.

**What you will learn**

- The whole PT2E flow in six steps, and which lesson explains each one
- What int8 gives a model on this CPU: accuracy, speed and size, measured
- How to prove int8 kernels ran, and the five rules of a fair race

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
# uses the narrow one (8 to 16 channels); this page takes it eight times wider (64 and 128
# channels), since int8 kernels process 64 bytes at a time and a narrow layer leaves most
# of each vector empty.

import io
import warnings
import zipfile

import torch

from common.cpu import describe
from common.data import accuracy, digits, export_digits_model, train_digits_cnn
from common.pt2e import quiet, x86_quantizer
from common.timing import race
from common.viz import draw

quiet()  # the stack's known import noise (torchao's CUDA-only kernels, deprecations)
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

model = train_digits_cnn(width=8)
images, labels = digits("test")
print(f"conv2: {model.conv2}")

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
# Step 3 — Compile both models and race them
# ------------------------------------------
# The converted graph only *simulates* int8: its convs still run in float between the q/dq
# nodes. ``torch.compile`` with **freezing** treats the weights as constants, so inductor can
# replace each dq → conv → q group by a oneDNN int8 kernel
# (:ref:`M03-1 · the lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`).
# ``race`` compiles both models the way a fair timing needs (freezing for the whole process,
# under ``torch.no_grad()``, at the thread count it times with; the checklist below says why),
# times them in interleaved rounds on the 500 test images, and reads from the profiler which
# compute kernels each one ran, before and after the rounds.

raced = race({"fp32": model, "int8": int8_model}, (images,))
print(raced.table())

# %%
# The last two lines are the proof that counts: the int8 model ran oneDNN's int8 convs and
# linears and no float conv or matmul at all, while the float model ran float kernels only.

ran = raced.kernels["int8"]
assert sum(ran.int8.values()) == 5 and not ran.float, "3 convs + 2 linears, all int8"
assert not raced.kernels["fp32"].int8, "the float model ran no int8 kernel"

# %%
# Step 4 — Speed
# --------------
# The numbers belong to the CPU the page ran on, named in the line under the table's rows.
# With **VNNI** oneDNN multiplies int8 several times faster than float, and a model this wide
# runs about 2–3× faster in int8 (VNNI's ceiling is 4× per instruction: M03-3 says where the
# rest goes). With **AMX**, int8 runs on tiles, another league: its ceiling is far above 4×
# (M03-3). Without VNNI the lead stays modest. The line under the ratio says which case this
# CPU is. The spread column says how much one call varies (the middle 80 % of the rounds);
# how well the ratio of the two medians is known is its 95 % interval within this run
# (``ratio_interval``, M03-3: both models ran in the same interleaved rounds).

speedup, (low, high) = raced.ratio("fp32", "int8"), raced.ratio_interval("fp32", "int8")
print(f"int8 runs {speedup:.2f}× as fast as fp32 (95 % interval in this run {low:.2f}–{high:.2f}×)")
cpu = describe()
print(
    f"{cpu.onednn}: AMX tiles, a ceiling far above VNNI's 4×"
    if cpu.amx_int8
    else f"{cpu.onednn}: VNNI, a ceiling of 4× per instruction"
    if cpu.vnni
    else f"{cpu.onednn}: no VNNI (vpmaddubsw), a modest lead"
)

# %%
# Step 5 — Accuracy
# -----------------
# Both compiled models classify the 500 test images.
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# finds where int8 loses precision, and
# :ref:`M04-2 · fixing it <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>` what to do when it
# costs too much.

fp32_accuracy = accuracy(raced.models["fp32"])
int8_accuracy = accuracy(raced.models["int8"])
print(f"test accuracy: fp32 {fp32_accuracy:.1%}, int8 {int8_accuracy:.1%}")
assert abs(int8_accuracy - fp32_accuracy) <= 0.01, "int8 costs at most one point here"

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
assert int8_weights <= 0.3 * fp32_weights, "int8 weights take about a quarter of the bytes"

# %%
# Summary
# -------
# Six steps take a trained model to int8: export, prepare with a quantizer, calibrate,
# convert, then compile with freezing for real int8 kernels, and check that they ran. The
# rest of the course opens each step: what the graph looks like after it (M00, M01), how to
# do it by hand (M02), what the compiler makes of it (M03), how to keep the accuracy (M04).
#
# Checklist: int8 on x86, without the traps
# -----------------------------------------
# Each of these has made int8 no faster than float, or slower, with nothing saying so:
#
# 1. **Export with a dynamic batch on an example batch of at least 2.** A graph exported for
#    one batch size recompiles (or fails) on another; a dynamic batch declared on a batch of
#    1 fails, since size-1 dimensions specialise (``export_digits_model`` exports on 2).
# 2. **Set freezing for the process**, ``torch._inductor.config.freezing = True``, not
#    ``config.patch`` around the first call: a recompile outside the block (a new input
#    shape, ``torch._dynamo.reset()``) compiles without freezing and runs float convs.
# 3. **Compile and run under** ``torch.no_grad()``: inductor freezes only when grad is off.
# 4. **Compile and time at the same thread count**: inductor writes the count into its code.
# 5. **Check the kernels that ran**, with ``common.kernels.kernels_run`` (the profiler) on the
#    inputs you serve, not the inductor counters, which describe the first compile only.
#
# ``common.timing.race`` follows all five. The troubleshooting page
# :ref:`Troubleshooting: lowering and speed
# <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`
# shows each trap, reproduced, with its fix.
#
# - Saving and serving the int8 model, with AOTInductor:
#   :ref:`M03-4 · shipping an int8 model <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`.
# - Start the course from the graph up:
#   :ref:`M00-1 · getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.
