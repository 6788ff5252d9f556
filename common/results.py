"""Figures a lesson publishes for the landing page, written only while the site is built."""

import json
from pathlib import Path

__all__ = ["ResultsTarget", "publish", "results_target"]


class ResultsTarget:
    """The file ``publish`` writes the running lesson's figures to; none unless the site is
    being built.

    The site's gallery hook (docs/course_gallery.py) calls ``start`` before each lesson runs on
    the site, with the lesson's file name; elsewhere (a reader, a test) no file is set and
    ``publish`` writes nothing.
    """

    def __init__(self):
        self.path: Path | None = None
        self.figures: dict = {}  # what the running lesson published so far

    def start(self, folder: Path, lesson: str) -> None:
        """Send the figures of the lesson about to run (a file name without ``.py``) to
        ``<folder>/<lesson>.json``, afresh: a name it no longer publishes does not survive."""
        self.path = Path(folder) / f"{lesson}.json"
        self.figures = {}


#: The one target ``publish`` writes to and the site's gallery hook points at each lesson.
results_target = ResultsTarget()


def publish(name: str, value) -> None:
    """Publish a figure a lesson printed, for the landing page of the build that ran it.

    While the site is built, ``value`` goes to the running lesson's file under ``name``
    (``build/results/<lang>/<lesson>.json``); the landing page's ``course-results`` directive
    reads it there. A file whose content would not change is left as it is (Sphinx reads the
    landing page again when the file changes).

    Args:
        name: what the figure is, e.g. ``"int8_speedup_compiled"``.
        value: a number, string, list or dict of them (JSON); floats must be finite.

    Raises:
        TypeError: if ``value`` is not JSON (e.g. a tensor: publish ``float(t)`` instead).
        ValueError: if ``value`` holds NaN or infinity.

    >>> publish("answer", 42)  # the site is not being built: nothing is written
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
    path = results_target.path
    if path is None:
        return
    results_target.figures[name] = json.loads(text)
    new = json.dumps(results_target.figures, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if path.exists() and path.read_text("utf-8") == new:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.new")
    partial.write_text(new, encoding="utf-8")
    partial.replace(path)
