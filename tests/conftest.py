"""Shared fixtures and skips for the pt2e-course tests."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "docs"))
from pattern_graphs import export_once  # noqa: E402

from languages import LANGUAGES, build_site  # noqa: E402

BUILT = ROOT / "build" / "html"

# torch.compile's kernels (M03-3) are cached under build/, shared with the docs builds.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor_cache"))

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz 'dot' is not installed (apt-get install graphviz)"
)


def pytest_configure(config):
    """Refuse a pytest whose node ids pytest-xdist 3.8 cannot tag with their xdist_group: the
    groups would do nothing, and the built-site tests would share no site (two workers would
    build it at once into the same generated folders).

    Upstream: pytest-dev/pytest-xdist#1386 (open as of pytest-xdist 3.8.0); drop this guard,
    and raise the pytest pin, with the first pytest-xdist release that fixes it.
    """
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores xdist_group (pytest-xdist's loadgroup sets "
            "item._nodeid, which pytest 9.2 no longer reads); install the pytest pinned in "
            "pyproject.toml"
        )


def torch_threads() -> dict[str, str]:
    """The environment that gives a test's torch one thread per worker, under pytest-xdist.

    The workers are one per core (``-n auto``): with torch's default of one thread per core
    each, they would take turns on both cores. A run without workers keeps the default, and
    so do the docs builds the tests start.
    """
    return {"OMP_NUM_THREADS": "1"} if os.environ.get("PYTEST_XDIST_WORKER") else {}


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_per_worker():
    if torch_threads():
        import torch

        torch.set_num_threads(1)


# ------------------------------------------------------- torchao's pattern graphs, exported once
# Each test worker exports each of torchao's pattern graphs once (docs/pattern_graphs.py).


# Tests that make torchao export its BatchNorm patterns (~15 s the first time in a worker) run
# on one worker: the lowering matrix (which its test_matrix_reaches_every_rewrite reads whole),
# handmade's and the edge matrix's unfolded_bn cases.
ON_THE_PATTERN_WORKER = pytest.mark.xdist_group("torchao_patterns")


@pytest.fixture(scope="session", autouse=True)
def torchao_patterns_exported_once():
    """The docs build's cache (docs/pattern_graphs.py), for the whole session of a worker."""
    import executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (imports the modules it patches)

    return export_once()


def lessons(lang: str) -> list[Path]:
    """Lesson scripts of one language, as paths relative to examples/<lang>.

    The quickstart page (``quickstart/quickstart.py``) is run and checked like a lesson.
    """
    base = EXAMPLES / lang
    scripts = [*base.glob("*/m[0-9][0-9]_*.py"), *base.glob("quickstart/quickstart.py")]
    return sorted(p.relative_to(base) for p in scripts)


# The quickstart, the page a reader is likeliest to open in Jupyter or Colab, runs as its
# downloaded notebook (test_site.py) instead of as a script (test_lessons.py): each lesson runs
# once outside the docs build.
NOTEBOOK_LESSON = Path("quickstart/quickstart.py")

ALL_LESSONS = sorted({(lang, path) for lang in LANGUAGES for path in lessons(lang)})


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
        indent = len(line) - len(line.lstrip())
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
        code = "\n".join(body)
        solutions.append(_dedent(code).strip() + "\n")
    return solutions


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _dedent(code: str) -> str:
    import textwrap

    return textwrap.dedent(code)


# ------------------------------------------------------------------- a lesson as a reader runs it
# `python lesson.py`, then the exercise solutions in the lesson's namespace, then a check that a
# cap on the kernel path took (see common.cpu.isa_environment).
READER_RUNNER = """
import json, os, runpy, sys
path, solutions, capped_at = json.load(sys.stdin)
sys.argv, sys.path[0] = [path], os.path.dirname(path)
namespace = runpy.run_path(path, run_name="__main__")
for number, code in enumerate(solutions, 1):
    exec(compile(code, f"{path} (solution {number})", "exec"), namespace)
if capped_at:
    from common.cpu import describe
    assert describe().onednn == capped_at, f"not capped at {capped_at}: {describe().verdict}"
"""

# M00-1 runs outside the build as a page's download, in a virtualenv made with the page's pip
# command only (test_front_door.py); the quickstart as its downloaded notebook (test_site.py);
# every other lesson as a script (test_lessons.py). So each runs once beside the two builds.
VIRTUALENV_LESSON = Path("m00_graphs/m00_1_getting_a_graph.py")


def run_as_a_reader(
    python: str, script: Path, folder: Path, *, env: dict, cap: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``script`` and its exercise solutions in a fresh ``python``, from ``folder`` (an
    unrelated one: the lesson must find common through the installed package), its pictures
    written there as graph_NNN.svg. Asserts it succeeded, wrote nothing to stderr, and drew."""
    env = {**env, **torch_threads(), "PT2E_COURSE_DRAW_DIR": str(folder)}
    if cap:
        from common.cpu import isa_environment

        env.update(isa_environment(cap))
    job = json.dumps([str(script), exercise_solutions(script), cap])
    result = subprocess.run(
        [python, "-c", READER_RUNNER],
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


def assert_drew_the_sites_pictures(folder: Path, lang: str, relative: Path) -> None:
    """The pictures a reader's run wrote into ``folder`` are, in order, those of the lesson's
    page: a lesson's pictures depend on nothing but the lesson (not on the lessons the site
    build ran before it in the same process, nor on the build being incremental). The run may
    draw more (its solutions run after it)."""
    drawn = sorted(folder.glob("graph_*.svg"))
    pictures = ROOT / "docs" / lang / "lessons" / relative.parent / "images"
    on_the_site = sorted(pictures.glob(f"sphx_glr_{relative.stem}_[0-9][0-9][0-9].svg"))
    assert len(drawn) >= len(on_the_site), f"{relative} drew fewer pictures than its page shows"
    differing = [
        site_svg.name
        for mine, site_svg in zip(drawn, on_the_site, strict=False)
        if mine.read_bytes() != site_svg.read_bytes()
    ]
    assert not differing, f"run alone, {relative} drew other pictures than the site's {differing}"


# ------------------------------------------------------------------------- the built site
# Shared by the readers' runs (test_lessons.py compares their pictures with the site's),
# test_site.py, test_build.py and test_zh_spacing.py, on both xdist workers: the first to ask
# builds it, the other waits on a lock and then finds nothing to do.


def build_both(html: Path) -> None:
    """Build the site as nox -s docs does (both languages at once, -W)."""
    results = build_site(sys.executable, html)
    failed = {lang: output[-5000:] for lang, (code, output) in results.items() if code}
    if failed:
        pytest.fail(
            "the site does not build:\n" + "\n".join(f"--- {k}\n{v}" for k, v in failed.items())
        )


def site_lock():
    """The lock every build into ``build/html`` and the docs sources takes (two workers
    building at once would race on docs/<lang>/lessons/ and build/backreferences/)."""
    from filelock import FileLock

    BUILT.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(BUILT.parent / "site-build.lock")


def _no_sources_from_the_future() -> None:
    """Sphinx reads a page again when a file it depends on is newer than the page's last read,
    by this machine's clock. A checkout copied with its times from a machine whose clock runs
    ahead holds files "modified" in the future, and every build re-reads the pages that use
    them (the API page, the course map, the lessons index) until that moment has passed."""
    now = time.time()
    for folder in ("common", "docs", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.stat().st_mtime > now:
                os.utime(path, (now, now))


@pytest.fixture(scope="session")
def site() -> Path:
    """The built site's root folder (holding index.html, en/ and zh_TW/).

    Built as nox -s docs builds it, into build/html: incrementally, so Sphinx and
    sphinx-gallery decide what to redo (nothing, a few seconds, when the site is up to date).
    """
    if os.environ.get("PT2E_COURSE_SITE"):  # test a site built elsewhere, as it is
        return Path(os.environ["PT2E_COURSE_SITE"]).resolve()
    started = time.perf_counter()
    with site_lock():
        _no_sources_from_the_future()
        build_both(BUILT)
    print(f"built the site into {BUILT} in {time.perf_counter() - started:.0f} s")
    return BUILT
