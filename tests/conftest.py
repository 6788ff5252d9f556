"""Shared fixtures and skips for the pt2e-course tests."""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "docs"))
from languages import LANGUAGES  # noqa: E402

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
