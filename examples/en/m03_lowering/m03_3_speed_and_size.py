"""
M03-3 Speed and size, measured
==============================

Quantization is mostly done for speed and size. The q/dq graph already brings the size (its
weights are stored as int8) but not the speed: its convs still run in float, with quantize
and dequantize around them. This lesson times one model in three settings — eager, compiled,
compiled with **freezing** — float beside int8 in each, on both kernel paths of this CPU, and
weighs the saved files. Timings are printed with how they were taken, never asserted; what is
asserted is what makes int8 fast: the int8 oneDNN kernels that each timed model really ran,
read from the profiler before and after its timing rounds.

**What you will learn**

- Why int8 compiled without freezing gains nothing on float compiled the same way, and how
  to prove which kernels ran
- What VNNI and AMX change, and what a CPU without them gets
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
# for int8 kernels to matter (the 16×16 toy models spend their time in overheads).
# ``compare_speed`` times models in interleaved rounds, on one thread when the machine has
# two cores or fewer, and prints medians with their spread, the load average and the CPU.

import io
import math
import statistics
import warnings

import matplotlib.pyplot as plt
import torch
from torch._dynamo.utils import counters

from common.charts import use_course_style
from common.cpu import ISA_PATHS, describe, run_under_isa, weaker_paths
from common.data import digits, export_digits_model, train_digits_cnn
from common.kernels import kernels_run, time_by_kind
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import compare_speed, median_interval, race, ranked_apart
from common.viz import draw

quiet()
use_course_style()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.lowering import lower, reshape_views

BATCH = 2
ROUNDS = 100  # the landing page ranks these medians: their 95 % interval narrows as 1/√rounds
x = example_inputs(BATCH, shape=input_shape("conv_net"))
float_model = export_module(get_model("conv_net"), x)
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():  # calibrate on four batches of the model's image shape
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=input_shape("conv_net")))
int8_model = convert_pt2e(prepared)
cpu = describe()
print(cpu.verdict)
print(f"batch {BATCH} of {input_shape('conv_net')} images")

# %%
# ``race`` (``common.timing``) compiles a copy of each model with ``torch.compile`` and times
# them. It compiles under ``torch.no_grad()`` at the thread count the timing uses (inductor
# writes the count into its code), sets freezing for the whole process (a recompile must not
# lose it), and reads with the profiler (``common.kernels.kernels_run``) which compute kernels
# each model ran, before and after the timing rounds. Its docstring says why each rule exists.
#
# The profiler is the proof to run on your own models: it lists the kernels a call really
# dispatched. Here is the q/dq model, eager: float convs and matmuls, no int8 kernel.

print(f"q/dq model, eager: {kernels_run(int8_model, x).summary}")
assert not kernels_run(int8_model, x).int8, "the q/dq model computes in float"


# %%
# Step 1 — Eager: float, simulated int8, lowered int8
# ---------------------------------------------------
# The q/dq graph runs every conv in float *plus* a quantize and a dequantize per tensor: more
# work than float. The lowered graph (M03-1) runs oneDNN's int8 convs, eagerly.

lowered = lower(int8_model, x)
reshape_views(lowered)  # the flatten after the int8 convs (M03-1)
int8_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
draw(lowered, highlight=int8_ops, title="conv_net lowered: its oneDNN int8 ops")
eager = compare_speed(
    {"fp32": float_model, "int8 q/dq (simulated)": int8_model, "int8 lowered (oneDNN)": lowered},
    x,
    rounds=ROUNDS,
)
print(eager.table())

# %%
# Step 2 — torch.compile without freezing: the trap
# -------------------------------------------------
# ``torch.compile`` hands the graph to inductor. Without **freezing**, weights are inputs of
# the compiled code, which may change between calls: inductor cannot prepack them, finds no
# int8 conv pattern, and generates float convs around the dequantize nodes. So int8 compiled
# this way is still the simulation, compiled: it gains nothing on fp32 compiled the same way.
# That is the trap users meet first.

plain = race({"fp32": float_model, "int8": int8_model}, x, freezing=False)
print(plain.table())
print(f"without freezing, int8 takes {plain.ratio('int8', 'fp32'):.2f}× the time of fp32")
assert not plain.kernels["int8"].int8, "without freezing the int8 model ran float kernels only"

# %%
# Step 3 — torch.compile with freezing
# ------------------------------------
# With ``torch._inductor.config.freezing = True`` the weights are constants: the same prepack
# and fusion patterns as M03-1 fire, and int8 runs oneDNN's int8 convs and linears. Again both
# models in the same setting.

counters.clear()
frozen = race({"fp32": float_model, "int8": int8_model}, x, rounds=ROUNDS)
print(frozen.table())
print(f"with freezing, int8 runs {frozen.ratio('fp32', 'int8'):.2f}× as fast as fp32")
ran = frozen.kernels["int8"]
assert ran.int8["onednn::qconv_pointwise"] == 4 and not ran.float, "every conv and linear int8"

# %%
# Inductor's counters tell the same story, but they are a record of the *compile*: they keep
# saying "4 convs prepacked" after a recompile that lost freezing (troubleshooting m99_3
# shows it). The profiler's list above is what ran.

packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
print(f"inductor's counter: {packed} int8 convs prepacked while compiling")
assert packed == 4, "the compile prepacked all four int8 convs"
# sphinx_gallery_start_ignore
from common.results import publish  # the landing page's figures

publish("cpu", cpu.verdict)
publish("int8_path", cpu.onednn)
publish("timing_threads", frozen.threads)
publish("int8_speedup_compiled", frozen.ratio("fp32", "int8"))
publish("compiled_interval", frozen.ratio_interval("fp32", "int8"))
publish("compiled_load", frozen.load[0])
# sphinx_gallery_end_ignore

# %%
# Step 4 — The whole picture
# --------------------------
# The three tables in one chart: medians, with the 10th–90th percentile as the whisker.

settings = {"eager": eager, "compiled": plain, "compiled + freezing": frozen}
names, medians, whiskers, colors = [], [], [[], []], []
for setting, timings in settings.items():
    for label, t in timings.times.items():
        names.append(f"{setting}: {label}")
        medians.append(t.median)
        whiskers[0].append(t.median - t.low)
        whiskers[1].append(t.high - t.median)
        colors.append("#94a3b8" if label == "fp32" else "#2563eb")
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.barh(names, medians, xerr=whiskers, color=colors, capsize=3)
ax.invert_yaxis()
ax.set_xlabel(f"median time per batch (ms), {eager.threads} thread(s)")
ax.set_title(f"conv_net, batch {BATCH}: int8 path {cpu.onednn}")
fig.tight_layout()

# %%
# How much int8 wins depends on the CPU. oneDNN multiplies uint8 × int8 with **VNNI**
# (``vpdpbusd``: four products summed into int32 in one instruction; AVX512-VNNI or
# AVX-VNNI), or with **AMX** tiles on recent Xeons (a whole 16×64 block per instruction).
# Without either (AVX2, or AVX-512 without VNNI) it falls back to ``vpmaddubsw``, which sums
# pairs of products in 16 bits (the saturation of M03-1) and needs extra instructions to
# widen them: fewer int8 multiply-adds per instruction, so less of a lead over float. This
# page's tables were measured on this kind of CPU:

kind = "AMX tiles" if cpu.amx_int8 else "VNNI, no AMX" if cpu.vnni else "no VNNI: vpmaddubsw"
print(f"int8 path {cpu.onednn}: {kind}")

# %%
# Step 5 — Both kernel paths
# --------------------------
# oneDNN and ATen read their ISA caps once per process (M03-1), so the eager comparison of
# step 1 runs again in fresh interpreters: on this CPU's path, and capped at AVX2, the path
# every x86-64 CPU of the last ten years has (an AVX2 CPU has only its own).
# Emulation runs that path's instructions on *this* chip: it shows what those instructions
# cost here, not a real AVX2 chip's speed (other clocks, caches, cores).

EAGER_STEP = """
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from common.lowering import lower, reshape_views
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, x86_quantizer
from common.timing import compare_speed

x = example_inputs(2, shape=input_shape("conv_net"))
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():
    for seed in range(4):
        prepared(*example_inputs(2, seed=seed, shape=input_shape("conv_net")))
lowered = lower(convert_pt2e(prepared), x)
reshape_views(lowered)
timings = compare_speed(
    {"fp32": export_module(get_model("conv_net"), x), "int8": lowered}, x, rounds=ROUNDS
)
result = {label: vars(timings[label]) for label in ("fp32", "int8")}
result["load"] = timings.load[0]
"""

# %%
# A spread describes one call: the middle 80 % of calls lie within it, and more rounds do not
# narrow it. How well a *median* is known does narrow: of 100 sorted rounds the 40th and the
# 61st bracket the true median with 95 % probability (order statistics, no distribution
# assumed; ``common.timing.median_interval``, asserted below) — when the rounds are
# independent. They are not quite: a busy second slows several rounds in a row. And the level
# moves from one process to the next by more than that interval: the same model timed in three
# processes on this kind of machine gave three medians whose intervals excluded each other. So
# one run's interval says how well *that run's* median is known, and nothing about the next run.
#
# To rank two paths, the run is the unit: each path is measured in five processes, the paths
# taking turns (a slow minute slows each of them), and each run gives one speed-up. Two paths
# are ranked only when every run of one beats every run of the other. Were they the same path,
# that would happen by chance 2 times in C(10, 5) = 252 (``common.timing.ranked_apart``). This
# CPU's own path is measured twice, as two paths: the same path, two sets of processes.

assert median_interval(list(range(1, ROUNDS + 1))) == (40, 61), "ranks 40 and 61 of 100"
assert 2 / math.comb(10, 5) < 0.01, "five runs each: a false ranking under 1 %"

RUNS = 5
here = cpu.onednn if cpu.onednn in ISA_PATHS else "native"  # a capped run stays capped
paths = {cpu.onednn: (here, 0), f"{cpu.onednn} again": (here, 1)}
if "AVX2" in weaker_paths():
    paths["AVX2"] = ("AVX2", 0)
speedups = {label: [] for label in paths}
loads = {label: [] for label in paths}
for run in range(RUNS):  # the paths take turns, so a slow minute slows each of them
    for label, (isa, copy) in paths.items():
        # RUN makes each run a step of its own: while the site is built, run_under_isa keeps one
        # answer per step and both languages show it
        found = run_under_isa(isa, f"ROUNDS, RUN = {ROUNDS}, {(copy, run)}\n" + EAGER_STEP)
        result = found["result"]
        speedups[label].append(result["fp32"]["median"] / result["int8"]["median"])
        loads[label].append(result["load"])

print("int8 path                    speed-up of each run (fp32 ÷ int8, eager)  median  load")
for label, found in speedups.items():
    each = " ".join(f"{ratio:.2f}" for ratio in found)
    print(f"{label:28} {each}   {statistics.median(found):.2f}×   {max(loads[label]):.2f}")
labels = list(paths)
for i, one in enumerate(labels):
    for other in labels[i + 1 :]:
        apart = ranked_apart(speedups[one], speedups[other])
        verdict = (
            "ranked: every run of one beats every run of the other"
            if apart
            else "not ranked: their runs overlap"
        )
        print(f"{one} / {other}: {verdict}")
# sphinx_gallery_start_ignore
publish("int8_speedup_eager", {label: statistics.median(s) for label, s in speedups.items()})
publish("eager_intervals", {label: [min(s), max(s)] for label, s in speedups.items()})
publish("eager_loads", {label: max(found) for label, found in loads.items()})
publish("eager_runs", speedups)
# sphinx_gallery_end_ignore

# %%
# Step 6 — Size on disk
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
# sphinx_gallery_start_ignore
publish("size_ratio", ratio)
# sphinx_gallery_end_ignore

# %%
# Step 7 — How far from 4×?
# -------------------------
# With VNNI, one ``vpdpbusd`` multiplies and adds 64 uint8 × int8 pairs into int32 where one
# float FMA does 16: int8 can be at most 4× as fast, per instruction. On **AMX**
# (``cpu.amx_int8``) 4× is not a ceiling: oneDNN runs int8 convs and GEMMs on tiles, a
# 16×16×64 block of multiply-adds per instruction (1024 a cycle per core, by Intel's figures),
# while fp32 stays on AVX-512 FMAs (up to 32 a cycle per core), and the ratios may pass 4×. The
# line under the table says which case this CPU is. Three compute-bound cases show what the
# same PT2E path reaches on this CPU — 3×3 convs of 128 channels at 56×56, two GEMMs of
# 256×1024×4096 — and one that is not compute-bound: depthwise convs (``groups=128``), which
# do 9 multiply-adds per value they load, so memory traffic, not arithmetic, sets their time.


def int8_of(model, args):
    """``model`` through the PT2E flow: export, x86 quantizer, one calibration call, convert."""
    prepared = prepare_pt2e(export_module(model, args), x86_quantizer())
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


def convs(groups: int) -> torch.nn.Module:
    torch.manual_seed(0)
    conv = [torch.nn.Conv2d(128, 128, 3, padding=1, groups=groups) for _ in range(3)]
    return torch.nn.Sequential(*(m for c in conv for m in (c, torch.nn.ReLU()))).eval()


torch.manual_seed(0)
gemms = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
).eval()
cases = {
    "3×3 convs, 128 channels": (convs(groups=1), (torch.randn(4, 128, 56, 56),)),
    "GEMMs 256×1024×4096": (gemms, (torch.randn(256, 1024),)),
    "depthwise 3×3 convs": (convs(groups=128), (torch.randn(4, 128, 56, 56),)),
}
ceiling = {}
for name, (model, args) in cases.items():
    raced = race({"fp32": model, "int8": int8_of(model, args)}, args, rounds=10)
    assert not raced.kernels["int8"].float, "every conv or linear ran int8"
    ceiling[name] = raced.ratio("fp32", "int8")
    fp32, int8 = raced["fp32"], raced["int8"]
    print(
        f"{name:24} fp32 {fp32.median:7.2f} ms ({fp32.spread:4.0%})  "
        f"int8 {int8.median:7.2f} ms ({int8.spread:4.0%})  {ceiling[name]:.2f}×"
    )
print(
    f"{cpu.onednn}: AMX tiles, so int8's ceiling is far above 4×"
    if cpu.amx_int8
    else f"{cpu.onednn}: VNNI, no AMX: 4× per instruction is the ceiling"
    if cpu.vnni
    else f"{cpu.onednn}: no VNNI: vpmaddubsw, below VNNI's 4×"
)

# %%
# The GEMMs' float side runs on MKL (``mkl::_mkl_linear``, the kernel list of step 3), the
# convs' on oneDNN: without AMX, a GEMM ratio above 4× says that this CPU's float GEMM is
# slow, not that int8 beat its instruction count. Measured against the compute-bound convs,
# where both sides run oneDNN, where does ``conv_net``'s time go? The profiler splits a call
# of each compiled model into its int8 kernels, its float ones, and the rest (quantize,
# reorders, pooling, inductor's fused loops):

with torch.no_grad():
    split = {
        label: time_by_kind(frozen.models[label], x, threads=frozen.threads)
        for label in ("fp32", "int8")
    }
for label, parts in split.items():
    print(f"{label}: " + ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in parts.items()))
compute = split["fp32"]["float"] / split["int8"]["int8"]
print(
    f"convs and linears alone: {compute:.2f}× faster in int8; the rest: "
    f"{split['fp32']['other']:.2f} ms in fp32, {split['int8']['other']:.2f} ms in int8"
)

# %%
# A model wide enough to be compute-bound gets close to the ceiling: the quickstart's digits
# CNN (64 and 128 channels, 500 images a batch). Its share of the conv ceiling, printed, never
# asserted: a ratio of two ratios measured minutes apart, each with its spread, so a share
# above 100 % is noise, not a model that beat its ceiling.

wide, images = train_digits_cnn(width=8), digits("test")[0]
prepared = prepare_pt2e(export_digits_model(wide), x86_quantizer())
with torch.no_grad():
    prepared(digits("calibration")[0])
showcase = race({"fp32": wide, "int8": convert_pt2e(prepared)}, (images,), rounds=10)
assert not showcase.kernels["int8"].float, "every conv and linear ran int8"
share = showcase.ratio("fp32", "int8") / ceiling["3×3 convs, 128 channels"]
print(
    f"digits CNN, width 8: int8 {showcase.ratio('fp32', 'int8'):.2f}× fp32, "
    f"{share:.0%} of the conv ceiling (spreads {showcase['fp32'].spread:.0%}, "
    f"{showcase['int8'].spread:.0%}; {showcase.cpu})"
)

# %%
# Summary
# -------
# - The q/dq graph is a simulation: more work than float, eager or compiled without freezing.
#   Compare like with like: int8 and fp32 both eager, both compiled, both frozen.
# - Lowering (eager oneDNN ops, M03-1) or ``torch.compile`` with ``freezing = True`` runs
#   real int8 kernels; the profiler shows which kernels ran (the inductor counters only what
#   the first compile prepacked).
# - The speed-up depends on VNNI/AMX (``run_under_isa`` shows the weaker paths on one CPU,
#   not a real older chip's speed); the 4× smaller file does not.
# - VNNI's ceiling is 4× per instruction; AMX's tiles put it far higher. Compute-bound convs
#   reach most of it, memory-bound depthwise convs little; in a small model, quantize,
#   reorders and pooling take their share.
#
# Exercises
# ---------
# 1. Every float32 weight becomes one int8 byte. Predict, dtype by dtype, how many bytes of
#    constants the int8 program saves (what ``saved_bytes`` writes besides the graph), from
#    ``conv_net``'s layers alone; then say why the file is more than a quarter of fp32's.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from collections import Counter
#
#          lean = torch.fx.GraphModule(int8_model, int8_model.graph)  # what saved_bytes saves
#          stored = Counter()
#          for tensor in lean.state_dict().values():
#              stored[tensor.dtype] += tensor.numel() * tensor.element_size()
#          print({str(dtype): size for dtype, size in stored.items()})
#          weights = [p for p in float_model.state_dict().values() if p.ndim > 1]
#          biases = [p for p in float_model.state_dict().values() if p.ndim == 1]
#          channels = sum(w.shape[0] for w in weights)  # one scale and one zero point each
#          assert set(stored) == {torch.int8, torch.float32, torch.int64}, (
#              "int8 weights, float32 biases and scales, int64 zero points"
#          )
#          assert stored[torch.int8] == sum(w.numel() for w in weights), "1 byte per weight"
#          assert stored[torch.float32] == 4 * (sum(b.numel() for b in biases) + channels), (
#              "4 bytes per bias and per channel's scale"
#          )
#          assert stored[torch.int64] == 8 * channels, "8 bytes per zero point"
#          fp32_constants = 4 * sum(p.numel() for p in float_model.state_dict().values())
#          assert int8_bytes - sum(stored.values()) > fp32_bytes - fp32_constants, (
#              "and a larger graph around them: the q/dq nodes"
#          )
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
# - :ref:`M03-4 · Shipping an int8 model
#   <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>` — saving and serving the int8 model
# - :ref:`M06-3 · The .pte, inside out
#   <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>` — the edge route: int8 in a .pte file
# - :ref:`Troubleshooting: lowering and speed
#   <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`:
# is the int8 model still accurate?
