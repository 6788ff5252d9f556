"""The running lesson: its language, one cache for what is expensive, where its figures and
pictures go while the site is built.

At the bottom of ``common``'s imports (it imports only ``common.charts``, never torch), so
every helper can ask it. A reader's script or notebook never calls anything here itself; the
site's gallery hook (docs/course_gallery.py) calls ``start`` before each lesson.

The running lesson:

- ``lesson_language()``: ``"en"`` or ``"zh_TW"``, as ``start`` stated it; without a build,
  read from the lesson (its path, its Chinese docstring, a notebook's Chinese cells).
- ``start(lang=..., name=..., results=..., measured=...)``: the one entry point of the build's
  per-lesson hook; ``stop()`` returns to a reader's (nothing collected, nothing published).
- ``publish_figure(name, value)``: what ``common.results.publish`` writes through;
  ``collect_picture(svg, alt, focus)`` and ``take_pictures()``: what ``common.viz.draw``
  feeds and the gallery scraper empties.

One cache, for every helper that keeps an expensive result (and for the op atlas):

- ``cached(kind, key, make) -> JSON``: ``make()``'s JSON value, kept as
  ``<cache_folder()>/<kind>/<key>.json``; always on, also for a reader.
- ``cached_path(kind, key, make) -> Path``: a file or folder ``make(path)`` writes, kept as
  ``<cache_folder()>/<kind>/<key>``; always on.
- ``measured_once(key, make) -> JSON``: a figure measured once per site build, the other
  language's build reusing it; only while a build runs (``start(measured=...)``), ``make()``
  otherwise. Kept in a subfolder named by the stack and ``common/``'s code: a change to either
  removes the older figures.
- ``digest(*parts) -> str``: the one key function: bytes, strings, files (``Path``), JSON,
  tensors, modules (code, plain attributes, every parameter and buffer, the functions their
  classes call), always with the installed torch, torchao and ExecuTorch versions.

While the site is built, a timing runs alone (``alone``): both languages' builds run at once,
one per core, and a timing beside the other build's lesson measures the neighbour. A build's
process computes holding a shared lock (``working``), lets go of it while it waits
(``waiting``: a lock, a subprocess) and between lessons; a timing waits for it alone.
``quiet_environment()`` hands the locks to a lesson's subprocess.

Both caches lock their entry (``filelock``: the two languages' builds run at once) and write
it whole (a partial file renamed into place). ``cache_folder()`` is the checkout's
``build/cache`` when ``common`` runs from a source checkout, else a per-user folder
(``$XDG_CACHE_HOME/pt2e-course`` or ``~/.cache/pt2e-course``), never beside an installed
package.
"""

import ast
import contextlib
import hashlib
import inspect
import json
import linecache
import os
import re
import shutil
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path

from common.charts import CJK_CHARACTERS

__all__ = [
    "CHECKOUT",
    "ROOT",
    "Lesson",
    "alone",
    "cache_folder",
    "cached",
    "cached_path",
    "collect_picture",
    "digest",
    "lesson_language",
    "measured_once",
    "publish_figure",
    "quiet_environment",
    "running",
    "start",
    "stop",
    "take_pictures",
    "waiting",
    "working",
]

_COMMON = Path(__file__).resolve().parent
#: The folder holding ``common/``: a source checkout's root, or site-packages when installed.
ROOT = _COMMON.parent
#: True when ``common`` runs from a source checkout (the course's ``pyproject.toml`` beside it).
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "examples").is_dir()
#: The packages whose versions every ``digest`` covers.
STACK = ("torch", "torchao", "executorch")


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
        measuring: seconds spent in ``measured_once`` in this process, measuring or reading
            (benchmarks/bench.py shows it per module).
    """

    lang: str | None = None
    name: str | None = None
    results: Path | None = None
    figures: dict = field(default_factory=dict)
    pictures: list | None = None
    measured: Path | None = None
    measuring: float = 0.0


#: The one running lesson; ``start`` and ``stop`` set it.
running = Lesson()


def start(
    *,
    lang: str,
    name: str,
    results: Path | None = None,
    measured: Path | None = None,
    pictures: bool = True,
) -> None:
    """Begin a lesson as the site's build runs it (docs/course_gallery.py, before each lesson).

    Args:
        lang: the lesson's language, ``"en"`` or ``"zh_TW"``.
        name: its file name without ``.py``, e.g. ``"m03_3_speed_and_size"``.
        results: the folder its published figures go to, as ``<results>/<name>.json``
            (afresh: a figure it no longer publishes does not survive); None: not published.
        measured: the folder timings are measured once in, shared by both languages'
            builds (``measured_once``); None: measured in each run.
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
    files = _quiet_files()  # between two lessons, a timing of the other build goes first
    if files is not None and files.shared:
        fcntl.flock(files.main, fcntl.LOCK_UN)
        files.shared = False
    working()


def stop() -> None:
    """Return to a reader's lesson: the language read from it, nothing published or collected."""
    measuring = running.measuring
    vars(running).update(vars(Lesson()))
    running.measuring = measuring
    _quiet_close()


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


# ------------------------------------------------------------ quiet: a timing runs alone

#: The variable that hands the build's quiet locks to a lesson's subprocess (``run_under_isa``).
QUIET_VARIABLE = "PT2E_COURSE_QUIET"
#: The lock files in ``start``'s ``measured`` folder: taken shared while a process computes,
#: alone while it times; the turnstile lets a waiting timing in before the next lesson.
_QUIET_LOCKS = (".quiet.lock", ".quiet-turn.lock")
#: Seconds a timing waits for the other build to pause before it measures anyway.
QUIET_PATIENCE = 300.0

try:
    import fcntl
except ImportError:  # Windows: timings run beside the other build, as a reader's do
    fcntl = None


@dataclass
class _Quiet:
    folder: Path | None = None
    main: object = None
    turn: object = None
    shared: bool = False


_quiet = _Quiet()


def _quiet_folder() -> Path | None:
    if fcntl is None:
        return None
    if running.measured is not None:
        return running.measured
    inherited = os.environ.get(QUIET_VARIABLE)
    return Path(inherited) if inherited else None


def _quiet_files() -> _Quiet | None:
    """The open lock files of the build this process belongs to, or None (no build)."""
    folder = _quiet_folder()
    if folder is None:
        return None
    if _quiet.folder != folder:
        _quiet_close()
        folder.mkdir(parents=True, exist_ok=True)
        main, turn = (open(folder / name, "a+b") for name in _QUIET_LOCKS)
        vars(_quiet).update(folder=folder, main=main, turn=turn, shared=False)
    return _quiet


def _quiet_close() -> None:
    for handle in (_quiet.main, _quiet.turn):
        if handle is not None:
            handle.close()  # closing a file lets go of its lock
    vars(_quiet).update(vars(_Quiet()))


def _take_shared(files: _Quiet) -> None:
    fcntl.flock(files.turn, fcntl.LOCK_EX)  # after any timing that is waiting or running
    try:
        fcntl.flock(files.main, fcntl.LOCK_SH)
        files.shared = True
    finally:
        fcntl.flock(files.turn, fcntl.LOCK_UN)


def working() -> None:
    """Mark this process as computing for the site's build (``start`` does; so does the
    subprocess of ``run_under_isa``): a timing of the other language's build waits until it
    pauses. Nothing for a reader."""
    files = _quiet_files()
    if files is not None and not files.shared:
        _take_shared(files)


@contextlib.contextmanager
def waiting():
    """Pause as a computing process while the block waits (for a lock another process holds,
    for a subprocess), so that a timing of the other build can run; resume after it."""
    files = _quiet_files()
    if files is None or not files.shared:
        yield
        return
    fcntl.flock(files.main, fcntl.LOCK_UN)
    files.shared = False
    try:
        yield
    finally:
        _take_shared(files)


@contextlib.contextmanager
def alone():
    """Run the block (a timing's rounds) while no other process of the site's build computes.

    Both languages' builds run at once, one per core: a timing beside the other build's
    lesson measures the neighbour (spreads of 20–40 % on two cores). Each build process holds
    a shared lock while it computes (``working``) and lets go while it waits (``waiting``) and
    between lessons; a timing takes a turnstile (no lesson starts while it waits), then the
    lock alone, so it runs once every other process of the build paused or finished its
    lesson. After ``QUIET_PATIENCE`` seconds it measures anyway (its spread shows it). Only
    while the site is built; a reader's timing runs at once.
    """
    files = _quiet_files()
    if files is None:
        yield
        return
    was_shared = files.shared
    if was_shared:
        fcntl.flock(files.main, fcntl.LOCK_UN)
        files.shared = False
    fcntl.flock(files.turn, fcntl.LOCK_EX)
    try:
        deadline = time.monotonic() + QUIET_PATIENCE
        while True:
            try:
                fcntl.flock(files.main, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(files.main, fcntl.LOCK_UN)
            if was_shared:
                fcntl.flock(files.main, fcntl.LOCK_SH)
                files.shared = True
    finally:
        fcntl.flock(files.turn, fcntl.LOCK_UN)


def quiet_environment() -> dict:
    """The environment a subprocess of the running lesson needs to join the build's quiet
    locks (``working`` in it): ``{QUIET_VARIABLE: folder}``, or ``{}`` for a reader."""
    folder = _quiet_folder()
    return {QUIET_VARIABLE: str(folder)} if folder is not None else {}


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
    while frame is not None and Path(frame.f_code.co_filename).resolve().parent == _COMMON:
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


# ------------------------------------------------------------------------------------- keys


@cache
def stack_versions() -> tuple[tuple[str, str], ...]:
    """The installed versions of ``STACK`` (``"none"`` for one not installed).

    >>> dict(stack_versions())["torch"].startswith("2.")
    True
    """
    found = []
    for name in STACK:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, "none"))
    return tuple(found)


def digest(*parts) -> str:
    """A short hex digest of ``parts`` and of the installed torch, torchao and ExecuTorch.

    Each part may be bytes, a string, a ``Path`` (the file's contents), a tensor (its dtype,
    shape and values, whatever its layout), an ``nn.Module`` (see below), a list, tuple or dict
    of these, or any other JSON value. A module stands for what it computes: a GraphModule's
    code and the tensors it reads; another module's class source (up to torch's own classes)
    and ``repr``; for every submodule its plain attributes (numbers, strings, tuples of them:
    what steers ``forward``), every parameter and buffer (persistent or not) and the state
    dict; and the source of the module-level functions and classes (and the plain constants)
    the modules' classes name.

    >>> digest("a", 1) == digest("a", 1) != digest("a", 2)
    True
    >>> len(digest(b"bytes"))
    20
    """
    hasher = hashlib.sha256()
    _feed(hasher, [list(pair) for pair in stack_versions()])
    for part in parts:
        _feed(hasher, part)
    return hasher.hexdigest()[:20]


def _feed(hasher, part) -> None:
    torch = sys.modules.get("torch")  # a tensor or module exists only once torch is imported
    if isinstance(part, bytes | bytearray):
        hasher.update(b"b%d:" % len(part) + bytes(part))
    elif isinstance(part, str):
        _feed(hasher, part.encode())
    elif isinstance(part, Path):
        _feed(hasher, part.read_bytes())
    elif torch is not None and isinstance(part, torch.Tensor):
        _feed(hasher, f"tensor {part.dtype} {tuple(part.shape)}")
        _feed(hasher, _tensor_bytes(part))
    elif torch is not None and isinstance(part, torch.nn.Module):
        _feed_module(hasher, part)
    elif isinstance(part, list | tuple):
        hasher.update(b"[%d" % len(part))
        for item in part:
            _feed(hasher, item)
    elif isinstance(part, set | frozenset):  # in an order that is the same in every process
        _feed(hasher, ["set", *sorted(part, key=repr)])
    elif isinstance(part, dict):
        hasher.update(b"{%d" % len(part))
        for key in sorted(part, key=repr):
            _feed(hasher, repr(key))
            _feed(hasher, part[key])
    else:
        _feed(hasher, json.dumps(part, sort_keys=True, default=repr))


def _tensor_bytes(tensor) -> bytes:
    """A tensor's values as bytes, whatever its layout (oneDNN's prepacked weights, qint8)."""
    tensor = tensor.detach()
    if tensor.is_mkldnn:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    return tensor.cpu().contiguous().view(-1).view(sys.modules["torch"].uint8).numpy().tobytes()


@cache
def _module_internals() -> frozenset:
    """The attribute names every ``nn.Module`` (and GraphModule) sets for itself."""
    torch = sys.modules["torch"]
    return frozenset(vars(torch.nn.Module())) | {"training", "meta", "_graph", "_code"}


def _plain(value) -> bool:
    """A value whose ``repr`` says all it is and is the same in every process."""
    torch = sys.modules["torch"]
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        return True
    if isinstance(value, torch.dtype | torch.device | torch.Size | torch.memory_format):
        return True
    if isinstance(value, tuple | list | frozenset | set):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _feed_module(hasher, model) -> None:
    torch = sys.modules["torch"]
    tensors = {
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),  # non-persistent ones too
    }
    known = {id(tensor) for tensor in tensors.values()}
    # The state dict's other entries (packed weights' extra state), each tensor hashed once.
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in known:
            tensors[f"state:{name}"] = value
    if isinstance(model, torch.fx.GraphModule):
        for node in model.graph.nodes:
            if node.op == "get_attr":  # convert's int8 constants are attributes, not buffers
                value = model
                for part in node.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.Tensor) and id(value) not in known:
                    tensors[f"attr:{node.target}"] = value
    else:
        _feed(hasher, repr(model))
    internals = _module_internals()
    seen_functions: set = set()
    for name, module in model.named_modules(remove_duplicate=False):
        _feed(hasher, [name, type(module).__module__, type(module).__qualname__])
        if isinstance(module, torch.fx.GraphModule):
            _feed(hasher, module.code)
        for cls in type(module).__mro__:
            if cls.__module__.startswith(("torch.", "builtins")):
                break
            _feed_source(hasher, cls, seen_functions)
        attributes = {
            key: value
            for key, value in vars(module).items()
            if key not in internals and _plain(value)
        }
        _feed(hasher, attributes)
        for key, value in vars(module).items():  # a function kept as an attribute
            if key not in internals and isinstance(value, types.FunctionType):
                _feed_source(hasher, value, seen_functions)
    _feed(hasher, tensors)


def _feed_source(hasher, thing, seen: set) -> None:
    """The source of a class or function defined outside torch, and of the module-level
    functions and classes (and the plain constants) it names, recursively."""
    if id(thing) in seen:
        return
    seen.add(id(thing))
    module = getattr(thing, "__module__", "") or ""
    if module.startswith(("torch", "builtins")):
        return
    try:
        _feed(hasher, inspect.getsource(thing))
    except (OSError, TypeError):
        _feed(hasher, f"{module}.{getattr(thing, '__qualname__', '?')}")
    functions = (
        [thing]
        if isinstance(thing, types.FunctionType)
        else [v for v in vars(thing).values() if isinstance(v, types.FunctionType)]
    )
    for function in functions:
        scope = function.__globals__
        for name in sorted(_names(function.__code__)):
            value = scope.get(name)
            if isinstance(value, types.FunctionType | type):
                _feed_source(hasher, value, seen)
            elif value is not None and not isinstance(value, types.ModuleType):
                if _plain(value):
                    _feed(hasher, [name, value])


def _names(code: types.CodeType) -> set:
    """The global names a function's code (and the code nested in it) reads."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


# ------------------------------------------------------------------------------------ cache


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


@contextlib.contextmanager
def _locked(path: Path):
    from filelock import FileLock, Timeout  # torch needs it: installed with the course

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{path}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:  # its holder may be timing: pause meanwhile (``alone``)
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
    ...     "common.lesson.cache_folder", lambda: Path(folder)
    ... ):
    ...     first = cached("demo", "k1", lambda: {"answer": (4, 2)})
    ...     again = cached("demo", "k1", lambda: 1 / 0)  # kept: make is not called
    >>> first == again == {"answer": [4, 2]}
    True
    """
    return _json_at(_entry(kind, f"{key}.json"), make)


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
    return digest(*[[p.name, p] for p in sorted(_COMMON.glob("*.py"))])


_tidied: set = set()


def _measured_folder(folder: Path) -> Path:
    """``folder``'s subfolder for this stack and this ``common/``; the others are removed
    (figures measured with other code) the first time this process uses ``folder``."""
    current = folder / _code_digest()
    if folder not in _tidied:
        _tidied.add(folder)
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.name not in (current.name, *_QUIET_LOCKS):
                    _remove(entry)
    return current


def measured_once(key: str | None, make: Callable[[], object]):
    """``make()`` (a JSON value), or what a build of the other language measured for ``key``.

    Only while the site is built (``start(measured=...)``): both languages' pages then show
    one measurement. Otherwise, or when ``key`` is None, ``make()`` runs every time: a reader's
    timings are their own. The figures live in a subfolder named by ``digest`` of the stack and
    of ``common/``'s code, so a new torch or a changed helper measures afresh.

    >>> measured_once("k", lambda: 42)  # no build is running: measured
    42
    """
    if key is None or running.measured is None:
        return make()
    started = time.perf_counter()
    try:
        return _json_at(_measured_folder(running.measured) / f"{key}.json", make)
    finally:
        running.measuring += time.perf_counter() - started
