"""Build facts listed once: the languages and how the site is built (nox and tests use this)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each is a folder under examples/ and docs/, a folder of the built site and Sphinx's language.
LANGUAGES = ("zh_TW", "en")

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
                ROOT / "docs" / lang,
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
        # Imported here: course_site reads the Sphinx settings, which import this module.
        from course_site import write_site_root

        write_site_root(Path(html))
    return results
