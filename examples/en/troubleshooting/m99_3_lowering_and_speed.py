"""
Troubleshooting: lowering and speed
===================================

After ``convert_pt2e``: an int8 model slower than the float one, a compiled int8 model that
silently runs float (grad on, or a recompile without freezing), a lowered graph that fails when
run, a transformer whose attention stays in float, and a compile cache cut short by a killed
compile. Each entry is headed by the exact
first line of the message (or the symptom in a reader's words), reproduces it on this site's
stack (torch 2.13, torchao 0.18), shows the cause, asserts the fix, and links to the lesson
that explains it.

**Prerequisites**: none; each entry links to the lesson that explains it.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# The quickstart's digits CNN (eight times the width of M04's) and ``small_cnn``, quantized
# with ``X86InductorQuantizer`` as the lowering lessons do.

import copy
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch.export import Dim

from common.aoti import compiled_package, kernels_ran
from common.data import digits, export_digits_model, train_digits_cnn
from common.expect import expect_error
from common.kernels import kernels_run
from common.lowering import reshape_views
from common.models import example_inputs, get_model
from common.numerics import sqnr
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import compare_speed, race, timing_threads
from common.viz import draw

quiet()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

x = example_inputs(8)
floating = get_model("small_cnn")


def quantize(model, args) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_module(model, args), x86_quantizer())
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


def quantize_digits(model) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_digits_model(model), x86_quantizer())  # a dynamic batch
    with torch.no_grad():
        prepared(digits("calibration")[0])
    return convert_pt2e(prepared)


simulated = quantize(floating, x)
wide = train_digits_cnn(width=8)
wide_int8, narrow = quantize_digits(wide), quantize_digits(train_digits_cnn())
images = digits("test")[0]

# %%
# int8 is slower than float
# -------------------------
# The model that ``convert_pt2e`` returns runs slower than the float model it came from. The
# timings (one thread, interleaved rounds; printed, never asserted):

print(compare_speed({"fp32": wide, "int8 q/dq": wide_int8}, (images,), rounds=10).table())

# %%
# **Cause**, on the graph: nothing in it computes in int8. Each conv and linear still runs in
# float, between a dequantize and a quantize (highlighted) that only *simulate* int8 — extra
# work on top of the float model's.

floats = [
    n.name
    for n in wide_int8.graph.nodes
    if n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
]
draw(wide_int8, highlight=floats, title="After convert_pt2e: float convs and linears between q/dq")
assert len(floats) == 5, "the three convs and two linears still compute in float"
print(f"kernels the q/dq model runs: {kernels_run(wide_int8, (images,)).summary}")

# %%
# **Fix**: compile both models with ``torch.compile`` and
# ``torch._inductor.config.freezing = True`` (off by default: that is the trap; without it the
# compiled int8 model is still simulated), under ``torch.no_grad()``, at the thread count you
# time with, and check which kernels ran. ``common.timing.race`` does all of it. On a CPU with
# VNNI, int8 now runs several times faster than fp32; without VNNI the lead is smaller
# (:ref:`M03-3 · Speed and size, measured
# <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`). Eagerly,
# ``lower_pt2e_quantized_to_x86`` gives int8 kernels too (and needs the fix of a later entry).

assert inductor_config.freezing is False, "freezing is off unless you turn it on"
raced = race({"fp32": wide, "int8": wide_int8}, (images,), rounds=10)
print(raced.table())
assert not raced.kernels["int8"].float, "no float conv or linear is left"
print(f"int8 runs {raced.ratio('fp32', 'int8'):.2f}× as fast as fp32")

# %%
# The compiled int8 model runs float convs (freezing on, grad on)
# ---------------------------------------------------------------
# Freezing is on, the model compiled without an error, and yet the profiler shows float convs
# and matmuls, no int8 kernel: the model was compiled and called with autograd on.

threads = torch.get_num_threads()
torch.set_num_threads(timing_threads())  # compile and run at one thread count (race's rule)
inductor_config.freezing = True
graded = torch.compile(copy.deepcopy(narrow))
graded(images)  # grad is on: the default outside torch.no_grad()
ran = kernels_run(graded, (images,))
print(f"grad on: {ran.summary}")
assert ran.float and not ran.int8, "float convs, no int8 kernel"

# %%
# **Cause**: inductor freezes only when grad is off (``torch/_inductor/compile_fx.py``:
# ``if config.freezing and not torch.is_grad_enabled()``); with grad on it compiles the model
# for training, weights as inputs, and finds no int8 pattern. No warning says so.
#
# **Fix**: compile and call it under ``torch.no_grad()`` (or ``torch.inference_mode()``).
# Dynamo guards on the grad mode, so the same compiled model recompiles, frozen. The fair
# race is explained in
# :ref:`M03-3 · Speed and size, measured <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.

with torch.no_grad():
    graded(images)
    ran = kernels_run(graded, (images,))
print(f"no_grad: {ran.summary}")
assert ran.int8 and not ran.float, "int8 kernels only"

# %%
# The counters say int8, the profiler says float
# ----------------------------------------------
# Inductor's counters report the int8 convs it prepacked, yet the model runs float convs. The
# freezing was set with ``config.patch`` around the first call, and a later call with another
# input shape (or after ``torch._dynamo.reset()``) recompiled outside that block.

# What such a block around the first call amounts to, written out: freezing on for the first
# compile, back to the default (off) when the block ends, before the recompile.
counters.clear()
inductor_config.freezing = True
with torch.no_grad():
    patched = torch.compile(copy.deepcopy(narrow))
    patched(images)
inductor_config.freezing = False
packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
with torch.no_grad():
    patched(images[:100])  # another batch size: dynamo recompiles, now without freezing
    ran = kernels_run(patched, (images[:100],))
print(f"convs prepacked, says inductor: {packed}; batch of 100 ran {ran.summary}")
assert packed == 3 and ran.float and not ran.int8, "the counters describe the first compile"

# %%
# **Cause**: ``config.patch`` sets freezing only while the block runs; a recompile happens at
# the call that needs it, outside the block, with the default (off). The counters are a
# compile-time record: they still show the first compile's prepacks.
#
# **Fix**: set ``torch._inductor.config.freezing = True`` for the process, compile with
# ``dynamic=False`` (the next entry says why), and check the kernels with the profiler
# (``common.kernels.kernels_run``) on the shapes you serve. ``common.timing.race`` does all
# three. Each new batch size now compiles once more, frozen. The profiler's check is taught in
# :ref:`M03-3 · Speed and size, measured <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.

inductor_config.freezing = True
with torch.no_grad():
    steady = torch.compile(copy.deepcopy(narrow), dynamic=False)
    steady(images)
    steady(images[:100])
    ran = kernels_run(steady, (images[:100],))
print(f"freezing for the process, batch of 100: {ran.summary}")
assert ran.int8 and not ran.float, "the recompile is frozen too"

# %%
# AssertionError: expected size 8==8, stride 1==64 at dim=1
# ---------------------------------------------------------
# A frozen int8 model, compiled with the default ``dynamic=None``, runs on its first batch
# size and fails on the second. The message goes on with the other dimensions, then
# "Error in op: ... _register_quantized_conv_lowering".

with torch.no_grad():
    dynamic = torch.compile(copy.deepcopy(narrow))
    dynamic(images)
with expect_error(AssertionError, match="expected size 8==8, stride 1==64 at dim=1"):
    with torch.no_grad():
        dynamic(images[:100])

# %%
# **Cause**: on the second batch size dynamo recompiles with a *dynamic* batch dimension.
# For an int8 conv whose input has **one channel** (``conv1`` here, on grey images), inductor
# then declares the output contiguous (NCHW), stride 64 across the 8 channels: a rule written
# for the float conv, which is not prepacked under a symbolic batch and does write NCHW from
# one channel (``_prepare_convolution_fusion_create`` in ``torch/_inductor/mkldnn_ir.py``).
# oneDNN's prepacked int8 conv returns it channels-last (NHWC), stride 1, and the compiled
# code's check of the strides stops (torch 2.13, torchao 0.18). The next entry but one has
# the trigger in a few lines.
#
# **Fix**: ``torch.compile(model, dynamic=False)``: every batch size gets code of its own,
# frozen, as the previous entry showed. Serve a few fixed batch sizes, or pad to them.
# ``race`` compiles this way
# (:ref:`M03-3 · Speed and size, measured <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`).

with torch.no_grad():
    assert steady(images[:37]).shape == (37, 10), "static code for one more batch size"
inductor_config.freezing = False
torch.set_num_threads(threads)

# %%
# An AOTInductor package runs float convs (compiled without freezing)
# -------------------------------------------------------------------
# ``aoti_compile_and_package`` compiles the converted model without an error, the package
# loads and its outputs are right, and it runs no int8 kernel: its convs are float ones, and
# nothing says so (pytorch/ao#4566, open). Compiled with ``kernel_profile=True``, the loaded
# package shows the kernels it ran under the profiler (``common.aoti.kernels_ran``):

program = torch.export.export(narrow, (images[:8],))
plain = compiled_package(program, "digits_int8_no_freezing", freezing=False, kernel_profile=True)
ran_plain = kernels_ran(torch._inductor.aoti_load_package(str(plain)), (images[:8],))
print(dict(ran_plain))
assert "convolution" in ran_plain and not any(k.startswith("q") for k in ran_plain), (
    "float convs, no int8"
)

# %%
# **Cause**: the passes that fuse dq → conv → q into oneDNN's int8 kernels are freezing
# passes: they need the weights as constants to prepack them. Without freezing, the weights
# are inputs of the compiled code, and the q/dq pattern is written as dequantizing arithmetic
# and a float conv, as in ``torch.compile`` without freezing (M03-3).
#
# **Fix**: compile with ``inductor_configs={"freezing": True}`` (``compiled_package``'s
# default), and check with the profiler that the loaded package runs ``qconv_pointwise``.
# Explained in :ref:`M03-4 · Shipping an int8 model
# <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`.

frozen = compiled_package(program, "digits_int8_frozen", kernel_profile=True)
ran_frozen = kernels_ran(torch._inductor.aoti_load_package(str(frozen)), (images[:8],))
print(dict(ran_frozen))
assert ran_frozen["qconv_pointwise"] and "convolution" not in ran_frozen, "int8 convs, no float"

# %%
# An AOTInductor package with a dynamic batch gives wrong outputs
# ---------------------------------------------------------------
# The converted model, exported with a dynamic batch and compiled with freezing, runs int8
# kernels (the profiler shows them), and its outputs are noise: an SQNR near 0 dB against the
# q/dq model, and no error. (``check=False`` asks ``compiled_package`` for it unchecked: the
# fix shows why.)

up_to_8 = ({0: Dim("batch", min=1, max=8)},)
dynamic_program = torch.export.export(narrow, (images[:8],), dynamic_shapes=up_to_8)
dynamic_package = compiled_package(
    dynamic_program, "digits_int8_batch_1_8", kernel_profile=True, check=False
)
noisy = torch._inductor.aoti_load_package(str(dynamic_package))
noise = sqnr(narrow(images[:5]), noisy(images[:5])).item()
print(f"{dict(kernels_ran(noisy, (images[:5],)))}; SQNR {noise:.1f} dB")
assert noise < 10 and kernels_ran(noisy, (images[:5],))["qconv_pointwise"], (
    "int8 kernels, wrong numbers"
)

# %%
# **Cause**: the stride entry's bug, without the stop. The package declares ``conv1``'s output
# contiguous (one input channel, a symbolic batch), oneDNN writes it channels-last, and the
# code inductor generated after the conv reads it in the declared layout. The stride check is
# compiled into the package too, but runs only when ``AOTI_RUNTIME_CHECK_INPUTS=1`` is set in
# the environment of the process that loads it; with it, batch 5, inside the bound, stops
# with the stride entry's message:

CHECKED = f"""
import torch
runner = torch._inductor.aoti_load_package({str(dynamic_package)!r})
runner(torch.zeros(5, 1, 8, 8))
"""
env = {**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"}
child = subprocess.run([sys.executable, "-c", CHECKED], env=env, capture_output=True, text=True)
refusal = next(line for line in child.stderr.splitlines() if line.startswith("RuntimeError"))
print(refusal[:80])
assert refusal.startswith("RuntimeError: expected size 8==8, stride 1==64 at dim=1"), "batch 5"

# %%
# The trigger in a few lines, with no helper of this course, to report upstream: an int8 conv
# and a flatten, packaged with a batch from 1 to 4. One input channel gives noise, near 0 dB;
# three give the q/dq model's numbers up to the int8 kernels' rounding, well above 10 dB on
# either kernel path.

import torch
from torch.export import Dim, export
from torchao.quantization.pt2e import quantize_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86


def package_sqnr(channels: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(channels, 8, 3), torch.nn.Flatten()).eval()
    x, batch = torch.randn(3, channels, 6, 5), ({0: Dim("batch", min=1, max=4)},)
    config = x86.get_default_x86_inductor_quantization_config()
    prepared = quantize_pt2e.prepare_pt2e(
        export(model, (x,), dynamic_shapes=batch).module(),
        x86.X86InductorQuantizer().set_global(config),
    )
    prepared(x)
    q = quantize_pt2e.convert_pt2e(prepared)
    with torch.no_grad():
        exported = export(q, (x,), dynamic_shapes=batch)
        path = torch._inductor.aoti_compile_and_package(
            exported, inductor_configs={"freezing": True}
        )
        out, ref = torch._inductor.aoti_load_package(path)(x), q(x)
    return (10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean())).item()


by_channels = {channels: package_sqnr(channels) for channels in (1, 3)}
print({channels: f"{db:.1f} dB" for channels, db in by_channels.items()})
assert by_channels[1] < 10 < by_channels[3], "one input channel: noise; three: int8 rounding"

# %%
# **Fix**: check the numbers. ``common.aoti.compiled_package`` compares a package's outputs
# with its program's before handing it out, and refuses this one:

with expect_error(RuntimeError, match="computes other numbers than the program"):
    compiled_package(dynamic_program, "digits_int8_batch_1_8", kernel_profile=True)

# %%
# Then serve a static package per batch size, or one for the largest batch with smaller
# batches padded with zeros (each sample is computed on its own); or keep the dynamic batch
# and leave the one-channel conv float (``set_module_name_qconfig("conv1", None)``), or give
# it more input channels, as the three channels above. Explained in
# :ref:`M06-4 · Shapes that change <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`.

static_runner = torch._inductor.aoti_load_package(str(frozen))  # the batch-8 package above
filler = images[:3].new_zeros(3, *images.shape[1:])
padded = static_runner(torch.cat([images[:5], filler]))[:5]
padded_sqnr = sqnr(narrow(images[:5]), padded).item()
print(f"batch 5 padded to 8: SQNR {padded_sqnr:.1f} dB")
assert padded_sqnr > 30, "the q/dq model's numbers"

# %%
# RuntimeError: view size is not compatible with input tensor\'s size and stride
# ------------------------------------------------------------------------------
# A graph lowered by ``lower_pt2e_quantized_to_x86`` fails when run eagerly, if a ``flatten``
# follows an int8 conv (torchao 0.18). The message goes on: "(at least one dimension spans
# across two contiguous subspaces). Use .reshape(...) instead."

failing = lower_pt2e_quantized_to_x86(simulated, x)
with expect_error(RuntimeError, match="view size is not compatible"):
    failing(*x)
lowered = lower_pt2e_quantized_to_x86(simulated, x)

# %%
# **Cause**, on the graph: oneDNN's int8 conv returns a **channels-last** tensor (NHWC in
# memory); the ``view`` that ``flatten`` was traced to (highlighted) cannot regroup an NHWC
# tensor without copying. ``torch.compile`` of this lowered graph fails the same way (its
# fake tensors have the same strides, M03-1); compiling the q/dq graph with freezing works,
# since inductor then lowers it itself and picks the layouts.

views = failing.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default)
draw(failing, highlight=[n.name for n in views], title="The view after the int8 conv")
assert len(views) == 1

# %%
# **Fix**: replace each ``view`` by a ``reshape``, which copies only when it must
# (``common.lowering.reshape_views``); the values are the same. Explained in
# :ref:`M03-1 · The lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`.

print(f"changed: {reshape_views(failing)}")
reshape_views(lowered)
assert torch.equal(failing(*x), lowered(*x)), "the fixed graph runs, and gives the same values"

# %%
# A transformer's attention stays float
# -------------------------------------
# Quantized with the default x86 config, an ``nn.TransformerEncoderLayer`` gets int8 weights
# in its two feed-forward linears only; the attention's projections stay float.

tokens = (torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(0)),)
torch.manual_seed(0)
encoder = quantize(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval(), tokens)


def linears(gm) -> dict[str, bool]:
    """Each linear node: does its weight come through a dequantize (int8), or stay float?"""
    return {
        n.name: "dequantize" in str(n.args[1].target)
        for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    }


print(f"int8 weight per linear: {linears(encoder)}")
assert list(linears(encoder).values()) == [False, False, True, True], "attention's stay float"

# %%
# **Cause**, on the graph: ``nn.MultiheadAttention`` calls ``F.linear`` with its packed
# ``in_proj_weight``, and its ``out_proj`` is called the same way, inside the attention's
# ``forward``: the quantizer looks for ``nn.Linear`` modules and finds only
# ``MultiheadAttention`` in those nodes' ``nn_module_stack``.

for node in encoder.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
    print(node.name, "from", list(node.meta["nn_module_stack"].values())[-1][1])

# %%
# **Fix**: write the attention with an ``nn.Linear`` per projection and
# ``F.scaled_dot_product_attention``; all four projections then get int8 weights. Explained in
# :ref:`M05-1 · What the quantizer sees in attention
# <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`.


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


attention = quantize(Attention().eval(), tokens)
print(f"int8 weight per linear: {linears(attention)}")
assert all(linears(attention).values()) and len(linears(attention)) == 4

# %%
# BackendCompilerFailed: backend=\'inductor\' raised: ImportError: ….main.so: file too short
# ------------------------------------------------------------------------------------------
# ``torch.compile`` worked yesterday; today the same script stops before the first call, with
# an ``ImportError`` naming a ``….main.so`` in inductor's cache folder. A compile that was
# killed while it wrote that file (Ctrl-C, a time limit, a full disk) left it cut short, and
# the next process that compiles the same graph finds it in the cache and loads it. Here, in a
# cache folder of its own, a process compiles a small function, the library is cut as a
# killed compile leaves it, and the next process fails:

SMALL_COMPILE = """
import torch
print(torch.compile(lambda x: (x.sin() + 1).relu())(torch.ones(8)).sum().item())
"""


def compile_in_a_new_process(cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    return subprocess.run(
        [sys.executable, "-c", SMALL_COMPILE], env=env, capture_output=True, text=True
    )


cache = tempfile.mkdtemp(prefix="inductor-")
assert compile_in_a_new_process(cache).returncode == 0, "the first compile fills the cache"
library = next(Path(cache).rglob("*.main.so"))
library.write_bytes(b"")  # what a compile killed as it began writing the file leaves
failed = compile_in_a_new_process(cache)
message = next(line for line in failed.stderr.splitlines() if "file too short" in line)
print(message.replace(cache, "<cache>"))
assert failed.returncode != 0 and message.startswith("ImportError"), "the cut file is loaded"

# %%
# **Cause**: inductor names a compiled library after the code it generates and compiles it
# only when no file of that name exists (``torch/_inductor/codecache.py``): a file that exists
# is loaded as it is, whole or not, and the dynamic loader refuses one shorter than an ELF
# header. (Cut later, past its header, the same file gives ``ImportError: ….main.so: cannot
# read file data``: the same cause, the same fix.) The folder is ``TORCHINDUCTOR_CACHE_DIR``
# when set, else ``/tmp/torchinductor_<user>``, shared by every process of that user.
#
# **Fix**: delete the file the message names (or the whole cache folder: it is only a cache),
# and compile again. A job that may be killed mid-compile can use a cache folder of its own
# (``TORCHINDUCTOR_CACHE_DIR``), as this site's build does. Compiling is explained in
# :ref:`M03-3 · Speed and size, measured <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.

library.unlink()
again = compile_in_a_new_process(cache)
print(again.stdout.strip())
assert again.returncode == 0 and float(again.stdout) > 0, "recompiled, runs"
shutil.rmtree(cache)

# %%
# Next
# ----
# :ref:`Troubleshooting: accuracy, eval and QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`.
