"""One cache for what is expensive, and the figures a site build measures once.

- ``cached(kind, key, make) -> JSON``: ``make()``'s JSON value, kept as
  ``<cache_folder()>/<kind>/<key>.json``; always on, also for a reader.
- ``cached_path(kind, key, make) -> Path``: a file or folder ``make(path)`` writes, kept as
  ``<cache_folder()>/<kind>/<key>``; always on.
- ``measured_once(key, make) -> JSON``: a figure measured once per site build, the other
  language's build reusing it; only while a build runs (``common.lesson.start(measured=...)``),
  ``make()`` otherwise. Kept in a subfolder named by what the lesson's run depends on
  (``start``'s ``inputs``: the stack and the ``common`` modules it imports), so an edit
  elsewhere keeps them.

Both caches lock their entry (``filelock``: the two languages' builds run at once) and write
it whole (a partial file renamed into place). ``cache_folder()`` is the checkout's
``build/cache`` when ``common`` runs from a source checkout, else a per-user folder
(``$XDG_CACHE_HOME/pt2e-course`` or ``~/.cache/pt2e-course``), never beside an installed
package. Name an entry by ``common.digest.digest`` of what made it.
"""

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

from common.digest import digest
from common.lesson import running
from common.turns import let_a_timing_in, waiting

__all__ = [
    "CHECKOUT",
    "ROOT",
    "cache_folder",
    "cached",
    "cached_path",
    "cached_state",
    "measured_once",
]

_COMMON = Path(__file__).resolve().parent
#: The folder holding ``common/``: a source checkout's root, or site-packages when installed.
ROOT = _COMMON.parent
#: True when ``common`` runs from a source checkout (the course's ``pyproject.toml`` beside it).
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "examples").is_dir()


def cache_folder() -> Path:
    """Where ``cached`` and ``cached_path`` keep their entries.

    The checkout's ``build/cache`` when ``common`` runs from a source checkout; otherwise a
    per-user folder, ``$XDG_CACHE_HOME/pt2e-course`` (``~/.cache/pt2e-course`` when unset):
    never beside an installed package.
    """
    if CHECKOUT:
        return ROOT / "build" / "cache"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pt2e-course"


_NAME = re.compile(r"[\w+-][\w.+-]*")


def _entry(kind: str, key: str) -> Path:
    for what, text in (("kind", kind), ("key", key)):
        if not isinstance(text, str) or not _NAME.fullmatch(text):
            raise ValueError(
                f"cache {what} {text!r} is not a file name; use letters, digits and . _ + - "
                "(e.g. a digest(...) of what made the entry)"
            )
    return cache_folder() / kind / key


def _lock(path: Path):
    """The entry's lock (``filelock``; torch needs it: installed with the course), and whether
    it was free: taken if so, not taken if another process holds it."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{path}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return lock, False
    return lock, True


@contextlib.contextmanager
def _locked(path: Path):
    let_a_timing_in()  # a point where the build may pause for the other build's timing
    lock, taken = _lock(path)
    if not taken:  # its holder may be timing: pause meanwhile (``alone``)
        with waiting():
            lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _json_at(path: Path, make: Callable[[], object]):
    with _locked(path):  # another process (the other language's build) may be making it
        if path.exists():
            return json.loads(path.read_text("utf-8"))
        text = json.dumps(make())
        partial = path.with_name(f".{os.getpid()}-{path.name}")
        partial.write_text(text, "utf-8")
        partial.replace(path)
    return json.loads(text)  # as a later read gives it: tuples become lists


def cached(kind: str, key: str, make: Callable[[], object]):
    """``make()``'s JSON value, made once per ``key`` and kept in ``cache_folder()``.

    Always on, for a reader too: give it a ``key`` that names everything the value depends on
    (``digest(...)`` of it). The value is returned as a later call reads it back (JSON: a tuple
    becomes a list).

    Args:
        kind: the subfolder, e.g. ``"op_atlas"``.
        key: the entry's name in it (letters, digits, ``. _ + -``), e.g. ``digest(...)``.
        make: computes the value (numbers, strings, lists, dicts) when it is not kept yet.

    Raises:
        ValueError: if ``kind`` or ``key`` is not a plain file name.

    >>> import tempfile
    >>> from unittest import mock
    >>> with tempfile.TemporaryDirectory() as folder, mock.patch(
    ...     "common.cache.cache_folder", lambda: Path(folder)
    ... ):
    ...     first = cached("demo", "k1", lambda: {"answer": (4, 2)})
    ...     again = cached("demo", "k1", lambda: 1 / 0)  # kept: make is not called
    >>> first == again == {"answer": [4, 2]}
    True
    """
    return _json_at(_entry(kind, f"{key}.json"), make)


def cached_state(kind: str, key: str) -> str:
    """Where ``cached(kind, key, ...)``'s entry stands: ``"kept"``, ``"being made"`` (another
    process holds its lock: ``cached`` would wait for it) or ``"missing"``.

    For a loop over many entries that two processes walk at once (the two languages' builds in
    the op atlas): one that finds an entry being made can make another meanwhile instead of
    waiting (``common.atlas.run_cached``).

    >>> import tempfile
    >>> from unittest import mock
    >>> with tempfile.TemporaryDirectory() as folder, mock.patch(
    ...     "common.cache.cache_folder", lambda: Path(folder)
    ... ):
    ...     before = cached_state("demo", "k1")
    ...     _ = cached("demo", "k1", lambda: 1)
    ...     after = cached_state("demo", "k1")
    >>> before, after
    ('missing', 'kept')
    """
    path = _entry(kind, f"{key}.json")
    if path.exists():
        return "kept"
    lock, taken = _lock(path)
    if not taken:
        return "kept" if path.exists() else "being made"
    lock.release()
    return "kept" if path.exists() else "missing"


def cached_path(kind: str, key: str, make: Callable[[Path], object]) -> Path:
    """The file or folder ``make(path)`` writes, made once per ``key`` in ``cache_folder()``.

    ``make`` gets a path that does not exist yet, in the same folder, and writes a file or a
    folder there; it is renamed to ``<cache_folder()>/<kind>/<key>`` only when ``make``
    returns, so no process ever sees half of it. Always on, for a reader too.

    Args:
        kind: the subfolder, e.g. ``"aoti"``.
        key: the entry's name, ending as the file must (e.g. ``f"encoder-{digest(p)}.pt2"``).
        make: writes the entry at the path it is given.

    Returns:
        Path: the entry.

    Raises:
        ValueError: if ``kind`` or ``key`` is not a plain file name.
        RuntimeError: if ``make`` wrote nothing at its path.
    """
    path = _entry(kind, key)
    with _locked(path):
        if not path.exists():
            partial = path.with_name(f".{os.getpid()}-{path.name}")  # keeps the suffix
            _remove(partial)
            try:
                make(partial)
            except BaseException:
                _remove(partial)
                raise
            if not partial.exists():
                raise RuntimeError(f"cached_path({kind!r}, {key!r}, make): make wrote nothing")
            os.replace(partial, path)
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@cache
def _code_digest() -> str:
    """The stack's versions and the source of every ``common`` module."""
    files = sorted(_COMMON.rglob("*.py"))
    return digest(*[[p.relative_to(_COMMON).as_posix(), p] for p in files])


def measured_once(key: str | None, make: Callable[[], object]):
    """``make()`` (a JSON value), or what a build of the other language measured for ``key``.

    Only while the site is built (``start(measured=...)``): both languages' pages then show
    one measurement. Otherwise, or when ``key`` is None, ``make()`` runs every time: a reader's
    timings are their own. The figures live in the subfolder ``start``'s ``inputs`` names (what
    the lesson's run depends on: the stack and the ``common`` modules it imports), so a new
    torch or a changed helper it uses measures afresh; the build removes the subfolders no
    lesson names any more.

    >>> measured_once("k", lambda: 42)  # no build is running: measured
    42
    """
    if key is None or running.measured is None:
        return make()
    started = time.perf_counter()
    try:
        folder = running.measured / (running.inputs or _code_digest())
        return _json_at(folder / f"{key}.json", make)
    finally:
        running.measuring += time.perf_counter() - started
