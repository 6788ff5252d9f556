"""The running lesson (common.lesson): its language as the build states it, its figures and
pictures; and common's imports: lesson at the bottom, no circle anywhere."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lesson_scripts import ROOT

from common import lesson

COMMON = ROOT / "common"


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


# ------------------------------------------------------------------------- common's imports


def _dotted(path: Path) -> str:
    """``common/coverage/__init__.py`` -> ``coverage``; ``common/backends/x86/rules.py`` ->
    ``backends.x86.rules``."""
    parts = path.relative_to(COMMON).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def common_imports() -> dict[str, set[str]]:
    """Each module of common (dotted under ``common``) to the common modules it imports, at
    module level or in a function (a package's ``__init__`` stands for the package)."""
    modules = {_dotted(path): path for path in sorted(COMMON.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .rules import X
                    parent = f"common.{package}".split(".")
                    parent = parent[: len(parent) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for dotted in names:
                if dotted.startswith("common."):
                    inner = dotted.removeprefix("common.")
                    while inner and inner not in modules:
                        inner = inner.rpartition(".")[0]  # a name imported from a module
                    if inner and inner != name:
                        imported.add(inner)
        graph[name] = imported
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


def test_the_import_graph_reads_packages_and_relative_imports():
    graph = common_imports()
    assert "timing" in graph["aoti"], "from common.timing import ..."
    packages = ("backends", "coverage", "atlas")
    assert all("." not in name or name.startswith(packages) for name in graph), sorted(graph)


def test_lesson_is_at_the_bottom_of_commons_imports_and_imports_no_torch():
    graph = common_imports()
    assert graph["lesson"] <= {"charts", "turns"}
    assert graph["charts"] == set() and graph["turns"] == set() and graph["digest"] == set()
    assert graph["cache"] <= {"digest", "lesson", "turns"}
    probe = (
        "import sys, common.lesson, common.cache, common.digest, common.turns; "
        "print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert shown.stdout.strip() == "False", shown.stderr[-2000:]
