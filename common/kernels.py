"""Which compute kernels a model really ran, int8 or float, read from ``torch.profiler``.

Inductor's prepack counters (``counters["inductor"]``) are a compile-time fact: they count
what the *first* compile did, and say nothing when a later call recompiled (a new input
shape, ``torch._dynamo.reset()``, a setting gone) and ran float. The profiler records the
operators each call dispatched, so it tells what ran.
"""

import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

import torch

from common.lesson import lesson_language

__all__ = ["FLOAT_KERNELS", "KernelsRun", "kernels_run", "time_by_kind"]

#: The float compute kernels, as the profiler names them: eager convs and matmuls, and what
#: inductor calls for float convs and linears (oneDNN's prepacked ones with freezing, MKL's
#: for static linears). Each conv or matmul dispatches exactly one of them.
FLOAT_KERNELS = frozenset(
    {
        "aten::convolution",
        "aten::addmm",
        "aten::mm",
        "aten::bmm",
        "aten::baddbmm",
        "mkldnn::_convolution_pointwise",
        "mkldnn::_convolution_transpose_pointwise",
        "mkldnn::_linear_pointwise",
        "mkl::_mkl_linear",
    }
)


def _is_int8(name: str) -> bool:
    """oneDNN's int8 compute ops (``onednn::qconv_pointwise``, ``onednn::qlinear_pointwise``,
    their ``binary``/``tensor`` forms), not the prepacking that runs at compile time; and
    ATen's int8 GEMM ``aten::_int_mm``, which torchao's ``quantize_`` models call."""
    onednn_int8 = name.startswith("onednn::q") and not name.endswith("prepack")
    return onednn_int8 or name == "aten::_int_mm"


@dataclass(frozen=True)
class KernelsRun:
    """The compute kernels of one call, by profiler name, with counts.

    Attributes:
        int8: oneDNN's int8 convs and linears, and ``aten::_int_mm``.
        float: float convs and matmuls (``FLOAT_KERNELS``).
    """

    int8: Counter
    float: Counter

    @property
    def summary(self) -> str:
        """One line, ``int8: onednn::qconv_pointwise ×3; float: none``, in the language of the
        lesson that asks (``lesson_language()``)."""
        return self.summary_in(lesson_language())

    def summary_in(self, lang: str) -> str:
        """``summary`` in ``lang``, ``"en"`` or ``"zh_TW"``.

        >>> KernelsRun(Counter({"onednn::qlinear_pointwise": 2}), Counter()).summary_in("zh_TW")
        'int8: onednn::qlinear_pointwise ×2; float: 無'
        """
        none = "無" if lang == "zh_TW" else "none"

        def listed(kernels: Counter) -> str:
            return ", ".join(f"{n} ×{c}" for n, c in sorted(kernels.items())) or none

        return f"int8: {listed(self.int8)}; float: {listed(self.float)}"


def kernels_run(model, args: tuple) -> KernelsRun:
    """Call ``model(*args)`` once under the profiler; return the compute kernels that ran.

    Run it after the compile (the first call), on the inputs you time or serve, in the grad
    mode you serve in: a change of input shape or of grad mode recompiles a
    ``torch.compile``'d model, and the call then shows the kernels of the new code.

    Args:
        model: any callable: eager, exported, lowered or ``torch.compile``'d.
        args: its positional inputs.

    Returns:
        KernelsRun: the int8 and float compute kernels the call dispatched.

    >>> kernels_run(torch.nn.Linear(4, 2), (torch.ones(1, 4),)).summary
    'int8: none; float: aten::addmm ×1'
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    with native_stderr_silenced(), torch.profiler.profile(activities=activities) as profile:
        model(*args)
    names = [event.name for event in profile.events()]
    return KernelsRun(
        int8=Counter(n for n in names if _is_int8(n)),
        float=Counter(n for n in names if n in FLOAT_KERNELS),
    )


def time_by_kind(model, args: tuple, *, calls: int = 10) -> dict[str, float]:
    """Where one call's time goes: int8 compute kernels, float ones, and everything else.

    ``calls`` calls run under the profiler; each kernel's own time is summed by kind and
    divided by ``calls``. "other" is the rest of the call's wall time, also under the profiler:
    quantize and dequantize, layout reorders, pooling, activations and inductor's fused loops,
    and the Python around them. Like every timing, print it; never assert on it.

    Args:
        model: a callable, run in the caller's grad mode (as ``kernels_run``).
        args: its positional inputs.
        calls: profiled calls, after one untimed call.

    Returns:
        dict: milliseconds per call, ``{"int8": ..., "float": ..., "other": ..., "total": ...}``.
    """
    model(*args)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with native_stderr_silenced(), torch.profiler.profile(activities=activities) as profile:
        started = time.perf_counter()
        for _ in range(calls):
            model(*args)
        total = (time.perf_counter() - started) * 1e3 / calls
    spent = {"int8": 0.0, "float": 0.0}
    for event in profile.key_averages():
        kind = "int8" if _is_int8(event.key) else "float" if event.key in FLOAT_KERNELS else None
        if kind:
            spent[kind] += event.cpu_time_total / 1e3 / calls  # microseconds in the profiler
    return {**spent, "other": max(total - spent["int8"] - spent["float"], 0.0), "total": total}


@contextlib.contextmanager
def native_stderr_silenced():
    """Drop what C++ writes to the process's stderr (file descriptor 2) meanwhile: torch
    2.13's profiler (kineto) writes a ``USDT:... profiler_start`` and a ``profiler_stop`` line
    there at every use, with no setting to turn them off (``KINETO_LOG_LEVEL`` does not), and
    some packages log there as they import (common.migration). Python's errors still raise."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
