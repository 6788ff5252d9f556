"""Shared fixtures and skips for the pt2e-course tests."""

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "docs"))
from languages import LANGUAGES, build_site  # noqa: E402

BUILT = ROOT / "build" / "html"

# torch.compile's kernels (M03-3) are cached under build/, shared with the docs builds.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor_cache"))

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz 'dot' is not installed (apt-get install graphviz)"
)


def lessons(lang: str) -> list[Path]:
    """Lesson scripts of one language, as paths relative to examples/<lang>."""
    base = EXAMPLES / lang
    return sorted(p.relative_to(base) for p in base.glob("*/m[0-9][0-9]_*.py"))


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


# ------------------------------------------------------------------------- the built site
# Shared by test_site.py and test_zh_spacing.py; their tests run on one xdist worker
# (xdist_group "site"), so the site is built at most once per run.


def newest_source() -> float:
    """Latest modification time of anything the site is built from (generated pages excluded)."""
    newest = 0.0
    for top in ("docs", "examples", "common"):
        for path in (ROOT / top).rglob("*"):
            parts = path.relative_to(ROOT).parts
            if "__pycache__" in parts or (top == "docs" and "lessons" in parts[2:3]):
                continue
            if path.is_file():
                newest = max(newest, path.stat().st_mtime)
    return newest


def build_stamp(html: Path) -> float | None:
    """When the site was last built (languages.build_site writes the root's sitemap last)."""
    stamp = html / "sitemap.xml"
    return stamp.stat().st_mtime if stamp.exists() else None


def build_both(html: Path) -> None:
    """Build the site as nox -s docs does (both languages at once, -W)."""
    results = build_site(sys.executable, html)
    failed = {lang: output[-5000:] for lang, (code, output) in results.items() if code}
    if failed:
        pytest.fail(
            "the site does not build:\n" + "\n".join(f"--- {k}\n{v}" for k, v in failed.items())
        )


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site's root folder (holding index.html, en/ and zh_TW/)."""
    if os.environ.get("PT2E_COURSE_SITE"):  # test a site built elsewhere, as it is
        return Path(os.environ["PT2E_COURSE_SITE"]).resolve()
    stamp = build_stamp(BUILT)
    if stamp is not None and stamp >= newest_source():
        return BUILT
    html = tmp_path_factory.mktemp("site") / "html"
    started = time.perf_counter()
    build_both(html)
    print(f"built the site into {html} in {time.perf_counter() - started:.0f} s")
    return html
