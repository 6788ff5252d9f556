"""
M03-1 The lowered graph
=======================

After ``convert_pt2e`` the graph only *simulates* int8: every conv and linear still runs in
float, between a dequantize and a quantize. **Lowering** replaces each such group by one real
int8 operator of oneDNN, the CPU library behind PyTorch's x86 kernels. This lesson runs
torchao's ``lower_pt2e_quantized_to_x86`` on ``small_cnn``, reads the lowered graph node by
node, runs into a failure that torchao 0.18 leaves in it, fixes it, and measures how far the
real int8 result is from the simulated one — and why.

**What you will learn**

- Which dequantize → conv/linear → quantize groups become which ``torch.ops.onednn`` op
- Where the prepacked int8 weights live, and which quantize/dequantize nodes remain
- Why the int8 result differs from the simulated one on a CPU without VNNI, and how to see
  both kernel paths on one CPU

**Prerequisites**:
:ref:`M02-3 · convert by hand <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``small_cnn`` quantized with ``X86InductorQuantizer``, the quantizer the x86 lowering is
# written for (uint8 activations, int8 per-channel weights).

import torch

from common.cpu import describe, run_under_isa, weaker_paths
from common.expect import expect_error
from common.models import example_inputs, get_model
from common.numerics import sqnr
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common.lowering import reshape_views

x = example_inputs(8)


def quantize(quantizer):
    prepared = prepare_pt2e(export_module(get_model("small_cnn"), x), quantizer)
    calibrate(prepared)
    return convert_pt2e(prepared)


simulated = quantize(x86_quantizer())
qdq = [n.name for n in simulated.graph.nodes if "quantize_per_tensor" in str(n.target)]
draw(simulated, highlight=qdq, title="Before: the q/dq graph (int8 simulated in float)")

# %%
# Two helpers: ``ops`` counts a graph's operators by short name, and ``Recorder`` runs a
# graph node by node (``torch.fx.Interpreter``) and keeps every node's output, so we can look
# inside a graph that fails.

from common.pt2e import op_counts as ops


class Recorder(torch.fx.Interpreter):
    """Runs a graph and keeps each node's output in ``self.values`` (even if a later node fails)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, node):
        self.values[node.name] = super().run_node(node)
        return self.values[node.name]


# %%
# Step 1 — Lower with torchao
# ---------------------------
# ``lower_pt2e_quantized_to_x86(model, example_inputs)`` returns a new graph. The conv and the
# linear are gone; in their place stand ``onednn.qconv_pointwise`` and
# ``onednn.qlinear_pointwise``.

lowered = lower_pt2e_quantized_to_x86(simulated, x)
onednn_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
draw(lowered, highlight=onednn_ops, title="After: lowered to oneDNN int8 ops")
before, after = ops(simulated), ops(lowered)
print(f"before: {dict(before)}")
print(f"after:  {dict(after)}")
assert (
    after["onednn.qconv_pointwise.default"] == 1 and after["onednn.qlinear_pointwise.default"] == 1
)
assert not after["aten.conv2d.default"] and not after["aten.linear.default"], "no float conv/linear"

# %%
# Step 2 — Which group became which op
# ------------------------------------
# In the q/dq graph the conv group was ``dequantize → conv2d → relu → quantize``. All four
# nodes became one ``qconv_pointwise``: it reads the uint8 tensor (not its dequantize),
# applies ``relu`` as a fused *post-op*, and requantizes its result to uint8 with the scale of
# the quantize it replaced. The linear group had no quantize after it, so ``qlinear_pointwise``
# returns float32.

conv, linear = (n for n in lowered.graph.nodes if n.name in onednn_ops)
old_q = next(n for n in simulated.graph.nodes if n.name == "quantize_per_tensor_default_1")
print(f"conv:   input {conv.args[0].name}, output {conv.args[13]} × {conv.args[11]:.6f}", end="")
print(f", post-op {conv.args[14]!r}")
print(f"linear: input {linear.args[0].name}, output {linear.args[9]}, post-op {linear.args[10]!r}")
print(f"the replaced quantize after relu: scale {old_q.args[1]:.6f}")
assert conv.args[0].target == torch.ops.quantized_decomposed.quantize_per_tensor.default
assert (conv.args[13], conv.args[14], conv.args[11]) == (torch.uint8, "relu", old_q.args[1])
assert (linear.args[9], linear.args[10]) == (torch.float32, "none")

# %%
# Step 3 — Where the int8 weights live
# ------------------------------------
# The weight argument (``args[3]``) is a ``get_attr`` of a constant made once at lowering time
# by ``onednn.qconv_prepack`` / ``qlinear_prepack``: the same int8 numbers as the q/dq graph's
# ``_frozen_param`` weights, **prepacked** — reordered into oneDNN's blocked memory layout
# (``torch._mkldnn``), the linear's stored transposed. ``to_dense()`` reads them back.

for node in (conv, linear):
    packed = getattr(lowered, node.args[3].target)
    print(f"{node.args[3].target}: {packed.layout}, {packed.dtype}, shape {tuple(packed.shape)}")
conv_w, linear_w = (getattr(lowered, n.args[3].target).to_dense() for n in (conv, linear))
assert getattr(lowered, conv.args[3].target).layout == torch._mkldnn
assert torch.equal(conv_w, simulated._frozen_param0), "the conv's int8 weight, unchanged"
assert torch.equal(linear_w, simulated._frozen_param1.t()), "the linear's, transposed"

# %%
# Step 4 — The quantize/dequantize nodes that remain
# --------------------------------------------------
# Every dequantize that fed a conv or linear was absorbed. What remains sits around ops with no
# int8 operator in this lowering: the input's quantize (the model still takes float images),
# and the pairs around ``max_pool2d`` and the ``view`` that ``flatten`` became.

remaining = [n for n in lowered.graph.nodes if "quantize_per_tensor" in str(n.target)]
for node in remaining:
    print(f"{node.name:26} reads {node.args[0].name:26} read by {[u.name for u in node.users]}")
assert after["quantize_per_tensor.default"] == 3 and after["dequantize_per_tensor.default"] == 2
dq_users = {u.target for n in remaining if "dequantize" in n.name for u in n.users}
assert dq_users == {torch.ops.aten.max_pool2d_with_indices.default, torch.ops.aten.view.default}

# %%
# Step 5 — Run it: a failure, and why
# -----------------------------------
# The lowered graph fails on ``aten.view``. The ``Recorder`` shows why: oneDNN's conv returns
# its output **channels-last** (NHWC in memory), max pool keeps that layout, and a ``view``
# cannot regroup C×H×W of an NHWC tensor without copying. The q/dq graph's float conv returned
# a contiguous (NCHW) tensor, which is what the re-export traced ``flatten`` with — so it wrote
# ``view``.

recorder = Recorder(lowered)
with expect_error(RuntimeError, match="view size is not compatible"):
    recorder.run(*x)
conv_out = recorder.values[conv.name]
recorded = Recorder(simulated)
recorded.run(*x)
print(f"conv output {tuple(conv_out.shape)}, strides:")
print(f"  lowered (NHWC in memory) {conv_out.stride()}")
print(f"  q/dq    (NCHW in memory) {recorded.values['conv2d'].stride()}")
assert conv_out.is_contiguous(memory_format=torch.channels_last) and not conv_out.is_contiguous()
assert recorded.values["conv2d"].is_contiguous(), "the float conv's output is NCHW"

# %%
# Compiling does not rescue this graph: ``torch.compile(lowered)`` traces the same ``view``
# with fake tensors of the same strides and refuses it the same way. What compiles is the
# *q/dq* graph with freezing, where inductor does the lowering itself and picks the layouts
# (:ref:`M03-3 · speed and size <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`).

with expect_error(RuntimeError, match="Cannot view a tensor"):
    torch.compile(lowered)(*x)
torch._dynamo.reset()

# %%
# The fix: make each ``view`` a ``reshape``, which returns the same values and copies only
# when a view is impossible (``common.lowering.reshape_views``, five lines). Now it runs.

print(f"changed: {reshape_views(lowered)}")
y_int8, y_simulated = lowered(*x), simulated(*x)
print("output", tuple(y_int8.shape), y_int8.dtype)
assert y_int8.shape == y_simulated.shape

# %%
# Step 6 — Real int8 against simulated int8
# -----------------------------------------
# Compare the conv's uint8 output, in quantization steps, on unseen images. Where oneDNN sums
# the integer products exactly in int32 and then requantizes (rescales with the input and
# weight scales, adds the bias, applies relu, rounds), the two agree to ±1 step: the
# simulation does the same in float, where a rounding at a half-step can tip the other way.
# Whether the sums are exact depends on the CPU, as the next cells show. The output's SQNR
# (``common.numerics.sqnr``, which M04-1 derives) puts the whole gap in decibels.

fresh = example_inputs(8, seed=123)


def conv_steps(model, quantized_model):
    """Largest difference, in steps, between the conv's uint8 outputs, and the share that differ."""
    real, sim = Recorder(model), Recorder(quantized_model)
    real.run(*fresh)
    sim.run(*fresh)
    a = real.values[conv.name].int()
    b = sim.values["quantize_per_tensor_default_1"].int()
    return (a - b).abs().max().item(), (a != b).float().mean().item()


steps, share = conv_steps(lowered, simulated)
output_sqnr = sqnr(simulated(*fresh), lowered(*fresh)).item()
cpu = describe()
print(cpu.verdict)
print(f"int8 path {cpu.onednn}: the conv output differs by up to {steps} steps")
print(f"on {share:.1%} of its values; output SQNR {output_sqnr:.1f} dB")

# %%
# How far apart they are depends on the CPU's int8 instructions. **With VNNI** (or AMX),
# oneDNN adds four uint8 × int8 products straight into an int32: the sums are exact, and only
# a rounding at a half-step can differ — at most 1 step. **Without VNNI** (AVX2, and AVX-512
# without VNNI such as Skylake-SP), it uses ``vpmaddubsw``, which adds *pairs* of products
# into a **16-bit** integer and saturates when a pair exceeds 32767 (255 × 127 × 2 = 64770
# can): then whole outputs go wrong by tens of steps. ``get_cpu_capability()`` says
# ``"AVX512"`` in both AVX-512 cases; the line above reads ``torch.cpu.get_capabilities()``
# and names the path oneDNN takes. This page was built on a CPU of this kind:

print(
    f"{cpu.onednn}, VNNI: exact int32 sums, rounding only"
    if cpu.vnni
    else f"{cpu.onednn}, no VNNI: 16-bit pair sums, which saturate"
)

# %%
# The remedy is as old as the instruction: ``reduce_range=True`` quantizes activations to
# 0…127 (7 bits), so no pair can overflow. With it, the two agree to ±1 step on any CPU,
# and the outputs differ by rounding only.

reduced = quantize(
    X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(reduce_range=True)
    )
)
reduced_lowered = lower_pt2e_quantized_to_x86(reduced, x)
reshape_views(reduced_lowered)
steps_7bit, share_7bit = conv_steps(reduced_lowered, reduced)
sqnr_7bit = sqnr(reduced(*fresh), reduced_lowered(*fresh)).item()
print(f"reduce_range=True: up to {steps_7bit} step(s) on {share_7bit:.1%}; SQNR {sqnr_7bit:.1f} dB")
assert steps_7bit <= 1, "exact int32 accumulation: only rounding at half-steps can differ"
assert sqnr_7bit > 40, "the outputs differ by rounding only"

# %%
# Step 7 — Both kernel paths, side by side
# ----------------------------------------
# oneDNN reads ``ONEDNN_MAX_CPU_ISA`` (``AVX2``, ``AVX512_CORE`` = AVX-512 without VNNI, …)
# once, at its first use, and ATen reads ``ATEN_CPU_CAPABILITY``: another kernel path needs a
# fresh interpreter. ``run_under_isa(isa, source)`` runs ``source`` in one, capped at ``isa``,
# and returns the ``result`` it sets. The source repeats steps 1, 5 and 6 for both recipes.

STEP_6 = """
import torch
from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)
from common.lowering import reshape_views
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module

x, fresh = example_inputs(8), example_inputs(8, seed=123)


def output_of(gm, name):
    run = torch.fx.Interpreter(gm, garbage_collect_values=False)  # keeps every node's value
    run.run(*fresh)
    return next(value for node, value in run.env.items() if node.name == name).int()


result = {}
for reduce_range in (False, True):
    config = get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
    prepared = prepare_pt2e(
        export_module(get_model("small_cnn"), x), X86InductorQuantizer().set_global(config)
    )
    calibrate(prepared)
    simulated = convert_pt2e(prepared)
    lowered = lower_pt2e_quantized_to_x86(simulated, x)
    reshape_views(lowered)
    (conv,) = [n.name for n in lowered.graph.nodes if "qconv" in str(n.target)]
    a, b = output_of(lowered, conv), output_of(simulated, "quantize_per_tensor_default_1")
    steps = (a - b).abs().max().item()
    result["7-bit" if reduce_range else "8-bit"] = [steps, (a != b).float().mean().item()]
"""

# %%
# One row per kernel path: this process's, then every weaker one this CPU can be capped to
# (a cap never raises the path, so a CPU without VNNI shows one row). Emulation changes the
# instructions, and so the numbers; it does not give a real AVX2 chip's speed.
# (``ONEDNN_VERBOSE=1`` in the environment makes oneDNN print the kernel it takes, e.g.
# ``jit_uni_int8:avx2`` or ``brg_conv_fwd:avx512_core_vnni``.)

rows = {cpu.onednn: (cpu.vnni, [steps, share], [steps_7bit, share_7bit])}
for isa in weaker_paths():
    other = run_under_isa(isa, STEP_6)
    result = other["result"]
    rows[other["cpu"]["onednn"]] = (other["cpu"]["vnni"], result["8-bit"], result["7-bit"])
print(f"{'int8 path':18} {'VNNI':5} {'8-bit: steps, share':>20} {'reduce_range: steps, share':>28}")
for path, (vnni, full, seven) in rows.items():
    print(
        f"{path:18} {'yes' if vnni else 'no':5} {full[0]:>10}, {full[1]:7.1%}"
        f" {seven[0]:>17}, {seven[1]:7.1%}"
    )

# %%
# With VNNI the two agree to ±1 step; without it the 8-bit recipe saturates, and
# ``reduce_range=True`` brings every path back to ±1 step.

for path, (vnni, full, seven) in rows.items():
    if vnni:
        assert full[0] <= 1, f"{path}: with VNNI, exact int32 sums: rounding only"
    else:
        assert full[0] > 1, f"{path}: without VNNI, 16-bit pair sums saturate"
    assert seven[0] <= 1, f"{path}: with 7-bit activations no pair can overflow"

# %%
# Summary
# -------
# ===========================================  =================================================
# q/dq graph (``convert_pt2e``)                lowered graph
# ===========================================  =================================================
# ``dequantize → conv2d → relu → quantize``    ``onednn.qconv_pointwise``, post-op relu, uint8
# ``dequantize → linear``                      ``onednn.qlinear_pointwise``, float32 output
# int8 weights ``_frozen_param0/1``            prepacked ``torch._mkldnn`` constants
# quantize/dequantize by max pool and view     unchanged (no int8 op for them here)
# ===========================================  =================================================
#
# torchao 0.18's lowered graph fails when run eagerly if a ``flatten`` follows an int8 conv:
# ``reshape_views`` fixes it (``torch.compile`` does not). The int8 result equals the
# simulation to ±1 step when no 16-bit overflow occurs — always with VNNI; without it (AVX2,
# AVX-512 without VNNI) only with ``reduce_range=True``. ``run_under_isa`` shows both paths
# on a CPU with VNNI.
#
# Exercises
# ---------
# 1. Lower ``conv_bn_relu`` instead. Predict the op counts: how many onednn ops, how many
#    quantize and dequantize nodes, and the output dtype of the conv?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          other_q = prepare_pt2e(export_module(get_model("conv_bn_relu"), x), x86_quantizer())
#          calibrate(other_q)
#          other = lower_pt2e_quantized_to_x86(convert_pt2e(other_q), x)
#          print(ops(other))
#          assert ops(other) == {
#              "onednn.qconv_pointwise.default": 1,
#              "quantize_per_tensor.default": 1,
#          }, "bn folded, relu fused, nothing after it to quantize"
#          (qconv,) = [n for n in other.graph.nodes if "onednn" in str(n.target)]
#          assert qconv.args[13] == torch.float32
#
# 2. Lower ``conv_relu``, which has no ``flatten`` after its conv. Predict: does the lowered
#    graph run without ``reshape_views``? In which memory layout does the caller get its
#    output, and what happens to a caller who flattens it with ``.view``?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          no_flatten_q = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
#          calibrate(no_flatten_q)
#          no_flatten_sim = convert_pt2e(no_flatten_q)
#          no_flatten = lower_pt2e_quantized_to_x86(no_flatten_sim, x)
#          assert not ops(no_flatten)["aten.view.default"], "no view in the graph: it runs as it is"
#          out, out_sim = no_flatten(*fresh), no_flatten_sim(*fresh)
#          print(f"strides: lowered {out.stride()}, q/dq {out_sim.stride()}")
#          assert out.is_contiguous(memory_format=torch.channels_last), (
#              "the int8 conv's channels-last output reaches the caller"
#          )
#          assert not out.is_contiguous() and out_sim.is_contiguous(), "the q/dq one: NCHW"
#          with expect_error(RuntimeError, match="view size is not compatible"):
#              out.view(len(out), -1)  # the same failure, now in the caller's code
#
# Further reading
# ---------------
# - `PyTorch 2 Export Quantization with X86 Backend through Inductor
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
# - `torch.fx Interpreter <https://docs.pytorch.org/docs/stable/fx.html#the-interpreter-pattern>`_
# - :ref:`Troubleshooting: lowering and speed
#   <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>` —
#   the same failure, found by its error message
# - :ref:`Troubleshooting: accuracy, eval and QAT
#   <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# :ref:`M03-2 · lowering by hand <sphx_glr_lessons_m03_lowering_m03_2_lowering_by_hand.py>`
# rebuilds this graph with the graph edits of M00-4, bit for bit.
