"""The lessons as the tests see them: the list, their exercise solutions, a run as a reader's."""

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

from site_facts import LANGUAGES

__all__ = [
    "ALL_LESSONS",
    "EXAMPLES",
    "INSTALLED_LESSONS",
    "NOTEBOOK_LESSON",
    "PASSED_READER_RUNS",
    "ROOT",
    "RUNNER",
    "VIRTUALENV_LESSON",
    "assert_drew_the_sites_pictures",
    "build_measurements",
    "drawn_alike_in_any_folder",
    "exercise_solutions",
    "lessons",
    "page_pictures",
    "passed_before",
    "reader_run_key",
    "remember_pass",
    "run_as_a_reader",
    "torch_threads",
]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RUNNER = Path(__file__).with_name("run_lesson.py")  # what run_as_a_reader starts
#: One empty file per reader run that passed, named by ``reader_run_key``: a run with the same
#: inputs is not run again (Bazel keeps test results so). A fresh clone, CI's, runs them all.
PASSED_READER_RUNS = ROOT / "build" / "cache" / "reader-runs"


def lessons(lang: str) -> list[Path]:
    """Lesson scripts of one language, as paths relative to examples/<lang>.

    The quickstart page (``quickstart/quickstart.py``) is run and checked like a lesson.
    """
    base = EXAMPLES / lang
    scripts = [*base.glob("*/m[0-9][0-9]_*.py"), *base.glob("quickstart/quickstart.py")]
    return sorted(p.relative_to(base) for p in scripts)


ALL_LESSONS = sorted({(lang, path) for lang in LANGUAGES for path in lessons(lang)})

# Each lesson runs once outside the docs build. The quickstart, the page a reader is likeliest
# to open in Jupyter or Colab, runs as its downloaded notebook (test_site.py); M00-1 as a page's
# download, in a virtualenv made with the page's pip command only, then in the same virtualenv
# the lessons that keep expensive results in the course's cache (M03-4: AOTInductor packages
# and trained weights; M06-3: its .pte and ETRecord) after their page's command
# (test_front_door.py); every other lesson as a script (test_lessons.py).
NOTEBOOK_LESSON = Path("quickstart/quickstart.py")
VIRTUALENV_LESSON = Path("m00_graphs/m00_1_getting_a_graph.py")
INSTALLED_LESSONS = (
    Path("m03_lowering/m03_4_shipping.py"),
    Path("m06_executorch/m06_3_pte_inside_out.py"),
)


def drawn_alike_in_any_folder(relative: Path) -> bool:
    """Whether a lesson draws its page's pictures from any folder. ``torch.export``'s
    ``.module()`` leaves its ``_guards_fn`` node out when a file on the call stack has
    "executorch" or "torchao" in its path (M06-4 shows it): the pages of such a folder
    (``m06_executorch/``) or file (``m99_5_executorch_...``) are drawn without it, a reader's
    copy elsewhere with it. Their pictures are compared where the course keeps them."""
    return not any(word in relative.as_posix() for word in ("executorch", "torchao"))


def exercise_solutions(path: Path) -> list[str]:
    """The code of each exercise solution of a lesson, in order.

    A solution is a ``.. code-block:: python`` inside a ``.. dropdown::`` in a text block (see
    README, "Adding a lesson"); the page shows it folded, and the tests run it after the lesson.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    text = [re.sub(r"^# ?", "", line) if line.startswith("#") else None for line in lines]
    solutions, in_dropdown = [], None
    for i, line in enumerate(text):
        if line is None:
            in_dropdown = None
            continue
        indent = _indent(line)
        if line.strip().startswith(".. dropdown::"):
            in_dropdown = indent
        elif in_dropdown is not None and line.strip() and indent <= in_dropdown:
            in_dropdown = None
        if in_dropdown is None or line.strip() != ".. code-block:: python":
            continue
        body = []
        for following in text[i + 1 :]:
            if following is None or (following.strip() and _indent(following) <= indent):
                break
            body.append(following)
        solutions.append(textwrap.dedent("\n".join(body)).strip() + "\n")
    return solutions


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def torch_threads() -> dict[str, str]:
    """The environment that gives a test's torch one thread per worker, under pytest-xdist.

    The workers are one per core (``-n auto``): with torch's default of one thread per core
    each, they would take turns on both cores. A run without workers keeps the default, and
    so do the docs builds the tests start.
    """
    return {"OMP_NUM_THREADS": "1"} if os.environ.get("PYTEST_XDIST_WORKER") else {}


def run_as_a_reader(
    python: str,
    script: Path,
    folder: Path,
    *,
    env: dict,
    cap: str | None = None,
    measured: dict | None = None,
    patterns: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``script`` and its exercise solutions in a fresh ``python`` (tests/run_lesson.py),
    from ``folder`` (an unrelated one: the lesson must find common through the installed
    package), its pictures written there as graph_NNN.svg; with ``measured``
    (``build_measurements``), its timings read from the site's build; with ``patterns``,
    torchao's pattern graphs exported once in the run, as the build does (docs/pattern_graphs.py;
    a checkout's run only). Asserts it succeeded, wrote nothing to stderr, and drew."""
    env = {**env, **torch_threads(), "PT2E_COURSE_DRAW_DIR": str(folder)}
    if cap:
        from common.cpu import isa_environment

        env.update(isa_environment(cap))
    docs = str(ROOT / "docs") if patterns else None
    job = json.dumps([str(script), exercise_solutions(script), cap, measured, docs])
    result = subprocess.run(
        [python, str(RUNNER)],
        input=job,
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    where = f"{script}" + (f" (kernels capped at {cap})" if cap else "")
    assert result.returncode == 0, f"{where} failed:\n{result.stderr[-3000:]}"
    assert result.stderr == "", f"{where} wrote to stderr:\n{result.stderr[-3000:]}"
    assert list(folder.glob("graph_*.svg")), f"{where} drew no picture"
    return result


def page_pictures(lessons: Path, relative: Path) -> list[Path]:
    """The pictures a lesson's page shows, in order: ``images/sphx_glr_<stem>_NNN.svg`` beside
    its page under ``lessons`` (``docs/<lang>/lessons`` where the build writes them, or a built
    site's ``<lang>/lessons``)."""
    images = lessons / relative.parent / "images"
    return sorted(images.glob(f"sphx_glr_{relative.stem}_[0-9][0-9][0-9].svg"))


def passed_before(key: str) -> bool:
    """Whether a run with the inputs ``key`` names passed before (``remember_pass``);
    never when ``PT2E_COURSE_RERUN_READERS`` is set."""
    return (PASSED_READER_RUNS / key).exists() and not os.environ.get("PT2E_COURSE_RERUN_READERS")


def remember_pass(key: str) -> None:
    PASSED_READER_RUNS.mkdir(parents=True, exist_ok=True)
    (PASSED_READER_RUNS / key).touch()


def reader_run_key(lang: str, relative: Path, cap: str | None) -> str:
    """What a lesson's reader run (``run_as_a_reader`` then ``assert_drew_the_sites_pictures``)
    depends on, as a digest: the script (its solutions are in it), the ``common`` files its
    imports reach (the closure the site's re-runs use), the pins (pyproject.toml), the stack,
    this CPU and the ISA cap, the runner, and the page's pictures it is compared with."""
    from common.cpu import describe

    from course_sources import common_closure, inputs_digest

    script = EXAMPLES / lang / relative
    compared = page_pictures(ROOT / "docs" / lang / "lessons", relative)
    runner = [RUNNER, Path(__file__), ROOT / "docs" / "pattern_graphs.py"]
    inputs = [script, *common_closure(script), *runner, ROOT / "pyproject.toml"]
    return inputs_digest([*inputs, *compared], f"cap {cap}", repr(describe()))


def build_measurements(lang: str, relative: Path, folder: Path) -> dict | None:
    """What the site's build measured once for a lesson (``common.cache.measured_once``: its
    timings, ``run_under_isa``'s answers), copied into ``folder``, as ``run_as_a_reader``'s
    ``measured``; None when the build kept none for the lesson's inputs.

    A reader run on this CPU's own path then prints the figures its page prints instead of
    timing again: the code that measured them ran in the build under the same inputs (the
    stack, the lesson's ``common`` closure; ``measured_key``), and timings are printed, never
    asserted. A run capped at another ISA than the build's gets them too: its own timings are
    keyed by its kernel path (``common.timing.timing_key``), so it measures them, and it reads
    the answers of the build's ``run_under_isa`` subprocesses, whose path is their ``isa``'s
    whichever process asks.
    """
    from course_sources import MEASURED_ONCE, measured_key

    inputs = measured_key(EXAMPLES / lang / relative)
    kept = MEASURED_ONCE / inputs
    if not any(kept.glob("*.json")):
        return None
    shutil.copytree(kept, folder / inputs, ignore=shutil.ignore_patterns("*.lock"))
    return {"lang": lang, "name": relative.stem, "folder": str(folder), "inputs": inputs}


def assert_drew_the_sites_pictures(folder: Path, lang: str, relative: Path) -> None:
    """The pictures a reader's run wrote into ``folder`` are, in order, those of the lesson's
    page: a lesson's pictures depend on nothing but the lesson (not on the lessons the site
    build ran before it in the same process, nor on the build being incremental). The run may
    draw more (its solutions run after it)."""
    drawn = sorted(folder.glob("graph_*.svg"))
    on_the_site = page_pictures(ROOT / "docs" / lang / "lessons", relative)
    assert len(drawn) >= len(on_the_site), f"{relative} drew fewer pictures than its page shows"
    differing = [
        site_svg.name
        for mine, site_svg in zip(drawn, on_the_site, strict=False)
        if mine.read_bytes() != site_svg.read_bytes()
    ]
    assert not differing, f"run alone, {relative} drew other pictures than the site's {differing}"
