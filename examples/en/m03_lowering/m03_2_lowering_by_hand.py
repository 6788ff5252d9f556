"""
M03-2 Lowering by hand
======================

torchao lowers a quantized graph with inductor's pattern matcher; nothing in it needs more
than the graph edits of M00-4. This lesson rewrites ``small_cnn``'s q/dq graph into oneDNN int8
ops by hand — match the group around the conv, prepack its weight, insert the int8 op, erase
the old nodes — and ends with a graph whose operators, constants and outputs are those of
``lower_pt2e_quantized_to_x86``: not close, identical.

**What you will learn**

- The moves of a lowering: match, prepack, replace, fuse post-ops, fold constants
- What ``common.lowering.lower`` does, and what it refuses
- How to prove two lowerings equal when the weights are opaque oneDNN tensors

**Prerequisites**:
:ref:`M03-1 · the lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`,
:ref:`M00-4 · graph surgery <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 4

# %%
# Setup
# -----
# The quantized ``small_cnn`` of M03-1; ``reference`` is torchao's lowering of it.

import copy

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet, x86_quantizer
from common.viz import draw, draw_diff

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common import lowering

aten, onednn = torch.ops.aten, torch.ops.onednn
x = example_inputs(8)


def quantize(model):
    prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
    calibrate(prepared)
    return convert_pt2e(prepared)


simulated = quantize(get_model("small_cnn"))
reference = lower_pt2e_quantized_to_x86(simulated, x)

# %%
# Step 1 — Start from torchao's starting point
# --------------------------------------------
# torchao first re-exports the model with the decompositions of *composite* ops, the form its
# patterns are written against: ``conv2d`` becomes ``aten.convolution``, ``linear`` becomes a
# ``permute`` of the weight and an ``addmm``, ``flatten`` a ``view``. ``lowering.reexport`` is
# that step, unchanged; the rest is ours.

gm = lowering.reexport(simulated, x)
graph = gm.graph
draw(gm, title="Before: re-exported q/dq graph")
print(dict(op_counts(gm)))
assert op_counts(gm)["aten.convolution.default"] == 1 and op_counts(gm)["aten.addmm.default"] == 1
assert not op_counts(gm)["aten.linear.default"], "linear is decomposed"

# %%
# Step 2 — The conv: match, prepack, replace
# ------------------------------------------
# The pattern is ``convolution(dequantize(x_uint8), dequantize_per_channel(w_int8))``. The int8
# op reads ``x_uint8`` directly, with the dequantize's scale and zero point as arguments; the
# weight goes through ``onednn.qconv_prepack`` (for now a node; step 5 runs it once). Then the
# old nodes go: conv first, while the dequantize nodes still have it as a user they cannot.

before = copy.deepcopy(gm)
conv = next(iter(graph.find_nodes(op="call_function", target=aten.convolution.default)))
out = (1.0, 0, torch.float32, "none", [], "")  # float32 output (scale 1, zero point 0), no post-op
x_dq, w_dq, bias, stride, padding, dilation, _, _, groups = conv.args
qx, x_scale, x_zp = x_dq.args[:3]
qw, w_scale, w_zp = w_dq.args[:3]
with graph.inserting_before(conv):
    packed = graph.call_function(
        onednn.qconv_prepack.default,
        (qw, w_scale, x_scale, x_zp, stride, padding, dilation, groups, qx.meta["val"].shape),
    )
    qconv = graph.call_function(
        onednn.qconv_pointwise.default,
        (qx, x_scale, x_zp, packed, w_scale, w_zp, bias, stride, padding, dilation, groups, *out),
    )
conv.replace_all_uses_with(qconv)
qconv.meta.update(conv.meta)
for node in (conv, x_dq, w_dq):
    graph.erase_node(node)
gm.recompile()
draw_diff(before, gm, title="Step 2: the conv is an int8 oneDNN op")
assert qconv.args[0].target == torch.ops.quantized_decomposed.quantize_per_tensor.default

# %%
# Step 3 — The linear, the same way
# ---------------------------------
# ``addmm(bias, dequantize(x), permute(dequantize_per_channel(w)))`` becomes
# ``qlinear_pointwise`` on ``qlinear_prepack(w)``; ``lowering.prepack_linear`` is that, written
# like step 2 (read it in ``common/lowering.py``).

addmm = next(iter(graph.find_nodes(op="call_function", target=aten.addmm.default)))
qlinear = lowering.prepack_linear(gm, addmm)
gm.recompile()
print(qlinear.format_node())
assert not graph.find_nodes(op="call_function", target=aten.addmm.default)

# %%
# Step 4 — Fuse what follows into the int8 ops
# --------------------------------------------
# ``qconv → relu → quantize`` becomes one ``qconv_pointwise`` with post-op ``relu`` and uint8
# output at the quantize's scale: the same replace-and-erase, over a chain of three nodes.
# ``lowering.fuse_post_ops`` tries inductor's patterns in its order (int8 outputs first, then
# float ones; ``add`` of a residual too).

before = copy.deepcopy(gm)
lowering.fuse_post_ops(gm)
(qconv,) = graph.find_nodes(op="call_function", target=onednn.qconv_pointwise.default)
print(qconv.format_node())
assert (qconv.args[13], qconv.args[14]) == (torch.uint8, "relu")
assert not graph.find_nodes(op="call_function", target=aten.relu.default), "relu went in"
draw_diff(before, gm, title="Step 4: relu and quantize fused into the int8 ops")

# %%
# Step 5 — Run the prepacks once: constants
# -----------------------------------------
# A prepack node depends on constants only, so, as in M02-3's weight folding, it is run now
# and its result stored as a buffer ``_frozen_paramN`` read by a ``get_attr`` with the node's
# name. The int8 weights of the q/dq graph lose their last reader and are deleted.

lowering.fold_prepacked_weights(gm)
frozen = [n for n in graph.nodes if n.op == "get_attr" and "prepack" in n.name]
draw(gm, highlight=[n.name for n in frozen], title="Step 5: prepacked int8 weights as constants")
for node in frozen:
    print(f"{node.name} reads {node.target}: {getattr(gm, node.target).layout}")
assert not any(n.target in lowering.PREPACK for n in graph.nodes)

# %%
# Step 6 — Compare with torchao
# -----------------------------
# Same operators, same constants, same outputs. The prepacked weights are opaque ``_mkldnn``
# tensors (``torch.equal`` does not take them): ``to_dense()`` reads their values. Both graphs
# get M03-1's ``reshape_views`` fix before they run.


def dense(t):
    """A prepacked weight is an opaque oneDNN tensor; ``to_dense`` reads its values back."""
    return t.to_dense() if t.layout == torch._mkldnn else t


def same_constants(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(dense(sa[k]), dense(sb[k])) for k in sa)


lowering.reshape_views(gm)
lowering.reshape_views(reference)
fresh = example_inputs(8, seed=123)
print(f"ops equal: {op_counts(gm) == op_counts(reference)} | constants: {sorted(gm.state_dict())}")
assert op_counts(gm) == op_counts(reference), "the same multiset of operators"
assert same_constants(gm, reference), "the same constants, prepacked weights included"
assert torch.equal(gm(*fresh), reference(*fresh)), "bit-exact with lower_pt2e_quantized_to_x86"

# %%
# The packaged version, ``common.lowering.lower(model, example_inputs)``, runs steps 1–5 and
# what transformer graphs add: dynamically quantized linears, a dequantize shared by q/k/v
# given to each user, and float linears packed for MKL. ``tests/test_lowering.py`` checks it
# against torchao, bit for bit, on every zoo model, M02's test models and held-out
# transformer graphs (an ``nn.TransformerEncoderLayer``, a tiny ViT), static and dynamic.

packaged = lowering.lower(simulated, x)
lowering.reshape_views(packaged)
assert torch.equal(packaged(*fresh), reference(*fresh))

# %%
# A pattern it does not reproduce raises, naming the node, instead of returning a different
# graph. A linear whose output is added to another tensor is one: torchao fuses the add into
# ``qlinear_pointwise.binary``, this module does not.


class LinearPlusInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        rows = x.flatten(0, 2)
        return self.fc(rows) + rows


with expect_error(NotImplementedError, match="linear + add"):
    lowering.lower(quantize(LinearPlusInput().eval()), x)

# %%
# Summary
# -------
# A lowering is five graph edits: re-export into the patterns' form; per conv/linear, insert
# the prepack and the int8 op before the float op, move its users over, erase the float op
# and its dequantize nodes; fuse ``relu``/``add``/``quantize`` chains into the int8 op; run
# the prepacks once and keep the results as constants. ``common.lowering.lower`` is bit-exact
# with torchao's lowering and refuses loudly what it does not know.
#
# Exercises
# ---------
# 1. Lower ``conv_bn_relu`` instead. Predict which nodes of its re-exported graph the one
#    int8 op replaces (is a batch norm among them?) and its output dtype. Check against torchao.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          q = quantize(get_model("conv_bn_relu"))
#          start = lowering.reexport(q, x)
#          mine, theirs = lowering.lower(q, x), lower_pt2e_quantized_to_x86(q, x)
#          replaced = op_counts(start) - op_counts(mine)
#          print(dict(replaced))
#          assert replaced == {
#                  "dequantize_per_tensor.default": 1,
#                  "dequantize_per_channel.default": 1,
#                  "aten.convolution.default": 1,
#                  "aten.relu.default": 1,
#          }, "dq(x), dq(w), the conv and relu; prepare folded the batch norm away"
#          assert op_counts(mine) - op_counts(start) == {"onednn.qconv_pointwise.default": 1}
#          (op,) = [n for n in mine.graph.nodes if "onednn" in str(n.target)]
#          assert op.args[13] == torch.float32 and op.args[14] == "relu", (
#              "relu fused; nothing quantizes its output: float32"
#          )
#          assert op_counts(mine) == op_counts(theirs) and torch.equal(mine(*fresh), theirs(*fresh))
#
# 2. Skip step 4 (``fuse_post_ops``) on a fresh copy. Predict: is the graph still torchao's?
#    By how many quantization steps, at most, can the conv's uint8 output now differ from
#    torchao's?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          unfused = lowering.reexport(simulated, x)
#          for node in reversed(list(unfused.graph.nodes)):
#              if node.target == aten.convolution.default:
#                  lowering.prepack_conv(unfused, node)
#              elif node.target == aten.addmm.default:
#                  lowering.prepack_linear(unfused, node)
#          lowering.fold_prepacked_weights(unfused)
#          lowering.reshape_views(unfused)
#          unfused_ops = op_counts(unfused)
#          assert unfused_ops["aten.relu.default"] == 1 and unfused_ops != op_counts(reference), (
#              "relu and a quantize are back: not torchao's graph"
#          )
#
#
#          def values(gm):
#              """Every node's output on ``fresh``, by node name."""
#              run = torch.fx.Interpreter(gm, garbage_collect_values=False)
#              run.run(*fresh)
#              return {node.name: value for node, value in run.env.items()}
#
#
#          quantize_op = torch.ops.quantized_decomposed.quantize_per_tensor.default
#          quantizes = unfused.graph.find_nodes(op="call_function", target=quantize_op)
#          (requantize,) = [n for n in quantizes if n.args[0].target == aten.relu.default]
#          (fused,) = [n for n in reference.graph.nodes if n.target == lowering.QCONV]
#          ours, theirs = values(unfused)[requantize.name], values(reference)[fused.name]
#          assert ours.dtype == theirs.dtype == torch.uint8, "both: the conv's output in uint8"
#          steps = (ours.int() - theirs.int()).abs().max().item()
#          print(f"{requantize.name} vs torchao's {fused.name}: up to {steps} step(s) apart")
#          # The same int32 sums; quantize_per_tensor now rounds what oneDNN rounded, and a
#          # value at a half step can tip either way.
#          assert steps <= 1, "rounding only: at most 1 step"
#
# Further reading
# ---------------
# - `torch.fx: graph manipulation <https://docs.pytorch.org/docs/stable/fx.html>`_
# - `PyTorch 2 Export Quantization with X86 Backend through Inductor
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
#
# Next
# ----
# :ref:`M03-3 · speed and size <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`
# measures what lowering buys.
