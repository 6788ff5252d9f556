"""
M02-1 What a quantizer writes
=============================

A PT2E quantizer's ``annotate`` does not change the graph: it only writes a note on some
nodes, ``node.meta["quantization_annotation"]``, saying which inputs and which output should
be quantized and how. Everything ``prepare_pt2e`` does afterwards follows from those notes.
This lesson reads the notes that the course's own quantizer
(``common.quantizer.CourseQuantizer``) writes on ``small_cnn``, compares them with
``X86InductorQuantizer``'s, and shows that torchao's real ``prepare_pt2e``/``convert_pt2e``
accept the course quantizer unchanged.

**What you will learn**

- The four fields of an annotation: ``input_qspec_map``, ``output_qspec``,
  ``allow_implicit_sharing``, ``_annotated``
- What a ``QuantizationSpec`` says, and what a ``SharedQuantizationSpec`` points to
- In which order ``prepare_pt2e`` calls a quantizer, and which call may change the graph

**Prerequisites**:
:ref:`M01-1 · the PT2E flow <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`,
:ref:`M00-3 · finding patterns <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``prepare_pt2e`` folds BatchNorm into the conv *before* it calls the quantizer (step 2 shows
# it), so we do the same with ``handmade.fold_batch_norm`` (M02-2 explains it).

import dataclasses

import torch

from common.charts import pad
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    SharedQuantizationSpec,
)

from common import handmade
from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer

aten = torch.ops.aten
x = example_inputs(8)
gm = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm)
code_before = gm.code

# %%
# Helpers: ``notes`` lists the annotated nodes of a graph, ``summary`` shortens an annotation
# to one line, ``observer_calls`` lists the observer nodes of a prepared graph, and two small
# quantizers built on the course's record what ``prepare_pt2e`` calls and switch off implicit
# sharing on the max pool.


def notes(gm):
    """Node name -> its quantization annotation, for the annotated nodes only."""
    return {
        node.name: node.meta["quantization_annotation"]
        for node in gm.graph.nodes
        if "quantization_annotation" in node.meta
    }


def summary(annotation):
    inputs = {n.name: getattr(s, "dtype", None) for n, s in annotation.input_qspec_map.items()}
    output = annotation.output_qspec
    kind = type(output).__name__.replace("QuantizationSpec", "") if output else "-"
    return f"inputs={inputs}  output={kind or 'Spec'}"


def observer_calls(prepared):
    return [n for n in prepared.graph.nodes if handmade.is_observer_node(prepared, n)]


class RecordingQuantizer(CourseQuantizer):
    """The course quantizer, noting each call prepare_pt2e makes and whether BatchNorm is left."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def _note(self, name, model):
        batch_norm = model.graph.find_nodes(op="call_function", target=aten.batch_norm.default)
        self.calls.append((name, "batch_norm" if batch_norm else "no batch_norm"))

    def transform_for_annotation(self, model):
        self._note("transform_for_annotation", model)
        return super().transform_for_annotation(model)

    def annotate(self, model):
        self._note("annotate", model)
        return super().annotate(model)

    def validate(self, model):
        self._note("validate", model)
        return super().validate(model)


class NoImplicitSharingAtPool(CourseQuantizer):
    """The course quantizer, with allow_implicit_sharing=False on the max pool's annotation."""

    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.max_pool2d.default):
            node.meta["quantization_annotation"].allow_implicit_sharing = False
        return model


# %%
# Step 1 — Let the quantizer annotate
# -----------------------------------
# ``annotate`` walks the graph and writes notes. The graph's code does not change at all:
# no node is added, none is rewired.

quantizer = CourseQuantizer()
quantizer.annotate(gm)
ours = notes(gm)
print(f"annotated nodes: {list(ours)}")
assert gm.code == code_before, "annotate only writes node.meta; the code stays the same"
assert list(ours) == ["conv2d", "relu", "max_pool2d", "flatten", "linear"], (
    "five nodes carry a note"
)
draw(gm, highlight=list(ours), title="Step 1: the nodes CourseQuantizer annotated")

# %%
# Step 2 — What prepare_pt2e calls, in which order
# ------------------------------------------------
# ``prepare_pt2e`` folds BatchNorm, then calls three methods of the quantizer:
# ``transform_for_annotation``, ``annotate``, ``validate``. The first one *may* rewrite the
# graph (decompose an op the backend cannot quantize, say) and returns the model to annotate;
# only ``annotate`` is meant to leave the graph alone (it writes ``node.meta``). The course
# quantizer and ``X86InductorQuantizer`` keep the default, which returns the graph unchanged
# (M02-4 writes one that does not).

recorder = RecordingQuantizer()
prepare_pt2e(export_module(get_model("small_cnn"), x), recorder)
for call in recorder.calls:
    print(call)
assert [name for name, _ in recorder.calls] == [
    "transform_for_annotation",
    "annotate",
    "validate",
], "transform, annotate, validate, in this order"
assert recorder.calls[0][1] == "no batch_norm", "BatchNorm is folded before the quantizer runs"
plain = export_module(get_model("small_cnn"), x)
code = plain.code
for default in [CourseQuantizer(), x86_quantizer()]:
    assert default.transform_for_annotation(plain).code == code, "the default: no change"

# %%
# Step 3 — Read one annotation
# ----------------------------
# A ``QuantizationAnnotation`` has four fields. ``input_qspec_map`` maps an *input node* to a
# spec: the edge from that node into this one gets quantized. The conv wants its input ``x``
# and its weight quantized, not its bias. Its ``output_qspec`` is ``None``: the conv's only
# user is a relu, so the course quantizer quantizes after the relu instead (a backend runs
# conv+relu as one fused op). ``allow_implicit_sharing`` (step 5) and ``_annotated`` follow.

print([field.name for field in dataclasses.fields(QuantizationAnnotation)])
conv = ours["conv2d"]
names = {id(ACTIVATION_SPEC): "ACTIVATION_SPEC", id(WEIGHT_SPEC): "WEIGHT_SPEC"}
print({source.name: names[id(spec)] for source, spec in conv.input_qspec_map.items()})
print("output_qspec:", conv.output_qspec, "   _annotated:", conv._annotated)
assert [f.name for f in dataclasses.fields(QuantizationAnnotation)] == [
    "input_qspec_map",
    "output_qspec",
    "allow_implicit_sharing",
    "_annotated",
], "an annotation has four fields"
assert [n.name for n in conv.input_qspec_map] == ["x", "conv_weight"], "bias stays float"
assert conv.input_qspec_map[next(iter(conv.input_qspec_map))] is ACTIVATION_SPEC, (
    "the input x gets ACTIVATION_SPEC"
)
assert conv.output_qspec is None and ours["relu"].output_qspec is ACTIVATION_SPEC, (
    "the conv's output is quantized after its relu"
)
assert conv._annotated, "_annotated tells other quantizers: hands off this node"

# %%
# Step 4 — What a QuantizationSpec says
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
assert WEIGHT_SPEC.qscheme == torch.per_channel_symmetric and WEIGHT_SPEC.ch_axis == 0, (
    "weights: per channel along axis 0, symmetric"
)
assert -WEIGHT_SPEC.quant_min == WEIGHT_SPEC.quant_max == 127, "a symmetric range [-127, 127]"
assert ACTIVATION_SPEC.qscheme == torch.per_tensor_affine, "activations: per tensor, affine"
assert isinstance(ACTIVATION_SPEC, QuantizationSpec) and isinstance(
    WEIGHT_SPEC, QuantizationSpec
), "both are QuantizationSpec"

# %%
# Step 5 — SharedQuantizationSpec and allow_implicit_sharing
# ----------------------------------------------------------
# Max pooling only picks values, so its output can keep its input's scale and zero point.
# Its ``output_qspec`` is not a spec of its own but a pointer to the edge
# ``relu → max_pool2d``. Flatten does the same, pointing to ``max_pool2d → flatten``.

for name in ["max_pool2d", "flatten"]:
    shared = ours[name].output_qspec
    source, user = shared.edge_or_node
    print(f"{name}.output_qspec = SharedQuantizationSpec(({source.name}, {user.name}))")
    assert isinstance(shared, SharedQuantizationSpec) and user.name == name, (
        f"{name}'s output shares its own input edge's numbers"
    )
assert ours["max_pool2d"].output_qspec.edge_or_node[0].name == "relu", (
    "the pool points to relu → max_pool2d"
)

# %%
# That pointer is *explicit* sharing. The edge ``relu → max_pool2d`` carries the very tensor the
# relu outputs, and both places ask for ``ACTIVATION_SPEC``: with ``allow_implicit_sharing``
# (``True`` by default) prepare gives them one observer, *implicit* sharing (M02-2, step 3).
# Switched off on the max pool, its input edge gets an observer of its own: one more observer
# call, one more observer.

sharing = {name: a.allow_implicit_sharing for name, a in ours.items()}
print(f"allow_implicit_sharing: {sharing}")
shared_run = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
separate_run = prepare_pt2e(export_module(get_model("small_cnn"), x), NoImplicitSharingAtPool())
for label, prepared in [("default", shared_run), ("off at the pool", separate_run)]:
    calls = observer_calls(prepared)
    distinct = {id(prepared.get_submodule(n.target)) for n in calls}
    print(f"{pad(label, 16)} {len(calls)} observer calls, {len(distinct)} distinct observers")
assert all(a.allow_implicit_sharing for a in ours.values()), "True unless a quantizer says no"
assert len(observer_calls(separate_run)) == len(observer_calls(shared_run)) + 1, (
    "without implicit sharing, relu → max_pool2d gets its own observer"
)
pool = separate_run.graph.find_nodes(op="call_function", target=aten.max_pool2d.default)[0]
own = pool.args[0]
assert handmade.is_observer_node(separate_run, own.args[0]), (
    "two observers in a row: the relu's output, then the pool's input edge"
)
draw(separate_run, highlight=[own.name], title="Step 5: the pool's input edge, its own observer")

# %%
# Step 6 — Another quantizer, other notes
# ---------------------------------------
# ``X86InductorQuantizer`` annotates the same nodes on a fresh copy of the graph, with other
# choices: unsigned activations in [0, 255], an explicit ``None`` for the bias, no output spec
# on the relu (its output is quantized only because the pool's input edge wants it), and a
# float output for the final linear.

gm_x86 = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm_x86)
theirs = notes(x86_quantizer().annotate(gm_x86))
for name in ours:
    print(f"{name:10}  course: {summary(ours[name])}\n{'':10}  x86:    {summary(theirs[name])}")
assert list(theirs) == list(ours), "the same nodes are annotated"
x86_input = theirs["conv2d"].input_qspec_map[gm_x86.graph.find_nodes(op="placeholder")[0]]
assert (x86_input.dtype, x86_input.quant_min, x86_input.quant_max) == (torch.uint8, 0, 255), (
    "x86: unsigned activations in [0, 255]"
)
bias = {n.name: spec for n, spec in theirs["conv2d"].input_qspec_map.items()}["conv_bias"]
assert bias is None, "x86 names the bias, with None: it stays float"
assert theirs["relu"].output_qspec is None and theirs["linear"].output_qspec is None, (
    "x86: no output spec on the relu, a float output for the linear"
)
assert isinstance(theirs["max_pool2d"].output_qspec, SharedQuantizationSpec), (
    "x86 shares the pool's numbers too"
)

# %%
# Step 7 — torchao's prepare and convert accept the course quantizer
# ------------------------------------------------------------------
# A quantizer is just annotations, so torchao's passes work with ours unchanged. The quantized
# model stays close to the float one: the largest difference, printed below, is a few
# hundredths against outputs of size about one.

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
draw(quantized, highlight=qdq, title="Step 7: torchao's convert_pt2e with CourseQuantizer")

# %%
# Summary
# -------
# A quantizer writes one ``QuantizationAnnotation`` per node it cares about: specs for input
# edges, a spec for the output, or a ``SharedQuantizationSpec`` that borrows another edge's
# numbers; ``allow_implicit_sharing`` lets prepare merge places that carry the same tensor.
# ``annotate`` changes nothing else; ``transform_for_annotation``, called first by
# ``prepare_pt2e``, is where a quantizer may rewrite the graph.

# %%
# Exercises
# ---------
# 1. Annotate ``linear_relu`` (export it, then ``CourseQuantizer().annotate``). Which nodes get
#    a note, and which one carries the output spec?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          other = CourseQuantizer().annotate(export_module(get_model("linear_relu"), x))
#          print({name: summary(a) for name, a in notes(other).items()})
#          assert list(notes(other)) == ["linear", "relu"], "flatten's input is not quantized"
#          assert notes(other)["linear"].output_qspec is None
#          assert notes(other)["relu"].output_qspec is ACTIVATION_SPEC
#
# 2. Switch off ``allow_implicit_sharing`` on *every* annotation, not only the pool's. How many
#    observer calls does ``prepare_pt2e`` insert on ``small_cnn``, and how many distinct
#    observers?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          class NoImplicitSharing(CourseQuantizer):
#              def annotate(self, model):
#                  super().annotate(model)
#                  for annotation in notes(model).values():
#                      annotation.allow_implicit_sharing = False
#                  return model
#
#          none_shared = prepare_pt2e(export_module(get_model("small_cnn"), x), NoImplicitSharing())
#          calls = observer_calls(none_shared)
#          distinct = {id(none_shared.get_submodule(n.target)) for n in calls}
#          print(len(calls), "calls,", len(distinct), "observers")
#          assert (len(calls), len(distinct)) == (10, 8), "pool, flatten, linear inputs: their own"
#
# 3. Give ``X86InductorQuantizer``'s notes to torchao's ``prepare_pt2e`` (use ``x86_quantizer()``).
#    Does the linear's output get an observer?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          x86_prepared = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
#          linear = x86_prepared.graph.find_nodes(op="call_function", target=aten.linear.default)[0]
#          print([user.name for user in linear.users])
#          assert not any(handmade.is_observer_node(x86_prepared, u) for u in linear.users), (
#              "output_qspec None: the linear's output stays float"
#          )

# %%
# Further reading
# ---------------
# - `PT2E Quantization <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`__
#   (torchao)
# - `How to write a Quantizer for PyTorch 2 Export Quantization
#   <https://docs.pytorch.org/tutorials/prototype/pt2e_quantizer.html>`__
# - :ref:`M05-1 · What the quantizer sees in attention
#   <sphx_glr_lessons_m05_transformers_m05_1_attention.py>` — the same question on a transformer
# - :ref:`Troubleshooting: imports and export
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>` —
#   the same failure, found by its error message

# %%
# **Next**: :ref:`M02-2 · prepare by hand <sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py>`
# turns these notes into observers ourselves, and checks that we get exactly ``prepare_pt2e``'s
# graph.
