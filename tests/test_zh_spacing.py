"""Chinese pages show no stray spaces: docs/zh_spacing.py, on a tiny site and on the real one.

A browser shows a source line break inside a paragraph as a space, which splits Chinese text
(「把模型 執行一次」); a space kept between inline code and full-width punctuation shows as
「x ，」; the space reST needs around inline markup shows as 「int8 有沒有 代價」. All are
artefacts of the source's layout, never something the writer asked for. Chinese sentences
also take full-width punctuation: no half-width 「:」「(」「)」 right after a Chinese character
in running text or in a lesson's Chinese printed output.
"""

import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest
from lesson_scripts import ROOT

from common.charts import CJK_CHARACTERS

from zh_spacing import CJK, FULL_WIDTH_PUNCTUATION, tidy

# Where an inline element (em, strong, a link, ...) starts or ends inside a block of text.
BOUNDARY = "\x00"
# In the text a reader sees: a line break between two CJK characters, or whitespace that
# touches full-width punctuation (both checked with the boundaries taken out) ...
ARTEFACT = re.compile(
    f"[{CJK}][^\\S\\n]*\\n\\s*[{CJK}]"
    f"|\\S\\s+[{FULL_WIDTH_PUNCTUATION}]"
    f"|[{FULL_WIDTH_PUNCTUATION}]\\s+\\S"
)
# ... or a space between two CJK characters at an inline element's edge (「有沒有 代價」).
AT_BOUNDARY = re.compile(
    f"[{CJK}][\\s{BOUNDARY}]*(?:\\s{BOUNDARY}|{BOUNDARY}\\s)[\\s{BOUNDARY}]*[{CJK}]"
)
# Half-width punctuation that belongs to a Chinese sentence: 「參數:」, 「(常數)」.
HALF_WIDTH = re.compile(f"[{CJK_CHARACTERS}][:()]|[(][{CJK_CHARACTERS}]")
# Blocks of running text; their code spans count as one Latin character, since their inside
# is shown as written.
TEXT_BLOCKS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "caption", "figcaption"}
SKIPPED = {"pre", "script", "style", "code"}


class _RunningText(HTMLParser):
    """The text of every running-text block of an HTML page, and the lessons' printed output.

    In ``blocks``, BOUNDARY marks where an inline element starts or ends; ``outputs`` holds
    the text of each sphinx-gallery output block (what a lesson printed).
    """

    def __init__(self):
        super().__init__()
        self.blocks, self._open, self._skipping = [], [], 0
        self.outputs, self._output, self._next_pre_is_output = [], None, False

    def handle_starttag(self, tag, attrs):
        if tag == "div" and "sphx-glr-script-out" in (dict(attrs).get("class") or ""):
            self._next_pre_is_output = True
        elif tag == "pre" and self._next_pre_is_output:
            self._output, self._next_pre_is_output = [], False
        if tag in SKIPPED:
            if self._skipping == 0 and tag == "code":
                self._add(f"{BOUNDARY}x{BOUNDARY}")
            self._skipping += 1
        elif tag in TEXT_BLOCKS:
            self._open.append([])
        else:
            self._add(BOUNDARY)

    def handle_endtag(self, tag):
        if tag == "pre" and self._output is not None:
            self.outputs.append("".join(self._output))
            self._output = None
        if tag in SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in TEXT_BLOCKS and self._open:
            self.blocks.append("".join(self._open.pop()))
        else:
            self._add(BOUNDARY)

    def handle_data(self, data):
        if self._output is not None:
            self._output.append(data)
        if not self._skipping:
            self._add(data)

    def _add(self, text):
        if self._open:
            self._open[-1].append(text)


def _excerpts(pattern: re.Pattern, text: str) -> list[str]:
    """Each match of ``pattern`` with 4 characters either side, shown without BOUNDARY."""
    found = []
    for match in pattern.finditer(text):
        before = text[: match.start()].replace(BOUNDARY, "")[-4:]
        after = text[match.end() :].replace(BOUNDARY, "")[:4]
        shown = before + match.group().replace(BOUNDARY, "") + after
        found.append(shown.replace("\n", "⏎"))
    return found


def _parse(html: str) -> _RunningText:
    parser = _RunningText()
    parser.feed(html)
    return parser


def artefacts(html: str) -> list[str]:
    """Each stray space of a page, with a few characters around it."""
    found = []
    for block in _parse(html).blocks:
        found += _excerpts(ARTEFACT, block.replace(BOUNDARY, "").strip())
    return found + at_markup(html)


def at_markup(html: str) -> list[str]:
    """The stray spaces of a page between Chinese and an inline element's edge."""
    return [found for block in _parse(html).blocks for found in _excerpts(AT_BOUNDARY, block)]


def half_width(html: str) -> list[str]:
    """Each half-width 「:」「(」「)」 that touches a Chinese character, in running text and in
    the printed lines that hold Chinese (a code span counts as Latin text)."""
    parser = _parse(html)
    found = []
    for block in parser.blocks:
        found += _excerpts(HALF_WIDTH, block.replace(BOUNDARY, ""))
    for output in parser.outputs:
        found += _excerpts(HALF_WIDTH, output)
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
        (" 代價", "有", "", "代價"),
        ("把 ", "", "量", "把"),
        (" ", "有", "代", ""),
        (" quantizer", "有", "", " quantizer"),
        ("呼叫 ", "", "x", "呼叫 "),
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
        "space-after-inline-markup",
        "space-before-inline-markup",
        "space-between-two-inline-elements",
        "keeps-space-before-latin-markup",
        "keeps-space-before-code",
        "keeps-em-dash-spaces",
        "punctuation-alone",
        "block-edge",
    ],
)
def test_tidy_removes_only_stray_spaces(text, before, after, expected):
    assert tidy(text, before, after) == expected


def test_the_check_finds_every_artefact():
    page = "<p>把模型\n執行一次，呼叫 <code>x</code> ，好</p><pre>保留 原樣 ，</pre>"
    assert artefacts(page) == ["把模型⏎執行一次，", "，呼叫 x ，好"]
    assert artefacts("<p>把模型執行一次，呼叫 <code>a ，b</code>，好</p>") == []
    assert artefacts("<p>int8 <em>有沒有</em> 代價，把 <a>量化後</a>的</p>") == [
        "8 有沒有 代價，把 ",
        " 代價，把 量化後的",
    ]
    assert artefacts("<p>呼叫 <em>quantizer</em> 的 <code>x</code> 與 <b>y</b></p>") == []


def test_the_check_finds_half_width_punctuation():
    page = (
        '<dl><dt>參數<span class="colon">:</span></dt></dl><p>見 <code>f(x)</code>（常數）</p>'
        '<div class="sphx-glr-script-out"><pre>stride = [1, 1] (常數)\nshape (2, 8)</pre></div>'
        '<pre>print("不是輸出(")</pre>'
    )
    assert half_width(page) == ["參數:", " 1] (常數)⏎s", "] (常數)⏎sha"]


FIXTURE_RST = """\
.. _索引:

索引
====

PT2E 的 quantizer 不改圖，它只在某些 node 上留下便條
``node.meta["quantization_annotation"]`` ，寫明哪些輸入要量化。把模型
執行一次（ ``calibrate`` ）就好。**粗體**
之後也是。準確度告訴你 int8 *有沒有* 代價，把 **量化後** 的張量 :ref:`拿來 <索引>` 比較。

:參數: 一個欄位

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
自己跟著圖改變，也 **不會** 讀 [索引](index.rst) 以外的頁面。
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


def fixture_artefacts(out: Path, check=artefacts) -> list[str]:
    return [a for page in ("index", "myst") for a in check((out / f"{page}.html").read_text())]


def test_without_the_extension_the_fixture_shows_stray_spaces(tmp_path):
    out = build_fixture(tmp_path, [])
    found = fixture_artefacts(out)
    assert len(found) >= 12, f"the fixture should show every kind of stray space: {found}"
    found = fixture_artefacts(out, at_markup)
    assert len(found) >= 6, f"and spaces at inline markup (em, strong, links): {found}"
    assert fixture_artefacts(out, half_width) == ["參數:"]


def test_the_extension_removes_every_stray_space(tmp_path):
    out = build_fixture(tmp_path, ["zh_spacing"])
    assert fixture_artefacts(out) == []
    assert fixture_artefacts(out, half_width) == []
    text = (out / "index.html").read_text()
    assert "quantizer 不改圖" in text, "the space between Chinese and Latin words stays"
    assert "把模型執行一次（<code" in text
    page = (out / "myst.html").read_text()
    assert "呼叫\nquantizer 的便條，把模型執行一次。" in page, "the right line break of several"
    assert "<strong>不會</strong>自己" in page, "a line break after bold text"
    assert "也<strong>不會</strong>讀" in page, "spaces around bold text"
    assert "int8 <em>有沒有</em>代價" in text, "the Latin side keeps its space"


@pytest.mark.slow
@pytest.mark.xdist_group("site")  # the worker that has the built site (tests/conftest.py)
@pytest.mark.parametrize(
    "check", [artefacts, half_width], ids=["stray-spaces", "half-width-punctuation"]
)
def test_zh_tw_pages_of_the_site_are_spaced_and_punctuated(site, check):
    root = site
    pages = sorted((root / "zh_TW").rglob("*.html"))
    pages = [p for p in pages if not p.relative_to(root / "zh_TW").parts[0].startswith("_")]
    assert len(pages) > 30, f"not every zh_TW page is under {root}: {pages}"
    found = {
        str(page.relative_to(root)): bad
        for page in pages
        if (bad := check(page.read_text(encoding="utf-8")))
    }
    total = sum(map(len, found.values()))
    assert not found, f"{total} in Chinese text on {len(found)} pages ({check.__name__}): {found}"
