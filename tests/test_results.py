"""The landing page's speed-ups: each with its spreads and load, ties said to be within noise."""

import pytest

from course_conf import TEXT
from course_directives import speedup, ties_within_noise


@pytest.mark.parametrize(
    ("figures", "ties"),
    [
        pytest.param(
            {"A": (2.0, [0.1, 0.1], 1.0), "B": (2.1, [0.1, 0.1], 1.0)},
            [("A", "B")],
            id="5 % apart, 10 % spreads: a tie",
        ),
        pytest.param(
            {"A": (2.0, [0.02, 0.02], 1.0), "B": (3.0, [0.02, 0.02], 1.0)},
            [],
            id="40 % apart, 2 % spreads: ranked",
        ),
        pytest.param(
            {
                "VNNI": (2.9, [0.1, 0.1], 1.0),
                "AVX2": (1.9, [0.2, 0.2], 1.0),
                "AVX512": (2.0, [0.2, 0.2], 1.0),
            },
            [("AVX2", "AVX512")],
            id="only the close pair",
        ),
    ],
)
def test_speedups_within_their_spreads_are_ties(figures, ties):
    assert ties_within_noise(figures) == ties


@pytest.mark.parametrize("lang", TEXT)
def test_a_speedup_shows_its_spreads_and_load(lang):
    shown = speedup(2.764, [0.13, 0.29], 2.96, TEXT[lang])
    assert shown.startswith("2.76×") and "13%" in shown and "29%" in shown and "2.96" in shown
