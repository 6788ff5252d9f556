"""The site the tests read, built as nox -s docs builds it, behind a lock the workers share."""

import os
import shutil
import subprocess
import sys
import time
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest
from lesson_scripts import ROOT

from site_build import SPHINX_OPTIONS, build_site

__all__ = [
    "BUILT",
    "SITE_PYTHON",
    "build_both",
    "make_site",
    "no_sources_from_the_future",
    "site_lock",
    "sphinx_build",
]

BUILT = ROOT / "build" / "html"
# The Python whose Sphinx builds build/html: nox -s tests names nox -s docs's own when that
# virtualenv is installed. Sphinx records the extensions' folders (inside the virtualenv) with
# a build, and a build from another virtualenv would write every page again, then again at the
# next nox -s docs: alternating the two commands would cost ~30 s each time.
SITE_PYTHON = os.environ.get("PT2E_COURSE_SITE_PYTHON", sys.executable)


def build_both(html: Path) -> None:
    """Build the site as nox -s docs does (both languages at once, -W)."""
    results = build_site(SITE_PYTHON, html)
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


def no_sources_from_the_future() -> None:
    """Sphinx reads a page again when a file it depends on is newer than the page's last read,
    by this machine's clock. A checkout copied with its times from a machine whose clock runs
    ahead holds files "modified" in the future, and every build re-reads the pages that use
    them (the API page, the course map, the lessons index) until that moment has passed."""
    now = time.time()
    for folder in ("common", "docs", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.stat().st_mtime > now:
                os.utime(path, (now, now))


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


# The browser tests' server and Chromium (their fixtures are in conftest.py).
CHROMIUM = os.environ.get("PT2E_COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-quic",
    "--disable-component-update",
    "--disable-sync",
]


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass
