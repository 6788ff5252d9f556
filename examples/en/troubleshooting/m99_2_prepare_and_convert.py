"""
Troubleshooting: prepare and convert
====================================

The errors and silent failures of ``prepare_pt2e`` and ``convert_pt2e``: a reused activation
module, a weight two modules share, a module left float by name, observers and specs that do
not fit together, a ``forward`` under ``@torch.no_grad()``, a model converted without
calibration, a graph edit that ``constant_fold`` cannot survive, and, on M08's language model,
a dynamic int8 decoder that outputs zeros, a KV cache that seems lost after convert, and
linears whose width int4 groups of 32 do not divide. Each entry is headed by the exact first
line of the message (or the symptom in a reader's words), reproduces it on this site's stack
(torch 2.13, torchao 0.18, executorch 1.5.1), shows the cause, asserts the fix, and links to
the lesson that explains it.

**Prerequisites**: none; each entry links to the lesson that explains it.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``OneSpecQuantizer`` annotates the input and output of every conv with one spec: the smallest
# quantizer that lets an entry swap the spec or the observer it is made of.

import operator
import warnings

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e import MinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

x = example_inputs(8)
CONV, RELU = torch.ops.aten.conv2d.default, torch.ops.aten.relu.default


def uint8_spec(observer) -> QuantizationSpec:
    return QuantizationSpec(
        dtype=torch.uint8,
        quant_min=0,
        quant_max=255,
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=observer,
    )


class OneSpecQuantizer(Quantizer):
    """Quantizes each conv's input and output with ``spec`` (weights stay float)."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def annotate(self, model):
        for conv in model.graph.find_nodes(op="call_function", target=CONV):
            conv.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={conv.args[0]: self.spec}, output_qspec=self.spec, _annotated=True
            )
        return model

    def validate(self, model):
        pass


# %%
# ValueError: Input partition has more than one output node
# ---------------------------------------------------------
# Real models often create one ``nn.ReLU`` and call it twice. Exported non-strict (the
# default), ``X86InductorQuantizer.annotate`` itself fails on such a model.


class ReusedReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()  # one module, called twice below

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


reused = export_module(ReusedReLU(), x)
with expect_error(ValueError, match="Input partition has more than one output node"):
    prepare_pt2e(reused, x86_quantizer())

# %%
# **Cause**, on the graph: both ``relu`` nodes carry the same module, ``relu``, in their
# ``nn_module_stack``. The quantizer groups nodes into partitions by the module that produced
# them, so it sees one "ReLU" with two outputs, which it refuses.

relus = reused.graph.find_nodes(op="call_function", target=RELU)
for node in relus:
    print(node.name, "from module", list(node.meta["nn_module_stack"].values())[-1])
draw(reused, highlight=[n.name for n in relus], title="Two relu nodes, one nn.ReLU module")
modules = {list(n.meta["nn_module_stack"].values())[-1][0] for n in relus}
assert len(relus) == 2 and modules == {"relu"}, "two relu nodes, one module"

# %%
# **Fix**: one activation module per call. Explained in
# :ref:`M00-3 · Finding patterns <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`.


class OneReLUPerCall(ReusedReLU):
    def __init__(self):
        super().__init__()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(self.conv2(self.relu(self.conv1(x))))


prepared = prepare_pt2e(export_module(OneReLUPerCall(), x), x86_quantizer())
calibrate(prepared)
assert op_counts(convert_pt2e(prepared))["quantize_per_tensor.default"] >= 2, (
    "both convs are quantized"
)

# %%
# A reused ``nn.Linear`` is reported under this heading too (pytorch/ao#4478), but on torchao
# 0.18 it prepares and converts, and both calls of the one ``fc`` read int8 input (asserted
# below). Compiled, a weight read by two linears has its own catch: M07-4's
# "linear · weight shared" row. Step 6 of :ref:`M07-5 · rewrites that buy more int8
# <sphx_glr_lessons_m07_your_model_m07_5_rewrites_for_int8.py>` gives a GRU's cell a copy per
# step, so that every linear runs int8, and times what that buys on a recurrent model.


class ReusedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)  # one module, called twice below

    def forward(self, t):
        return self.fc(torch.relu(self.fc(t)))


tokens = (torch.randn(2, 16),)
prepared = prepare_pt2e(export_module(ReusedLinear(), tokens), x86_quantizer())
prepared(*tokens)
linears = convert_pt2e(prepared).graph.find_nodes(
    op="call_function", target=torch.ops.aten.linear.default
)
DQ_TENSOR = torch.ops.quantized_decomposed.dequantize_per_tensor.default
assert len(linears) == 2 and all(n.args[0].target == DQ_TENSOR for n in linears), (
    "both calls of the one linear read a dequantized int8 input"
)

# %%
# A tied weight quantized twice (two modules share one weight)
# ------------------------------------------------------------
# Models tie weights: ``b.weight = a.weight``, or an embedding tied to the output linear.
# Reported on torch 2.6 as ``ValueError: Linear partition cannot have more than one output
# node`` (`pytorch/pytorch#142035 <https://github.com/pytorch/pytorch/issues/142035>`_); on
# torch 2.13 ``prepare_pt2e`` runs. Export reads the tied weight through one ``get_attr`` node
# that both modules use. The trap left: a config that differs per module (here
# ``set_module_name`` makes ``b`` per-tensor, the rest per-channel) puts two observers on that
# one node, and convert stores the weight twice, in int8 with different scales: the tie is
# silently gone.

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    get_symmetric_quantization_config,
)

from common.edge import xnnpack_quantizer


class TiedLinears(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.b.weight = self.a.weight  # one Parameter, two modules

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def tied_weight_observers(prepared) -> list[str]:
    """The observers on the output of the one get_attr node that reads the tied weight."""
    (weight,) = [n for n in prepared.graph.find_nodes(op="get_attr") if n.target.endswith("weight")]
    return [
        type(prepared.get_submodule(u.target)).__name__
        for u in weight.users
        if u.op == "call_module"
    ]


def int8_constants(converted) -> list[str]:
    """The int8 tensors a converted graph reads (its quantized weights)."""
    return [
        n.target
        for n in converted.graph.find_nodes(op="get_attr")
        if operator.attrgetter(n.target)(converted).dtype == torch.int8
    ]


features = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
per_tensor = get_symmetric_quantization_config(is_per_channel=False)
mixed = prepare_pt2e(
    export_module(TiedLinears(), (features,)), xnnpack_quantizer().set_module_name("b", per_tensor)
)
observers = tied_weight_observers(mixed)
mixed(features)  # calibration
twice = convert_pt2e(mixed)
print(f"observers of the tied weight: {observers}; int8 constants: {int8_constants(twice)}")
assert len(observers) == 2 and len(int8_constants(twice)) == 2, "one weight, stored twice in int8"

# %%
# **Fix**: give the modules that share a weight the same config (here the global one): one
# observer then watches the weight, and convert stores one int8 tensor that both linears
# dequantize. (With ``X86InductorQuantizer`` an embedding tied to a linear stays float: the
# embedding reads the float weight, the linear its int8 copy.) Where prepare puts observers,
# and when edges share one, is explained in
# :ref:`M02-2 · prepare by hand <sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py>`.

same = prepare_pt2e(export_module(TiedLinears(), (features,)), xnnpack_quantizer())
observers = tied_weight_observers(same)
same(features)
once = convert_pt2e(same)
print(f"observers of the tied weight: {observers}; int8 constants: {int8_constants(once)}")
assert len(observers) == 1 and len(int8_constants(once)) == 1, "one weight, one int8 tensor"

# %%
# AssertionError: quantization_config == None is not supported yet
# ----------------------------------------------------------------
# ``None`` as a module's config leaves that module float: ``X86InductorQuantizer`` takes
# ``set_module_name_qconfig("b", None)``. Its ExecuTorch counterpart,
# ``XNNPACKQuantizer().set_module_name("b", None)``, refuses at once, before any graph.

with expect_error(AssertionError, match="quantization_config == None is not supported yet"):
    xnnpack_quantizer().set_module_name("b", None)

# %%
# **Cause**: ``set_module_name`` asserts that its config is not ``None`` (ExecuTorch 1.5.1,
# ``xnnpack_quantizer.py``); ``set_module_type`` asserts nothing, and ``None`` works there:
# ``annotate`` skips a ``None`` config, and the global config skips every module named in
# the two tables. But a type covers every module of that class: ``set_module_type(nn.Linear,
# None)`` leaves both linears float, here ``a`` as well as ``b``.


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def float_weights(quantizer) -> list[str]:
    """The weights a converted ``TwoLinears`` still reads in float (not through a dequantize)."""
    prepared = prepare_pt2e(export_module(TwoLinears(), (features,)), quantizer)
    prepared(features)  # calibration
    converted = convert_pt2e(prepared)
    linears = converted.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    return [n.args[1].target for n in linears if n.args[1].op == "get_attr"]


by_type = float_weights(xnnpack_quantizer().set_module_type(nn.Linear, None))
print(f"float weights with set_module_type(nn.Linear, None): {by_type}")
assert by_type == ["a.weight", "b.weight"], "every nn.Linear float, not only b"

# %%
# **Fix**: keep the global config and filter the one module out. ``set_filter_function``
# takes a function of a node (every annotation must pass it), and torchao's
# ``get_module_name_filter("b")`` tells whether a node was recorded in module ``b``: its
# negation leaves ``b`` float and quantizes the rest, as ``X86InductorQuantizer``'s
# ``set_module_name_qconfig("b", None)`` does. Leaving modules float by name and by type is
# :ref:`M05-3 · Choosing what to quantize
# <sphx_glr_lessons_m05_transformers_m05_3_choosing_what_to_quantize.py>`.

from torchao.quantization.pt2e.quantizer import get_module_name_filter

in_b = get_module_name_filter("b")
by_filter = float_weights(xnnpack_quantizer().set_filter_function(lambda node: not in_b(node)))
print(f"float weights with set_filter_function: {by_filter}")
assert by_filter == ["b.weight"], "b float, a quantized"
x86_by_name = float_weights(x86_quantizer().set_module_name_qconfig("b", None))
assert x86_by_name == by_filter, "what X86InductorQuantizer does with None"

# %%
# Nothing got quantized (the observers are still in the graph after ``convert_pt2e``)
# -----------------------------------------------------------------------------------
# A quantizer whose specs use an observer from ``torch.ao.quantization`` (the old home of
# PT2E) runs without an error. ``prepare_pt2e`` inserts the observers; ``convert_pt2e`` does
# not recognise them as observers, leaves them in the graph, and inserts no quantize node.

from torch.ao.quantization.observer import MinMaxObserver as OldMinMaxObserver

old = prepare_pt2e(
    export_module(get_model("conv_relu"), x), OneSpecQuantizer(uint8_spec(OldMinMaxObserver))
)
calibrate(old)
old_converted = convert_pt2e(old)
left = [
    n.name for n in old_converted.graph.nodes if n.op == "call_module" and "post_process" in n.name
]
draw(old_converted, highlight=left, title="After convert_pt2e: torch.ao observers left, no q/dq")
assert op_counts(old_converted)["quantize_per_tensor.default"] == 0 and len(left) == 2, (
    "nothing quantized, observers kept"
)

# %%
# **Fix**: take observers (and specs, quantizers) from torchao only. torchao's
# ``MinMaxObserver`` is a different class from ``torch.ao``'s: convert looks for its own.
# Explained in
# :ref:`M02-3 · convert by hand <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`.

print(OldMinMaxObserver.__module__, "is not", MinMaxObserver.__module__)
new = prepare_pt2e(
    export_module(get_model("conv_relu"), x), OneSpecQuantizer(uint8_spec(MinMaxObserver))
)
calibrate(new)
assert op_counts(convert_pt2e(new))["quantize_per_tensor.default"] == 2, (
    "the conv's input and output are quantized"
)

# %%
# No quantize node after ``convert_pt2e``: ``forward`` has ``@torch.no_grad()``
# -----------------------------------------------------------------------------
# Inference code often decorates ``forward`` with ``@torch.no_grad()``. Such a model goes
# through export, ``prepare_pt2e``, calibration and ``convert_pt2e`` without an error or a
# warning, under ``X86InductorQuantizer`` and ``XNNPACKQuantizer`` alike, and comes out with
# no quantize node: it still computes in float.


class NoGradConvReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    @torch.no_grad()
    def forward(self, x):
        return torch.relu(self.conv(x))


def quantize_nodes(model) -> dict[str, int]:
    """Quantize nodes after export, prepare, calibration and convert, by quantizer."""
    counts = {}
    for quantizer in (x86_quantizer(), xnnpack_quantizer()):
        prepared = prepare_pt2e(export_module(model, x), quantizer)
        calibrate(prepared)
        converted = convert_pt2e(prepared)
        counts[type(quantizer).__name__] = op_counts(converted)["quantize_per_tensor.default"]
    return counts


decorated = quantize_nodes(NoGradConvReLU().eval())
print(f"quantize nodes after convert_pt2e: {decorated}")
assert decorated == {"X86InductorQuantizer": 0, "XNNPACKQuantizer": 0}, "nothing quantized"

# %%
# **Cause**, on the graph: export records the switch of grad mode as one node,
# ``wrap_with_set_grad_enabled`` (a higher-order op, highlighted), which calls a subgraph,
# ``submod_1``, holding the conv and the ReLU
# (``torch/_export/passes/replace_set_grad_with_hop_pass.py``). The quantizer annotates the
# nodes of the top-level graph, and ``prepare_pt2e`` goes into the subgraphs of ``scan`` and
# ``while_loop`` only: it sees no conv, and inserts no observer. ``common.coverage`` says so
# first, and why:

from common.coverage import coverage

graph = export_module(NoGradConvReLU().eval(), x)
(wrapped,) = graph.graph.find_nodes(
    op="call_function", target=torch.ops.higher_order.wrap_with_set_grad_enabled
)
body = graph.get_submodule(wrapped.args[1].target)
print(f"{wrapped.args[1].target}: {[n.name for n in body.graph.nodes if n.op == 'call_function']}")
draw(graph, highlight=[wrapped.name], title="The whole forward in one node")
print(coverage(graph, x86_quantizer()).summary())
assert body.graph.find_nodes(op="call_function", target=CONV), "the conv is in the subgraph"
assert not graph.graph.find_nodes(op="call_function", target=CONV), "and not in the graph"

# %%
# **Fix**: take the decorator off ``forward`` and export inside ``with torch.no_grad():``
# (where the model then runs too). Export keeps a switch of grad mode only when it changes
# the mode export runs in, so the conv and the ReLU are in the top-level graph, and both
# quantizers quantize them. Under ``with torch.no_grad():`` the decorated model exports
# whole as well. What export records is
# :ref:`M00-1 · Getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.


class ConvReLU(NoGradConvReLU):
    def forward(self, x):
        return torch.relu(self.conv(x))


with torch.no_grad():
    undecorated = quantize_nodes(ConvReLU().eval())
    assert quantize_nodes(NoGradConvReLU().eval()) == undecorated, "decorated: the same"
print(f"quantize nodes after convert_pt2e: {undecorated}")
assert all(undecorated.values()), "both quantizers quantize"

# %%
# KeyError: conv2d
# ----------------
# A bare ``KeyError`` naming a node (here ``conv2d``) from inside ``prepare_pt2e``. An
# annotation said "share the quantization parameters of ``conv2d``"
# (``SharedQuantizationSpec(conv)``), but nothing annotated ``conv2d``'s output, so there is no
# observer to share.


class SharesWithConv(Quantizer):
    """relu shares its qparams with the conv's output; ``annotate_conv`` decides if that exists."""

    def __init__(self, *, annotate_conv: bool):
        super().__init__()
        self.annotate_conv = annotate_conv

    def annotate(self, model):
        (conv,) = model.graph.find_nodes(op="call_function", target=CONV)
        (relu,) = model.graph.find_nodes(op="call_function", target=RELU)
        spec = uint8_spec(MinMaxObserver)
        if self.annotate_conv:
            conv.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={conv.args[0]: spec}, output_qspec=spec, _annotated=True
            )
        relu.meta["quantization_annotation"] = QuantizationAnnotation(
            input_qspec_map={conv: SharedQuantizationSpec(conv)},
            output_qspec=SharedQuantizationSpec(conv),
            _annotated=True,
        )
        return model

    def validate(self, model):
        pass


with expect_error(KeyError, match="conv2d"):
    prepare_pt2e(export_module(get_model("conv_relu"), x), SharesWithConv(annotate_conv=False))

# %%
# **Fix**: a ``SharedQuantizationSpec`` must point at a node (its output) or an edge
# ``(producer, consumer)`` that another annotation gives a real spec. With the conv annotated,
# relu's input and output get the conv's observer. Explained in
# :ref:`M02-4 · Writing a quantizer for a new backend
# <sphx_glr_lessons_m02_by_hand_m02_4_writing_a_quantizer.py>`.

shared = prepare_pt2e(export_module(get_model("conv_relu"), x), SharesWithConv(annotate_conv=True))
observers = dict(shared.named_modules(remove_duplicate=False))
print(f"observer names: {[n for n in observers if n.startswith('activation_post_process')]}")
assert len({id(m) for n, m in observers.items() if n.startswith("activation_post_process")}) == 2

# %%
# UserWarning: must run observer before calling calculate_qparams. Returning default values.
# ------------------------------------------------------------------------------------------
# ``convert_pt2e`` on a model that was never calibrated raises nothing: it warns (a line easy
# to miss in a notebook) and uses scale 1.0 and zero point 0 — every activation is rounded to
# a whole number, and the output is meaningless.

uncalibrated = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    garbage = convert_pt2e(uncalibrated)
print(f"warning: {str(caught[0].message).split('.')[0]}")
scales = {
    n.args[1]
    for n in garbage.graph.nodes
    if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default
}
print(f"activation scales: {scales}")
assert "must run observer before calling calculate_qparams" in str(caught[0].message)
assert scales == {1.0}, "the default scale, not one measured from data"

# %%
# **Fix**: calibrate between prepare and convert — run representative inputs through the
# prepared model. The scales then fit the data and the output is close to float. Explained in
# :ref:`M01-3 · How an observer turns statistics into qparams
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`.

reference = get_model("small_cnn")(*x)
calibrated = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
calibrate(calibrated)
good = convert_pt2e(calibrated)
errors = {
    name: (m(*x) - reference).abs().max().item()
    for name, m in [("uncalibrated", garbage), ("calibrated", good)]
}
print({name: f"{error:.4f}" for name, error in errors.items()})
assert errors["calibrated"] < errors["uncalibrated"] / 10, "calibration fits the scales"

# %%
# RuntimeError: Node shared_1 target shared references nonexistent attribute shared
# ---------------------------------------------------------------------------------
# torchao's ``constant_fold`` (``convert_pt2e`` uses it to fold weights into int8 constants)
# fails on a graph where two ``get_attr`` nodes read the same attribute and only one of them
# becomes dead: it deletes the attribute while the other node still reads it
# (`pytorch/ao#4420 <https://github.com/pytorch/ao/issues/4420>`_). Such graphs come from graph
# edits and other compilers' passes.

from torchao.quantization.pt2e.constant_fold import constant_fold


def two_reads_of_one_buffer() -> torch.fx.GraphModule:
    root = nn.Module()
    root.register_buffer("shared", torch.arange(4.0))
    graph = torch.fx.Graph()
    inp = graph.placeholder("x")
    folded = graph.call_function(torch.ops.aten.mul.Tensor, (graph.get_attr("shared"), 2.0))
    live = graph.call_function(torch.ops.aten.add.Tensor, (inp, graph.get_attr("shared")))
    graph.output((folded, live))
    return torch.fx.GraphModule(root, graph)


with expect_error(RuntimeError, match="references nonexistent attribute shared"):
    constant_fold(two_reads_of_one_buffer())

# %%
# **Fix** until torchao fixes it: make the graph read each attribute once before folding
# (redirect the users of every duplicate ``get_attr`` to the first one). Explained in
# :ref:`M00-4 · Editing graphs <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`.

gm = two_reads_of_one_buffer()
first = {}
for node in list(gm.graph.find_nodes(op="get_attr")):
    if node.target in first:
        node.replace_all_uses_with(first[node.target])
        gm.graph.erase_node(node)
    else:
        first[node.target] = node
gm.recompile()
constant_fold(gm)
doubled, added = gm(torch.ones(4))
assert torch.equal(doubled, torch.arange(4.0) * 2) and torch.equal(added, torch.arange(4.0) + 1)

# %%
# Dynamic int8 language model outputs only zeros after convert_pt2e
# -----------------------------------------------------------------
# M08's decoder, quantized for XNNPACK with dynamic int8 activations (``is_dynamic=True``:
# each activation's scale is measured at run time), converted straight after ``prepare_pt2e``
# because "dynamic quantization needs no calibration". Nothing raises; ``convert_pt2e`` warns
# once per weight (the warning of the entry above, 29 times, easy to scroll past). Every logit
# is exactly 0.0: each next character is equally likely, the perplexity is the size of the
# vocabulary, and greedy generation writes ``VOCAB[0]``, a line break, again and again.

from common.language_model import (
    MAX_LEN,
    VOCAB,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    train_decoder,
)

decoder, _ = train_decoder()  # trained once per stack, then loaded from the course's cache
dynamic = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
prompt = (encode("The import")[None], torch.arange(10))
LENGTH = torch.export.Dim("length", min=1, max=MAX_LEN)  # as export_decoder declares it
DQ_CHANNEL = torch.ops.quantized_decomposed.dequantize_per_channel.default


def dynamic_prepared() -> torch.fx.GraphModule:
    """The decoder exported for prefill and decode, prepared for dynamic int8 on XNNPACK."""
    return prepare_pt2e(export_decoder(decoder).module(), xnnpack_quantizer().set_global(dynamic))


never_run = dynamic_prepared()
observers = [m for name, m in never_run.named_modules() if "activation_post_process" in name]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    zeros = convert_pt2e(never_run)
with torch.no_grad():
    logits = zeros(*prompt)
text = generate(zeros, "The import statement", 20)
uniform = perplexity(zeros, windows=1)
print(f"{len(caught)} warnings; largest |logit| {logits.abs().max().item()}")
print(f"perplexity {uniform:.2f} (vocabulary: {len(VOCAB)} characters); generated {text!r}")
assert torch.equal(logits, torch.zeros_like(logits)), "every logit is 0.0"
assert abs(uniform - len(VOCAB)) < 1e-3 and text == VOCAB[0] * 20, "uniform: no prediction"

# %%
# **Cause**: dynamic quantization measures the *activations* at run time, but the *weights*
# still get their scales from observers (``PerChannelMinMaxObserver``, one per linear), and an
# observer sees its weight only when the prepared model runs. Never run, each holds no
# minimum (``tensor([])``) and returns its default scale, 1.0: every weight is rounded to a
# whole number, and this model's weights, all smaller than 0.5, round to 0. So does the
# output linear's, and with no bias the logits are 0. The same trap on a one-layer model, with
# the scales printed, is in :ref:`Troubleshooting: ExecuTorch and XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`.

weights = [m for m in observers if type(m).__name__ == "PerChannelMinMaxObserver"]
int8_weights = [
    getattr(zeros, n.args[0].target)
    for n in zeros.graph.find_nodes(op="call_function", target=DQ_CHANNEL)
]
largest = max(m.weight.abs().max().item() for m in decoder.modules() if isinstance(m, nn.Linear))
print(f"{len(weights)} weight observers, min_val {weights[0].min_val}; largest |w| {largest:.3f}")
assert all(m.min_val.numel() == 0 for m in weights), "no weight observer ever ran"
assert len(caught) == len(weights), "one warning per weight"
assert largest < 0.5 and not any(w.count_nonzero() for w in int8_weights), "every weight is 0"

# %%
# **Fix**: one calibration call, on any prompt, between ``prepare_pt2e`` and ``convert_pt2e``:
# it runs every weight observer (the activations' scales are still measured at run time). The
# perplexity is then back within 1 % of the float model's, on the same held-out windows.
# The three ways of quantizing this decoder, calibration included, are
# :ref:`M08-2 · Quantized three ways
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`.

calibrated = dynamic_prepared()
with torch.no_grad():
    calibrated(*prompt)  # one call: any prompt will do
int8_decoder = convert_pt2e(calibrated)
scores = {"float": perplexity(decoder, windows=5), "int8": perplexity(int8_decoder, windows=5)}
print({name: f"{score:.3f}" for name, score in scores.items()})
with torch.no_grad():
    assert int8_decoder(*prompt).abs().max() > 1, "real logits again"
assert scores["int8"] < scores["float"] * 1.01, "within 1 % of the float perplexity"

# %%
# KV cache not updated after convert_pt2e (buffers_to_mutate is empty)
# --------------------------------------------------------------------
# Reported as `pytorch/ao#4138 <https://github.com/pytorch/ao/issues/4138>`_: a model that
# writes a buffer in place (a KV cache) goes through ``prepare_pt2e`` and ``convert_pt2e``,
# and the re-exported program's ``graph_signature.buffers_to_mutate`` is empty: the cache
# looks lost. Checked on the converted decoder of the entry above: export's signature lists
# no mutated buffer, for the float program (``export_decoder``) as for the int8 one.

reset_cache(int8_decoder)
with torch.no_grad():
    reexported = torch.export.export(
        int8_decoder, prompt, dynamic_shapes=({1: LENGTH}, {0: LENGTH})
    )
signatures = {
    "float": dict(export_decoder(decoder).graph_signature.buffers_to_mutate),
    "int8": dict(reexported.graph_signature.buffers_to_mutate),
}
print(f"buffers_to_mutate: {signatures}")
assert signatures == {"float": {}, "int8": {}}, "empty in both signatures"

# %%
# **Cause**: nothing is lost on torch 2.13 / torchao 0.18. ``torch.export`` returns the
# *training IR*, which keeps in-place ops as they are: the graph still calls
# ``aten.index_copy_`` on each cache, and only a functional graph lists the buffers it
# writes. The converted model's ``index_copy_`` writes the cache buffer itself, not a
# dequantized copy of it, and a call of the converted model fills the cache.

writes = reexported.graph.find_nodes(op="call_function", target=torch.ops.aten.index_copy_.default)
targets = reexported.graph_signature.inputs_to_buffers
assert all(n.args[0].name in targets for n in writes), "each writes a buffer, not a copy"
written = sorted(targets[n.args[0].name] for n in writes)
print(f"{len(writes)} index_copy_ nodes write {written[:2]} ...")
reset_cache(int8_decoder)
with torch.no_grad():
    int8_decoder(*prompt)
caches = {n: b for n, b in int8_decoder.named_buffers() if n.endswith(("k_cache", "v_cache"))}
assert len(caches) == 8 and sorted(caches) == written, "each of the 8 caches is written in place"
assert all(
    b[:, :, :10].count_nonzero() and not b[:, :, 10:].count_nonzero() for b in caches.values()
)

# %%
# **Fix**: look at the functional graph: ``run_decompositions()`` (which ``to_edge`` runs
# too) turns each ``index_copy_`` into an ``index_put`` whose result the signature writes back
# to its buffer, and ``buffers_to_mutate`` lists all 8 caches. The two upstream fixes are both
# in torchao 0.18: constant folding no longer folds the input of a ``copy_`` or ``put_`` op
# (`pytorch/ao#4181 <https://github.com/pytorch/ao/pull/4181>`_), and ``prepare_pt2e`` no
# longer inserts an observer on the buffer such an op writes
# (`pytorch/ao#4466 <https://github.com/pytorch/ao/pull/4466>`_). On an older torchao, with a
# quantizer that annotates the cache write (ExecuTorch's ``TOSAQuantizer`` in the report), the
# buffer was folded into a constant (``_frozen_param0``) or the op wrote a dequantized
# temporary instead of the buffer, and the re-exported program had no buffer mutation: the
# cache really stayed empty. Upgrade to torchao 0.18. The cache through
# export is :ref:`M08-1 · A decoder and its KV cache
# <sphx_glr_lessons_m08_language_model_m08_1_a_decoder_and_its_cache.py>`.

functional = reexported.run_decompositions().graph_signature.buffers_to_mutate
first = next(iter(functional.items()))
print(f"after run_decompositions(): {len(functional)} buffers to mutate, the first {first}")
assert sorted(functional.values()) == sorted(caches), "all 8 caches are written back"

# %%
# AssertionError: Expecting input size at 1 dimension: 344 to be divisible by block_size
# --------------------------------------------------------------------------------------
# torchao's ``quantize_`` with ExecuTorch's 8da4w recipe (``Int8DynamicActivationIntxWeightConfig``:
# int8 activations, int4 weights in groups of 32 along each row) on a decoder whose SwiGLU is 344
# wide instead of M08's 352: ``feed_forward.w2`` reads 344 features, which groups of 32 do not
# divide (344 = 10 × 32 + 24). An untrained decoder is enough: the shapes fail, not the values.

from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
from torchao.quantization.granularity import PerAxis, PerGroup

from common.language_model import Decoder

INT4_GROUPS = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int4, weight_granularity=PerGroup(32)
)


def float_linears(model: nn.Module) -> list[str]:
    """The linears whose weight ``quantize_`` left a plain float ``Parameter``."""
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and type(m.weight) is nn.Parameter
    ]


with expect_error(AssertionError, match="344 to be divisible by block_size"):
    quantize_(Decoder(hidden=344), INT4_GROUPS)

# %%
# **Cause**: a group takes ``group_size`` consecutive input features of one output row and
# shares one scale, so every linear's ``in_features`` must be a multiple of it. The group size
# that divides every width here, ``math.gcd`` of them all, is 8, but XNNPACK delegates int4
# groups only in multiples of 32 (``node_visitor.py``: "Delegation to XNNPACK requires
# group_size to be a multiple of 32"), and int4 per channel is one group of 344, which it
# refuses too; the one linear below shows it.

import math

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

widths = {m.in_features for m in Decoder(hidden=344).modules() if isinstance(m, nn.Linear)}
print(f"in_features: {sorted(widths)}; gcd {math.gcd(*widths)}")
one = nn.Sequential(nn.Linear(344, 128, bias=False)).eval()
quantize_(
    one,
    Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerAxis(0)),
)
with expect_error(AssertionError, match="requires group_size to be a multiple of 32"):
    program = torch.export.export(one, (torch.randn(1, 344),))
    to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
assert math.gcd(*widths) == 8, "no group size both divides 344 and is a multiple of 32"

# %%
# **Fix**: int4 in groups of 32 where the width allows, and int8 weights, one scale per
# output channel (``PerAxis(0)``, 8da8w), for the linears it does not; XNNPACK runs both
# (``QB4W`` and ``QC8W`` GEMMs). Or give the model widths that are multiples of 32, as M08's
# 352. Both recipes side by side are
# :ref:`M08-2 · Quantized three ways
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`.

INT8_PER_CHANNEL = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int8, weight_granularity=PerAxis(0)
)
mixed = Decoder(hidden=344).eval()
quantize_(mixed, INT4_GROUPS, filter_fn=lambda m, fqn: getattr(m, "in_features", 1) % 32 == 0)
still_float = float_linears(mixed)
quantize_(mixed, INT8_PER_CHANNEL, filter_fn=lambda m, fqn: fqn in still_float)
print(f"linears left float: {float_linears(mixed)}")
assert not float_linears(mixed), "every linear quantized"

# %%
# 8da4w model is larger than expected: some linears stayed float
# --------------------------------------------------------------
# ExecuTorch's LLM recipe (``examples/models/llama/source_transformation/quantize.py``,
# qmode ``"8da4w"``) raises nothing on the same decoder: its ``filter_fn`` quantizes a linear
# only when ``m.weight.shape[1] % group_size == 0`` and skips the rest without a word
# (`pytorch/executorch#22044 <https://github.com/pytorch/executorch/issues/22044>`_). Each
# block's ``w2`` stays float, at 4 bytes a weight instead of half a byte. (The newer
# ``executorch/extension/llm/export/quantize.py`` raises instead, unless
# ``skip_incompatible_shapes=True``, which prints "Skipping ...".)

from common.kernels import native_stderr_silenced

with native_stderr_silenced():  # pytorch_tokenizers, imported with it, logs a C++ line to stderr
    from executorch.examples.models.llama.source_transformation.quantize import quantize

recipe = quantize(Decoder(hidden=344).eval(), "8da4w", group_size=32)
left = float_linears(recipe)
linears = [m for m in recipe.modules() if isinstance(m, nn.Linear)]
float_count = sum(m.weight.numel() for name, m in recipe.named_modules() if name in left)
int4_count = sum(m.weight.numel() for m in linears) - float_count
print(f"left float: {left}")
print(
    f"{float_count:,} float weights: {float_count * 4 / 1e3:.0f} kB; "
    f"{int4_count:,} int4 weights: {int4_count / 2 / 1e3:.0f} kB"
)
assert left == [f"layers.{i}.feed_forward.w2" for i in range(4)], "each block's w2, silently"
assert float_count * 4 > int4_count / 2, "the float quarter outweighs all the int4 weights"

# %%
# **Fix**: after the recipe, list what it left float (``float_linears`` above) and quantize
# those linears with int8 per-channel weights, as the entry above does; check that none is
# left. What ExecuTorch's recipe quantizes, and which linears it must skip, is
# :ref:`M08-2 · Quantized three ways
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`; the ``.pte`` and its
# size, :ref:`M08-3 · To a phone <sphx_glr_lessons_m08_language_model_m08_3_to_a_phone.py>`.

quantize_(recipe, INT8_PER_CHANNEL, filter_fn=lambda m, fqn: fqn in left)
print(f"linears left float: {float_linears(recipe)}")
assert not float_linears(recipe), "no nn.Linear left float"

# %%
# Next
# ----
# :ref:`Troubleshooting: lowering and speed
# <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`.
