"""
M02-3 convert by hand
=====================

``convert_pt2e`` replaces every calibrated observer with a quantize/dequantize pair carrying
the observer's scale and zero point, gives every quantized op its own dequantize, and
quantizes the constant weights ahead of time so that the graph stores them as int8. This
lesson does each of these edits by hand with the moves of M00-4 (steps 4–6) and ends with a
model whose outputs are ``torch.equal`` to ``convert_pt2e``'s: not close, identical.

**What you will learn**

- How an observer becomes ``quantize → dequantize``, per tensor and per channel
- Why a dequantize shared by two ops is duplicated
- What ``fold_quantize=True`` does to the weights

**Prerequisites**: M00-4 (steps 4–6), M01-2, M02-2.
"""

# %%
# Setup
# -----
# The same ``small_cnn`` and course quantizer as in M02-2, prepared twice and calibrated on the
# same batches: ``gm`` is ours to edit, ``reference`` goes through ``convert_pt2e``.

from collections import Counter

import torch
from torch import nn

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

from common import handmade  # noqa: E402
from common.quantizer import CourseQuantizer  # noqa: E402

qd = torch.ops.quantized_decomposed


def call_functions(gm):
    """The multiset of call_function targets of a graph."""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


x = example_inputs(8)
gm = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
reference = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(gm)
calibrate(reference)
reference = convert_pt2e(reference)
graph = gm.graph
nodes = {node.name: node for node in graph.nodes}
draw(gm, title="Before: calibrated observers")

# %%
# Step 1 — A per-tensor observer becomes quantize → dequantize
# ------------------------------------------------------------
# ``calculate_qparams`` turns the observer's statistics into a scale and a zero point (M01-3).
# Per tensor they are plain Python numbers in the arguments. The pair goes *before* the
# observer (``inserting_before``), takes over its users, and the observer node is erased.

observer_node = nodes["activation_post_process_0"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
qparams = (float(scale), int(zero_point), observer.quant_min, observer.quant_max, torch.int8)
with graph.inserting_before(observer_node):
    q = graph.call_function(qd.quantize_per_tensor.default, (nodes["x"], *qparams))
    dq = graph.call_function(qd.dequantize_per_tensor.default, (q, *qparams))
observer_node.replace_all_uses_with(dq)
graph.erase_node(observer_node)
print(dq.format_node())
assert nodes["conv2d"].args[0] is dq and q.args[0] is nodes["x"]

# %%
# Step 2 — A per-channel observer: qparams become buffers
# -------------------------------------------------------
# The weight has one scale per output channel: a tensor, so it is stored as a buffer and read
# by a ``get_attr`` node (M00-4 step 5). torchao names the buffers after the module the
# observed node came from; the weight's ``get_attr`` has none, so they are plain
# ``_scale_0`` and ``_zero_point_0``.

observer_node = nodes["activation_post_process_1"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
gm.register_buffer("_scale_0", scale)
gm.register_buffer("_zero_point_0", zero_point)
with graph.inserting_before(observer_node):
    qparams = (
        graph.get_attr("_scale_0"),
        graph.get_attr("_zero_point_0"),
        0,
        -127,
        127,
        torch.int8,
    )
    q_w = graph.call_function(qd.quantize_per_channel.default, (nodes["conv_weight"], *qparams))
    dq_w = graph.call_function(qd.dequantize_per_channel.default, (q_w, *qparams))
observer_node.replace_all_uses_with(dq_w)
graph.erase_node(observer_node)
print(f"{scale.shape[0]} scales, zero points {zero_point.unique().tolist()}")
assert scale.shape == (8,) and torch.equal(zero_point, torch.zeros(8, dtype=zero_point.dtype))

# %%
# Step 3 — The other observers, then clean up
# -------------------------------------------
# ``handmade.replace_observer`` does steps 1 and 2 for any observer. A shared observer is
# called from several nodes: each call becomes its own pair, with the same numbers. Then the
# usual clean-up (M00-4 step 6): dead code out, a fresh ``GraphModule`` that keeps only what
# the graph uses, the observer submodules deleted.

scopes = gm.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(graph.nodes):
    if handmade.is_observer_node(gm, node):
        handmade.replace_observer(gm, node, scopes)
graph.eliminate_dead_code()
gm = torch.fx.GraphModule(gm, graph)
gm.delete_all_unused_submodules()
graph.lint()
qdq = [n.name for n in gm.graph.nodes if "quantize_per" in str(n.target)]
draw(gm, highlight=qdq, title="Step 3: every observer is now quantize → dequantize")
assert not any(handmade.is_observer_node(gm, n) for n in gm.graph.nodes if n.op == "call_module")
assert len(qdq) == 14, "7 observer calls, 2 nodes each"

# %%
# Step 4 — A dequantize shared by two ops is duplicated
# -----------------------------------------------------
# ``small_cnn`` has none, so take two convs reading the same input. Its observer becomes one
# dequantize with two users. A backend fuses ``dequantize → conv → quantize`` into one integer
# conv, which needs the dequantize to belong to that conv alone, so convert gives each
# annotated user its own copy (``node_copy``).


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x) + self.b(x)


side = handmade.prepare(export_module(TwoBranches().eval(), x), CourseQuantizer())
calibrate(side)
side_scopes = side.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(side.graph.nodes):
    if handmade.is_observer_node(side, node):
        handmade.replace_observer(side, node, side_scopes)
dq_op = qd.dequantize_per_tensor.default
shared = [n for n in side.graph.find_nodes(op="call_function", target=dq_op) if len(n.users) > 1]
print("shared:", [(n.name, [u.name for u in n.users]) for n in shared])
q_x = shared[0].args[0]
handmade.duplicate_shared_dequantize(side)
copies = [
    n.name for n in side.graph.find_nodes(op="call_function", target=dq_op) if n.args[0] is q_x
]
print("after:", copies)
draw(side, highlight=copies, title="Step 4: one dequantize per conv")
assert len(shared) == 1 and len(copies) == 2, "one dequantize with two users became two"
assert all(len(n.users) == 1 for n in side.graph.nodes if n.name in copies)

# %%
# On ``small_cnn`` the same pass changes nothing; convert runs it anyway:

before = gm.code
handmade.duplicate_shared_dequantize(gm)
assert gm.code == before, "no dequantize of small_cnn has two users"

# %%
# Step 5 — Quantize the weights ahead of time
# -------------------------------------------
# ``get_attr(weight) → quantize`` depends on nothing but constants, so its result can be
# computed once now and stored: an int8 frozen parameter ``_frozen_param0``, read by a
# ``get_attr`` that keeps the quantize node's name. The float weight is no longer read by the graph.

q_w = next(n for n in gm.graph.nodes if n.target == qd.quantize_per_channel.default)
weight = gm.conv.weight
int8_weight = q_w.target(weight, gm._scale_0, gm._zero_point_0, *q_w.args[3:])
gm.register_buffer("_frozen_param0", int8_weight)
with gm.graph.inserting_before(q_w):
    frozen = gm.graph.get_attr("_frozen_param0")
q_w.replace_all_uses_with(frozen)
gm.graph.erase_node(q_w)
frozen.name = q_w.name
print(f"{int8_weight.dtype}, range [{int8_weight.min()}, {int8_weight.max()}]")
assert int8_weight.dtype == torch.int8 and int8_weight.abs().max() == 127, "symmetric: ±127"

# %%
# ``handmade.fold_weight_quantize`` does the same for the linear's weight, removes the
# ``get_attr`` nodes nobody reads any more, and lints.

handmade.fold_weight_quantize(gm)
frozen_nodes = [n.name for n in gm.graph.nodes if n.op == "get_attr" and "quantize" in n.name]
draw(gm, highlight=frozen_nodes, title="Step 5: int8 weights as constants")
assert not gm.graph.find_nodes(op="call_function", target=qd.quantize_per_channel.default)
assert torch.equal(gm._frozen_param1, reference._frozen_param1), "the linear's int8 weight"

# %%
# Step 6 — Compare with convert_pt2e
# ----------------------------------
# Same code, same multiset of ops, and — the point of the whole module — the same outputs, bit
# for bit, on inputs never seen during calibration.

gm.graph.lint()
gm.recompile()
fresh = example_inputs(8, seed=123)
assert call_functions(gm) == call_functions(reference)
assert gm.code == reference.code, "the same graph as convert_pt2e"
assert torch.equal(gm(*fresh), reference(*fresh)), "bit-exact with convert_pt2e"
print(call_functions(gm))
print("torch.equal(ours, convert_pt2e):", torch.equal(gm(*fresh), reference(*fresh)))

# %%
# And the packaged version, ``common.handmade.convert``, agrees as well:

packaged = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(packaged)
assert torch.equal(handmade.convert(packaged)(*fresh), reference(*fresh))

# %%
# Summary
# -------
# convert = each observer call → ``quantize → dequantize`` (numbers in the args per tensor,
# buffers per channel), clean-up, one dequantize per quantized user, and the constant weight
# quantization computed ahead of time. ``common.handmade`` packages M02-2 and M02-3 as
# ``prepare`` and ``convert``; its tests run them against torchao on every model of the course
# and on eleven more layer mixes, with both the course quantizer and ``X86InductorQuantizer``.
