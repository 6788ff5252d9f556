"""
Troubleshooting: the migration map, torch.ao → torchao → ExecuTorch
===================================================================

PT2E quantization started in ``torch.ao.quantization``, moved to torchao, and its edge
quantizers moved on to ExecuTorch. Tutorials, answers and older code still import from the
old homes. This page is the map: for every API a reader meets, the old import, what it does
on this site's stack (torch 2.13, torchao 0.18, executorch 1.5.1), and the new one. Both are
executed: the map below runs every row, and each entry reproduces the old import's error (or
its silent trap), asserts the new import at work, and links to the lesson that uses it. Most
old imports fail loudly; three still import and do something else, which is worse. The last
entry is a model quantized with the old eager API, which export refuses.

**Prerequisites**: none; each entry links to the lesson that explains it.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``common.migration`` holds the map's rows (``MOVES``): each an API, its old import, what
# that import does here (``""``: it still imports), its new import, and the lesson. A test of
# the course runs the same rows. ``old_import`` runs a row's old import and prints it with
# what it did (an ``ImportError`` without the file path that ends its message, which differs
# between installations).

import copy
import dataclasses
import logging
import warnings
from importlib import metadata

import torch
from torch import nn

from common.migration import MOVES, attempt, move
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet
from common.viz import draw

quiet()

x = example_inputs(8)
qd = torch.ops.quantized_decomposed


def old_import(api: str) -> str:
    """Run the old import of ``api``'s row; print it and what it did. Returns the error."""
    statement = move(api).old
    _, error = attempt(statement)
    print(f"{statement}\n  → {error or 'imports'}")
    return error


# %%
# The map
# -------
# Every row, run here: its old import, then its new one, each followed by what it did
# ("imports", or the error's first line). The entries below take them one by one.

for row in MOVES:
    _, old = attempt(row.old)
    _, new = attempt(row.new)
    print(f"{row.api}\n  old: {row.old}\n    → {old or 'imports'}")
    print(f"  new: {row.new}\n    → {new or 'imports'}\n")
    assert old == row.old_result and new == "", f"{row.api}: not what the map says"

# %%
# export_for_training and capture_pre_autograd_graph
# --------------------------------------------------
# PT2E tutorials of 2023–2025 capture the graph with
# ``torch._export.capture_pre_autograd_graph``, then with ``torch.export.export_for_training``.
# torch 2.13 has neither.

error = old_import("export_for_training")
assert error == "ImportError: cannot import name 'export_for_training' from 'torch.export'"
error = old_import("capture_pre_autograd_graph")
assert error == "ImportError: cannot import name 'capture_pre_autograd_graph' from 'torch._export'"

# %%
# **Fix**: ``torch.export.export``; its ``.module()`` is the graph ``prepare_pt2e`` takes,
# and it computes what the model does. Explained in
# :ref:`M00-1 · Getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.

from torch.export import export

model = get_model("small_cnn")
graph = export(model, x).module()
assert torch.equal(graph(*x), model(*x)), "the exported graph computes the model's output"

# %%
# X86InductorQuantizer
# --------------------
# Every quantizer under ``torch.ao.quantization.quantizer`` went with the package:

error = old_import("X86InductorQuantizer")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"

# %%
# **Fix**: the same names in torchao, one level deeper, under ``pt2e``. Explained in
# :ref:`M03-1 · The lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`.

from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

config = get_default_x86_inductor_quantization_config()
quantizer = X86InductorQuantizer().set_global(config)
assert type(quantizer).__module__.startswith("torchao."), "torchao's quantizer"

# %%
# prepare_pt2e, convert_pt2e and prepare_qat_pt2e
# -----------------------------------------------
# The three entry points lived in ``torch.ao.quantization.quantize_pt2e``, which torch 2.13
# no longer has.

error = old_import("prepare_pt2e, convert_pt2e, prepare_qat_pt2e")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantize_pt2e'"

# %%
# **Fix**: import them from the module ``torchao.quantization.pt2e.quantize_pt2e``: the
# package ``torchao.quantization.pt2e`` above it does not re-export them (an
# ``ImportError`` for the shorter path). With the quantizer of the previous entry, the flow
# quantizes. Explained in :ref:`M01-1 · The PT2E flow end to end
# <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`.

import torchao.quantization.pt2e
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

assert not hasattr(torchao.quantization.pt2e, "prepare_pt2e"), "not in the package itself"
prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), quantizer)
calibrate(prepared)
converted = convert_pt2e(prepared)
quantize_count = op_counts(converted)["quantize_per_tensor.default"]
print(f"quantize nodes after convert_pt2e: {quantize_count}")
assert quantize_count > 0, "torchao's prepare and convert quantize"

# %%
# QuantizationSpec, QuantizationAnnotation and Quantizer
# ------------------------------------------------------
# A quantizer written for ``torch.ao`` (M02-4's kind) imports its building blocks from
# ``torch.ao.quantization.quantizer``, gone:

error = old_import("QuantizationSpec, QuantizationAnnotation, Quantizer")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"

# %%
# **Fix**: ``torchao.quantization.pt2e.quantizer`` has them all; the x86 quantizer's own
# specs are of these classes. Explained in
# :ref:`M02-1 · What a quantizer writes
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`.

from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
)

assert isinstance(config.input_activation, QuantizationSpec), "the x86 config's specs"
assert isinstance(quantizer, Quantizer), "the x86 quantizer's base class"
annotations = [n.meta.get("quantization_annotation") for n in prepared.graph.nodes]
assert any(isinstance(a, QuantizationAnnotation) for a in annotations), "its annotations"

# %%
# MinMaxObserver, HistogramObserver and PerChannelMinMaxObserver
# --------------------------------------------------------------
# The trap of the map: ``torch.ao.quantization.observer`` still imports, without a warning,
# but its classes are not torchao's, and torchao's ``convert_pt2e`` recognises only its own.
# Swap torch.ao's ``HistogramObserver`` into the x86 config's activation specs: no error
# anywhere, the activation observers (highlighted) stay in the converted graph, and only the
# weight (torchao's observer) is quantized.

names, _ = attempt(move("MinMaxObserver, HistogramObserver, PerChannelMinMaxObserver").old)
OldHistogram = names["HistogramObserver"]
old_spec = dataclasses.replace(config.input_activation, observer_or_fake_quant_ctr=OldHistogram)
mixed = dataclasses.replace(config, input_activation=old_spec, output_activation=old_spec)
old_prepared = prepare_pt2e(
    export_module(get_model("conv_relu"), x), X86InductorQuantizer().set_global(mixed)
)
calibrate(old_prepared)
old_converted = convert_pt2e(old_prepared)
left = [n.name for n in old_converted.graph.nodes if "activation_post_process" in n.name]
draw(old_converted, highlight=left, title="torch.ao observers: still there after convert")
weights = old_converted.graph.find_nodes(
    op="call_function", target=qd.dequantize_per_channel.default
)
quantize_count = op_counts(old_converted)["quantize_per_tensor.default"]
print(f"observers left: {left}; quantize nodes: {quantize_count}")
assert left and quantize_count == 0, "activations not quantized, no error"
assert len(weights) == 1, "the weight, observed by torchao's observer, is int8"

# %%
# **Fix**: torchao's observers, from ``torchao.quantization.pt2e.observer`` (also exported by
# ``torchao.quantization.pt2e``); the same swap then quantizes. Explained in
# :ref:`M01-3 · How an observer turns statistics into scale and zero point
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`.

from torchao.quantization.pt2e.observer import (
    HistogramObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
)

new_classes = (HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver)
assert all(names[c.__name__] is not c for c in new_classes), "three other classes"
assert not issubclass(OldHistogram, HistogramObserver), "not even a subclass"
new_spec = dataclasses.replace(old_spec, observer_or_fake_quant_ctr=MinMaxObserver)
fixed = dataclasses.replace(config, input_activation=new_spec, output_activation=new_spec)
new_prepared = prepare_pt2e(
    export_module(get_model("conv_relu"), x), X86InductorQuantizer().set_global(fixed)
)
calibrate(new_prepared)
assert op_counts(convert_pt2e(new_prepared))["quantize_per_tensor.default"] > 0, (
    "torchao's observers: quantized"
)

# %%
# lower_pt2e_quantized_to_x86
# ---------------------------
# The x86 lowering (q/dq groups → oneDNN int8 ops) was added to ``torch.ao.quantization.pt2e``
# and moved with it:

error = old_import("lower_pt2e_quantized_to_x86")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.pt2e'"

# %%
# **Fix**: ``torchao.quantization.pt2e.lowering``. Explained in
# :ref:`M03-1 · The lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`.

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86

lowered = lower_pt2e_quantized_to_x86(converted, x)
onednn = [str(n.target) for n in lowered.graph.nodes if "onednn" in str(n.target)]
print(onednn)
assert onednn, "oneDNN int8 ops in the lowered graph"

# %%
# The numeric debugger
# --------------------
# ``generate_numeric_debug_handle`` and its three companions were exported by
# ``torch.ao.quantization``; the names are gone from it (the package itself still exists, for
# eager and FX quantization):

error = old_import("numeric debugger")
assert error == (
    "ImportError: cannot import name 'generate_numeric_debug_handle' from 'torch.ao.quantization'"
)

# %%
# **Fix**: the four are in ``torchao.quantization.pt2e``. Here, the SQNR of every node of
# the conv_relu model, int8 against float. Explained in
# :ref:`M04-1 · Measuring the error
# <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`.

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)

program = export(get_model("conv_relu"), x)
generate_numeric_debug_handle(program)
marked = program.module()
int8 = prepare_pt2e(copy.deepcopy(marked), quantizer)
calibrate(int8)
logged = {
    "fp32": prepare_for_propagation_comparison(marked),
    "int8": prepare_for_propagation_comparison(convert_pt2e(int8)),
}
for m in logged.values():
    m(*x)
results = compare_results(*(extract_results_from_loggers(m) for m in logged.values()))
sqnrs = {info.name: round(s.results[0].sqnr.item(), 1) for info, s in results.items()}
print(f"SQNR (dB): {sqnrs}")
assert sqnrs and min(sqnrs.values()) > 20, "every compared node above 20 dB"

# %%
# move_exported_model_to_eval and move_exported_model_to_train
# ------------------------------------------------------------
# An exported graph refuses ``.eval()`` (:ref:`accuracy and QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`); the functions that switch
# it were exported by ``torch.ao.quantization``:

error = old_import("move_exported_model_to_eval, move_exported_model_to_train")
assert error == (
    "ImportError: cannot import name 'move_exported_model_to_eval' from 'torch.ao.quantization'"
)

# %%
# **Fix**: both are in ``torchao.quantization.pt2e``. A dropout exported in training mode
# drops half its inputs at random; after ``move_exported_model_to_eval`` it passes them all,
# as the eval-mode model does. Explained in
# :ref:`M04-3 · QAT <sphx_glr_lessons_m04_accuracy_m04_3_qat.py>`.

from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train

torch.manual_seed(0)
dropout = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5))
rows = (torch.randn(4, 16),)
in_training = export(dropout, rows).module()
assert not torch.equal(in_training(*rows), dropout.eval()(*rows)), "training: it drops"
move_exported_model_to_eval(in_training)
assert torch.equal(in_training(*rows), dropout(*rows)), "eval: what the eval model computes"
move_exported_model_to_train(in_training)
assert not torch.equal(in_training(*rows), dropout(*rows)), "and back to training"

# %%
# disable_observer
# ----------------
# After QAT, ``model.apply(disable_observer)`` freezes the scales (M04-3). With
# ``torch.ao.quantization.disable_observer`` — which still imports — it freezes nothing: it
# tests ``isinstance(module, torch.ao.quantization.FakeQuantizeBase)``, and torchao's fake
# quantizers are another class. No error, and every observer stays on.

names, _ = attempt(move("disable_observer").old)
qat_config = get_default_x86_inductor_quantization_config(is_qat=True)
qat = prepare_qat_pt2e(
    export(get_model("small_cnn"), x).module(), X86InductorQuantizer().set_global(qat_config)
)
qat(*x)
fake_quants = [m for m in qat.modules() if hasattr(m, "observer_enabled")]
qat.apply(names["disable_observer"])
print(f"after torch.ao's disable_observer: {[int(m.observer_enabled) for m in fake_quants]}")
assert all(m.observer_enabled for m in fake_quants), "nothing disabled, silently"

# %%
# **Fix**: torchao's ``disable_observer`` (in ``torchao.quantization.pt2e``, and in its
# ``fake_quantize`` module). Explained in
# :ref:`M04-3 · QAT <sphx_glr_lessons_m04_accuracy_m04_3_qat.py>`.

from torchao.quantization.pt2e import disable_observer

qat.apply(disable_observer)
print(f"after torchao's disable_observer:  {[int(m.observer_enabled) for m in fake_quants]}")
assert not any(m.observer_enabled for m in fake_quants), "every observer off"

# %%
# XNNPACKQuantizer
# ----------------
# The edge quantizer took two steps. ``torch.ao.quantization.quantizer.xnnpack_quantizer`` is
# gone; torchao kept a copy only for its own tests, in the private
# ``torchao.testing.pt2e._xnnpack_quantizer``, which imports and then warns when constructed.

error = old_import("XNNPACKQuantizer (torch.ao)")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"
names, _ = attempt(move("XNNPACKQuantizer (torchao)").old)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    names["XNNPACKQuantizer"]()
print(f"torchao's copy: {caught[0].category.__name__}: {caught[0].message}")
assert str(caught[0].message) == "XNNPACKQuantizer is deprecated!"

# %%
# **Fix**: ExecuTorch's, which its XNNPACK partitioner is written for; a different class from
# torchao's copy. Explained in
# :ref:`M06-1 · The XNNPACK quantizer
# <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`.

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

assert XNNPACKQuantizer is not names["XNNPACKQuantizer"], "not torchao's copy"
xnnpack = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
edge_prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), xnnpack)
calibrate(edge_prepared)
assert op_counts(convert_pt2e(edge_prepared))["quantize_per_tensor.default"] > 0, (
    "ExecuTorch's quantizer quantizes"
)

# %%
# DEPRECATION WARNING: You are using the deprecated \'to_edge() + to_backend()\' workflow.
# ----------------------------------------------------------------------------------------
# ExecuTorch scripts of the torch 2.3 era lower in two calls, ``to_edge(program)`` then
# ``.to_backend(partitioner)``. Both still import and run; XNNPACK's partitioner then logs
# this line (through ``logging``, on stderr), which goes on: "Please consider migrating to
# 'to_edge_transform_and_lower()' for better error handling and optimization."

assert old_import("to_edge, to_backend") == "", "it still imports"
names, _ = attempt(move("to_edge, to_backend").old)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner


def partitioner_log(lower) -> list[str]:
    """Run ``lower()``; return what XNNPACK's partitioner logged meanwhile (kept off the page)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        lower()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return [record.getMessage().strip() for record in records]


two_calls = partitioner_log(
    lambda: names["to_edge"](export(get_model("conv_relu"), x)).to_backend(XnnpackPartitioner())
)
print(two_calls[0])
assert two_calls[0].startswith(
    "DEPRECATION WARNING: You are using the deprecated 'to_edge() + to_backend()' workflow."
)

# %%
# **Fix**: one call, ``to_edge_transform_and_lower(program, partitioner=[...])``: it runs the
# partitioner's own transforms before ExecuTorch decomposes the graph, then delegates. No
# warning, and the whole program is one delegate. Explained in
# :ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`.

from executorch.exir import to_edge_transform_and_lower

lowered_once = []
one_call = partitioner_log(
    lambda: lowered_once.append(
        to_edge_transform_and_lower(
            export(get_model("conv_relu"), x), partitioner=[XnnpackPartitioner()]
        )
    )
)
graph_nodes = lowered_once[0].exported_program().graph.nodes
outside = {str(n.target) for n in graph_nodes if n.op == "call_function"}
print(f"logged: {one_call or 'nothing'}; outside the delegate: {sorted(outside)}")
assert not one_call and outside == {"executorch_call_delegate", "<built-in function getitem>"}

# %%
# OpenVINOQuantizer
# -----------------
# PyTorch's OpenVINO tutorial imports ``OpenVINOQuantizer`` from NNCF. NNCF 3.4 no longer has
# it there: the quantizer moved into ExecuTorch's OpenVINO backend, and NNCF keeps the
# algorithms it calls. Neither torch, torchao nor ExecuTorch installs the ``nncf`` and
# ``openvino`` packages that both homes need; this site's build has them:

print({name: metadata.version(name) for name in move("OpenVINOQuantizer").needs})
error = old_import("OpenVINOQuantizer")
assert error == (
    "ImportError: cannot import name 'OpenVINOQuantizer' from 'nncf.experimental.torch.fx'"
)

# %%
# **Fix**: ExecuTorch's, from ``executorch.backends.openvino.quantizer``. It is a PT2E
# ``Quantizer`` like the x86 one (torchao's base class, torchao's ``prepare_pt2e``), with
# annotations of its own, set beside the x86, XNNPACK and Arm ones in
# :ref:`M07-3 · One graph, every quantizer that runs here
# <sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py>`.

from executorch.backends.openvino.quantizer import OpenVINOQuantizer

assert issubclass(OpenVINOQuantizer, Quantizer), "torchao's Quantizer"
openvino_prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), OpenVINOQuantizer())
calibrate(openvino_prepared)
assert op_counts(convert_pt2e(openvino_prepared))["quantize_per_tensor.default"] > 0, "it quantizes"

# %%
# DeprecationWarning: torch.ao.quantization is deprecated and will be removed in 2.10.
# -------------------------------------------------------------------------------------
# Eager mode (``quantize_dynamic``) and FX graph mode (``prepare_fx``, ``convert_fx``) are
# still in torch 2.13, and still import; calling them warns, with a release number already
# past (the FX functions carry the same warning, in their ``__deprecated__``). The warning
# goes on: eager users should move to torchao's ``quantize_``, FX users to PT2E.

names, _ = attempt(move("quantize_dynamic (eager mode)").old)
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    names["quantize_dynamic"](mlp, {nn.Linear}, dtype=torch.qint8)
deprecations = {str(w.message).splitlines()[0].strip() for w in caught}
print(deprecations & {"torch.ao.quantization is deprecated and will be removed in 2.10."})
assert "torch.ao.quantization is deprecated and will be removed in 2.10." in deprecations
assert torch.__version__ >= "2.10", "torch 2.13: past the release named for the removal"
fx, _ = attempt(move("prepare_fx, convert_fx (FX graph mode)").old)
assert all(
    fx[name].__deprecated__.startswith("torch.ao.quantization is deprecated")
    for name in ("prepare_fx", "convert_fx")
), "FX graph mode: the same warning"

# %%
# **Fix**: in eager mode, ``quantize_`` with a torchao config swaps each linear's weight for
# an int8 tensor; for a graph, the PT2E flow of this course. Which to choose, measured:
# :ref:`M05-4 · PT2E or quantize_()?
# <sphx_glr_lessons_m05_transformers_m05_4_pt2e_or_quantize.py>`.

from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

eager = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
eager.load_state_dict(mlp.state_dict())
quantize_(eager, Int8DynamicActivationInt8WeightConfig())
tokens = torch.randn(16, 64)
print(f"weight: {type(eager[0].weight).__name__}")
torch.testing.assert_close(eager(tokens), mlp(tokens), atol=0.05, rtol=0)  # int8 rounding

# %%
# Not like for like: ``quantize_dynamic`` runs torch.ao's ``quantized::linear_dynamic``, with
# one activation scale per tensor, and quantizes ``nn.LSTM`` and ``nn.GRU`` too;
# ``Int8DynamicActivationInt8WeightConfig`` takes a scale per token (M05-4) and quantizes
# linears only. An LSTM stays float under ``quantize_``:


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(16, 32, batch_first=True), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the deprecation of this entry
    old_tagger = names["quantize_dynamic"](Tagger().eval(), {nn.LSTM, nn.Linear}, torch.qint8)
new_tagger = Tagger().eval()
quantize_(new_tagger, Int8DynamicActivationInt8WeightConfig())
print(f"quantize_dynamic: {type(old_tagger.rnn).__module__}.{type(old_tagger.rnn).__name__}")
print(f"quantize_: {type(new_tagger.rnn).__name__}, {type(new_tagger.head.weight).__name__}")
assert type(old_tagger.rnn).__module__.startswith("torch.ao.nn.quantized.dynamic"), "int8 LSTM"
assert type(new_tagger.rnn) is nn.LSTM and not hasattr(new_tagger.rnn.weight_ih_l0, "qdata")
assert hasattr(new_tagger.head.weight, "qdata"), "the linear only"

# %%
# AttributeError: __torch__.torch.classes.quantized.LinearPackedParamsBase (of Python compilation unit at: 0) does not have a field with name \'__obj_flatten__\'
# ---------------------------------------------------------------------------------------------------------------------------------------------------------------
# A model quantized with torch.ao's eager API runs, and ``torch.export`` refuses it: exported
# non-strict (the default) with this error, strict with ``torch._dynamo``'s ``Unsupported:
# Failed to convert args/kwargs to proxy`` (pytorch/pytorch#137111, #140943). Here the MLP of
# the entry above, through ``quantize_dynamic``:

from common.expect import expect_error

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the deprecation of the entry above
    eager_int8 = names["quantize_dynamic"](mlp, {nn.Linear}, dtype=torch.qint8)
with expect_error(AttributeError, match="does not have a field with name '__obj_flatten__'"):
    export(eager_int8, (tokens,))
with expect_error(torch._dynamo.exc.Unsupported, match="Failed to convert args/kwargs to proxy"):
    export(eager_int8, (tokens,), strict=True)

# %%
# **Cause**: ``quantize_dynamic`` swaps each ``nn.Linear`` for torch.ao's dynamic ``Linear``,
# which keeps its int8 weight prepacked in a TorchScript object, ``LinearPackedParamsBase``,
# and hands it to ``torch.ops.quantized.linear_dynamic``. Export traces with fake tensors, so
# non-strict export must fake that object too: ``maybe_to_fake_obj``
# (``torch/_library/fake_class_registry.py``) calls its ``__obj_flatten__``, a method this
# class does not have. Strict export's Dynamo cannot put the object into the graph either.

packed = eager_int8[0]._packed_params._packed_params
print(f"{type(eager_int8[0]).__module__}.Linear holds a {packed._type().qualified_name()}")
assert isinstance(packed, torch.ScriptObject) and not hasattr(packed, "__obj_flatten__")

# %%
# **Fix**: quantize the float model with PT2E instead: export it first, then
# ``prepare_pt2e`` and ``convert_pt2e`` (here the x86 quantizer's dynamic config, int8
# activations quantized at run time, as ``quantize_dynamic`` does). The converted graph holds
# plain tensors and q/dq ops, and exports again, for ``torch.compile``, AOTInductor or
# ExecuTorch. Dynamic quantization with PT2E is
# :ref:`M05-2 · Static vs dynamic int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`.

dynamic = X86InductorQuantizer().set_global(
    get_default_x86_inductor_quantization_config(is_dynamic=True)
)
pt2e_prepared = prepare_pt2e(export(mlp, (tokens,)).module(), dynamic)
pt2e_prepared(tokens)
pt2e_int8 = convert_pt2e(pt2e_prepared)
reexported = export(pt2e_int8, (tokens,))
print(f"exported again: {op_counts(reexported.module())['choose_qparams.tensor']} choose_qparams")
assert torch.equal(reexported.module()(tokens), pt2e_int8(tokens)), "the same int8 model"
torch.testing.assert_close(pt2e_int8(tokens), mlp(tokens), atol=0.05, rtol=0)  # int8 rounding

# %%
# Next
# ----
# Back to the :ref:`first troubleshooting page
# <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`, or on to
# :ref:`M05-4 · PT2E or quantize_()?
# <sphx_glr_lessons_m05_transformers_m05_4_pt2e_or_quantize.py>`.
