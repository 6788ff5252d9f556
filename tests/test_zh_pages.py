"""zh_TW pages speak Chinese where the tools speak English, and share their anchors with the
English twins: section ids (docs/course_anchors.py), the copy buttons' tooltips and
sphinx-gallery's output label (docs/_static/copybutton-zh-tw.js, course-zh-tw.css), and the
lines the course's helpers print (common.cpu, common.timing)."""

import re
from html.parser import HTMLParser

import pytest
from lesson_scripts import EXAMPLES
from test_site import lesson_pages

# tests/conftest.py puts docs/ on sys.path.
from course_anchors import english_titles, section_ids
from course_sources import page_source
from site_facts import LANGUAGES

TWINS = sorted(set(lesson_pages("zh_TW")) & set(lesson_pages("en")))
MODULE_PAGES = sorted(
    f"lessons/{p.parent.name}/index.html" for p in EXAMPLES.glob("en/*/README.txt")
)


class _Sections(HTMLParser):
    """The ids of a page's <section> elements, in order."""

    def __init__(self):
        super().__init__()
        self.ids = []

    def handle_starttag(self, tag, attrs):
        if tag == "section" and dict(attrs).get("id"):
            self.ids.append(dict(attrs)["id"])


def sections(site, lang: str, page: str) -> list[str]:
    parser = _Sections()
    parser.feed((site / lang / page).read_text("utf-8"))
    return parser.ids


# -------------------------------------------------------------------------------- anchors


def test_an_english_title_gives_the_id_docutils_gives_it():
    assert section_ids(["Setup", "Step 1 — insert a node", "Setup"]) == [
        "setup",
        "step-1-insert-a-node",
        "setup-2",
    ]
    assert page_source("en", "lessons/m00_graphs/m00_1_getting_a_graph").suffix == ".py"
    assert page_source("en", "course_map") is None


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("en/*/*.py")), ids=lambda p: p.stem)
def test_twins_have_as_many_sections(path):
    twin = EXAMPLES / "zh_TW" / path.relative_to(EXAMPLES / "en")
    en, zh = english_titles(path), english_titles(twin)
    assert len(en) == len(zh), f"{path.name}: {len(en)} sections in en, {len(zh)} in zh_TW"


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.parametrize("page", [p.as_posix() for p in TWINS] + MODULE_PAGES)
def test_zh_tw_sections_have_the_english_twins_ids(site, page):
    zh, en = sections(site, "zh_TW", page), sections(site, "en", page)
    assert zh == en, f"{page}: zh_TW {zh} != en {en}"
    assert not [i for i in zh if re.fullmatch(r"id\d+", i)], f"{page}: opaque ids {zh}"


# ----------------------------------------------------------------------- the helpers' lines


@pytest.mark.slow
@pytest.mark.xdist_group("site")
def test_zh_tw_pages_print_the_helpers_lines_in_chinese(site):
    english = ("timed with", "thread(s)", "interleaved rounds", "oneDNN int8 path", "median ms")
    printed_timings = 0
    for page in lesson_pages("zh_TW"):
        html = (site / "zh_TW" / page).read_text("utf-8")
        found = [phrase for phrase in english if phrase in html]
        assert not found, f"zh_TW/{page}: English helper lines {found}"
        printed_timings += "個執行緒計時" in html
    assert printed_timings >= 3, "the timed lessons print their header in Chinese"
    en = "".join((site / "en" / p).read_text("utf-8") for p in lesson_pages("en"))
    assert "timed with" in en and "個執行緒" not in en


# ---------------------------------------------------------------------------- in a browser


@pytest.mark.slow
@pytest.mark.xdist_group("site")
@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_copy_buttons_and_output_labels_speak_the_pages_language(browse, server, lang):
    from playwright.sync_api import expect

    words = {
        "zh_TW": ("複製", "複製到剪貼簿", "已複製！", '"輸出："'),
        "en": ("Copy", "Copy to clipboard", "Copied!", '"Out:"'),
    }[lang]
    page = browse()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    page.goto(f"{server}/{lang}/{TWINS[0].as_posix()}")
    button = page.locator("article.bd-article button.copybtn").first
    assert button.get_attribute("data-tooltip") == words[0]
    assert button.locator("svg title").text_content() == words[1]
    button.scroll_into_view_if_needed()
    button.hover()
    button.click()
    expect(button).to_have_attribute("data-tooltip", words[2])
    label = page.evaluate(
        "getComputedStyle(document.querySelector('.sphx-glr-script-out'), '::before').content"
    )
    assert label == words[3], f"{lang}: the output label is {label}"
