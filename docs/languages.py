"""Build facts listed once: the languages and how the site is built (nox and tests use this)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Folder name (under examples/ and docs/, and in the built site) -> Sphinx language code.
LANGUAGES = {"zh_TW": "zh_TW", "en": "en"}

# Warnings are errors; --keep-going reports all of them before failing.
SPHINX_OPTIONS = ["-b", "html", "-W", "--keep-going", "-q"]


def build_site(python: str, html: Path, extra_args=()) -> dict[str, tuple[int, str]]:
    """Build every language into ``html/<lang>``, all at once (one process per core).

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
    return results
