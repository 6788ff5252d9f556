"""Figures a lesson publishes for the landing page, written only while the site is built."""

import json
import os
import sys
from pathlib import Path

__all__ = ["RESULTS_FOLDER", "publish"]

#: The environment variable the docs build sets (docs/course_site.py) to the folder that
#: receives the figures; unset when a reader or a test runs a lesson, and then nothing is written.
RESULTS_FOLDER = "PT2E_COURSE_RESULTS"

_started: set[Path] = set()  # the lessons that published something in this process


def publish(name: str, value, *, lesson: str | None = None) -> None:
    """Publish a figure a lesson printed, for the landing page of the build that ran it.

    While the site is built, ``value`` goes to ``<folder>/<lesson>.json`` under ``name``; the
    landing page's ``course-results`` directive reads it there. The first figure a lesson
    publishes in a process starts its file afresh, so a name the lesson no longer publishes does
    not survive its next run. A file whose content would not change is left as it is (Sphinx
    reads the landing page again when the file changes).

    Args:
        name: what the figure is, e.g. ``"int8_speedup_compiled"``.
        value: a number, string, list or dict of them (JSON); floats must be finite.
        lesson: the lesson's file name without ``.py``; by default the file of the calling
            code (sphinx-gallery runs a lesson's cells under the lesson's file name).

    Raises:
        TypeError: if ``value`` is not JSON (e.g. a tensor: publish ``float(t)`` instead).
        ValueError: if ``value`` holds NaN or infinity.

    >>> publish("answer", 42, lesson="m00_0_doctest")  # no folder set: nothing is written
    """
    try:
        text = json.dumps(value, allow_nan=False)
    except TypeError:
        raise TypeError(
            f"publish({name!r}, ...) needs a number, string, list or dict, not "
            f"{type(value).__name__}; convert it first, e.g. float(value)"
        ) from None
    except ValueError:
        raise ValueError(f"publish({name!r}, ...) got NaN or infinity: {value!r}") from None
    folder = os.environ.get(RESULTS_FOLDER)
    if not folder:
        return
    lesson = lesson or Path(sys._getframe(1).f_code.co_filename).stem
    path = Path(folder) / f"{lesson}.json"
    figures = {}
    if path in _started and path.exists():
        figures = json.loads(path.read_text("utf-8"))
    _started.add(path)
    figures[name] = json.loads(text)
    new = json.dumps(figures, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if path.exists() and path.read_text("utf-8") == new:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.new")
    partial.write_text(new, encoding="utf-8")
    partial.replace(path)
