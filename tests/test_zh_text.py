"""The zh_TW lessons say in Chinese what their asserts claim (code-only messages excepted)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
