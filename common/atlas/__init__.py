"""The op atlas: one small model per op, through every quantizer that runs here, to what ran it.

Each :class:`Entry` is a model built around one op the way real models meet it (between two
convs, after a linear, as a classifier head). :func:`run_entry` quantizes it with each
quantizer and follows it to where it runs:

- **x86** (``X86InductorQuantizer``): ``lower_pt2e_quantized_to_x86`` (inductor's freezing
  passes), the lowered graph run once under :func:`common.kernels.kernels_run`: the oneDNN
  kernel the op runs in (with the op as its post-op when fused), or the loop inductor writes
  for it, on uint8 (dequantize → op → quantize) or float values. The lowering fuses a ReLU
  and an add; a compile, which decomposes GELU, SiLU, Hardswish and ReLU6 first, fuses those
  too (:func:`x86_compiled`). Where the lowered graph cannot run, or a compile runs it
  otherwise (an int8 weight several linears read), the compiled call is read.
- **XNNPACK** (``XNNPACKQuantizer``): ``to_edge_transform_and_lower`` with ExecuTorch's
  ``XnnpackPartitioner``: the op inside an XNNPACK delegate, or left to the portable
  kernels, with the constraint XNNPACK's partitioner logged for it.
- **OpenVINO** (``OpenVINOQuantizer``): the q/dq program converted and compiled for the CPU
  plugin; the runtime model's ``runtimePrecision`` of the layers that hold the op.
- **Arm** (``ArmInductorQuantizer``): what it annotates only: nothing runs its int8 graph on
  an x86 machine.

The annotation of each op is read from the converted graph: ``int8`` (its inputs are
dequantized int8 and, unless it is a conv, linear or matmul, its output is quantized again),
``int8 shared`` (the same scale and zero point out as in: max-pool, cat, layout ops),
``int8 fused`` (annotated as a piece of the pattern of the int8 conv or linear before it, whose
float output it reads, its own output quantized: a post-op), or ``float`` (also an op that
only sits between int8 ops, its inputs dequantized, its output quantized, but no annotation of
its own: scaled_dot_product_attention between int8 linears). The results are plain data
(``dict``), so a page may cache them.

Where it lives: the rows in ``common/atlas/entries.py``, what an entry is and how it runs in
``recipe.py``, the run and the reading of converted graphs in ``run.py``; what each backend ran
in that backend's home (``common/backends/x86/runs.py``, ``xnnpack/runs.py``,
``openvino.py``). x86's compiles set inductor's freezing for the process and leave it set.
"""

from common.atlas.entries import ENTRIES, entry, placement
from common.atlas.recipe import IMAGE, TOKENS, BetweenConvs, BetweenLinears, Entry, example_args
from common.atlas.run import (
    QUANTIZERS,
    annotation,
    make_quantizer,
    nodes_of,
    quantize,
    reported,
    run_cached,
    run_entry,
)
from common.backends.openvino import openvino_runs
from common.backends.x86.runs import x86_compiled, x86_runs
from common.backends.xnnpack.runs import xnnpack_runs

__all__ = [
    "ENTRIES",
    "IMAGE",
    "QUANTIZERS",
    "TOKENS",
    "BetweenConvs",
    "BetweenLinears",
    "Entry",
    "annotation",
    "entry",
    "example_args",
    "make_quantizer",
    "nodes_of",
    "openvino_runs",
    "placement",
    "quantize",
    "reported",
    "run_cached",
    "run_entry",
    "x86_compiled",
    "x86_runs",
    "xnnpack_runs",
]

# The API page (autodoc of common.atlas) and sphinx-gallery's backreferences name them here.
for _name in __all__:
    _public = globals()[_name]
    if callable(_public):
        _public.__module__ = __name__
del _name, _public
