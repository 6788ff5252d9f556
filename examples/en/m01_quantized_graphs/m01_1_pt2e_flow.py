"""
M01-1 The PT2E flow end to end
==============================

Quantizing a model with PT2E takes four calls: ``torch.export`` captures the graph,
``prepare_pt2e`` removes BatchNorm (BatchNorm folding) and inserts an observer on every edge
the quantizer wants quantized, a few calibration batches let the observers record statistics, and
``convert_pt2e`` replaces each observer with a quantize/dequantize pair whose scale and zero
point come from those statistics. This lesson runs the four calls on ``small_cnn`` with
torchao's ``X86InductorQuantizer``, draws the graph after each one and counts its nodes.

**What you will learn**

- Which edges get an observer, and why one observer can sit on three edges
- How ``convert_pt2e`` turns every observer into q/dq nodes, and how close the result stays
  to the float model
- What ``fold_quantize`` changes in the converted graph

**Prerequisites**: M00-4 (inserting and replacing nodes).
"""

# %%
# Setup
# -----
# PT2E lives in torchao: ``prepare_pt2e`` and ``convert_pt2e`` come from
# ``torchao.quantization.pt2e.quantize_pt2e``. ``x86_quantizer()`` is the public
# ``X86InductorQuantizer`` with its default static config, and ``calibrate`` feeds four fixed
# batches of eight images. ``census`` counts a graph's nodes by their role.

import copy
from collections import Counter

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.observer import ObserverBase  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402


def is_observer(gm, node):
    """True for a call_module node whose module is an observer."""
    return node.op == "call_module" and isinstance(gm.get_submodule(node.target), ObserverBase)


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
# The graph is exported with a batch of eight images, the size ``calibrate`` feeds later:
# ``torch.export`` records the batch size as a guard. The exported graph computes exactly
# what the eager model computes.

model = get_model("small_cnn")
x = example_inputs(8)
exported = export_module(model, x)
with torch.no_grad():
    reference = model(*x)
    assert torch.equal(exported(*x), reference), "same aten ops, same numbers"
stages = {"exported": census(exported)}
draw(exported, highlight=["batch_norm"], title="Step 1: the exported float graph")

# %%
# Step 2 — prepare_pt2e: fold BatchNorm, insert observers
# -------------------------------------------------------
# ``prepare_pt2e`` edits the graph it is given, so it gets a fresh export and ``exported``
# stays as it was. The observers are drawn as dashed amber boxes.

prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
observers = [node for node in prepared.graph.nodes if is_observer(prepared, node)]
stages["prepared"] = census(prepared)
draw(prepared, highlight=[node.name for node in observers], title="Step 2: after prepare_pt2e")

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
# Which edges? ``conv2d`` and ``linear`` want their input and their weight quantized (the bias
# stays float). ``max_pool2d`` and ``flatten`` only move values around, so the x86 quantizer
# quantizes their input and their output too. Nothing else: the output of ``linear``, the
# model's output, stays float, and ``conv2d → relu`` is one fused pattern with no observer
# inside. Applying that rule to the exported graph predicts the observed edges exactly.

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
    torch.testing.assert_close(copy.deepcopy(prepared)(*x), reference, rtol=0, atol=1e-5)
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
# ``convert_pt2e`` also edits its input in place; converting a copy keeps ``prepared`` for
# step 6. Quantize nodes are red, dequantize nodes green; per-tensor ones show their scale and
# zero point.

converted = convert_pt2e(copy.deepcopy(prepared))
qdq = [
    node.name for node in converted.graph.nodes if node.name.startswith(("quantize", "dequantize"))
]
stages["converted"] = census(converted)
draw(converted, highlight=qdq, title="Step 4: after convert_pt2e")

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
assert counts["quantize_per_tensor"] == counts["dequantize_per_tensor"] == on_activations
assert counts["dequantize_per_channel"] == on_weights and counts["quantize_per_channel"] == 0
assert counts["nodes"] == stages["prepared"]["nodes"] + on_activations + 2 * on_weights

# %%
# Step 5 — How close is the quantized model?
# ------------------------------------------
# On a batch the observers never saw, the quantized model differs from the float one, but only
# by the rounding the q/dq pairs add. Measure it in steps of the output's own 8-bit grid, its
# range divided by 255: every activation and weight is rounded to its own grid (and clipped to
# its range), and those small errors add up through conv and linear, so a few output steps are
# expected. The bound asserted is 3 steps.

test = example_inputs(8, seed=100)
with torch.no_grad():
    expected, got = model(*test), converted(*test)
step = (expected.max() - expected.min()) / 255
error = (got - expected).abs().max()
print(f"output range {expected.min():.4f}..{expected.max():.4f}, one step = {step:.5f}")
print(f"largest difference = {error:.5f} = {error / step:.2f} steps")
assert not torch.equal(got, expected), "quantization does change the numbers"
assert error <= 3 * step, "but by no more than 3 steps of the output's 8-bit grid"

# %%
# Step 6 — fold_quantize
# ----------------------
# By default (``fold_quantize=True``) convert runs each weight's ``quantize_per_channel`` once,
# at convert time, and stores the int8 result. With ``fold_quantize=False`` the graph keeps the
# float weight and quantizes it at every call. Same calibrated observers, converted again:

unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)
stages["unfolded"] = census(unfolded)
weight_q = [n.name for n in unfolded.graph.nodes if n.name.startswith("quantize_per_channel")]
draw(unfolded, highlight=weight_q, title="Step 6: convert_pt2e(..., fold_quantize=False)")

# %%
# The unfolded graph has one ``quantize_per_channel`` per weight, reading the float weight; the
# folded one reads an int8 constant instead, a quarter of the bytes. The folded constant is
# exactly what that node computes, so both graphs give the same output bit for bit.

conv_dq = next(node for node in converted.graph.nodes if node.name == "conv2d").args[1]
folded_weight = getattr(converted, conv_dq.args[0].target)
print(f"fold_quantize=False: {unfolded.conv.weight.dtype}, {unfolded.conv.weight.nbytes} bytes")
print(f"fold_quantize=True:  {folded_weight.dtype}, {folded_weight.nbytes} bytes")
assert stages["unfolded"]["quantize_per_channel"] == on_weights
assert stages["unfolded"]["nodes"] == stages["converted"]["nodes"] + on_weights
assert folded_weight.dtype == torch.int8 and folded_weight.nbytes * 4 == unfolded.conv.weight.nbytes
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
# weights become int8 constants). The next lesson reads the numbers inside those q/dq nodes and
# recomputes them by hand: :ref:`sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py`.
