"""The build's CPU turns: while the site is built, a timing runs alone.

Both languages' builds run at once, one per core, and a timing beside the other build's
lesson measures the neighbour. A build's process computes holding a shared lock (``working``),
lets go of it while it waits (``waiting``: a lock, a subprocess) and between lessons; a timing
waits for it alone (``alone``). ``subprocess_environment()`` hands the locks to a lesson's
subprocess. The build joins them through ``common.lesson.start``; for a reader every call here
does nothing.

Torch-free, like ``common.lesson`` (which imports it).
"""

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PATIENCE",
    "TURNS_VARIABLE",
    "alone",
    "join",
    "leave",
    "let_a_timing_in",
    "pause_between_lessons",
    "subprocess_environment",
    "waiting",
    "working",
]


#: The variable that hands the build's lock folder to a lesson's subprocess (``run_under_isa``).
TURNS_VARIABLE = "PT2E_COURSE_TURNS"
#: The lock files in the build's folder (``join``; ``common.lesson.start``'s ``measured``):
#: taken shared while a process computes, alone while it times; the turnstile lets a waiting
#: timing in before the next lesson.
LOCKS = (".turns.lock", ".turns-turnstile.lock")
#: Seconds a timing waits for the other build to pause before it measures anyway.
PATIENCE = 300.0

try:
    import fcntl
except ImportError:  # Windows: timings run beside the other build, as a reader's do
    fcntl = None


@dataclass
class _Turns:
    folder: Path | None = None
    main: object = None
    turn: object = None
    shared: bool = False


_turns = _Turns()


def _folder() -> Path | None:
    if fcntl is None:
        return None
    if _joined is not None:
        return _joined
    inherited = os.environ.get(TURNS_VARIABLE)
    return Path(inherited) if inherited else None


def _files() -> _Turns | None:
    """The open lock files of the build this process belongs to, or None (no build)."""
    folder = _folder()
    if folder is None:
        return None
    if _turns.folder != folder:
        _close()
        folder.mkdir(parents=True, exist_ok=True)
        main, turn = (open(folder / name, "a+b") for name in LOCKS)
        vars(_turns).update(folder=folder, main=main, turn=turn, shared=False)
    return _turns


def leave() -> None:
    """Let go of the build's locks (``common.lesson.stop``: back to a reader's lesson)."""
    global _joined
    _joined = None
    _close()


def _close() -> None:
    for handle in (_turns.main, _turns.turn):
        if handle is not None:
            handle.close()  # closing a file lets go of its lock
    vars(_turns).update(vars(_Turns()))


def _take_shared(files: _Turns) -> None:
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
    files = _files()
    if files is not None and not files.shared:
        _take_shared(files)


@contextlib.contextmanager
def waiting():
    """Pause as a computing process while the block waits (for a lock another process holds,
    for a subprocess), so that a timing of the other build can run; resume after it."""
    files = _files()
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
    lesson. After ``PATIENCE`` seconds it measures anyway (its spread shows it). Only
    while the site is built; a reader's timing runs at once.
    """
    files = _files()
    if files is None:
        yield
        return
    was_shared = files.shared
    if was_shared:
        fcntl.flock(files.main, fcntl.LOCK_UN)
        files.shared = False
    fcntl.flock(files.turn, fcntl.LOCK_EX)
    try:
        deadline = time.monotonic() + PATIENCE
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


def subprocess_environment() -> dict:
    """The environment a subprocess of the running lesson needs to join the build's
    turns (``working`` in it): ``{TURNS_VARIABLE: folder}``, or ``{}`` for a reader."""
    folder = _folder()
    return {TURNS_VARIABLE: str(folder)} if folder is not None else {}


_joined: Path | None = None


def join(folder: Path | None) -> None:
    """Take part in the build's turns, with the lock files in ``folder`` (None: a reader's
    lesson, no turns); between two lessons a waiting timing of the other build goes first."""
    global _joined
    if _joined != folder:
        leave()
    _joined = Path(folder) if folder is not None else None
    pause_between_lessons()
    working()


def let_a_timing_in() -> None:
    """Pause here while a timing of the other build runs, if one is waiting for its turn.

    A computing process pauses by itself only between lessons and while it waits; a cold
    lesson can compute for minutes, and a timing waiting for it keeps its own build idle
    meanwhile (one core of two). The build calls this after every cell (docs/course_gallery.py)
    and before every cache entry it makes or reads (``common.cache``): a timing waits for the
    next one, seconds, not for the end of the other build's lesson. Nothing for a reader.
    """
    files = _files()
    if files is None or not files.shared:
        return
    try:
        fcntl.flock(files.turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # a timing holds the turnstile: it is waiting, or timing
        fcntl.flock(files.main, fcntl.LOCK_UN)
        files.shared = False
        _take_shared(files)  # after it
        return
    fcntl.flock(files.turn, fcntl.LOCK_UN)


def pause_between_lessons() -> None:
    """Let go of the shared lock, so a timing of the other build waiting for it runs now."""
    files = _files()
    if files is not None and files.shared:
        fcntl.flock(files.main, fcntl.LOCK_UN)
        files.shared = False
