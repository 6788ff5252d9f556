"""torchao's pattern graphs, exported once per process: shared by the docs build and the tests.

torchao exports small pattern graphs (strict ``torch.export``, ~0.2 s each) each time it
rewrites: ``convert_pt2e`` 96 of them whenever a BatchNorm is left in the graph (its QAT
conv-bn patterns), ``prepare_qat_pt2e`` and ``move_exported_model_to_train/eval`` a few more,
and ExecuTorch's ``XNNPACKQuantizer`` its conv-bn patterns at every annotate (~3.5 s per
``prepare_pt2e``, even on a graph without BatchNorm). A pattern's graph depends only on its
code, the values it closes over and its inputs' shapes and dtypes, so a process needs each
one once. tests/test_handmade.py checks that a remembered graph is the freshly exported one.

Part of the site's build and of the tests, as the inductor cache is, and never of a lesson: a
lesson run as a script exports the patterns as torchao does, and prints what its page shows.

What it does not cover: the build patches the modules loaded before a lesson starts
(docs/course_gallery.reset, once torchao is loaded), so in each Sphinx process the first lesson
that imports torchao, and the first that imports ExecuTorch's quantizer (M06-1 in a clean
build: its ``xnnpack_quantizer_utils`` holds the exporter under its own name), export the
patterns they use themselves; so do the lessons the tests run in a fresh Python, and every
pattern ``pattern_key`` cannot key.

Upstream: no issue or pull request names this in pytorch/executorch or pytorch/ao as of
executorch 1.5.1 and torchao 0.18.0 (the closest is pytorch/pytorch#116440, which made
``convert_pt2e`` skip the conv-bn fold on a graph without BatchNorm and left caching the
patterns as a follow-up). A fix upstream: ``XNNPACKQuantizer`` runs its conv-bn annotators only
when the graph holds a BatchNorm (``prepare_pt2e`` folds each conv-BatchNorm pair before it
annotates a PTQ graph, so they rarely match there), and torchao memoizes
``_get_aten_graph_module_for_pattern``, returning a copy per call, as this module does. Drop
this module with the first releases that do both.
"""

import copy
import sys

__all__ = ["caching_pattern_graphs", "export_once", "pattern_key"]

NAME = "_get_aten_graph_module_for_pattern"  # in torchao.quantization.pt2e.utils
_PATCHED_PACKAGES = ("torchao.", "executorch.")
_cached = None


def pattern_key(pattern, example_inputs, is_cuda=False, **kwargs):
    """What a torchao pattern graph depends on, or None when that cannot be told (not cached)."""
    function = getattr(pattern, "fn", pattern)  # torchao wraps some patterns in WrapperModule
    try:
        closed_over = tuple(cell.cell_contents for cell in function.__closure__ or ())
        key = (
            type(pattern),
            function.__code__,
            closed_over,
            tuple(map(_input_signature, example_inputs)),
            is_cuda,
            tuple(sorted((name, _input_signature(v)) for name, v in kwargs.items())),
        )
        hash(key)
    except (AttributeError, TypeError, ValueError):
        return None
    return key


def _input_signature(value):
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    return value


def caching_pattern_graphs(export_pattern):
    """``export_pattern`` (torchao's ``_get_aten_graph_module_for_pattern``) with a memory:
    each pattern is exported once, and every call gets its own copy of the graph."""
    exported = {}

    def cached(pattern, example_inputs, is_cuda=False, **kwargs):
        key = pattern_key(pattern, example_inputs, is_cuda, **kwargs)
        if key is None:
            return export_pattern(pattern, example_inputs, is_cuda, **kwargs)
        if key not in exported:
            exported[key] = export_pattern(pattern, example_inputs, is_cuda, **kwargs)
        return copy.deepcopy(exported[key])

    cached.exported, cached.export_pattern = exported, export_pattern
    return cached


def modules_holding(function) -> list:
    """The loaded torchao and ExecuTorch modules whose ``NAME`` is ``function`` (several
    import it by name)."""
    return [
        module
        for module in list(sys.modules.values())
        if getattr(module, "__name__", "").startswith(_PATCHED_PACKAGES)
        and getattr(module, NAME, None) is function
    ]


def export_once():
    """Give every loaded torchao and ExecuTorch module that holds torchao's pattern exporter
    this process's caching one, and return it. Idempotent: the docs build calls it before
    each lesson, so modules a lesson imported are covered from the next lesson on."""
    global _cached
    from torchao.quantization.pt2e import utils

    if _cached is None:
        _cached = caching_pattern_graphs(getattr(utils, NAME))
    for module in modules_holding(_cached.export_pattern):
        setattr(module, NAME, _cached)
    return _cached
