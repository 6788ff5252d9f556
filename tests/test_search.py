"""The site's search, in both languages: the zh_TW index and the query typed into the box split
alike (docs/course_search_zh.py), and in headless Chromium the search page finds the pages a
reader looks for, with its result-count line in the page's language."""

import json
import re
import shutil
import subprocess
from urllib.parse import quote

import pytest
from lesson_scripts import EXAMPLES

# tests/conftest.py puts docs/ on sys.path.
import course_search_zh
from course_search_zh import SPLITTER_JS, CourseChinese, glossary_terms, split

TERMS = frozenset(glossary_terms())

# What readers type, and the pages it must find (docnames; the first is the one they want).
QUERIES = {
    "zh_TW": {
        "疑難排解": [
            f"lessons/troubleshooting/{p.stem}"
            for p in sorted((EXAMPLES / "zh_TW" / "troubleshooting").glob("m99_*.py"))
        ],
        "量化感知訓練": ["lessons/m04_accuracy/m04_3_qat"],
        "捨入": ["lessons/m01_quantized_graphs/m01_2_qdq_numbers"],
        # m99_2 is about them; m99_5's Conv1d(padding="same") entry is one too
        "不報錯的失敗": [
            "lessons/troubleshooting/m99_2_prepare_and_convert",
            "lessons/troubleshooting/m99_5_executorch_and_xnnpack",
        ],
        # m99_5's entries that are symptoms, not messages (those: test_troubleshooting.py)
        "區段錯誤": ["lessons/troubleshooting/m99_5_executorch_and_xnnpack"],
        "GRU": ["lessons/troubleshooting/m99_5_executorch_and_xnnpack"],
    },
    "en": {
        "troubleshooting": [
            f"lessons/troubleshooting/{p.stem}"
            for p in sorted((EXAMPLES / "en" / "troubleshooting").glob("m99_*.py"))
        ],
        "quantization-aware training": ["lessons/m04_accuracy/m04_3_qat"],
        "rounding": ["lessons/m01_quantized_graphs/m01_2_qdq_numbers"],
        "silent failures": ["lessons/troubleshooting/m99_2_prepare_and_convert"],
        "segmentation fault": ["lessons/troubleshooting/m99_5_executorch_and_xnnpack"],
        "GRU": ["lessons/troubleshooting/m99_5_executorch_and_xnnpack"],
    },
}

# Text the two splitters must agree on: course terms, a troubleshooting heading, prose.
SAMPLES = [
    *sorted(TERMS),
    "疑難排解：prepare 與 convert",
    "讀者最常遇到的錯誤與無聲的失敗，依階段分頁：匯入與 export、prepare 與 convert",
    "把 `x * (1 / scale)` 捨入到最近的整數，剛好一半時取偶數；再截斷到量化範圍內。",
    "int8 量化感知訓練（QAT）用 prepare_qat_pt2e，活化值 8 位元；M04-3",
    "ValueError: Input partition has more than one output node",
    "圖",
    "",
]


# ----------------------------------------------------------------------------- the splitter


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("捨入", ["捨入"]),
        ("疑難排解", ["疑難排解", "疑難", "難排", "排解"]),
        ("不報錯的失敗", ["不報錯的失敗", "不報", "報錯", "錯的", "的失", "失敗"]),
        ("int8 的 scale", ["int8", "的", "scale"]),
        ("prepare_pt2e（量化）", ["prepare_pt2e", "量化"]),
    ],
    ids=["a-two-character-term", "a-term-and-its-pairs", "a-phrase", "latin-words", "mixed"],
)
def test_split_gives_each_course_term_and_every_character_pair(text, words):
    assert split(text, TERMS) == words


def test_every_glossary_term_is_a_word_of_the_index():
    language = CourseChinese({})
    for term in TERMS:
        assert term in language.split(term), f"{term!r} is not kept whole"
    for term in ("捨入", "飽和", "活化值", "逐位元", "數值除錯器", "詞彙表", "疑難排解", "下放"):
        assert term in TERMS, f"{term!r} is not a course term"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("不報錯的失敗", ["不報錯的失敗"]),
        ("無聲的", ["無聲", "聲的"]),
        ("活化值捨入", ["活化", "化值", "值捨", "捨入"]),
        ("捨入 int8", ["捨入", "int8"]),
    ],
    ids=["a-term-alone", "not-a-term", "two-terms-in-a-run", "latin-beside"],
)
def test_a_query_asks_for_a_term_alone_or_for_pairs_never_both(text, words):
    assert split(text, TERMS, query=True) == words


def test_a_query_finds_any_text_that_contains_it():
    """Every word of a query is a word of any text holding the query (Sphinx needs them all)."""
    text = "convert_pt2e 之後，observer 還在圖裡：這是不報錯的失敗，量化感知訓練也救不了。"
    indexed = set(split(text, TERMS))
    for start in range(len(text)):
        for end in range(start + 1, len(text) + 1):
            query = split(text[start:end], TERMS, query=True)
            query = [w for w in query if len(w) > 1 and not w.isascii()]
            assert set(query) <= indexed, f"{text[start:end]!r}: {set(query) - indexed}"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_query_splits_in_javascript_as_the_index_in_python():
    code = CourseChinese({}).js_splitter_code
    script = f"{code}\nconsole.log(JSON.stringify({json.dumps(SAMPLES)}.map(splitQuery)));"
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True)
    in_js = json.loads(done.stdout)
    for text, words in zip(SAMPLES, in_js, strict=True):
        expected = [w for w in split(text, TERMS, query=True) if len(w) > 1]
        assert words == expected, f"{text!r}: JavaScript {words}, Python {expected}"


def test_the_splitter_code_names_splitquery():
    assert "var splitQuery" in SPLITTER_JS and "TERMS" in SPLITTER_JS
    assert course_search_zh.HAN in CourseChinese({}).js_splitter_code


# ------------------------------------------------------------------------- the built site


def search_index(site, lang: str) -> dict:
    text = (site / lang / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


@pytest.mark.slow
@pytest.mark.xdist_group("site")
def test_the_zh_tw_index_holds_the_course_terms_whole(site):
    terms = search_index(site, "zh_TW")["terms"]
    for term in ("捨入", "飽和", "活化值", "逐位元", "量化感知訓練", "疑難排解"):
        assert term in terms, f"{term!r} is not a word of the zh_TW index"


@pytest.mark.slow
@pytest.mark.xdist_group("site")
def test_the_result_count_line_is_translated(site):
    catalog = (site / "zh_TW" / "_static" / "translations.js").read_text("utf-8")
    data = json.loads(catalog[catalog.index("(") + 1 : catalog.rindex(")")])
    line = data["messages"]["Search finished, found one page matching the search query."]
    assert line and "${resultCount}" in line[0] and re.search("[\u4e00-\u9fff]", line[0]), line


def run_search(page, server, lang: str, query: str) -> tuple[list[str], str]:
    """Search as a reader does; return the result pages (docnames, in order) and the status line."""
    page.goto(f"{server}/{lang}/search.html?q={quote(query)}")
    page.wait_for_function(
        "typeof Search !== 'undefined' && Search.title?.innerText"
        " === Documentation.gettext('Search Results')",
        timeout=30_000,
    )
    hrefs = page.eval_on_selector_all(
        "#search-results ul.search li > a", "links => links.map(a => a.getAttribute('href'))"
    )
    found = [re.sub(r"^\./|\.html.*$", "", href or "") for href in hrefs]
    return found, page.locator("#search-results .search-summary").inner_text()


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.browser
@pytest.mark.parametrize(
    ("lang", "query"), [(lang, query) for lang, queries in QUERIES.items() for query in queries]
)
def test_the_search_page_finds_what_readers_look_for(browse, server, lang, query):
    page = browse()
    found, status = run_search(page, server, lang, query)
    wanted = QUERIES[lang][query]
    missing = [doc for doc in wanted if doc not in found]
    assert not missing, f"{lang}: {query!r} finds {len(found)} pages, not {missing}: {found}"
    if lang == "zh_TW":  # (the English ranking is Sphinx's own: ties in alphabetical order)
        assert set(found[:3]) & set(wanted), f"{query!r}: top hits {found[:3]}"
    count = "one page" if len(found) == 1 and lang == "en" else str(len(found))  # Sphinx's words
    assert count in status, f"{lang}: the status line {status!r} gives no count"
    if lang == "zh_TW":
        assert re.search("[\u4e00-\u9fff]", status), f"status line {status!r} is not Chinese"


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.browser
def test_the_search_box_splits_as_the_index(browse, server):
    """The page's own splitQuery (language_data.js) agrees with the Python splitter."""
    page = browse()
    page.goto(f"{server}/zh_TW/search.html")
    page.wait_for_function("typeof splitQuery === 'function'")
    in_browser = page.evaluate("samples => samples.map(splitQuery)", SAMPLES)
    for text, words in zip(SAMPLES, in_browser, strict=True):
        assert words == [w for w in split(text, TERMS, query=True) if len(w) > 1], text
