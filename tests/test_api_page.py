"""The API page documents every module of ``common`` a lesson imports, in the order it is given,
and lists under each name the lessons that use it (docs/course_api.py, no site build)."""

import ast

import pytest

from course_api import API_ORDER, api_modules, lessons_using, package_modules
from site_facts import LANGUAGES, ROOT


def modules_lessons_import() -> dict[str, set[str]]:
    """Each ``common`` module the lessons import (``common.x`` and ``from common import x``)
    -> the lessons that import it."""
    found: dict[str, set[str]] = {}
    for script in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(script.read_text("utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module == "common":  # from common import viz
                    names += [f"common.{alias.name}" for alias in node.names]
            for name in names:
                if name == "common" or name.startswith("common."):
                    found.setdefault(name, set()).add(script.relative_to(ROOT).as_posix())
    return found


def test_every_common_module_a_lesson_imports_has_a_section_on_the_api_page():
    imported = modules_lessons_import()
    assert "common.lowering" in imported and "common.data" in imported, "the scan finds imports"
    documented = set(api_modules())
    for module, scripts in sorted(imported.items()):
        assert module in documented, f"{module} has no section; {sorted(scripts)[0]} imports it"


def test_the_page_documents_every_module_of_common_in_the_given_order():
    assert api_modules() == list(API_ORDER)
    assert set(API_ORDER) == package_modules()


@pytest.mark.parametrize(
    ("found", "order", "message"),
    [
        pytest.param(
            {"common", "common.viz", "common.new"},
            ("common", "common.viz"),
            r"no place for common\.new: add it to API_ORDER in docs/course_api\.py",
            id="a new module not in the order",
        ),
        pytest.param(
            {"common", "common.viz"},
            ("common", "common.viz", "common.gone"),
            r"API_ORDER in docs/course_api\.py names common\.gone: no such module",
            id="the order names a module that is gone",
        ),
    ],
)
def test_a_stale_order_fails_naming_the_module_and_the_list_to_edit(found, order, message):
    with pytest.raises(ValueError, match=message):
        api_modules(found, order)


def test_the_order_decides_the_sections_order():
    found = {"common", "common.viz", "common.models"}
    order = ("common", "common.viz", "common.models")
    assert api_modules(found, order) == ["common", "common.viz", "common.models"]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_lessons_using_a_name_are_listed_once_each_in_course_order(lang):
    gallery = ROOT / "docs" / lang / "lessons"
    entry = ["examples folder", "intro", "title"]
    backreferences = {
        "common.viz.draw": [
            ["m01_1_pt2e_flow.py", entry[0], str(gallery / "m01_quantized_graphs"), *entry[1:]],
            ["m00_1_getting_a_graph.py", entry[0], str(gallery / "m00_graphs"), *entry[1:]],
        ]
    }
    assert lessons_using(lang, "common.viz.draw", backreferences) == [
        "sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py",
        "sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py",
    ]
    assert lessons_using(lang, "common.viz.to_svg", backreferences) == []
