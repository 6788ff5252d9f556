"""
Troubleshooting: imports and export
===================================

The errors and silent surprises met before quantization starts: imports that moved from
``torch.ao`` to torchao, a graph exported for one batch size, and what non-strict export
(``torch.export``'s default) leaves out of the graph; and, at the other end, a saved quantized
program that a fresh process cannot load. Each entry is headed by the exact first
line of the message (or the symptom in a reader's words), reproduces it on this site's stack
(torch 2.13, torchao 0.18), shows the cause, asserts the fix, and links to the lesson that
explains it.

**Prerequisites**: none; each entry links to the lesson that explains it.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``expect_error`` runs a block that must fail and prints the error's type and first line;
# the page fails to build the day the error stops happening.

import builtins
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet, x86_quantizer
from common.viz import draw

quiet()

x = example_inputs(8)


def in_fresh_python(source: str) -> None:
    """Run ``source`` in a new Python process; raise its error here (its stderr attached)."""
    child = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True)
    if child.returncode:
        name, _, message = child.stderr.strip().splitlines()[-1].partition(": ")
        error = getattr(builtins, name)(message)
        error.stderr = child.stderr
        raise error


# %%
# ModuleNotFoundError: No module named \'torch.ao.quantization.quantize_pt2e\'
# ----------------------------------------------------------------------------
# Older code and tutorials import the PT2E entry points from ``torch.ao``. They moved
# to torchao, and torch 2.13 no longer has the module.

with expect_error(ModuleNotFoundError, match="torch.ao.quantization.quantize_pt2e"):
    importlib.import_module("torch.ao.quantization.quantize_pt2e")

# %%
# **Fix**: import them from torchao (``torchao.quantization.pt2e`` does not re-export them;
# the module ``quantize_pt2e`` does). The same flow then runs. Explained in
# :ref:`M01-1 · The PT2E flow end to end
# <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`.

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
calibrate(prepared)
assert op_counts(convert_pt2e(prepared))["quantize_per_tensor.default"] > 0, (
    "torchao's prepare/convert quantize the conv"
)

# %%
# ModuleNotFoundError: No module named \'torch.ao.quantization.quantizer\'
# ------------------------------------------------------------------------
# The quantizers moved too: ``torch.ao.quantization.quantizer.x86_inductor_quantizer`` is gone.
# Old code that still finds a ``torch.ao`` quantizer (an older torch in another environment)
# mixes two copies of the PT2E classes; torchao's ``prepare_pt2e`` only understands its own.

with expect_error(ModuleNotFoundError, match="torch.ao.quantization.quantizer"):
    importlib.import_module("torch.ao.quantization.quantizer.x86_inductor_quantizer")

# %%
# **Fix**: take the quantizer, its config and every spec and observer from torchao — all of
# them (a ``torch.ao`` observer inside a torchao spec quantizes nothing, see
# :ref:`prepare and convert <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`).
# Explained in
# :ref:`M01-1 · The PT2E flow end to end
# <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`.

from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
assert type(quantizer).__module__.startswith("torchao."), "the quantizer is torchao's"

# %%
# AssertionError: Guard failed: x.size()[0] == 8
# ----------------------------------------------
# The graph was exported (or calibrated) with batches of 8 and is then called with 4.
# ``torch.export`` specialises every dimension it is not told is dynamic, and the
# ``_guards_fn`` node at the top of ``.module()`` checks the input before anything runs — in
# the exported graph and, as here, in the prepared one that ``calibrate`` feeds. The number
# is the example's batch size, whatever it was: ``== 1``, ``== 32``, …

fixed = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
calibrate(fixed)
with expect_error(AssertionError, match="Guard failed: x.size()[0] == 8"):
    fixed(*example_inputs(4))
single = export_module(get_model("small_cnn"), example_inputs(1))
with expect_error(AssertionError, match="Guard failed: x.size()[0] == 1"):
    single(*x)

# %%
# **Fix**: export with the batch dimension declared dynamic; calibration and every later
# call may then use any batch size. Explained in
# :ref:`M00-1 · Getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.

batch = torch.export.Dim("batch")
program = torch.export.export(get_model("small_cnn"), x, dynamic_shapes=({0: batch},))
dynamic = prepare_pt2e(program.module(), x86_quantizer())
calibrate(dynamic)
converted = convert_pt2e(dynamic)
assert converted(*example_inputs(4)).shape == (4, 10), "batch 4 runs after calibrating on 8"

# %%
# torch._dynamo.exc.UserError: Constraints violated (batch)!
# ----------------------------------------------------------
# The batch dimension is declared dynamic, as the previous entry advises, but the example
# given to ``torch.export`` has a batch of 1. The message goes on: "You marked batch as
# dynamic but your code specialized it to be a constant (1)."

with expect_error(torch._dynamo.exc.UserError, match="Constraints violated (batch)!"):
    torch.export.export(get_model("small_cnn"), example_inputs(1), dynamic_shapes=({0: batch},))

# %%
# **Cause**: export specialises every dimension of size 0 or 1 (a size-1 dimension
# broadcasts, so the graph traced for it may not hold for other sizes); a dimension declared
# dynamic and then specialised is a violated constraint.
#
# **Fix**: export on an example batch of at least 2; the program then takes any batch size,
# 1 included (``common.data.export_digits_model`` exports on 2 images for this reason).
# Dynamic dimensions are explained in
# :ref:`M00-1 · Getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`.

program = torch.export.export(
    get_model("small_cnn"), example_inputs(2), dynamic_shapes=({0: batch},)
)
assert program.module()(*example_inputs(1)).shape == (1, 10), "batch 1 runs after exporting on 2"

# %%
# AssertionError: Guard failed: x.size()[0] <= 4
# ----------------------------------------------
# The batch was exported dynamic with an upper bound, ``Dim("batch", max=4)``, and the model
# is then called with a batch of 8. The same ``_guards_fn`` checks the range: ``<= 4`` past
# the maximum, ``>= 2`` below a minimum of 2. The number is the bound, not the example.

bounded = torch.export.export(
    get_model("small_cnn"), example_inputs(2), dynamic_shapes=({0: Dim("batch", max=4)},)
)
bounded_model = prepare_pt2e(bounded.module(), x86_quantizer())
bounded_model(*example_inputs(2))  # calibrated on one batch of 2
bounded_model = convert_pt2e(bounded_model)
with expect_error(AssertionError, match="Guard failed: x.size()[0] <= 4"):
    bounded_model(*x)

# %%
# **Cause**: the bound is part of the program (its ``range_constraints``); every target made
# from it keeps it: the q/dq model raises this, a ``.pte`` refuses the input with
# ``method->set_inputs() ... failed with error 0x10`` (m99_5), and memory on the edge is planned
# for the maximum.
#
# **Fix**: export with the bound your deployment needs (it costs memory on a ``.pte``), or
# split a larger batch into pieces of at most the bound. A bounded batch through every target
# is :ref:`M06-4 · Shapes that change
# <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`.

wider = torch.export.export(
    get_model("small_cnn"), example_inputs(2), dynamic_shapes=({0: Dim("batch", max=8)},)
)
wider_model = prepare_pt2e(wider.module(), x86_quantizer())
wider_model(*example_inputs(2))  # calibrated on one batch of 2
wider_model = convert_pt2e(wider_model)
assert wider_model(*x).shape == (8, 10), "a batch of 8 runs under a bound of 8"

# %%
# KeyError: \'source_fn_stack\'
# -----------------------------
# Code that reads ``node.meta["source_fn_stack"]`` (older quantizers, pattern matchers,
# ``get_source_partitions``) finds nothing: ``torch.export.export`` traces
# **non-strict** by default (``strict=False``), which does not record ``source_fn_stack``.

nonstrict = torch.export.export(get_model("conv_relu"), x).module()
(conv,) = nonstrict.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default)
with expect_error(KeyError, match="source_fn_stack"):
    conv.meta["source_fn_stack"]

# %%
# **Fix**: read ``nn_module_stack``, which both modes record (the module path and class of
# each node), or export with ``strict=True`` where the code needs ``source_fn_stack``.
# Explained in
# :ref:`M00-2 · Anatomy of a node <sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>`.

print("nn_module_stack:", list(conv.meta["nn_module_stack"].values())[-1])
strict = torch.export.export(get_model("conv_relu"), x, strict=True).module()
(strict_conv,) = strict.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default)
print("strict source_fn_stack:", strict_conv.meta["source_fn_stack"][-1])
assert strict_conv.meta["source_fn_stack"][-1][1] is nn.Conv2d


# %%
# Nothing got quantized (a model that calls ``F.conv2d``)
# -------------------------------------------------------
# A model that calls ``F.conv2d`` with its own weight, not an ``nn.Conv2d``, comes out of
# ``convert_pt2e`` with no quantize node at all, and no error. ``X86InductorQuantizer`` finds
# convs by the module that produced them or by ``source_fn_stack``; under non-strict export a
# functional call has neither.


class FunctionalConv(nn.Module):
    def __init__(self):
        super().__init__()
        seeded = torch.Generator().manual_seed(0)  # the same weights whatever ran before
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3, generator=seeded) / 10)
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        return F.relu(F.conv2d(x, self.weight, self.bias, padding=1))


def quantized(program) -> torch.fx.GraphModule:
    model = prepare_pt2e(program.module(), x86_quantizer())
    calibrate(model)
    return convert_pt2e(model)


silent = quantized(torch.export.export(FunctionalConv(), x))
quantize_count = op_counts(silent)["quantize_per_tensor.default"]
print(f"quantize nodes after non-strict export: {quantize_count}")
assert quantize_count == 0, "nothing got quantized, and nothing was raised"

# %%
# **Fix**: export with ``strict=True`` (which records ``source_fn_stack``), or use
# ``nn.Conv2d``. The picture is the converted graph: the conv now reads dequantized input and
# weight. Explained in
# :ref:`M02-1 · What a quantizer writes
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`.

fixed_conv = quantized(torch.export.export(FunctionalConv(), x, strict=True))
qdq = [n.name for n in fixed_conv.graph.nodes if "quantize_per" in str(n.target)]
draw(fixed_conv, highlight=qdq, title="strict=True: F.conv2d gets its quantize/dequantize nodes")
assert op_counts(fixed_conv)["quantize_per_tensor.default"] > 0, (
    "strict export: the functional conv is quantized"
)

# %%
# RuntimeError: We ran into an error when deserializing the saved file.
# ---------------------------------------------------------------------
# A converted model, exported and saved with ``torch.export.save``, is loaded with
# ``torch.export.load`` in another process — a server, a restarted notebook — that imported
# torch but not torchao (the line goes on: "Please check the warnings above for possible
# errors."). Reported on torch 2.3 as ``TypeError: import_nn_module_stack() takes 3 positional
# arguments but 4 were given``
# (`pytorch/pytorch#126063 <https://github.com/pytorch/pytorch/issues/126063>`_); that bug is
# fixed, and on torch 2.13 this error is what is left.

folder = Path(tempfile.mkdtemp())
saved = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
calibrate(saved)
saved = convert_pt2e(saved)
torch.export.save(torch.export.export(saved, x), folder / "int8.pt2")
torch.save(x, folder / "x.pt")
LOAD = f"""
import torch
program = torch.export.load({str(folder / "int8.pt2")!r})
torch.save(program.module()(*torch.load({str(folder / "x.pt")!r})), {str(folder / "y.pt")!r})
"""
with expect_error(RuntimeError, match="error when deserializing the saved file") as caught:
    in_fresh_python(LOAD)

# %%
# **Cause**: the warnings above the error (torch logs them to the child's stderr) name the
# first operator that could not be resolved. The program's quantize and dequantize nodes call
# operators of the ``quantized_decomposed`` namespace, which are registered when torchao is
# imported; ``import torch`` alone does not register them.

(cause,) = {
    line.split("SerializeError: ")[1].split(". ")[0]
    for line in caught.error.stderr.splitlines()
    if "SerializeError: We failed to resolve" in line
}
print(cause)
assert "torch.ops.quantized_decomposed." in cause, "the quantize operators are not registered"

# %%
# **Fix**: import torchao before ``torch.export.load`` (``import torchao.quantization.pt2e``
# registers the operators). The loaded program then gives the converted model's output,
# exactly. Saving and loading programs is explained in
# :ref:`M03-4 · Shipping an int8 model <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`.

in_fresh_python("import torchao.quantization.pt2e\n" + LOAD)
loaded_output = torch.load(folder / "y.pt")
assert torch.equal(loaded_output, saved(*x)), "the loaded program computes what was saved"

# %%
# Next
# ----
# :ref:`Troubleshooting: prepare and convert
# <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`.
