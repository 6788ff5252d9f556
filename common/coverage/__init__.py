"""What a PT2E quantizer leaves in float: each compute op of an exported graph, int8 or not, why.

API:

- ``coverage(graph, quantizer, *, label=None, every_op=False)`` -> ``Coverage``: prepares a
  copy of the exported graph and reads the annotations. By default it reports the ops of
  ``COMPUTE_OPS`` (conv, linear, matmul, attention, add, mul); ``every_op=True`` reports
  every op of ``OPS`` (also pooling, cat, pad, slices, layout ops, norms, activations,
  resampling, reductions, embedding, recurrent layers, sub/div, rsqrt/pow, and a KV cache's
  in-place writes).
- ``OpCoverage``: ``node``, ``op`` (aten name), ``kind``, ``module``, ``status`` (``int8
  static``, ``int8 dynamic``, ``int8 fused``: runs inside the int8 conv/linear before it;
  ``int8 shared``: int8 in and out with its input's qparams; ``float``), ``reason`` (English)
  and ``reason_in(lang)`` / ``why`` (the lesson's language), ``specs``.
- ``Coverage``: ``report[node]``, ``names(kind=, int8=, op=)``, ``statuses(op)``,
  ``counts()`` (kind -> (int8, all)), ``reasons()``, ``schemes(role)``, ``summary()``,
  ``table(only=)`` (``"float"``, ``"int8"`` or a kind), ``grouped(only=, with_layout=)``
  (one row per op, status and reason, with a count: the short table for big models);
  ``nothing_quantized``: why, when ``prepare_pt2e`` inserted no observer (a ``forward`` under
  ``@torch.no_grad()``), which each of its texts then says first.
- ``side_by_side(*reports)``, ``spec_table(*reports)``: several quantizers on one graph.
- ``MOVING_KINDS``: the kinds that move values without arithmetic. (The activations x86 fuses
  into the conv or linear before them: ``common.backends.x86.rules.X86_UNARY_FUSIONS``.)

Float reasons come from the installed quantizers' rules: ``X86InductorQuantizer``'s op sets,
fusion patterns and propagation (torchao 0.18), ``XNNPACKQuantizer``'s patterns and
``propagate_annotation`` and ``XnnpackPartitioner``'s constraints (ExecuTorch 1.5.1); other
quantizers get a generic reason (which input is not quantized).
"""

# The package, a file per job: ops (the op tables), words (the neutral texts, en and zh_TW),
# report (OpCoverage, Coverage, side_by_side, spec_table), classify (coverage() and the
# backend-neutral reading of annotations). Each backend's rules, with their words, are in
# common.backends.<name>.rules.

import torch  # noqa: F401  (the doctests below use torch, nn and _text)
from torch import nn  # noqa: F401

from common.coverage import ops
from common.coverage.classify import coverage
from common.coverage.report import Coverage, OpCoverage, side_by_side, spec_table
from common.coverage.words import _text  # noqa: F401

__all__ = [
    "COMPUTE_OPS",
    "MOVING_KINDS",
    "OPS",
    "Coverage",
    "OpCoverage",
    "coverage",
    "side_by_side",
    "spec_table",
]

#: The compute ops the report covers, by kind. ``add`` and ``mul`` count only between two
#: tensors (a residual add, a squeeze-excitation scale), not with a Python number.
COMPUTE_OPS = ops.COMPUTE_OPS
#: Every op ``coverage(..., every_op=True)`` reports, by kind: ``COMPUTE_OPS``; the ops that
#: can pass int8 values through (``pool``, ``cat``, ``pad``, ``slice``, ``layout``); ``norm``,
#: ``activation``, ``resample``, ``reduction``, ``embedding``, ``recurrent``; ``sub`` and
#: ``div`` between two tensors, ``rsqrt`` and ``pow`` (``elementwise``); a KV cache's in-place
#: writes, ``index_copy_`` and ``index_put_`` (``cache update``). An eval-mode dropout, an
#: identity, is not listed.
OPS = ops.OPS
#: The kinds of ``OPS`` whose ops move values without arithmetic (``grouped(with_layout=False)``
#: leaves them out).
MOVING_KINDS = ops.MOVING_KINDS

# Documented, and their doctests run, as common.coverage's: the API page and sphinx-gallery's
# backreferences name them so, as before the package. (The doctests use torch, nn and _text.)
for _exported in (coverage, Coverage, OpCoverage, side_by_side, spec_table):
    _exported.__module__ = __name__
    for _member in vars(_exported).values() if isinstance(_exported, type) else ():
        if callable(_member) and hasattr(_member, "__module__"):
            _member.__module__ = __name__
del _exported, _member
