"""The running lesson (common.lesson): its language as the build states it, the one cache and
its key, and common's imports: lesson at the bottom, no circle anywhere."""

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lesson_scripts import ROOT

from common import lesson

COMMON = ROOT / "common"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(lesson, "cache_folder", lambda: tmp_path)
    return tmp_path


@pytest.fixture
def stopped():
    yield
    lesson.stop()


# ------------------------------------------------------------------------ the running lesson


def test_the_build_states_the_language_and_stop_returns_to_the_lessons_own(stopped):
    assert lesson.lesson_language() == "en", "read from this file: not zh_TW"
    lesson.start(lang="zh_TW", name="m00_1_getting_a_graph")
    assert lesson.lesson_language() == "zh_TW", "as the build states it"
    lesson.stop()
    assert lesson.lesson_language() == "en"
    assert lesson.running.results is None and lesson.running.pictures is None


def test_start_refuses_a_language_the_course_has_not(stopped):
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        lesson.start(lang="fr", name="m00_1")


def test_start_sends_each_lesson_its_own_results_file_afresh(tmp_path, stopped):
    lesson.start(lang="en", name="m04_1", results=tmp_path)
    lesson.publish_figure("old", 1)
    lesson.start(lang="en", name="m04_1", results=tmp_path)
    lesson.publish_figure("new", 2)
    assert json.loads((tmp_path / "m04_1.json").read_text("utf-8")) == {"new": 2}


def test_pictures_are_collected_only_while_the_build_runs(stopped):
    assert not lesson.collect_picture("<svg/>", "alt", lambda: 1 / 0), "a reader: not collected"
    lesson.start(lang="en", name="m00_1")
    assert lesson.collect_picture("<svg/>", "alt", lambda: "<svg focus/>")
    assert lesson.take_pictures() == [("<svg/>", "alt", "<svg focus/>")]
    assert lesson.take_pictures() == []


# --------------------------------------------------------------------------------- the cache


def test_cached_makes_a_value_once_and_returns_it_as_it_reads_it_back(cache):
    made = []
    first = lesson.cached("demo", "k", lambda: made.append(1) or {"pair": (1, 2)})
    again = lesson.cached("demo", "k", lambda: made.append(1) or {"pair": (3, 4)})
    assert first == again == {"pair": [1, 2]} and made == [1]
    assert [p.name for p in (cache / "demo").iterdir() if not p.name.endswith(".lock")] == [
        "k.json"
    ]


def test_cached_path_keeps_a_file_or_a_folder_written_whole(cache):
    def folder(path: Path) -> None:
        path.mkdir()
        (path / "model.pte").write_bytes(b"pte")

    kept = lesson.cached_path("pte", "net-1", folder)
    assert (kept / "model.pte").read_bytes() == b"pte"
    assert lesson.cached_path("pte", "net-1", lambda path: 1 / 0) == kept, "kept: not made"
    file = lesson.cached_path("aoti", "net-1.pt2", lambda path: path.write_bytes(b"so"))
    assert file.read_bytes() == b"so" and file.suffix == ".pt2"


def test_a_failed_make_leaves_nothing_behind(cache):
    def broken(path: Path) -> None:
        path.write_bytes(b"half")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        lesson.cached_path("pte", "net-2", broken)
    assert not [p for p in (cache / "pte").iterdir() if not p.name.endswith(".lock")]
    with pytest.raises(RuntimeError, match="make wrote nothing"):
        lesson.cached_path("pte", "net-3", lambda path: None)


@pytest.mark.parametrize(("kind", "key"), [("../up", "k"), ("demo", "a/b"), ("demo", ".hidden")])
def test_a_kind_or_key_that_is_not_a_file_name_is_refused(cache, kind, key):
    with pytest.raises(ValueError, match="is not a file name"):
        lesson.cached(kind, key, lambda: 1)


def test_the_cache_is_the_checkouts_build_folder_or_the_users_never_the_package(monkeypatch):
    assert lesson.CHECKOUT and lesson.cache_folder() == ROOT / "build" / "cache"
    monkeypatch.setattr(lesson, "CHECKOUT", False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert lesson.cache_folder() == Path("/x/cache/pt2e-course")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert lesson.cache_folder() == Path.home() / ".cache" / "pt2e-course"


def test_an_installed_copy_is_no_checkout(tmp_path):
    """``common`` copied alone, as pip installs it into site-packages."""
    site = tmp_path / "site-packages"
    site.mkdir()
    for path in (COMMON / "charts.py", COMMON / "lesson.py"):
        (site / "common").mkdir(exist_ok=True)
        (site / "common" / path.name).write_bytes(path.read_bytes())
    (site / "common" / "__init__.py").write_text("")
    probe = "from common import lesson; print(lesson.CHECKOUT, lesson.cache_folder())"
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "user")}
    shown = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert shown.stdout.split() == ["False", str(tmp_path / "user" / "pt2e-course")], shown


def test_measured_once_only_while_a_build_runs_and_only_for_this_stack(tmp_path, stopped):
    assert lesson.measured_once("k", lambda: 1) == 1
    stale = tmp_path / "an-older-stack"
    stale.mkdir(parents=True)
    (stale / "timings-k.json").write_text("0")
    (tmp_path / "timings2-flat.json").write_text("0")  # the layout before subfolders
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    assert lesson.measured_once("k", lambda: 2) == 2
    assert lesson.measured_once("k", lambda: 3) == 2, "the other language's build reuses it"
    kept = [p.name for p in tmp_path.iterdir() if p.name not in lesson._QUIET_LOCKS]
    assert kept == [lesson._code_digest()], "older ones gone"
    assert lesson.measured_once(None, lambda: 4) == 4, "no key: measured"


def other_build(folder: Path, steps: str) -> subprocess.Popen:
    """A process of the other language's build: it starts a lesson and runs ``steps``,
    printing "working" once its lesson has started."""
    program = (
        "import sys, time\nfrom common import lesson\n"
        f"lesson.start(lang='zh_TW', name='a', measured={str(folder)!r})\n"
        "print('working', flush=True)\n" + steps
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "working"
    return child


def test_a_timing_of_the_build_waits_for_the_other_builds_lesson_and_holds_the_next(
    tmp_path, stopped
):
    with lesson.alone():  # a reader's timing runs at once
        pass
    child = other_build(
        tmp_path,
        "time.sleep(1.5)\n"
        f"lesson.start(lang='zh_TW', name='b', measured={str(tmp_path)!r})\n"
        "print(time.time(), flush=True)\n",
    )
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    started = time.monotonic()
    with lesson.alone():
        waited = time.monotonic() - started
        time.sleep(0.5)
        ended = time.time()
    resumed = float(child.stdout.readline())
    assert child.wait(timeout=30) == 0
    assert waited > 1.0, "the other build's lesson ran to its end first"
    assert resumed >= ended, "its next lesson started after the timing"


def test_a_build_waiting_for_a_figure_a_timing_makes_lets_it_run(tmp_path, stopped):
    """The other build asks measured_once for the figure being timed: it waits for the entry's
    lock, and pauses meanwhile, or the timing would wait for it until QUIET_PATIENCE."""
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    child = None

    def timed():
        nonlocal child
        child = other_build(
            tmp_path, "print(lesson.measured_once('k', lambda: 0), time.time(), flush=True)\n"
        )
        time.sleep(0.5)  # the other build is now waiting for 'k'
        started = time.monotonic()
        with lesson.alone():
            waited = time.monotonic() - started
        return waited

    waited = lesson.measured_once("k", timed)
    figure, _ = child.stdout.readline().split()
    assert child.wait(timeout=30) == 0
    assert waited < 5, f"the timing waited {waited:.0f} s for a build that waited for it"
    assert float(figure) == waited, "the other build read the figure measured"


# -------------------------------------------------------------------------------- the key


def test_digest_covers_the_stack_and_reads_files_tensors_and_containers(tmp_path, monkeypatch):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"w")
    key = lesson.digest(path, torch.ones(2), {"b": 1, "a": [1, 2]})
    assert key == lesson.digest(path, torch.ones(2), {"a": [1, 2], "b": 1})
    assert key != lesson.digest(path, torch.ones(2, dtype=torch.int8), {"a": [1, 2], "b": 1})
    assert lesson.digest("ab", "c") != lesson.digest("a", "bc"), "parts do not run together"
    monkeypatch.setattr(lesson, "stack_versions", lambda: (("torch", "9.9"),))
    assert key != lesson.digest(path, torch.ones(2), {"b": 1, "a": [1, 2]}), "another torch"


def test_a_modules_digest_is_the_same_in_a_new_process():
    """The other language's build is another process: the key must not hold an address."""
    probe = (
        "import torch\nfrom common.lesson import digest\nfrom common.models import get_model\n"
        "from common.pt2e import export_module\nfrom common.models import example_inputs\n"
        "m = get_model('conv_relu')\n"
        "print(digest(m), digest(export_module(m, example_inputs(1))))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    keys = [
        subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert keys[0] == keys[1] and len(keys[0]) == 2


# ------------------------------------------------------------------------- common's imports


def common_imports() -> dict[str, set[str]]:
    """Each common module to the common modules it imports, at module level or in a function."""
    graph = {}
    for path in sorted(COMMON.glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                if node.module == "common":  # from common import cpu
                    names = [f"common.{alias.name}" for alias in node.names]
            else:
                continue
            imported |= {n.split(".")[1] for n in names if n.startswith("common.")}
        graph[path.stem] = imported & {p.stem for p in COMMON.glob("*.py")}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (as a path that ends where it starts), or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                return [*path[path.index(other) :], other] if other in path else [module, other]
            if other not in state and (found := visit(other, [*path, other])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert cycle_in({"cpu": {"timing"}, "timing": {"kernels"}, "kernels": {"cpu"}}) == [
        "cpu",
        "timing",
        "kernels",
        "cpu",
    ]
    assert cycle_in({"timing": {"cpu", "lesson"}, "cpu": {"lesson"}, "lesson": set()}) is None


def test_common_has_no_import_circle():
    circle = cycle_in(common_imports())
    assert circle is None, f"common imports in a circle: {' → '.join(circle)}"


def test_lesson_is_at_the_bottom_of_commons_imports_and_imports_no_torch():
    assert common_imports()["lesson"] <= {"charts"}
    assert common_imports()["charts"] == set()
    probe = "import sys, common.lesson; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert shown.stdout.strip() == "False", shown.stderr[-2000:]
