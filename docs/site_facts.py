"""The site's facts, listed once: its languages, its repository and the addresses derived
from it (the site's, Colab's).

The Sphinx settings (course_conf.py), the extensions, the build driver (site_build.py), nox
and the tests import this module; it imports nothing of the docs and needs no Sphinx.
"""

import os
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Each is a folder under examples/ and docs/, a folder of the built site and Sphinx's language.
LANGUAGES = ("zh_TW", "en")

# ---------------------------------------------------------------------------------------------
# THE ONE SETTING TO CHANGE when the course moves: its public repository.
# The notebooks' first cell pip-installs the course from it when they run in Google Colab, the
# "Open in Colab" links read the published notebooks from its gh-pages branch, and the site's
# address (GitHub Pages) is derived from it.
COURSE_REPOSITORY = "https://github.com/pt2e-course/pt2e-course"
# ---------------------------------------------------------------------------------------------

# The branch .github/workflows/pages.yml publishes build/html to (Colab opens notebooks from it).
PAGES_BRANCH = "gh-pages"
_owner, _repo = urlparse(COURSE_REPOSITORY).path.strip("/").split("/")[:2]
# Read the Docs tells its build where the site will live; elsewhere it is GitHub Pages.
SITE_URL = (
    os.environ.get("READTHEDOCS_CANONICAL_URL") or f"https://{_owner.lower()}.github.io/{_repo}/"
)
SITE_URL = SITE_URL.rstrip("/") + "/"
# Colab opens a lesson's notebook where the Pages workflow publishes it (+ <lang>/_downloads/...).
COLAB_NOTEBOOKS = f"https://colab.research.google.com/github/{_owner}/{_repo}/blob/{PAGES_BRANCH}/"


def other_language(lang: str) -> str:
    """The language a page's switch leads to (the course has exactly two)."""
    (other,) = [code for code in LANGUAGES if code != lang]
    return other
