"""The docs build fails loudly on a broken lesson, is deterministic, writes only ignored files."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import BUILT, EXAMPLES, ROOT, needs_dot
from languages import SPHINX_OPTIONS

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


def make_site(root: Path, lessons: dict[str, str]) -> Path:
    """A small copy of the English site at ``root`` whose gallery holds only ``lessons``.

    ``lessons`` maps "module_folder/file.py" to the script's text.
    """
    docs = root / "docs"
    shutil.copytree(
        ROOT / "docs",
        docs,
        ignore=shutil.ignore_patterns("lessons", "*.md", "__pycache__"),
    )
    (docs / "en" / "index.md").write_text("# Fixture\n\n```{toctree}\nlessons/index\n```\n")
    (docs / "en" / "lessons").mkdir()
    shutil.copy(ROOT / "docs" / "en" / "lessons" / "index.rst", docs / "en" / "lessons")
    for relative, text in lessons.items():
        path = root / "examples" / "en" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "README.txt").write_text("Module\n======\n\nFixture.\n")
        path.write_text(text, encoding="utf-8")
    return root


def sphinx_build(root: Path, *, strict: bool = True) -> subprocess.CompletedProcess:
    options = SPHINX_OPTIONS if strict else [o for o in SPHINX_OPTIONS if o != "-W"]
    command = [sys.executable, "-m", "sphinx", *options, "docs/en", "build/html/en"]
    return subprocess.run(command, cwd=root, capture_output=True, text=True)


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


def first_lesson_of_each_module() -> dict[str, str]:
    lessons = {}
    for module in sorted(p for p in (EXAMPLES / "en").iterdir() if p.is_dir()):
        scripts = sorted(module.glob("m[0-9][0-9]_*.py"))
        if scripts:
            lessons[f"{module.name}/{scripts[0].name}"] = scripts[0].read_text(encoding="utf-8")
    return lessons


def lesson_outputs(site: Path) -> dict[str, bytes]:
    """The generated lesson pages (minus run-time lines) and their pictures."""
    outputs = {}
    for path in sorted((site / "docs" / "en" / "lessons").rglob("*")):
        if path.suffix == ".svg" and "thumb" not in path.parts:
            outputs[str(path.relative_to(site))] = path.read_bytes()
        elif path.suffix == ".rst" and path.name.startswith("m"):
            text = path.read_text(encoding="utf-8")
            text = re.sub(r"\*\*Total running time of the script:\*\*.*", "", text)
            # Lessons print measured times beside what they claim (never assert them): the
            # seconds, milliseconds and their ratios change from run to run, nothing else may.
            text = re.sub(r"\d+(?:\.\d+)?(?= ?m?s\b| ?×)", "<measured>", text)
            # common.timing's tables: median, p10–p90 and spread per row, then the load average.
            text = re.sub(r"\d+\.\d+ +\d+\.\d+–\d+\.\d+ +\d+%", "<measured>", text)
            text = re.sub(r"load average \S+ \(1 min\), \S+ \(5 min\)", "<measured>", text)
            text = re.sub(r" +<measured>", " <measured>", text)  # aligned by their width
            outputs[str(path.relative_to(site))] = text.encode()
    return outputs


def clean_build(root: Path, lessons: dict[str, str]) -> Path:
    site = make_site(root, lessons)
    # Not -W: the copied lessons link to lessons this small site does not have.
    result = sphinx_build(site, strict=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return site


# On the worker that has the built site (tests/conftest.py): the site's build is one of the two.
@pytest.mark.xdist_group("site")
def test_a_clean_build_gives_lessons_the_outputs_the_site_build_gave_them(site, tmp_path):
    """A lesson's page and pictures depend on nothing but the lesson: a clean build of the
    first lesson of each module, alone, writes what the site's build (all lessons, one after
    another in one process, perhaps incrementally) wrote for them."""
    lessons = first_lesson_of_each_module()
    assert lessons
    alone = lesson_outputs(clean_build(tmp_path / "alone", lessons))
    if os.environ.get("PT2E_COURSE_SITE"):
        # A site built elsewhere: docs/en/lessons/ may be another build's; a second clean
        # build stands in for the site's.
        in_the_site = lesson_outputs(clean_build(tmp_path / "again", lessons))
    else:
        in_the_site = lesson_outputs(ROOT)
    assert sum(name.endswith(".svg") for name in alone) >= len(lessons), "every lesson draws"
    missing = sorted(set(alone) - set(in_the_site))
    assert not missing, f"the site's build did not write {missing}"
    differing = [name for name in alone if alone[name] != in_the_site[name]]
    assert not differing, f"outputs differ between the site's build and a clean one: {differing}"


@pytest.mark.xdist_group("site")
def test_a_build_with_nothing_changed_reads_no_page(site):
    """Sphinx decides what to read again from the files each page noted it read (lessons,
    README.txt, thumbnails, backreferences): with nothing changed, no page is read and no lesson
    runs (a changed lesson would be a changed page)."""
    command = [sys.executable, "-m", "sphinx", "-b", "html", "docs/en", str(BUILT / "en")]
    runs = 2 if os.environ.get("PT2E_COURSE_SITE") else 1  # then build/html may be stale
    for _ in range(runs):
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # What Sphinx read again, and why (config changed, outdated files), if anything.
    read = [
        line
        for line in result.stdout.splitlines()
        if "updating environment" in line or "reading sources" in line or "outdated" in line
    ]
    assert "updating environment: 0 added, 0 changed, 0 removed" in result.stdout, "\n".join(read)


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
        "from languages import write_site_root\n"
        f"write_site_root(__import__('pathlib').Path({str(tmp_path)!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "index.html").exists() and (tmp_path / "sitemap.xml").exists()
