"""Shared fixtures and skips for the pt2e-course tests."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "docs"))
from languages import LANGUAGES  # noqa: E402

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz 'dot' is not installed (apt-get install graphviz)"
)


def lessons(lang: str) -> list[Path]:
    """Lesson scripts of one language, as paths relative to examples/<lang>."""
    base = EXAMPLES / lang
    return sorted(p.relative_to(base) for p in base.glob("*/m[0-9][0-9]_*.py"))


ALL_LESSONS = sorted({(lang, path) for lang in LANGUAGES for path in lessons(lang)})
