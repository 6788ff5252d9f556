"""
M03-3 Speed and size, measured
==============================

Quantization is mostly done for speed and size, and the q/dq graph gives neither: it is slower
than float. This lesson times one model six ways — float and int8, eager and lowered, and
under ``torch.compile`` with and without **freezing** — on the machine that builds this page,
and weighs the saved files. The timings are printed, never asserted (they belong to the
machine); what is asserted is what makes int8 fast: the int8 oneDNN ops in the compiled graph.

**What you will learn**

- Why int8 compiled without freezing gains nothing on float
- What VNNI and AMX change, and what an AVX2-only CPU gets
- How much smaller an int8 program is on disk

**Prerequisites**:
:ref:`M03-2 · lowering by hand <sphx_glr_lessons_m03_lowering_m03_2_lowering_by_hand.py>`.
``torch.compile`` needs a C++ compiler (``g++``).
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``conv_net`` from the zoo: four 3×3 convs of 64–128 channels on 28×28 images, big enough
# for int8 kernels to matter (the 16×16 toy models spend their time in overheads). The thread
# count and the CPU's instruction set are printed with every timing.

import io
import statistics
import time
import warnings

import matplotlib.pyplot as plt
import torch
from torch._dynamo.utils import counters

from common.charts import use_course_style
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.lowering import lower, reshape_views

BATCH = 2
x = example_inputs(BATCH, shape=input_shape("conv_net"))
float_model = export_module(get_model("conv_net"), x)
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():  # calibrate on four batches of the model's image shape
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=input_shape("conv_net")))
int8_model = convert_pt2e(prepared)
cpu = f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
print(f"CPU: {cpu}; batch {BATCH} of {input_shape('conv_net')} images")

# %%
# ``median_ms`` runs a model once to warm up, then ``repeat`` times, and returns the median in
# milliseconds; ``compiled`` compiles a model with ``torch.compile``, freezing on or off, and
# runs it once (the compilation happens then).


def median_ms(model, repeat=5) -> float:
    with torch.no_grad():
        model(*x)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            model(*x)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compiled(model, *, freezing: bool):
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(freezing=freezing), torch.no_grad():
        fast = torch.compile(model)
        fast(*x)
    return fast, dict(counters["inductor"])


# %%
# Step 1 — Eager: float, simulated int8, lowered int8
# ---------------------------------------------------
# The q/dq graph runs every conv in float *plus* a quantize and a dequantize per tensor: it
# does more work than float, so expect it slower (on a busy machine single timings are noisy).
# The lowered graph (M03-1) runs oneDNN's int8 convs, eagerly.

timings = {}
timings["fp32 eager"] = median_ms(float_model)
timings["int8 q/dq (simulated)"] = median_ms(int8_model)
lowered = lower(int8_model, x)
reshape_views(lowered)  # the flatten after the int8 convs (M03-1)
timings["int8 lowered (oneDNN, eager)"] = median_ms(lowered)
int8_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
draw(lowered, highlight=int8_ops, title="conv_net lowered: its oneDNN int8 ops")
for name, ms in timings.items():
    print(f"{name:32} {ms:8.1f} ms")

# %%
# Step 2 — torch.compile, without and with freezing
# -------------------------------------------------
# ``torch.compile`` hands the graph to inductor. Without **freezing**, weights are inputs of
# the compiled code, which may change between calls: inductor cannot prepack them, finds no
# int8 conv pattern, and generates float convs around the dequantize nodes. With
# ``torch._inductor.config.freezing = True`` the weights are constants: the same prepack and
# fusion patterns as M03-1 fire, and the counters say so.

for label, model in (("fp32", float_model), ("int8", int8_model)):
    for freezing in (False, True):
        fast, seen = compiled(model, freezing=freezing)
        timings[f"{label} compile{' + freezing' if freezing else ''}"] = median_ms(fast)
        if label == "int8":
            packed = seen.get("qconv_weight_prepack_matcher_count", 0)
            print(f"int8, freezing={freezing}: {packed} convs prepacked for oneDNN")
            assert packed == (4 if freezing else 0), "only freezing lets inductor prepack"
for name, ms in list(timings.items())[3:]:
    print(f"{name:32} {ms:8.1f} ms")

# %%
# That is the trap users meet first: **int8 compiled without freezing gains nothing on
# float** — it is still the simulation, compiled — and float compiled with freezing beats it.
# Freezing is what makes the int8 graph int8:

trap = timings["int8 compile"] / timings["fp32 compile + freezing"]
print(f"int8 compiled without freezing takes {trap:.1f}× the time of fp32 with freezing")

# %%
# Step 3 — The whole picture
# --------------------------

fig, ax = plt.subplots(figsize=(7, 3.6))
names = list(timings)
ax.barh(
    names,
    [timings[n] for n in names],
    color=["#94a3b8" if "fp32" in n else "#2563eb" for n in names],
)
ax.invert_yaxis()
ax.set_xlabel("median time per batch (ms)")
ax.set_title(f"conv_net, batch {BATCH} — {cpu}")
fig.tight_layout()

# %%
# The same numbers as a table: milliseconds per batch, and the speed relative to fp32 eager.

print(f"{'way':32} {'ms/batch':>9} {'speed':>7}")
for name, ms in timings.items():
    print(f"{name:32} {ms:9.1f} {timings['fp32 eager'] / ms:6.2f}×")

# %%
# How much int8 wins depends on the CPU. oneDNN multiplies uint8 × int8 with **VNNI**
# (``vpdpbusd``: four products summed into int32 in one instruction; AVX512-VNNI or
# AVX-VNNI), or with **AMX** tiles on recent Xeons (a whole 16×64 block per instruction).
# Without either — on an AVX2-only CPU like the one that builds this course — it falls back to
# ``vpmaddubsw``, which sums pairs of products in 16 bits (the saturation of M03-1) and needs
# extra instructions to widen them, so int8's lead over float stays modest there. VNNI and
# AMX do several times more int8 multiply-adds per instruction than float ones: that is where
# the large int8 speed-ups are measured.
#
# Step 4 — Size on disk
# ---------------------
# ``torch.export.save`` writes a program with its weights. The int8 program stores int8
# weights (1 byte each instead of 4) plus one float scale per output channel.


def saved_bytes(model) -> int:
    buffer = io.BytesIO()
    # A fresh GraphModule keeps only the attributes its graph reads (M02-3): convert leaves
    # the float weights on the submodules, unused but saved otherwise.
    lean = torch.fx.GraphModule(model, model.graph)
    torch.export.save(torch.export.export(lean, x), buffer)
    return buffer.getbuffer().nbytes


fp32_bytes, int8_bytes = saved_bytes(float_model), saved_bytes(int8_model)
ratio = int8_bytes / fp32_bytes
print(f"fp32 {fp32_bytes / 1e3:.0f} kB, int8 {int8_bytes / 1e3:.0f} kB: {ratio:.2f}×")
assert int8_bytes <= 0.3 * fp32_bytes, "int8 weights take a quarter of the bytes, plus scales"

# %%
# Summary
# -------
# - The q/dq graph is a simulation: more work than float, eager or compiled without freezing.
# - Lowering (eager oneDNN ops, M03-1) or ``torch.compile`` with ``freezing = True`` runs
#   real int8 kernels; the inductor counters show the convs it prepacked.
# - The speed-up depends on VNNI/AMX; the 4× smaller file does not.
#
# Exercises
# ---------
# 1. Without compiling anything: how many ``onednn`` ops does ``lower`` put into
#    ``conv_net``'s graph, and of which kinds? Predict from the model's layers, then count.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          lowered = lower(int8_model, x)
#          kinds = [str(n.target) for n in lowered.graph.nodes if "onednn" in str(n.target)]
#          print(kinds)
#          assert kinds.count("onednn.qconv_pointwise.default") == 4, "four conv + relu"
#          assert kinds.count("onednn.qlinear_pointwise.default") == 2, "the classifier"
#
# 2. Save the *lowered* program instead of the q/dq one. Predict: can ``torch.export`` save
#    its prepacked oneDNN weights?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#
#          unsaveable = lower(int8_model, x)
#          reshape_views(unsaveable)
#          with expect_error(NotImplementedError, match="OpaqueTensorImpl"):
#              saved_bytes(unsaveable)
#          # oneDNN's opaque tensors have no storage to serialize: save the q/dq program,
#          # lower (or compile with freezing) after loading it.
#
# Further reading
# ---------------
# - `PyTorch 2 Export Quantization with X86 Backend through Inductor
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
# - `torch.export.save <https://docs.pytorch.org/docs/stable/export.html#torch.export.save>`_
#
# Next
# ----
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`:
# is the int8 model still accurate?
