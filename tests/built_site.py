"""The site the tests read, built as nox -s docs builds it, behind a lock the workers share."""

import os
import sys
import time
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest
from lesson_scripts import ROOT

from languages import build_site

__all__ = ["BUILT", "SITE_PYTHON", "build_both", "no_sources_from_the_future", "site_lock"]

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
