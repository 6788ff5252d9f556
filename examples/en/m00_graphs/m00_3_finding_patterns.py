"""
M00-3 Finding patterns: conv → batch norm → relu
================================================

Before a quantizer can decide where the quantize and dequantize nodes go, it must find the
groups of nodes that will run as one fused kernel, such as conv → batch norm → relu. This
lesson finds every such chain three ways: by walking ``graph.nodes`` by hand, with
``get_source_partitions`` (nodes grouped by the module they came from), and with
``SubgraphMatcher`` (a small pattern graph matched node for node). All three find the same
nodes, and torchao's ``X86InductorQuantizer`` turns out to use the second.

**What you will learn**

- how to walk a graph along ``users`` and recognise a chain of ATen operators
- ``get_source_partitions`` and ``SubgraphMatcher``: what each matches on, and their pitfalls
- why quantizers annotate through source partitions, and what that asks of graph passes

**Prerequisites**: :ref:`sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py`.
"""

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
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

from torchao.quantization.pt2e.graph_utils import find_sequential_partitions  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
)

CONV = torch.ops.aten.conv2d.default
BATCH_NORM = torch.ops.aten.batch_norm.default
RELU = torch.ops.aten.relu.default

x = example_inputs(2)[0]
gm = export_module(get_model("small_cnn"), (x,))
draw(gm, title="small_cnn: where is conv → batch norm → relu?")

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
assert partitions[torch.nn.Conv2d][0].nodes[0].name == "conv2d"

# %%
# How does it know? M00-2 showed that the default export leaves ``source_fn_stack`` out.
# In that case ``get_source_partitions`` falls back to ``meta["torch_fn"]`` and to the
# innermost entry of ``meta["nn_module_stack"]``, for ``call_function`` nodes only. That is
# why the weights, which are ``get_attr`` nodes, are not in the partitions: ``params`` is
# empty here (after a ``strict=True`` export it would list them).

source_code = inspect.getsource(get_source_partitions)
assert "source_fn_stack" in source_code and "nn_module_stack" in source_code
assert all(not p.params for found in partitions.values() for p in found)

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
assert not strict_matches and len(matches) == 1
assert mapped["weight"] == "conv_weight" and mapped["relu"] == "relu"

# %%
# The matched call_function nodes are the chain found by hand:

matched = tuple(g.name for p, g in matches[0].nodes_map.items() if p.op == "call_function")
assert tuple(sorted(matched)) == tuple(sorted(by_hand[0])), matched
draw(gm, highlight=matched, title="Step 3: the chain found by SubgraphMatcher")

# %%
# Step 4 — Why quantizers annotate through source partitions
# ----------------------------------------------------------
# A quantizer thinks in modules: "quantize every ``Conv2d`` followed by a ``ReLU``". Source
# partitions answer that question directly, whatever ATen operators and constants the
# module turned into; a hand-written walk or a pattern graph has to spell out each
# operator, overload and constant. torchao's ``X86InductorQuantizer`` finds its conv →
# relu pairs with ``find_sequential_partitions`` and its single convs with
# ``get_source_partitions``:

unary = inspect.getsource(X86InductorQuantizer._annotate_conv2d_unary)
single = inspect.getsource(X86InductorQuantizer._annotate_conv2d)
print([line.strip() for line in unary.splitlines() if "[torch.nn.Conv2d, torch.nn.ReLU]" in line])
assert "find_sequential_partitions(gm, unary_pattern)" in unary
assert "get_source_partitions(" in single

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
assert conv_chains(edited.graph) == [("conv2d", "batch_norm", new_relu.name)]
assert chains_from_partitions(edited) == [], "the new relu has no nn_module_stack"

# %%
# Copying the old node's ``meta`` onto the new one makes it visible again. A pass that
# rewrites nodes should always carry ``meta`` over; M02's hand-written passes will.

new_relu.meta = dict(old_relu.meta)
assert chains_from_partitions(edited) == [("conv2d", "batch_norm", new_relu.name)]

# %%
# Summary
# -------
# ==========================  =================================================================
# Way                         Matches on
# ==========================  =================================================================
# walk ``graph.nodes``        ``target`` and ``users``: exact, but you spell out every operator
# ``get_source_partitions``   the module or function a node came from (``meta``); what
#                             quantizers use, so passes must keep ``meta``
# ``SubgraphMatcher``         a pattern graph: operators, wiring and (unless
#                             ``ignore_literals=True``) constants
# ==========================  =================================================================
#
# Reading is done. Next, :ref:`sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py` edits the
# graph: inserting, rewiring and removing nodes, as ``prepare_pt2e`` and ``convert_pt2e`` do.
