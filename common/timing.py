"""Timing models so that numbers hold on a small shared machine: interleaved, one thread, spread."""

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from common.charts import display_width, pad
from common.cpu import describe

__all__ = ["Timing", "Timings", "compare_speed", "timing_threads"]


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
    """

    median: float
    low: float
    high: float
    rounds: int

    @property
    def spread(self) -> float:
        """(high - low) / median: 0.1 means the middle 80 % of calls lie within 10 %."""
        return (self.high - self.low) / self.median if self.median else 0.0


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

    def header(self) -> str:
        """The line that says how the numbers were taken: CPU verdict, threads, load."""
        one, five, _ = self.load
        rounds = max((t.rounds for t in self.times.values()), default=0)
        return (
            f"{self.cpu}\n"
            f"timed with {self.threads} thread(s), {rounds} interleaved rounds; "
            f"load average {one:.2f} (1 min), {five:.2f} (5 min)"
        )

    def table(self) -> str:
        """A plain-text table: median, p10–p90 and spread per model, then the header."""
        width = max((display_width(label) for label in self.times), default=5)
        ranges = {label: f"{t.low:.3f}–{t.high:.3f}" for label, t in self.times.items()}
        span = max((len(r) for r in ranges.values()), default=10)
        lines = [f"{'':{width}}  {'median ms':>10}  {'p10–p90 ms':>{span}}  spread"]
        for label, t in self.times.items():
            lines.append(
                f"{pad(label, width)}  {t.median:10.3f}  {ranges[label]:>{span}}  {t.spread:6.0%}"
            )
        return "\n".join([*lines, self.header()])


@contextlib.contextmanager
def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def compare_speed(
    models: dict[str, Callable],
    args: tuple,
    *,
    rounds: int = 30,
    warmup: int = 3,
    threads: int | None = None,
) -> Timings:
    """Time each model on ``args`` in interleaved rounds and return medians with their spread.

    Every round calls each model once, in a rotating order, so a burst of load from
    elsewhere slows all of them alike instead of one; the first ``warmup`` rounds (kernel
    choice, allocation, compiled-code loading) are not timed. Runs under ``torch.no_grad()``
    with ``threads`` threads and restores the caller's thread count. Print the result; never
    assert on it.

    Compile ``torch.compile`` models under the same thread count (``timing_threads()``):
    inductor writes the count into the code it generates, and code compiled for two threads
    runs several times slower when timed on one core beside one-thread models.

    Args:
        models: label to callable, e.g. ``{"fp32": model, "int8": compiled}``.
        args: the positional inputs every model is called with.
        rounds: timed calls per model, at least 5.
        warmup: untimed rounds first.
        threads: thread count while timing; ``timing_threads()`` when omitted.

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
    labels = list(models)
    spent = {label: [] for label in labels}
    with _threads(count), torch.no_grad():
        for index in range(warmup + rounds):
            shift = index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                start = time.perf_counter()
                models[label](*args)
                if index >= warmup:
                    spent[label].append((time.perf_counter() - start) * 1e3)
        cpu = describe().verdict
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    times = {
        label: Timing(
            median=statistics.median(values),
            low=_percentile(values, 0.1),
            high=_percentile(values, 0.9),
            rounds=len(values),
        )
        for label, values in spent.items()
    }
    return Timings(times=times, threads=count, load=tuple(load), cpu=cpu)
