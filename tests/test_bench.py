"""benchmarks/bench.py's pure parts: the "runs again" parser and its targets (no build runs)."""

import dataclasses
import importlib.util

from lesson_scripts import ROOT

_spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

NOX_OUTPUT = """\
nox > Running session docs
--- sphinx-build en ---
en: m07_4_op_atlas runs again: common/atlas/run.py
--- sphinx-build zh_TW ---
zh_TW: m07_4_op_atlas runs again: common/atlas/run.py
zh_TW: m07_3_every_quantizer runs again: common/atlas/run.py, common/lesson.py
fr: m00_1 runs again: not a language of the site
nox > Session docs was successful in 12 seconds.
"""


def test_parse_reruns_reads_each_lesson_the_build_runs_again():
    assert bench.parse_reruns(NOX_OUTPUT) == [
        ("en", "m07_4_op_atlas"),
        ("zh_TW", "m07_3_every_quantizer"),
        ("zh_TW", "m07_4_op_atlas"),
    ]
    assert bench.parse_reruns("nox > Session docs was successful\n") == []


def _pages(stem):
    return bench.expected_pages(stem)


def _measurements(**changes):
    """Figures that meet every target; ``changes`` replaces some."""
    met = bench.Measurements(
        repeat=1,
        cpu="AVX512, 2 threads",
        lessons=70,
        floor=350.0,
        modules={"m07_your_model": {"en": 40.0, "zh_TW": 40.0}},
        timing={"m07_your_model": {"en": 0.0, "zh_TW": 0.0}},
        clean=360.0,
        noop=2.5,
        twins=5.0,
        edit=9.0,
        edit_pages=_pages(bench.EDITED_LESSON.stem),
        atlas_file="common/atlas/run.py",
        atlas_edit=30.0,
        atlas_reruns=[(lang, bench.ATLAS_LESSON) for lang in sorted(bench.LANGUAGES)],
        atlas_pages=_pages(bench.ATLAS_LESSON),
        one_lesson=12.0,
        one_lesson_pages=_pages(bench.EDITED_LESSON.stem),
        tests=500.0,
        tests_passed=True,
        tests_summary="10 passed",
        noop_after_tests=2.5,
        lesson_run=3.0,
        edit_tests=7.0,
        profile=[("tests/test_x.py::test_y", 1.0, 1)],
        ci=2000.0,
        ci_docs=900.0,
        draw_rows=[
            {"layers": 4, "nodes": 10, "draw": (0.1, 100), "fx": (0.2, 200), "untooltipped": 90}
        ],
    )
    return dataclasses.replace(met, **changes)


def test_every_target_is_met_by_figures_within_it():
    checks = bench.check(_measurements())
    assert [name for name, ok, _ in checks if ok is not True] == []
    assert bench.report(_measurements(), checks).count("| yes |") == len(checks)


def test_every_target_can_fail():
    twins = _pages(bench.EDITED_LESSON.stem)
    missed = _measurements(
        floor=300.0,  # clean 360 > 315
        noop=3.5,
        noop_after_tests=3.5,
        edit_pages=[*twins, *_pages("m00_1_getting_a_graph")],  # another lesson re-ran
        edit=10.5,  # > twins 5 + 5
        atlas_reruns=[("en", bench.ATLAS_LESSON), ("en", "m07_3_every_quantizer")],
        one_lesson_pages=twins[:1],  # one twin only
        one_lesson=15.5,  # > 5 + 10
        edit_tests=8.5,  # > 3 + 5
        tests_passed=False,  # within its time, but failing
        modules={"m07_your_model": {"en": 70.0, "zh_TW": 70.0}},
        ci=2500.0,
        draw_rows=[
            {"layers": 4, "nodes": 10, "draw": (0.3, 300), "fx": (0.2, 200), "untooltipped": 200}
        ],
    )
    checks = bench.check(missed)
    assert [name for name, ok, _ in checks if ok is not False] == []
    assert len(checks) == len(bench.check(_measurements()))


def test_a_target_whose_figure_is_missing_is_not_met():
    atlas_alone = _measurements(atlas_pages=[])  # the lines said so, the pages did not change
    no_module = _measurements(modules={})
    no_ci = _measurements(ci=None, ci_docs=None)
    for measured, target in [
        (atlas_alone, "re-runs only m07_4_op_atlas"),
        (no_module, "m07_your_model adds"),
        (no_ci, "`bash .ci/run`"),
    ]:
        (ok,) = [ok for name, ok, _ in bench.check(measured) if target in name]
        assert ok is not True, target
    assert "| not measured |" in bench.report(no_ci, bench.check(no_ci))
