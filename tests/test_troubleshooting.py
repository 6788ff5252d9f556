"""The troubleshooting pages: at least 15 entries, each reproduced, fixed and linked to its
lesson, headed by the message the page really prints, found by the site's search, listed last.

The pages run as lessons do (tests/test_lessons.py: as scripts, twins with identical code); here
are the rules of their shape, then checks of the built site (the ``site`` fixture of conftest).
"""

import html
import json
import re
from pathlib import Path

import pytest
from lesson_scripts import EXAMPLES, lessons
from sphinx.search.en import SearchEnglish

from course_search_zh import CourseChinese
from site_facts import LANGUAGES

FOLDER = "troubleshooting"
# Section headings of a page that are not entries (the migration map's table: "The map").
NOT_ENTRIES = {"Setup", "Next", "The map", "準備", "下一頁", "對照表"}
# A heading that is an error message starts with the exception's (or warning's) name.
MESSAGE = re.compile(r"^(?P<type>[A-Z]\w*(?:Error|Warning|Exception)): (?P<text>.+)$")
# Messages the search must find, in both languages: four entries of the first pages, and
# every error of m99_5 (ExecuTorch's errors, which readers paste from elsewhere; see below).
SEARCHED = [
    "Input partition has more than one output node",
    "Calling eval() is not supported yet.",
    # torchao's message starts with a line break: a reader pastes the type and the line under it
    "NotImplementedError: Calling train() or eval() is not supported for exported models.",
    "No module named 'torch.ao.quantization.quantize_pt2e'",
    "Guard failed: x.size()[0] <= 4",  # the bounded batch (m99_1), beside M06-4's bound
    "We ran into an error when deserializing the saved file.",
]


def pages(lang: str) -> list[Path]:
    return [p for p in lessons(lang) if p.parts[0] == FOLDER]


def entries(path: Path) -> list[tuple[str, str]]:
    """(heading, the entry's text and code up to the next heading) for each entry of a page."""
    text = path.read_text(encoding="utf-8")
    found = list(re.finditer(r"^# %%\n# (?P<heading>[^\n]+)\n# -{3,}\n", text, re.MULTILINE))
    bodies = [
        (m["heading"], text[m.end() : following.start() if following else len(text)])
        for m, following in zip(found, [*found[1:], None], strict=True)
    ]
    # Headings escape their quotes (a backslash) so that Sphinx's smart quotes keep them straight.
    return [(h.replace("\\'", "'"), body) for h, body in bodies if h not in NOT_ENTRIES]


SEARCHED += [
    MESSAGE.match(heading)["text"]
    for heading, _ in entries(EXAMPLES / "en" / FOLDER / "m99_5_executorch_and_xnnpack.py")
    if MESSAGE.match(heading)
]

ALL_ENTRIES = [
    pytest.param(lang, page, heading, body, id=f"{lang}-{page.stem}-{heading[:50]}")
    for lang in LANGUAGES
    for page in pages(lang)
    for heading, body in entries(EXAMPLES / lang / page)
]


def test_entries_are_found(tmp_path):
    text = "# %%\n# Setup\n# -----\nx = 1\n# %%\n# KeyError: \\'a\\'\n# -------------\n# Why.\n"
    page = tmp_path / "m99_1_x.py"
    page.write_text(text + "assert x\n")
    assert entries(page) == [("KeyError: 'a'", "# Why.\nassert x\n")]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_there_are_at_least_15_entries_on_3_to_6_pages(lang):
    found = [heading for page in pages(lang) for heading, _ in entries(EXAMPLES / lang / page)]
    assert 3 <= len(pages(lang)) <= 6, f"{len(pages(lang))} troubleshooting pages"
    assert len(found) >= 15, f"examples/{lang}/{FOLDER} has {len(found)} entries: {found}"
    assert len(set(found)) == len(found), "two entries share a heading"


@pytest.mark.parametrize(("lang", "page", "heading", "body"), ALL_ENTRIES)
def test_each_entry_reproduces_asserts_a_fix_and_links_its_lesson(lang, page, heading, body):
    fix = "**修正**" if lang == "zh_TW" else "**Fix**"
    assert fix in body, f"{heading!r}: no {fix} paragraph"
    problem, remedy = body.split(fix, 1)
    assert re.search(r"^(with expect_error\(|assert )", problem, re.M), (
        f"{heading!r}: the problem is neither reproduced (expect_error) nor asserted"
    )
    assert re.search(r"^\s*(assert |torch\.testing\.assert_close\()", remedy, re.M), (
        f"{heading!r}: the fix is not asserted"
    )
    assert re.search(r":ref:`[^`]+<sphx_glr_lessons_m\d\d_\w+\.py>`", remedy, re.S), (
        f"{heading!r}: the fix links to no lesson (a :ref: with a title)"
    )


@pytest.mark.parametrize(("lang", "page", "heading", "body"), ALL_ENTRIES)
def test_an_error_heading_is_the_error_the_entry_expects(lang, page, heading, body):
    message = MESSAGE.match(heading)
    if message is None:  # a symptom in a reader's words: checked by the asserts above
        return
    if message["type"].endswith("Warning"):
        assert "warnings.catch_warnings(record=True)" in body, f"{heading!r}: warning not caught"
        return
    expected = re.search(rf'expect_error\({message["type"]}, match="(?P<match>[^"]+)"\)', body)
    assert expected, f"{heading!r}: no expect_error({message['type']}, match=...) in the entry"
    assert expected["match"] in message["text"], (
        f"{heading!r}: the entry expects {expected['match']!r}, which the heading does not say"
    )


@pytest.mark.parametrize("relative", pages("en"), ids=str)
def test_twins_have_the_same_error_headings(relative):
    def messages(lang):
        return [h for h, _ in entries(EXAMPLES / lang / relative) if MESSAGE.match(h)]

    for lang in LANGUAGES:
        assert messages(lang) == messages("en"), f"{lang}: the error headings differ"


# ------------------------------------------------------------------------- the built site


def search_index(site: Path, lang: str) -> dict:
    text = (site / lang / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


def searcher(lang: str):
    """The language's search splitter and stemmer, as Sphinx built the index with them."""
    return CourseChinese({}) if lang == "zh_TW" else SearchEnglish({})


def pages_found(index: dict, lang: str, query: str) -> set[str]:
    """Documents holding every word of ``query``, as Sphinx's search looks them up."""
    language = searcher(lang)
    words = [language.stem(w.lower()) for w in language.split(query)]
    words = [w for w in words if language.word_filter(w) and w not in language.stopwords]
    assert words, f"{query!r} has no searchable word"
    found = None
    for word in words:
        docs = set()
        for table in (index["terms"], index["titleterms"]):
            hits = table.get(word, [])
            docs |= {hits} if isinstance(hits, int) else set(hits)
        found = docs if found is None else found & docs
    return {index["docnames"][i] for i in found}


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("message", SEARCHED)
def test_search_finds_the_entry_of_a_message(site, lang, message):
    index = search_index(site, lang)
    headings = [t for t in index["alltitles"] if t.endswith(message)]
    assert headings, f"{lang}: no section is headed {message!r}"
    (docs,) = {tuple(index["docnames"][i] for i, _ in index["alltitles"][h]) for h in headings}
    assert all(doc.startswith(f"lessons/{FOLDER}/") for doc in docs), docs
    found = pages_found(index, lang, message)
    assert set(docs) <= found, f"{lang}: searching {message!r} finds {sorted(found)}, not {docs}"


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.parametrize("lang", LANGUAGES)
def test_each_error_heading_is_what_the_page_printed(site, lang):
    """The heading is the exact first line the stack raised: the page's output shows it."""
    for page in pages(lang):
        built = (site / lang / "lessons" / page.with_suffix(".html")).read_text("utf-8")
        # tags off first, then entities: an unescaped "<= 4" would read as the start of a tag
        outputs = re.sub(r"<[^>]+>", "", " ".join(re.findall(r"<pre>(.*?)</pre>", built, re.S)))
        outputs = html.unescape(outputs)
        for heading, _ in entries(EXAMPLES / lang / page):
            message = MESSAGE.match(heading)
            if message and not message["type"].endswith("Warning"):
                assert heading in outputs, f"{lang}/{page}: the page never printed {heading!r}"


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.parametrize("lang", LANGUAGES)
def test_troubleshooting_is_the_last_section_of_the_lessons(site, lang):
    index = (site / lang / "lessons" / "index.html").read_text("utf-8")
    article = index[index.index("<article") : index.index("</article>")]  # not the footer's links
    # The folders of the pages the article links to, in order (each section lists its pages).
    sections = list(dict.fromkeys(re.findall(r'href="(\w+)/[^"/]+\.html', article)))
    assert sections[-1] == FOLDER, f"{FOLDER} is not last: {sections}"
