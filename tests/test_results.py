"""The landing page's figures: what a lesson publishes (common.results), and the speed-ups
each with its 95 % interval and load, ties said where intervals overlap."""

import json
import statistics

import pytest

from course_conf import TEXT
from course_results import speedup, ties_within_noise
from course_sources import results_folder


@pytest.mark.parametrize(
    ("figures", "ties"),
    [
        pytest.param(
            {"A": (2.0, [1.9, 2.1], 1.0), "B": (2.05, [2.0, 2.1], 1.0)},
            [("A", "B")],
            id="overlapping intervals: a tie",
        ),
        pytest.param(
            {"A": (2.0, [1.9, 2.1], 1.0), "B": (2.2, [2.11, 2.3], 1.0)},
            [],
            id="intervals apart by 0.01: ranked",
        ),
        pytest.param(
            {"A": (2.0, [1.9, 2.1], 1.0), "B": (2.2, [2.1, 2.3], 1.0)},
            [("A", "B")],
            id="intervals touching: a tie",
        ),
        pytest.param(
            {
                "VNNI": (2.9, [2.8, 3.0], 1.0),
                "AVX2": (1.9, [1.8, 2.05], 1.0),
                "AVX512": (2.0, [1.95, 2.1], 1.0),
            },
            [("AVX2", "AVX512")],
            id="only the close pair",
        ),
    ],
)
def test_speedups_whose_intervals_overlap_are_ties(figures, ties):
    assert ties_within_noise(figures) == ties


@pytest.mark.parametrize("lang", TEXT)
def test_a_speedup_shows_its_interval_and_load(lang):
    shown = speedup(2.764, [2.61, 2.93], 2.96, TEXT[lang])
    assert shown.startswith("2.76×") and "2.61–2.93×" in shown and "2.96" in shown
    assert "95%" in shown.replace(" ", ""), "the interval says its confidence"


# ---------------------------------------------------------------- common.results.publish


@pytest.fixture
def building(tmp_path):
    """A lesson as the site's build runs it, its figures sent under ``tmp_path``."""
    from common import lesson

    lesson.start(lang="en", name="m03_3_speed", results=tmp_path)
    yield tmp_path / "m03_3_speed.json"
    lesson.stop()


def test_publish_writes_the_running_lessons_figures_while_the_site_is_built(building):
    import json

    from common.results import publish

    publish("int8_speedup_compiled", 2.5)
    publish("spreads", (0.1, 0.2))
    assert json.loads(building.read_text("utf-8")) == {
        "int8_speedup_compiled": 2.5,
        "spreads": [0.1, 0.2],
    }
    stamp = building.stat().st_mtime_ns
    publish("spreads", [0.1, 0.2])
    assert building.stat().st_mtime_ns == stamp, "the same figures: the file is left alone"


def test_a_reader_publishes_nothing(tmp_path):
    from common.results import publish

    publish("answer", 42)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (object(), TypeError, "needs a number, string, list or dict, not object"),
        (float("nan"), ValueError, "got NaN or infinity"),
    ],
    ids=["not-json", "nan"],
)
def test_publish_refuses_what_is_not_a_finite_json_value(building, value, error, message):
    from common.results import publish

    with pytest.raises(error, match=message):
        publish("figure", value)
    assert not building.exists()


@pytest.mark.parametrize("lang", TEXT)
def test_a_speedup_of_several_runs_shows_their_range_and_the_highest_load(lang):
    shown = speedup(2.764, [2.61, 2.93], 2.96, TEXT[lang], runs=True)
    assert shown.startswith("2.76×") and "2.61–2.93×" in shown and "2.96" in shown
    assert "95" not in shown, "a range of five runs is no 95 % interval"


@pytest.mark.slow
def test_the_same_path_in_other_processes_is_not_ranked_and_a_faster_one_is(site):
    """The build's M03-3 measured this CPU's path twice, in two sets of five processes, the
    paths taking turns: the two are not ranked apart (an A/A check, which a true tie fails
    0.8 % of the time: 2 / C(10, 5)), while AVX2, where this CPU's path runs clearly faster
    (a median 20 % apart), is ranked below it."""
    from common.timing import ranked_apart

    found = json.loads((results_folder("en") / "m03_3_speed_and_size.json").read_text())
    runs, native = found["eager_runs"], found["int8_path"]
    again = [label for label in runs if label != native and label.startswith(native)]
    assert len(again) == 1 and len(runs[native]) == len(runs[again[0]]) == 5, sorted(runs)
    assert not ranked_apart(runs[native], runs[again[0]]), f"A/A ranked apart: {runs}"
    ties = ties_within_noise(
        {label: (0, [min(r), max(r)], 0) for label, r in runs.items() if label in (native, *again)}
    )
    assert ties, "the landing page names the A/A pair a tie"
    if "AVX2" in runs and statistics.median(runs[native]) > 1.2 * statistics.median(runs["AVX2"]):
        assert ranked_apart(runs[native], runs["AVX2"]), f"{native} not ranked above AVX2: {runs}"
