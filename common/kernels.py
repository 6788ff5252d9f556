"""Which compute kernels a model really ran, int8 or float, read from ``torch.profiler``.

Inductor's prepack counters (``counters["inductor"]``) are a compile-time fact: they count
what the *first* compile did, and say nothing when a later call recompiled (a new input
shape, ``torch._dynamo.reset()``, a setting gone) and ran float. The profiler records the
operators each call dispatched, so it tells what ran.

API:

- ``kernels_run(model, args)`` -> ``KernelsRun``: one call under the profiler. A call that
  compiles (dynamo's counters move) is not read: it is called again, and ``warmed_up`` says
  so; when that call compiles too, ``RuntimeError``. oneDNN's own log of the same call gives
  each int8 kernel's post-ops (``post_ops``).
- ``KernelsRun.int8`` / ``.float``: Counters of profiler names (``onednn::qlinear_pointwise``;
  eager torch.ao's ``quantized::linear`` and ``quantized::conv2d``, fbgemm's or oneDNN's, are
  int8 too);
  ``.post_ops``: ``{name: Counter({"add": 1, "gelu": 1})}``, the fused post-ops of that
  kernel's calls as oneDNN named them at run time (``binary_add`` and ``sum``, its
  accumulate into the output, -> ``add``; ``eltwise_gelu_erf`` -> ``gelu``), None when
  oneDNN's log could not be paired with the profiler's calls; ``.implementations``: the
  implementation oneDNN ran each call with (``{name: Counter({"ref_int8:any": 1})}``, its slow
  reference code when no optimized one takes the call's layouts); ``.summary``: ``int8:
  onednn::qlinear_pointwise ×2 (+add ×1, +gelu ×1); float: none``.
- ``time_by_kind(model, args)``: where a call's time goes, int8, float or other.

What it cannot see: float work that is not a call to one of ``FLOAT_KERNELS``. Inductor
inlines small float GEMMs into its own C++ loops (``torch/_inductor/decomposition.py``: an
``addmm``/``mm`` at batch 1 with a weight of at most 16×16, or with one output column), and
``scaled_dot_product_attention``'s float matmuls run inside
``aten::_scaled_dot_product_flash_attention_for_cpu`` (not listed): ``float: none`` means "no
float conv or linear kernel". To check those, read the code inductor generated
(``TORCH_LOGS=output_code``, or ``torch._inductor.utils.run_and_get_code``) for a float loop
over the weight, or profile at a batch size above 1.
"""

import contextlib
import ctypes
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from common.lesson import lesson_language
from common.turns import alone

__all__ = ["FLOAT_KERNELS", "KernelsRun", "kernels_run", "time_by_kind"]

#: The float compute kernels, as the profiler names them: eager convs and matmuls, and what
#: inductor calls for float convs and linears (oneDNN's prepacked ones with freezing, MKL's
#: for static linears). A conv or matmul that inductor calls out dispatches one of them; not
#: listed, so not seen: the small GEMMs inductor inlines into its C++ loops (batch 1 with a
#: weight of at most 16×16, or one output column: torch/_inductor/decomposition.py) and the
#: matmuls inside scaled_dot_product_attention (aten::_scaled_dot_product_flash_attention_for_cpu).
#: Read inductor's generated code for those (TORCH_LOGS=output_code).
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


#: Eager torch.ao's int8 convs and linears (a model from ``torch.ao.quantization.convert`` or
#: ``quantize_dynamic``), run by fbgemm or oneDNN, as the profiler names them: ``quantized::
#: linear``, ``quantized::conv2d``, their fused ``_relu``/``_add`` forms and ``_dynamic``
#: ones; not their prepacking, their parameter getters (``conv2d_stride``) or the fp16 linears.
_LEGACY_INT8 = re.compile(
    r"quantized::(?:(?:conv(?:_transpose)?[123]d|linear)"
    r"(?:_relu|_add|_add_relu|_leaky_relu|_tanh)?(?:_dynamic)?"
    r"|linear_with_input_q_dq_qweight_dq(?:_relu)?_output_fp32)"
)


def _is_int8(name: str) -> bool:
    """oneDNN's int8 compute ops (``onednn::qconv_pointwise``, ``onednn::qlinear_pointwise``,
    their ``binary``/``tensor`` forms), not the prepacking that runs at compile time; ATen's
    int8 GEMM ``aten::_int_mm``, which torchao's ``quantize_`` models call; and eager
    torch.ao's ``quantized::linear``, ``quantized::conv2d`` and kin (``_LEGACY_INT8``)."""
    onednn_int8 = name.startswith("onednn::q") and not name.endswith("prepack")
    return onednn_int8 or name == "aten::_int_mm" or bool(_LEGACY_INT8.fullmatch(name))


@dataclass(frozen=True)
class KernelsRun:
    """The compute kernels of one call, by profiler name, with counts.

    Attributes:
        int8: oneDNN's int8 convs and linears, ``aten::_int_mm``, and eager torch.ao's
            ``quantized::linear``/``quantized::conv2d`` (fbgemm or oneDNN).
        float: float convs and matmuls (``FLOAT_KERNELS``).
        post_ops: for each oneDNN int8 kernel, the post-ops oneDNN ran fused into its calls,
            counted (``{"onednn::qlinear_pointwise": Counter({"add": 1})}``; a call with no
            post-op adds nothing); None when they were not read (oneDNN's log could not be
            paired with the profiler's calls, or a ``KernelsRun`` built by hand).
        warmed_up: the first profiled call compiled (after ``torch._dynamo.reset()``, a new
            shape, a new grad mode), so these are the kernels of the call after it.
        implementations: for each oneDNN int8 kernel, the implementations oneDNN executed its
            calls with, counted, as its verbose log names them (``brg_matmul:avx512_core_amx``,
            ``gemm:jit``; ``ref_int8:any`` is its slow reference code, taken when no optimized
            one accepts the call's layouts); None when ``post_ops`` is.
    """

    int8: Counter
    float: Counter
    post_ops: dict | None = field(default=None, compare=False)
    warmed_up: bool = field(default=False, compare=False)
    implementations: dict | None = field(default=None, compare=False)

    @property
    def summary(self) -> str:
        """One line, ``int8: onednn::qconv_pointwise ×3; float: none``, in the language of the
        lesson that asks (``lesson_language()``)."""
        return self.summary_in(lesson_language())

    def summary_in(self, lang: str) -> str:
        """``summary`` in ``lang``, ``"en"`` or ``"zh_TW"``.

        >>> KernelsRun(Counter({"onednn::qlinear_pointwise": 2}), Counter()).summary_in("zh_TW")
        'int8：onednn::qlinear_pointwise ×2；浮點數：無'
        """
        zh = lang == "zh_TW"
        none, comma = ("無", "、") if zh else ("none", ", ")
        opening, closing = ("（", "）") if zh else (" (", ")")
        post_ops = self.post_ops or {}

        def fused(name: str) -> str:
            ops = post_ops.get(name)
            if not ops:
                return ""
            return opening + comma.join(f"+{op} ×{c}" for op, c in sorted(ops.items())) + closing

        def listed(kernels: Counter) -> str:
            return comma.join(f"{n} ×{c}{fused(n)}" for n, c in sorted(kernels.items())) or none

        if zh:
            line = f"int8：{listed(self.int8)}；浮點數：{listed(self.float)}"
        else:
            line = f"int8: {listed(self.int8)}; float: {listed(self.float)}"
        if self.warmed_up:
            line += (
                "（先呼叫過一次：那次呼叫在編譯）"
                if lang == "zh_TW"
                else (" (read on a second call: the first one compiled)")
            )
        return line


def kernels_run(model, args: tuple) -> KernelsRun:
    """Call ``model(*args)`` under the profiler; return the compute kernels that ran.

    Call it on the inputs you time or serve, in the grad mode you serve in (a new input
    shape or grad mode recompiles a ``torch.compile``'d model: the call then runs new code).
    A call that compiles also dispatches the compiler's own aten work (tracing, constant
    folding: ``aten::addmm`` on an int8-only model), so a call during which dynamo's
    counters move is not read: ``kernels_run`` calls the model once more and reads that
    call (``warmed_up``, and the summary says so); if that call compiles as well (a guard
    that fails at every call), it raises.

    The post-ops of each oneDNN int8 kernel (``onednn::qlinear_pointwise`` with an ``add``,
    a ``relu``, a ``gelu``) are read from oneDNN's verbose log of the same call
    (``torch.backends.mkldnn.verbose``, its ``attr-post-ops`` field), which oneDNN writes to
    file descriptor 1 and which is kept off the output. The profiler's name is the same with
    and without a post-op. See the module docstring for what it cannot see (small GEMMs
    inductor inlines, SDPA's matmuls).

    Args:
        model: any callable: eager, exported, lowered or ``torch.compile``'d.
        args: its positional inputs.

    Returns:
        KernelsRun: the int8 and float compute kernels the call dispatched.

    Raises:
        RuntimeError: if the call compiles twice in a row.

    >>> kernels_run(torch.nn.Linear(4, 2), (torch.ones(1, 4),)).summary
    'int8: none; float: aten::addmm ×1'
    """
    run = _profiled(model, args)
    if run is not None:
        return run
    run = _profiled(model, args)
    if run is None:
        raise RuntimeError(
            "kernels_run: the model compiled at two calls in a row, so no call ran without "
            "the compiler: a guard fails at every call (a changing Python value, a new "
            "shape, a grad mode that flips). torch._logging.set_logs(recompiles=True) names "
            "the guard; kernels_run reads a call that runs compiled code"
        )
    return KernelsRun(
        run.int8, run.float, run.post_ops, warmed_up=True, implementations=run.implementations
    )


def _compiles() -> tuple:
    """Dynamo's counters of frames compiled and graphs made: they move when a call compiles."""
    from torch._dynamo.utils import counters

    return (sum(counters["frames"].values()), sum(counters["stats"].values()))


def _profiled(model, args: tuple) -> KernelsRun | None:
    """One call under the profiler and oneDNN's log; None when it compiled."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    before = _compiles()
    with (
        native_stderr_silenced(),
        _onednn_log() as log,
        torch.profiler.profile(activities=activities) as profile,
    ):
        model(*args)
    if _compiles() != before:
        return None
    names = [event.name for event in profile.events()]
    int8 = [n for n in names if _is_int8(n)]
    paired = _paired(int8, log.lines)
    return KernelsRun(
        int8=Counter(int8),
        float=Counter(n for n in names if n in FLOAT_KERNELS),
        post_ops=paired and paired[0],
        implementations=paired and paired[1],
    )


#: oneDNN's primitive kinds that int8 convs and linears execute as (its verbose log's 6th
#: field), and the onednn kernels the profiler names for them.
_PRIMITIVES = {
    "convolution": "onednn::qconv",
    "deconvolution": "onednn::qconv",
    "matmul": "onednn::qlinear",
    "inner_product": "onednn::qlinear",
}
#: oneDNN's names for post-ops, as a reader of PyTorch says them; ``sum`` is oneDNN's
#: accumulate into the output buffer (the add's other input written first), an add too.
_POST_OP_NAMES = {
    "gelu_erf": "gelu",
    "gelu_tanh": "gelu",
    "swish": "silu",
    "clip": "hardtanh",
    "sum": "add",
}


def _post_ops(line: str) -> list[str]:
    """``["add", "relu"]`` from a verbose line's ``attr-post-ops:binary_add:f32:3:ab+eltwise_relu``;
    ``eltwise_linear`` (a scale oneDNN may apply as a post-op) is left out."""
    found = re.search(r"attr-post-ops:(\S+?)(?:,| attr-|$)", line)
    if not found:
        return []
    ops = []
    for part in found.group(1).split("+"):
        name = part.split(":")[0].removeprefix("eltwise_").removeprefix("binary_")
        if name != "linear":
            ops.append(_POST_OP_NAMES.get(name, name))
    return ops


def _paired(int8: list[str], lines: list[str]) -> tuple[dict, dict] | None:
    """Each oneDNN int8 kernel call of the profiler, in order, with the int8 primitive oneDNN
    executed for it, in order: the post-ops and the implementations of each kernel's calls;
    None when the two lists do not pair one to one."""
    calls = [n for n in int8 if n.startswith("onednn::q")]
    executed = []
    for line in lines:
        fields = line.split(",")
        if len(fields) < 10 or fields[2:4] != ["primitive", "exec"]:
            continue
        kind, descriptors = fields[5], fields[8]
        if kind in _PRIMITIVES and re.search(r"src:[us]8", descriptors):
            executed.append((_PRIMITIVES[kind], _post_ops(line), fields[6]))
    if len(executed) != len(calls) or not all(
        call.startswith(prefix) for call, (prefix, _, _) in zip(calls, executed, strict=True)
    ):
        return None
    found: dict[str, Counter] = {}
    implementations: dict[str, Counter] = {}
    for call, (_, ops, implementation) in zip(calls, executed, strict=True):
        found.setdefault(call, Counter())
        implementations.setdefault(call, Counter())[implementation] += 1
        if ops:
            found[call]["+".join(ops)] += 1
    return found, implementations


class _Log:
    def __init__(self):
        self.lines: list[str] = []


@contextlib.contextmanager
def _onednn_log():
    """oneDNN's verbose log of what runs meanwhile, in ``.lines`` when the block ends; kept off
    file descriptor 1 (oneDNN prints it with C's stdio). Empty if verbose cannot be turned on
    (a torch without oneDNN) or C's stdio cannot be flushed (no C library found)."""
    log = _Log()
    try:
        libc = ctypes.CDLL(None)
        verbose = torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON)
    except (OSError, TypeError, AttributeError):
        yield log
        return
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            with contextlib.ExitStack() as stack:
                try:
                    stack.enter_context(verbose)
                except AssertionError:  # "Failed to set MKLDNN into verbose mode"
                    pass
                yield log
            libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        log.lines = sink.read().decode(errors="replace").splitlines()


def time_by_kind(
    model, args: tuple, *, calls: int = 30, threads: int | None = None
) -> dict[str, float]:
    """Where one call's time goes: int8 compute kernels, float ones, and everything else.

    ``calls`` calls run under the profiler; each kernel's own time is summed by kind and
    divided by ``calls``. "other" is the rest of the call's wall time, also under the profiler:
    quantize and dequantize, layout reorders, pooling, activations and inductor's fused loops,
    and the Python around them. The profiler's times are wall times: give ``threads`` the
    count the model was compiled and timed with (``Race.threads``): on two loaded cores,
    conv_net's int8 kernels measured 0.3× to 4.4× as fast as its float ones from one call of
    this function to the next at two threads, 8× to 17× at one. While the site is built it
    runs while no other build process computes
    (``common.turns.alone``). Like every timing, print it; never assert on it.

    Args:
        model: a callable, run in the caller's grad mode (as ``kernels_run``).
        args: its positional inputs.
        calls: profiled calls, after one untimed call.
        threads: the thread count to run with (restored after); the caller's when omitted.

    Returns:
        dict: milliseconds per call, ``{"int8": ..., "float": ..., "other": ..., "total": ...}``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        model(*args)
        activities = [torch.profiler.ProfilerActivity.CPU]
        with (
            alone(),
            native_stderr_silenced(),
            torch.profiler.profile(activities=activities) as profile,
        ):
            started = time.perf_counter()
            for _ in range(calls):
                model(*args)
            total = (time.perf_counter() - started) * 1e3 / calls
    finally:
        torch.set_num_threads(before)
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
