"""
M07-4 The op atlas
==================

What happens to the ops between the convs and the linears? One small model per op (conv1d,
conv2d, conv_transpose2d, linear, matmul, bmm, scaled_dot_product_attention, embedding, add,
sub, mul, div, cat, max_pool2d, avg_pool2d, adaptive_avg_pool2d, mean, sum, relu, hardtanh,
leaky_relu, gelu, silu, mish, hardswish, hardsigmoid, sigmoid, tanh, softmax, clamp,
layer_norm, group_norm, an RMSNorm as Llama writes it, batch_norm, upsample_nearest2d,
upsample_bilinear2d, pixel_shuffle, pad, flatten, reshape, permute, transpose, slice, split,
dropout, lstm, gru, a KV cache's ``index_copy_``), each placed where real models put it, goes
through every quantizer that runs here and then to what runs it: a oneDNN kernel or inductor's
loop on x86, an XNNPACK delegate or ExecuTorch's portable kernels, the precision OpenVINO's CPU
plugin executes. Every cell of the table is read from what ran, and checked against rules the
page states, so the page breaks when a release changes an op's fate.

**What you will learn**

- Which ops each quantizer makes int8, fuses into the conv or linear before them, passes
  int8 through with shared qparams, or leaves float, and the rule behind each
- Where each op then runs: the oneDNN kernel and its post-op, the XNNPACK delegate and the
  constraint that refused an op, OpenVINO's executed precision
- How to put your own op through the same run (``common.atlas``)

**Prerequisites**: :ref:`M07-1 · what stays float
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`,
:ref:`M07-3 · one graph, every quantizer
<sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``common.atlas`` holds the models (``ENTRIES``) and the run. ``run_cached`` quantizes an
# entry with each quantizer and follows it to what runs it; the result is plain data, kept in
# the course's cache under a key naming the model, the reading code, the installed stack and
# the CPU's kernel path (it holds no timing).

import copy
import importlib
import re
from collections import Counter
from itertools import chain

import torch
from torch import nn

from common.pt2e import quiet

quiet()

from common import atlas, edge
from common.cpu import describe
from common.kernels import native_stderr_silenced
from common.viz import draw

# sphinx_gallery_start_ignore
# ExecuTorch's OpenVINO package imports pytorch_tokenizers, whose C++ extension logs a line
# to the process's stderr as it loads: kept off the build's log.
with native_stderr_silenced():
    importlib.import_module("pytorch_tokenizers")
# sphinx_gallery_end_ignore

print(describe().verdict)
results = {item.name: atlas.run_cached(item) for item in atlas.ENTRIES}
print(f"{len(results)} models, {len({item.op for item in atlas.ENTRIES})} ops")
assert len({item.op for item in atlas.ENTRIES}) >= 40, "at least 40 ops"

# %%
# Step 1 — One model per op
# -------------------------
# Each op sits where real models meet it: an activation between two convs (or linears, for
# the ones transformers use), a pooling layer after a conv, a reduction in a classifier's
# head. Where a model puts an op decides its fate: x86 fuses a GELU after a linear, not after
# a conv.

for item in atlas.ENTRIES:
    print(f"{item.name:30} {atlas.placement(item)}")
after = {n: results[n]["x86"]["coverage"]["status"] for n in ("gelu", "gelu · after conv")}
print(after)
assert after == {"gelu": "int8 fused", "gelu · after conv": "float"}, "GELU fuses after a linear"


# %%
# Step 2 — The atlas
# ------------------
# One row per op. **x86**, **XNNPACK**, **OpenVINO**, **Arm**: what the quantizer did with the
# op, as ``coverage`` (M07-1) reports it: ``int8`` (it computes on int8 inputs), ``fused``
# (it runs inside the int8 conv or linear before it, as a post-op), ``shared`` (int8 passes
# through it, the same scale and zero point out as in) or ``float``. **x86 kernel**: where it
# ran, read with ``kernels_run``: a oneDNN kernel with the post-ops oneDNN ran, ``loop
# u8→u8`` (the op between a dequantize and a quantize: inductor's loop reads and writes
# uint8), a float kernel, or ``loop fp32`` (inductor's float loop); for an op the lowering
# decomposes (attention, the recurrent layers), the float kernels its model ran, the 3-D
# linears around it among them (the lowering leaves those to ``aten::addmm``).
# **XNNPACK node**: inside an XNNPACK delegate, or on ExecuTorch's portable kernels.
# **OpenVINO ran**: the precision OpenVINO's CPU plugin ran the op's layers in (its float
# layers in bf16 where the CPU has bf16, else f32). **Arm**: the annotation only: nothing
# runs Arm's int8 graph on an x86 machine (M07-3).
#
# The x86 graphs are lowered with ``lower_pt2e_quantized_to_x86`` (inductor's freezing
# passes, about a second each) and run eagerly, not compiled: a ``torch.compile`` per model
# would multiply the page's build time. Those passes prepack the int8 convs and linears and
# fuse a ReLU and an add. A compile runs the same passes, and they would fuse a GELU, SiLU,
# Hardswish or ReLU6 too, but their patterns match inductor's decomposed forms of them (SiLU
# as ``x / (exp(-x) + 1)``, ReLU6 as ``clamp_min`` then ``clamp_max``, GELU with ``erf``),
# which the lowering never produces: it keeps ``aten.gelu`` whole. Only a compile decomposes
# first. Tanh and LeakyReLU after a linear have no int8 post-op at all (Step 3). Where the
# quantizer fused an op the lowering left unfused, or the lowered graph does not run eagerly
# (the conv + add, whose residual input oneDNN wants channels-last; the flatten, whose
# ``view`` rejects the int8 conv's channels-last output), or a compile runs it otherwise (a
# weight several linears read, Step 3), the row says ``compiled``: that model alone is
# compiled with freezing (``atlas.x86_compiled``) and its call read.

SHORT = {"int8 static": "int8", "int8 fused": "fused", "int8 shared": "shared"}
compiled = {
    item.name: atlas.x86_compiled(item)
    for item in atlas.ENTRIES
    if "view size is not compatible" in results[item.name]["x86"].get("error", "")
    or (
        results[item.name]["x86"].get("coverage", {}).get("status") == "int8 fused"
        and not results[item.name]["x86"]["op"].startswith("fused")
    )
}


def status(result: dict) -> str:
    if result.get("coverage", {}).get("status", "not reported") == "not reported":
        return result["annotation"]  # read from the converted graph (or "error")
    return result["coverage"]["status"]


def cell(result: dict) -> str:
    return SHORT.get(status(result), status(result))


def x86_kernel(name: str) -> str:
    result = results[name]["x86"]
    if name in compiled:
        post_ops = compiled[name]["post_ops"]
        kernels = ["+".join([k.split("::")[1], *post_ops[k]]) for k in sorted(post_ops)]
        return ", ".join(kernels) + " (compiled)"
    where = result.get("op", "error").split(": ", 1)[-1]
    if where == "absent" and result["float"]:  # decomposed: its float kernels ran
        where = ", ".join(sorted(result["float"]))
    return where + (" (compiled)" if result.get("path") == "compiled" else "")


def xnnpack_node(result: dict) -> str:
    if "delegated" not in result:
        return "error"
    return "delegate" if result["delegated"] else "portable"


def openvino_ran(result: dict) -> str:
    found = set(result.get("precisions", {}).values()) - {"i32", "i64"}  # shape arithmetic
    return "/".join(sorted(found)) or ("error" if "error" in result else "—")


header = ("op", "x86", "x86 kernel", "XNNPACK", "XNNPACK node", "OpenVINO", "OpenVINO ran", "Arm")
rows = [header]
for name, r in results.items():
    x86, xnnpack, openvino, arm = (r[q] for q in atlas.QUANTIZERS)
    rows.append(
        (
            name,
            cell(x86),
            x86_kernel(name),
            cell(xnnpack),
            xnnpack_node(xnnpack),
            cell(openvino),
            openvino_ran(openvino),
            cell(arm),
        )
    )
widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
for row in rows:
    print("  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip())

# %%
# Step 3 — x86: the rules, checked
# --------------------------------
# ``X86InductorQuantizer`` (torchao's ``x86_inductor_quantizer.py``) annotates by these rules:
#
# 1. conv2d, linear and a ``mul`` of two tensors of one shape are int8 (its
#    ``default_quantizable_ops``): two convs' outputs, or a language model's SwiGLU,
#    ``silu(w1 x) * w3 x``, but not a mul whose operand broadcasts (ConvNeXt's layer scale
#    γ, rotary positions' ``cos`` and ``sin``): it compares the two shapes, as ``broadcasts``
#    does below. conv1d only with an ``nn.ReLU`` after it.
# 2. An activation module right after a conv or linear is fused into it, from two lists:
#    after a conv ``nn.ReLU``, ``nn.ReLU6`` (hardtanh), ``nn.Hardswish``, ``nn.SiLU``; after
#    a linear ``nn.ReLU``, ``nn.LeakyReLU``, ``nn.Tanh``, ``nn.GELU``. An ``add`` directly
#    after its conv or linear is fused too (with the ReLU after it).
# 3. max_pool2d, cat, avg_pool2d, adaptive_avg_pool2d and flatten pass int8 through when
#    their input comes from a quantized op (``int8_in_int8_out_ops``).
# 4. Everything else stays float: norms (an RMSNorm written out too), resampling,
#    reductions, the other activations, conv_transpose2d (no x86 int8 op for a transposed
#    conv), matmul, attention and a KV cache's write.

X86_INT8 = {"conv2d", "linear", "mul"}
X86_AFTER_CONV = {"relu", "hardtanh", "hardswish", "silu", "add"}
X86_AFTER_LINEAR = {"relu", "leaky_relu", "tanh", "gelu", "add"}
X86_SHARED = {"max_pool2d", "cat", "avg_pool2d", "adaptive_avg_pool2d", "flatten"}


def after_linear(item) -> bool:
    return isinstance(item.build(), atlas.BetweenLinears) or "linear" in item.name


def broadcasts(item) -> bool:
    if item.op != "mul":
        return False
    graph = torch.export.export(item.build(), item.example_args()).graph
    muls = atlas.nodes_of(item, graph)
    shapes = [{tuple(a.meta["val"].shape) for a in n.args[:2]} for n in muls]
    return any(len(pair) > 1 for pair in shapes)  # torchao's _same_shape, on each mul


def x86_rule(item) -> str:
    if item.op in X86_INT8 and not broadcasts(item):
        return "int8 static"
    if item.op in (X86_AFTER_LINEAR if after_linear(item) else X86_AFTER_CONV):
        return "int8 fused"
    if item.op in X86_SHARED:
        return "int8 shared"
    return "float"


x86_wrong = {
    item.name: (status(results[item.name]["x86"]), x86_rule(item))
    for item in atlas.ENTRIES
    if status(results[item.name]["x86"]) != x86_rule(item)
}
print(x86_wrong or "x86: every op as the rules say")
assert not x86_wrong, "x86 annotates every op as its rules say"

# %%
# What ran agrees, but for two ops and one weight. Every int8 conv and linear ran a oneDNN
# int8 kernel, and every fused op ran as that kernel's post-op (``relu``, ``gelu``, ``add``),
# read from oneDNN's own log of the call, except Tanh and LeakyReLU after a linear: annotated
# fused, no qlinear post-op for them. The quantizer annotates Linear + Tanh and Linear +
# LeakyReLU as one pattern each, but inductor's int8 linear fusions have post-ops for ReLU and
# GELU only, so the Tanh or LeakyReLU runs in inductor's float loop on the linear's float
# output. The lowering itself fused only the ReLUs and the adds (Step 2): every other fused
# op is still whole in the lowered graph, and its row reads the compiled call. The fused rows:

LOWERING_FUSES = {"relu", "add"}
NO_POST_OP = {"tanh", "leaky_relu"}
SHARED_WEIGHT = "linear · weight shared"

outside = []  # fused rows whose op ran outside the int8 kernel
for item in atlas.ENTRIES:
    r = results[item.name]["x86"]
    if status(r) == "int8 static" and item.op != "mul":
        assert r["op"].startswith("oneDNN"), f"{item.name}: a oneDNN int8 kernel ran"
        assert ("fp32" in r["op"]) == (item.name == SHARED_WEIGHT), f"{item.name}: all int8"
    if status(r) != "int8 fused":
        continue
    if item.op not in LOWERING_FUSES:
        assert r["op"].startswith("loop"), f"{item.name}: the lowering keeps the op whole"
    where = r["op"]
    if item.name in compiled:  # the post-ops the compiled call ran
        post_ops = {op for ops in compiled[item.name]["post_ops"].values() for op in ops}
        if item.op in NO_POST_OP:
            assert item.op not in post_ops, f"{item.name}: the op runs outside the kernel"
            outside.append(item.name)
            continue
        where = "fused: " + ", ".join(sorted(post_ops)) + " (compiled)"
    assert where.startswith("fused: ") and item.op in where.replace("sum", "add"), (
        f"{item.name}: a post-op of the int8 kernel"
    )
    print(f"{item.name:26} {where}")
print(f"annotated fused, no qlinear post-op for them: {', '.join(outside)}")
assert outside == ["leaky_relu · after linear", "tanh"], "Tanh and LeakyReLU after a linear"

# %%
# In the converted graph a fused op has no quantize/dequantize pair before it: x86 leaves the
# linear's output float for the GELU, which oneDNN then computes inside the int8 linear.

gelu = atlas.entry("gelu")
draw(atlas.quantize(gelu, "x86"), highlight=["linear", "gelu"], title="x86: linear + GELU, fused")

# %%
# And why the others stay float, in the quantizer's words (``coverage``'s reason):

why_float = Counter(
    results[item.name]["x86"]["coverage"]["reason"]["en"]
    for item in atlas.ENTRIES
    if results[item.name]["x86"]["coverage"]["status"] == "float"
)
for reason, count in why_float.most_common():
    print(f"×{count:<3}{reason}")

# %%
# The weight: one ``nn.Linear`` called at two steps of a recurrent cell (the row
# ``linear · weight shared``; a GRU-like cell written with ``nn.Linear`` calls its weights at
# every step). Both calls are annotated int8, and lowered they run two int8 kernels;
# compiled, they run float (``aten::addmm``) beside the int8 linear before them. Before its
# freezing passes a compile merges equal nodes, and the two dequantize nodes of the one int8
# weight become one node with two users, which the passes' int8 weight pattern (one user)
# does not match.

shared = results[SHARED_WEIGHT]["x86"]
print(f"{SHARED_WEIGHT}: {shared['path']}, int8 {shared['int8']}, float {shared['float']}")
assert shared["path"] == "compiled", "compiled: the lowering would run it int8"
assert shared["int8"] == {"onednn::qlinear_pointwise": 1}, "the linear before them int8"
assert shared["float"] == {"aten::addmm": 2}, "both readers of the shared weight run float"

# %%
# The fix is one int8 constant per reader: give each step a copy of the module (the same
# values, the same outputs). Compiled, every linear runs int8.

unrolled = atlas.entry(SHARED_WEIGHT)


def copy_per_step() -> nn.Module:
    model = unrolled.build()
    model.steps = nn.ModuleList(copy.deepcopy(step) for step in model.steps)
    return model


copied = atlas.Entry(
    "linear · weight copied", unrolled.ops, "a copy per step", copy_per_step, unrolled.shape
)
x = unrolled.example_args()
assert torch.equal(copy_per_step()(*x), unrolled.build()(*x)), "the same outputs"
fixed = atlas.x86_compiled(copied)
print(f"copied: int8 {fixed['int8']}, float {fixed['float']}")
assert fixed["int8"] == {"onednn::qlinear_pointwise": 3} and not fixed["float"], "all int8"

# %%
# Step 4 — XNNPACK: delegated, or why not
# ---------------------------------------
# ``XNNPACKQuantizer`` annotates by its own rules (its ``SUPPORTED_PATTERNS`` and
# ``propagate_annotation``):
#
# 1. Every conv (1-D, 2-D, depthwise, transposed), linear, add and mul is int8, each by a
#    pattern of its own; a ReLU right after a conv or linear is fused into it.
# 2. cat, max_pool2d, adaptive_avg_pool2d, hardtanh, mean and the layout ops (flatten,
#    reshape, permute, transpose, slice) and an eval-mode dropout share their input's
#    qparams. A mean XNNPACK's partitioner then refuses (anything but a 4-D mean over H and W
#    with keepdim) runs on the portable kernels in float: ``coverage`` counts it float.
# 3. Everything else stays float, scaled_dot_product_attention too: the quantizer
#    annotates nothing on it. Between int8 linears it reads their dequantized outputs, and its
#    output is quantized for the next linear, but none of its own math is int8 (below).

XNNPACK_INT8 = {"conv1d", "conv2d", "conv_transpose2d", "linear", "add", "mul"}
XNNPACK_SHARED = {"cat", "max_pool2d", "adaptive_avg_pool2d", "hardtanh", "mean"}
XNNPACK_SHARED |= {"flatten", "reshape", "permute", "transpose", "slice", "dropout"}


def xnnpack_rule(item) -> str:
    if item.op in XNNPACK_INT8:
        return "int8 static"
    if item.op == "relu":
        return "int8 fused"
    if item.op == "mean" and item.name != "mean · keepdim":
        return "float"  # annotated, then refused by the partitioner: portable, float
    return "int8 shared" if item.op in XNNPACK_SHARED else "float"


xnnpack_wrong = {
    item.name: (status(results[item.name]["xnnpack"]), xnnpack_rule(item))
    for item in atlas.ENTRIES
    if status(results[item.name]["xnnpack"]) != xnnpack_rule(item)
}
print(xnnpack_wrong or "XNNPACK: every op as the rules say")
assert not xnnpack_wrong, "XNNPACK annotates every op as its rules say"

# %%
# scaled_dot_product_attention, then, is float between int8 linears. XNNPACK's delegates take
# the linears, int8, and the attention's two matrix products as ``bmm``, an op XNNPACK has
# only a float kernel for (``common.edge.SUPPORTED``), on the dequantized q, k and v; its
# softmax is float too, and its scale and mask ops run on the portable kernels.

sdpa = results["scaled_dot_product_attention"]["xnnpack"]
in_xnnpack = {re.sub(r"^aten_|_default(_\d+)?$", "", n) for n in chain(*sdpa["delegates"].values())}
print(f"scaled_dot_product_attention: {cell(sdpa)} (between int8 linears)")
print(f"  XNNPACK: {', '.join(sorted(in_xnnpack & {'linear', 'bmm', '_softmax'}))}")
print(f"  portable: {', '.join(sdpa['portable'])}")
assert status(sdpa) == sdpa["annotation"] == "float", "XNNPACK annotates nothing on SDPA"
assert {"linear", "bmm", "_softmax"} <= in_xnnpack, "linears, bmm and softmax in XNNPACK"
assert not edge.SUPPORTED["bmm.default"].int8, "XNNPACK's bmm is float only"

# %%
# ``XnnpackPartitioner`` takes an op when one of its configs covers it and the config's
# constraint holds; a config that refuses logs why (``WhyNoPartition``). The ops left to the
# portable kernels, with XNNPACK's reason, or the course partitioner's table
# (``common.edge.PORTABLE``) where XNNPACK has no config to log one. An RMSNorm as Llama
# writes it runs in XNNPACK (float) but for its mean, over the last axis; a KV cache's write,
# ``index_put`` on the edge graph, has no XNNPACK config:

portable = {n: r["xnnpack"] for n, r in results.items() if r["xnnpack"].get("delegated") is False}
for name, r in portable.items():
    table = [edge.PORTABLE[k] for k in edge.PORTABLE if k.split(".")[0] in r["portable"]]
    reason = r["why"] or "; ".join(dict.fromkeys(table)) or "no XNNPACK config"
    print(f"{name:30} {', '.join(r['portable'])[:30]:30} {reason}")
assert "mean · keepdim" not in portable, "a 4-D mean over H and W with keepdim runs in XNNPACK"
assert "mean · last axis" in portable, "a mean over the last axis of a 3-D tensor does not"
assert "layer_norm" in portable, "XNNPACK has no layer norm"
rms_norm = portable["rms_norm · as Llama writes it"]
assert rms_norm["portable"] == ["mean"], "the RMSNorm's pow and rsqrt run in XNNPACK, its mean not"
assert portable["index_copy_ · KV cache"]["portable"] == ["index_put"], "a cache's write"

# %%
# Step 5 — OpenVINO and Arm
# -------------------------
# OpenVINO's CPU plugin runs every conv and linear in u8. Its runtime model also shows what
# the annotation does not: some ops NNCF left unquantized run in u8 anyway (the plugin moves
# the quantization across them, or fuses them into the conv before), and conv_transpose2d,
# annotated int8, runs in float. And ``OpenVINOQuantizer`` itself fails on four models: on
# layer_norm and group_norm in calibration (an observer it puts on the norm's 1-D weight
# fails: ``IndexError``), on the recurrent layers while quantizing (``TypeError``).

openvino = {n: r["openvino"] for n, r in results.items()}
for name in ("conv2d", "linear", "conv1d"):
    assert set(openvino[name]["precisions"].values()) == {"u8"}, f"OpenVINO: {name} in u8"
transposed = openvino["conv_transpose2d"]
print(transposed["precisions"])
assert status(transposed) == "int8 static", "annotated int8"
assert "u8" not in transposed["precisions"].values(), "run in float"
refused = {n: r["error"] for n, r in openvino.items() if "error" in r}
print(refused)
assert set(refused) == {"layer_norm", "group_norm", "lstm", "gru"}
assert refused["layer_norm"].startswith("IndexError"), "the norms fail in calibration"

# %%
# ``ArmInductorQuantizer`` derives from ``X86InductorQuantizer`` with a narrower recipe and
# its own config (int8 activations, per-tensor weights): conv2d and linear int8, some of
# x86's fusions, no int8 pass-through. Every op it quantizes, x86 quantizes too:

arm = Counter(status(r["arm"]) for r in results.values())
print(dict(arm))
arm_int8 = {n for n, r in results.items() if status(r["arm"]) != "float"}
x86_int8 = {n for n, r in results.items() if status(r["x86"]) != "float"}
print(sorted(arm_int8))
assert arm_int8 <= x86_int8, "Arm quantizes no op x86 leaves float"
assert "int8 shared" not in arm

# %%
# Summary
# -------
# - x86: conv2d, linear, same-shape mul int8 (a broadcast mul float); ReLU, ReLU6,
#   Hardswish, SiLU fused after a conv, ReLU, LeakyReLU, Tanh, GELU after a linear, add after
#   its conv or linear; max_pool2d, cat, avg_pool2d, adaptive_avg_pool2d, flatten int8
#   through; the rest float.
#   Run: every fused op a oneDNN post-op (the lowering fuses ReLU and add, a compile the
#   others), but Tanh and LeakyReLU after a linear, which inductor leaves in a float loop;
#   compiled, the linears that read one weight run float: one int8 constant per reader.
# - XNNPACK: convs, linears, add, mul int8, ReLU fused, pooling by max, cat and layout ops
#   shared; SDPA float between int8 linears; the portable ops are the ones no config covers,
#   or whose constraint refused them (a mean only over H, W of a 4-D tensor, with keepdim).
# - OpenVINO: convs and linears in u8; the runtime model, not the annotation, says the rest.
# - Arm: annotation only; a subset of x86's.
#
# Exercises
# ---------
# 1. Put ``nn.SiLU`` between two linears instead of two convs. Predict x86's annotation.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from torch import nn
#
#          silu = atlas.Entry(
#              "silu · after linear",
#              ("silu",),
#              "between linears",
#              lambda: atlas.BetweenLinears(nn.SiLU()).eval(),
#              atlas.TOKENS,
#          )
#          fate = atlas.reported(silu, "x86")
#          print(fate["reason"]["en"])
#          assert fate["status"] == "float", "SiLU fuses after a conv only"
#
# 2. Put Inception v3's pool branch, ``nn.AvgPool2d(3, stride=1, padding=1)``, between two
#    convs (the atlas's ``avg_pool2d`` has no padding). Predict whether XNNPACK delegates it;
#    then with ``count_include_pad=False``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          def branch_pool(include_pad: bool) -> atlas.Entry:
#              pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=include_pad)
#              return atlas.Entry(
#                  f"avg_pool2d · padding 1, count_include_pad={include_pad}",
#                  ("avg_pool2d",),
#                  "between convs (Inception v3's pool branch)",
#                  lambda: atlas.BetweenConvs(pool).eval(),
#                  atlas.IMAGE,
#              )
#
#
#          for include_pad in (True, False):
#              pool = branch_pool(include_pad)
#              ran = atlas.xnnpack_runs(pool, atlas.quantize(pool, "xnnpack"))
#              print(f"count_include_pad={include_pad}: delegated {ran['delegated']} {ran['why']}")
#              assert ran["delegated"] is not include_pad, "XNNPACK averages real pixels only"
#
# Further reading
# ---------------
# - `X86InductorQuantizer source
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `XNNPACK partitioner configs
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/partition/config>`_
#
# Next
# ----
# :ref:`M07-5 · Rewrites that buy more int8
# <sphx_glr_lessons_m07_your_model_m07_5_rewrites_for_int8.py>` makes some of the ops the
# atlas leaves in float int8, with five rewrites that leave the outputs unchanged.
