"""
M05-2 Static vs dynamic int8
============================

Static quantization (static int8) fixes every activation's scale at calibration time;
**dynamic** int8 computes it again for every batch, from the batch itself. With
``is_dynamic=True`` the x86 quantizer writes that computation into the graph: a
``choose_qparams`` node before each quantized input. This lesson reads those nodes, shows the
scales changing from batch to batch, checks what calibration still does for a dynamic model
(torchao's docs say it is needed: it is, for the weights), and measures both recipes on the
trained ViT: accuracy, the numeric debugger's SQNR node by node, and inputs brighter than any
calibration image. The course's ``handmade.prepare``/``convert`` stay bit-exact with torchao's
for the dynamic config too.

**What you will learn**

- What ``is_dynamic=True`` puts in the graph, and what calibration still measures
- Where dynamic int8 matches static int8, and where it holds up when static breaks
- How to run the numeric debugger on a graph with a dynamic batch

**Prerequisites**: :ref:`M05-1 · what the quantizer sees in attention
<sphx_glr_lessons_m05_transformers_m05_1_attention.py>`, :ref:`M04-1 · measuring the error
<sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``train_digits_vit`` trains the ViT of M05-1 (q/k/v linears + SDPA) on the digits'
# train split, deterministically, and keeps the weights in ``build/cache/``. It is exported
# once with a dynamic batch and marked for the numeric debugger (M04-1); every quantized
# model below starts from a copy of that export.

import copy
import warnings
from collections import Counter

import torch

from common.charts import pad
from common.data import accuracy, digits, train_digits_vit
from common.expect import expect_error
from common.numerics import sqnr
from common.pt2e import quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)
from torchao.quantization.pt2e.observer import PerChannelMinMaxObserver, PlaceholderObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade

model = train_digits_vit()
calibration_images, _ = digits("calibration")
test_images, test_labels = digits("test")
batch = torch.export.Dim("batch")
program = torch.export.export(model, (test_images[:2],), dynamic_shapes=({0: batch},))
generate_numeric_debug_handle(program)
marked = program.module()
qd = torch.ops.quantized_decomposed
# How the printed lines name the three models (the code refers to them by key).
LABELS = {"fp32": "fp32", "static": "int8 static", "dynamic": "int8 dynamic"}

# %%
# Helpers: ``dynamic_x86`` is the x86 quantizer with ``is_dynamic=True``; ``quantize``
# prepares a fresh copy of the export, feeds it one calibration batch (unless told
# otherwise) and converts it; ``qdq_ops`` counts the quantization nodes of a graph. ``sqnr``
# (from ``common.numerics``) is M04-1's formula.


def dynamic_x86():
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return X86InductorQuantizer().set_global(config)


def quantize(quantizer, images=calibration_images, *, by_hand=False):
    prepare, convert = (
        (handmade.prepare, handmade.convert) if by_hand else (prepare_pt2e, convert_pt2e)
    )
    prepared = prepare(copy.deepcopy(marked), quantizer)
    if images is not None:
        with torch.no_grad():
            prepared(images)
    return convert(prepared)


def qdq_ops(gm) -> dict:
    names = (str(n.target).removeprefix("quantized_decomposed.") for n in gm.graph.nodes)
    return dict(Counter(name for name in names if "quantize" in name or "choose" in name))


# %%
# Step 1 — What is_dynamic=True puts in the graph
# -----------------------------------------------
# The static model quantizes each linear's input with ``quantize_per_tensor.default``, its
# scale a Python number fixed at convert. The dynamic model puts a ``choose_qparams.tensor``
# node in front of each: it reads the activation and returns a scale and a zero point as
# tensors, which ``quantize_per_tensor.tensor`` and ``dequantize_per_tensor.tensor`` take.
# Weights are int8 per channel in both.

static = quantize(x86_quantizer())
dynamic = quantize(dynamic_x86())
print(f"static:  {qdq_ops(static)}")
print(f"dynamic: {qdq_ops(dynamic)}")
chooses = dynamic.graph.find_nodes(op="call_function", target=qd.choose_qparams.tensor)
assert len(chooses) == 10, "one per quantized activation (q, k and v share theirs)"
assert "quantize_per_tensor.default" not in qdq_ops(dynamic), "no fixed activation scale"
assert qdq_ops(static)["quantize_per_tensor.default"] == 10

# %%
# The picture is the first encoder block quantized alone with the dynamic config, the
# ``choose_qparams`` nodes highlighted: each reads the tensor it quantizes.

tokens = (torch.randn(8, 17, 32, generator=torch.Generator().manual_seed(0)),)
block = prepare_pt2e(torch.export.export(model.blocks[0], tokens).module(), dynamic_x86())
block(*tokens)
block = convert_pt2e(block)
chosen = [
    n.name for n in block.graph.find_nodes(op="call_function", target=qd.choose_qparams.tensor)
]
draw(block, highlight=chosen, title="Dynamic int8: a choose_qparams before each quantized input")
assert len(chosen) == 4, "the q/k/v input, the attention output, fc1's and fc2's inputs"

# %%
# Step 2 — A scale per batch
# --------------------------
# Record what the ``choose_qparams`` of the first block's q/k/v input returns
# (``torch.fx.Interpreter``, as in M03-1) for one image and for the whole test set: two
# different scales. The static model's scale for the same tensor is one number in the
# graph, whatever the batch.


def first_scale(gm, images) -> float:
    seen = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if node is chooses[1]:
                seen.append(result[0].item())
            return result

    with torch.no_grad():
        Recorder(gm).run(images)
    return seen[0]


one, many = first_scale(dynamic, test_images[:1]), first_scale(dynamic, test_images)
fixed = static.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)[1]
print(f"dynamic: scale {one:.5f} for one image, {many:.5f} for 500; static: {fixed.args[1]:.5f}")
assert one != many, "computed from each batch"
assert isinstance(fixed.args[1], float), "a constant of the static graph"

# %%
# Step 3 — What calibration still does
# ------------------------------------
# torchao's documentation says to calibrate a dynamic model too (pytorch/ao#4307, "Calibration
# is a must for both static and dynamic quantization"). The prepared model shows
# why: its activations carry ``PlaceholderObserver``\ s, which record nothing, but every
# weight still has a ``PerChannelMinMaxObserver``, and a PT2E weight observer sees its
# weight only when the model runs. Convert without running it and every weight gets the
# default scale: torchao warns, and the model reads digits no better than chance.

prepared = prepare_pt2e(copy.deepcopy(marked), dynamic_x86())
kinds = Counter(type(m).__name__ for n, m in prepared.named_children() if "activation_post" in n)
print(dict(kinds))
assert set(kinds) == {PlaceholderObserver.__name__, PerChannelMinMaxObserver.__name__}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    never_run = convert_pt2e(prepared)
print(f"{len(caught)} warnings, e.g. {str(caught[0].message)!r}")
print(f"uncalibrated dynamic model: accuracy {accuracy(never_run):.1%}")
assert "must run observer before calling calculate_qparams" in str(caught[0].message)
assert accuracy(never_run) < 0.3

# %%
# Any data will do, though: the weights are the same whatever passes through. Calibrated on
# seven images of noise, the dynamic model is bit for bit the one calibrated on digits.

noise = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(0))
on_noise = quantize(dynamic_x86(), noise)
with torch.no_grad():
    assert torch.equal(on_noise(test_images), dynamic(test_images)), (
        "calibration data is irrelevant"
    )
print("calibrated on noise == calibrated on digits")

# %%
# Step 4 — Accuracy
# -----------------
# On the 500 test images the three models read the digits equally well: a batch of 500
# images spans about the range the 200 calibration images did, so the scales dynamic int8
# computes are close to the static ones.

scores = {
    "fp32": accuracy(model),
    "static": accuracy(static),
    "dynamic": accuracy(dynamic),
}
for key, score in scores.items():
    print(f"{pad(LABELS[key], 13)} {score:.1%}")
assert min(scores.values()) > scores["fp32"] - 0.03, "int8 costs at most a few test images"

# %%
# Step 5 — Node by node, with the numeric debugger
# ------------------------------------------------
# The debugger of M04-1 compares every node of the float and the int8 graph. On a graph with
# a dynamic batch it meets a node whose output is no tensor — ``sym_size``, the batch size —
# and ``compare_results`` refuses it with a ``ValueError``; keep the tensors only.

float_logged = prepare_for_propagation_comparison(marked)
logged = {
    label: prepare_for_propagation_comparison(m)
    for label, m in (("static", static), ("dynamic", dynamic))
}
with torch.no_grad():
    for m in (float_logged, *logged.values()):
        m(test_images)
reference = extract_results_from_loggers(float_logged)
with expect_error(ValueError, match="sym_size"):
    compare_results(reference, extract_results_from_loggers(logged["static"]))


def tensors_only(results):
    return {k: v for k, v in results.items() if isinstance(v[2][0], torch.Tensor)}


per_node = {}
for label, m in logged.items():
    compared = compare_results(
        tensors_only(reference), tensors_only(extract_results_from_loggers(m))
    )
    per_node[label] = {
        info.name: summary.results[0].sqnr.item() for info, summary in compared.items()
    }

# %%
# The SQNR of each linear's output, and of the logits (``linear_12``, the head). Static and
# dynamic stay within a fraction of a decibel of each other all the way through, and both
# lose SQNR block by block as the rounding errors add up.

linear_names = [name for name in per_node["static"] if name.startswith("linear")]
for name in linear_names:
    print(
        f"{name:10} static {per_node['static'][name]:6.2f} dB",
        f"  dynamic {per_node['dynamic'][name]:6.2f} dB",
    )
gaps = [abs(per_node["static"][n] - per_node["dynamic"][n]) for n in linear_names]
assert max(gaps) < 2, "the two recipes are equally accurate on this data"

# %%
# Where dynamic int8 pays: inputs unlike the calibration set. Make the test images twice as
# bright. The static model clips every activation at the range it calibrated; the dynamic
# model measures the new range. Compared with the float model on the same images, the
# static logits' SQNR collapses and the dynamic logits' hardly moves.

bright = 2 * test_images[:200]
with torch.no_grad():
    reference_logits = model(bright)
    shifted = {
        key: sqnr(reference_logits, m(bright)).item()
        for key, m in (("static", static), ("dynamic", dynamic))
    }
print({LABELS[key]: f"{value:.1f} dB" for key, value in shifted.items()}, "(images ×2)")
assert shifted["dynamic"] > 30 and shifted["static"] < 20, "static clips, dynamic adapts"

# %%
# Step 6 — prepare and convert by hand, dynamic too
# -------------------------------------------------
# ``common.handmade`` (M02) writes the same ``choose_qparams`` nodes: the converted code is
# torchao's, and so are the outputs, bit for bit.

by_hand = quantize(dynamic_x86(), by_hand=True)
assert by_hand.code == dynamic.code, "the same graph"
with torch.no_grad():
    assert torch.equal(by_hand(test_images), dynamic(test_images)), "the same outputs"
print("handmade dynamic == torchao dynamic")

# %%
# Summary
# -------
# ===================================  ==========================  ================================
# \                                    static int8                 dynamic int8
# ===================================  ==========================  ================================
# activation scale                     fixed at convert            ``choose_qparams`` per batch
# calibration                          activations and weights     weights only (any data)
# on the test set                      as accurate as fp32         the same
# on inputs ×2                         clips: SQNR collapses       adapts
# ===================================  ==========================  ================================
#
# Exercises
# ---------
# 1. Feed the dynamic model one test image at a time. Predict: are the logits equal to those
#    it gives the image inside the batch of 500?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          with torch.no_grad():
#              alone = torch.cat([dynamic(test_images[i : i + 1]) for i in range(20)])
#              in_batch = dynamic(test_images)[:20]
#          assert not torch.equal(alone, in_batch), "each batch has its own scales"
#
# 2. Lower the dynamic model with ``lower_pt2e_quantized_to_x86`` (M03-1) on a batch of 8.
#    Predict how many oneDNN int8 ops the lowered graph has.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
#
#          lowered = lower_pt2e_quantized_to_x86(dynamic, (test_images[:8],))
#          onednn = [str(n.target) for n in lowered.graph.nodes if "onednn" in str(n.target)]
#          assert onednn == ["onednn.qlinear_pointwise.tensor"], "the head: 2-D, like M05-1"
#
# Further reading
# ---------------
# - `PyTorch 2 Export Quantization with X86 Backend through Inductor
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
#   (dynamic quantization is one of its recipes)
# - `pytorch/ao#4307: calibration is a must for both static and dynamic quantization
#   <https://github.com/pytorch/ao/pull/4307>`_
#
# Next
# ----
# M05-3 chooses what to quantize, layer by layer.
