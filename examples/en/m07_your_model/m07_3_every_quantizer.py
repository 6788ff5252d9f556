"""
M07-3 One graph, every quantizer that runs here
===============================================

A PT2E quantizer only writes annotations; what those say, and what can run the result,
depends on the backend it was written for. One small CNN goes through every quantizer that
imports on this machine: torchao's ``X86InductorQuantizer`` and ``ArmInductorQuantizer``,
ExecuTorch's ``XNNPACKQuantizer`` and ``OpenVINOQuantizer`` (NNCF). They agree on which ops
become int8 and disagree on everything else: uint8 or int8 activations, affine or symmetric,
per-channel or per-tensor weights, the residual add fused into a conv or an op of its own.
The course's hand-written ``prepare``/``convert`` gives torchao's exact numbers under all
four; three of the four then run int8 kernels here, and ``use_reference_representation=True``
turns the int8 q/dq ops into integer arithmetic any backend can read.

**What you will learn**

- How to read what a quantizer annotates: ops, dtype, symmetric or affine, per-channel
- Which quantizers run int8 on this machine, which only annotate, and which do not import
- What ``convert_pt2e(..., use_reference_representation=True)`` rewrites, and what it leaves

**Prerequisites**: :ref:`M07-1 · what stays float
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`, :ref:`M02-3 · convert by hand
<sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`, :ref:`M06-1 · the XNNPACK quantizer
<sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The model: a conv + BatchNorm + ReLU stem, one residual block (two convs, ``out + x``,
# ReLU), average pooling and two linears. Random weights, 16×16 images, four calibration
# batches.

import contextlib
import copy
import importlib
import inspect
import io
import os
import platform
import sys
import warnings
from collections import Counter
from importlib.metadata import version

import torch
from torch import nn

from common.coverage import coverage, side_by_side, spec_table
from common.expect import expect_error
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.arm_inductor_quantizer import (
    ArmInductorQuantizer,
    get_default_arm_inductor_quantization_config,
)

from common import handmade
from common.edge import xnnpack_quantizer

# sphinx_gallery_start_ignore
# Two kinds of noise, kept off the page and out of stderr: the C++ extension of
# pytorch_tokenizers (imported by ExecuTorch's OpenVINO package) logs a line to the process's
# stderr when it loads, and the reference rewrite warns about a deprecated pytree API.
sys.stderr.flush()
saved_stderr = os.dup(2)
with open(os.devnull, "w") as devnull:
    os.dup2(devnull.fileno(), 2)
    importlib.import_module("pytorch_tokenizers")
os.dup2(saved_stderr, 2)
os.close(saved_stderr)
warnings.filterwarnings("ignore", r"`treespec\.children_specs` is deprecated", FutureWarning)
# sphinx_gallery_end_ignore


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.conv1, self.bn1 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.relu3, self.fc2 = nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        x = torch.flatten(self.pool(self.relu2(out + x)), 1)
        return self.fc2(self.relu3(self.fc1(x)))


torch.manual_seed(0)
model = Net().eval()
images = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
calibration = [
    (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(s)),) for s in range(2, 6)
]
graph = export_module(model, images)

# %%
# ``quantize`` runs prepare, calibration and convert, torchao's passes or the course's;
# ``quantized_outputs`` lists the nodes whose output a prepared graph observes (the edges
# convert turns into q/dq).


def quantize(quantizer, *, passes=(prepare_pt2e, convert_pt2e), **convert_options):
    prepare, convert = passes
    prepared = prepare(copy.deepcopy(graph), quantizer)
    for batch in calibration:
        prepared(*batch)
    return convert(prepared, **convert_options)


def quantized_outputs(quantizer) -> set[str]:
    prepared = prepare_pt2e(copy.deepcopy(graph), quantizer)
    return {
        node.name
        for node in prepared.graph.nodes
        if node.op != "call_module"
        and any(handmade.is_observer_node(prepared, user) for user in node.users)
    }


# %%
# Step 1 — Import every quantizer
# -------------------------------
# ExecuTorch 1.5.1 ships quantizers for more backends than run here. Its Arm TOSA/Ethos-U
# quantizers and its Cortex-M quantizer import ``tosa_serializer``, a package built from
# the TOSA tools' sources and not published on PyPI: they do not import.

with expect_error(ModuleNotFoundError, match="tosa_serializer"):
    importlib.import_module("executorch.backends.arm.quantizer")
with expect_error(ModuleNotFoundError, match="tosa_serializer"):
    importlib.import_module("executorch.backends.cortex_m.quantizer.quantizer")

# %%
# ``OpenVINOQuantizer`` asks Intel's NNCF where to quantize. NNCF and the OpenVINO runtime
# are on PyPI and install beside this torch without touching it (the course pins them in its
# ``docs`` extra), so this one imports:

from executorch.backends.openvino.quantizer import OpenVINOQuantizer

print(f"torch {torch.__version__}, nncf {version('nncf')}, openvino {version('openvino')}")
assert torch.__version__.startswith("2.13.0"), "NNCF left torch as it was"

# %%
# The four, each a function that returns a new, configured quantizer:


def arm_quantizer():
    return ArmInductorQuantizer().set_global(get_default_arm_inductor_quantization_config())


quantizers = {
    "x86": x86_quantizer,
    "xnnpack": xnnpack_quantizer,
    "arm": arm_quantizer,
    "openvino": OpenVINOQuantizer,
}

# %%
# Step 2 — The same ops become int8
# ---------------------------------
# ``coverage`` (M07-1) on the same exported graph, one column per quantizer. All four make
# every conv, the residual add and both linears int8 on this model; x86 and Arm fuse the
# add into the conv before it (``conv + add`` is one int8 kernel), XNNPACK and OpenVINO
# quantize it as an op of its own.

reports = {name: coverage(graph, make()) for name, make in quantizers.items()}
print(side_by_side(*reports.values()))
for report in reports.values():
    assert report.counts() == {"conv": (3, 3), "add": (1, 1), "linear": (2, 2)}
status = {name: report["add"].status for name, report in reports.items()}
assert status == {
    "x86": "int8 fused",
    "xnnpack": "int8 static",
    "arm": "int8 fused",
    "openvino": "int8 static",
}

# %%
# Step 3 — Different int8
# -----------------------
# ``spec_table`` lists, per quantizer, the specs it gave activations and weights. x86 runs
# oneDNN kernels that take uint8 activations; XNNPACK and Arm take int8; OpenVINO's default
# mode (``INT8_SYM``) is symmetric for activations too. Only Arm quantizes weights per tensor.

print(spec_table(*reports.values()))
schemes = {name: (r.schemes("activation"), r.schemes("weight")) for name, r in reports.items()}
assert schemes == {
    "x86": (["u8 per-tensor affine"], ["s8 per-channel symmetric"]),
    "xnnpack": (["s8 per-tensor affine"], ["s8 per-channel symmetric"]),
    "arm": (["s8 per-tensor affine"], ["s8 per-tensor symmetric"]),
    "openvino": (["u8 per-tensor symmetric"], ["s8 per-channel symmetric"]),
}

# %%
# Symmetric on uint8 puts the zero point in the middle of 0…255: every OpenVINO activation
# has zero point 127, also after a ReLU, where no value is negative and the codes below 127
# go unused. Affine x86 gives a ReLU's output zero point 0. The zero points of each graph's
# ``quantize_per_tensor`` nodes:

converted = {name: quantize(make()) for name, make in quantizers.items()}
quantize_op = torch.ops.quantized_decomposed.quantize_per_tensor.default
zero_points = {
    name: sorted({n.args[2] for n in gm.graph.find_nodes(op="call_function", target=quantize_op)})
    for name, gm in converted.items()
}
print(zero_points)
assert zero_points["openvino"] == [127] and 0 in zero_points["x86"]

# %%
# Step 4 — Where the observers go
# -------------------------------
# The quantizers also differ in which outputs they quantize. OpenVINO (NNCF) quantizes the
# outputs of the ops before the ones it makes int8, x86 the inputs of its patterns. In
# OpenVINO's converted graph, highlighted: the nodes whose output OpenVINO quantizes and x86
# does not. ``conv2d_2`` is among them: under x86 its output goes straight into the fused
# add.

only_openvino = sorted(quantized_outputs(OpenVINOQuantizer()) - quantized_outputs(x86_quantizer()))
print(f"OpenVINO only: {only_openvino}")
assert "conv2d_2" in only_openvino
draw(converted["openvino"], highlight=only_openvino, title="OpenVINO: outputs x86 leaves float")

# %%
# x86's graph, the fused add highlighted: ``conv2d_2`` feeds it without a q/dq pair.

draw(converted["x86"], highlight=["conv2d_2", "add"], title="x86: conv + add, one int8 kernel")
(add,) = converted["x86"].graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor)
assert add.args[0].name == "conv2d_2", "x86: the conv's float output goes into the add"

# %%
# Step 5 — The hand-written passes, under each quantizer
# ------------------------------------------------------
# ``common.handmade`` (M02) knows none of these quantizers: it reads only their annotations.
# Under each, its prepare and convert give the same int8 model as torchao's, bit for bit.
# Beside it, how far each int8 model is from the float one (largest difference of the 10
# outputs on one batch):

for name, make in quantizers.items():
    by_hand = quantize(make(), passes=(handmade.prepare, handmade.convert))
    assert torch.equal(by_hand(*images), converted[name](*images)), f"{name}: bit-exact"
    error = (converted[name](*images) - model(*images)).abs().max().item()
    print(f"{name:9} handmade == torchao   max |int8 - fp32| = {error:.4f}")

# %%
# Step 6 — Which of them run int8 here
# ------------------------------------
# The q/dq graph runs anywhere, but it computes in float. An int8 kernel needs a backend
# that takes the graph. **x86**: torchao's lowering (M03) turns x86's graph into oneDNN int8
# ops. It finds none of its patterns in Arm's graph (int8 activations): Arm's recipe is for
# Inductor on Arm CPUs, and this machine is:

print(platform.machine())


def onednn_ops(gm) -> Counter:
    targets = (str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return Counter(t for t in targets if t.startswith("onednn."))


with torch.no_grad():
    lowered = {
        name: lower_pt2e_quantized_to_x86(copy.deepcopy(converted[name]), images)
        for name in ("x86", "arm")
    }
print({name: dict(onednn_ops(gm)) for name, gm in lowered.items()})
assert sum(onednn_ops(lowered["x86"]).values()) == 5, "3 convs (one with the add), 2 linears"
assert not onednn_ops(lowered["arm"]), "no oneDNN op in Arm's graph"
gap = (lowered["x86"](*images) - converted["x86"](*images)).abs().max()
print(f"x86 lowered vs q/dq: {gap:.2e}")

# %%
# **XNNPACK**: ExecuTorch's runtime runs its graph on XNNPACK's int8 kernels (M06), delegated
# by ``XnnpackPartitioner``:

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.runtime import Runtime

from common.edge import delegated, to_executorch

with contextlib.redirect_stderr(io.StringIO()):
    manager = to_executorch(converted["xnnpack"], images, partitioner=XnnpackPartitioner())
    program = Runtime.get().load_program(manager.buffer)  # alive while the Method runs
    (on_xnnpack,) = program.load_method("forward").execute([images[0]])
print(f"XNNPACK vs q/dq: {(on_xnnpack - converted['xnnpack'](*images)).abs().max():.2e}")
delegates = delegated(manager.exported_program())
kernels = ("aten_convolution", "aten_linear", "aten_add")
computed = [n for names in delegates.values() for n in names if n.startswith(kernels)]
print(f"{len(delegates)} XNNPACK delegate, running {len(computed)} convs, linears and adds")
assert len(computed) == 6, "every conv, linear and the add run inside XNNPACK"

# %%
# **OpenVINO**: the OpenVINO runtime converts the exported q/dq program (weights not folded,
# as ExecuTorch's OpenVINO flow passes it, ``fold_quantize=False``) and compiles it for the
# CPU. Its runtime model says in what precision each layer runs: the convolutions and the
# fully connected layers in ``u8``.

import openvino as ov

unfolded = quantize(OpenVINOQuantizer(), fold_quantize=False)
compiled = ov.Core().compile_model(ov.convert_model(torch.export.export(unfolded, images)), "CPU")
layers = [op.get_rt_info() for op in compiled.get_runtime_model().get_ordered_ops()]
precision = {
    (info["layerType"].astype(str), info["runtimePrecision"].astype(str)) for info in layers
}
print(sorted(p for p in precision if p[0] in ("Convolution", "FullyConnected")))
assert {p for p in precision if p[0] in ("Convolution", "FullyConnected")} == {
    ("Convolution", "u8"),
    ("FullyConnected", "u8"),
}, "OpenVINO runs convs and linears in u8"
on_openvino = torch.from_numpy(compiled(images[0].numpy())[0])
print(f"OpenVINO vs q/dq: {(on_openvino - unfolded(*images)).abs().max():.2e}")

# %%
# Step 7 — The reference representation
# -------------------------------------
# ``convert_pt2e(..., use_reference_representation=True)`` rewrites the patterns it knows
# into integer arithmetic in plain ``aten`` ops, for backends that read integer ops rather
# than q/dq. On XNNPACK's graph every int8 ``quantize``/``dequantize`` is written out as
# the arithmetic it does (``div``, ``round``, ``clamp``, ``to``), and the add + ReLU becomes
# int32 arithmetic (``out_dtype`` nodes). The convs and linears still compute in float on
# dequantized values, each for a reason of its own. No conv ever matches: torchao writes its
# conv pattern with ``aten.convolution``, and torch 2.13 exports ``aten.conv2d``. A linear
# matches only with per-tensor weights in −127…127, as the pattern writes them, and its output
# quantized right after it; XNNPACK's weights here are per channel.


def op_name(node) -> str:
    if "quantized_decomposed" in str(node.target):
        return "q/dq"
    return getattr(node.target, "_overloadpacket", node.target).__name__


def op_counts(gm) -> Counter:
    return Counter(op_name(n) for n in gm.graph.nodes if n.op == "call_function")


reference = quantize(xnnpack_quantizer(), use_reference_representation=True)
counts = op_counts(reference)
print(dict(counts.most_common()))
assert counts["q/dq"] == 0 and counts["out_dtype"] == 2, "int8 q/dq and the add rewritten"
assert (counts["conv2d"], counts["linear"]) == (3, 2), "convs and linears stay float ops"
pattern = importlib.import_module("torchao.quantization.pt2e.reference_representation_rewrite")
conv_pattern = inspect.getsource(pattern._qdq_quantized_conv2d)
assert "aten.convolution.default" in conv_pattern and "convolution" not in counts, "no match"
print(f"reference vs q/dq: {(reference(*images) - converted['xnnpack'](*images)).abs().max():.2e}")

# %%
# With per-tensor weights (``xnnpack_quantizer(per_channel=False)``), ``fc2``, whose output is
# quantized right after it, becomes int32 arithmetic too; ``fc1``, with its ReLU between it and
# its quantize, and the three convs stay float.

per_tensor = quantize(xnnpack_quantizer(per_channel=False), use_reference_representation=True)
tensor_counts = op_counts(per_tensor)
(float_linear,) = per_tensor.graph.find_nodes(
    op="call_function", target=torch.ops.aten.linear.default
)
print({op: tensor_counts[op] for op in ("out_dtype", "conv2d", "linear")})
assert tensor_counts["out_dtype"] > counts["out_dtype"] and tensor_counts["conv2d"] == 3
assert [u.target for u in float_linear.users] == [torch.ops.aten.relu.default], "fc1"

# %%
# Summary
# -------
# =====================  ==================  ==================  ==========================
# quantizer              activations         weights             int8 on this machine
# =====================  ==================  ==================  ==========================
# X86InductorQuantizer   u8 affine           s8 per-channel      oneDNN, after lowering
# XNNPACKQuantizer       s8 affine           s8 per-channel      ExecuTorch + XNNPACK
# ArmInductorQuantizer   s8 affine           s8 per-tensor       no: q/dq simulation only
# OpenVINOQuantizer      u8 symmetric        s8 per-channel      OpenVINO runtime, CPU
# Arm TOSA, Cortex-M     —                   —                   do not import
# =====================  ==================  ==================  ==========================
#
# The hand-written passes are bit-exact with torchao's under all four: a quantizer is only
# its annotations.
#
# Exercises
# ---------
# 1. Convert Arm's graph with ``use_reference_representation=True``. Arm's activations are
#    int8 too, and its weights per tensor: predict whether any q/dq op remains, and whether
#    any op computes in int32.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          arm = quantize(arm_quantizer(), use_reference_representation=True)
#          arm_reference = op_counts(arm)
#          print(dict(arm_reference.most_common()))
#          assert arm_reference["q/dq"] == 0, "every int8 q/dq is rewritten"
#          assert arm_reference["out_dtype"] == 0, "no int32 op"
#          # the linears: Arm's weights span -128...127, not the pattern's -127...127
#          weight = get_default_arm_inductor_quantization_config().weight
#          assert (weight.quant_min, weight.quant_max) == (-128, 127)
#          assert (arm_reference["conv2d"], arm_reference["linear"]) == (3, 2), "all float"
#          # the convs match no pattern (aten.conv2d), and the add is fused into the conv
#          # before it (x86's conv + add, which Arm's quantizer inherits): no add pattern
#
# 2. Ask OpenVINO for ``QuantizationMode.INT8_MIXED`` (``OpenVINOQuantizer(mode=...)``).
#    Predict the activation spec.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from executorch.backends.openvino.quantizer import QuantizationMode
#
#          mixed = coverage(graph, OpenVINOQuantizer(mode=QuantizationMode.INT8_MIXED))
#          print(spec_table(mixed))
#          assert mixed.schemes("activation") == ["u8 per-tensor affine"], "affine activations"
#          assert mixed.schemes("weight") == ["s8 per-channel symmetric"]
#
# 3. Give XNNPACK per-tensor weights (``xnnpack_quantizer(per_channel=False)``). Predict the
#    weight spec, and whether the hand-written passes still match torchao's.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          per_tensor = coverage(graph, xnnpack_quantizer(per_channel=False))
#          assert per_tensor.schemes("weight") == ["s8 per-tensor symmetric"]
#          by_hand = (handmade.prepare, handmade.convert)
#          mine = quantize(xnnpack_quantizer(per_channel=False), passes=by_hand)
#          theirs = quantize(xnnpack_quantizer(per_channel=False))
#          assert torch.equal(mine(*images), theirs(*images)), "still bit-exact"
#
# Further reading
# ---------------
# - `ArmInductorQuantizer source
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/arm_inductor_quantizer.py>`_
# - `OpenVINO backend for ExecuTorch
#   <https://github.com/pytorch/executorch/tree/main/backends/openvino>`_
# - `reference representation rewrite
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/reference_representation_rewrite.py>`_
#
# Next
# ----
# :ref:`M07-4 · The op atlas <sphx_glr_lessons_m07_your_model_m07_4_op_atlas.py>` takes the
# same four quantizers to more than 40 ops, one op at a time, and on to what runs each.
