"""Timings that hold on a small shared machine (common.timing): compare_speed, race, the key
a timing is measured once by while the site is built."""

import itertools
import time
from pathlib import Path

import pytest
import torch

from common import digest, lesson, timing
from common.cpu import describe
from common.kernels import KernelsRun
from common.timing import Timing, compare_speed, race, timing_key, timing_threads


def tiny_conv_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)
    ).eval()


def test_compare_speed_interleaves_rounds_each_model_after_the_same_other():
    calls = []
    models = {label: (lambda x, label=label: calls.append(label)) for label in "abc"}
    timings = compare_speed(models, (None,), rounds=5, warmup=1)
    assert calls == list("abc") * 6, "one call each per round, never a model after itself"
    assert all(timings[label].rounds == 5 for label in "abc"), "warm-up rounds are not timed"


def test_one_thread_times_cpu_time_so_a_neighbours_slices_do_not_count():
    """On one thread a call's time is the process's CPU time: a call that waited for the core
    (here: slept) costs what it computed."""
    timings = compare_speed({"sleeps": lambda x: time.sleep(0.02)}, (0,), rounds=5, threads=1)
    assert timings["sleeps"].median < 5, "the 20 ms asleep are not counted"
    walled = compare_speed({"sleeps": lambda x: time.sleep(0.02)}, (0,), rounds=5, threads=2)
    assert walled["sleeps"].median >= 20, "more threads: wall time"


def test_compare_speed_times_on_its_threads_and_restores_the_callers():
    before, seen = torch.get_num_threads(), []
    timings = compare_speed({"m": lambda x: seen.append(torch.get_num_threads())}, (0,), rounds=5)
    assert set(seen) == {timing_threads()} and timings.threads == timing_threads()
    assert torch.get_num_threads() == before
    compare_speed({"m": lambda x: seen.append(torch.get_num_threads())}, (0,), rounds=5, threads=1)
    assert seen[-1] == 1


def test_compare_speed_table_says_how_the_numbers_were_taken():
    timings = compare_speed({"fp32": torch.neg, "int8": torch.abs}, (torch.ones(64),), rounds=5)
    table = timings.table()
    for piece in ("fp32", "int8", "median ms", "p10–p90", "spread", "load average"):
        assert piece in table
    assert f"timed with {timings.threads} thread(s), 5 interleaved rounds" in table
    assert describe().verdict.split(";")[0] in table, "the CPU's int8 verdict"
    t = timings["fp32"]
    assert t.low <= t.median <= t.high
    assert timings.ratio("fp32", "int8") == t.median / timings["int8"].median


def test_timing_spread_is_the_middle_range_over_the_median():
    assert Timing(median=10.0, low=9.0, high=12.0, rounds=5).spread == pytest.approx(0.3)
    assert Timing(median=0.0, low=0.0, high=0.0, rounds=5).spread == 0.0


@pytest.mark.parametrize("rounds", [30, 100])
def test_median_interval_covers_the_true_median_95_times_in_100(rounds):
    """Skewed times (exponential, as a call's slow tail is): the interval of ``rounds`` draws
    holds the true median (ln 2) in 93–98 % of 2000 trials, and narrows as 1/sqrt(rounds)."""
    generator = torch.Generator().manual_seed(0)
    true_median = torch.log(torch.tensor(2.0)).item()
    covered, widths = 0, []
    for _ in range(2000):
        values = torch.empty(rounds).exponential_(generator=generator).tolist()
        low, high = timing.median_interval(values)
        covered += low <= true_median <= high
        widths.append(high - low)
    assert 0.93 <= covered / 2000 <= 0.98, f"covered {covered / 2000:.3f}"
    # the interval spans k - j of n ranks: in time, (k - j) / n over the density at the median
    # (1/2 here), e.g. 21/100 ranks -> 0.42; narrower with more rounds
    j, k = timing.median_interval(list(range(1, rounds + 1)))
    expected = (k - j) / rounds / 0.5
    assert abs(sum(widths) / len(widths) - expected) < 0.1 * expected


def test_timings_carry_the_median_interval_and_a_ratio_interval_that_holds_both():
    timings = compare_speed({"fp32": torch.neg, "int8": torch.abs}, (torch.ones(64),), rounds=20)
    for t in timings.times.values():
        assert t.low <= t.median_low <= t.median <= t.median_high <= t.high
    low, high = timings.ratio_interval("fp32", "int8")
    assert low <= timings.ratio("fp32", "int8") <= high
    fp32, int8 = timings["fp32"], timings["int8"]
    assert (low, high) == (fp32.median_low / int8.median_high, fp32.median_high / int8.median_low)


@pytest.mark.parametrize(
    ("models", "rounds", "message"),
    [({}, 30, "at least one model"), ({"m": abs}, 4, "rounds=4 gives no usable median")],
    ids=["no-models", "too-few-rounds"],
)
def test_compare_speed_refuses_unusable_settings(models, rounds, message):
    with pytest.raises(ValueError, match=message):
        compare_speed(models, (1,), rounds=rounds)


def test_race_refuses_a_model_compiled_already():
    with pytest.raises(TypeError, match=r"already torch\.compile'd"):
        race({"fp32": torch.compile(tiny_conv_net())}, (torch.randn(1, 3, 8, 8),))


def test_race_raises_when_the_kernels_change_during_the_timing(monkeypatch):
    answers = itertools.cycle(
        [KernelsRun(int8={"onednn::qconv_pointwise": 1}, float={}), KernelsRun(int8={}, float={})]
    )
    monkeypatch.setattr(timing, "kernels_run", lambda model, args: next(answers))
    monkeypatch.setattr(torch, "compile", lambda model, **options: model)
    monkeypatch.setattr(torch._inductor.config, "freezing", False)
    with pytest.raises(RuntimeError, match="recompiled"):
        race({"int8": tiny_conv_net()}, (torch.randn(1, 3, 8, 8),), rounds=5, warmup=0)


def test_race_compiles_with_freezing_for_the_process_and_reports_what_ran(monkeypatch):
    monkeypatch.setattr(torch._inductor.config, "freezing", False)
    raced = race({"fp32": tiny_conv_net()}, (torch.randn(2, 3, 8, 8),), rounds=5, warmup=1)
    assert torch._inductor.config.freezing, "a later recompile keeps freezing"
    assert hasattr(raced.models["fp32"], "_orig_mod"), "the timed model is the compiled copy"
    assert raced.kernels["fp32"].float and not raced.kernels["fp32"].int8
    assert raced["fp32"].rounds == 5 and "ran int8: none" in raced.table()


def test_timing_key_follows_the_weights_and_the_input_shape():
    x = (torch.randn(2, 3, 8, 8),)
    model = tiny_conv_net()
    key = timing_key({"m": model}, x)
    assert key == timing_key({"m": tiny_conv_net()}, x), "same code, same weights"
    with torch.no_grad():
        model[0].weight[0, 0, 0, 0] += 1
    assert timing_key({"m": model}, x) != key
    assert timing_key({"m": tiny_conv_net()}, (torch.randn(4, 3, 8, 8),)) != key
    assert timing_key({"m": lambda t: t}, x) is None, "code it cannot read: no key"
    assert timing_key({"m": torch.compile(tiny_conv_net())}, x) is None


def test_a_timing_is_measured_once_while_the_site_is_built(tmp_path):
    x = (torch.randn(2, 3, 8, 8),)
    lesson.start(lang="en", name="m03_3_speed", measured=tmp_path, pictures=False)
    try:
        first = compare_speed({"m": tiny_conv_net()}, x, rounds=5)
        again = compare_speed({"m": tiny_conv_net()}, x, rounds=5)
    finally:
        lesson.stop()
    assert again == first, "the other language's build shows the same figures"
    assert len(list(tmp_path.glob("*/*.json"))) == 1
    compare_speed({"m": tiny_conv_net()}, x, rounds=5)
    assert len(list(tmp_path.glob("*/*.json"))) == 1, "a reader's run measures afresh"


class Scaled(torch.nn.Module):
    """Does ``repeat`` times the work, and adds its non-persistent buffer."""

    def __init__(self, repeat: int, offset: float = 0.0):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.repeat = repeat  # a plain attribute that steers forward
        self.register_buffer("offset", torch.full((8,), offset), persistent=False)

    def forward(self, x):
        for _ in range(self.repeat):
            x = self.linear(x)
        return shifted(x, self.offset)


def shifted(x, offset):
    return x + offset


def scaled(repeat: int = 1, offset: float = 0.0) -> Scaled:
    torch.manual_seed(0)
    return Scaled(repeat, offset).eval()


def test_timing_key_follows_a_plain_attribute_that_changes_the_work():
    x = (torch.randn(2, 8),)
    assert timing_key({"m": scaled(1)}, x) == timing_key({"m": scaled(1)}, x)
    assert timing_key({"m": scaled(1)}, x) != timing_key({"m": scaled(50)}, x)


def test_timing_key_follows_a_non_persistent_buffer():
    x = (torch.randn(2, 8),)
    one, other = scaled(offset=0.0), scaled(offset=1.0)
    assert one.state_dict().keys() == other.state_dict().keys(), "not in the state dict"
    assert timing_key({"m": one}, x) != timing_key({"m": other}, x)


def test_timing_key_follows_the_module_level_functions_forward_calls(monkeypatch):
    x = (torch.randn(2, 8),)
    key = timing_key({"m": scaled()}, x)
    monkeypatch.setitem(globals(), "shifted", lambda x, offset: x - offset)
    assert timing_key({"m": scaled()}, x) != key


def test_timing_key_follows_the_stack_and_the_helpers_code(monkeypatch):
    x = (torch.randn(2, 8),)
    key = timing_key({"m": scaled()}, x)
    versions = (("torch", "2.13.0"), ("torchao", "0.18.0"), ("executorch", "9.9.9"))
    monkeypatch.setattr(digest, "stack_versions", lambda: versions)
    assert timing_key({"m": scaled()}, x) != key, "another ExecuTorch"
    monkeypatch.undo()
    monkeypatch.setattr(timing, "_SOURCE", Path(lesson.__file__))
    assert timing_key({"m": scaled()}, x) != key, "another common/timing.py"


def test_as_compiled_sets_race_s_threads_and_grad_mode_and_gives_the_caller_s_back():
    from common.timing import as_compiled

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with pytest.raises(KeyError), as_compiled(other):
        assert torch.get_num_threads() == other and not torch.is_grad_enabled()
        raise KeyError("a step that fails inside")
    assert torch.get_num_threads() == before and torch.is_grad_enabled()
