"""
M03-4 Shipping an int8 model
============================

A quantized model in memory is not yet a product. This lesson ships the int8 digits CNN two
ways: as a program file (``torch.export.save``) that loads back with outputs equal bit for bit
and is compiled where it runs; and as an **AOTInductor** package (``aoti_compile_and_package``),
a ``.pt2`` archive of machine code already compiled with the int8 kernels, which runs after
loading, without torchao and without a compiler. It weighs both, times the loading, and sets
the threads a server should use.

**What you will learn**

- Saving and loading the converted program, and compiling it after loading
- Compiling ahead of time with AOTInductor: what is inside the package, what it costs
- How many threads and processes to serve with

**Prerequisites**:
:ref:`M03-3 · speed and size <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`
(freezing), :ref:`M04-1 · measuring the error
<sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>` (the digits CNN).
``torch.compile`` and AOTInductor need a C++ compiler (``g++``).
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The digits CNN of M04, quantized with ``X86InductorQuantizer``'s defaults and calibrated on
# the 200 calibration images, exactly as on the quickstart page.

import os
import tempfile
import time
import warnings
from pathlib import Path

import torch

from common.aoti import compiled_package, kernel_calls
from common.data import accuracy, digits, export_digits_model, train_digits_cnn
from common.kernels import kernels_run
from common.pt2e import quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw

quiet()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about.
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

images, labels = digits("test")
prepared = prepare_pt2e(export_digits_model(train_digits_cnn()), x86_quantizer())
with torch.no_grad():
    prepared(digits("calibration")[0])
int8_model = convert_pt2e(prepared)
folder = Path(tempfile.mkdtemp())  # where this lesson writes its files

# %%
# Step 1 — Save and load the program
# ----------------------------------
# ``torch.export.save`` writes an ``ExportedProgram``: the graph, its weights and an example
# input, in one zip file. The converted model is exported again first, with a dynamic batch
# dimension, so the saved program accepts any number of images. ``torch.export.load`` gives
# back a program whose outputs are **equal bit for bit** to the model's: the same graph, the
# same int8 weights, the same float kernels. (As in M03-3, a fresh ``GraphModule`` leaves
# behind the float weights that convert keeps on the submodules, unused.)

lean, batch = torch.fx.GraphModule(int8_model, int8_model.graph), torch.export.Dim("batch")
program = torch.export.export(lean, (images[:2].clone(),), dynamic_shapes=({0: batch},))
saved = folder / "digits_int8.pt2"
torch.export.save(program, saved)
started = time.perf_counter()
loaded = torch.export.load(saved)
load_seconds = time.perf_counter() - started
print(f"{saved.name}: {saved.stat().st_size / 1e3:.0f} kB, loaded in {load_seconds:.2f} s")
with torch.no_grad():
    reference = int8_model(images)
    assert torch.equal(loaded.module()(images), reference), "loading changes no bit"
qdq = [n.name for n in loaded.module().graph.nodes if "quantize_per" in str(n.target)]
draw(loaded.module(), highlight=qdq, title="Loaded from digits_int8.pt2: the same q/dq graph")

# %%
# Step 2 — Compile the loaded program with freezing
# -------------------------------------------------
# The loaded program is still the q/dq simulation (M03-1). On the serving machine it is
# compiled like any model: with **freezing** set for the process, under ``torch.no_grad()``,
# one compile per input shape (``dynamic=False``), or it stays slow (M03-3 and the
# quickstart's checklist). The profiler shows the int8 kernels running from the loaded graph
# as from the original.

torch._inductor.config.freezing = True  # for the process: a recompile must keep it (m99_3)
started = time.perf_counter()
with torch.no_grad():
    compiled = torch.compile(loaded.module(), dynamic=False)
    compiled_out = compiled(images)
    compile_seconds = time.perf_counter() - started
    ran = kernels_run(compiled, (images,))
print(f"compiled in {compile_seconds:.1f} s; ran {ran.summary}")
assert ran.int8["onednn::qconv_pointwise"] == 3 and not ran.float, "the three convs run int8"
int8_accuracy = accuracy(compiled)
print(f"compiled int8 accuracy: {int8_accuracy:.1%}; q/dq model: {accuracy(loaded.module()):.1%}")
assert abs(int8_accuracy - accuracy(loaded.module())) <= 0.01, "real int8 kernels, same answers"

# %%
# That compile runs on every start of the server, and the serving machine needs a C++
# compiler for it. **AOTInductor** does it once, ahead of time.
#
# Step 3 — Compile ahead of time with AOTInductor
# -----------------------------------------------
# ``torch._inductor.aoti_compile_and_package`` takes an ``ExportedProgram``, runs inductor on
# it — freezing on, so the same int8 patterns fire — compiles the generated C++ into a shared
# library and packs it, with the prepacked weights, into a ``.pt2`` file.
# ``torch._inductor.aoti_load_package`` loads it back as a callable.
#
# Two things follow from "machine code". The package is compiled for the input shapes of the
# program it was given: here, a batch of 500 images (exercise 2 shows what another batch
# does). And it is built for one PyTorch version and one CPU's instruction set. So a package
# is kept under a key of everything that made it: the graph's code and its weights (what it
# computes, with what), the input shapes, the PyTorch version, the CPU's kernel path, and the
# thread count (inductor writes it into the loops it generates). The saved file makes no key:
# its bytes change from one compile to the next. ``common.aoti.compiled_package`` compiles
# only when the key is new and names the file after it, so rebuilding this page does not
# recompile.

fixed = torch.export.export(loaded.module(), (images,))  # the package's program: 500 images
package = compiled_package(fixed, "digits_int8_aoti")
started = time.perf_counter()
runner = torch._inductor.aoti_load_package(str(package))
aoti_load_seconds = time.perf_counter() - started
with torch.no_grad():
    served = runner(images)
print(f"{package.name}: {package.stat().st_size / 1e3:.0f} kB, loaded in {aoti_load_seconds:.2f} s")
assert torch.equal(served, compiled_out), "the same kernels as torch.compile, the same numbers"

# %%
# What makes the package int8: its generated C++ (``wrapper.cpp`` in the archive, beside the
# compiled library) calls oneDNN's int8 conv kernel for each of the three convs and its int8
# linear kernel for each of the two linears, and no other kernel of ATen's.
# ``kernel_calls`` counts those calls.

calls = kernel_calls(package)
for kernel, count in calls.items():
    print(f"{kernel:18} × {count}")
assert calls == {"qconv_pointwise": 3, "qlinear_pointwise": 2}, "int8 kernels, and only those"

# %%
# Size and loading time side by side. The program file is mostly weights and the graph's
# description; the package adds the compiled library and the runtime around it, so it is
# larger — the price of starting without a compiler.

program_kb, package_kb = saved.stat().st_size / 1e3, package.stat().st_size / 1e3
print(f"{'':24} {'size':>8} {'ready in':>9}")
print(f"{'program (export.save)':24} {program_kb:5.0f} kB {load_seconds:8.2f} s")
print(f"{'  + torch.compile':24} {'':8} {load_seconds + compile_seconds:8.2f} s")
print(f"{'AOTInductor package':24} {package_kb:5.0f} kB {aoti_load_seconds:8.2f} s")

# %%
# Step 4 — Threads for serving
# ----------------------------
# The package's int8 kernels run on PyTorch's intra-op threads: ``torch.set_num_threads(n)``
# at the start of the server (or ``OMP_NUM_THREADS=n`` in its environment) sets how many. One
# request then uses up to ``n`` cores. For throughput, run **one process per core with one
# thread each**: the processes never wait for each other, where threads of one small request
# spend much of their time synchronising. Never give all processes together more threads than
# cores: they would take turns. The timings below (printed, never asserted) compare one thread
# with all cores for this one small batch; on a shared machine of two cores the second number
# measures the neighbours as much as the model.

for threads in sorted({1, os.cpu_count() or 1}):
    timing = compare_speed({"package": runner}, (images,), threads=threads, key=package.name)
    print(f"{threads} thread(s): median {timing['package'].median:.2f} ms per batch of 500")
print(timing.header())

# %%
# .. note::
#
#    For phones and microcontrollers the route is ExecuTorch's ``.pte`` file, with its own
#    int8 quantizer and kernels (XNNPACK): module M06, the edge half of PT2E —
#    :ref:`M06-3 · the .pte, inside out <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`.
#
# Summary
# -------
#
# =========================  ====================================  =====================
# shipped as                 the serving machine needs             before the first call
# =========================  ====================================  =====================
# ``torch.export.save``      PyTorch, with its q/dq ops imported   load, compile with
#                            (no torchao), and a C++ compiler      freezing
# AOTInductor ``.pt2``       the same PyTorch version, a CPU       load
#                            like the one it was built on
# =========================  ====================================  =====================
#
# - ``torch.export.save`` / ``load`` round-trip the converted program bit for bit; compile it
#   with freezing after loading.
# - ``aoti_compile_and_package`` compiles once, ahead of time, into a package of machine code
#   for one input shape, one PyTorch and one CPU; the int8 kernels are in its C++.
# - Serve with one process per core and one thread each, unless one request must use them all
#   (PyTorch's note on CPU threading, below; this page times one request, not throughput).
#
# Exercises
# ---------
# 1. In a fresh Python process that imports only torch, as one worker of a server would, load
#    the saved program, then the package. Predict: which one needs more than ``import torch``,
#    and is that more torchao?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          import subprocess
#          import sys
#
#
#          def in_fresh_process(code, **env):
#              """Run ``code`` in a new Python that imports only torch; return the process."""
#              command = [sys.executable, "-c", "import sys, torch\n" + code]
#              environment = {**os.environ, **env}
#              return subprocess.run(command, env=environment, capture_output=True, text=True)
#
#
#          as_program = in_fresh_process(f"torch.export.load({str(saved)!r})")
#          print(as_program.stderr.strip().splitlines()[-1])
#          assert "error when deserializing" in as_program.stderr, "q/dq ops not registered"
#          # Its ops are aten's and quantized_decomposed's, which torch itself registers in
#          # torch.ao.quantization.fx._decomposed: that import is enough, torchao is not.
#          torch.save(images, folder / "images.pt")
#          with_ops = in_fresh_process(
#              "import torch.ao.quantization.fx._decomposed\n"
#              f"program = torch.export.load({str(saved)!r})\n"
#              f"out = program.module()(torch.load({str(folder / 'images.pt')!r}))\n"
#              f"torch.save(out, {str(folder / 'program_out.pt')!r})\n"
#              "assert 'torchao' not in sys.modules\n"
#          )
#          assert with_ops.returncode == 0, with_ops.stderr
#          assert torch.equal(torch.load(folder / "program_out.pt"), loaded.module()(images))
#          as_package = in_fresh_process(
#              "torch.set_num_threads(1)\n"  # one process per core, one thread each
#              f"runner = torch._inductor.aoti_load_package({str(package)!r})\n"
#              f"out = runner(torch.load({str(folder / 'images.pt')!r}))\n"
#              f"torch.save(out, {str(folder / 'out.pt')!r})\n"
#              "assert 'torchao' not in sys.modules\n"
#          )
#          assert as_package.returncode == 0, as_package.stderr
#          assert torch.equal(torch.load(folder / "out.pt"), served), "torch alone, same bits"
#
# 2. Call the saved program and the package with 7 images instead of 500. Predict which one
#    complains.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          print(loaded.module()(images[:7]).shape)  # a dynamic batch: any size works
#          # The package checks its inputs only when AOTI_RUNTIME_CHECK_INPUTS=1; without it
#          # it reads 500 images' worth of memory. (images[:7] shares the storage of the 500
#          # images here; a tensor of its own would be read past its end.)
#          assert runner(images[:7]).shape[0] == 500, "no error, and a wrong answer"
#          torch.save(images[:7].clone(), folder / "seven.pt")
#          checked = in_fresh_process(  # from exercise 1
#              f"runner = torch._inductor.aoti_load_package({str(package)!r})\n"
#              f"runner(torch.load({str(folder / 'seven.pt')!r}))\n",
#              AOTI_RUNTIME_CHECK_INPUTS="1",
#          )
#          print(checked.stderr.strip().splitlines()[-1])
#          assert "expected: 500, but got: 7" in checked.stderr, "checked, it refuses"
#
# Further reading
# ---------------
# - `AOTInductor: ahead-of-time compilation for torch.export-ed models
#   <https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html>`_
# - `torch.export.save and load <https://docs.pytorch.org/docs/stable/export.html#serialization>`_
# - `CPU threading and TorchScript inference
#   <https://docs.pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html>`_ —
#   intra-op threads, and several processes for throughput
#
# Next
# ----
# :ref:`M04-1 · measuring the error <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`:
# is the int8 model still accurate?
