"""
M00-3 Finding patterns: conv → batch norm → relu
================================================

Before a quantizer can decide where the quantize and dequantize nodes go, it must find the
groups of nodes that fusion will run as one kernel, such as conv → relu. This lesson finds
every conv → (batch norm →) relu chain of an exported graph three ways: by walking
``graph.nodes`` by hand, with ``get_source_partitions`` (nodes grouped by the module they came
from), and with ``SubgraphMatcher`` (a small pattern graph matched node for node). All three
find the same nodes, and torchao's ``X86InductorQuantizer`` turns out to use the second. Then
it looks at the graph a quantizer is actually given: for post-training quantization the batch
norm is already folded into the conv.

**What you will learn**

- how to walk a graph along ``users`` and recognise a chain of ATen operators
- ``get_source_partitions`` and ``SubgraphMatcher``: what each matches on, and their pitfalls
- what graph a quantizer receives, and why one quantizer matches modules and another ATen targets

**Prerequisites**: :ref:`M00-2 · anatomy of a node
<sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``small_cnn`` contains one conv → batch norm → relu chain, followed by max pool, flatten
# and linear, which belong to no chain.

import copy
import inspect

import torch
import torch.nn.functional as F
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher
from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.graph_utils import find_sequential_partitions
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

from common.quantizer import CourseQuantizer

CONV = torch.ops.aten.conv2d.default
BATCH_NORM = torch.ops.aten.batch_norm.default
RELU = torch.ops.aten.relu.default

x = example_inputs(2)[0]
gm = export_module(get_model("small_cnn"), (x,))
draw(gm, title="small_cnn: where is conv → batch norm → relu?")

# %%
# Two classes for steps 5 and 6: a quantizer that annotates nothing and only keeps a copy of
# the graph it is given, and a model that calls functions instead of modules.


class SeenByAnnotate(Quantizer):
    """Annotates nothing; keeps a copy of the graph ``annotate`` receives."""

    def annotate(self, model):
        self.graph_module = copy.deepcopy(model)
        return model

    def validate(self, model):
        pass

    def ops(self):
        """The call_function targets it received, in graph order."""
        return [str(n.target) for n in self.graph_module.graph.nodes if n.op == "call_function"]


class FunctionalConvReLU(torch.nn.Module):
    """conv → relu written with torch.nn.functional calls instead of submodules."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8, 3, 3, 3))  # values play no part here

    def forward(self, x):
        return F.relu(F.conv2d(x, self.weight, padding=1))


# %%
# Step 1 — Walk the graph by hand
# -------------------------------
# Start at every ``aten.conv2d`` node and follow ``users`` downstream: an optional
# ``batch_norm``, then a ``relu``. Each step requires a *single* user: if the conv's output
# were also read elsewhere, a fused kernel that never writes that intermediate out could
# not serve the other reader.


def only_user(node):
    """The one node that reads ``node``, or None when it has zero or several users."""
    return next(iter(node.users)) if len(node.users) == 1 else None


def conv_chains(graph):
    """Every conv → relu and conv → batch norm → relu chain, as tuples of node names."""
    chains = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target != CONV:
            continue
        chain, step = [node], only_user(node)
        if step is not None and step.target == BATCH_NORM:
            chain, step = [*chain, step], only_user(step)
        if step is not None and step.target == RELU:
            chains.append(tuple(n.name for n in [*chain, step]))
    return chains


by_hand = conv_chains(gm.graph)
print(by_hand)
assert by_hand == [("conv2d", "batch_norm", "relu")], "one chain in small_cnn"
draw(gm, highlight=by_hand[0], title="Step 1: the chain found by hand")

# %%
# The same walk over the whole zoo. The zoo's definitions say what to expect: two models
# have the batch norm in between, ``conv_relu`` does not, ``linear_relu`` has no conv.

expected = {
    "conv_relu": [("conv2d", "relu")],
    "conv_bn_relu": [("conv2d", "batch_norm", "relu")],
    "linear_relu": [],
    "small_cnn": [("conv2d", "batch_norm", "relu")],
}
graphs = {name: export_module(get_model(name), (x,)) for name in MODEL_NAMES}
for name, graph_module in graphs.items():
    print(f"{name:13} {conv_chains(graph_module.graph)}")
    assert conv_chains(graph_module.graph) == expected[name], name

# %%
# Step 2 — get_source_partitions: nodes grouped by their module
# -------------------------------------------------------------
# ``get_source_partitions(graph, wanted_sources)`` groups the nodes that came from each
# wanted module class (or function) into ``SourcePartition`` objects: the nodes, the nodes
# feeding them (``input_nodes``), the nodes whose results leave the group
# (``output_nodes``) and the weights (``params``).

partitions = get_source_partitions(gm.graph, [torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU])
for source, found in partitions.items():
    for p in found:
        print(f"{source.__name__:11} nodes={p.nodes} inputs={p.input_nodes} ", end="")
        print(f"outputs={p.output_nodes} params={p.params}")
assert [len(found) for found in partitions.values()] == [1, 1, 1], "one module of each class"
assert partitions[torch.nn.Conv2d][0].nodes[0].name == "conv2d", "the conv partition: conv2d"

# %%
# How does it know? M00-2 showed that the default export leaves ``source_fn_stack`` out.
# In that case ``get_source_partitions`` falls back to ``meta["torch_fn"]`` and to the
# innermost entry of ``meta["nn_module_stack"]``, for ``call_function`` nodes only. That is
# why the weights, which are ``get_attr`` nodes, are not in the partitions: ``params`` is
# empty here (after a ``strict=True`` export it would list them).

source_code = inspect.getsource(get_source_partitions)
assert "torch_fn" in source_code and "nn_module_stack" in source_code, "the two fallbacks"
assert all(not p.params for found in partitions.values() for p in found), "params is empty"

# %%
# Chains are partitions that feed one another. torchao's ``find_sequential_partitions``
# builds them from ``get_source_partitions``: one partition per class in the list, each
# connected to the next. Two lists cover both kinds of chain, and it finds the same nodes as
# the walk by hand, on every zoo model.


def chains_from_partitions(graph_module):
    """Chains found by torchao's find_sequential_partitions, as tuples of node names."""
    chains = []
    for types in (
        [torch.nn.Conv2d, torch.nn.ReLU],
        [torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU],
    ):
        for fused in find_sequential_partitions(graph_module, types):
            chains.append(tuple(p.output_nodes[0].name for p in fused))
    return chains


for name, graph_module in graphs.items():
    print(f"{name:13} {chains_from_partitions(graph_module)}")
    assert chains_from_partitions(graph_module) == conv_chains(graph_module.graph), name

# %%
# Step 3 — SubgraphMatcher: match a pattern graph node for node
# --------------------------------------------------------------
# ``SubgraphMatcher`` takes a pattern *graph* and finds where the same operators, wired the
# same way, occur. Export a tiny module to get the pattern (only the shapes of its example
# inputs matter, not their values), and take the graph of the ``ExportedProgram`` (M00-1):
# its inputs are placeholders, and it has no ``_guards_fn``.


class ConvBatchNormReLU(torch.nn.Module):
    """The pattern: every tensor is an input, so it can stand for any conv and batch norm."""

    def forward(self, x, weight, bias, bn_weight, bn_bias, mean, var):
        y = F.conv2d(x, weight, bias)
        y = F.batch_norm(y, mean, var, bn_weight, bn_bias, training=False)
        return F.relu(y)


pattern_args = (torch.ones(1, 3, 4, 4), torch.ones(2, 3, 1, 1), *(torch.ones(2) for _ in range(5)))
pattern = torch.export.export(ConvBatchNormReLU(), pattern_args).graph_module
draw(pattern, title="The pattern graph")

# %%
# Matched as it is, the pattern finds nothing: the matcher also compares the constant
# arguments. The pattern's conv has the default padding, ``[0, 0]``, while the model's conv
# has padding 1. ``ignore_literals=True`` treats constants as wildcards, and the pattern's
# placeholders match anything, so ``weight`` matches the model's ``get_attr`` node
# ``conv_weight``.

strict_matches = SubgraphMatcher(pattern.graph).match(gm.graph)
matches = SubgraphMatcher(pattern.graph, ignore_literals=True).match(gm.graph)
print(f"ignore_literals=False: {len(strict_matches)} matches;  True: {len(matches)}")
mapped = {p.name: g.name for p, g in matches[0].nodes_map.items()}
print(mapped)
assert not strict_matches and len(matches) == 1, "only ignore_literals=True finds the chain"
assert mapped["weight"] == "conv_weight", "a pattern placeholder matched a get_attr node"

# %%
# The matched call_function nodes are the chain found by hand:

matched = tuple(g.name for p, g in matches[0].nodes_map.items() if p.op == "call_function")
assert tuple(sorted(matched)) == tuple(sorted(by_hand[0])), matched
draw(gm, highlight=matched, title="Step 3: the chain found by SubgraphMatcher")

# %%
# Step 4 — Why quantizers annotate through source partitions
# ----------------------------------------------------------
# torchao's ``X86InductorQuantizer`` thinks in modules: "quantize every ``Conv2d`` followed by
# a ``ReLU``". Source partitions answer that question directly, whatever ATen operators and
# constants the module turned into; a hand-written walk or a pattern graph has to spell out
# each operator, overload and constant. It finds its conv → relu pairs with
# ``find_sequential_partitions`` and its single convs with ``get_source_partitions``:

unary = inspect.getsource(X86InductorQuantizer._annotate_conv2d_unary)
single = inspect.getsource(X86InductorQuantizer._annotate_conv2d)
print([line.strip() for line in unary.splitlines() if "[torch.nn.Conv2d, torch.nn.ReLU]" in line])
assert "find_sequential_partitions(gm, unary_pattern)" in unary, "conv → relu: partitions"
assert "get_source_partitions(" in single, "a single conv: partitions"

# %%
# The price is that everything rests on ``meta``. A pass that replaces a node and does not
# copy its ``meta`` makes the node invisible to source partitions. Below, ``relu`` is
# replaced by an identical new ``aten.relu`` node (the M00-4 way): the walk by hand still
# finds the chain, the partitions no longer do.

edited = copy.deepcopy(gm)
old_relu = next(n for n in edited.graph.nodes if n.name == "relu")
with edited.graph.inserting_after(old_relu):
    new_relu = edited.graph.call_function(RELU, old_relu.args)
old_relu.replace_all_uses_with(new_relu)
edited.graph.erase_node(old_relu)
edited.recompile()
print(f"by hand: {conv_chains(edited.graph)}   partitions: {chains_from_partitions(edited)}")
assert conv_chains(edited.graph) == [("conv2d", "batch_norm", new_relu.name)], "still found"
assert chains_from_partitions(edited) == [], "the new relu has no nn_module_stack"

# %%
# Copying the old node's ``meta`` onto the new one makes it visible again. A pass that
# rewrites nodes should always carry ``meta`` over; M02's hand-written passes will.

new_relu.meta = dict(old_relu.meta)
found = chains_from_partitions(edited)
assert found == [("conv2d", "batch_norm", new_relu.name)], "with meta, partitions see it again"

# %%
# Step 5 — What a quantizer is given
# ----------------------------------
# The chains so far come from the exported graph, but that is not what a quantizer sees.
# For post-training quantization, ``prepare_pt2e`` (M01-1) first folds each batch norm into
# the conv before it and only then calls ``annotate``. ``SeenByAnnotate`` shows the result:
# the quantizer receives conv → relu.

ptq = SeenByAnnotate()
prepare_pt2e(export_module(get_model("conv_bn_relu"), (x,)), ptq)
print(f"annotate receives: {ptq.ops()}")
assert conv_chains(ptq.graph_module.graph) == [("conv2d", "relu")], "batch norm already folded"
draw(ptq.graph_module, highlight=["conv2d", "relu"], title="What a PTQ quantizer receives")

# %%
# Quantization-aware training (M04-3) is different: ``prepare_qat_pt2e`` annotates first and
# folds afterwards, so a QAT quantizer sees conv → batch norm → relu (the ``add_`` is the
# batch norm's batch counter, live in train mode), and the x86 quantizer's QAT patterns
# include ``BatchNorm2d``. The three-node chain matters there, and in any pass that runs on
# the exported graph before ``prepare``, like this lesson's.

qat = SeenByAnnotate()
prepare_qat_pt2e(export_module(get_model("conv_bn_relu").train(), (x,)), qat)
print(f"annotate receives: {qat.ops()}")
assert conv_chains(qat.graph_module.graph) == [("conv2d", "batch_norm", "relu")], "QAT: kept"
qat_patterns = inspect.getsource(X86InductorQuantizer._annotate_qat_conv2d_bn_unary)
assert "torch.nn.BatchNorm2d" in qat_patterns, "the x86 QAT patterns include the batch norm"

# %%
# Step 6 — Matching ATen targets instead: the course's quantizer
# --------------------------------------------------------------
# The course's own ``CourseQuantizer`` (M02) walks ``graph.nodes`` and matches ATen targets,
# as step 1 did. A PTQ quantizer is given a conv and its single relu user, which targets
# describe exactly, and targets do not depend on ``meta`` or on how the model was written.

annotate_code = inspect.getsource(CourseQuantizer.annotate)
print([line.strip() for line in annotate_code.splitlines() if "node.target in" in line])
assert "node.target in _WEIGHTED_OPS" in annotate_code, "it matches on aten targets"

# %%
# ``FunctionalConvReLU`` calls ``F.conv2d`` and ``F.relu``: the same ATen nodes, but no
# ``Conv2d`` module. The x86 quantizer's partitions miss them, so it annotates nothing; the
# course quantizer annotates both nodes. In exchange, partitions know the module: configuring a
# quantizer by module type or name needs them.

annotated = {}
for quantizer in (x86_quantizer(), CourseQuantizer()):
    functional = export_module(FunctionalConvReLU(), (x,))
    quantizer.annotate(functional)
    marked = [n.name for n in functional.graph.nodes if "quantization_annotation" in n.meta]
    annotated[type(quantizer).__name__] = marked
print(annotated)
assert annotated["X86InductorQuantizer"] == [], "partitions keyed on modules find nothing"
assert annotated["CourseQuantizer"] == ["conv2d", "relu"], "aten targets find conv and relu"

# %%
# Why the x86 quantizer misses a functional conv: after the default export,
# ``get_source_partitions`` matches a function only by its name as a string, and the x86
# quantizer passes the function ``F.conv2d`` itself.

assert not get_source_partitions(functional.graph, [F.conv2d]), "F.conv2d: no partition"
assert get_source_partitions(functional.graph, ["conv2d"]), "'conv2d' as a string: found"

# %%
# Summary
# -------
# ==========================  =================================================================
# Way                         Matches on
# ==========================  =================================================================
# walk ``graph.nodes``        ``target`` and ``users``: exact, but you spell out every operator
# ``get_source_partitions``   the module or function a node came from (``meta``); what the
#                             x86 quantizer uses, so passes must keep ``meta``
# ``SubgraphMatcher``         a pattern graph: operators, wiring and (unless
#                             ``ignore_literals=True``) constants
# ==========================  =================================================================
#
# For post-training quantization the quantizer is given conv → relu, the batch norm already
# folded; conv → batch norm → relu is what QAT quantizers and passes before ``prepare`` see.

# %%
# Exercises
# ---------
# 1. A model whose conv output is read twice, ``relu(y) + y`` with ``y = conv(x)``: predict
#    what ``conv_chains`` and ``chains_from_partitions`` return.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          class TwoReaders(torch.nn.Module):
#              def __init__(self):
#                  super().__init__()
#                  self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
#                  self.relu = torch.nn.ReLU()
#
#              def forward(self, x):
#                  y = self.conv(x)
#                  return self.relu(y) + y
#
#          two = export_module(TwoReaders(), (x,))
#          assert conv_chains(two.graph) == [], "the walk wants a single user"
#          assert chains_from_partitions(two) == [("conv2d", "relu")], "partitions do not check"
#
# 2. Give ``SeenByAnnotate`` to ``prepare_pt2e`` with ``small_cnn``. Predict the operators
#    ``annotate`` receives.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          seen = SeenByAnnotate()
#          prepare_pt2e(export_module(get_model("small_cnn"), (x,)), seen)
#          ops = ["conv2d", "relu", "max_pool2d", "flatten", "linear"]
#          assert [op.split(".")[1] for op in seen.ops()] == ops, "no batch_norm: folded"
#
# 3. Export a conv → relu pattern (no batch norm) the way step 3 does. Predict how many
#    matches ``SubgraphMatcher(..., ignore_literals=True)`` finds in each zoo model.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          class ConvReLUPattern(torch.nn.Module):
#              def forward(self, x, weight, bias):
#                  return F.relu(F.conv2d(x, weight, bias))
#
#          args = (torch.ones(1, 3, 4, 4), torch.ones(2, 3, 1, 1), torch.ones(2))
#          conv_relu_pattern = torch.export.export(ConvReLUPattern(), args).graph_module
#          matcher = SubgraphMatcher(conv_relu_pattern.graph, ignore_literals=True)
#          counts = {name: len(matcher.match(g.graph)) for name, g in graphs.items()}
#          expected = {"conv_relu": 1, "conv_bn_relu": 0, "linear_relu": 0, "small_cnn": 0}
#          assert counts == expected, "a batch norm in between breaks the match"

# %%
# Further reading
# ---------------
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_: ``Graph`` and ``Node``, the
#   structures all three ways walk.
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_: strict and non-strict
#   export, and the node metadata they record.
# - :ref:`Troubleshooting: prepare and convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` —
#   the same failure, found by its error message
# - :ref:`Troubleshooting: imports and export
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# Reading is done. :ref:`M00-4 · editing graphs
# <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>` edits the graph: inserting, rewiring
# and removing nodes, as ``prepare_pt2e`` and ``convert_pt2e`` do.
