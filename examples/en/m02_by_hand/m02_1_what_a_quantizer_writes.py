"""
M02-1 What a quantizer writes
=============================

A PT2E quantizer does not change the graph: it only writes a note on some nodes,
``node.meta["quantization_annotation"]``, saying which inputs and which output should be
quantized and how. Everything ``prepare_pt2e`` does afterwards follows from those notes. This
lesson reads the notes that the course's own quantizer (``common.quantizer.CourseQuantizer``,
about 100 lines) writes on ``small_cnn``, compares them with ``X86InductorQuantizer``'s, and
shows that torchao's real ``prepare_pt2e``/``convert_pt2e`` accept the course quantizer unchanged.

**What you will learn**

- The three fields of an annotation: ``input_qspec_map``, ``output_qspec``, ``_annotated``
- What a ``QuantizationSpec`` says, and what a ``SharedQuantizationSpec`` points to
- How two quantizers can annotate the same graph differently

**Prerequisites**: M01-1 (the PT2E flow), M00-3 (finding patterns).
"""

# %%
# Setup
# -----
# ``prepare_pt2e`` folds BatchNorm into the conv *before* it calls the quantizer, so we do the
# same with ``handmade.fold_batch_norm`` (M02-2 explains it). ``notes`` lists the annotated
# nodes of a graph.

import torch

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    QuantizationSpec,
    SharedQuantizationSpec,
)

from common import handmade  # noqa: E402
from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer  # noqa: E402


def notes(gm):
    """Node name -> its quantization annotation, for the annotated nodes only."""
    return {
        node.name: node.meta["quantization_annotation"]
        for node in gm.graph.nodes
        if "quantization_annotation" in node.meta
    }


x = example_inputs(8)
gm = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm)
code_before = gm.code

# %%
# Step 1 — Let the quantizer annotate
# -----------------------------------
# ``annotate`` walks the graph and writes notes. The graph's code does not change at all:
# no node is added, none is rewired.

quantizer = CourseQuantizer()
quantizer.annotate(gm)
ours = notes(gm)
print("annotated nodes:", list(ours))
assert gm.code == code_before, "annotate only writes node.meta"
assert list(ours) == ["conv2d", "relu", "max_pool2d", "flatten", "linear"]
draw(gm, highlight=list(ours), title="Step 1: the nodes CourseQuantizer annotated")

# %%
# Step 2 — Read one annotation
# ----------------------------
# ``input_qspec_map`` maps an *input node* to a spec: the edge from that node into this one
# gets quantized. The conv wants its input ``x`` and its weight quantized, not its bias.
# Its ``output_qspec`` is ``None``: the conv's only user is a relu, so the course quantizer
# quantizes after the relu instead (a backend runs conv+relu as one fused op).

conv = ours["conv2d"]
names = {id(ACTIVATION_SPEC): "ACTIVATION_SPEC", id(WEIGHT_SPEC): "WEIGHT_SPEC"}
print({source.name: names[id(spec)] for source, spec in conv.input_qspec_map.items()})
print("output_qspec:", conv.output_qspec, "   _annotated:", conv._annotated)
assert [n.name for n in conv.input_qspec_map] == ["x", "conv_weight"], "bias stays float"
assert conv.input_qspec_map[next(iter(conv.input_qspec_map))] is ACTIVATION_SPEC
assert conv.output_qspec is None and ours["relu"].output_qspec is ACTIVATION_SPEC
assert conv._annotated, "_annotated tells other quantizers: hands off this node"

# %%
# Step 3 — What a QuantizationSpec says
# -------------------------------------
# A spec names the integer type and its range, the scheme, and the observer class that will
# measure the tensor. The weight is per channel along axis 0 (one scale per output channel)
# and symmetric: its zero point will be 0, and [-127, 127] keeps the range symmetric.

for name, spec in [("activation", ACTIVATION_SPEC), ("weight", WEIGHT_SPEC)]:
    print(
        f"{name:10}  dtype={spec.dtype}  range=[{spec.quant_min}, {spec.quant_max}]  "
        f"qscheme={spec.qscheme}  ch_axis={spec.ch_axis}  "
        f"observer={spec.observer_or_fake_quant_ctr.__name__}"
    )
assert WEIGHT_SPEC.qscheme == torch.per_channel_symmetric and WEIGHT_SPEC.ch_axis == 0
assert -WEIGHT_SPEC.quant_min == WEIGHT_SPEC.quant_max == 127
assert ACTIVATION_SPEC.qscheme == torch.per_tensor_affine
assert isinstance(ACTIVATION_SPEC, QuantizationSpec) and isinstance(WEIGHT_SPEC, QuantizationSpec)

# %%
# Step 4 — SharedQuantizationSpec: "use the same numbers as over there"
# ---------------------------------------------------------------------
# Max pooling only picks values, so its output can keep its input's scale and zero point.
# Its ``output_qspec`` is not a spec of its own but a pointer to the edge
# ``relu → max_pool2d``. Flatten does the same, pointing to ``max_pool2d → flatten``.

for name in ["max_pool2d", "flatten"]:
    shared = ours[name].output_qspec
    source, user = shared.edge_or_node
    print(f"{name}.output_qspec = SharedQuantizationSpec(({source.name}, {user.name}))")
    assert isinstance(shared, SharedQuantizationSpec) and user.name == name
assert ours["max_pool2d"].output_qspec.edge_or_node[0].name == "relu"

# %%
# Step 5 — Another quantizer, other notes
# ---------------------------------------
# ``X86InductorQuantizer`` annotates the same nodes on a fresh copy of the graph, with other
# choices: unsigned activations in [0, 255], an explicit ``None`` for the bias, no output spec
# on the relu (only because the pool's input edge wants it quantized), and a float output for
# the final linear.


def summary(annotation):
    inputs = {n.name: getattr(s, "dtype", None) for n, s in annotation.input_qspec_map.items()}
    output = annotation.output_qspec
    kind = type(output).__name__.replace("QuantizationSpec", "") if output else "-"
    return f"inputs={inputs}  output={kind or 'Spec'}"


gm_x86 = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm_x86)
theirs = notes(x86_quantizer().annotate(gm_x86))
for name in ours:
    print(f"{name:10}  course: {summary(ours[name])}\n{'':10}  x86:    {summary(theirs[name])}")
assert list(theirs) == list(ours), "the same nodes are annotated"
assert theirs["conv2d"].input_qspec_map[gm_x86.graph.find_nodes(op="placeholder")[0]].dtype == (
    torch.uint8
)
assert theirs["relu"].output_qspec is None and theirs["linear"].output_qspec is None
assert isinstance(theirs["max_pool2d"].output_qspec, SharedQuantizationSpec)

# %%
# Step 6 — torchao's prepare and convert accept the course quantizer
# ------------------------------------------------------------------
# A quantizer is just annotations, so torchao's passes work with ours unchanged. The quantized
# model stays close to the float one: the largest difference is a few hundredths, against
# outputs of size about one.

model = get_model("small_cnn")
prepared = prepare_pt2e(export_module(model, x), CourseQuantizer())
calibrate(prepared)
quantized = convert_pt2e(prepared)
with torch.no_grad():
    error = (quantized(*x) - model(*x)).abs().max().item()
    size = model(*x).abs().max().item()
print(f"max |quantized - float| = {error:.4f}   (max |float| = {size:.2f})")
assert error < 0.05 * size, "int8 keeps the outputs within 5% of their range"
qdq = [n.name for n in quantized.graph.nodes if "quantize_per" in str(n.target)]
draw(quantized, highlight=qdq, title="Step 6: torchao's convert_pt2e with CourseQuantizer")

# %%
# Summary
# -------
# A quantizer writes one ``QuantizationAnnotation`` per node it cares about: specs for input
# edges, a spec for the output, or a ``SharedQuantizationSpec`` that borrows another edge's
# numbers. Nothing else. In :ref:`sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py` we turn
# these notes into observers ourselves, and check that we get exactly ``prepare_pt2e``'s graph.
