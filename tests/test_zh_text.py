"""The zh_TW lessons say in Chinese what their asserts claim (code-only messages excepted)."""

import ast
import functools
import re
from pathlib import Path

import pytest
from lesson_scripts import ROOT

ZH_LESSONS = sorted((ROOT / "examples" / "zh_TW").rglob("*.py"))
HAN = re.compile(r"[\u3400-\u9fff]")
# Two plain English words in a row ("kernel size", "is float") are prose; identifiers,
# dotted names, operators and numbers ("handmade.prepare == prepare_pt2e") are code.
PROSE = re.compile(r"(?<![\w.])[A-Za-z]{2,}\s+[A-Za-z]{2,}(?![\w.(])")


def assert_messages(source: str) -> list[tuple[int, str]]:
    """(line, message text) of every assert with a message, in code and in folded solutions."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        statement = line.strip().lstrip("#").strip()
        if not statement.startswith("assert "):
            continue
        try:
            tree = ast.parse(statement)
        except SyntaxError:  # an assert continued on the next line: its message is there
            continue
        message = tree.body[0].msg
        if isinstance(message, ast.Constant) and isinstance(message.value, str):
            found.append((number, message.value))
        elif isinstance(message, ast.JoinedStr):
            parts = [v.value for v in message.values if isinstance(v, ast.Constant)]
            found.append((number, "".join(parts)))
    return found


def is_only_code(message: str) -> bool:
    return not PROSE.search(message)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("handmade.prepare == prepare_pt2e", True),
        ("x → quantize → dequantize → conv", True),
        ("sigmoid(conv(x))", True),
        ("kernel size 2, stride 2", False),
        ("the residual add and the sigmoid are float", False),
    ],
)
def test_code_only_messages_are_told_from_prose(message, code):
    assert is_only_code(message) is code


@pytest.mark.parametrize("path", ZH_LESSONS, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_every_assert_message_in_a_zh_lesson_is_chinese(path):
    english = [
        f"line {number}: {message!r}"
        for number, message in assert_messages(path.read_text(encoding="utf-8"))
        if not HAN.search(message) and not is_only_code(message)
    ]
    assert not english, "assert messages still in English:\n" + "\n".join(english)


def test_the_assert_scan_sees_folded_solutions():
    source = '#          assert len(x) == 2, "two nodes"\nassert y, "一個"\n'
    assert assert_messages(source) == [(1, "two nodes"), (2, "一個")]


# Mainland words and the Taiwanese ones the course writes instead (python-docs-zh-tw's list).
MAINLAND = {
    "函數": "函式",
    "拋出": "引發",
    "數據": "資料",
    "默認": "預設",
    "信息": "資訊",
    "調用": "呼叫",
    "內存": "記憶體",
    "代碼": "程式碼",
    "套路": "做法",
}
ZH_PAGES = [*ZH_LESSONS, *sorted((ROOT / "docs" / "zh_TW").glob("*.md"))]


@pytest.mark.parametrize("path", ZH_PAGES, ids=lambda p: p.name)
def test_zh_pages_use_taiwanese_terms(path):
    text = path.read_text(encoding="utf-8")
    found = [
        f"line {text.count(chr(10), 0, text.index(word)) + 1}: {word} → {taiwan}"
        for word, taiwan in MAINLAND.items()
        if word in text
    ]
    assert not found, "Mainland terms:\n" + "\n".join(found)


# A cross-reference in a zh page names its lesson as the lesson's own title does
# (「M01-1 · PT2E 全流程」 for 「M01-1 PT2E 全流程：export → …」), so the reader recognises it.
REFERENCE = re.compile(r"(?:\{ref\}|:ref:)`([^`<]+?)\s*<(sphx_glr_lessons_[^>]+)>`")


@functools.cache  # read once for the ~50 pages that ask (the lessons are parsed)
def lesson_titles(root: Path = ROOT / "examples" / "zh_TW") -> dict[str, str]:
    """Sphinx-gallery's label of every zh lesson and module page -> its title."""
    titles = {}
    for path in root.rglob("*.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        titles[f"sphx_glr_lessons_{path.parent.name}_{path.name}"] = docstring.splitlines()[0]
    for path in root.rglob("README.txt"):
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        titles[f"sphx_glr_lessons_{path.parent.name}"] = next(
            line for line in lines if not line.startswith("..")
        )
    return titles


def mismatched_references(text: str, titles: dict[str, str]) -> list[str]:
    """Each reference whose title is neither its lesson's title nor the part before 「：」."""
    found = []
    for match in REFERENCE.finditer(text):
        title = " ".join(re.sub(r"\n\s*#", " ", match[1]).split()).replace(" · ", " ")
        wanted = titles.get(match[2])
        if wanted is not None and title not in (wanted, wanted.split("：")[0]):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"line {line}: {title!r}, the lesson is {wanted!r}")
    return found


def test_the_reference_check_sees_a_wrong_title():
    titles = {"sphx_glr_lessons_m01_x_m01_1_flow.py": "M01-1 PT2E 全流程：export → convert"}
    good = "見 :ref:`M01-1 · PT2E 全流程\n# <sphx_glr_lessons_m01_x_m01_1_flow.py>`。"
    bad = "見 :ref:`M01-1 · PT2E 流程 <sphx_glr_lessons_m01_x_m01_1_flow.py>`。"
    assert mismatched_references(good, titles) == []
    assert mismatched_references(bad, titles) == [
        "line 1: 'M01-1 PT2E 流程', the lesson is 'M01-1 PT2E 全流程：export → convert'"
    ]


ZH_MODULE_PAGES = sorted((ROOT / "examples" / "zh_TW").rglob("README.txt"))


@pytest.mark.parametrize(
    "path", [*ZH_PAGES, *ZH_MODULE_PAGES], ids=lambda p: str(p.relative_to(ROOT))
)
def test_zh_references_use_the_lessons_titles(path):
    found = mismatched_references(path.read_text(encoding="utf-8"), lesson_titles())
    assert not found, "cross-reference titles that differ from the lesson's:\n" + "\n".join(found)


# The theme's own English, which docs/locale/zh_TW/LC_MESSAGES/sphinx.po and the zh_TW theme
# options in docs/course_conf.py replace.
THEME_ENGLISH = ("Search the docs", "Color mode", "© Copyright", "contributors")


@pytest.mark.slow
@pytest.mark.xdist_group("site")  # the worker that has the built site (tests/conftest.py)
def test_zh_tw_pages_show_no_theme_english(site):
    pages = [p for p in (site / "zh_TW").rglob("*.html") if "_" not in p.parts[-2][:1]]
    assert len(pages) > 30, f"not every zh_TW page is under {site}"
    found = {
        str(page.relative_to(site)): english
        for page in pages
        if (english := [s for s in THEME_ENGLISH if s in page.read_text(encoding="utf-8")])
    }
    assert not found, f"theme strings still in English on {len(found)} zh_TW pages: {found}"
