"""Chinese pages show no stray spaces: docs/zh_spacing.py, on a tiny site and on the real one.

A browser shows a source line break inside a paragraph as a space, which splits Chinese text
(「把模型 執行一次」); a space kept between inline code and full-width punctuation shows as
「x ，」. Both are artefacts of the source's layout, never something the writer asked for.
"""

import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest
from zh_spacing import CJK, FULL_WIDTH_PUNCTUATION, tidy

from conftest import ROOT

# In the text a reader sees: a line break between two CJK characters, or whitespace that
# touches full-width punctuation.
ARTEFACT = re.compile(
    f"[{CJK}][^\\S\\n]*\\n\\s*[{CJK}]"
    f"|\\S\\s+[{FULL_WIDTH_PUNCTUATION}]"
    f"|[{FULL_WIDTH_PUNCTUATION}]\\s+\\S"
)
# Blocks of running text; their code spans count as one Latin character, since their inside
# is shown as written.
TEXT_BLOCKS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "caption", "figcaption"}
SKIPPED = {"pre", "script", "style", "code"}


class _RunningText(HTMLParser):
    """The text of every running-text block of an HTML page."""

    def __init__(self):
        super().__init__()
        self.blocks, self._open, self._skipping = [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIPPED:
            if self._skipping == 0 and tag == "code":
                self._add("x")
            self._skipping += 1
        elif tag in TEXT_BLOCKS:
            self._open.append([])

    def handle_endtag(self, tag):
        if tag in SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in TEXT_BLOCKS and self._open:
            self.blocks.append("".join(self._open.pop()))

    def handle_data(self, data):
        if not self._skipping:
            self._add(data)

    def _add(self, text):
        if self._open:
            self._open[-1].append(text)


def artefacts(html: str) -> list[str]:
    """Each stray space of a page, with a few characters around it."""
    parser = _RunningText()
    parser.feed(html)
    found = []
    for block in parser.blocks:
        block = block.strip()
        for match in ARTEFACT.finditer(block):
            start, end = max(0, match.start() - 4), match.end() + 4
            found.append(block[start:end].replace("\n", "⏎"))
    return found


@pytest.mark.parametrize(
    ("text", "before", "after", "expected"),
    [
        ("把模型\n執行一次", "", "", "把模型執行一次"),
        ("，\n   把模型", "", "", "，把模型"),
        (" ，寫明", "x", "", "，寫明"),
        ("（ ", "", "x", "（"),
        ("\n執行", "型", "", "執行"),
        ("呼叫\nquantizer 的", "", "", "呼叫\nquantizer 的"),
        ("把模型 執行", "", "", "把模型 執行"),
        ("步驟 1 — 標註", "", "", "步驟 1 — 標註"),
        ("，", "", "", "，"),
        ("end\n", "", "", "end\n"),
    ],
    ids=[
        "line-break-between-han",
        "line-break-after-punctuation",
        "space-after-code-before-comma",
        "space-after-open-parenthesis",
        "line-break-at-node-start",
        "keeps-chinese-latin-space",
        "keeps-space-written-on-one-line",
        "keeps-em-dash-spaces",
        "punctuation-alone",
        "block-edge",
    ],
)
def test_tidy_removes_only_stray_spaces(text, before, after, expected):
    assert tidy(text, before, after) == expected


def test_the_check_finds_both_artefacts():
    page = "<p>把模型\n執行一次，呼叫 <code>x</code> ，好</p><pre>保留 原樣 ，</pre>"
    assert artefacts(page) == ["把模型⏎執行一次，", "，呼叫 x ，好"]
    assert artefacts("<p>把模型執行一次，呼叫 <code>a ，b</code>，好</p>") == []


FIXTURE_RST = """\
索引
====

PT2E 的 quantizer 不改圖，它只在某些 node 上留下便條
``node.meta["quantization_annotation"]`` ，寫明哪些輸入要量化。把模型
執行一次（ ``calibrate`` ）就好。**粗體**
之後也是。

.. toctree::

   myst
"""

FIXTURE_MD = """\
# MyST 頁面

圖模組的 `forward` ，由圖產生；把模型
執行一次，再讀 [索引](index.rst)
的內容。

呼叫
quantizer 的便條，把模型
執行一次。

產生出來的 `forward` **不會**
自己跟著圖改變。
"""


def build_fixture(root: Path, extensions: list[str]) -> Path:
    """A tiny zh_TW site (a reST page and a MyST page) built with -W; its output folder."""
    source = root / "source"
    source.mkdir()
    (source / "conf.py").write_text(
        textwrap.dedent(f"""\
            import sys
            sys.path.insert(0, {str(ROOT / "docs")!r})
            language = "zh_TW"
            extensions = {["myst_parser", *extensions]!r}
            """)
    )
    (source / "index.rst").write_text(FIXTURE_RST, encoding="utf-8")
    (source / "myst.md").write_text(FIXTURE_MD, encoding="utf-8")
    out = root / "html"
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", source, out]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def fixture_artefacts(out: Path) -> list[str]:
    return [a for page in ("index", "myst") for a in artefacts((out / f"{page}.html").read_text())]


def test_without_the_transform_the_fixture_shows_stray_spaces(tmp_path):
    found = fixture_artefacts(build_fixture(tmp_path, []))
    assert len(found) >= 6, f"the fixture should show every kind of stray space: {found}"


def test_the_transform_removes_every_stray_space(tmp_path):
    out = build_fixture(tmp_path, ["zh_spacing"])
    assert fixture_artefacts(out) == []
    text = (out / "index.html").read_text()
    assert "quantizer 不改圖" in text, "the space between Chinese and Latin words stays"
    assert "把模型執行一次（<code" in text
    page = (out / "myst.html").read_text()
    assert "呼叫\nquantizer 的便條，把模型執行一次。" in page, "the right line break of several"
    assert "<strong>不會</strong>自己" in page, "a line break after bold text"


@pytest.mark.slow
@pytest.mark.xdist_group("site")  # the worker that has the built site (tests/conftest.py)
def test_zh_tw_pages_of_the_site_show_no_stray_spaces(site):
    root = site
    pages = sorted((root / "zh_TW").rglob("*.html"))
    pages = [p for p in pages if not p.relative_to(root / "zh_TW").parts[0].startswith("_")]
    assert pages, f"no zh_TW page under {root}"
    found = {
        str(page.relative_to(root)): stray
        for page in pages
        if (stray := artefacts(page.read_text(encoding="utf-8")))
    }
    assert not found, f"stray spaces in Chinese text: {found}"
