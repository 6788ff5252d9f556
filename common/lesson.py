"""The running lesson: its language, and where its figures and pictures go while the site is
built.

At the bottom of ``common``'s imports (it imports only ``common.charts`` and
``common.turns``, never torch), so every helper can ask it. A reader's script or notebook never
calls anything here itself; the site's gallery hook (docs/course_gallery.py) calls ``start``
before each lesson.

- ``lesson_language()``: ``"en"`` or ``"zh_TW"``, as ``start`` stated it; without a build,
  read from the lesson (its path, its Chinese docstring, a notebook's Chinese cells).
- ``start(lang=..., name=..., results=..., measured=..., inputs=...)``: the one entry point
  of the build's per-lesson hook; ``stop()`` returns to a reader's (nothing collected,
  nothing published).
- ``publish_figure(name, value)``: what ``common.results.publish`` writes through;
  ``collect_picture(svg, alt, focus)`` and ``take_pictures()``: what ``common.viz.draw``
  feeds and the gallery scraper empties.

The jobs beside it: ``common.cache`` (the cache, ``measured_once``), ``common.digest`` (the
one key function), ``common.turns`` (while the site is built, a timing runs alone).
"""

import ast
import inspect
import json
import linecache
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import turns
from common.charts import CJK_CHARACTERS

__all__ = [
    "Lesson",
    "collect_picture",
    "lesson_language",
    "publish_figure",
    "running",
    "start",
    "stop",
    "take_pictures",
]

_COMMON = Path(__file__).resolve().parent


# ------------------------------------------------------------------------- the running lesson


@dataclass
class Lesson:
    """What the site's build said about the lesson running now; all empty for a reader.

    Attributes:
        lang: ``"en"`` or ``"zh_TW"``, stated by ``start``; None: read from the lesson.
        name: the lesson's file name without ``.py``.
        results: the JSON file ``publish_figure`` writes, or None (nothing published).
        figures: what the lesson published so far.
        pictures: what ``draw`` drew since the scraper last took them, or None (not collected).
        measured: the folder ``measured_once`` keeps figures in, or None (measured afresh).
        inputs: the subfolder of ``measured`` for this lesson's figures: a digest of what its
            run depends on, or None (the stack and all of ``common/``'s code).
        measuring: seconds spent in ``measured_once`` in this process, measuring or reading
            (benchmarks/bench.py shows it per module).
    """

    lang: str | None = None
    name: str | None = None
    results: Path | None = None
    figures: dict = field(default_factory=dict)
    pictures: list | None = None
    measured: Path | None = None
    inputs: str | None = None
    measuring: float = 0.0


#: The one running lesson; ``start`` and ``stop`` set it.
running = Lesson()


def start(
    *,
    lang: str,
    name: str,
    results: Path | None = None,
    measured: Path | None = None,
    inputs: str | None = None,
    pictures: bool = True,
) -> None:
    """Begin a lesson as the site's build runs it (docs/course_gallery.py, before each lesson).

    Args:
        lang: the lesson's language, ``"en"`` or ``"zh_TW"``.
        name: its file name without ``.py``, e.g. ``"m03_3_speed_and_size"``.
        results: the folder its published figures go to, as ``<results>/<name>.json``
            (afresh: a figure it no longer publishes does not survive); None: not published.
        measured: the folder timings are measured once in, shared by both languages'
            builds (``measured_once``); None: measured in each run. It also holds the
            locks that let a timing run alone (``alone``).
        inputs: names the subfolder of ``measured`` this lesson's figures go to: the build
            gives a digest of the stack and the ``common`` modules the lesson imports, the same
            for both twins (docs/course_sources.py, ``measured_key``); None: the stack and
            all of ``common/``'s code.
        pictures: collect what ``draw`` draws for the gallery scraper (``take_pictures``).

    Raises:
        ValueError: for another language than en or zh_TW.

    >>> start(lang="zh_TW", name="m00_1_getting_a_graph")
    >>> lesson_language(), running.results
    ('zh_TW', None)
    >>> stop()
    """
    if lang not in ("en", "zh_TW"):
        raise ValueError(f"unknown language {lang!r} (one of: en, zh_TW)")
    running.lang, running.name = lang, name
    running.results = Path(results) / f"{name}.json" if results is not None else None
    running.figures = {}
    running.pictures = [] if pictures else None
    running.measured = Path(measured) if measured is not None else None
    running.inputs = inputs
    turns.join(running.measured)  # between two lessons, a timing of the other build goes first


def stop() -> None:
    """Return to a reader's lesson: the language read from it, nothing published or collected."""
    measuring = running.measuring
    vars(running).update(vars(Lesson()))
    running.measuring = measuring
    turns.leave()


def publish_figure(name: str, value) -> None:
    """Add ``name``: ``value`` (JSON) to the running lesson's results file, while the site is
    built; nothing otherwise. A file whose content would not change is left as it is (Sphinx
    reads the landing page again when it changes). ``common.results.publish`` checks the value.
    """
    if running.results is None:
        return
    running.figures[name] = value
    new = json.dumps(running.figures, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    path = running.results
    if path.exists() and path.read_text("utf-8") == new:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.new")
    partial.write_text(new, encoding="utf-8")
    partial.replace(path)


def collect_picture(svg: str, alt: str, focus: Callable[[], str | None]) -> bool:
    """Keep a picture ``draw`` made for the lesson's page, while the site is built.

    Args:
        svg: the picture.
        alt: its text alternative.
        focus: makes the card's focus picture (``common.viz.focus_svg``), or None; called only
            when the picture is kept.

    Returns:
        bool: True when kept (the build collects pictures), False for a reader.
    """
    if running.pictures is None:
        return False
    running.pictures.append((svg, alt, focus()))
    return True


def take_pictures() -> list[tuple[str, str, str | None]]:
    """The pictures drawn since the last call, as (svg, text alternative, focus svg or None)."""
    if running.pictures is None:
        return []
    taken = list(running.pictures)
    running.pictures.clear()
    return taken


# ---------------------------------------------------------------------------------- language

_CHINESE = re.compile(f"[{CJK_CHARACTERS}]")


def lesson_language() -> str:
    """The language of the lesson that is running, ``"zh_TW"`` or ``"en"``: the helpers print
    their lines (``CpuInfo.verdict``, ``Timings.table()``) in it.

    While the site is built, the build states it (``start``). Otherwise it is read from the
    lesson itself, so that a downloaded script or notebook needs no setting: the lesson is the
    first caller outside ``common/``; it is zh_TW when its path has a ``zh_TW`` folder
    (``examples/zh_TW/``, as the tests run it) or its docstring is Chinese (a downloaded
    script), or, in Jupyter, when a cell run so far holds Chinese (a zh_TW notebook's first
    cell does). Anything else is en.

    >>> lesson_language()
    'en'
    """
    if running.lang is not None:
        return running.lang
    frame = inspect.currentframe()
    while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(_COMMON):
        frame = frame.f_back
    if frame is not None:
        filename = frame.f_code.co_filename
        if "zh_TW" in Path(filename).parts or _chinese_docstring(filename):
            return "zh_TW"
    cells = getattr(sys.modules.get("__main__"), "In", None)  # IPython's inputs, in Jupyter
    if isinstance(cells, list) and any(_CHINESE.search(cell) for cell in cells):
        return "zh_TW"
    return "en"


def _chinese_docstring(filename: str) -> bool:
    source = "".join(linecache.getlines(filename))
    try:
        docstring = ast.get_docstring(ast.parse(source)) or ""
    except (SyntaxError, ValueError):
        return False
    return bool(_CHINESE.search(docstring))
