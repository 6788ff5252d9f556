"""
M01-1 The PT2E flow end to end
==============================

Quantizing a model with PT2E takes four calls: ``torch.export`` captures the graph,
``prepare_pt2e`` removes BatchNorm (BatchNorm folding) and inserts an observer on every edge
the quantizer wants quantized, a few calibration batches let the observers record statistics, and
``convert_pt2e`` replaces each observer with a quantize/dequantize pair whose scale and zero
point come from those statistics. The result still computes in float32: it *simulates* int8.
This lesson runs the four calls on ``small_cnn`` with torchao's ``X86InductorQuantizer``,
draws what each one changes in the graph and counts its nodes.

**What you will learn**

- Which edges get an observer, and why one observer can sit on three edges
- How ``convert_pt2e`` turns every observer into q/dq nodes, how close the result stays to the
  float model, and why it is slower than the float model
- What ``fold_quantize`` changes in the converted graph

**Prerequisites**:
:ref:`M00-4 · editing graphs <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`
(inserting and replacing nodes).
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# Setup
# -----
# ``prepare_pt2e`` and ``convert_pt2e`` come from torchao, in
# ``torchao.quantization.pt2e.quantize_pt2e``. ``x86_quantizer()`` is the public
# ``X86InductorQuantizer`` with its default static config, and ``calibrate`` feeds four fixed
# batches of eight images. ``Q`` is the namespace of the q/dq ops.

import copy
from collections import Counter

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw, draw_diff

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
x = example_inputs(8)

# %%
# ``census`` counts a graph's nodes by their role, ``is_observer`` and ``node_named`` find
# nodes.

from common.handmade import is_observer_node as is_observer
from common.pt2e import node_named


def census(gm):
    """Count all nodes, the observers, and each quantize/dequantize op by name."""
    counts = Counter(nodes=len(gm.graph.nodes))
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", "").split(".")[0]
        if is_observer(gm, node):
            counts["observer"] += 1
        elif node.op == "call_function" and name.startswith(("quantize_per", "dequantize_per")):
            counts[name] += 1
    return counts


# %%
# Step 1 — Export the float model
# -------------------------------
# The graph computes exactly what the eager model computes. It is exported with a batch of
# eight images, the size ``calibrate`` feeds later, because ``torch.export`` records the batch
# size as a guard: a batch of four is refused.

exported = export_module(model, x)
with torch.no_grad():
    reference = model(*x)
    assert torch.equal(exported(*x), reference), "same aten ops, same numbers"
    with expect_error(AssertionError, match="Guard failed"):
        exported(*example_inputs(4))
stages = {"exported": census(exported)}
draw(exported, highlight=["batch_norm"], title="Step 1: the exported float graph")

# %%
# Step 2 — prepare_pt2e: fold BatchNorm, insert observers
# -------------------------------------------------------
# ``prepare_pt2e`` edits the graph it is given, so it gets a fresh export and ``exported``
# stays as it was. The picture marks what changed against ``exported``; observers are the
# dashed amber boxes.

given = export_module(model, x)
prepared = prepare_pt2e(given, x86_quantizer())
assert prepared.graph is given.graph, "prepare_pt2e edited the graph it was given"
observers = [node for node in prepared.graph.nodes if is_observer(prepared, node)]
stages["prepared"] = census(prepared)
draw_diff(exported, prepared, title="Step 2: after prepare_pt2e")

# %%
# Two things changed. BatchNorm is gone: the ``batch_norm`` node and the ``get_attr`` nodes of
# its parameters and buffers were removed. Every node that was added is an observer.

before = {node.name for node in exported.graph.nodes}
after = {node.name for node in prepared.graph.nodes}
batch_norm_nodes = {
    node.name
    for node in exported.graph.nodes
    if node.name == "batch_norm" or str(node.target).startswith("bn.")
}
print(f"removed: {sorted(before - after)}")
print(f"added:   {sorted(after - before)}")
assert before - after == batch_norm_nodes, "prepare removed exactly the BatchNorm nodes"
assert after - before == {node.name for node in observers}, "and added only observers"

# %%
# The BatchNorm now lives inside the conv: ``prepare_pt2e`` replaced the conv's weight and bias
# by the folded ones. It calls ``torch.nn.utils.fusion.fuse_conv_bn_weights``, so calling it
# ourselves on the eager model's parameters gives the same tensors bit for bit.

bn = model.bn
weight, bias = fuse_conv_bn_weights(
    model.conv.weight, model.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
)
assert torch.equal(prepared.conv.weight, weight), "the conv weight is the folded weight"
assert torch.equal(prepared.conv.bias, bias), "the conv bias is the folded bias"
assert not torch.equal(prepared.conv.weight, model.conv.weight), "and no longer the original"

# %%
# Each observer sits on one edge, between the node it reads and the one node that reads it.
# Which edges? ``conv2d`` and ``linear`` want their input and their weight quantized.
# ``max_pool2d`` and ``flatten`` only move values around, and the x86 quantizer quantizes
# their input and their output too. That rule predicts the observed edges exactly:

wanted = set()
for node in exported.graph.nodes:
    if node.name in ("conv2d", "linear"):
        wanted |= {(node.args[0].name, node.name), (node.args[1].name, node.name)}
    if node.name in ("max_pool2d", "flatten"):
        wanted |= {(node.args[0].name, node.name)} | {(node.name, u.name) for u in node.users}
observed = set()
for obs in observers:
    (user,) = obs.users
    observed.add((obs.args[0].name, user.name))
    kind = type(prepared.get_submodule(obs.target)).__name__
    print(f"{obs.args[0].name:>12} → {obs.name} → {user.name:<10} {kind}")
assert observed == wanted and len(observers) == len(wanted), "one observer per wanted edge"

# %%
# And nothing else is observed: the biases stay float, ``conv2d → relu`` is one fused pattern
# with no observer inside, and the output of ``linear``, the model's output, stays float.

observed_sources = {source for source, _ in observed}
biases = {node_named(exported, name).args[2].name for name in ("conv2d", "linear")}
print(f"biases: {sorted(biases)}, observed sources: {sorted(observed_sources)}")
assert not observed_sources & biases, "no observer on a bias"
assert "conv2d" not in observed_sources, "no observer between conv2d and relu"
assert "linear" not in observed_sources, "no observer on the model's output"

# %%
# Six observer nodes, but fewer observer modules. ``max_pool2d`` and ``flatten`` cannot produce
# a value their input did not have, so their output shares the input's scale and zero point:
# the three edges from ``relu`` to ``linear`` are watched by one and the same module, listed
# under three names.

modules = {obs.name: prepared.get_submodule(obs.target) for obs in observers}
chain = [
    modules[obs.name] for obs in observers if obs.args[0].name in ("relu", "max_pool2d", "flatten")
]
distinct = {id(module) for module in modules.values()}
print(f"observer nodes: {len(observers)}, distinct observer modules: {len(distinct)}")
assert len(chain) == 3 and chain[0] is chain[1] is chain[2], "one module shared by three edges"
assert len(distinct) == len(observers) - 2, "the shared module accounts for the difference"

# %%
# Step 3 — Calibrate
# ------------------
# Observers pass their input through unchanged, so the prepared model still computes the float
# result. Not bit for bit: the folded conv rounds differently from conv followed by BatchNorm,
# hence a tolerance of 1e-5. Running the prepared model *is* calibration, so this check runs
# on a copy: the observers of ``prepared`` must see only the calibration batches.

with torch.no_grad():
    observed_output = copy.deepcopy(prepared)(*x)
torch.testing.assert_close(
    observed_output,
    reference,
    rtol=0,
    atol=1e-5,
    msg="the prepared model computes the float result within 1e-5",
)
assert not torch.equal(observed_output, reference), "but not bit for bit"
input_observer = modules[next(obs.name for obs in observers if obs.args[0].name == "x")]
print(f"before calibration: min_val={input_observer.min_val}, max_val={input_observer.max_val}")
assert input_observer.min_val == float("inf"), "an observer that saw nothing has min = +inf"

# %%
# ``calibrate`` feeds batches ``example_inputs(8, seed=i)`` for i = 0..3. The observer on the
# input ``x`` now holds the smallest and largest value of those 32 images, exactly.

calibrate(prepared)
seen = torch.cat([example_inputs(8, seed=seed)[0] for seed in range(4)])
low, high = input_observer.min_val, input_observer.max_val
print(f"after calibration:  min_val={low:.6f}, max_val={high:.6f}")
assert torch.equal(input_observer.min_val, seen.min()), "min over all calibration images"
assert torch.equal(input_observer.max_val, seen.max()), "max over all calibration images"

# %%
# Step 4 — convert_pt2e: observers become q/dq nodes
# --------------------------------------------------
# ``convert_pt2e`` also edits the graph it is given; converting a copy keeps ``prepared`` for
# step 7. The picture marks what changed against ``prepared``. Quantize nodes are red,
# dequantize nodes green; per-tensor ones show their scale and zero point.

to_convert = copy.deepcopy(prepared)
converted = convert_pt2e(to_convert)
assert converted.graph is to_convert.graph, "convert_pt2e edited the graph it was given"
stages["converted"] = census(converted)
draw_diff(prepared, converted, title="Step 4: after convert_pt2e")

# %%
# Every observer on an activation became a ``quantize_per_tensor`` → ``dequantize_per_tensor``
# pair. Every observer on a weight became one ``dequantize_per_channel`` that reads an int8
# weight computed ahead of time, plus two ``get_attr`` nodes for the per-channel scales and
# zero points. So the graph grows by one node per activation observer and by two per weight
# observer.

on_weights = sum(obs.args[0].op == "get_attr" for obs in observers)
on_activations = len(observers) - on_weights
counts = stages["converted"]
print(dict(counts))
assert counts["observer"] == 0, "no observer is left"
assert counts["quantize_per_tensor"] == counts["dequantize_per_tensor"] == on_activations, (
    "one quantize_per_tensor and one dequantize_per_tensor per activation observer"
)
assert counts["dequantize_per_channel"] == on_weights and counts["quantize_per_channel"] == 0, (
    "one dequantize_per_channel per weight observer, and no quantize left for the weights"
)
assert counts["nodes"] == stages["prepared"]["nodes"] + on_activations + 2 * on_weights, (
    "one more node per activation observer, two more per weight observer"
)

# %%
# Step 5 — How close is the quantized model?
# ------------------------------------------
# On a batch the observers never saw, the quantized model differs from the float one, by the
# rounding the q/dq pairs add. Two scales for that difference: the relative error
# ``‖got − expected‖ / ‖expected‖`` with its SQNR, ``−20·log10`` of it in decibels (higher is
# better; 40 dB is 1%), and the largest difference in steps of the output's own 8-bit grid,
# its range divided by 255. Every activation and weight is rounded to its own grid, and those
# small errors add up through conv and linear: the bounds asserted are 30 dB and 3 steps.

test = example_inputs(8, seed=100)
with torch.no_grad():
    expected, got = model(*test), converted(*test)
relative = (got - expected).norm() / expected.norm()
sqnr = -20 * torch.log10(relative)
step = (expected.max() - expected.min()) / 255
error = (got - expected).abs().max()
print(f"relative error {relative:.4f}, SQNR {sqnr:.1f} dB")
print(f"output range {expected.min():.4f}..{expected.max():.4f}, one step = {step:.5f}")
print(f"largest difference = {error:.5f} = {error / step:.2f} steps")
assert not torch.equal(got, expected), "quantization does change the numbers"
assert sqnr >= 30, "the SQNR stays above 30 dB"
assert error <= 3 * step, "and no output moves by more than 3 steps of its 8-bit grid"

# %%
# Step 6 — The converted model only simulates int8
# ------------------------------------------------
# Nothing in the converted graph computes in int8. ``conv2d`` and ``linear`` are the same
# float32 aten ops as before; they read the outputs of dequantize nodes, float32 numbers that
# happen to lie on the 8-bit grid.

for name in ("conv2d", "linear"):
    node = node_named(converted, name)
    inputs = [arg.target.__name__.split(".")[0] for arg in node.args[:2]]
    print(f"{node.target.__name__} reads {inputs}, gives {node.meta['val'].dtype}")
    dequantizes = (Q.dequantize_per_tensor.default, Q.dequantize_per_channel.default)
    assert all(arg.target in dequantizes for arg in node.args[:2]), "it reads dequantized values"
    assert node.meta["val"].dtype == torch.float32, "and computes in float32"

# %%
# So the converted model does all the float work plus every quantize and dequantize: it is
# *slower* than the float model, not faster. ``compare_speed`` times the two in 50
# interleaved rounds (batch 8), on one thread where the machine has two cores or fewer, and
# prints the medians with their spread, the threads, the load average and the CPU's int8
# verdict, as measured when this page was built; timings are printed, never asserted. Real
# int8 kernels come from lowering the graph, the subject of
# :ref:`M03-1 · the lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`.

timings = compare_speed({"float model": model, "converted model": converted}, test, rounds=50)
print(timings.table())
slower = timings.ratio("converted model", "float model")
print(f"the converted model takes {slower:.1f}× the float model's time")

# %%
# Step 7 — fold_quantize
# ----------------------
# By default (``fold_quantize=True``) convert runs each weight's ``quantize_per_channel`` once,
# at convert time, and stores the int8 result. With ``fold_quantize=False`` the graph keeps the
# float weight and quantizes it at every call. Same calibrated observers, converted again; the
# picture marks what differs from the default graph of step 4:

unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)
stages["unfolded"] = census(unfolded)
draw_diff(converted, unfolded, title="Step 7: convert_pt2e(..., fold_quantize=False)")

# %%
# The unfolded graph has one ``quantize_per_channel`` per weight, reading the float weight; the
# folded one reads an int8 constant instead, a quarter of the bytes. The folded constant is
# exactly what that node computes, so both graphs give the same output bit for bit.

conv_dq = node_named(converted, "conv2d").args[1]
folded_weight = getattr(converted, conv_dq.args[0].target)
print(f"fold_quantize=False: {unfolded.conv.weight.dtype}, {unfolded.conv.weight.nbytes} bytes")
print(f"fold_quantize=True:  {folded_weight.dtype}, {folded_weight.nbytes} bytes")
assert stages["unfolded"]["quantize_per_channel"] == on_weights, "one quantize per weight"
assert stages["unfolded"]["nodes"] == stages["converted"]["nodes"] + on_weights, (
    "one node more per weight"
)
assert folded_weight.dtype == torch.int8, "the folded weight is int8"
assert folded_weight.nbytes * 4 == unfolded.conv.weight.nbytes, "a quarter of the bytes"
with torch.no_grad():
    assert torch.equal(unfolded(*test), got), "folding changes where, not what"

# %%
# Summary
# -------
# The node counts at every stage, as counted by ``census``:

columns = {
    "nodes": "nodes",
    "observer": "obs",
    "quantize_per_tensor": "q",
    "dequantize_per_tensor": "dq",
    "quantize_per_channel": "q/ch",
    "dequantize_per_channel": "dq/ch",
}
print(f"{'stage':<10}" + "".join(f"{label:>7}" for label in columns.values()))
for stage, counts in stages.items():
    print(f"{stage:<10}" + "".join(f"{counts[key]:>7}" for key in columns))

# %%
# PT2E is export → ``prepare_pt2e`` (BatchNorm folded, one observer per quantized edge) →
# calibration (observers record statistics) → ``convert_pt2e`` (observers become q/dq nodes,
# weights become int8 constants). The converted model is a float32 simulation of int8: close
# to the float model (about 40 dB here) and slower than it, until it is lowered (M03).
#
# Exercises
# ---------
# 1. Run the same flow on ``conv_bn_relu`` (conv → BatchNorm → relu, nothing after). Predict,
#    with the rules of steps 2 and 4, which edges get an observer and how many nodes
#    ``convert_pt2e`` adds.
#
#    .. dropdown:: Solution
#
#       Only ``conv2d`` asks for quantized inputs: its input ``x`` and its weight. The relu's
#       output is the model's output and stays float. One activation observer adds one node,
#       one weight observer two.
#
#       .. code-block:: python
#
#          small = get_model("conv_bn_relu")
#          small_prepared = prepare_pt2e(export_module(small, x), x86_quantizer())
#          small_observers = [
#              n for n in small_prepared.graph.nodes if is_observer(small_prepared, n)
#          ]
#          edges = {(n.args[0].name, next(iter(n.users)).name) for n in small_observers}
#          print(sorted(edges))
#          assert edges == {("x", "conv2d"), ("conv_weight", "conv2d")}, "input and weight only"
#          calibrate(small_prepared)
#          nodes_before = len(small_prepared.graph.nodes)
#          small_converted = convert_pt2e(small_prepared)
#          assert len(small_converted.graph.nodes) == nodes_before + 1 + 2, "one + two nodes"
#
# 2. Calibrate a fresh prepared ``small_cnn`` with one batch instead of four
#    (``calibrate(..., batches=1)``). Predict the input observer's ``min_val`` and ``max_val``.
#
#    .. dropdown:: Solution
#
#       The smallest and largest value of that one batch, ``example_inputs(8, seed=0)``: a
#       MinMax-style record of exactly what the observer saw, and no wider than with four.
#
#       .. code-block:: python
#
#          once = prepare_pt2e(export_module(model, x), x86_quantizer())
#          calibrate(once, batches=1)
#          observer = next(
#              once.get_submodule(n.target)
#              for n in once.graph.nodes
#              if is_observer(once, n) and n.args[0].name == "x"
#          )
#          batch = example_inputs(8, seed=0)[0]
#          print(f"{observer.min_val:.6f}..{observer.max_val:.6f}")
#          assert torch.equal(observer.min_val, batch.min()), "the one batch's minimum"
#          assert torch.equal(observer.max_val, batch.max()), "the one batch's maximum"
#          assert observer.min_val >= input_observer.min_val, "no wider than with four batches"
#
# Further reading
# ---------------
# - `PT2E quantization overview (torchao) <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `PyTorch 2 Export post-training quantization (torchao) <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_ptq.html>`_
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_
# - :ref:`Troubleshooting: imports and export
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# The next lesson reads the numbers inside those q/dq nodes and recomputes them by hand:
# :ref:`M01-2 · q/dq nodes and their numbers
# <sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`.
