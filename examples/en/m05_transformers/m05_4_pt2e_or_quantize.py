"""
M05-4 PT2E or quantize_()?
==========================

torchao quantizes in two ways. ``quantize_(model, config)`` works on the eager module: it
swaps each linear's weight for a tensor subclass that carries int8 values and their scales,
and the subclass decides at each call which kernel runs — the API torchao's own guides lead
with, built for LLMs. PT2E, this course's way, rewrites an exported graph with quantize and
dequantize nodes that a backend (inductor, ExecuTorch) then lowers. This lesson puts three
int8 recipes on the same encoder — ``quantize_`` with int8 dynamic activations and int8
weights, ``quantize_`` with int8 weights only, and PT2E dynamic (``X86InductorQuantizer`` with
``is_dynamic=True``) — and measures what each model becomes, its error, the kernels it runs
compiled, and its speed. It ends with a table: which to choose for what.

**What you will learn**

- What ``quantize_`` changes (a module's weights) and what PT2E changes (the graph)
- Which kernels each recipe runs once compiled, and what that buys
- When to choose ``quantize_`` and when PT2E

**Prerequisites**: :ref:`M05-2 · Static vs dynamic int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`, :ref:`M03-3 · Speed and size,
measured <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# The timing encoder of M05-3 (four pre-norm blocks, d_model 256, MLP 1024, random weights) on a
# batch of 4 × 64 tokens. ``with_quantize_`` quantizes a copy of a module with a torchao
# config; ``with_pt2e`` exports a module, prepares it with the x86 quantizer's dynamic config,
# runs it once (the weights' observers, M05-2) and converts it. ``ops`` counts the
# quantization and matrix-product ops of a graph.

import copy
import dataclasses
import warnings
from collections import Counter

import torch

from common.charts import pad
from common.kernels import kernels_run
from common.models import example_inputs, get_model, input_shape
from common.numerics import sqnr
from common.pt2e import export_module, quiet
from common.timing import as_compiled, race, timing_threads
from common.viz import draw

quiet()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about (M03-3).
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization import (
    Int8DynamicActivationInt8WeightConfig,
    Int8StaticActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

encoder = get_model("encoder")
tokens = example_inputs(4, shape=input_shape("encoder"))
with torch.no_grad():
    reference = encoder(*tokens)
# How the printed lines name the recipes (the code refers to them by key).
LABELS = {
    "fp32": "fp32",
    "dynamic": "quantize_ int8 dynamic",
    "weight_only": "quantize_ int8 weight-only",
    "pt2e": "PT2E int8 dynamic",
}


def with_quantize_(module, config):
    quantized = copy.deepcopy(module)
    quantize_(quantized, config)
    return quantized


def with_pt2e(module, args):
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    prepared = prepare_pt2e(export_module(module, args), X86InductorQuantizer().set_global(config))
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


def ops(gm) -> dict:
    kinds = ("quantize", "choose_qparams", "_int_mm", "linear", "mm")
    names = (str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return dict(Counter(n for n in names if any(k in n for k in kinds)))


# %%
# Step 1 — What each recipe changes
# ---------------------------------
# ``quantize_`` leaves the module as it was — same class, same submodules — and replaces each
# linear's weight with torchao's ``Int8Tensor``: int8 values (``qdata``) and a scale per
# output row. PT2E returns a new object, an exported ``GraphModule``, whose int8 weights are
# constants read by ``dequantize_per_channel`` nodes.

CONFIGS = {
    "dynamic": Int8DynamicActivationInt8WeightConfig(),
    "weight_only": Int8WeightOnlyConfig(),
}
models = {key: with_quantize_(encoder, config) for key, config in CONFIGS.items()}
models["pt2e"] = with_pt2e(encoder, tokens)
weight = models["dynamic"].blocks[0].fc1.weight
print(f"quantize_: {type(models['dynamic']).__name__}, fc1.weight is {type(weight).__name__}")
print(
    f"  qdata {weight.qdata.dtype} {tuple(weight.qdata.shape)}, scale {tuple(weight.scale.shape)}"
)
print(f"PT2E: {type(models['pt2e']).__name__}, {ops(models['pt2e'])}")
assert type(models["dynamic"]) is type(encoder), "the same module class"
assert weight.qdata.dtype == torch.int8 and weight.scale.numel() == weight.shape[0]
assert isinstance(models["pt2e"], torch.fx.GraphModule), "a new graph"

# %%
# Step 2 — The graph that runs
# ----------------------------
# Export the ``quantize_`` model and the subclass unfolds into ops: torchao's own
# ``choose_qparams_affine`` and ``quantize_affine`` for each linear's input, a row at a time,
# then ``aten._int_mm``, a real int8 × int8 → int32 matrix product, already in the graph.
# PT2E's graph is still a simulation — each float ``linear`` between q/dq nodes — that
# inductor turns into int8 kernels only when it compiles (M03). The pictures are the first
# block under each recipe, their quantization ops highlighted.

block = get_model("encoder").blocks[0]
block_tokens = (tokens[0][:2],)
block_quantize_ = torch.export.export(
    with_quantize_(block, Int8DynamicActivationInt8WeightConfig()), block_tokens
).module()
print(f"quantize_, exported: {ops(block_quantize_)}")
highlight = [n.name for n in block_quantize_.graph.nodes if "torchao" in str(n.target)]
draw(block_quantize_, highlight=highlight, title="quantize_: torchao ops and aten._int_mm")
assert ops(block_quantize_)["aten._int_mm.default"] == 6, "q, k, v, out, fc1, fc2: six a block"

# %%

block_pt2e = with_pt2e(block, block_tokens)
print(f"PT2E: {ops(block_pt2e)}")
highlight = [n.name for n in block_pt2e.graph.nodes if "quantized_decomposed" in str(n.target)]
draw(block_pt2e, highlight=highlight, title="PT2E: q/dq around float linears")
assert "aten._int_mm.default" not in ops(block_pt2e), "no int8 op before compiling"

# %%
# The two graphs speak different ops, and that decides where each can go. The x86 lowering
# (M03) reads the ``quantized_decomposed`` q/dq ops of PT2E, not the ``torchao`` ops of
# ``quantize_`` (those, torchao's own inductor passes handle: Step 5). ExecuTorch's XNNPACK
# partitioner (M06) reads both: PT2E's q/dq ops, and torchao's ``choose_qparams_affine``,
# ``quantize_affine`` and ``dequantize_affine``, which it lowers right when the activations
# are quantized at run time too, as ``Int8DynamicActivationIntxWeightConfig`` does. That
# ``quantize_`` program runs on the ExecuTorch runtime in :ref:`Troubleshooting: ExecuTorch
# and XNNPACK <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`, beside the
# weight-only configs, which do not (no kernel without the partitioner; with it, the weights'
# scales dropped).

namespaces = {
    label: {n.target.namespace for n in gm.graph.nodes if hasattr(n.target, "namespace")}
    for label, gm in (("quantize_", block_quantize_), ("PT2E", block_pt2e))
}
print({label: sorted(found - {"aten"}) for label, found in namespaces.items()})
assert "quantized_decomposed" not in namespaces["quantize_"], "no PT2E q/dq ops"
assert "torchao" not in namespaces["PT2E"], "no torchao ops"

# %%
# Step 3 — The error
# ------------------
# The SQNR of each model's output against the float encoder (``common.numerics.sqnr``, M04-1).
# Weight-only keeps the activations in float, so it is the closest. The two int8-dynamic
# recipes quantize the same tensors and land close together.

errors = {}
with torch.no_grad():
    for key, model in models.items():
        errors[key] = sqnr(reference, model(*tokens)).item()
        print(f"{pad(LABELS[key], 28)} {errors[key]:5.1f} dB")
assert errors["weight_only"] > max(errors["dynamic"], errors["pt2e"]), "weight-only: closest"
assert abs(errors["dynamic"] - errors["pt2e"]) < 3, "int8 dynamic: the same error, give or take"

# %%
# They differ in what an activation's scale is measured over: ``quantize_`` takes one per token
# (a row of the input), PT2E one per tensor (the whole batch, M05-2). Multiply the other three
# sequences of the batch by 10 and keep the first: its output moves under PT2E, whose scale
# grew with the batch, and not at all under ``quantize_``.

loud = torch.cat([tokens[0][:1], 10 * tokens[0][1:]])
with torch.no_grad():
    moved = {
        key: not torch.equal(models[key](loud)[:1], models[key](*tokens)[:1])
        for key in ("dynamic", "pt2e")
    }
print({LABELS[key]: "changed" if changed else "unchanged" for key, changed in moved.items()})
assert moved == {"dynamic": False, "pt2e": True}, "a scale per token, a scale per tensor"

# %%
# Step 4 — Fewer bits
# -------------------
# ``quantize_`` goes below 8 bits: ``IntxWeightOnlyConfig`` stores 4-bit weights (here with
# its default, a scale per output row), the kind of recipe LLMs use to fit in memory; the
# error grows, as it must with 16 levels instead of 256. The x86 quantizer's configs are int8
# weights and uint8 activations, nothing smaller.

int4 = with_quantize_(encoder, IntxWeightOnlyConfig(weight_dtype=torch.int4))
weight4 = int4.blocks[0].fc1.weight
with torch.no_grad():
    errors["int4"] = sqnr(reference, int4(*tokens)).item()
x86 = get_default_x86_inductor_quantization_config()
print(f"quantize_ int4 weight-only: {errors['int4']:.1f} dB, block {tuple(weight4.block_size)}")
print(f"x86 quantizer: weights {x86.weight.dtype}, activations {x86.input_activation.dtype}")
assert tuple(weight4.block_size) == (1, 256), "a scale per row"
assert 20 < errors["int4"] < errors["weight_only"], "4 bits: more error than 8"
assert (x86.weight.dtype, x86.input_activation.dtype) == (torch.int8, torch.uint8)

# %%
# Step 5 — The kernels that run, compiled
# ---------------------------------------
# Each model is compiled with ``torch.compile`` and freezing, in the thread count the timing
# uses (M03-3's rules). ``race`` (``common.timing``) compiles the two graphs, fp32 and PT2E,
# and reads the kernels each runs (``kernels_run``, from the profiler); the ``quantize_``
# models are compiled here the same way and timed in the same rounds (``also=``): ``race``
# keys what it measured by the models' weights, which it cannot read inside torchao's
# subclasses, so ``also_key`` names the configs that made them (their ``repr``: every field).
#
# PT2E's compiled graph runs oneDNN's int8 linear for every linear. The ``quantize_``
# int8-dynamic model runs every linear on an int8 kernel, of two kinds: ATen's
# ``aten::_int_mm`` and, where torchao's inductor passes rewrote the pattern, oneDNN's int8
# linear (``kernels_run`` counts both as int8; ``matmuls`` lists the matrix products by
# name). The weight-only model, frozen, runs float kernels only: freezing folds the
# dequantization of its constant weights away,
# and what is left is a float model with rounded weights, its weights fp32 again in memory:
# weight-only saves no memory at run time once frozen on a CPU.


def matmuls(model) -> dict:
    """The matrix-product kernels one call runs, by profiler name."""
    with torch.no_grad():
        run = kernels_run(model, tokens)
    return dict(run.int8 + run.float)


torch._inductor.config.freezing = True  # as race sets it, for the process
with as_compiled(timing_threads()):
    compiled = {
        key: torch.compile(models[key], dynamic=False) for key in ("dynamic", "weight_only")
    }
    for model in compiled.values():
        model(*tokens)  # the first call compiles
timings = race(
    {LABELS["fp32"]: export_module(encoder, tokens), LABELS["pt2e"]: models["pt2e"]},
    tokens,
    also={LABELS[key]: model for key, model in compiled.items()},
    also_key=repr(CONFIGS),  # every field of the configs that made them
)
ran = {LABELS[key]: timings.kernels[LABELS[key]] for key in ("fp32", "pt2e")}
with as_compiled(timings.threads):  # the thread count and grad mode they were compiled in
    ran |= {LABELS[key]: kernels_run(model, tokens) for key, model in compiled.items()}
    products = matmuls(compiled["dynamic"])
for label, kernels in ran.items():
    print(f"{pad(label, 28)} {kernels.summary}")
print(f"{pad(LABELS['dynamic'], 28)} {products}")
assert ran[LABELS["pt2e"]].int8, "PT2E: oneDNN's int8 linear"
assert (
    set(products) <= {"aten::_int_mm", "onednn::qlinear_pointwise"} and sum(products.values()) == 24
), "quantize_ int8 dynamic: int8 kernels only"
assert ran[LABELS["weight_only"]].float and not ran[LABELS["weight_only"]].int8, (
    "weight-only, frozen: float kernels only"
)

# %%
# Step 6 — Speed
# --------------
# Medians of interleaved rounds, with the spread, the thread count and the CPU's int8 path
# printed beside them (M03-3). Never asserted: they depend on the machine.

print(timings.table())

# %%
# Static activations
# ------------------
# ``quantize_`` has a static int8 config too, ``Int8StaticActivationInt8WeightConfig``; but the
# activations' scale is an argument you pass it (``act_quant_scale``, none by default), where
# PT2E's observers measure it on calibration data (M01–M04). No observer comes with it: you
# measure the scale yourself, which is why the lesson does not put it in the race.

static = {f.name: f.default for f in dataclasses.fields(Int8StaticActivationInt8WeightConfig)}
print({name: static[name] for name in ("act_quant_scale", "act_quant_zero_point")})
assert static["act_quant_scale"] is None, "the activations' scale: the caller's to give"

# %%
# Summary
# -------
# ================================  =================================  ======================
# you want                          ``quantize_``                      PT2E
# ================================  =================================  ======================
# an LLM's weights in 8 or 4 bits   stored small, run as float on x86  8 bits only (x86)
# int8 dynamic activations          a scale per token                  a scale per tensor
# the eager module kept, no export  yes                                no: a new graph
# q/dq ops the x86 lowering reads   no: torchao's own ops              yes (M03)
# static int8 activations           you give the scale: no observers   observers (M01–M04)
# a ``.pte`` for ExecuTorch         dynamic activations only (m99_5)   yes (M06)
# ================================  =================================  ======================
#
# - Weight-only keeps the weights small where they are stored, not where an x86 CPU runs
#   them: compiled with freezing they are folded back into fp32 constants (Step 5), and in
#   eager each call dequantizes them (exercise 1).
# - To ExecuTorch: ``quantize_`` with ``Int8DynamicActivationIntxWeightConfig`` (int8 dynamic
#   activations, 4- or 8-bit weights) and ``XnnpackPartitioner``, ExecuTorch's own LLM recipe,
#   lowers whole and runs; weight-only configs do not (m99_5).
#
# In short: low-bit weights for an LLM, the eager module kept → ``quantize_`` (and, to
# ExecuTorch, its dynamic-activation recipe); static int8 graphs calibrated by observers, the
# x86 lowering → PT2E.
#
# Exercises
# ---------
# 1. Run the weight-only ``quantize_`` model *without* compiling it. Predict: does eager
#    weight-only run an int8 matrix product?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          eager = matmuls(models["weight_only"])
#          assert "aten::mm" in eager and "aten::_int_mm" not in eager, "float mm: dequantized"
#
# 2. Export the encoder with a dynamic batch before PT2E (``dynamic_shapes``, as
#    ``common.data.export_digits_model`` does), and compile it and the ``quantize_``
#    int8-dynamic model with ``torch.compile``'s default, ``dynamic=None``: a second batch size
#    then recompiles with a dynamic batch, the case where m99_3's int8 convs fail. Predict: at
#    batch 4, then at batch 1, which of the two runs every linear on an int8 kernel?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          batch = torch.export.Dim("batch")
#          program = torch.export.export(encoder, tokens, dynamic_shapes=({0: batch},))
#          config = get_default_x86_inductor_quantization_config(is_dynamic=True)
#          prepared = prepare_pt2e(program.module(), X86InductorQuantizer().set_global(config))
#          with torch.no_grad():
#              prepared(*tokens)
#          both = {"pt2e": convert_pt2e(prepared), "quantize_": models["dynamic"]}
#          with torch.no_grad():
#              for key, model in both.items():
#                  default = torch.compile(model)  # dynamic=None
#                  for n in (4, 1):
#                      default(tokens[0][:n])  # batch 1 recompiles, with a dynamic batch
#                      ran = kernels_run(default, (tokens[0][:n],))
#                      assert ran.int8 and not ran.float, f"{key}, batch {n}: every linear int8"
#          # both, at both sizes: the int8 linears lower with a dynamic batch too;
#          # what fails in m99_3 is the int8 conv's layout check
#
# Further reading
# ---------------
# - `torchao quantization overview
#   <https://docs.pytorch.org/ao/stable/quantization_overview.html>`_ (``quantize_`` and its
#   tensor subclasses)
# - `PyTorch 2 Export Quantization with X86 Backend through Inductor
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
#
# Next
# ----
# M06 takes the PT2E graph to the edge, with ExecuTorch.
