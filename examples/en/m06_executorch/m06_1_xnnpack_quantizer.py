"""
M06-1 The XNNPACK quantizer
===========================

PT2E was built first for ExecuTorch, and the quantizer most PT2E examples use is ExecuTorch's
``XNNPACKQuantizer``, not the x86 one this course has used so far. Both write annotations on
the same exported graph, but for different kernels: XNNPACK runs whole int8 operators on
phones, so it quantizes outputs as well as inputs, uses signed int8 activations and shares
one scale through pools and reshapes; x86 Inductor fuses on the CPU and leaves more in float.
This lesson annotates one model with both and reads the difference off the graph, then checks
that the course's own ``handmade.prepare/convert`` gives ``XNNPACKQuantizer``'s result bit
for bit.

**What you will learn**

- Which nodes each quantizer annotates, and with which dtype, range and scheme
- Where XNNPACK shares one scale between an op's input and output, and what its dynamic
  configuration quantizes
- That nothing in prepare/convert is specific to a backend: the handmade passes give the
  same bits

**Prerequisites**:
:ref:`M02-1 · What a quantizer writes
<sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`,
:ref:`M02-4 · Writing a quantizer for a new backend
<sphx_glr_lessons_m02_by_hand_m02_4_writing_a_quantizer.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# A small block with what a mobile CNN has: conv + relu, a max pool, a residual ``add``
# followed by relu, a global average pool, a flatten and a linear classifier.
# ``XNNPACKQuantizer`` and ``get_symmetric_quantization_config`` come from the ``executorch``
# package (``pip install executorch``), not from torchao.

import warnings

import torch
from torch import nn

from common.models import example_inputs
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
# X86InductorQuantizer warns when it skips a max pool whose input it left in float (Step 1).
warnings.filterwarnings("ignore", message="The input of maxpool2d is not quantized")

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.stem(x)))
        x = torch.relu(self.conv(x) + x)
        return self.fc(torch.flatten(self.gap(x), 1))


torch.manual_seed(0)
model = Block().eval()
x = example_inputs(4)
qd = torch.ops.quantized_decomposed


def xnnpack_quantizer(**options):
    """XNNPACKQuantizer with per-channel weights, as ExecuTorch's examples use it."""
    config = get_symmetric_quantization_config(is_per_channel=True, **options)
    return XNNPACKQuantizer().set_global(config)


# %%
# ``annotated`` exports the block, lets a quantizer annotate it (after its
# ``transform_for_annotation``, as ``prepare_pt2e`` does) and returns the graph;
# ``describe_spec`` writes a spec as ``int8[-128, 127] affine``.


def annotated(quantizer):
    gm = quantizer.transform_for_annotation(export_module(model, x))
    quantizer.annotate(gm)
    return gm


def describe_spec(spec) -> str:
    if spec is None:
        return "float"
    if not hasattr(spec, "dtype"):  # a SharedQuantizationSpec: no numbers of its own
        return "shared"
    scheme = {"per_tensor_affine": "affine", "per_tensor_symmetric": "symmetric"}.get(
        str(spec.qscheme).removeprefix("torch."), "symmetric/channel"
    )
    return f"{str(spec.dtype).removeprefix('torch.')}[{spec.quant_min},{spec.quant_max}] {scheme}"


def annotations(gm) -> dict:
    """op name -> (its input specs, by input name; its output spec), for annotated ops."""
    found = {}
    for node in gm.graph.nodes:
        note = node.meta.get("quantization_annotation")
        if node.op == "call_function" and note is not None:
            inputs = {source.name: spec for source, spec in note.input_qspec_map.items()}
            found[node.name] = (inputs, note.output_qspec)
    return found


# %%
# Step 1 — Annotate the same graph twice
# --------------------------------------
# One row per operator of the graph: what each quantizer wrote on its inputs (the activation
# input first, then the weight) and on its output.

x86 = annotations(annotated(x86_quantizer()))
xnn = annotations(annotated(xnnpack_quantizer()))
ops = [n.name for n in export_module(model, x).graph.nodes if n.name in x86.keys() | xnn.keys()]


def row(notes, name) -> str:
    if name not in notes:
        return "(not annotated)"
    inputs, output = notes[name]
    ins = " + ".join(describe_spec(spec) for spec in inputs.values() if spec is not None)
    ins = ins or "float"  # an op whose output alone is annotated, like relu after a conv
    return f"in {ins} -> out {describe_spec(output)}"


for name in ops:
    print(f"{name:20} x86      {row(x86, name)}\n{'':20} XNNPACK  {row(xnn, name)}")

# %%
# Three differences stand out. XNNPACK annotates **outputs**: a conv + relu pair ends in an
# int8 tensor, because XNNPACK runs the fused op in integers end to end, while the x86
# quantizer quantizes only what the next int8 kernel reads. XNNPACK's **activations are
# signed**, int8 in [-128, 127], where x86 uses uint8 in [0, 255] (its oneDNN kernels multiply
# uint8 by int8); both are affine, with a zero point. And XNNPACK's **weights** use
# [-127, 127]: the same range on both sides of 0, so -128 never appears and negating a weight
# never overflows int8.

_, relu_out = xnn["relu"]
assert describe_spec(relu_out) == "int8[-128,127] affine", "XNNPACK: int8 outputs"
assert x86["conv2d"][1] is None and "relu" not in x86, "x86: the conv + relu output is float"
stem_input, stem_weight = list(x86["conv2d"][0].values())[:2]
assert describe_spec(stem_input) == "uint8[0,255] affine", "x86: uint8 activations"
assert describe_spec(stem_weight) == "int8[-128,127] symmetric/channel", "x86 weights"
assert describe_spec(list(xnn["conv2d"][0].values())[1]) == "int8[-127,127] symmetric/channel"

# %%
# Step 2 — Shared specs: one scale through pools and reshapes
# -----------------------------------------------------------
# A max pool, an average pool or a flatten does not change the range of its input. XNNPACK
# gives them a ``SharedQuantizationSpec``: input and output share the observer of the node
# before, so no requantization happens between them (``propagate_annotation`` in
# ``xnnpack_quantizer_utils.py`` does it for a list of such ops).

shared = [name for name, (_, output) in xnn.items() if describe_spec(output) == "shared"]
print(f"XNNPACK shares its input's scale at: {shared}")
assert shared == ["max_pool2d", "adaptive_avg_pool2d", "flatten"], "pools and the flatten"

# %%
# Step 3 — Convert both and compare the graphs
# --------------------------------------------
# After calibration on the same batches, convert turns every annotated edge into q/dq. The
# XNNPACK graph has a q/dq pair after nearly every op, and its output is int8 too; the x86
# graph quantizes only the inputs of its convs, the add and the linear.


def converted(quantizer):
    prepared = prepare_pt2e(export_module(model, x), quantizer)
    calibrate(prepared)
    return convert_pt2e(prepared)


def quantize_nodes(gm) -> list:
    return [
        n.name
        for n in gm.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)
    ]


x86_model, xnn_model = converted(x86_quantizer()), converted(xnnpack_quantizer())
draw(x86_model, highlight=quantize_nodes(x86_model), title="X86InductorQuantizer, converted")
draw(xnn_model, highlight=quantize_nodes(xnn_model), title="XNNPACKQuantizer, converted")
counts = {"x86": len(quantize_nodes(x86_model)), "XNNPACK": len(quantize_nodes(xnn_model))}
print(f"quantize nodes: {counts}")
assert counts["XNNPACK"] > counts["x86"], "XNNPACK quantizes more edges"

# %%
# In the XNNPACK graph the zero points tell the dtype story: relu's output is never negative,
# so its int8 range starts at -128 with zero point -128; the per-channel weight zero points
# are all 0 (symmetric).

relu = xnn_model.graph.find_nodes(op="call_function", target=torch.ops.aten.relu.default)[0]
relu_q = next(iter(relu.users))
print("relu output: scale", relu_q.args[1], "zero point", relu_q.args[2])
assert relu_q.args[2] == -128, "an all-positive tensor uses the whole int8 range"
zero_points = [b for name, b in xnn_model.named_buffers() if name.startswith("_zero_point")]
assert all(torch.count_nonzero(z) == 0 for z in zero_points), "symmetric weights: zero point 0"

# %%
# Step 4 — The dynamic configuration
# ----------------------------------
# ``is_dynamic=True`` quantizes activations at run time: a ``choose_qparams`` node measures
# each input batch, so the activations need no calibration. XNNPACK applies it to linears and
# to convs that are not fused with a relu (a conv + relu pattern has no dynamic variant);
# everything else stays float.

dynamic = converted(xnnpack_quantizer(is_dynamic=True))
quantized_ops = sorted(
    user.name
    for n in dynamic.graph.find_nodes(op="call_function", target=qd.dequantize_per_tensor.tensor)
    for user in n.users
)
print(f"dynamically quantized inputs of: {quantized_ops}")
assert quantized_ops == ["conv2d_1", "linear"], "the linear and the conv without relu"
assert not dynamic.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)

# %%
# The weights still need the prepared model to run. Each keeps an observer, which sees its
# weight only when the model runs (``converted`` runs it on four batches). Converted without a
# single run, every weight scale is the observer's default, 1.0 (``convert_pt2e`` warns "must
# run observer before calling calculate_qparams"), and the output drifts far from the float
# model. Step 3 of M05-2 measures what that costs in accuracy.

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="must run observer before calling calculate_qparams")
    never_run = convert_pt2e(
        prepare_pt2e(export_module(model, x), xnnpack_quantizer(is_dynamic=True))
    )
weight_scales = [
    getattr(never_run, n.args[1].target)
    for n in never_run.graph.find_nodes(
        op="call_function", target=qd.dequantize_per_channel.default
    )
]
errors = {
    name: (gm(*x) - model(*x)).abs().max().item()
    for name, gm in [("never run", never_run), ("calibrated", dynamic)]
}
print(f"weight scales, never run: {[s.tolist() for s in weight_scales]}")
print(f"largest output error: never run {errors['never run']:.4f}, run {errors['calibrated']:.4f}")
assert all(torch.equal(s, torch.ones(1)) for s in weight_scales), "every weight scale is 1.0"
assert errors["never run"] > 50 * errors["calibrated"], "over fifty times the error"

# %%
# X86's dynamic configuration, for comparison, quantizes more: the inputs of both convs, of
# the add and of the linear. Only its *lowering* is linear-only (M05-2).

x86_config = get_default_x86_inductor_quantization_config(is_dynamic=True)
x86_dynamic = converted(X86InductorQuantizer().set_global(x86_config))
x86_ops = sorted(
    user.name
    for n in x86_dynamic.graph.find_nodes(
        op="call_function", target=qd.dequantize_per_tensor.tensor
    )
    for user in n.users
)
print(f"x86, dynamically quantized inputs of: {x86_ops}")
assert x86_ops == ["add", "conv2d", "conv2d_1", "linear"], "convs, the add and the linear"

# %%
# Step 5 — handmade, bit for bit
# ------------------------------
# The course's ``handmade.prepare`` and ``handmade.convert`` (M02) know nothing about XNNPACK:
# they read the annotations. Given ``XNNPACKQuantizer``, they produce the same code and the
# same outputs as torchao, exactly (``tests/test_handmade.py`` checks it on every model of the
# course, exported strictly and not).

ours = handmade.prepare(export_module(model, x), xnnpack_quantizer())
calibrate(ours)
ours = handmade.convert(ours)
assert ours.code == xnn_model.code, "the same converted graph"
assert torch.equal(ours(*x), xnn_model(*x)), "bit-identical outputs"
print(f"handmade == torchao under XNNPACKQuantizer: {torch.equal(ours(*x), xnn_model(*x))}")

# %%
# Summary
# -------
#
# ==================  =====================  =======================
# \                   X86InductorQuantizer   XNNPACKQuantizer
# ==================  =====================  =======================
# activations         uint8 [0, 255] affine  int8 [-128, 127] affine
# weights             int8 [-128, 127]       int8 [-127, 127]
# weight scales       per channel            per channel if asked
# conv/linear output  float                  int8
# pools, flatten      float here             share their input's
# dynamic             convs, linears, add    linears, convs w/o relu
#                     (lowered: linears)
# ==================  =====================  =======================
#
# - A quantizer describes its backend's kernels; the annotations differ, the passes do not.
# - The same ``handmade`` passes reproduce torchao under both.
#
# Exercises
# ---------
# 1. Call ``get_symmetric_quantization_config()`` without ``is_per_channel=True``. Predict
#    the weights' scheme and whether the converted graph still has ``dequantize_per_channel``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          per_tensor = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
#          weight = list(annotations(annotated(per_tensor))["conv2d"][0].values())[1]
#          assert describe_spec(weight) == "int8[-127,127] symmetric"
#          gm = converted(per_tensor)
#          assert not gm.graph.find_nodes(
#              op="call_function", target=qd.dequantize_per_channel.default
#          ), "one scale per weight tensor"
#
# 2. Keep the static configuration for the model and make only the linear dynamic, with
#    ``set_operator_type(torch.ops.aten.linear.default, ...)``. How many ``choose_qparams``
#    nodes, and is the conv + relu still static?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from collections import Counter
#
#          mixed = xnnpack_quantizer().set_operator_type(
#              torch.ops.aten.linear.default,
#              get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True),
#          )
#          gm = converted(mixed)
#          kinds = Counter(str(n.target) for n in gm.graph.nodes)
#          assert kinds["quantized_decomposed.choose_qparams.tensor"] == 1, "the linear's"
#          assert kinds["quantized_decomposed.quantize_per_tensor.default"] > 0, "the rest"
#
# Further reading
# ---------------
# - `Quantization overview (ExecuTorch)
#   <https://docs.pytorch.org/executorch/stable/quantization-overview.html>`_
# - `XNNPACK quantizer source
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/quantizer>`_
#
# Next
# ----
# :ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`: the converted graph
# becomes XNNPACK delegates.
