"""The one cache (common.cache): values and files made once and written whole, where it lives
(a checkout's build folder or the user's, never the package), and the figures a site build
measures once, kept under the running lesson's inputs."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from lesson_scripts import ROOT

from common import cache, lesson

COMMON = ROOT / "common"


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(cache, "cache_folder", lambda: tmp_path)
    return tmp_path


@pytest.fixture
def stopped():
    yield
    lesson.stop()


def test_cached_makes_a_value_once_and_returns_it_as_it_reads_it_back(folder):
    made = []
    first = cache.cached("demo", "k", lambda: made.append(1) or {"pair": (1, 2)})
    again = cache.cached("demo", "k", lambda: made.append(1) or {"pair": (3, 4)})
    assert first == again == {"pair": [1, 2]} and made == [1]
    assert [p.name for p in (folder / "demo").iterdir() if not p.name.endswith(".lock")] == [
        "k.json"
    ]


def test_cached_path_keeps_a_file_or_a_folder_written_whole(folder):
    def folder(path: Path) -> None:
        path.mkdir()
        (path / "model.pte").write_bytes(b"pte")

    kept = cache.cached_path("pte", "net-1", folder)
    assert (kept / "model.pte").read_bytes() == b"pte"
    assert cache.cached_path("pte", "net-1", lambda path: 1 / 0) == kept, "kept: not made"
    file = cache.cached_path("aoti", "net-1.pt2", lambda path: path.write_bytes(b"so"))
    assert file.read_bytes() == b"so" and file.suffix == ".pt2"


def test_a_failed_make_leaves_nothing_behind(folder):
    def broken(path: Path) -> None:
        path.write_bytes(b"half")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cache.cached_path("pte", "net-2", broken)
    assert not [p for p in (folder / "pte").iterdir() if not p.name.endswith(".lock")]
    with pytest.raises(RuntimeError, match="make wrote nothing"):
        cache.cached_path("pte", "net-3", lambda path: None)


@pytest.mark.parametrize(("kind", "key"), [("../up", "k"), ("demo", "a/b"), ("demo", ".hidden")])
def test_a_kind_or_key_that_is_not_a_file_name_is_refused(folder, kind, key):
    with pytest.raises(ValueError, match="is not a file name"):
        cache.cached(kind, key, lambda: 1)


def test_the_cache_is_the_checkouts_build_folder_or_the_users_never_the_package(monkeypatch):
    assert cache.CHECKOUT and cache.cache_folder() == ROOT / "build" / "cache"
    monkeypatch.setattr(cache, "CHECKOUT", False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert cache.cache_folder() == Path("/x/cache/pt2e-course")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_folder() == Path.home() / ".cache" / "pt2e-course"


def test_an_installed_copy_is_no_checkout(tmp_path):
    """``common`` copied alone, as pip installs it into site-packages."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "common").mkdir()
    for name in ("charts", "lesson", "turns", "digest", "cache"):
        (site / "common" / f"{name}.py").write_bytes((COMMON / f"{name}.py").read_bytes())
    (site / "common" / "__init__.py").write_text("")
    probe = "from common import cache; print(cache.CHECKOUT, cache.cache_folder())"
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "user")}
    shown = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert shown.stdout.split() == ["False", str(tmp_path / "user" / "pt2e-course")], shown


def test_measured_once_only_while_a_build_runs_and_under_the_lessons_inputs(tmp_path, stopped):
    assert cache.measured_once("k", lambda: 1) == 1
    lesson.start(lang="en", name="m03_3", measured=tmp_path, inputs="closure-a")
    assert cache.measured_once("k", lambda: 2) == 2
    assert cache.measured_once("k", lambda: 3) == 2, "the other language's build reuses it"
    assert (tmp_path / "closure-a" / "k.json").exists(), "kept under the lesson's inputs"
    lesson.start(lang="zh_TW", name="m03_3", measured=tmp_path, inputs="closure-b")
    assert cache.measured_once("k", lambda: 5) == 5, "other inputs: measured afresh"
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    assert cache.measured_once("k", lambda: 6) == 6, "no inputs named: all of common's code"
    assert (tmp_path / cache._code_digest() / "k.json").exists()
    assert cache.measured_once(None, lambda: 4) == 4, "no key: measured"


def test_cached_state_tells_an_entry_another_process_is_making(folder):
    from filelock import FileLock

    assert cache.cached_state("demo", "k") == "missing"
    holding, checked = threading.Event(), threading.Event()

    def another_process_makes_it():  # a thread of its own: filelock refuses one thread two locks
        with FileLock(f"{folder / 'demo' / 'k.json'}.lock"):
            holding.set()
            checked.wait(30)

    other = threading.Thread(target=another_process_makes_it)
    other.start()
    holding.wait()
    try:
        assert cache.cached_state("demo", "k") == "being made"
    finally:
        checked.set()
        other.join()
    assert cache.cached_state("demo", "k") == "missing"
    cache.cached("demo", "k", lambda: 1)
    assert cache.cached_state("demo", "k") == "kept"
