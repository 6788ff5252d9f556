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

**Prerequisites**:
:ref:`M00-4 · graph surgery <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>` (steps 4–6),
:ref:`M01-2 · q/dq nodes and their numbers
<sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`,
:ref:`M02-2 · prepare by hand <sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# Setup
# -----
# The same ``small_cnn`` and course quantizer as in M02-2, prepared twice and calibrated on the
# same batches: ``gm`` is ours to edit, ``reference`` goes through ``convert_pt2e``.

import copy
from collections import Counter

import torch
from torch import nn

from common.expect import expect_error
from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw_diff

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common import handmade
from common.quantizer import CourseQuantizer

qd = torch.ops.quantized_decomposed
x = example_inputs(8)
gm = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
reference = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(gm)
calibrate(reference)
reference = convert_pt2e(reference)
graph = gm.graph
nodes = {node.name: node for node in graph.nodes}
calibrated = copy.deepcopy(gm)

# %%
# Helpers: ``call_functions`` counts a graph's ops; ``TwoBranches`` is a model whose input is
# read by two convs (step 4).


def call_functions(gm):
    """The multiset of call_function targets of a graph."""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same weights whatever ran before
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x) + self.b(x)


# %%
# Step 1 — A per-tensor observer becomes quantize → dequantize
# ------------------------------------------------------------
# ``calculate_qparams`` turns the observer's statistics into a scale and a zero point (M01-3);
# the integer type and its range are the observer's too (``dtype``, ``quant_min``,
# ``quant_max``, from the quantizer's spec). Per tensor they are plain Python numbers in the
# arguments. The pair goes *before* the observer (``inserting_before``) and takes over its
# users; only then can the observer node be erased.

observer_node = nodes["activation_post_process_0"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
qparams = (float(scale), int(zero_point), observer.quant_min, observer.quant_max, observer.dtype)
print(f"observer: {observer.dtype} [{observer.quant_min}, {observer.quant_max}]")
with graph.inserting_before(observer_node):
    q = graph.call_function(qd.quantize_per_tensor.default, (nodes["x"], *qparams))
    dq = graph.call_function(qd.dequantize_per_tensor.default, (q, *qparams))
with expect_error(RuntimeError, match="still had 1 users"):
    graph.erase_node(observer_node)
observer_node.replace_all_uses_with(dq)
graph.erase_node(observer_node)
print(dq.format_node())
assert nodes["conv2d"].args[0] is dq and q.args[0] is nodes["x"], "x → quantize → dequantize → conv"
assert observer_node not in graph.nodes, "the observer node is gone"

# %%
# Step 2 — A per-channel observer: qparams become buffers
# -------------------------------------------------------
# The weight has one scale per output channel: a tensor, so it is stored as a buffer and read
# by a ``get_attr`` node (M00-4 step 5). torchao names the buffers after the module the
# observed node came from; the weight's ``get_attr`` has none, so they are plain
# ``_scale_0`` and ``_zero_point_0`` (step 6 compares the names). The axis and the range come
# from the observer: symmetric per channel, so every zero point is 0.

observer_node = nodes["activation_post_process_1"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
gm.register_buffer("_scale_0", scale)
gm.register_buffer("_zero_point_0", zero_point)
with graph.inserting_before(observer_node):
    qparams = (
        graph.get_attr("_scale_0"),
        graph.get_attr("_zero_point_0"),
        observer.ch_axis,
        observer.quant_min,
        observer.quant_max,
        observer.dtype,
    )
    q_w = graph.call_function(qd.quantize_per_channel.default, (nodes["conv_weight"], *qparams))
    dq_w = graph.call_function(qd.dequantize_per_channel.default, (q_w, *qparams))
observer_node.replace_all_uses_with(dq_w)
graph.erase_node(observer_node)
print(f"axis {observer.ch_axis}, {scale.shape[0]} scales, zero points {zero_point.unique()}")
assert scale.shape == (gm.conv.weight.shape[observer.ch_axis],), "one scale per output channel"
assert not zero_point.any(), "symmetric: every zero point is 0"

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
draw_diff(calibrated, gm, title="Steps 1–3: every observer is now quantize → dequantize")
quantizes = gm.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)
numbers = Counter(q.args[1:3] for q in quantizes)
print(f"per-tensor (scale, zero point) -> quantize nodes: {dict(numbers)}")
assert not any(handmade.is_observer_node(gm, n) for n in gm.graph.nodes if n.op == "call_module"), (
    "no observer is left"
)
assert len(qdq) == 14, "7 observer calls, 2 nodes each"
assert sorted(numbers.values()) == [1, 1, 3], "the shared observer's 3 calls: 3 pairs, 1 set"

# %%
# Step 4 — A dequantize shared by two ops is duplicated
# -----------------------------------------------------
# ``small_cnn`` has none, so take two convs reading the same input. Its observer becomes one
# dequantize with two users. A backend fuses ``dequantize → conv → quantize`` into one integer
# conv (M03), which needs the dequantize to belong to that conv alone, so convert gives each
# annotated user its own copy (``node_copy``).

side = handmade.prepare(export_module(TwoBranches().eval(), x), CourseQuantizer())
calibrate(side)
side_scopes = side.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(side.graph.nodes):
    if handmade.is_observer_node(side, node):
        handmade.replace_observer(side, node, side_scopes)
dq_op = qd.dequantize_per_tensor.default
shared = [n for n in side.graph.find_nodes(op="call_function", target=dq_op) if len(n.users) > 1]
print(f"shared: {[(n.name, [u.name for u in n.users]) for n in shared]}")
q_x = shared[0].args[0]
side_before = copy.deepcopy(side)
handmade.duplicate_shared_dequantize(side)
copies = [
    n.name for n in side.graph.find_nodes(op="call_function", target=dq_op) if n.args[0] is q_x
]
print(f"after: {copies}")
draw_diff(side_before, side, title="Step 4: one dequantize per conv")
assert len(shared) == 1 and len(copies) == 2, "one dequantize with two users became two"
convs = side.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default)
assert sorted(conv.args[0].name for conv in convs) == sorted(copies), "each conv reads its own"

# %%
# On ``small_cnn`` the same pass changes nothing; convert runs it anyway:

before = gm.code
handmade.duplicate_shared_dequantize(gm)
assert gm.code == before, "no dequantize of small_cnn has two users"
print(f"unchanged: {gm.code == before}")

# %%
# Step 5 — Quantize the weights ahead of time
# -------------------------------------------
# ``get_attr(weight) → quantize`` depends on nothing but constants, so its result can be
# computed once now and stored: an int8 frozen parameter ``_frozen_param0``, read by a
# ``get_attr`` that keeps the quantize node's name. The float weight is no longer read by the
# graph. Its values fill the observer's symmetric range.

unfolded = copy.deepcopy(gm)
q_w = next(n for n in gm.graph.nodes if n.target == qd.quantize_per_channel.default)
weight = gm.conv.weight
int8_weight = q_w.target(weight, gm._scale_0, gm._zero_point_0, *q_w.args[3:])
gm.register_buffer("_frozen_param0", int8_weight)
with gm.graph.inserting_before(q_w):
    frozen = gm.graph.get_attr("_frozen_param0")
q_w.replace_all_uses_with(frozen)
gm.graph.erase_node(q_w)
frozen.name = q_w.name
*_, quant_min, quant_max, dtype = q_w.args[3:]
print(f"{int8_weight.dtype}, range [{int8_weight.min()}, {int8_weight.max()}]")
assert int8_weight.dtype == dtype, "stored in the observer's dtype"
assert int8_weight.abs().max() == quant_max == -quant_min, "symmetric: the largest |w| → ±max"
weight_reads = [n for n in gm.graph.find_nodes(op="get_attr") if n.target == "conv.weight"]
assert weight_reads and not any(n.users for n in weight_reads), "the float weight: unread"

# %%
# ``handmade.fold_weight_quantize`` does the same for the linear's weight, removes the
# ``get_attr`` nodes nobody reads any more, and lints.

handmade.fold_weight_quantize(gm)
draw_diff(unfolded, gm, title="Step 5: int8 weights as constants")
assert not gm.graph.find_nodes(op="call_function", target=qd.quantize_per_channel.default), (
    "no weight quantize is left in the graph"
)
assert torch.equal(gm._frozen_param1, reference._frozen_param1), "the linear's int8 weight"

# %%
# Step 6 — Compare with convert_pt2e
# ----------------------------------
# Same code, same multiset of ops, and — the point of the whole module — the same outputs, bit
# for bit, on inputs never seen during calibration (``calibrate`` used seeds 0–3; these are
# seed 123).

gm.graph.lint()
gm.recompile()
fresh = example_inputs(8, seed=123)
assert call_functions(gm) == call_functions(reference), "the same ops, as many times"
assert gm.code == reference.code, "the same graph as convert_pt2e"
assert torch.equal(gm(*fresh), reference(*fresh)), "bit-exact with convert_pt2e"
print(call_functions(gm))
print(f"torch.equal(ours, convert_pt2e): {torch.equal(gm(*fresh), reference(*fresh))}")

# %%
# And the packaged version, ``common.handmade.convert``, agrees as well:

packaged = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(packaged)
same = torch.equal(handmade.convert(packaged)(*fresh), reference(*fresh))
print(f"torch.equal(handmade.convert, convert_pt2e): {same}")
assert same, "handmade.convert is bit-exact with convert_pt2e"

# %%
# Step 7 — Every model of the zoo, with both quantizers
# ------------------------------------------------------
# The same comparison on each model of the course's zoo, with the course quantizer and with
# torchao's ``X86InductorQuantizer``: ``handmade.prepare`` and ``handmade.convert`` against
# ``prepare_pt2e`` and ``convert_pt2e``, calibrated alike, their outputs compared with
# ``torch.equal`` on the fresh inputs. Each pair is one case; ``tests/test_handmade.py`` runs
# a larger matrix of them.

cases = 0
for name in MODEL_NAMES:
    for quantizer in (CourseQuantizer, x86_quantizer):
        ours = handmade.prepare(export_module(get_model(name), x), quantizer())
        theirs = prepare_pt2e(export_module(get_model(name), x), quantizer())
        calibrate(ours)
        calibrate(theirs)
        same = torch.equal(handmade.convert(ours)(*fresh), convert_pt2e(theirs)(*fresh))
        assert same, f"{name} with {quantizer.__name__}: bit-exact with torchao"
        cases += 1
print(f"bit-exact with torchao on {cases} cases: {len(MODEL_NAMES)} models × 2 quantizers")
# sphinx_gallery_start_ignore
from common.results import publish  # the landing page's figures

publish("bit_exact_cases", cases)
# sphinx_gallery_end_ignore

# %%
# Summary
# -------
# convert = each observer call → ``quantize → dequantize`` (numbers in the args per tensor,
# buffers per channel, dtype and range from the observer), clean-up, one dequantize per
# quantized user, and the constant weight quantization computed ahead of time.
# ``common.handmade`` packages M02-2 and M02-3 as ``prepare`` and ``convert``; its tests run
# them against torchao on every model of the course and on the further layer mixes of
# ``tests/test_handmade.py``, with both the course quantizer and ``X86InductorQuantizer``.

# %%
# Exercises
# ---------
# 1. Quantize the weights per tensor instead (``PER_TENSOR_WEIGHT`` below: symmetric, one
#    scale for the whole weight). Predict which of steps 1 and 2 the weights now take: how many
#    scale or zero-point buffers does the converted model keep, and where does each weight's
#    dequantize find its scale?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from dataclasses import replace
#
#          from torchao.quantization.pt2e.observer import MinMaxObserver
#
#          from common.quantizer import WEIGHT_SPEC
#
#          PER_TENSOR_WEIGHT = replace(
#              WEIGHT_SPEC,
#              qscheme=torch.per_tensor_symmetric,
#              ch_axis=None,
#              observer_or_fake_quant_ctr=MinMaxObserver,
#          )
#          WEIGHTED = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
#
#
#          class PerTensorWeights(CourseQuantizer):
#              def annotate(self, model):
#                  super().annotate(model)
#                  for node in model.graph.nodes:
#                      if node.target in WEIGHTED:
#                          qspecs = node.meta["quantization_annotation"].input_qspec_map
#                          qspecs[node.args[1]] = PER_TENSOR_WEIGHT
#                  return model
#
#
#          small_cnn = export_module(get_model("small_cnn"), x)
#          per_tensor = handmade.prepare(small_cnn, PerTensorWeights())
#          calibrate(per_tensor)
#          per_tensor = handmade.convert(per_tensor)
#          buffers = sorted(name for name, _ in per_tensor.named_buffers())
#          print(buffers)
#          assert buffers == ["_frozen_param0", "_frozen_param1"], (
#              "only the int8 weights: no scale or zero-point buffer"
#          )
#          weights = [n for n in per_tensor.graph.find_nodes(op="get_attr") if n.target in buffers]
#          dequantizes = [next(iter(n.users)) for n in weights]
#          print(dequantizes[0].format_node())
#          assert all(dq.target == qd.dequantize_per_tensor.default for dq in dequantizes)
#          assert all(isinstance(dq.args[1], float) for dq in dequantizes), (
#              "step 1: the scale is a number in the args"
#          )
#          assert all(dq.args[2] == 0 for dq in dequantizes), "symmetric: zero point 0"
#
# 2. Convert with ``fold_quantize=False``. Which ops change, and is the result still
#    bit-exact with ``convert_pt2e(..., fold_quantize=False)``?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          ours = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
#          theirs = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
#          calibrate(ours)
#          calibrate(theirs)
#          ours = handmade.convert(ours, fold_quantize=False)
#          theirs = convert_pt2e(theirs, fold_quantize=False)
#          print(call_functions(ours) - call_functions(gm))
#          assert call_functions(ours) - call_functions(gm) == Counter(
#              {"quantized_decomposed.quantize_per_channel.default": 2}
#          ), "the two weight quantizes stay in the graph"
#          assert torch.equal(ours(*fresh), theirs(*fresh))
#
# 3. Convert ``conv_relu`` by hand. How many quantize/dequantize nodes do you predict?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          small = handmade.prepare(export_module(get_model("conv_relu"), x), CourseQuantizer())
#          calibrate(small)
#          small = handmade.convert(small)
#          ops = call_functions(small)
#          counts = {t.split(".")[1]: n for t, n in ops.items() if "quantize" in t}
#          print(counts)
#          assert counts == {
#              "quantize_per_tensor": 2,
#              "dequantize_per_tensor": 2,
#              "dequantize_per_channel": 1,
#          }, "input and relu output per tensor; the weight's quantize folded away"

# %%
# Further reading
# ---------------
# - `torch.fx: Graph and GraphModule <https://docs.pytorch.org/docs/stable/fx.html>`__
# - `PT2E Quantization <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`__
#   (torchao)
# - :ref:`Troubleshooting: prepare and convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` —
#   the same failure, found by its error message

# %%
# **Next**: :ref:`M02-4 · writing a quantizer for a new backend
# <sphx_glr_lessons_m02_by_hand_m02_4_writing_a_quantizer.py>`,
# where the course quantizer's code is extended with the specs this module has not used yet.
