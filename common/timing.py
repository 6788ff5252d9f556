"""Timing models so that numbers hold on a small shared machine: interleaved, one thread, spread."""

import contextlib
import copy
import gc
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from common.cache import measured_once
from common.charts import display_width, pad
from common.cpu import CpuInfo, describe
from common.digest import digest
from common.kernels import kernels_run
from common.lesson import lesson_language
from common.turns import alone

__all__ = [
    "Race",
    "Timing",
    "Timings",
    "as_compiled",
    "compare_speed",
    "median_interval",
    "race",
    "ranked_apart",
    "ratio_interval",
    "timing_key",
    "timing_threads",
]


def timing_threads() -> int:
    """The thread count timings use: one on machines with at most two cores, else all.

    On two shared cores, two threads measure the scheduler: a neighbour's job stalls one
    thread and the other waits for it. One thread gives medians close to the minimums.

    >>> timing_threads() >= 1
    True
    """
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else torch.get_num_threads()


@dataclass(frozen=True)
class Timing:
    """One model's times, in milliseconds per call.

    Attributes:
        median: the median of the rounds.
        low: the 10th percentile.
        high: the 90th percentile.
        rounds: how many calls were timed.
        median_low: the low end of the median's 95 % confidence interval.
        median_high: its high end (``median_interval`` says how they are found).
    """

    median: float
    low: float
    high: float
    rounds: int
    median_low: float | None = None
    median_high: float | None = None

    @property
    def spread(self) -> float:
        """(high - low) / median: 0.1 means the middle 80 % of calls lie within 10 %."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def rate(self, per_call: int) -> str:
        """How many items (tokens, images) per second a call of ``per_call`` items gives, at
        the median call, then at the ends of the median's 95 % interval.

        >>> call = Timing(median=2.0, low=1.5, high=3.0, rounds=30, median_low=1.6, median_high=2.5)
        >>> call.rate(64)
        '32,000 (25,600–40,000)'
        """
        low, high = per_call * 1e3 / self.median_high, per_call * 1e3 / self.median_low
        return f"{per_call * 1e3 / self.median:,.0f} ({low:,.0f}–{high:,.0f})"


def median_interval(values: list) -> tuple[float, float]:
    """The median's 95 % confidence interval from order statistics (no assumed distribution).

    Of n sorted times, the j-th and k-th bracket the true median with 95 % probability for
    j, k = n/2 ∓ 1.96·√n/2 (the binomial's normal approximation), when the rounds are
    independent. A call's spread (p10–p90) does not shrink with more rounds; this interval
    does, as 1/√n: it is the uncertainty to use when two medians are ranked.

    >>> median_interval(list(range(1, 101)))
    (40, 61)
    """
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    j = max(1, math.floor(n / 2 - half))
    k = min(n, math.ceil(n / 2 + half) + 1)
    return ordered[j - 1], ordered[k - 1]


def ratio_interval(slower: Timing, faster: Timing) -> tuple[float, float]:
    """The range of ``slower.median / faster.median`` that the two medians' intervals allow.

    Both ends taken at once (the slow model at its fastest and the fast one at its slowest,
    then the reverse): wider than either interval, so a ranking that survives it is real.

    >>> ratio_interval(Timing(10, 9, 11, 30, 9.5, 10.5), Timing(2, 1.8, 2.2, 30, 1.9, 2.1))
    (4.523809523809524, 5.526315789473684)
    """
    if None in (slower.median_low, slower.median_high, faster.median_low, faster.median_high):
        return slower.low / faster.high, slower.high / faster.low
    return slower.median_low / faster.median_high, slower.median_high / faster.median_low


def ranked_apart(one: list, other: list) -> bool:
    """Whether every figure of ``one`` lies above every figure of ``other``, or below.

    The rule for figures that each come from their own process (one speed-up per run,
    the paths alternating in time): within one process, rounds are not independent and the
    level moves between processes by more than a median's interval, so the run is the unit.
    Were the two the same path, their 2k runs exchangeable, k runs of one would all lie on
    one side by chance with probability 2 / C(2k, k): 0.8 % for five runs each.

    >>> ranked_apart([2.9, 3.0, 2.8, 3.1, 2.9], [1.6, 1.7, 1.6, 1.8, 1.7])
    True
    >>> ranked_apart([2.9, 3.0, 2.8, 3.1, 2.9], [2.7, 2.95, 2.8, 2.9, 2.85])
    False
    """
    return min(one) > max(other) or min(other) > max(one)


@dataclass
class Timings:
    """The result of ``compare_speed``: a ``Timing`` per model, and how they were taken."""

    times: dict = field(default_factory=dict)
    threads: int = 1
    load: tuple = (0.0, 0.0, 0.0)
    cpu: str = ""

    def __getitem__(self, label: str) -> Timing:
        return self.times[label]

    def ratio(self, slower: str, faster: str) -> float:
        """How many times faster ``faster`` is than ``slower`` (medians)."""
        return self.times[slower].median / self.times[faster].median

    def ratio_interval(self, slower: str, faster: str) -> tuple[float, float]:
        """The range of ``ratio(slower, faster)`` the medians' 95 % intervals allow."""
        return ratio_interval(self.times[slower], self.times[faster])

    def header(self, *, lang: str | None = None) -> str:
        """The line that says how the numbers were taken: CPU verdict, threads, load.

        Args:
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.

        >>> Timings(threads=1, load=(0.5, 0.25, 0.0)).header(lang="zh_TW").splitlines()[1]
        '以 1 個執行緒計時，交錯 0 輪；平均負載 0.50（1 分鐘）、0.25（5 分鐘）'
        """
        lang = lang or lesson_language()
        one, five, _ = self.load
        rounds = max((t.rounds for t in self.times.values()), default=0)
        info = CpuInfo.from_verdict(self.cpu)  # shown in the language asked
        cpu = info.verdict_in(lang) if info else self.cpu
        if lang == "zh_TW":
            return (
                f"{cpu}\n以 {self.threads} 個執行緒計時，交錯 {rounds} 輪；"
                f"平均負載 {one:.2f}（1 分鐘）、{five:.2f}（5 分鐘）"
            )
        return (
            f"{cpu}\n"
            f"timed with {self.threads} thread(s), {rounds} interleaved rounds; "
            f"load average {one:.2f} (1 min), {five:.2f} (5 min)"
        )

    def table(self, *, lang: str | None = None) -> str:
        """A plain-text table: median, p10–p90 and spread per model, then the header.

        Args:
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.
        """
        lang = lang or lesson_language()
        width = max((display_width(label) for label in self.times), default=5)
        ranges = {label: f"{t.low:.3f}–{t.high:.3f}" for label, t in self.times.items()}
        span = max((len(r) for r in ranges.values()), default=10)
        median = "中位數 ms" if lang == "zh_TW" else "median ms"
        spread = pad("離散度", 6, align=">") if lang == "zh_TW" else "spread"
        lines = [f"{'':{width}}  {pad(median, 10, align='>')}  {'p10–p90 ms':>{span}}  {spread}"]
        for label, t in self.times.items():
            lines.append(
                f"{pad(label, width)}  {t.median:10.3f}  {ranges[label]:>{span}}  {t.spread:6.0%}"
            )
        return "\n".join([*lines, self.header(lang=lang)])


@contextlib.contextmanager
def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def as_compiled(threads: int):
    """Run the block at ``threads`` threads with grad off, as ``race`` compiles; the
    caller's thread count and grad mode come back after it.

    Dynamo guards a compiled model on both: called at another thread count, or with grad on,
    it recompiles, silently (seconds for a small model, minutes for a long unrolled graph),
    and the kernels read from it before describe code that no longer runs. Call a race's
    models inside ``as_compiled(race.threads)``, and compile your own inside
    ``as_compiled(timing_threads())`` to time them beside a race's.
    """
    with _threads(threads), torch.no_grad():
        yield


@contextlib.contextmanager
def _no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def timing_key(models: dict, args: tuple, *settings) -> str | None:
    """A digest of what a timing depends on, or None when a model's code cannot be read.

    The models as ``common.digest.digest`` reads a module (code, plain attributes, every
    parameter and buffer, the functions their classes call), the inputs' shapes and dtypes,
    the installed torch, torchao and ExecuTorch, this CPU and kernel path (``describe()``), the
    timing's thread count and any ``settings`` (e.g. compiled, freezing), and this module's
    own code. Models must be modules (``nn.Module``) not compiled yet (a compiled one hides
    what it was compiled with).
    """
    for model in models.values():  # not the labels: each language names the models its way
        if not isinstance(model, torch.nn.Module) or hasattr(model, "_orig_mod"):
            return None
    shapes = [(tuple(a.shape), str(a.dtype)) for a in args if isinstance(a, torch.Tensor)]
    cpu = describe()
    return digest(list(models.values()), shapes, cpu.name, cpu.kernel_path, settings, _SOURCE)


_SOURCE = Path(__file__)  # a change to how timings are taken measures them afresh


def _cached(key: str | None, labels: list, measure: Callable[[], "Timings"]) -> "Timings":
    """``measure()``, or the figures a build of the other language measured for ``key``."""

    def measured() -> dict:
        found = asdict(measure())
        return {**found, "times": list(found["times"].values())}  # in order, without labels

    found = measured_once(key and f"timings-{key}", measured)
    times = {label: Timing(**t) for label, t in zip(labels, found["times"], strict=True)}
    # Kept in English for both languages; the lesson gets it in its own.
    info = CpuInfo.from_verdict(found["cpu"])
    cpu = info.verdict_in(lesson_language()) if info else found["cpu"]
    return Timings(times=times, threads=found["threads"], load=tuple(found["load"]), cpu=cpu)


def compare_speed(
    models: dict[str, Callable],
    args: tuple,
    *,
    rounds: int = 30,
    warmup: int = 3,
    threads: int | None = None,
    key: str | None = None,
) -> Timings:
    """Time each model on ``args`` in interleaved rounds and return medians with their spread.

    Every round calls each model once, so a burst of load from elsewhere slows all of them
    alike instead of one, and always in the same order, so that a model's call always follows
    the same other model's (in a rotating order, a model followed itself at every other round
    boundary, with its weights still in the caches: a 2 ms int8 call ran 25 % faster there,
    and its spread doubled). The first ``warmup`` rounds (kernel choice, allocation,
    compiled-code loading) are not timed. On one thread a call's time is the process's CPU
    time, on more the wall time (``_clock``). Runs under ``torch.no_grad()``
    with ``threads`` threads and restores the caller's thread count. Print the result; never
    assert on it.

    To time ``torch.compile``'d models, use ``race``: it compiles them the way a fair timing
    needs. While the site is built, a timing is measured once and the other language's page
    shows the same figures (``common.cache.measured_once``), when its models are uncompiled
    modules or the caller gives a ``key``.

    Args:
        models: label to callable, e.g. ``{"fp32": model, "int8": lowered}``.
        args: the positional inputs every model is called with.
        rounds: timed calls per model, at least 5.
        warmup: untimed rounds first.
        threads: thread count while timing; ``timing_threads()`` when omitted.
        key: what the timing depends on, for models that ``timing_key`` cannot read (an
            AOTInductor package, an ExecuTorch program): e.g. their files' digest.

    Returns:
        Timings: per-model ``Timing``, the thread count, the load average and the CPU verdict.

    Raises:
        ValueError: if ``models`` is empty or ``rounds`` is below 5.

    >>> t = compare_speed({"id": lambda x: x, "neg": torch.neg}, (torch.ones(4),), rounds=5)
    >>> sorted(t.times), t["id"].rounds
    (['id', 'neg'], 5)
    """
    if not models:
        raise ValueError("compare_speed needs at least one model, e.g. {'fp32': model}")
    if rounds < 5:
        raise ValueError(f"rounds={rounds} gives no usable median; use at least 5")
    count = threads or timing_threads()
    if key is None:
        key = timing_key(models, args, "eager", rounds, warmup, count)
    else:
        key = timing_key({}, args, key, rounds, warmup, count)
    return _cached(key, list(models), lambda: _measure(models, args, rounds, warmup, count))


def _clock(count: int) -> Callable[[], float]:
    """What a call's time is read from: on one thread, the process's CPU time; else the wall.

    On one thread a call's CPU time is its wall time on a quiet core, without the slices the
    scheduler gave another process meanwhile: on two cores at a load average of 16, the
    p10–p90 spreads of conv_net's calls were 25–900 % in wall time and 6–30 % in CPU time.
    With more threads, CPU time would add their times up (and their waits for each other):
    wall time.

    >>> _clock(1) is time.process_time, _clock(2) is time.perf_counter
    (True, True)
    """
    return time.process_time if count == 1 else time.perf_counter


def _measure(models: dict, args: tuple, rounds: int, warmup: int, count: int) -> Timings:
    labels = list(models)
    spent = {label: [] for label in labels}
    clock = _clock(count)
    # While the site is built, no other process of the build computes meanwhile (``alone``);
    # no garbage collection inside a timed call, as timeit does (the build's process holds
    # every page read so far: a full collection there takes longer than a 2 ms int8 call).
    gc.collect()
    with _threads(count), torch.no_grad(), alone(), _no_gc():
        for index in range(warmup + rounds):
            for label in labels:  # always this order (compare_speed says why)
                start = clock()
                models[label](*args)
                if index >= warmup:
                    spent[label].append((clock() - start) * 1e3)
        cpu = describe().verdict_in("en")  # both languages' pages show this measurement
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    times = {
        label: Timing(
            median=statistics.median(values),
            low=_percentile(values, 0.1),
            high=_percentile(values, 0.9),
            rounds=len(values),
            median_low=median_interval(values)[0],
            median_high=median_interval(values)[1],
        )
        for label, values in spent.items()
    }
    return Timings(times=times, threads=count, load=tuple(load), cpu=cpu)


@dataclass
class Race(Timings):
    """The result of ``race``: the ``Timings``, the compiled models and the kernels they ran.

    Attributes:
        models: label to the callable that was timed (the ``torch.compile``'d copy).
        kernels: label to ``KernelsRun``, read after the timing rounds (the same as before
            them, or ``race`` would have raised).
    """

    models: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)

    def table(self, *, lang: str | None = None) -> str:
        """The timings' table, then one line per model saying which kernels it ran.

        Args:
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.
        """
        lang = lang or lesson_language()
        width = max((display_width(label) for label in self.kernels), default=5)
        ran = "執行的 kernel：" if lang == "zh_TW" else "ran "
        lines = [
            f"{pad(label, width)}  {ran}{k.summary_in(lang)}" for label, k in self.kernels.items()
        ]
        return "\n".join([super().table(lang=lang), *lines])


def race(
    models: dict[str, torch.nn.Module],
    args: tuple,
    *,
    freezing: bool = True,
    also: dict[str, Callable] | None = None,
    also_key: str | None = None,
    rounds: int = 30,
    warmup: int = 3,
    threads: int | None = None,
) -> Race:
    """Compile each model with ``torch.compile`` the way a fair timing needs, then time them.

    The rules, each of which has turned a real int8 win into a loss on the course's pages:

    - **Compile inside the timing's thread count.** Inductor decides its loops' parallelism
      from ``torch.get_num_threads()`` at compile time (at one thread it parallelizes none)
      and specializes its CPU kernels on that count; code compiled for two threads and timed
      on one ran int8 at 0.95× fp32 instead of 3×.
    - **Freezing is set for the process** (``torch._inductor.config.freezing``), not with
      ``config.patch`` around the first call: a later recompile (a new input shape,
      ``torch._dynamo.reset()``) happens outside such a block, without freezing, and runs
      float convs between the q/dq nodes while the prepack counters still show the first
      compile's int8.
    - **Under torch.no_grad().** Inductor freezes only when grad is off; with grad on a
      "frozen" int8 model silently runs float convs.
    - **A copy of each model is compiled**, so two races of one model (with and without
      freezing) do not share dynamo's compiled code.
    - **With** ``dynamic=False``: static code per shape, frozen, runs int8. A frozen
      int8 model whose first conv reads one channel (grey images, audio features), recompiled
      for a second input shape with a dynamic batch, fails in torch 2.13 (``AssertionError:
      expected size ..., stride ...``, troubleshooting m99_3).
    - **The kernels are read before and after the timing rounds** (``kernels_run``): a
      recompile in between raises here instead of timing other code than was checked.

    Args:
        models: label to an uncompiled module, e.g. ``{"fp32": exported, "int8": converted}``.
        args: the positional inputs every model is compiled for and called with.
        freezing: the process-wide freezing setting the models are compiled with.
        also: label to a callable timed in the same rounds without being compiled: an eager
            model, an ExecuTorch method. Uncompiled modules are keyed like ``models``.
        also_key: what ``also``'s other callables run (e.g. the ``.pte``'s digest), so that
            the docs build can measure the race once; without it such a race is measured in
            each language's build.
        rounds: timed calls per model (see ``compare_speed``).
        warmup: untimed rounds before them.
        threads: thread count for compiling and timing; ``timing_threads()`` when omitted.

    Returns:
        Race: the timings, the compiled models and the kernels each ran. The compiled models
        (``.models``) were compiled at ``.threads`` threads under ``torch.no_grad()``, and
        ``race`` gives the caller back its own thread count: dynamo guards on both
        (``GLOBAL_STATE changed: num_threads``, ``grad_mode``), so calling one of them at
        another thread count or with grad on recompiles it, silently, and ``.kernels`` no
        longer describes what runs. That takes seconds for a small model and minutes for a
        long unrolled graph. Call them inside ``as_compiled(race.threads)``.

    Raises:
        TypeError: if a model is already compiled (compile the original instead).
        RuntimeError: if a model's kernels changed between the start and the end of the
            timing (it recompiled): the message names both.
    """
    for label, model in models.items():
        if hasattr(model, "_orig_mod"):
            raise TypeError(
                f"race compiles the models itself; {label!r} is already torch.compile'd: "
                "pass the model you compiled instead"
            )
    count = threads or timing_threads()
    torch._inductor.config.freezing = freezing
    compiled = {}
    with as_compiled(count):
        for label, model in models.items():
            compiled[label] = torch.compile(copy.deepcopy(model), dynamic=False)
            compiled[label](*args)  # the first call compiles
        before = {label: kernels_run(fast, args) for label, fast in compiled.items()}
        extra = dict(also or {})
        readable = [timing_key({label: m}, args) for label, m in extra.items()]
        key = None  # a callable that timing_key cannot read, and no also_key: measure it
        if also_key is not None or all(readable):
            settings = ("compiled", freezing, rounds, warmup, count, also_key, readable)
            key = timing_key(models, args, *settings)
        timed = {**compiled, **extra}
        timings = _cached(key, list(timed), lambda: _measure(timed, args, rounds, warmup, count))
        after = {label: kernels_run(fast, args) for label, fast in compiled.items()}
    for label in compiled:
        if before[label] != after[label]:
            raise RuntimeError(
                f"{label!r} ran other kernels after timing than before (it recompiled): "
                f"before {before[label].summary}; after {after[label].summary}"
            )
    return Race(**vars(timings), models=compiled, kernels=after)
