"""The docs build fails loudly on a broken lesson, redoes nothing when nothing changed, writes
only ignored files. (That a lesson's pages do not depend on the lessons built before it is
checked by its reader run, tests/test_lessons.py.)"""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from built_site import BUILT, SITE_PYTHON, make_site, site_lock, sphinx_build
from lesson_scripts import ROOT
from marks import needs_dot

from site_build import SPHINX_OPTIONS

pytestmark = [pytest.mark.slow, needs_dot]

FAILING_LESSON = '''\
"""
A failing lesson
================

Its assert does not hold, so the build must stop.
"""

# %%
# Step 1 — add
# ------------

value = 1 + 1
assert value == 3, "one plus one should be three"
'''


def test_a_failing_lesson_fails_the_build_and_names_file_line_and_assertion(tmp_path):
    site = make_site(tmp_path, {"m99_fixture/m99_1_fails.py": FAILING_LESSON})
    result = sphinx_build(site)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "m99_1_fails.py" in output
    assert re.search(r'm99_1_fails\.py", line 13', output), output
    assert "AssertionError: one plus one should be three" in output
    assert not (site / "build" / "html" / "en" / "lessons" / "m99_fixture").exists(), (
        "no page may be written for a lesson that failed"
    )


@pytest.mark.xdist_group("site")
def test_a_build_with_nothing_changed_reads_no_page(site):
    """Sphinx decides what to read again from the files each page noted it read (lessons,
    README.txt, thumbnails, backreferences): with nothing changed, no page is read and no lesson
    runs (a changed lesson would be a changed page)."""
    # -vv: Sphinx then says why it reads a page ("[build target] changed: ... due to ...").
    command = [SITE_PYTHON, "-m", "sphinx", "-vv", "-b", "html", "docs/en", str(BUILT / "en")]
    runs = 2 if os.environ.get("PT2E_COURSE_SITE") else 1  # then build/html may be stale
    for _ in range(runs):
        with site_lock():
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # What Sphinx read again, and why (config changed, outdated files), if anything.
    counts = re.findall(r"\d+ added, \d+ changed, \d+ removed", result.stdout)
    why = [line for line in result.stdout.splitlines() if "[build target] changed" in line]
    assert counts == ["0 added, 0 changed, 0 removed"], "\n".join(counts + why)


USES_COMMON = '''\
"""
Uses common
===========

Imports a helper of common.
"""

import common.expect

print("uses", common.expect.__name__)
'''

NO_COMMON = '''\
"""
Plain
=====

Imports nothing of common.
"""

print("plain")
'''


def test_a_lesson_runs_again_only_when_its_script_or_a_common_module_it_imports_changed(
    tmp_path,
):
    """docs/course_rerun.py: an edit of ``common/expect.py`` runs again the lesson that imports
    it, not the other, and the build's output says why; with ``PT2E_COURSE_LESSON`` only the
    lesson it names runs, the other's page and run stay as they were."""
    site = make_site(
        tmp_path,
        {"m99_fixture/m99_1_uses.py": USES_COMMON, "m99_fixture/m99_2_plain.py": NO_COMMON},
    )
    shutil.copytree(ROOT / "common", site / "common", ignore=shutil.ignore_patterns("__pycache__"))
    pages = site / "docs" / "en" / "lessons" / "m99_fixture"
    env = {k: v for k, v in os.environ.items() if k != "PT2E_COURSE_LESSON"}

    def build(**extra) -> str:
        command = [sys.executable, "-m", "sphinx", *SPHINX_OPTIONS, "docs/en", "build/html/en"]
        done = subprocess.run(
            command, cwd=site, capture_output=True, text=True, env={**env, **extra}
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    build()
    assert (pages / "m99_1_uses.py.md5").exists() and (pages / "m99_2_plain.py.md5").exists()
    assert "runs again" not in build(), "nothing changed: nothing runs again"

    expect = site / "common" / "expect.py"
    expect.write_text(expect.read_text() + "\n# an edit\n")
    plain = site / "examples" / "en" / "m99_fixture" / "m99_2_plain.py"
    plain.write_text(NO_COMMON.replace('"plain"', '"plain, edited"'))
    alone = build(PT2E_COURSE_LESSON="m99_2")
    assert "m99_1_uses" not in alone, "a lesson not named does not run"
    assert "plain, edited" in (pages / "m99_2_plain.rst").read_text()
    assert (pages / "m99_1_uses.py.md5").exists(), "its last run is kept"

    everything = build()
    assert "en: m99_1_uses runs again: common/expect.py" in everything, everything
    assert "m99_2_plain" not in everything, "its inputs did not change"

    command = [sys.executable, "-m", "sphinx", *SPHINX_OPTIONS, "docs/en", "build/html/en"]
    unknown = subprocess.run(
        command, cwd=site, capture_output=True, text=True, env={**env, "PT2E_COURSE_LESSON": "m42"}
    )
    assert unknown.returncode != 0, "a lesson that does not exist fails the build"
    assert "names no lesson: m42" in unknown.stdout + unknown.stderr
    assert "m99_1_uses, m99_2_plain" in unknown.stdout + unknown.stderr, "and lists the lessons"


def test_the_build_writes_only_generated_ignored_folders(tmp_path):
    lesson = textwrap.dedent('''\
        """
        Tiny
        ====

        Prints.
        """

        print("hello")
        ''')
    site = make_site(tmp_path, {"m99_fixture/m99_1_tiny.py": lesson})
    before = {p for p in site.rglob("*") if p.is_file()}
    assert sphinx_build(site).returncode == 0
    written = {p for p in site.rglob("*") if p.is_file()} - before
    outside = [
        str(p.relative_to(site))
        for p in written
        if not p.is_relative_to(site / "build")
        and not p.is_relative_to(site / "docs" / "en" / "lessons")
        and "__pycache__" not in p.parts
    ]
    assert written and not outside, (
        f"the build wrote outside build/ and docs/en/lessons/: {outside}"
    )
    for generated in ("build/html/index.html", "docs/en/lessons/m00_graphs/index.rst"):
        checked = subprocess.run(["git", "check-ignore", "-q", generated], cwd=ROOT)
        assert checked.returncode == 0, f"{generated} is not git-ignored"


def test_the_site_root_is_written_without_sphinx(tmp_path):
    """nox runs build_site in its own Python, which has no Sphinx: the root must not need it."""
    script = (
        "import sys\n"
        "sys.modules['sphinx'] = None  # any import of Sphinx now fails\n"
        f"sys.path.insert(0, {str(ROOT / 'docs')!r})\n"
        "from site_build import write_site_root\n"
        f"write_site_root(__import__('pathlib').Path({str(tmp_path)!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "index.html").exists() and (tmp_path / "sitemap.xml").exists()


def test_the_build_exports_torchaos_pattern_graphs_once_in_every_module_that_holds_them():
    """docs/course_gallery.reset calls export_once before each lesson: torchao's exporter and
    any ExecuTorch module that imported it by name get one caching exporter."""
    code = textwrap.dedent(
        """
        import sys, types
        sys.path.insert(0, "docs")
        import torchao.quantization.pt2e.quantize_pt2e
        from torchao.quantization.pt2e import utils
        import pattern_graphs

        original = utils._get_aten_graph_module_for_pattern
        holder = types.ModuleType("executorch.backends.holder")  # as XNNPACK's utils hold it
        holder._get_aten_graph_module_for_pattern = original
        sys.modules[holder.__name__] = holder
        cached = pattern_graphs.export_once()
        assert cached is not original and cached.export_pattern is original
        assert utils._get_aten_graph_module_for_pattern is cached
        assert holder._get_aten_graph_module_for_pattern is cached
        assert pattern_graphs.export_once() is cached, "idempotent"
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_lesson_run_again_keeps_no_picture_of_its_earlier_run(tmp_path):
    """A lesson whose first picture was a chart (png) and is now a graph (svg): sphinx-gallery
    would take the stale png as its thumbnail, so the pictures of the earlier run go first."""
    from course_gallery import forget_earlier_pictures

    images = tmp_path / "lessons" / "m04_accuracy" / "images"
    (images / "thumb").mkdir(parents=True)
    thumbs = images / "thumb"
    stale = [images / "sphx_glr_m04_4_qat_001.png", thumbs / "sphx_glr_m04_4_qat_thumb.png"]
    kept = [images / "sphx_glr_m04_3_qat_001.png", thumbs / "sphx_glr_m04_3_qat_thumb.svg"]
    for path in stale + kept:
        path.write_bytes(b"")
    forget_earlier_pictures(tmp_path, "m04_4_qat")
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
