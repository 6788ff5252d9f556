"""
M05-3 Choosing what to quantize
===============================

``X86InductorQuantizer`` takes a config per module name, per module type and per function,
and ``None`` leaves those nodes in float. That is the tool for a layer that int8 hurts — but
first find the layer. This lesson plants one outlier channel in the trained digits ViT (the
float model computes the same function), finds the layer it hurts twice, by leaving each
layer in float in turn and with torchao's numeric debugger, colours the graph by SQNR, and
then fixes the layer without any float fallback: SmoothQuant, by hand, moves the outlier's
scale from the activation into the next linear's weight. Last, the price in time: a
four-block encoder in fp32, int8 static and int8 dynamic, compiled with freezing and timed
on this CPU's int8 path and on AVX2.

**What you will learn**

- How ``set_module_name_qconfig``, ``set_module_type_qconfig`` and
  ``set_function_type_qconfig`` with ``None`` leave parts of a model in float
- How a sensitivity loop and the numeric debugger point at the same layer
- How SmoothQuant keeps the float function and makes the activation easy to quantize

**Prerequisites**: :ref:`M04-1 · measuring the error
<sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`, :ref:`M00-4 · graph surgery
<sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`, :ref:`M05-1 · what the quantizer sees
in attention <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The digits ViT of M05-1, trained (``common.data.train_digits_vit``, cached in ``build/``),
# with separate q/k/v linears. Calibration uses 64 calibration images; the errors are
# measured on the 500 test images, against the float model's logits.

import copy
import math
import tempfile

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from common.aoti import compiled_package, kernel_calls
from common.charts import pad, use_course_style
from common.cpu import describe, run_under_isa, weaker_paths
from common.data import accuracy, digits, export_digits_model, train_digits_vit
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet
from common.timing import Timing, compare_speed
from common.viz import draw

quiet()

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer
from torchao.quantization.utils import compute_error

model = train_digits_vit()
calibration, _ = digits("calibration")
calibration = calibration[:64]
test_images, test_labels = digits("test")
with torch.no_grad():
    fp32_logits = model(test_images)
aten, qd = torch.ops.aten, torch.ops.quantized_decomposed

# %%
# Helpers: ``quantizer()`` is the default static config under ``set_global``; ``quantize``
# runs prepare, calibration and convert on a copy of a float graph; ``int8_layers`` lists the
# modules whose conv or linear reads an int8 weight; ``errors`` gives the accuracy and the
# SQNR of the logits against a float reference; ``tensor_results`` keeps the debugger's
# records of tensors (the graph also logs the batch size, a ``sym_size`` node); ``Amax``
# runs a graph node by node (``torch.fx.Interpreter``) and keeps the largest absolute value
# of each channel of the nodes it is told to watch.


def quantizer():
    config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config()
    return x86_inductor_quantizer.X86InductorQuantizer().set_global(config)


def quantize(float_gm, q):
    prepared = prepare_pt2e(copy.deepcopy(float_gm), q)
    with torch.no_grad():
        prepared(calibration)
    return convert_pt2e(prepared)


def int8_layers(gm) -> list[str]:
    layers = []
    for node in gm.graph.nodes:
        if node.target in (aten.linear.default, aten.conv2d.default):
            if node.args[1].target == qd.dequantize_per_channel.default:
                layers.append(list(node.meta["nn_module_stack"].values())[-1][0])
    return layers


def errors(gm) -> tuple[float, float]:
    """(accuracy, SQNR in dB of the logits against the fp32 logits) on the test images."""
    with torch.no_grad():
        logits = gm(test_images)
    correct = (logits.argmax(dim=1) == test_labels).float().mean().item()
    return correct, compute_error(fp32_logits, logits).item()


def tensor_results(logged):
    results = extract_results_from_loggers(logged)
    return {key: row for key, row in results.items() if isinstance(row[2][0], torch.Tensor)}


class Amax(torch.fx.Interpreter):
    def __init__(self, gm, watched):
        super().__init__(gm)
        self.watched, self.amax = set(watched), {}

    def run_node(self, node):
        value = super().run_node(node)
        if node.name in self.watched:
            channels = value.detach().abs().flatten(0, -2).amax(dim=0)
            seen = self.amax.get(node.name, torch.zeros_like(channels))
            self.amax[node.name] = torch.maximum(seen, channels)
        return value


# %%
# Step 1 — Leave parts of the model in float
# ------------------------------------------
# The default config gives int8 weights to all 14 layers: the patch embedding's conv and 13
# linears. Each setter below takes ``None`` for "leave it in float", and the quantizer
# applies them in a fixed order — module names first, then types and functions, the global
# config last — never annotating a node twice.

float_gm = export_digits_model(model)
everything = quantize(float_gm, quantizer())
print(len(int8_layers(everything)), "layers with int8 weights")
assert len(int8_layers(everything)) == 14

head_float = quantize(float_gm, quantizer().set_module_name_qconfig("head", None))
conv_float = quantize(float_gm, quantizer().set_module_type_qconfig(nn.Conv2d, None))
linears_float = quantize(float_gm, quantizer().set_function_type_qconfig(F.linear, None))
for label, gm in (
    ('set_module_name_qconfig("head", None)', head_float),
    ("set_module_type_qconfig(nn.Conv2d, None)", conv_float),
    ("set_function_type_qconfig(F.linear, None)", linears_float),
):
    print(f"{label:42} {len(int8_layers(gm)):2} int8 layers")
assert "head" not in int8_layers(head_float) and len(int8_layers(head_float)) == 13
assert "patch_embed" not in int8_layers(conv_float) and len(int8_layers(conv_float)) == 13
assert int8_layers(linears_float) == ["patch_embed"], "every linear float, the conv int8"

# %%
# On the trained model int8 costs nothing a classifier notices: the test accuracy and the
# logits' SQNR of the fully quantized model.

fp32_accuracy = accuracy(model)
static_accuracy, static_sqnr = errors(everything)
print(f"fp32 {fp32_accuracy:.3f} | int8 static {static_accuracy:.3f}, {static_sqnr:.1f} dB")
assert static_accuracy >= fp32_accuracy - 0.01 and static_sqnr > 30

# %%
# Step 2 — Plant an outlier channel
# ---------------------------------
# Large language models have a few activation channels a hundred times larger than the rest
# (the LLM.int8 and SmoothQuant papers). Plant one: multiply channel 5 of block 0's
# ``norm2`` (weight and bias) by 100 and divide column 5 of ``fc1``'s weight by 100. The
# float model computes the same function, to float rounding; ``fc1``'s input now has one
# channel a hundred times too big for a per-tensor int8 scale.

CHANNEL, FACTOR = 5, 100.0
planted = copy.deepcopy(model)
with torch.no_grad():
    planted.blocks[0].norm2.weight[CHANNEL] *= FACTOR
    planted.blocks[0].norm2.bias[CHANNEL] *= FACTOR
    planted.blocks[0].fc1.weight[:, CHANNEL] /= FACTOR
    torch.testing.assert_close(planted(test_images), model(test_images), atol=1e-4, rtol=0)

# The debugger (Step 4) needs the export marked before it is quantized.
program = torch.export.export(
    planted, (calibration[:2],), dynamic_shapes=({0: torch.export.Dim("batch")},)
)
generate_numeric_debug_handle(program)
planted_gm = program.module()
planted_int8 = quantize(planted_gm, quantizer())
planted_accuracy, planted_sqnr = errors(planted_int8)
print(f"planted outlier, int8 static: {planted_accuracy:.3f}, {planted_sqnr:.1f} dB")
assert planted_sqnr < static_sqnr - 10, "the same function, far harder to quantize"

# %%
# Step 3 — Leave each layer in float in turn
# ------------------------------------------
# The sensitivity loop: 14 quantizations, each with one layer left in float by
# ``set_module_name_qconfig(name, None)``, ranked by the SQNR they give back. One layer
# stands out: ``blocks.0.fc1``, the linear that reads the outlier.

layers = [name for name, m in planted.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
gains = {}
for name in layers:
    fallback = quantize(planted_gm, quantizer().set_module_name_qconfig(name, None))
    gains[name] = errors(fallback)
ranking = sorted(gains, key=lambda name: gains[name][1], reverse=True)
for name in ranking[:4]:
    acc, sqnr = gains[name]
    print(f"{name:22} float: accuracy {acc:.3f}, SQNR {sqnr:5.1f} dB ({sqnr - planted_sqnr:+.1f})")
fallback_accuracy, fallback_sqnr = gains["blocks.0.fc1"]
assert ranking[0] == "blocks.0.fc1", "the layer behind the outlier"
assert fallback_sqnr > planted_sqnr + 10 > gains[ranking[1]][1]

# %%
# Step 4 — The numeric debugger points at the same node
# -----------------------------------------------------
# M04-1's four calls give the SQNR after every node of the planted int8 model. The node
# where it falls most, compared with the node's input, is ``fc1``'s linear.

float_logged = prepare_for_propagation_comparison(planted_gm)
int8_logged = prepare_for_propagation_comparison(planted_int8)
with torch.no_grad():
    float_logged(test_images)
    int8_logged(test_images)
comparison = compare_results(tensor_results(float_logged), tensor_results(int8_logged))
node_sqnr = {info.name: summary.results[0].sqnr.item() for info, summary in comparison.items()}
nodes = {node.name: node for node in planted_gm.graph.nodes}


def fall(name):
    """How many dB the SQNR loses across a node (its first input's SQNR minus its own)."""
    source = nodes[name].args[0].name
    return node_sqnr.get(source, float("inf")) - node_sqnr[name]


linear_nodes = [name for name in node_sqnr if nodes[name].target == aten.linear.default]
steepest = max(linear_nodes, key=fall)
module = list(nodes[steepest].meta["nn_module_stack"].values())[-1][0]
print(f"steepest fall: {steepest} ({module}), {fall(steepest):.1f} dB")
assert module == ranking[0], "the debugger and the sensitivity loop agree"

# %%
# The float graph coloured by the debugger's SQNR (hover a node for its number): the red
# starts at block 0's ``fc1`` and does not recover downstream.

finite = {name: sqnr for name, sqnr in node_sqnr.items() if math.isfinite(sqnr)}  # inf: exact
draw(planted_gm, values=finite, value_name="SQNR dB", title="planted outlier: SQNR per node")

# %%
# Step 5 — SmoothQuant by hand
# ----------------------------
# Falling back to float gives up int8 for that layer. SmoothQuant keeps it: for a linear
# ``y = x·Wᵀ`` any per-channel ``s`` gives ``y = (x / s)·(W·s)ᵀ``. Choose
# ``s_j = max|x_j|^α / max|W_j|^(1−α)`` (α = 0.5) and both sides of channel ``j`` meet in the
# middle: ``max|x_j| / s_j = max|W_j|·s_j = √(max|x_j|·max|W_j|)`` (asserted below). The
# outlier channel shrinks; weight column ``j`` grows, but only to that geometric mean.
# Per-channel weight quantization does not absorb the growth (the x86 weight scale is per
# *output* channel, a row of ``W``, and column ``j`` crosses every row): the balance is what
# works, neither side is left with an outlier. The ``/ s`` costs
# nothing: the activation comes out of a LayerNorm, so it folds into the LayerNorm's weight
# and bias. The M00 moves on the exported graph: find each ``layer_norm`` whose users are all
# linears (q, k, v share one), read the activation maxima on the calibration images, edit
# the constants in place.

smoothed = copy.deepcopy(planted_gm)
pairs = {
    norm: list(norm.users)
    for norm in smoothed.graph.find_nodes(op="call_function", target=aten.layer_norm.default)
    if all(user.target == aten.linear.default for user in norm.users)
}
print({norm.name: [user.name for user in users] for norm, users in pairs.items()})
assert len(pairs) == 4, "norm1 → q, k, v and norm2 → fc1, in both blocks"
watch = Amax(smoothed, [norm.name for norm in pairs])
with torch.no_grad():
    watch.run(calibration)
    for norm, users in pairs.items():
        weights = [smoothed.get_parameter(user.args[1].target) for user in users]
        weight_max = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0)
        s = (watch.amax[norm.name].sqrt() / weight_max.sqrt()).clamp(min=1e-5)
        torch.testing.assert_close(watch.amax[norm.name] / s, weight_max * s)  # balanced
        smoothed.get_parameter(norm.args[2].target).div_(s)  # LayerNorm weight
        smoothed.get_parameter(norm.args[3].target).div_(s)  # LayerNorm bias
        for w in weights:
            w.mul_(s)

# %%
# The float function is unchanged, to float rounding (1e-4 on logits of size ~10); its int8
# version recovers the SQNR, and the accuracy, of the model without the outlier — with every
# layer int8.

with torch.no_grad():
    torch.testing.assert_close(smoothed(test_images), model(test_images), atol=1e-4, rtol=0)
smooth_accuracy, smooth_sqnr = errors(quantize(smoothed, quantizer()))
print(f"SmoothQuant, int8 static: {smooth_accuracy:.3f}, {smooth_sqnr:.1f} dB")
assert smooth_sqnr > planted_sqnr + 15 and smooth_sqnr > static_sqnr - 3
assert smooth_accuracy >= planted_accuracy

# %%
# Step 6 — int8 with bfloat16 in between
# --------------------------------------
# What stays float in an int8 model (SDPA, LayerNorm, GELU, the softmax) could run in
# bfloat16 instead: torchao's x86 tutorial calls it "int8-mixed-bf16". It can pay only on CPUs
# that compute bf16 natively (``avx512_bf16`` or ``amx_bf16``); elsewhere bf16 is emulated and
# slower than float32. This page does not time it; it says which case this CPU is:

cpu = describe()
if cpu.bf16:
    print(f"bf16 native ({cpu.verdict}): int8-mixed-bf16 could pay here")
else:
    print(f"no native bf16 ({cpu.verdict}): keep the float parts in float32")

# %%
# Step 7 — Speed: fp32, int8 static, int8 dynamic
# ------------------------------------------------
# Accuracy is half the choice; the other half is time. ``common.models.Encoder`` (four
# blocks, d_model 256, 64 tokens, MLP 1024; random weights, four sentences of tokens) in
# three versions, each compiled ahead of time with freezing into an AOTInductor package
# (M03-4). ``common.aoti.compiled_package`` keeps each package in ``build/cache/``, keyed by
# the program, torch's version, the kernel path and the timing's thread count (inductor
# specializes its CPU kernels on it), so a rebuild loads it instead of compiling again.
# What is asserted is what the compiler made, read from each package's generated C++: the
# float encoder calls oneDNN's float linear, both int8 encoders call its int8 linear for
# all 24 linears, the residual add fused into the out projection and ``fc2``.

encoder = get_model("encoder")
tokens = example_inputs(4, shape=input_shape("encoder"))
# How the printed lines and the chart name the three versions (the keys also name the
# packages, the same in both languages).
LABELS = {"fp32": "fp32", "int8 static": "int8 static", "int8 dynamic": "int8 dynamic"}


def encoder_int8(is_dynamic):
    config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config(
        is_dynamic=is_dynamic
    )
    q = x86_inductor_quantizer.X86InductorQuantizer().set_global(config)
    prepared = prepare_pt2e(export_module(encoder, tokens), q)
    with torch.no_grad():
        for seed in range(1, 4):
            prepared(*example_inputs(4, seed=seed, shape=input_shape("encoder")))
    return convert_pt2e(prepared)


programs = {
    label: torch.export.export(gm, tokens)
    for label, gm in (
        ("fp32", export_module(encoder, tokens)),
        ("int8 static", encoder_int8(False)),
        ("int8 dynamic", encoder_int8(True)),
    )
}
packages = {
    label: compiled_package(program, "encoder_" + label.replace(" ", "_"))
    for label, program in programs.items()
}


def linear_kernels(package) -> dict:
    return {name: k for name, k in kernel_calls(package).items() if "linear" in name}


for label, package in packages.items():
    print(pad(LABELS[label], 12), linear_kernels(package))
assert not any(name.startswith("q") for name in linear_kernels(packages["fp32"]))
for label in ("int8 static", "int8 dynamic"):
    kernels = linear_kernels(packages[label])
    assert set(kernels) == {"qlinear_pointwise", "qlinear_pointwise_binary"}
    assert sum(kernels.values()) == 24, "q, k, v, out, fc1, fc2 in each of 4 blocks"

# %%
# Then the timing: the three packages in interleaved rounds, on this CPU's int8 path and, in
# a fresh process capped at AVX2 (``run_under_isa``, where this CPU has more than AVX2), on
# AVX2 — compiled there again, since the cap changes inductor's vector code and the layout
# of oneDNN's prepacked weights. With VNNI, int8 products are summed into int32 in one
# instruction and int8 linears of this size usually beat float32; without it (AVX2) they go
# through int16 pairs and the gain shrinks or vanishes. Dynamic int8 also computes each
# activation's scale at run time. The lines below the chart say which was fastest on each
# path measured here.

runners = {LABELS[k]: torch._inductor.aoti_load_package(str(p)) for k, p in packages.items()}
key = " ".join(
    path.name for path in packages.values()
)  # the packages' names hold their keys: the docs build times them once
timings = compare_speed(runners, tokens, rounds=20, key=key)
print(timings.table())
paths = {cpu.onednn: timings.times}

# The subprocess's code; importing quantize_pt2e registers the int8 ops the programs call.
AVX2_STEP = """
import torch
import torchao.quantization.pt2e.quantize_pt2e
from common.aoti import compiled_package
from common.timing import compare_speed

programs = {label: torch.export.load(path) for label, path in SAVED.items()}
runners = {
    label: torch._inductor.aoti_load_package(
        str(compiled_package(program, "encoder_" + label.replace(" ", "_")))
    )
    for label, program in programs.items()
}
timings = compare_speed(runners, programs["fp32"].example_inputs[0], rounds=20)
result = {"times": {label: vars(timings[label]) for label in runners}, "load": timings.load[0]}
"""

if "AVX2" in weaker_paths():
    with tempfile.TemporaryDirectory() as folder:
        saved = {label: f"{folder}/{label.replace(' ', '_')}.pt2" for label in programs}
        for label, program in programs.items():
            torch.export.save(program, saved[label])
        # temporary paths: key the step by what it times, the packages
        other = run_under_isa("AVX2", f"SAVED = {saved!r}\n{AVX2_STEP}", key=AVX2_STEP + key)
    found = other["result"]
    paths[other["cpu"]["onednn"]] = {LABELS[k]: Timing(**v) for k, v in found["times"].items()}
    print(f"AVX2 subprocess: {other['cpu']['onednn']}, load average {found['load']:.2f}")

labels = [LABELS[k] for k in programs]
print(pad("int8 path", 18) + "".join(pad(label, 22, align=">") for label in labels))
for path, times in paths.items():
    cells = [f"{times[label].median:9.2f} ms ({times[label].spread:4.0%})" for label in labels]
    print(f"{path:18}" + "".join(f"{cell:>22}" for cell in cells))

use_course_style()
fig, ax = plt.subplots(figsize=(6.5, 3))
width = 0.8 / len(paths)
for i, (path, times) in enumerate(paths.items()):
    medians = [times[label].median for label in labels]
    spread = [
        [m - times[label].low for label, m in zip(labels, medians, strict=True)],
        [times[label].high - m for label, m in zip(labels, medians, strict=True)],
    ]
    ax.bar(
        [j + i * width for j in range(len(labels))],
        medians,
        width,
        yerr=spread,
        capsize=3,
        label=path,
        color=["#2563eb", "#94a3b8"][i % 2],
    )
ax.set_xticks([j + width * (len(paths) - 1) / 2 for j in range(len(labels))], labels)
ax.set_ylabel("ms per call (median, p10–p90)")
ax.set_title("four encoder blocks, AOTInductor with freezing")
ax.legend(title="int8 path")
fig.tight_layout()
plt.show()
for path, times in paths.items():
    fastest = min(labels, key=lambda label: times[label].median)
    speedup = times[LABELS["fp32"]].median / times[fastest].median
    print(f"{path}: fastest {fastest}, {speedup:.2f}× the speed of fp32")

# %%
# Summary
# -------
# ===================================  ========================================================
# model                                accuracy and SQNR of the logits (printed above)
# ===================================  ========================================================
# fp32                                 the reference
# int8 static                          no visible loss
# planted outlier, int8 static         the same float function, far lower SQNR
# sensitivity fallback                 ``blocks.0.fc1`` in float gives most of it back
# SmoothQuant, int8 static             every layer int8, the SQNR of the model without outlier
# ===================================  ========================================================
#
# - ``None`` in ``set_module_name_qconfig`` / ``set_module_type_qconfig`` /
#   ``set_function_type_qconfig`` leaves those nodes in float; names win over types.
# - A sensitivity loop and the debugger's per-node SQNR find the same layer.
# - SmoothQuant divides an activation by ``s`` (folded into the LayerNorm before it) and
#   multiplies the next linears' weights by ``s``: the same float function, an easy int8 one.
# - Compiled with freezing, every linear of the int8 encoder runs as oneDNN's int8 linear,
#   static or dynamic; whether that beats float32 depends on the CPU's int8 path (VNNI or
#   AVX2), printed above for each path measured.
#
# Exercises
# ---------
# 1. Leave the whole of ``blocks.0`` of the planted model in float with
#    ``set_module_name_qconfig`` (a name covers every submodule under it). Predict how many
#    layers keep int8 weights; then predict how many dB the five more float layers win on top
#    of Step 3's ``blocks.0.fc1`` fallback: more or less than ``fc1`` alone gave back?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          block_float = quantize(planted_gm, quantizer().set_module_name_qconfig("blocks.0", None))
#          block_accuracy, block_sqnr = errors(block_float)
#          count = len(int8_layers(block_float))
#          print(f"{count} int8 layers: {block_accuracy:.3f}, {block_sqnr:.1f} dB")
#          assert count == 8, "14 minus q, k, v, out, fc1, fc2"
#          fc1_gain, rest_gain = fallback_sqnr - planted_sqnr, block_sqnr - fallback_sqnr
#          print(f"fc1 alone {fc1_gain:+.1f} dB, five more layers {rest_gain:+.1f} dB")
#          assert 0 < rest_gain < fc1_gain / 3, "fc1 gives most back, the rest a few dB"
#
# 2. Step 5 used α = 0.5. Use α = 1 on block 0's ``norm2`` only (``s = max|x|``: the
#    activation's whole range moves into ``fc1``'s weights, and every activation channel's
#    maximum becomes 1). Predict what happens to ``fc1``'s int8 SQNR (the debugger's, Step 4)
#    and to the range of its weights, channel by channel: better, worse, or no change?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          def migrated(alpha):
#              """SmoothQuant at this α on block 0's norm2 → fc1 pair only (Step 5's s)."""
#              gm = copy.deepcopy(planted_gm)
#              norm = [n for n in gm.graph.nodes if n.target == aten.layer_norm.default][1]
#              (fc1,) = norm.users
#              w = gm.get_parameter(fc1.args[1].target)
#              with torch.no_grad():
#                  s = watch.amax[norm.name] ** alpha / w.abs().amax(dim=0) ** (1 - alpha)
#                  s = s.clamp(min=1e-5)
#                  gm.get_parameter(norm.args[2].target).div_(s)
#                  gm.get_parameter(norm.args[3].target).div_(s)
#                  w.mul_(s)
#              return gm, fc1.name, w.detach()
#
#
#          def fc1_sqnr(gm, name):
#              """The debugger's SQNR at fc1's output (Step 4)."""
#              float_log = prepare_for_propagation_comparison(gm)
#              int8_log = prepare_for_propagation_comparison(quantize(gm, quantizer()))
#              with torch.no_grad():
#                  float_log(test_images)
#                  int8_log(test_images)
#              rows = compare_results(tensor_results(float_log), tensor_results(int8_log))
#              return next(s.results[0].sqnr.item() for i, s in rows.items() if i.name == name)
#
#
#          def weight_sqnr(w):
#              """w against its int8 copy: symmetric, one scale per output channel (row), as x86."""
#              scale = w.abs().amax(dim=1, keepdim=True) / 127.5
#              return compute_error(w, (w / scale).round().clamp(-128, 127) * scale).item()
#
#
#          found = {}
#          for alpha in (0.5, 1.0):
#              gm, name, w = migrated(alpha)
#              rows, columns = w.abs().amax(dim=1), w.abs().amax(dim=0)
#              found[alpha] = f = {
#                  "fc1": fc1_sqnr(gm, name),
#                  "weights": weight_sqnr(w),
#                  "rows": rows.median().item(),
#                  "spread": (columns.max() / columns.min()).item(),
#              }
#              print(f"α = {alpha}: fc1 {f['fc1']:.1f} dB, int8 weights {f['weights']:.1f} dB;")
#              print(f"    median row max {f['rows']:.2f}, column maxima {f['spread']:.1f}× apart")
#          low, high = found[0.5], found[1.0]
#          assert high["rows"] > low["rows"], "every output channel's range grows"
#          assert high["spread"] > 1.5 * low["spread"], "the activation's spread moved in"
#          assert high["weights"] < low["weights"], "small weights get coarser int8 steps"
#          assert abs(high["fc1"] - low["fc1"]) < 1 < high["fc1"] - node_sqnr[name] - 15, (
#              "fc1's output hardly moves: the weights had dB to spare, the activation is the limit"
#          )
#
# Further reading
# ---------------
# - Xiao et al., `SmoothQuant <https://arxiv.org/abs/2211.10438>`_
# - `X86InductorQuantizer source
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `PT2E numeric debugger
#   <https://docs.pytorch.org/ao/main/tutorials_source/pt2e_quant_numeric_debugger.html>`_
#
# Next
# ----
# Back to :ref:`M05-1 · what the quantizer sees in attention
# <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`, or on to the course map.
