"""
M00-4 Editing graphs: the torch.fx moves PT2E is made of
=========================================================

The first three lessons only *read* graphs, but both PT2E passes *edit* them:
``prepare_pt2e`` inserts observers into the graph, and ``convert_pt2e`` replaces each
observer with quantize/dequantize nodes and quantizes the weights to int8 ahead of time.
This lesson takes a small conv → relu graph through the six edits those passes are built
from, drawing the graph and checking the result with an ``assert`` after every step.

**What you will learn**

- How to insert a node after another one and move its users over (how M02-2 inserts observers)
- How to replace a ``call_module`` by a ``call_function`` and put a tensor constant in the graph
  (how M02-3 converts)
- Why every edit ends with ``recompile``, what ``eliminate_dead_code`` keeps, and how ``lint``
  checks the result

**Prerequisites**: :ref:`M00-1 · getting a graph
<sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`, :ref:`M00-2 · anatomy of a node
<sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>` and :ref:`M00-3 · finding patterns
<sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`, or the article
:ref:`FX Graph and Node basics <fx-basics>`.

.. note::
   All six steps edit the same ``gm`` in place. In a notebook, run the cells top to bottom;
   skipping or re-running a cell makes the pictures disagree with the text. To start over,
   restart the kernel and run everything again.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 4

# %%
# Setup
# -----
# ``export_module`` is ``torch.export.export(model, args).module()``.
# ``base`` keeps the original output so that every step can be checked against it.

import copy

import torch

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet
from common.viz import draw, draw_diff

quiet()

x = example_inputs(4)[0]
gm = export_module(get_model("conv_relu"), (x,))
with torch.no_grad():
    base = gm(x).clone()
graph = gm.graph
nodes = {node.name: node for node in graph.nodes}
relu = nodes["relu"]
draw(gm, title="gm before any edit")

# %%
# ``Scale`` is the module the new ``call_module`` nodes will call: it multiplies by ``k``, an
# effect easy to see in the output.


class Scale(torch.nn.Module):
    """Multiplies its input by k: a call_module target whose effect is easy to see."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


# %%
# Every edit deals with the two directions of a node: ``args`` are the nodes it reads
# (upstream), ``users`` are the nodes that read it (downstream).

print(f"relu.args  = {relu.args}    (upstream: what relu reads)")
print(f"relu.users = {list(relu.users)}    (downstream: who reads relu)")
assert relu.args == (nodes["conv2d"],), "relu reads conv2d"
assert list(relu.users) == [nodes["output"]], "only output reads relu"

# %%
# Step 1 — Insert a node
# ----------------------
# The module a ``call_module`` node calls must first be attached to the GraphModule with
# ``add_submodule``. ``graph.inserting_after(relu)`` sets the insertion point: nodes created
# inside it are placed right after relu.

before = copy.deepcopy(gm)
gm.add_submodule("scale_out", Scale(2.0))
with graph.inserting_after(relu):
    scale = graph.call_module("scale_out", (relu,))
draw_diff(before, gm, title="Step 1: scale_out(relu) created")

# %%
# The new node reads relu, but nothing reads it yet: ``output`` still hangs off relu.
# Creating a node does not wire it into the data flow; that is the next step.

print(f"scale.args  = {scale.args}")
print(f"scale.users = {list(scale.users)}")
assert scale.args == (relu,) and not scale.users, "scale_out exists but has no users yet"

# %%
# Step 2 — Move the users over
# ----------------------------
# The obvious call is ``relu.replace_all_uses_with(scale)``. Try it on a copy, ``gm_bad``,
# and see what goes wrong.

gm_bad = copy.deepcopy(gm)
relu_bad = next(n for n in gm_bad.graph.nodes if n.name == "relu")
scale_bad = next(n for n in gm_bad.graph.nodes if n.name == "scale_out")
relu_bad.replace_all_uses_with(scale_bad)
draw_diff(gm, gm_bad, title="Wrong: no delete_user_cb")

# %%
# scale_out now reads itself (the arrow looping back in the picture), and relu has no users
# left. scale_out was one of relu's users too, and ``replace_all_uses_with`` rewires
# every user, itself included. ``lint`` catches a graph that uses a value before defining it.

print(f"gm_bad: scale_out.args = {scale_bad.args}")
assert scale_bad.args == (scale_bad,), "scale_out reads itself: a self-loop"
with expect_error(RuntimeError, match="used before it has been defined"):
    gm_bad.graph.lint()

# %%
# The right call leaves the new node out with ``delete_user_cb``:

before = copy.deepcopy(gm)
relu.replace_all_uses_with(scale, delete_user_cb=lambda user: user is not scale)
draw_diff(before, gm, title="Step 2: output now reads scale_out")

# %%
# This is the standard way to put B after A: B reads A, and every other user of A reads B
# instead. It is exactly how ``prepare_pt2e`` inserts an observer.

print(f"relu.users = {list(relu.users)}    scale.args = {scale.args}")
assert list(relu.users) == [scale] and scale.args == (relu,), "scale_out is relu's only user"
assert list(scale.users) == [nodes["output"]], "output now reads scale_out"
graph.lint()

# %%
# Step 3 — Recompile
# ------------------
# The graph is edited; does ``gm(x)`` see it? A GraphModule's ``forward`` is Python code
# generated from the graph, and editing the graph does not regenerate it.

with torch.no_grad():
    unchanged_before = torch.equal(gm(x), base)
gm.recompile()
with torch.no_grad():
    doubled_after = torch.equal(gm(x), base * 2)
print(f"edited, not recompiled: output still the original?  {unchanged_before}")
print(f"after recompile: output is twice the original?      {doubled_after}")
assert unchanged_before, "before recompile, forward is still the old code"
assert doubled_after, "after recompile, forward calls scale_out"

# %%
# Call ``recompile()`` after every edit; ``gm.code`` shows the regenerated forward:

print(gm.code.strip())
assert "self.scale_out(relu)" in gm.code, "the regenerated forward calls scale_out on relu"

# %%
# Step 4 — Replace a call_module by a call_function
# -------------------------------------------------
# Next, swap the scale_out ``call_module`` for a ``call_function`` of ``aten.mul``.
# ``convert_pt2e`` turns observers into q/dq nodes with the same recipe: create the new
# node, move the users to it, erase the old one. First, the wrong order: erasing a node
# that still has users.

before = copy.deepcopy(gm)
with graph.inserting_before(scale):
    mul = graph.call_function(torch.ops.aten.mul.Tensor, (relu, 2.0))
with expect_error(RuntimeError, match="still had 1 users"):
    graph.erase_node(scale)
assert mul.name == "mul_tensor", "the new node is named after its op, aten.mul.Tensor"

# %%
# A node cannot go while something still reads it. In the right order:

scale.replace_all_uses_with(mul)
graph.erase_node(scale)
gm.delete_submodule("scale_out")
gm.recompile()
with torch.no_grad():
    assert torch.equal(gm(x), base * 2), "with aten.mul the output is still doubled"
assert not hasattr(gm, "scale_out"), "the module is gone as well"
draw_diff(before, gm, title="Step 4: scale_out replaced by aten.mul")

# %%
# The second argument of ``mul_tensor``, ``2.0``, is a Python constant stored in ``args``.
# It is not a node, so the picture does not show it.

print(f"mul.args = {mul.args}")
assert mul.args == (relu, 2.0), "2.0 is a constant in args, not a node"

# %%
# Step 5 — Put a tensor constant in the graph
# -------------------------------------------
# A Python number can sit in the arguments; that is how per-tensor scales and zero points are
# stored (M01 shows them). A tensor constant, such as a per-channel scale, is registered as a
# buffer with ``register_buffer`` and read by a ``get_attr`` node.

before = copy.deepcopy(gm)
gm.register_buffer("two", torch.tensor(2.0))
with graph.inserting_before(mul):
    two = graph.get_attr("two")
    mul_t = graph.call_function(torch.ops.aten.mul.Tensor, (relu, two))
mul.replace_all_uses_with(mul_t)
graph.erase_node(mul)
gm.recompile()
with torch.no_grad():
    assert torch.equal(gm(x), base * 2), "the constant now comes from a buffer; same output"
draw_diff(before, gm, title="Step 5: the constant is a buffer read by get_attr")

# %%
# ``two`` is a ``get_attr`` node. The pictures do not give it a box of its own: it is written
# inside the label of the node that reads it, as ``‹two›``.

print(f"two.op = {two.op!r}   two.target = {two.target!r}   mul_t.args = {mul_t.args}")
assert two.op == "get_attr" and mul_t.args == (relu, two), "mul reads the buffer through two"
assert torch.equal(gm.get_buffer("two"), torch.tensor(2.0)), "the buffer holds 2.0"

# %%
# Step 6 — Clean up and check
# ---------------------------
# Insert a ``neg`` that nobody reads, then remove it by dead code elimination:
# ``eliminate_dead_code`` deletes every node that has no users, unless ``node.is_impure()``
# says it must stay. ``lint`` checks the structure of the graph (every node defined before it
# is used, and more) and raises if something is off. With ``neg`` the graph has 10 nodes:
# ``x``, the two ``get_attr`` weights, ``_guards_fn``, ``conv2d``, ``relu``, ``two``,
# ``mul_tensor``, ``neg`` and ``output``.

with graph.inserting_after(relu):
    neg = graph.call_function(torch.ops.aten.neg.default, (relu,))
before = copy.deepcopy(gm)
nodes_with_neg = len(graph.nodes)
graph.eliminate_dead_code()
nodes_after_cleanup = len(graph.nodes)
graph.lint()
gm.recompile()
print(f"nodes: {nodes_with_neg} with neg -> {nodes_after_cleanup} after eliminate_dead_code")
assert (nodes_with_neg, nodes_after_cleanup) == (10, 9), "only neg was removed"
assert not any(node.name.startswith("neg") for node in graph.nodes), "neg is gone"
draw_diff(before, gm, title="Step 6: after clean-up")

# %%
# ``_guards_fn`` has no users either, and it stayed. Not because it is a ``call_module``:
# ``node.is_impure()`` asks the called module for an ``_is_impure`` attribute, and
# ``.module()`` sets it to ``True`` on ``_guards_fn`` so that the input checks survive.

guards = nodes["_guards_fn"]
marked = gm.get_submodule("_guards_fn")._is_impure
print(f"_guards_fn: users={list(guards.users)}  is_impure()={guards.is_impure()}")
print(f"gm._guards_fn._is_impure = {marked}")
assert not guards.users and guards.name in {n.name for n in graph.nodes}, "kept without users"
assert marked is True and guards.is_impure(), "kept because its module is marked impure"

# %%
# An ordinary ``call_module`` nobody reads is dead code like ``neg``: a ``Scale`` with no
# users is removed. Its submodule stays attached until ``delete_submodule``.

gm.add_submodule("unused", Scale(3.0))
with graph.inserting_after(relu):
    unused = graph.call_module("unused", (relu,))
print(f"unused.is_impure() = {unused.is_impure()}")
assert not unused.is_impure(), "an ordinary module is not marked impure"
graph.eliminate_dead_code()
assert "unused" not in {n.name for n in graph.nodes}, "an unused call_module is removed"
assert hasattr(gm, "unused"), "dead code elimination leaves the submodule itself alone"
gm.delete_submodule("unused")
gm.recompile()

# %%
# When convert pre-quantizes a weight and reads the int8 copy with ``get_attr``, the original
# weight node loses its last user and is removed the same way (M02-3).

with torch.no_grad():
    assert torch.equal(gm(x), base * 2), "after six steps the output is twice the original"

# %%
# Summary
# -------
# ====================  ==================================================================
# To do this            use
# ====================  ==================================================================
# insert an observer    ``add_submodule`` + ``inserting_after`` + ``call_module`` +
#                       ``replace_all_uses_with(delete_user_cb=...)``
# observer → q/dq       ``inserting_before`` + ``call_function`` + ``replace_all_uses_with``
#                       + ``erase_node`` (+ ``delete_submodule``)
# store scale and       a Python constant in ``args``, or ``register_buffer`` + ``get_attr``
# zero point
# finish                ``eliminate_dead_code`` (keeps what ``is_impure()`` marks), ``lint``,
#                       ``recompile``
# ====================  ==================================================================
#
# Inserting observers by hand in M02-2 uses steps 1–3; turning observers into q/dq nodes and
# pre-quantizing weights in M02-3 uses steps 4–6.

# %%
# Exercises
# ---------
# 1. On a copy of ``gm``, insert ``Scale(0.5)`` between ``conv2d`` and ``relu`` with the
#    recipe of steps 1–2. Predict the output: how does it compare with ``base``?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          half_gm = copy.deepcopy(gm)
#          conv2d = next(n for n in half_gm.graph.nodes if n.name == "conv2d")
#          half_gm.add_submodule("scale_in", Scale(0.5))
#          with half_gm.graph.inserting_after(conv2d):
#              scale_in = half_gm.graph.call_module("scale_in", (conv2d,))
#          conv2d.replace_all_uses_with(scale_in, delete_user_cb=lambda user: user is not scale_in)
#          half_gm.recompile()
#          assert [n.name for n in scale_in.users] == ["relu"], "relu now reads scale_in"
#          with torch.no_grad():
#              # relu(0.5 * c) * 2 == relu(c): halving and doubling are exact in float
#              assert torch.equal(half_gm(x), base), "back to the original output, bit for bit"
#
# 2. Give a ``Scale`` module the attribute ``_is_impure = True`` and call it from a node that
#    nobody reads. Predict what ``eliminate_dead_code`` does with that node.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          kept_gm = copy.deepcopy(gm)
#          relu_node = next(n for n in kept_gm.graph.nodes if n.name == "relu")
#          keep = Scale(3.0)
#          keep._is_impure = True
#          kept_gm.add_submodule("keep", keep)
#          with kept_gm.graph.inserting_after(relu_node):
#              kept = kept_gm.graph.call_module("keep", (relu_node,))
#          kept_gm.graph.eliminate_dead_code()
#          assert kept.is_impure() and not kept.users, "marked impure, no users"
#          assert "keep" in {n.name for n in kept_gm.graph.nodes}, "kept, like _guards_fn"
#
# 3. Export ``conv_relu`` again and replace its ``relu`` by ``aten.sigmoid`` with the recipe
#    of step 4. Predict the number of nodes and the output.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          model = get_model("conv_relu")
#          sig_gm = export_module(model, (x,))
#          old = next(n for n in sig_gm.graph.nodes if n.name == "relu")
#          count = len(sig_gm.graph.nodes)
#          with sig_gm.graph.inserting_after(old):
#              sigmoid = sig_gm.graph.call_function(torch.ops.aten.sigmoid.default, old.args)
#          old.replace_all_uses_with(sigmoid)
#          sig_gm.graph.erase_node(old)
#          sig_gm.graph.lint()
#          sig_gm.recompile()
#          assert len(sig_gm.graph.nodes) == count, "one node in, one node out"
#          with torch.no_grad():
#              assert torch.equal(sig_gm(x), torch.sigmoid(model.conv(x))), "sigmoid(conv(x))"

# %%
# Further reading
# ---------------
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_: ``Graph``, ``Node``,
#   ``GraphModule`` and the graph-manipulation API.
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_: what ``.module()``
#   returns, guards included.
# - :ref:`Troubleshooting: prepare and convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# Module M01 reads the graph torchao produces:
# :ref:`M01-1 · the PT2E flow <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`.
