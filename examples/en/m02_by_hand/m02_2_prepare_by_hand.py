"""
M02-2 prepare by hand
=====================

``prepare_pt2e`` folds BatchNorm into the conv before it, lets the quantizer transform and
annotate the graph, and inserts an observer wherever an annotation asks for one, sharing one
observer between places that must use the same scale and zero point. This lesson does all of
it by hand on ``small_cnn`` with the course quantizer, using the insertion moves of M00-4, and
ends with the same graph as ``prepare_pt2e``, character for character, and after the same
calibration the same scale and zero point in every observer.

**What you will learn**

- How BatchNorm disappears into the conv's weight and bias
- Which edges and outputs get an observer, and when two of them share one
- How an observer is inserted on an edge, and how an existing one is reused

**Prerequisites**:
:ref:`M00-4 · graph surgery <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>` (steps 1–3),
:ref:`M02-1 · what a quantizer writes
<sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 4

# %%
# Setup
# -----
# ``reference`` is torchao's result on the same model; everything we build is compared with it.

import copy

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw_diff

quiet()

from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

from common import handmade
from common.quantizer import CourseQuantizer

x = example_inputs(8)
model = get_model("small_cnn")
reference = prepare_pt2e(export_module(model, x), CourseQuantizer())
gm = export_module(model, x)

# %%
# Helpers: ``place`` names an observed place, ``observer_calls`` lists the observer nodes of
# a prepared graph.


def place(key):
    """An edge (a, b) as 'a → b', an output node as its name."""
    return f"{key[0].name} → {key[1].name}" if isinstance(key, tuple) else key.name


def observer_calls(prepared):
    return [n.name for n in prepared.graph.nodes if handmade.is_observer_node(prepared, n)]


# %%
# Step 1 — Fold BatchNorm into the conv
# -------------------------------------
# In eval mode BatchNorm computes ``(y - mean) / sqrt(var + eps) * gamma + beta`` per
# channel: an affine map, which can be baked into the conv's weight and bias.
# ``torch.nn.utils.fusion.fuse_conv_bn_weights`` computes the new pair; the fold then rewires
# the batch norm's users to the conv (M00-4 step 2) and removes it (step 6). The outputs
# change only by float rounding.

bn = model.bn
expected_w, expected_b = fuse_conv_bn_weights(
    model.conv.weight, model.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
)
before = copy.deepcopy(gm)
handmade.fold_batch_norm(gm)
print(f"nodes now: {[n.name for n in gm.graph.nodes if n.op == 'call_function']}")
assert torch.equal(gm.conv.weight, expected_w) and torch.equal(gm.conv.bias, expected_b), (
    "the conv holds fuse_conv_bn_weights' pair"
)
assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.batch_norm.default), (
    "no batch_norm node is left"
)
with torch.no_grad():
    difference = (gm(*x) - model(*x)).abs().max().item()
print(f"max |folded - eager| = {difference:.1e}")
assert difference < 1e-5, "only float rounding changes"
draw_diff(before, gm, title="Step 1: batch_norm folded into conv2d")

# %%
# Step 2 — Collect the places to observe
# --------------------------------------
# After ``annotate``, every input edge in an ``input_qspec_map`` (an observed edge) and every
# non-``None`` ``output_qspec`` is a place that needs an observer.
# ``handmade.collect_qspecs`` lists them in graph order.

quantizer = CourseQuantizer()
gm = quantizer.transform_for_annotation(gm)
quantizer.annotate(gm)
qspecs = handmade.collect_qspecs(gm)
for key, qspec in qspecs.items():
    print(f"{place(key):22} {type(qspec).__name__}")
assert len(qspecs) == 10, "conv: 2 edges, relu: 1 output, pool and flatten: 2 each, linear: 2 + 1"

# %%
# Step 3 — Decide which places share an observer
# ----------------------------------------------
# Places in one *sharing group* get one observer, hence one scale and zero point. Two rules
# build the groups (a union-find, ``handmade.sharing_groups``). Explicit: a
# ``SharedQuantizationSpec`` joins its place to the one it points to. Implicit: the edge
# ``relu → max_pool2d`` carries the very tensor ``relu`` outputs, so with equal specs the two
# places join, as ``allow_implicit_sharing`` allows (M02-1, step 5). Here six places end up
# in one group: relu's output through the linear's input.

groups = handmade.sharing_groups(qspecs)
members = {}
for key, root in groups.items():
    members.setdefault(place(root), []).append(place(key))
for root, keys in members.items():
    print(f"group of {root}: {keys}")
assert members["relu"] == [
    "relu",
    "relu → max_pool2d",
    "max_pool2d",
    "max_pool2d → flatten",
    "flatten",
    "flatten → linear",
], "six places, from relu's output to the linear's input, in one group"
assert len(members) == 5, "10 places, 5 groups"

# %%
# Step 4 — Create one observer per group
# --------------------------------------
# Each group's observer is built from its first member's spec: ``MinMaxObserver`` for the
# activations, ``PerChannelMinMaxObserver`` for the two weights. Every member maps to the same
# Python object.

observers = handmade.create_observers(qspecs, groups)
nodes = {node.name: node for node in gm.graph.nodes}
relu, pool = nodes["relu"], nodes["max_pool2d"]
print({place(k): type(v).__name__ for k, v in observers.items()})
per_channel = [k for k, v in observers.items() if isinstance(v, PerChannelMinMaxObserver)]
assert [place(k) for k in per_channel] == ["conv_weight → conv2d", "fc_weight → linear"], (
    "PerChannelMinMaxObserver for the two weights"
)
assert all(type(v) is MinMaxObserver for k, v in observers.items() if k not in per_channel), (
    "MinMaxObserver for the activations"
)
assert observers[relu] is observers[(relu, pool)] is observers[pool], "one group, one object"
assert len({id(o) for o in observers.values()}) == 5, "five groups, five observers"

# %%
# Step 5 — Insert input observers by hand
# ---------------------------------------
# The conv's two input edges each get a new observer: register it (``add_submodule``), call it
# right after the producer (``inserting_after`` + ``call_module``), and make the conv read it.
# torchao names observers ``activation_post_process_N`` in the order it inserts them (step 8
# compares the names too).

annotated = copy.deepcopy(gm)
graph, conv, conv_weight = gm.graph, nodes["conv2d"], nodes["conv_weight"]
for number, source in enumerate([nodes["x"], conv_weight]):
    name = f"activation_post_process_{number}"
    gm.add_submodule(name, observers[(source, conv)])
    with graph.inserting_after(source):
        observer_node = graph.call_module(name, (source,))
    conv.replace_input_with(source, observer_node)
print(conv.format_node())
assert [a.name for a in conv.args[:2]] == [
    "activation_post_process_0",
    "activation_post_process_1",
], "the conv reads its input and its weight through the new observers"

# %%
# Step 6 — Insert an output observer by hand
# ------------------------------------------
# An output observer sits right after its node, and *every* user of the node reads it instead:
# M00-4's ``replace_all_uses_with`` with ``delete_user_cb``, so that the observer does not end
# up reading itself.

gm.add_submodule("activation_post_process_2", observers[relu])
with graph.inserting_after(relu):
    relu_observer = graph.call_module("activation_post_process_2", (relu,))
relu.replace_all_uses_with(relu_observer, delete_user_cb=lambda user: user is not relu_observer)
gm.recompile()
assert pool.args[0] is relu_observer and relu_observer.args == (relu,), (
    "the pool reads the observer, the observer reads relu"
)
draw_diff(annotated, gm, title="Steps 5–6: three observers inserted by hand")

# %%
# Step 7 — Reuse, and the rest with handmade
# ------------------------------------------
# The pool's input edge belongs to relu's group, and relu's observer already sits on it: no new
# node. The pool's output is in the same group, so it gets a *second call* of the *same*
# observer object under a new name. ``handmade.observe_node`` does exactly these cases for one
# node; we run it for the pool, flatten and linear.

before = copy.deepcopy(gm)
for name in ["max_pool2d", "flatten", "linear"]:
    handmade.observe_node(gm, nodes[name], observers)
gm.recompile()
for line in gm.code.splitlines():
    if "= self.activation_post_process" in line:
        print(line.split(";")[0].strip())
assert pool.args[0] is relu_observer, "the existing observer was reused, none inserted"
assert gm.activation_post_process_3 is gm.activation_post_process_2, "a shared observer"
draw_diff(before, gm, title="Step 7: the rest, relu's observer reused")

# %%
# Step 8 — Compare with prepare_pt2e
# ----------------------------------
# The code of our graph is the code of torchao's, line for line. After the same calibration,
# every observer holds the same scale and zero point, bit for bit.

inserted = observer_calls(gm)
draw_diff(annotated, gm, title="After: prepare by hand")
assert gm.code == reference.code, "the same graph as prepare_pt2e"
calibrate(gm)
calibrate(reference)
for name in inserted:
    ours, theirs = gm.get_submodule(name), reference.get_submodule(name)
    for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True):
        assert torch.equal(a, b), f"{name}: the same qparams as prepare_pt2e's"
print(f"{len(inserted)} observer calls, identical graph and qparams")

# %%
# ``common.handmade.prepare`` packages these steps (plus bookkeeping so that torchao's
# ``convert_pt2e`` accepts its result). It, too, gives torchao's graph:

packaged = handmade.prepare(export_module(model, x), CourseQuantizer())
assert packaged.code == reference.code, "handmade.prepare == prepare_pt2e"
print("handmade.prepare(...).code == prepare_pt2e(...).code:", packaged.code == reference.code)

# %%
# Summary
# -------
# prepare = fold BatchNorm, transform and annotate, group the annotated places (explicit and
# implicit sharing), one observer per group, insert: a new ``call_module`` after the producer,
# or reuse of the one already there.

# %%
# Exercises
# ---------
# 1. Prepare ``conv_bn_relu`` with ``handmade.prepare``. How many observer calls, and is the
#    graph still ``prepare_pt2e``'s?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          ours = handmade.prepare(export_module(get_model("conv_bn_relu"), x), CourseQuantizer())
#          theirs = prepare_pt2e(export_module(get_model("conv_bn_relu"), x), CourseQuantizer())
#          print(observer_calls(ours))
#          assert len(observer_calls(ours)) == 3, "the conv's input and weight, the relu's output"
#          assert ours.code == theirs.code
#
# 2. A tensor read by two convs: both input edges ask for the same spec. How many observers
#    does the shared input ``x`` get?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from torch import nn
#
#          class TwoReaders(nn.Module):
#              def __init__(self):
#                  super().__init__()
#                  self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
#
#              def forward(self, x):
#                  return self.a(x) + self.b(x)
#
#          two = handmade.prepare(export_module(TwoReaders().eval(), x), CourseQuantizer())
#          placeholder = two.graph.find_nodes(op="placeholder")[0]
#          on_x = [u.name for u in placeholder.users if handmade.is_observer_node(two, u)]
#          print(on_x)
#          assert len(on_x) == 1, "implicit sharing: both edges carry x, one observer"
#
# 3. Annotate ``small_cnn`` and set ``allow_implicit_sharing = False`` on every annotation
#    before grouping. How many sharing groups does ``handmade.sharing_groups`` make?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          fresh = export_module(get_model("small_cnn"), x)
#          handmade.fold_batch_norm(fresh)
#          CourseQuantizer().annotate(fresh)
#          for node in fresh.graph.nodes:
#              if "quantization_annotation" in node.meta:
#                  node.meta["quantization_annotation"].allow_implicit_sharing = False
#          roots = set(handmade.sharing_groups(handmade.collect_qspecs(fresh)).values())
#          print(len(roots), "groups")
#          assert len(roots) == 8, "only the explicit SharedQuantizationSpec pairs stay joined"

# %%
# Further reading
# ---------------
# - `torch.fx: inserting and replacing nodes <https://docs.pytorch.org/docs/stable/fx.html>`__
# - `PT2E Quantization <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`__
#   (torchao)

# %%
# **Next**: :ref:`M02-3 · convert by hand <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`
# turns the calibrated observers into quantize/dequantize nodes.
