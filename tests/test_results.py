"""The landing page's figures: what a lesson publishes (common.results), and the speed-ups
each with its 95 % interval and load, ties said where intervals overlap."""

import pytest

from course_conf import TEXT
from course_results import speedup, ties_within_noise


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
    assert "95 %" in shown, "the interval says its confidence"


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
