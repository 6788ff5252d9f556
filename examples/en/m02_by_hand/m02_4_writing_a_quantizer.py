"""
M02-4 Writing a quantizer for a new backend
===========================================

A backend's whole say in PT2E is its quantizer: it walks the graph and writes annotations,
and prepare and convert do the rest. This lesson starts from the course quantizer's code and
grows it, one feature at a time, into the quantizer of an imagined integer accelerator: an
int32 bias, shared scales for ``add``/``cat``, fixed scales for ``sigmoid``, a graph rewrite
before annotating, and a check after it. The result runs through ``common.handmade`` and
torchao and gives bit-exact results.

**What you will learn**

- How ``DerivedQuantizationSpec`` makes an int32 bias with scale = input scale × weight scale
- When to use ``SharedQuantizationSpec``, ``FixedQParamsQuantizationSpec`` and
  ``allow_implicit_sharing``
- What ``transform_for_annotation`` and ``validate`` are for, and what to do when a quantizer
  fails on ordinary model code

**Prerequisites**: :ref:`M02-1 · What a quantizer writes
<sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`,
:ref:`M02-3 · convert by hand <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# Setup
# -----
# A block with what real CNN code has: a conv + relu stem, two branches joined by ``cat``, a
# residual written in place (``out += x``) and a ``sigmoid`` gate at the end.

import inspect

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs
from common.pt2e import calibrate, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.observer import MinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    SharedQuantizationSpec,
)

from common import handmade
from common.quantizer import ACTIVATION_SPEC, CourseQuantizer

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.left = nn.Conv2d(8, 4, 3, padding=1)
        self.right = nn.Conv2d(8, 4, 1)
        self.mix = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        out = self.mix(torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x))], dim=1))
        out += x
        return torch.sigmoid(out)


def block():
    torch.manual_seed(0)
    return Block().eval()


x = example_inputs(4)


def prepared_by(prepare, quantizer, model=None, strict=False):
    """Export the block (or ``model``), prepare it and calibrate it on the course's batches."""
    gm = torch.export.export(model or block(), x, strict=strict).module()
    gm = prepare(gm, quantizer)
    calibrate(gm, batches=2)
    return gm


def annotated(gm):
    return {
        n.name: n.meta["quantization_annotation"]
        for n in gm.graph.nodes
        if n.meta.get("quantization_annotation")
    }


# %%
# Step 1 — Read the course quantizer
# ----------------------------------
# This is all of ``CourseQuantizer``: for each node it recognises, it writes a
# ``QuantizationAnnotation`` (input specs, output spec). Nothing else.

print(inspect.getsource(CourseQuantizer))

# %%
# On the block it quantizes the convs, relus and the cat, and leaves the in-place ``add_`` and
# the ``sigmoid`` in float: between them, the graph goes back to float32 twice.

course = prepared_by(handmade.prepare, CourseQuantizer())
draw(course, title="CourseQuantizer: add_ and sigmoid stay float")
float_ops = [
    n.name for n in course.graph.nodes if n.target in (aten.add_.Tensor, aten.sigmoid.default)
]
assert float_ops == ["add_", "sigmoid"], "the residual add and the sigmoid are float"
assert not {"add_", "sigmoid"} & set(annotated(course)), "the course quantizer leaves them alone"

# %%
# Step 2 — transform_for_annotation: one pattern instead of two
# -------------------------------------------------------------
# Real code writes the residual in place (``out += x`` → ``aten.add_``). The accelerator's
# quantizer runs ``transform_for_annotation`` before ``annotate`` (prepare calls it), so it can
# rewrite ``add_`` into ``add`` there and match just ``aten.add``. The rewrite is only safe when
# nothing else reads the tensor that ``add_`` would have changed; the code checks that.


class Step2Quantizer(CourseQuantizer):
    def transform_for_annotation(self, model):
        for node in model.graph.find_nodes(op="call_function", target=aten.add_.Tensor):
            if len(node.args[0].users) == 1:  # nobody else sees the mutated tensor
                node.target = aten.add.Tensor
        model.recompile()
        return model


step2 = prepared_by(handmade.prepare, Step2Quantizer())
assert step2.graph.find_nodes(op="call_function", target=aten.add.Tensor), "add_ became add"
assert not step2.graph.find_nodes(op="call_function", target=aten.add_.Tensor)

# %%
# Step 3 — An int32 bias with DerivedQuantizationSpec
# ---------------------------------------------------
# An integer conv accumulates ``int8 × int8`` products in int32, with scale
# ``input scale × weight scale``; the bias must be added in that same scale. A
# ``DerivedQuantizationSpec`` says so: its ``derive_qparams_fn`` gets the observers of the
# edges in ``derived_from`` and returns the bias's scale and zero point.


def bias_qparams(observers):
    activation, weight = observers
    activation_scale, _ = activation.calculate_qparams()
    weight_scale, weight_zero_point = weight.calculate_qparams()
    return activation_scale * weight_scale, torch.zeros_like(weight_zero_point, dtype=torch.int32)


def int32_bias(conv):
    x, weight = conv.args[:2]
    return DerivedQuantizationSpec(
        derived_from=[(x, conv), (weight, conv)],
        derive_qparams_fn=bias_qparams,
        dtype=torch.int32,
        quant_min=-(2**31),
        quant_max=2**31 - 1,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
    )


class Step3Quantizer(Step2Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for conv in model.graph.find_nodes(op="call_function", target=aten.conv2d.default):
            conv.meta["quantization_annotation"].input_qspec_map[conv.args[2]] = int32_bias(conv)
        return model


step3 = prepared_by(handmade.prepare, Step3Quantizer())

# %%
# After calibration, each bias observer's scale is exactly the product of the two observers it
# derives from, channel by channel:

stem = next(iter(step3.graph.find_nodes(op="call_function", target=aten.conv2d.default)))
x_observer, w_observer, b_observer = (step3.get_submodule(arg.target) for arg in stem.args[:3])
bias_scale = b_observer.calculate_qparams()[0]
print("bias scale[:3] =", bias_scale[:3])
expected_scale = x_observer.calculate_qparams()[0] * w_observer.calculate_qparams()[0]
assert torch.equal(bias_scale, expected_scale), "bias scale = input scale × weight scale"

# %%
# Step 4 — Shared scales for add (and cat)
# ----------------------------------------
# The accelerator adds two int8 tensors without rescaling only when both have one scale and
# zero point. ``SharedQuantizationSpec(edge)`` says "use the observer of that edge": the second
# input and the output of ``add`` share the first input's. ``CourseQuantizer`` already does this
# for ``cat``.


def annotate_add(node, **options):
    first, second = node.args[:2]
    shared = SharedQuantizationSpec((first, node))
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map={first: ACTIVATION_SPEC, second: shared},
        output_qspec=shared,
        _annotated=True,
        **options,
    )


class Step4Quantizer(Step3Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.add.Tensor):
            annotate_add(node)
        return model


step4 = prepared_by(handmade.prepare, Step4Quantizer())
add = next(iter(step4.graph.find_nodes(op="call_function", target=aten.add.Tensor)))
add_observers = {id(step4.get_submodule(n.target)) for n in [*add.args[:2], *add.users]}
print(f"distinct observers around add: {len(add_observers)}")
draw(step4, highlight=[add.name], title="Step 4: add shares one observer")
assert len(add_observers) == 1, "both inputs and the output of add share one observer"

# %%
# Step 5 — allow_implicit_sharing
# -------------------------------
# Why did the add's inputs share with the *convs' outputs* too? An input edge reads the same
# tensor as its producer's output, so prepare lets them share an observer when their specs agree
# (implicit sharing). ``allow_implicit_sharing=False`` on an annotation turns that off for its
# input edges: they get observers of their own, and the graph gets more of them.


class NoImplicitSharing(Step3Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.add.Tensor):
            annotate_add(node, allow_implicit_sharing=False)
        return model


def count_observers(gm):
    return len(
        {id(gm.get_submodule(n.target)) for n in gm.graph.nodes if handmade.is_observer_node(gm, n)}
    )


separate = prepared_by(handmade.prepare, NoImplicitSharing())
print("observers:", count_observers(step4), "shared vs", count_observers(separate), "separate")
assert count_observers(separate) > count_observers(step4), "no implicit sharing: more observers"

# %%
# Step 6 — Fixed qparams for sigmoid
# ----------------------------------
# ``sigmoid``'s output always lies in [0, 1], so there is nothing to calibrate:
# ``FixedQParamsQuantizationSpec`` fixes scale 1/256 and zero point 0 in uint8.

SIGMOID_OUTPUT = FixedQParamsQuantizationSpec(
    dtype=torch.uint8, scale=1 / 256, zero_point=0, quant_min=0, quant_max=255
)


class Step6Quantizer(Step4Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.sigmoid.default):
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={node.args[0]: ACTIVATION_SPEC},
                output_qspec=SIGMOID_OUTPUT,
                _annotated=True,
            )
        return model


ours = prepared_by(handmade.prepare, Step6Quantizer())
converted = handmade.convert(ours)
sigmoid = next(iter(converted.graph.find_nodes(op="call_function", target=aten.sigmoid.default)))
q_out = next(iter(sigmoid.users))
print(q_out.target, q_out.args[1:])
assert q_out.args[1:3] == (1 / 256, 0), "sigmoid's output: scale 1/256, zero point 0"
draw(converted, highlight=[q_out.name], title="Step 6: sigmoid with fixed qparams, converted")

# %%
# Step 7 — validate: refuse what the backend cannot run
# -----------------------------------------------------
# prepare calls ``validate`` right after ``annotate``. The accelerator has no int16 kernels, so
# a user who asks for 16-bit activations hears it at prepare time, not on the device.

SUPPORTED_DTYPES = {torch.int8, torch.uint8, torch.int32}  # the accelerator's kernels


class BackendQuantizer(Step6Quantizer):
    """The accelerator's quantizer: the course's, plus steps 2–6 and a check (step 7)."""

    def validate(self, model):
        for node in model.graph.nodes:
            annotation = node.meta.get("quantization_annotation")
            specs = (
                [*annotation.input_qspec_map.values(), annotation.output_qspec]
                if annotation
                else []
            )
            for spec in specs:
                dtype = getattr(spec, "dtype", None)
                if dtype is not None and dtype not in SUPPORTED_DTYPES:
                    raise ValueError(f"node {node.name!r}: the accelerator has no {dtype} kernels")


INT16 = QuantizationSpec(
    dtype=torch.int16,
    quant_min=-(2**15),
    quant_max=2**15 - 1,
    qscheme=torch.per_tensor_affine,
    observer_or_fake_quant_ctr=MinMaxObserver,
)


class Int16Request(BackendQuantizer):
    def annotate(self, model):
        super().annotate(model)
        relu = next(iter(model.graph.find_nodes(op="call_function", target=aten.relu.default)))
        relu.meta["quantization_annotation"].output_qspec = INT16
        return model


with expect_error(ValueError, match="no torch.int16 kernels"):
    handmade.prepare(torch.export.export(block(), x).module(), Int16Request())

# %%
# Step 8 — The same through torchao, bit for bit
# ----------------------------------------------
# The reader's quantizer, with every kind of spec, through torchao's ``prepare_pt2e`` and
# ``convert_pt2e``: the same graph, the same int8/int32 constants, the same outputs.

converted = handmade.convert(prepared_by(handmade.prepare, BackendQuantizer()))
theirs = convert_pt2e(prepared_by(prepare_pt2e, BackendQuantizer()))
fresh = example_inputs(4, seed=123)
assert converted.code == theirs.code, "the same converted graph"
assert converted.state_dict().keys() == theirs.state_dict().keys()
assert all(torch.equal(v, converted.state_dict()[k]) for k, v in theirs.state_dict().items())
assert torch.equal(converted(*fresh), theirs(*fresh)), "bit-exact with torchao"
int32 = [
    k
    for k, v in converted.state_dict().items()
    if v.dtype == torch.int32 and v.ndim == 1 and "zero_point" not in k
]
print(f"int32 constants (the folded biases): {int32}")
assert len(int32) == 4, "the four conv biases are int32 constants"

# %%
# Step 9 — When torchao's own quantizer fails on ordinary code
# ------------------------------------------------------------
# A quantizer matches patterns that the export left behind, so it sees what the export
# recorded. Calling one ``nn.ReLU`` module twice is ordinary PyTorch, but after the default
# (non-strict) export ``X86InductorQuantizer.annotate`` itself raises. ``handmade.prepare``
# calls the same ``annotate``, so it raises too.


class ReusedReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()  # one module, called twice below

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


for prepare in (prepare_pt2e, handmade.prepare):
    with expect_error(ValueError, match="Input partition has more than one output node"):
        prepare(torch.export.export(ReusedReLU().eval(), x).module(), x86_quantizer())

# %%
# The workaround: give each use its own ``nn.ReLU`` (or call ``torch.relu``); exporting with
# ``strict=True`` also works. Both then agree bit for bit again.


class OwnReLUs(ReusedReLU):
    def __init__(self):
        super().__init__()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(self.conv2(self.relu(self.conv1(x))))


def seeded(cls):
    torch.manual_seed(0)
    return cls().eval()


passes = ((prepare_pt2e, convert_pt2e), (handmade.prepare, handmade.convert))
fixed = [convert(prepared_by(p, x86_quantizer(), seeded(OwnReLUs))) for p, convert in passes]
assert torch.equal(fixed[0](*fresh), fixed[1](*fresh)), "one nn.ReLU per use: works, bit-exact"
strict = [
    convert(prepared_by(p, x86_quantizer(), seeded(ReusedReLU), strict=True))
    for p, convert in passes
]
assert torch.equal(strict[0](*fresh), strict[1](*fresh)), "strict export: works, bit-exact"

# %%
# Summary
# -------
#
# =====================================  ==================================================
# Need of the backend                    What the quantizer writes
# =====================================  ==================================================
# int32 bias in the accumulator scale    ``DerivedQuantizationSpec`` (input × weight scale)
# one scale across ``add``/``cat``       ``SharedQuantizationSpec`` on inputs and output
# a known output range (sigmoid)         ``FixedQParamsQuantizationSpec``
# own observers on an op's inputs        ``allow_implicit_sharing=False``
# fewer patterns to match                ``transform_for_annotation`` (``add_`` → ``add``)
# refuse what it cannot run              ``validate``
# =====================================  ==================================================
#
# Exercises
# ---------
# 1. Read a slice of ``out`` before ``out += x`` (``Peek`` below). Predict: does
#    ``BackendQuantizer``'s ``transform_for_annotation`` turn that ``add_`` into ``add``? And
#    would the rewrite, done anyway, change what the model computes?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          class Peek(Block):
#              def forward(self, x):
#                  x = torch.relu(self.stem(x))
#                  branches = [torch.relu(self.left(x)), torch.relu(self.right(x))]
#                  out = self.mix(torch.cat(branches, dim=1))
#                  first = out[:, :1]  # a view of out: it sees what += writes
#                  out += x
#                  return torch.sigmoid(out) * first
#
#
#          torch.manual_seed(0)
#          peek = Peek().eval()
#          peeked = prepared_by(handmade.prepare, BackendQuantizer(), peek)
#          in_place = peeked.graph.find_nodes(op="call_function", target=aten.add_.Tensor)
#          assert in_place and "add_" not in annotated(peeked), "add_ is kept, and stays float"
#          forced = torch.export.export(peek, x).module()
#          (add_,) = forced.graph.find_nodes(op="call_function", target=aten.add_.Tensor)
#          add_.target = aten.add.Tensor  # the rewrite, without the check
#          forced.recompile()
#          with torch.no_grad():
#              assert not torch.equal(forced(*fresh), peek(*fresh)), (
#                  "the slice would no longer see the +="
#              )
#
# 2. Make the sigmoid's fixed scale 1/128 instead of 1/256. Predict how many different values
#    the quantized sigmoid output can take at most.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          import dataclasses
#
#
#          class Coarser(BackendQuantizer):
#              def annotate(self, model):
#                  super().annotate(model)
#                  coarse = dataclasses.replace(SIGMOID_OUTPUT, scale=1 / 128)
#                  graph = model.graph
#                  for node in graph.find_nodes(op="call_function", target=aten.sigmoid.default):
#                      node.meta["quantization_annotation"].output_qspec = coarse
#                  return model
#
#
#          out = handmade.convert(prepared_by(handmade.prepare, Coarser()))(*fresh)
#          assert len(out.unique()) <= 129, "[0, 1] in steps of 1/128: at most 129 values"
#
# 3. Run ``BackendQuantizer`` on a conv with ``bias=False``: step 3's loop raises
#    ``IndexError`` (``conv.args`` has no bias). Fix the loop to skip a conv without a bias,
#    then predict: how many int32 constants does the converted model hold, is it still
#    bit-exact with torchao, and does the fix change the block's converted graph?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          class NoBias(nn.Module):
#              def __init__(self):
#                  super().__init__()
#                  self.conv = nn.Conv2d(3, 8, 3, bias=False)
#
#              def forward(self, x):
#                  return self.conv(x)
#
#
#          with expect_error(IndexError):
#              prepared_by(handmade.prepare, BackendQuantizer(), NoBias().eval())
#
#
#          class BiasIfAny(Step3Quantizer):
#              def annotate(self, model):
#                  # the course's annotations, then step 3, fixed
#                  CourseQuantizer.annotate(self, model)
#                  convs = model.graph.find_nodes(op="call_function", target=aten.conv2d.default)
#                  for conv in convs:
#                      if len(conv.args) > 2 and conv.args[2] is not None:
#                          qspecs = conv.meta["quantization_annotation"].input_qspec_map
#                          qspecs[conv.args[2]] = int32_bias(conv)
#                  return model
#
#
#          torch.manual_seed(0)
#          no_bias = NoBias().eval()
#          ours = handmade.convert(prepared_by(handmade.prepare, BiasIfAny(), no_bias))
#          theirs = convert_pt2e(prepared_by(prepare_pt2e, BiasIfAny(), no_bias))
#          dtypes = [value.dtype for value in ours.state_dict().values()]
#          print(dtypes)
#          assert torch.int32 not in dtypes and torch.int8 in dtypes, (
#              "no bias, no int32 constant; the weight is int8"
#          )
#          assert torch.equal(ours(*fresh), theirs(*fresh)), "bit-exact with torchao"
#          before, after = (
#              handmade.convert(prepared_by(handmade.prepare, quantizer()))
#              for quantizer in (Step3Quantizer, BiasIfAny)
#          )
#          assert after.code == before.code, "where every conv has a bias, nothing changes"
#
# Further reading
# ---------------
# - `How to Write a Quantizer for PyTorch 2 Export Quantization
#   <https://docs.pytorch.org/tutorials/prototype/pt2e_quantizer.html>`_
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_ (strict and non-strict)
# - :ref:`M06-1 · The XNNPACK quantizer
#   <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>` —
#   another backend's quantizer, for ExecuTorch
# - :ref:`Troubleshooting: prepare and convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` —
#   the same failure, found by its error message
#
# Next
# ----
# :ref:`M03-1 · the lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`:
# lowering the converted graph to real int8 kernels.
