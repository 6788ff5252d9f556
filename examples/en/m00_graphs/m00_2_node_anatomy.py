"""
M00-2 Anatomy of a node
=======================

A ``torch.fx`` graph is a list of ``Node`` objects, and a node carries only a handful of
fields: what kind of node it is (``op``), what it calls (``target``), what it reads
(``args``/``kwargs``), who reads it (``users``) and a ``meta`` dictionary of facts recorded
by export. This lesson takes the nodes of a small CNN apart field by field and checks each
field against the model: the shapes in ``meta`` against a real forward pass, and the module
names in ``meta`` against the model's own submodules. A quantizer decides where to quantize
from exactly these fields.

**What you will learn**

- the six ``op`` kinds, and which ones an exported graph contains
- ``target``, ``args``, ``users`` and ``all_input_nodes``: what a node calls and how nodes connect
- ``meta["val"]``, ``meta["nn_module_stack"]`` and ``meta["source_fn_stack"]``: shape, dtype
  and the module each node came from

**Prerequisites**: :ref:`M00-1 · getting a graph
<sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``small_cnn`` is conv → batch norm → relu → max pool → flatten → linear.
# ``export_module`` is ``torch.export.export(model, args).module()`` from M00-1.

from collections import Counter

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

model = get_model("small_cnn")
x = example_inputs(2)[0]
gm = export_module(model, (x,))
nodes = {node.name: node for node in gm.graph.nodes}
draw(gm, title="small_cnn after export")

# %%
# Step 1 — The six kinds of node
# ------------------------------
# ``node.op`` is one of six strings. To see all six, compare the exported graph with the
# graph of ``torch.fx.symbolic_trace``, the older tracer that follows the Python code of
# ``forward`` with proxy objects instead of running ATen operations, and with the trace of
# a one-line function that calls a tensor *method*.

OP_KINDS = ("placeholder", "get_attr", "call_function", "call_module", "call_method", "output")
exported = Counter(node.op for node in gm.graph.nodes)
traced = Counter(node.op for node in torch.fx.symbolic_trace(model).graph.nodes)
method = Counter(node.op for node in torch.fx.symbolic_trace(lambda t: t.flatten(1)).graph.nodes)
print(f"{'op':14} {'export':>7} {'symbolic_trace':>15} {'t.flatten(1)':>13}")
for op in OP_KINDS:
    print(f"{op:14} {exported[op]:7} {traced[op]:15} {method[op]:13}")
assert set(exported) | set(traced) | set(method) == set(OP_KINDS), "six kinds, no others"

# %%
# In the exported graph every computation is a ``call_function`` of an ATen operator; the
# weights are ``get_attr`` nodes (one per entry of the ``state_dict``), and the only
# ``call_module`` is the ``_guards_fn`` of M00-1. ``symbolic_trace`` instead keeps each
# submodule as one ``call_module`` node and leaves the weights inside the modules; a tensor
# method such as ``t.flatten(1)`` becomes a ``call_method``. Export has none: it records the
# ATen operator behind the method instead.

leaf_modules = [name for name, m in model.named_modules() if not list(m.children())]
module_calls = [node.target for node in gm.graph.find_nodes(op="call_module")]
print(f"call_module targets in the exported graph: {module_calls}")
print(f"leaf submodules of the model:              {leaf_modules}")
assert exported["get_attr"] == len(model.state_dict()), "one get_attr per parameter or buffer"
assert module_calls == ["_guards_fn"], "the only call_module: _guards_fn"
assert exported["call_method"] == 0, "export: no call_method"
assert traced["get_attr"] == 0, "symbolic_trace: the weights stay inside the modules"
assert traced["call_module"] == len(leaf_modules), "symbolic_trace: one call_module per layer"

# %%
# Step 2 — target: what the node calls
# ------------------------------------
# For a ``call_function`` node of an exported graph, ``target`` is an ``OpOverload``: an ATen
# operator (``aten.conv2d``) plus one *overload* of it (``default``), which fixes the exact
# signature. For the other kinds it is a string: a name or an attribute path.

conv = nodes["conv2d"]
print(f"{type(conv.target).__name__}: {conv.target}")
print(f"schema: {conv.target._schema}")
for name in ("x", "conv_weight", "_guards_fn", "output"):
    print(f"{nodes[name].op:12} {name:12} target={nodes[name].target!r}")
assert isinstance(conv.target, torch._ops.OpOverload), "an OpOverload"
assert conv.target == torch.ops.aten.conv2d.default, "compare targets with the op itself"
other_targets = [n.target for n in gm.graph.nodes if n.op != "call_function"]
assert all(isinstance(t, str) for t in other_targets), "a string for the other kinds"

# %%
# The overload matters: ``torch.flatten(x, 1)`` was recorded as ``aten.flatten.using_ints``,
# not ``.default``. A pass that looks for ``aten.flatten.default`` would find nothing, so
# compare ``target.overloadpacket`` when any overload will do.

flatten = nodes["flatten"]
print(f"{flatten.target.name()}   overloadpacket: {flatten.target.overloadpacket}")
assert flatten.target == torch.ops.aten.flatten.using_ints, "not .default"
assert flatten.target.overloadpacket == torch.ops.aten.flatten, "any flatten overload"

# %%
# Step 3 — args and kwargs: what the node reads
# ---------------------------------------------
# ``args`` lines up with the operator's schema. Some entries are other nodes (the tensors),
# others are plain Python constants written into the graph (stride and padding). Arguments
# left at their defaults (``dilation``, ``groups``) are simply not written.

schema_args = conv.target._schema.arguments
for argument, value in zip(schema_args, conv.args, strict=False):
    kind = "Node" if isinstance(value, torch.fx.Node) else "constant"
    print(f"{argument.name:8} = {value!s:12} ({kind})")
print(f"kwargs = {conv.kwargs}")
assert [a.name for a in conv.args[:3]] == ["x", "conv_weight", "conv_bias"], "tensors: nodes"
assert conv.args[3:] == ([1, 1], [1, 1]) and conv.kwargs == {}, "stride 1 and padding 1"
assert len(conv.args) == 5 < len(schema_args) == 7, "dilation and groups keep their defaults"

# %%
# ``all_input_nodes`` keeps only the nodes among ``args`` and ``kwargs``: the edges of the
# picture. ``max_pool2d`` shows the other side: apart from its input it holds only
# constants, kernel size 2 and stride 2 (``nn.MaxPool2d(2)`` uses the kernel size as stride).

pool = nodes["max_pool2d"]
print(f"conv2d.all_input_nodes     = {conv.all_input_nodes}")
print(f"max_pool2d.args            = {pool.args}")
print(f"max_pool2d.all_input_nodes = {pool.all_input_nodes}")
assert conv.all_input_nodes == [a for a in conv.args if isinstance(a, torch.fx.Node)], "nodes"
assert pool.args[1:] == ([2, 2], [2, 2]), "kernel size 2, stride 2"
assert pool.all_input_nodes == [nodes["relu"]], "its only input node is relu"

# %%
# Step 4 — users and all_input_nodes: the two directions
# ------------------------------------------------------
# ``all_input_nodes`` points upstream, ``users`` downstream. ``x`` has two users: the conv
# and the guard check. ``users`` is a dictionary whose keys are the nodes (its values are
# unused), so write ``list(node.users)``.

print(f"x.users = {list(nodes['x'].users)}")
print(f"conv2d.all_input_nodes = {conv.all_input_nodes}   conv2d.users = {list(conv.users)}")
assert list(nodes["x"].users) == [conv, nodes["_guards_fn"]], "x: the conv and the guard"
assert list(conv.users) == [nodes["batch_norm"]], "batch_norm reads conv2d"
draw(gm, highlight=["x", "conv2d", "_guards_fn"], title="x and its two users")

# %%
# FX keeps the two directions consistent: whenever B reads A, A lists B among its users.
# That is what lets M00-4 rewire a graph by changing ``args`` alone. Nodes at the ends have
# an empty side: a placeholder reads nothing, and the output node has no users.

for node in gm.graph.nodes:
    for source in node.all_input_nodes:
        assert node in source.users, f"{source.name} -> {node.name} missing from users"
    for user in node.users:
        assert node in user.all_input_nodes, f"{node.name} -> {user.name} missing from inputs"
assert not nodes["x"].all_input_nodes, "a placeholder reads nothing"
assert not nodes["output"].users, "nothing reads the output node"
print("every edge appears in both directions")

# %%
# Step 5 — meta["val"]: shape and dtype without running the model
# ----------------------------------------------------------------
# Export traced the model on *fake* tensors (M00-1): tensors that have a shape, dtype and
# device but no data. Each node keeps its fake result in ``meta["val"]``. Asking for its values
# fails.

val = conv.meta["val"]
print(f"{type(val).__name__}  shape={tuple(val.shape)}  dtype={val.dtype}  device={val.device}")
assert isinstance(val, FakeTensor), "meta['val'] is a FakeTensor"
with expect_error(DataDependentOutputException):
    torch.equal(val, val)

# %%
# To check these shapes against real values, run the graph node by node with
# ``torch.fx.Interpreter``; with ``garbage_collect_values=False`` it keeps every node's real
# result in ``env``. The result must equal the eager model's output.

interpreter = torch.fx.Interpreter(gm, garbage_collect_values=False)
with torch.no_grad():
    result = interpreter.run(x)
    assert torch.equal(result, model(x)), "the interpreter computes the model's output"
for node, real in interpreter.env.items():
    fake = node.meta.get("val")
    if isinstance(real, torch.Tensor) and node.op == "call_function":
        print(f"{node.name:11} fake {tuple(fake.shape)!s:16} real {tuple(real.shape)}")
    if isinstance(real, torch.Tensor):
        assert fake.shape == real.shape and fake.dtype == real.dtype, f"{node.name}: fake = real"

# %%
# Note that the batch size in ``meta["val"]`` is 2, the batch of the example input: this is
# the same specialisation that ``_guards_fn`` checks (M00-1).

assert nodes["linear"].meta["val"].shape == (x.shape[0], 10), "batch 2, as exported"

# %%
# Step 6 — meta["nn_module_stack"]: which module a node came from
# ---------------------------------------------------------------
# ``nn_module_stack`` lists the modules whose ``forward`` was running when the operation was
# recorded, outermost first, each as (attribute path, class name). The last entry is the
# innermost module: ``conv2d`` came from ``model.conv``. ``flatten`` was called in
# ``SmallCNN.forward`` itself, so its innermost module is the root, with the path ``""``.

calls = [node for node in gm.graph.nodes if node.op == "call_function"]
for node in calls:
    path, cls = list(node.meta["nn_module_stack"].values())[-1]
    print(f"{node.name:11} path={path!r:8} class={cls}")
conv_path, conv_cls = list(conv.meta["nn_module_stack"].values())[-1]
assert model.get_submodule(conv_path) is model.conv and conv_cls.endswith(".Conv2d")
flatten_stack = list(flatten.meta["nn_module_stack"].values())
assert flatten_stack == [("", "common.models.SmallCNN")], "called by the root's own forward"

# %%
# The second provenance field, ``source_fn_stack``, records the Python-level call (a module
# class or a function) that produced a node. With torch 2.13 the default export, which runs
# ``forward`` as ordinary Python (``strict=False``), does not fill it; it writes ``torch_fn``
# instead: a unique name, and the kind and name of the torch function that was called.

print(f"source_fn_stack in meta: {'source_fn_stack' in conv.meta}")
for node in calls:
    print(f"{node.name:11} torch_fn={node.meta['torch_fn']}")
assert not any("source_fn_stack" in node.meta for node in gm.graph.nodes), "not filled"
assert conv.meta["torch_fn"][1] == "builtin_function_or_method.conv2d", "torch_fn instead"

# %%
# ``strict=True`` export traces the bytecode with TorchDynamo and does record
# ``source_fn_stack``: for each node, the module class (or function) it came from. M00-3 shows
# that the library's pattern finder reads ``source_fn_stack`` when it is there and falls back
# to ``torch_fn`` and ``nn_module_stack`` when it is not.

strict_gm = torch.export.export(model, (x,), strict=True).module()
for node in strict_gm.graph.nodes:
    if node.op != "call_function":
        continue
    name, source = node.meta["source_fn_stack"][-1]
    print(f"{node.name:11} source_fn_stack[-1]=({name!r}, {source.__name__})")
strict_conv = next(n for n in strict_gm.graph.nodes if n.name == "conv2d")
assert strict_conv.meta["source_fn_stack"][-1][1] is torch.nn.Conv2d, "strict: the module class"

# %%
# Summary
# -------
# ============================  ===========================================================
# Field                         In an exported graph
# ============================  ===========================================================
# ``op``                        ``placeholder``, ``get_attr``, ``call_function``, ``output``;
#                               ``call_module`` only for ``_guards_fn``; no ``call_method``
# ``target``                    an ``OpOverload`` such as ``aten.conv2d.default``, else a
#                               string
# ``args`` / ``kwargs``         nodes (the edges) and Python constants, in schema order
# ``all_input_nodes``           the nodes among the args: upstream
# ``users``                     the nodes that read this one: downstream
# ``meta["val"]``               a fake tensor: shape, dtype, device, no data
# ``meta["nn_module_stack"]``   the modules the node was recorded in, innermost last
# ``meta["torch_fn"]``          the torch function called (``source_fn_stack`` needs
#                               ``strict=True``)
# ============================  ===========================================================
#
# A quantizer decides where to quantize from these fields alone.

# %%
# Exercises
# ---------
# 1. Export ``linear_relu``. Predict its number of ``get_attr`` nodes, the ``target`` of its
#    flatten node and the shape in ``meta["val"]`` of its ``linear`` node.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          lin = {n.name: n for n in export_module(get_model("linear_relu"), (x,)).graph.nodes}
#          assert [n.op for n in lin.values()].count("get_attr") == 2, "weight and bias"
#          assert lin["flatten"].target == torch.ops.aten.flatten.using_ints, "torch.flatten(x, 1)"
#          assert lin["linear"].meta["val"].shape == (2, 10), "batch 2, 10 outputs"
#
# 2. Export ``small_cnn`` again with a dynamic batch:
#    ``dynamic_shapes=({0: torch.export.Dim("batch")},)``. Predict the first entry of
#    ``flatten``'s ``meta["val"]`` shape: still the 2 of ``x``? Which of ``gm`` and the new
#    module run a batch of 5?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          batch = torch.export.Dim("batch")
#          dynamic = torch.export.export(model, (x,), dynamic_shapes=({0: batch},)).module()
#          flat = next(n for n in dynamic.graph.nodes if n.name == "flatten")
#          print(flat.meta["val"].shape)
#          assert isinstance(flat.meta["val"].shape[0], torch.SymInt), "a symbol, not 2"
#          calls = [n for n in dynamic.graph.nodes if n.op == "call_function"]
#          assert len({str(n.meta["val"].shape[0]) for n in calls}) == 1, "one symbol, everywhere"
#          x5 = example_inputs(5)[0]
#          with torch.no_grad():
#              assert torch.equal(dynamic(x5), model(x5)), "the dynamic module runs batch 5"
#          with expect_error(AssertionError, match="Guard failed"):
#              gm(x5)  # gm was exported with batch 2, and its _guards_fn checks it
#
# 3. Predict which ``call_function`` nodes of ``gm`` have ``bn`` as the path of their
#    innermost ``nn_module_stack`` entry, and which have the root, ``""``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          def innermost_path(node):
#              return list(node.meta["nn_module_stack"].values())[-1][0]
#
#          from_bn = [n.name for n in calls if innermost_path(n) == "bn"]
#          from_root = [n.name for n in calls if innermost_path(n) == ""]
#          assert from_bn == ["batch_norm"] and from_root == ["flatten"], (from_bn, from_root)

# %%
# Further reading
# ---------------
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_: the ``Node`` class and its
#   fields.
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_: the IR it produces,
#   with the node metadata it records.
# - :ref:`Troubleshooting: imports and export
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# :ref:`M00-3 · finding patterns <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>` uses
# these fields to find every conv → batch norm → relu chain, by hand and with the library
# tools quantizers use.
