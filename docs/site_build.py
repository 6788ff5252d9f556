"""How the site is built: both languages at once, then the site root above them.

nox's docs session and the tests call build_site. It imports only the site's facts
(site_facts.py), never Sphinx: nox runs it in its own Python.
"""

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from site_facts import DOCS, LANGUAGES, ROOT, SITE_URL

# Warnings are errors; --keep-going reports all of them before failing.
SPHINX_OPTIONS = ["-b", "html", "-W", "--keep-going", "-q"]


def build_site(python: str, html: Path, extra_args=()) -> dict[str, tuple[int, str]]:
    """Build every language into ``html/<lang>``, all at once (one process per core), then,
    when all succeeded, the site root: ``html/index.html``, ``404.html`` and ``sitemap.xml``.

    Returns, per language, sphinx-build's exit code and its combined output.
    """
    running = {
        lang: subprocess.Popen(
            [
                python,
                "-m",
                "sphinx",
                *SPHINX_OPTIONS,
                *extra_args,
                DOCS / lang,
                html / lang,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for lang in LANGUAGES
    }
    results = {}
    for lang, process in running.items():
        output, _ = process.communicate()
        results[lang] = (process.returncode, output)
    if not any(code for code, _ in results.values()):
        write_site_root(Path(html))
    return results


def write_site_root(html: Path) -> None:
    """Write the folder holding one build per language (``html/<lang>``): its language picker,
    its 404 page and the sitemap index pointing at each language's sitemap.

    build_site calls it once, after every language has been built. Written without Sphinx:
    nox runs it in its own Python.
    """
    # A build by-product that is not a page: myst-nb's executed notebooks (build/html/
    # jupyter_execute, the FX article's cells), shared by both languages' builds. (The theme's
    # template macros are removed by each build: docs/course_sitemap.py.)
    shutil.rmtree(html / "jupyter_execute", ignore_errors=True)
    (html / "index.html").write_text((DOCS / "index.html").read_text("utf-8"), "utf-8")
    not_found = (DOCS / "404.html").read_text("utf-8")
    site_path = urlparse(SITE_URL).path
    (html / "404.html").write_text(not_found.replace("/SITE_PATH/", site_path), "utf-8")
    sitemaps = "".join(
        f"  <sitemap><loc>{SITE_URL}{lang}/sitemap.xml</loc></sitemap>\n" for lang in LANGUAGES
    )
    (html / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
        + sitemaps
        + "</sitemapindex>\n",
        "utf-8",
    )
