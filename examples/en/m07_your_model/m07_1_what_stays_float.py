"""
M07-1 What will my quantizer leave in float?
============================================

Bring a model the course did not write and ask, op by op, what the quantizer made int8 and
what it left in float, and why. ``common.coverage`` answers from the annotations the
quantizer wrote and its own rules. On a MobileNet-style CNN, ``X86InductorQuantizer`` first
refuses the graph outright, because one activation module is called at several places; a
strict export fixes that, and then it leaves the squeeze-excitation's broadcast ``mul``
float where ExecuTorch's ``XNNPACKQuantizer`` quantizes every conv, linear, add and mul. On
``nn.TransformerEncoderLayer`` the roles turn: x86 leaves the attention's two linears, SDPA
and both residual adds float, XNNPACK only SDPA. On torchvision's architectures (four on
this page: ResNet18, MobileNetV2 and V3, a ViT; ResNet50 and EfficientNet-B0 in exercise 3) the
same rules decide: x86 refuses the ResNets' reused ``self.relu`` and leaves every
squeeze-excitation ``mul`` float. Asked for every op, not only the compute ops, the report
also says what happens between them: which activations run fused inside the int8 conv or
linear, which pooling passes int8 through, which norms and activations stay float.

**What you will learn**

- How to read, for any exported model, which compute ops a quantizer leaves float and why
- Why a reused activation module breaks ``X86InductorQuantizer`` and what fixes it
- Where the x86 and the XNNPACK quantizers differ on CNNs and on transformers
- What each of them leaves float in ResNet, MobileNet, EfficientNet and ViT
- How to read the fate of every op, activations, pooling and norms included
  (``every_op=True``)

**Prerequisites**: :ref:`M00-3 · finding patterns
<sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`, :ref:`M05-1 · what the quantizer
sees in attention <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`, :ref:`M06-1 ·
the XNNPACK quantizer <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The CNN is written the way real model code writes one, after MobileNetV3 and ResNet:
# inverted-residual blocks (1×1 expand, 3×3 depthwise conv, squeeze-excitation, 1×1
# project) with hardswish, an in-place residual add ``out += x``, adaptive pooling, and one
# ``nn.ReLU`` (``self.relu``) and one ``nn.Hardswish`` per block (``self.act``) each called at
# two places, as torchvision's ``BasicBlock`` calls its one ``self.relu`` twice.
# ``one_module_per_call=True`` builds the same model with a module per call.
# Random weights, 32×32 images.

import importlib
import inspect
import logging
import re

import torch
from torch import nn

from common.charts import display_width, pad
from common.coverage import COMPUTE_OPS, MOVING_KINDS, coverage, side_by_side
from common.expect import expect_error
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer

from common.edge import xnnpack_quantizer

images = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
tokens = (torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1)),)

# %%
# The model, in the parts torchvision's MobileNetV3 has: ``SqueezeExcite``,
# ``InvertedResidual`` and ``MobileNetish``; ``build`` makes one with fixed random weights.
# ``quantized_block`` quantizes one block alone (strictly exported, calibrated on random
# activations), for the pictures.


class SqueezeExcite(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce, self.relu = nn.Conv2d(channels, channels // 4, 1), nn.ReLU()
        self.expand, self.gate = nn.Conv2d(channels // 4, channels, 1), nn.Hardsigmoid()

    def forward(self, x):
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))


def conv_bn(cin, cout, kernel=1, *, stride=1, groups=1):
    conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout))


class InvertedResidual(nn.Module):
    def __init__(self, channels, expand, *, one_module_per_call=False):
        super().__init__()
        hidden = channels * expand
        self.expand = conv_bn(channels, hidden)
        self.depthwise = conv_bn(hidden, hidden, 3, groups=hidden)
        self.se = SqueezeExcite(hidden)
        self.project = conv_bn(hidden, channels)
        self.act = nn.Hardswish()
        self.act2 = nn.Hardswish() if one_module_per_call else None

    def forward(self, x):
        out = self.act(self.expand(x))
        out = self.se((self.act2 or self.act)(self.depthwise(out)))
        out = self.project(out)
        out += x
        return out


class MobileNetish(nn.Module):
    def __init__(self, *, one_module_per_call=False):
        super().__init__()
        self.stem, self.relu = conv_bn(3, 16, 3, stride=2), nn.ReLU()
        blocks = [InvertedResidual(16, 4, one_module_per_call=one_module_per_call) for _ in "ab"]
        self.blocks = nn.Sequential(*blocks)
        self.relu2 = nn.ReLU() if one_module_per_call else None
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Linear(16, 64), nn.Hardswish(), nn.Linear(64, 10))

    def forward(self, x):
        x = (self.relu2 or self.relu)(self.blocks(self.relu(self.stem(x))))
        return self.head(torch.flatten(self.pool(x), 1))


def build(**options) -> MobileNetish:
    torch.manual_seed(0)
    return MobileNetish(**options).eval()


def quantized_block(quantizer):
    block = build(one_module_per_call=True).blocks[0]
    activations = (torch.randn(2, 16, 16, 16, generator=torch.Generator().manual_seed(2)),)
    prepared = prepare_pt2e(
        torch.export.export(block, activations, strict=True).module(), quantizer
    )
    prepared(*activations)
    return convert_pt2e(prepared)


# %%
# Step 1 — Ask the x86 quantizer
# ------------------------------
# ``coverage(model, quantizer)`` prepares a copy of the exported graph and reads each compute
# op's annotation. On the CNN exported as ``export_module`` does (non-strict), the x86
# quantizer itself fails: its conv + unary patterns take one source partition per module,
# and a module called twice is one partition with two outputs. The report's error names the
# modules called at several places, and the two ways out.

model = build()
graph = export_module(model, images)
modules = "'relu' (ReLU, 2 calls), 'blocks.0.act' (Hardswish, 2 calls)"
with expect_error(ValueError, match=modules):
    coverage(graph, x86_quantizer())

# %%
# Step 2 — Export strictly, then compare the two quantizers
# ---------------------------------------------------------
# A strict export (``strict=True``, TorchDynamo's tracer) records ``source_fn_stack`` on each
# node, with a name per call, and ``get_source_partitions`` reads it before
# ``nn_module_stack``: each call becomes a partition of its own and the patterns match. The
# same graph under x86 and XNNPACK, every compute op:

strict = torch.export.export(model, images, strict=True).module()
x86 = coverage(strict, x86_quantizer())
xnnpack = coverage(strict, xnnpack_quantizer())
print(side_by_side(x86, xnnpack))

# %%
# The counts, per kind of op (int8, all):

print(x86.summary())
print(xnnpack.summary())
assert x86.counts() == {"conv": (11, 11), "mul": (0, 2), "add": (2, 2), "linear": (2, 2)}
assert xnnpack.counts() == {"conv": (11, 11), "mul": (2, 2), "add": (2, 2), "linear": (2, 2)}

# %%
# Both adds are int8 under x86 too, but differently: x86 annotates an add only fused into
# the conv before it (``conv + add``), the conv's output never leaves the int8 kernel;
# XNNPACK quantizes the add's two inputs and its output, as an op of its own.

print(x86["add_"].why, "|", xnnpack["add_"].why)
assert x86["add_"].status == "int8 fused" and xnnpack["add_"].status == "int8 static"

# %%
# Step 3 — See the float mul
# --------------------------
# One block, quantized by each. Under x86 the squeeze-excitation's ``mul`` (highlighted)
# reads both inputs in float, the hardswish output and the gate, and only its result is
# quantized, for the project conv; under XNNPACK both inputs come through dequantize nodes.

dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor.default
x86_block = quantized_block(x86_quantizer())
draw(x86_block, highlight=["mul"], title="x86: the squeeze-excitation mul stays float")
(mul,) = x86_block.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)
assert not any(arg.target == dequantize for arg in mul.args), "x86: float inputs"

# %%

xnnpack_block = quantized_block(xnnpack_quantizer())
draw(xnnpack_block, highlight=["mul"], title="XNNPACK: int8 mul")
(mul,) = xnnpack_block.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)
assert all(arg.target == dequantize for arg in mul.args), "XNNPACK: both inputs dequantized"

# %%
# Why: ``mul.Tensor`` is among x86's ``default_quantizable_ops``, but ``_annotate_mul_tensor``
# skips a mul whose two inputs differ in shape, and squeeze-excitation multiplies a
# ``(2, 64, 16, 16)`` activation by a ``(2, 64, 1, 1)`` gate.

print(x86["mul"].why)
source = inspect.getsource(x86_inductor_quantizer.X86InductorQuantizer._annotate_mul_tensor)
assert "_same_shape(node.args[0], node.args[1])" in source
assert torch.ops.aten.mul.Tensor in x86_inductor_quantizer.default_quantizable_ops

# %%
# Step 4 — A transformer layer: the roles turn
# --------------------------------------------
# ``nn.TransformerEncoderLayer`` (width 64, 4 heads, ``batch_first=True``). x86 leaves the
# attention's two linears float, ``F.linear`` calls inside ``nn.MultiheadAttention`` (M05-1),
# and both residual adds: x86 quantizes an add only fused into the linear right before it,
# and an eval-mode dropout node sits in between (``dropout2(linear2(...))`` in the layer's
# source: ``nn.Dropout`` does nothing in eval mode, but the non-strict export keeps its
# node). The report names the dropout for the add after ``linear2``; the add after the
# attention has a dropout and MHA's reshapes before it. XNNPACK finds linears by op, not by
# module, and quantizes adds on their own: only SDPA stays float, in neither quantizer's set.

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
layer_graph = export_module(layer, tokens)
x86_layer = coverage(layer_graph, x86_quantizer())
xnnpack_layer = coverage(layer_graph, xnnpack_quantizer())
print(side_by_side(x86_layer, xnnpack_layer))
print(x86_layer.table(only="float"))
assert x86_layer.counts() == {"linear": (2, 4), "attention": (0, 1), "add": (0, 2)}
assert xnnpack_layer.counts() == {"linear": (4, 4), "attention": (0, 1), "add": (2, 2)}
assert "eval-mode dropout" in x86_layer["add_1"].reason, "dropout2 between linear2 and the add"

# %%
# Step 5 — torchvision's architectures
# ------------------------------------
# ``get_model`` builds six architectures as torchvision 0.28 writes them, at full depth and
# width: ResNet18 and ResNet50, MobileNetV2, MobileNetV3-small, EfficientNet-B0 and a small ViT
# (``common.vision_models``; torchvision itself does not import beside this CPU build of torch,
# see its docstring). Four of them, each with a habit of its own, are exported here as
# ``export_module`` exports (non-strict) and reported by both quantizers; ResNet50 and
# EfficientNet-B0 are exercise 3. Random weights, 64×64 images.

from common.models import VISION_NAMES, example_inputs, get_model, input_shape

HEADER = ("architecture", "x86", "float under x86", "XNNPACK", "float under XNNPACK")
REFUSED = "refused"


COMPUTE_KINDS = set(COMPUTE_OPS.values())


def compute_counts(report):
    return {k: counts for k, counts in report.counts().items() if k in COMPUTE_KINDS}


def int8_of_all(report):
    counts = compute_counts(report).values()
    return f"{sum(int8 for int8, _ in counts)}/{sum(total for _, total in counts)}"


def float_kinds(report):
    return ", ".join(f"{k} {i}/{n}" for k, (i, n) in compute_counts(report).items() if i < n)


ON_THE_PAGE = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "vit_tiny")
assert set(ON_THE_PAGE) < set(VISION_NAMES)
models, zoo, refusals = {}, {}, {}
for name in ON_THE_PAGE:
    models[name] = get_model(name)
    graph = export_module(models[name], example_inputs(2, shape=input_shape(name)))
    zoo[name] = {"XNNPACK": coverage(graph, xnnpack_quantizer(), every_op=True)}
    try:
        zoo[name]["x86"] = coverage(graph, x86_quantizer(), every_op=True)
    except ValueError as error:
        refusals[name] = str(error)

rows = [HEADER]
for name, reports in zoo.items():
    on_x86, on_xnnpack = reports.get("x86"), reports["XNNPACK"]
    x86_cells = (int8_of_all(on_x86), float_kinds(on_x86)) if on_x86 else (REFUSED, "")
    rows.append((name, *x86_cells, int8_of_all(on_xnnpack), float_kinds(on_xnnpack)))
widths = [max(display_width(row[i]) for row in rows) for i in range(len(HEADER))]
for row in rows:
    print("  ".join(pad(cell, width) for cell, width in zip(row, widths, strict=True)).rstrip())

# %%
# XNNPACK makes every conv, linear, add and mul int8 in all four; only the ViT's attention
# (SDPA) stays float. x86 leaves exactly the squeeze-excitation ``mul`` float (one per
# ``SqueezeExcitation`` module, the broadcast of Step 3), and on the ViT the attention's
# ``F.linear`` calls, SDPA and the adds (Step 4). Every conv is int8 under both: the counts
# equal the model's ``nn.Conv2d`` modules.

for name, reports in zoo.items():
    model = models[name]
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    squeeze_excitations = sum(type(m).__name__ == "SqueezeExcitation" for m in model.modules())
    for label, report in reports.items():
        counts = report.counts()
        assert counts["conv"] == (convs, convs), (name, label)
        if squeeze_excitations:
            expected_mul = squeeze_excitations if label == "XNNPACK" else 0
            assert counts["mul"] == (expected_mul, squeeze_excitations), (name, label)
    on_xnnpack = compute_counts(reports["XNNPACK"])
    assert all(i == n for k, (i, n) in on_xnnpack.items() if k != "attention")

# %%
# x86 refuses ResNet18 for the reason of Step 1: torchvision's ``BasicBlock`` calls its
# ``self.relu`` twice. The refusal names every such module:

for name, message in refusals.items():
    reused = re.findall(r"'([\w.]+)' \(ReLU, (\d) calls\)", message)
    print(f"{name}: {len(reused)} × ReLU, {reused[0][1]} calls each ({reused[0][0]}, ...)")
assert set(refusals) == {"resnet18"}

# %%
# The fix of Step 2 holds on a real ResNet: exported strictly, ResNet18 is int8 throughout
# under x86 too.

resnet_args = example_inputs(2, shape=input_shape("resnet18"))
resnet = torch.export.export(models["resnet18"], resnet_args, strict=True).module()
resnet_x86 = coverage(resnet, x86_quantizer())
print(resnet_x86.summary())
assert resnet_x86.counts() == compute_counts(zoo["resnet18"]["XNNPACK"])
assert all(i == n for i, n in resnet_x86.counts().values())

# %%
# Step 6 — Every op, not only the compute ops
# -------------------------------------------
# The reports of Step 5 cover every op that computes on tensor values (``every_op=True``):
# also the activations, pooling, norms, reductions and the layout ops that only move values.
# Such an op is ``int8 fused`` when it runs inside the int8 conv or linear before it (a ReLU
# after its conv), ``int8 shared`` when it reads and writes int8 with its input's scale (a
# max-pool), ``int8 static``, or ``float`` with the quantizer's rule. ``grouped`` keeps a big
# model's report short: a row per op, status and reason. The float ops of each report, the
# layout ops left out (``with_layout=False``):

for name, reports in zoo.items():
    for label, report in reports.items():
        floats = [op for op in report.ops if not op.int8 and op.kind not in MOVING_KINDS]
        print(f"{name}, {label}: {len(floats)} float")
        if floats:
            print(report.grouped(only="float", with_layout=False))

# %%
# XNNPACK leaves MobileNetV3's hardswish and hardsigmoid and the ViT's GELU and LayerNorm
# float: no pattern of its covers them. x86 fuses the hardswish into the conv before it and
# the GELU into the linear before it, and leaves the hardsigmoid gates, the LayerNorms and
# the one hardswish after the classifier's linear float (x86 fuses hardswish into convs
# only). Under both, every ReLU runs fused or passes int8 through, and every max-pool
# shares its input's scale.

v3, vit = zoo["mobilenet_v3_small"], zoo["vit_tiny"]


def modules(name, kind):
    return sum(isinstance(m, kind) for m in models[name].modules())


hardswishes, gelus = modules("mobilenet_v3_small", nn.Hardswish), modules("vit_tiny", nn.GELU)
for label in ("x86", "XNNPACK"):
    gates = modules("mobilenet_v3_small", nn.Hardsigmoid)
    assert v3[label].statuses("hardsigmoid") == {"float": gates}
    assert vit[label].statuses("layer_norm") == {"float": modules("vit_tiny", nn.LayerNorm)}
assert v3["XNNPACK"].statuses("hardswish_") == {"float": hardswishes}
assert v3["x86"].statuses("hardswish_") == {"int8 fused": hardswishes - 1, "float": 1}
assert vit["x86"].statuses("gelu") == {"int8 fused": gelus}
assert vit["XNNPACK"].statuses("gelu") == {"float": gelus}
for reports in zoo.values():
    for report in reports.values():
        for op in ("relu", "relu_", "max_pool2d"):
            assert set(report.statuses(op)) <= {"int8 fused", "int8 shared"}, (report.label, op)

# %%
# Step 7 — ExecuTorch's QuantizerReporter
# ---------------------------------------
# ExecuTorch 1.5.1 ships a report of its own, ``QuantizerReporter``
# (``executorch.backends.cortex_m.quantizer_reporter``). It reports what a quantizer tells it
# while annotating, through the ``QuantizerReporterUser`` interface (``get_quantizer_info``,
# ``register_reporter``) that ExecuTorch's Cortex-M and Arm quantizers implement; those need
# ``tosa_serializer``, which is not on PyPI, and do not import here:

with expect_error(ModuleNotFoundError, match="tosa_serializer"):
    importlib.import_module("executorch.backends.cortex_m.quantizer.quantizer")

# %%
# ``XNNPACKQuantizer`` and ``X86InductorQuantizer`` implement neither method, so the reporter
# does not apply to them:

from executorch.backends.cortex_m.quantizer_reporter import QuantizerReporter

logging.getLogger("executorch.backends.cortex_m.quantizer_reporter").setLevel(logging.ERROR)
with expect_error(AttributeError, match="get_quantizer_info"):
    QuantizerReporter([xnnpack_quantizer()])
assert not any(hasattr(q, "get_quantizer_info") for q in (x86_quantizer(), xnnpack_quantizer()))

# %%
# Summary
# -------
# ==================================  ========================  ===========================
# op                                  x86                       XNNPACK
# ==================================  ========================  ===========================
# conv, depthwise conv, 1×1 conv      int8                      int8
# in-place residual ``add_``          int8, fused into conv     int8, an op of its own
# squeeze-excitation ``mul``          float: shapes differ      int8
# ``nn.MultiheadAttention`` linears   float: not nn.Linear      int8 (matched by op)
# encoder's residual adds             float: dropout between    int8
# ``scaled_dot_product_attention``    float                     float
# ReLU after a conv                   int8, fused into conv     int8, fused into conv
# max-pool                            int8, shared scale        int8, shared scale
# hardswish after a conv              int8, fused into conv     float: no pattern
# GELU after a linear                 int8, fused into linear   float: no pattern
# hardsigmoid, LayerNorm              float                     float
# ==================================  ========================  ===========================
#
# ``coverage(..., every_op=True)`` reports every op, ``grouped`` a row per op and reason.
# What each op becomes under each quantizer of this course, and which kernel then runs it,
# is the op atlas: :ref:`M07-4 · the op atlas
# <sphx_glr_lessons_m07_your_model_m07_4_op_atlas.py>`.
#
# A module called at several places stops x86 before any of this, on a non-strict export:
# export with ``strict=True`` or give each call its own module. torchvision's ResNets are such
# models (``self.relu`` called two or three times per block); MobileNetV3 and EfficientNet-B0
# keep one float ``mul`` per squeeze-excitation under x86.
#
# Exercises
# ---------
# 1. Ask XNNPACK for dynamic quantization (``get_symmetric_quantization_config(
#    is_per_channel=True, is_dynamic=True)``). Predict which compute ops of the CNN stay int8.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
#              XNNPACKQuantizer,
#              get_symmetric_quantization_config,
#          )
#
#          config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
#          dynamic = coverage(strict, XNNPACKQuantizer().set_global(config))
#          print(dynamic.summary())
#          assert dynamic.counts() == {
#              "conv": (6, 11), "mul": (0, 2), "add": (0, 2), "linear": (2, 2)
#          }, "convs before a ReLU, depthwise convs, adds and muls are not annotated dynamically"
#
# 2. Ask x86 for int8 in the attention by module name,
#    ``set_module_name_qconfig("self_attn", config)``. Predict the int8 linears.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config()
#          by_name = x86_quantizer().set_module_name_qconfig("self_attn", config)
#          assert coverage(layer_graph, by_name).counts()["linear"] == (2, 4), (
#              "still 2: the linear pattern never finds F.linear inside the MHA"
#          )
#
# 3. ResNet50's ``Bottleneck`` calls its ``self.relu`` three times; EfficientNet-B0 has a
#    squeeze-excitation (SiLU, then a sigmoid gate) in each of its 16 blocks. Predict both
#    quantizers' reports on each, exported as in Step 5.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          name = "resnet50"
#          resnet50 = export_module(get_model(name), example_inputs(2, shape=input_shape(name)))
#          with expect_error(ValueError, match="'layer1.0.relu' (ReLU, 3 calls)"):
#              coverage(resnet50, x86_quantizer())
#          assert all(i == n for i, n in coverage(resnet50, xnnpack_quantizer()).counts().values())
#
#          name = "efficientnet_b0"
#          effnet = export_module(get_model(name), example_inputs(2, shape=input_shape(name)))
#          assert coverage(effnet, x86_quantizer()).counts()["mul"] == (0, 16), "one per block"
#          assert all(i == n for i, n in coverage(effnet, xnnpack_quantizer()).counts().values())
#
# Further reading
# ---------------
# - `X86InductorQuantizer source
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `XNNPACKQuantizer source
#   <https://github.com/pytorch/executorch/blob/main/backends/xnnpack/quantizer/xnnpack_quantizer.py>`_
# - `torch.export: strict and non-strict
#   <https://docs.pytorch.org/docs/stable/export.html>`_
#
# Next
# ----
# :ref:`M07-2 · a transformer you did not write
# <sphx_glr_lessons_m07_your_model_m07_2_transformer_you_did_not_write.py>` makes every linear
# of an ``nn.TransformerEncoder`` int8 without editing its code.
