"""
M00-1 Getting a graph: torch.export and ExportedProgram
=======================================================

PT2E quantizes a graph, not Python code. ``torch.export.export`` *traces* a model: it runs the
Python code of ``forward`` once, on fake tensors that have the shapes and dtypes of the example
inputs but no values, and records every ATen operation called. The result, an
``ExportedProgram``, holds that graph together with the model's weights and a signature saying
which graph input is which. ``.module()`` then turns the program into the
``torch.fx.GraphModule`` that PT2E reads and edits. This lesson does both on a conv → batch
norm → relu model and checks that the graph computes exactly what the model computes.

**What you will learn**

- what an ``ExportedProgram`` holds: a graph whose inputs include the weights, and its signature
- what ``.module()`` changes: weights read by ``get_attr`` nodes, and a ``_guards_fn`` node
  that checks the inputs
- how to print a graph as Python code, and check it against the eager model

**Prerequisites**: PyTorch itself (an ``nn.Module`` and its ``forward``; see
`torch.nn.Module <https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html>`_);
no ``torch.fx`` yet.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# The course's model zoo gives small models with fixed weights. ``conv_bn_relu`` has
# parameters (the conv and batch norm weights) and buffers (the batch norm statistics),
# which is what makes its graph signature interesting.

import torch

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import quiet
from common.viz import draw

quiet()

model = get_model("conv_bn_relu")
x = example_inputs(2)[0]
print(model)
print(f"x: {tuple(x.shape)}")

# %%
# Step 1 — Export the model
# -------------------------
# ``torch.export.export(model, args)`` takes the example inputs as a tuple, even when there is
# only one. Each box in the picture is one ATen operation that export recorded; each ellipse is
# a graph input. Every node has a tooltip with its op, dtype and shape, weights and source line:
# hover over it, or on a touch screen tap it. Click or tap a picture (or its *Open full size*
# button) to open it full size, with pan and zoom: the course's bigger graphs need it.

program = torch.export.export(model, (x,))
print(type(program).__name__)
assert isinstance(program, torch.export.ExportedProgram), "export returns an ExportedProgram"
draw(program.graph_module, title="ExportedProgram: the weights are graph inputs")

# %%
# Export ran the Python code of ``forward`` once, but not on the numbers in ``x``. A forward
# pre-hook on the conv shows what the conv receives during an export: *fake* tensors (M00-2
# looks at them), weights included. Only the shapes and dtypes of the example input matter:
# exporting with a batch of zeros records the same graph.

seen = []
hook = model.conv.register_forward_pre_hook(
    lambda conv, args: seen.append((type(args[0]).__name__, type(conv.weight).__name__))
)
zeros_program = torch.export.export(model, (torch.zeros_like(x),))
hook.remove()
print(f"conv input and weight during export: {seen}")
assert seen == [("FakeTensor", "FakeTensor")], "forward ran once, on fake tensors"
assert zeros_program.graph_module.code == program.graph_module.code, "values do not matter"

# %%
# The graph has eight inputs, not one. Export *lifts* every parameter and buffer into an
# input of its own, so that the graph is a pure function of its inputs: seven tensors of
# the model's state, then ``x``, named after the argument of ``forward()``.

placeholders = [node.name for node in program.graph.nodes if node.op == "placeholder"]
print(placeholders)
assert len(placeholders) == len(model.state_dict()) + 1, "one input per state tensor, plus x"
assert placeholders[-1] == "x", "the user input comes last, named as in forward(self, x)"

# %%
# Step 2 — Read the graph signature
# ---------------------------------
# ``program.graph_signature`` says what each input is: a ``PARAMETER``, a ``BUFFER`` or a
# ``USER_INPUT``, and for each lifted parameter or buffer, which attribute of the model it
# stands for.

signature = program.graph_signature
for spec in signature.input_specs:
    print(f"{spec.arg.name:26} {spec.kind.name:11} {spec.target}")
for spec in signature.output_specs:
    print(f"{spec.arg.name:26} {spec.kind.name:11}")

# %%
# The parameters and buffers are exactly the model's, in order. Their input names follow a
# rule: ``p_`` for a parameter or ``b_`` for a buffer, then the attribute path with ``_`` for
# ``.`` (``conv.weight`` becomes ``p_conv_weight``).

parameters = [name for name, _ in model.named_parameters()]
assert list(signature.parameters) == parameters, "the model's parameters, in order"
assert list(signature.buffers) == [name for name, _ in model.named_buffers()], "and its buffers"
for spec in signature.input_specs:
    if spec.target is not None:
        prefix = "p_" if spec.kind.name == "PARAMETER" else "b_"
        assert spec.arg.name == prefix + spec.target.replace(".", "_"), f"p_/b_ + path: {spec}"
# sphinx_gallery_start_ignore
assert signature.user_inputs == ("x",) and signature.user_outputs == ("relu",)
# sphinx_gallery_end_ignore

# %%
# The tensors themselves live in ``program.state_dict``. Export does not copy them: they are
# the model's own tensors, so changing the model's weights in place changes the program too.

print(list(program.state_dict))
assert program.state_dict["conv.weight"] is model.conv.weight, "the very same tensor object"

# %%
# An ``ExportedProgram`` cannot be called directly; the error names the way out.

with expect_error(RuntimeError, match="module()"):
    program(x)

# %%
# Step 3 — Get a GraphModule with .module()
# -----------------------------------------
# ``program.module()`` returns a ``torch.fx.GraphModule``: an ``nn.Module`` whose ``forward``
# is generated from its graph. This is the form that ``prepare_pt2e`` and ``convert_pt2e``
# take, and what ``common.pt2e.export_module`` returns.

gm = program.module()
is_graph_module, is_module = isinstance(gm, torch.fx.GraphModule), isinstance(gm, torch.nn.Module)
print(f"GraphModule? {is_graph_module}   nn.Module? {is_module}")
assert is_graph_module and is_module, "a GraphModule is an nn.Module"
draw(gm, highlight=["_guards_fn"], title="program.module(): get_attr nodes and _guards_fn")

# %%
# The only input left is ``x``. The state tensors are attributes of ``gm`` again, and the
# graph reads each one with a ``get_attr`` node whose ``target`` is the attribute path and
# whose name is that path with ``_`` (``conv_weight``; no ``p_`` prefix any more). The
# pictures do not draw these nodes as boxes: they appear as ``‹conv_weight›`` inside the
# label of the node that reads them. Only ``bn_num_batches_tracked`` gets a box of its own,
# because nothing reads it: batch norm in eval mode does not count batches.

attrs = {node.name: node.target for node in gm.graph.nodes if node.op == "get_attr"}
inputs = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
print(f"placeholders: {inputs}")
print(f"get_attr:     {attrs}")
assert inputs == ["x"], "only the user input is still a graph input"
assert set(attrs.values()) == set(model.state_dict()), "one get_attr per state tensor"
assert all(name == target.replace(".", "_") for name, target in attrs.items()), "path, . → _"
assert gm.get_parameter("conv.weight") is model.conv.weight, "still the model's own tensor"
unread = next(n for n in gm.graph.nodes if n.name == "bn_num_batches_tracked")
assert not unread.users, "nothing reads bn_num_batches_tracked"

# %%
# Step 4 — What _guards_fn is for
# -------------------------------
# Export recorded the graph for *this* ``x``: without ``dynamic_shapes`` every size is fixed,
# batch size 2 included. ``.module()`` therefore inserts, right after the placeholders, a
# ``call_module`` node that calls the submodule ``_guards_fn`` on the inputs. It checks the
# inputs against those assumptions and returns nothing, so the node has no users.

guards = next(node for node in gm.graph.nodes if node.name == "_guards_fn")
print(f"op={guards.op!r}  target={guards.target!r}")
print(f"args={guards.args}  users={list(guards.users)}")
assert guards.op == "call_module" and guards.target == "_guards_fn", "a call_module node"
assert [node.name for node in guards.args] == ["x"], "it reads the inputs"
assert not guards.users, "it returns nothing, so nobody reads it"

# %%
# The eager model accepts a batch of 3; the exported graph refuses it, and the failing
# check is the guard ``x.size()[0] == 2`` (2 is the batch size of the example input).

x3 = example_inputs(3)[0]
with torch.no_grad():
    print(f"model(x3): {tuple(model(x3).shape)}")
with expect_error(AssertionError, match=f"x.size()[0] == {x.shape[0]}"):
    gm(x3)

# %%
# ``program.module(check_guards=False)`` leaves ``_guards_fn`` out. The input is still
# checked, but by a forward pre-hook that runs *before* the graph, so the graph itself holds
# only the computation. The pre-hook does part of the guards' checks, enough for the shape.

gm_unguarded = program.module(check_guards=False)
unguarded_names = [node.name for node in gm_unguarded.graph.nodes]
print(f"nodes: {unguarded_names}")
assert "_guards_fn" not in unguarded_names, "no _guards_fn node"
assert len(unguarded_names) == len(gm.graph.nodes) - 1, "the same graph, minus _guards_fn"
with expect_error(RuntimeError, match=f"to be equal to {x.shape[0]}"):
    gm_unguarded(x3)

# %%
# Graph passes see ``_guards_fn`` like any other node: a pass that treats every
# ``call_module`` as an observer, or that counts nodes, has to allow for it (M00-4 does).
#
# Step 5 — Read the graph as code
# -------------------------------
# ``gm.code`` is the generated code, the Python source of ``forward``: one line per node, in graph
# order. The ``get_attr`` nodes are the ``self.conv.weight`` lines.

print(gm.code.strip())
assert "conv_weight = self.conv.weight" in gm.code, "a get_attr node is an attribute read"
assert "self._guards_fn(x)" in gm.code, "the guard node is a call of the submodule"

# %%
# ``print_readable`` prints the same code with each value's dtype and shape (taken from
# the node's ``meta["val"]``, see M00-2). It also prints the file and line each operation came
# from; here we keep only the operation lines. The conv turns 3 channels into 8 and its
# padding of 1 keeps 16 × 16, so its output is ``f32[2, 8, 16, 16]``.

readable = gm.print_readable(print_output=False)
for line in readable.splitlines():
    if "torch.ops.aten" in line:
        print(line.split(";")[0].strip())
conv_line = 'conv2d: "f32[2, 8, 16, 16]" = torch.ops.aten.conv2d.default'
assert conv_line in readable, "the conv's output is f32[2, 8, 16, 16]"

# %%
# Step 6 — Check the graph against the eager model
# ------------------------------------------------
# The graph calls the same ATen kernels as the eager model, on the same tensors, in the same
# order, so the outputs are not just close: they are equal bit for bit.

with torch.no_grad():
    eager = model(x)
    from_graph = gm(x)
    from_unguarded = gm_unguarded(x)
print(f"max |gm(x) - model(x)| = {(from_graph - eager).abs().max().item()}")
assert torch.equal(from_graph, eager), "the exported graph computes exactly the eager output"
assert torch.equal(from_unguarded, eager), "check_guards changes the checks, not the numbers"

# %%
# Summary
# -------
# ======================  =================================================================
# Form                    What it is
# ======================  =================================================================
# ``ExportedProgram``     graph with the weights lifted to inputs (``p_*``, ``b_*``),
#                         ``graph_signature``, ``state_dict``; not callable
# ``program.module()``    ``GraphModule``: weights read by ``get_attr``, a ``_guards_fn``
#                         node checks the inputs; ``gm(x)`` equals ``model(x)``
# ``check_guards=False``  the same graph without ``_guards_fn``; a pre-hook checks instead
# ======================  =================================================================
#
# Export traced ``forward`` once on fake tensors; the graph it recorded computes exactly what
# the model computes, for inputs of the exported shape.

# %%
# Exercises
# ---------
# 1. Export ``small_cnn`` instead. Predict how many placeholders the ``ExportedProgram``'s
#    graph has, and the name of its user output.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          cnn = get_model("small_cnn")
#          cnn_program = torch.export.export(cnn, (x,))
#          cnn_inputs = [n for n in cnn_program.graph.nodes if n.op == "placeholder"]
#          assert len(cnn_inputs) == len(cnn.state_dict()) + 1 == 10, "9 state tensors + x"
#          assert cnn_program.graph_signature.user_outputs == ("linear",), "the fc's aten.linear"
#
# 2. Export ``conv_relu`` with a batch of 4. Predict what calling its ``.module()`` on ``x``
#    (a batch of 2) does.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          gm4 = torch.export.export(get_model("conv_relu"), example_inputs(4)).module()
#          with expect_error(AssertionError, match="x.size()[0] == 4"):
#              gm4(x)
#
# 3. Export ``model`` again with ``dynamic_shapes={"x": {0: torch.export.Dim("batch")}}``.
#    Predict what ``.module()`` does with ``x3``, and what ``meta["val"]`` of ``conv2d`` holds
#    as its batch size.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          dynamic = {"x": {0: torch.export.Dim("batch")}}
#          gm_dynamic = torch.export.export(model, (x,), dynamic_shapes=dynamic).module()
#          with torch.no_grad():
#              assert torch.equal(gm_dynamic(x3), model(x3)), "a batch of 3 is accepted now"
#          conv_val = next(n for n in gm_dynamic.graph.nodes if n.name == "conv2d").meta["val"]
#          assert isinstance(conv_val.shape[0], torch.SymInt), "the batch size is a symbol"

# %%
# Further reading
# ---------------
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_: ``ExportedProgram``,
#   the graph signature, dynamic shapes and strict versus non-strict tracing.
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_: ``GraphModule`` and its
#   generated code.
# - :ref:`Troubleshooting: imports and export
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# :ref:`M00-2 · anatomy of a node <sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>` takes
# one node apart: its ``op``, ``target``, ``args``, ``users`` and ``meta``. The article
# :ref:`FX Graph and Node basics <fx-basics>` sums up the whole module on one page.
