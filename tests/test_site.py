"""The built site: twins, downloads, course map, glossary, root files, and in headless Chromium
the language redirect, the switch, Chinese search, the pictures and no request leaving localhost.

The ``site`` fixture reuses build/html when a build there is newer than every source (as in CI,
which runs ``nox -s docs`` first); otherwise it builds both languages into a temporary folder.
PT2E_COURSE_SITE=<folder> tests a site built elsewhere as it is.
"""

import ast
import functools
import json
import os
import re
import shutil
import threading
import zipfile
from html.parser import HTMLParser
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import pytest
from built_site import QuietHandler
from lesson_scripts import NOTEBOOK_LESSON, ROOT, lessons
from marks import needs_dot

# tests/conftest.py (loaded first by pytest) puts docs/ on sys.path: course_conf is the site's
# shared Sphinx configuration, site_facts has the languages, the repository and the site URL,
# course_api the API page's modules.
import course_conf
from course_api import api_modules
from site_facts import LANGUAGES, PAGES_BRANCH

# One worker runs them all: they share the built site, its server and one Chromium.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("site")]

ARTIFACTS = Path(os.environ.get("PT2E_COURSE_ARTIFACTS", ROOT / "build" / "test-artifacts"))
TWIN = re.compile(r'<a class="nav-link course-language-switch" href="([^"]+)"')


# ------------------------------------------------------------------------------------- the site


def pages(site: Path, lang: str) -> list[Path]:
    """Every HTML page of one language, relative to its folder."""
    base = site / lang
    return sorted(
        p.relative_to(base)
        for p in base.rglob("*.html")
        if not p.relative_to(base).parts[0][0] == "_"
    )


def lesson_pages(lang: str) -> list[Path]:
    return [Path("lessons") / p.with_suffix(".html") for p in lessons(lang)]


# ----------------------------------------------------------------------------- static checks


class _Links(HTMLParser):
    """Collects the ids a page defines and the local links (href/src) it makes."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            value = attrs.get(key)
            if value and not urlparse(value).scheme and not value.startswith("//"):
                self.links.append(value)


def test_every_internal_link_and_anchor_resolves(site):
    parsed: dict[Path, _Links] = {}

    def parse(page: Path) -> _Links:
        if page not in parsed:
            parsed[page] = _Links()
            parsed[page].feed(page.read_text(encoding="utf-8"))
        return parsed[page]

    broken = []
    # Pages only: _static holds the theme's own template fragments, not pages.
    html_pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)
    assert len(html_pages) > 20
    for page in html_pages:
        if page.name == "404.html":  # its links are absolute site paths, checked in test_site_root
            continue
        for link in parse(page).links:
            parts = urlparse(link)  # drops ?v=... cache busters from the path
            path, anchor = unquote(parts.path), unquote(parts.fragment)
            target = (page.parent / path).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif anchor and target.suffix == ".html" and anchor not in parse(target).ids:
                broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:50])


@pytest.mark.parametrize("lang", LANGUAGES)
def test_lessons_keep_their_addresses_and_labels(site, lang):
    """One gallery per module changes no address: a lesson is lessons/<module>/<file>.html with
    the label sphx_glr_lessons_<module>_<file>.py, its module page lessons/<module>/index.html
    links it, and the lessons index lists every module page in course order."""

    def anchor(label: str) -> str:  # how Sphinx writes a label as an HTML id
        return re.sub(r"[_.]", "-", label)

    modules = course_conf.module_folders(lang)
    for relative in lessons(lang):
        page = site / lang / "lessons" / relative.with_suffix(".html")
        assert page.exists(), f"{lang}: no page for {relative}"
        label = f"sphx_glr_lessons_{relative.parent}_{relative.name}"
        assert f'id="{anchor(label)}"' in page.read_text("utf-8"), f"{page}: no {label}"
    index = (site / lang / "lessons" / "index.html").read_text("utf-8")
    for relative in lessons(lang):
        page = (site / lang / "lessons" / relative.parent / "index.html").read_text("utf-8")
        assert f'href="{relative.stem}.html' in page, f"{relative.parent}/index.html: no {relative}"
    listed = re.findall(r'href="([a-z][a-z0-9_]*)/index\.html"', index)
    assert list(dict.fromkeys(listed)) == modules, "the lessons index lists every module, in order"


def test_site_root(site):
    index = (site / "index.html").read_text("utf-8")
    for lang in LANGUAGES:
        assert f'href="{lang}/index.html"' in index, f"the root page has no plain link to {lang}/"
        assert (site / lang / "index.html").exists()
    site_path = urlparse(course_conf.SITE_URL).path
    not_found = (site / "404.html").read_text("utf-8")
    assert "/SITE_PATH/" not in not_found, "the build did not fill in the site path"
    for lang in LANGUAGES:
        assert f'href="{site_path}{lang}/index.html"' in not_found, f"404.html: no link to {lang}/"
    sitemap = (site / "sitemap.xml").read_text("utf-8")
    for lang in LANGUAGES:
        assert f"{course_conf.SITE_URL}{lang}/sitemap.xml" in sitemap


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_page_links_to_its_twin(site, lang):
    other = course_conf.other_language(lang)
    found = pages(site, lang)
    assert Path("index.html") in found and len(found) > 5, f"too few pages in {site / lang}"
    problems = []
    for page in found:
        twin = site / other / page
        if not twin.exists():
            problems.append(f"{lang}/{page}: no twin {other}/{page}")
            continue
        links = TWIN.findall((site / lang / page).read_text("utf-8"))
        if not links:
            problems.append(f"{lang}/{page}: no language switch")
        elif any((site / lang / page).parent.joinpath(href).resolve() != twin for href in links):
            problems.append(f"{lang}/{page}: the switch leads to {links[0]}, not {other}/{page}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_lessons_offer_downloads_and_colab(site, lang):
    assert lesson_pages(lang), f"no lessons in examples/{lang}"
    for page in lesson_pages(lang):
        html = (site / lang / page).read_text("utf-8")
        for suffix in (".py", ".ipynb"):
            name = re.escape(page.stem + suffix)
            hrefs = re.findall(rf'href="((?:\.\./)*_downloads/[0-9a-f]+/{name})"', html)
            assert hrefs, f"{lang}/{page} offers no {suffix} download"
            assert (site / lang / page).parent.joinpath(hrefs[0]).exists(), hrefs[0]
        colab = re.search(r'class="course-colab-link" href="([^"]+)"', html)
        assert colab, f"{lang}/{page} has no Open in Colab link"
        owner_repo = urlparse(course_conf.COURSE_REPOSITORY).path.strip("/")
        expected = f"https://colab.research.google.com/github/{owner_repo}/blob/"
        assert colab[1].startswith(expected) and colab[1].endswith(f"/{page.stem}.ipynb"), colab[1]
        # The link reads the notebook where the Pages workflow publishes this very folder.
        published = colab[1].split(f"/blob/{PAGES_BRANCH}/", 1)[1]
        assert (site / published).exists(), f"Colab would open {published}, not in the site"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_each_module_offers_a_zip_of_its_lessons(site, lang):
    modules = sorted({p.parts[0] for p in lessons(lang)})
    for module in modules:
        index = (site / lang / "lessons" / module / "index.html").read_text("utf-8")
        expected = {p.name for p in lessons(lang) if p.parts[0] == module}
        for kind, suffix in (("python", ".py"), ("jupyter", ".ipynb")):
            hrefs = re.findall(
                rf'href="((?:\.\./)*_downloads/[0-9a-f]+/{module}_{kind}\.zip)"', index
            )
            assert hrefs, f"{lang}/lessons/{module}/index.html offers no {kind} zip"
            archive = (site / lang / "lessons" / module).joinpath(hrefs[0])
            names = {Path(n).name for n in zipfile.ZipFile(archive).namelist()}
            assert names == {Path(e).with_suffix(suffix).name for e in expected}, archive


@pytest.mark.parametrize("lang", LANGUAGES)
def test_notebooks_start_with_the_colab_cell(site, lang):
    notebooks = sorted((ROOT / "docs" / lang / "lessons").rglob("m[0-9][0-9]_*.ipynb"))
    assert notebooks, "the gallery wrote no notebook"
    for notebook in notebooks:
        cells = json.loads(notebook.read_text("utf-8"))["cells"]
        first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert '"google.colab" in sys.modules' in first, f"{notebook.name}: no Colab cell first"
        assert f"git+{course_conf.COURSE_REPOSITORY}" in first, f"{notebook.name}: wrong repository"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_course_map_has_a_card_per_lesson(site, lang):
    html = (site / lang / "course_map.html").read_text("utf-8")
    for page in lesson_pages(lang):
        href = page.as_posix()
        assert f'href="{href}#' in html or f'href="{href}"' in html, (
            f"course map: no card for {href}"
        )
    thumbs = re.findall(r'<img[^>]+class="[^"]*sd-card-img-top[^"]*"', html)
    scripts = [
        script
        for module in course_conf.module_folders(lang)
        for script in (ROOT / "examples" / lang / module).glob("*.py")
    ]
    # A card shows its lesson's focus picture, where the lesson's key picture highlights nodes.
    assert len(scripts) // 2 <= len(thumbs) <= len(scripts), "most lesson cards show a picture"
    index = (site / lang / "index.html").read_text("utf-8")
    assert 'href="course_map.html"' in index, "the landing page links to the course map"


def test_module_pages_show_focus_pictures_or_no_picture(site):
    """sphinx-gallery shrinks a lesson's first picture, a whole graph, to 160 px on its module's
    page; the page shows the lesson's focus picture there instead, as the course map's cards
    do, or no picture (docs/course_gallery_tidy.py)."""
    for lang in LANGUAGES:
        focus = {p.read_bytes() for p in (site / lang / "_images").glob("*_focus.svg")}
        shown = 0
        for page in (site / lang / "lessons").glob("*/index.html"):
            for src in re.findall(r'<img[^>]+src="([^"]+_thumb\.\w+)"', page.read_text("utf-8")):
                thumb = (page.parent / src).resolve()
                assert thumb.read_bytes() in focus, f"{lang}/{page.parent.name}: {src} is not one"
                shown += 1
        cards = (site / lang / "course_map.html").read_text("utf-8").count("sd-card-img-top")
        assert shown == cards > 0, f"{lang}: {shown} thumbnails, {cards} course-map pictures"


# Per card picture of a page: its file and the rendered size of its smallest label, in CSS px.
# A Graphviz SVG's font sizes are in its viewBox's units; the card draws the picture scaled by
# object-fit (scale-down: to fit its content box, and never beyond its natural size).
CARD_PICTURES = """async () => {
    const out = [];
    for (const img of document.querySelectorAll('.course-card img.sd-card-img-top')) {
        await img.decode();
        const svg = await (await fetch(img.src)).text();
        const [, , width, height] = svg.match(/viewBox="([^"]+)"/)[1].split(/\\s+/).map(Number);
        const fonts = [...svg.matchAll(/<text[^>]*font-size="([\\d.]+)"/g)].map(m => +m[1]);
        const style = getComputedStyle(img);
        const pad = side => parseFloat(style['padding' + side]);
        const boxWidth = img.clientWidth - pad('Left') - pad('Right');
        const boxHeight = img.clientHeight - pad('Top') - pad('Bottom');
        const scale = Math.min(img.naturalWidth / width, boxWidth / width, boxHeight / height);
        out.push({src: img.src.split('/').pop(), px: Math.min(...fonts) * scale});
    }
    return out;
}"""


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_card_pictures_are_focus_pictures_with_readable_labels(browse, server, lang):
    """The landing page's module cards and the course map's lesson cards show focus pictures
    (a lesson's highlighted nodes and their neighbours, common.viz.focus_svg), never a whole
    graph, with every label at least 8 px high as the card draws it (a whole graph shrunk to a
    card drew them at 1 to 9 px)."""
    page = browse()
    for path in ("index.html", "course_map.html"):
        page.goto(f"{server}/{lang}/{path}")
        pictures = page.evaluate(CARD_PICTURES)
        assert pictures, f"{lang}/{path}: no card shows a picture"
        for picture in pictures:
            assert picture["src"].endswith("_focus.svg"), f"{lang}/{path}: {picture['src']}"
            assert picture["px"] >= 8, (
                f"{lang}/{path}: {picture['src']} labels {picture['px']:.1f} px"
            )


def glossary_entries(site: Path, lang: str) -> list[str]:
    """Per glossary entry, the lesson page it links to ('' when it links to none)."""
    html = (site / lang / "glossary.html").read_text("utf-8")
    entries = re.findall(r"<dd>(.*?)</dd>", html, flags=re.S)
    return [next(iter(re.findall(r'href="(lessons/[^"#]+)', dd)), "") for dd in entries]


def test_glossary_pairs_every_term_with_its_lesson(site):
    entries = {lang: glossary_entries(site, lang) for lang in LANGUAGES}
    for lang, links in entries.items():
        assert len(links) >= 40, f"{lang} glossary has {len(links)} terms, fewer than 40"
        missing = re.findall(
            r'lesson-missing">([^<]+)<', (site / lang / "glossary.html").read_text("utf-8")
        )
        assert not missing, (
            f"{lang} glossary names lessons that do not exist yet: {sorted(set(missing))}"
        )
        assert all(links), f"{lang} glossary: an entry links to no lesson"
    first, *others = entries.values()
    for other in others:
        assert other == first, "both glossaries list the same terms with the same lessons, in order"


# ---------------------------------------------------------------------------- in a real browser


@pytest.mark.browser
@pytest.mark.parametrize(("locale", "lang"), [("en-US", "en"), ("zh-TW", "zh_TW")])
def test_root_sends_the_reader_to_their_language(browse, server, locale, lang):
    page = browse(locale)
    page.goto(f"{server}/")
    page.wait_for_url(f"{server}/{lang}/index.html")
    assert page.locator("h1").first.is_visible()


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_switch_on_a_lesson_lands_on_its_twin_in_the_same_section(browse, server, lang):
    other = course_conf.other_language(lang)
    # (A lesson without a twin fails test_every_page_links_to_its_twin already.)
    lesson = sorted(set(lesson_pages(lang)) & set(lesson_pages(other)))[-1].as_posix()
    page = browse()
    page.goto(f"{server}/{lang}/{lesson}")
    page.locator("a.course-language-switch:visible").first.click()
    page.wait_for_url(f"{server}/{other}/{lesson}")
    assert page.locator("a.course-language-switch:visible").count() >= 1
    # From a section, the switch lands on the same section: the twins' ids are equal.
    section = page.locator("article section[id] section[id]").last.get_attribute("id")
    page.goto(f"{server}/{other}/{lesson}#{section}")
    page.locator("a.course-language-switch:visible").first.click()
    page.wait_for_url(f"{server}/{lang}/{lesson}#{section}")
    assert page.locator(f"article section[id='{section}']").count() == 1, "the twin has the section"


@pytest.mark.browser
@pytest.mark.parametrize(
    ("lang", "query"), [("zh_TW", "量化"), ("zh_TW", "校準"), ("en", "observer")]
)
def test_search_finds_lessons(browse, server, lang, query):
    page = browse()
    page.goto(f"{server}/{lang}/search.html?q={quote(query)}")
    # Sphinx lists the results one by one and retitles the list when it has finished.
    page.wait_for_function(
        "typeof Search !== 'undefined' && Search.title?.innerText"
        " === Documentation.gettext('Search Results')",
        timeout=20_000,
    )
    results = page.locator("#search-results ul.search li a")
    hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
    assert any("lessons/" in (href or "") for href in hrefs), f"{query!r} found no lesson: {hrefs}"
    # A snippet is the lesson's own text, not sphinx-gallery's download note or the license.
    snippets = page.locator("#search-results ul.search li p.context").all_inner_texts()
    for snippet in snippets:
        assert "Go to the end" not in snippet and "SPDX" not in snippet, snippet


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_screenshots_and_no_third_party_request(browse, server, lang):
    """Visit the main kinds of page; browse() fails the test if any request left localhost."""
    folder = ARTIFACTS / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page = browse("zh-TW" if lang == "zh_TW" else "en-US")
    lesson = lesson_pages(lang)[-1].as_posix()
    for name, path in [("landing", "index.html"), ("lesson", lesson)]:
        page.goto(f"{server}/{lang}/{path}", wait_until="networkidle")
        page.screenshot(path=folder / f"{lang}-{name}.png", full_page=name == "landing")
    for path in ("course_map.html", "glossary.html", "lessons/index.html", "search.html?q=graph"):
        page.goto(f"{server}/{lang}/{path}", wait_until="networkidle")
    assert (folder / f"{lang}-lesson.png").stat().st_size > 10_000


# --------------------------------------------------------------------------- a real notebook


def test_a_downloaded_notebook_runs(site, tmp_path):
    """Execute the quickstart's notebook, as downloaded, with a Jupyter kernel."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    first = NOTEBOOK_LESSON
    found = sorted((site / "en" / "_downloads").glob(f"*/{first.stem}.ipynb"))
    assert found, f"the site offers no {first.stem}.ipynb"
    notebook = nbformat.read(shutil.copy(found[0], tmp_path / found[0].name), as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, if a cell fails
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not code[0].outputs, "the Colab cell does nothing outside Colab"
    stderr = [
        "".join(out.get("text", ""))
        for cell in code
        for out in cell.outputs
        if out.output_type == "stream" and out.name == "stderr"
    ]
    assert not stderr, "the notebook wrote to stderr:\n" + "\n".join(stderr)[:2000]
    pictures = [
        out for cell in code for out in cell.outputs if "image/svg+xml" in out.get("data", {})
    ]
    assert pictures, "draw() shows its pictures inline in Jupyter"


# ------------------------------------------------- API page, code links, copy buttons (#16)

API_LINK = re.compile(r'<a [^>]*href="((?:\.\./)*api\.html#(common\.[\w.]+))"')


def api_entries(site: Path, lang: str) -> dict[str, str]:
    """The API page's documented objects: id ("common.viz.draw") -> the HTML of its entry."""
    html = (site / lang / "api.html").read_text("utf-8")
    parts = re.split(r'<dt class="sig sig-object py" id="(common\.[\w.]+)">', html)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def lessons_calling(lang: str, name: str) -> set[str]:
    """The lesson pages (as "lessons/<module>/<lesson>.html") whose code calls ``name(...)``.

    Read from the syntax tree: exercise solutions sit in comments and the source a page runs in
    a subprocess sits in a string; the build sees neither as the lesson's calls.
    """

    def calls(source: str) -> bool:
        return any(
            isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
            for node in ast.walk(ast.parse(source))
        )

    return {
        page.as_posix()
        for page, script in zip(lesson_pages(lang), lessons(lang), strict=True)
        if calls((ROOT / "examples" / lang / script).read_text("utf-8"))
    }


@pytest.mark.parametrize("lang", LANGUAGES)
def test_lesson_code_links_common_names_to_the_api_page(site, lang):
    entries = api_entries(site, lang)
    linked = set()
    for page in lesson_pages(lang):
        for href, target in API_LINK.findall((site / lang / page).read_text("utf-8")):
            assert target in entries, f"{lang}/{page}: {href} leads to no entry of the API page"
            linked.add(target)
    for name in ("common.models.get_model", "common.pt2e.export_module", "common.viz.draw"):
        assert name in linked, f"no {lang} lesson's code links {name} to the API page"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_api_page_lists_the_lessons_that_use_each_function(site, lang):
    entries = api_entries(site, lang)
    page = (site / lang / "api.html").read_text("utf-8")
    for module in api_modules():  # every module of common/, those the lessons import among them
        assert f'id="module-{module}"' in page, f"the API page has no section for {module}"
    assert "Define the computation performed at every call" not in page, "nn.Module's docstring"
    assert "<img" not in page.split('<article class="bd-article">', 1)[1], "the page lists titles"
    for name in ("common.viz.draw", "common.models.get_model", "common.pt2e.calibrate"):
        listed = set(re.findall(r'href="(lessons/[^"#]+\.html)[#"]', entries[name]))
        expected = lessons_calling(lang, name.rsplit(".", 1)[1])
        assert expected, f"no {lang} lesson calls {name}: pick another example for this test"
        assert listed == expected, f"{lang} API page, {name}: lists {listed}, not {expected}"
    index = (site / lang / "index.html").read_text("utf-8")
    top_bar = r'<a class="nav-link[^"]*" href="api.html"'
    assert re.search(top_bar, index), "the top bar links the API page"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_sitemaps_list_every_page_with_its_twin(site, lang):
    sitemap = (site / lang / "sitemap.xml").read_text("utf-8")
    base = re.escape(f"{course_conf.SITE_URL}{lang}/")
    listed = set(re.findall(rf"<loc>{base}([^<]+)</loc>", sitemap))
    expected = {p.as_posix() for p in pages(site, lang)} - {"search.html", "genindex.html"}
    assert listed == expected
    other = course_conf.other_language(lang)
    assert sitemap.count(f'href="{course_conf.SITE_URL}{other}/') == len(expected)


# ------------------------------------------ pictures, charts and accessibility (issue #14)

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
DTYPE = re.compile(r"\b(?:float(?:16|32|64)|bfloat16|u?int(?:8|16|32|64)|bool)\[")
PAGE_KINDS = [
    "landing",
    "course-map",
    "glossary",
    "fx-article",
    "lessons",
    "module",
    "lesson",
    "search",
]


def page_of_kind(lang: str, kind: str) -> str:
    """One page of each kind the site has, relative to the language's folder."""
    module = lesson_pages(lang)[0].parts[1]
    return {
        "landing": "index.html",
        "course-map": "course_map.html",
        "glossary": "glossary.html",
        "fx-article": "fx_basics.html",
        "lessons": "lessons/index.html",
        "module": f"lessons/{module}/index.html",
        "lesson": lesson_pages(lang)[-1].as_posix(),
        "search": f"search.html?q={quote('量化' if lang == 'zh_TW' else 'graph')}",
    }[kind]


def settle(page) -> None:
    """Wait for the fonts and for the theme's tab stops on scrolling code, measured after them.

    docs/_static/course-a11y.js asks the theme to measure again once the fonts are in; the
    theme waits 300 ms (debounce) before it does.
    """
    fonts_loaded(page)
    page.evaluate("new Promise(done => setTimeout(done, 400))")


def fonts_loaded(page) -> None:
    """Wait for the page's fonts: a line's width, hence whether a block scrolls, depends on them."""
    page.evaluate("document.fonts.ready.then(() => true)")


@pytest.fixture(scope="session")
def axe() -> Path:
    if not AXE.exists():
        pytest.fail(f"axe-core is missing ({AXE}): run `npm ci` in {ROOT} (nox -s tests does)")
    return AXE


@pytest.mark.browser
@pytest.mark.parametrize("kind", PAGE_KINDS)
@pytest.mark.parametrize("lang", LANGUAGES)
def test_axe_finds_no_serious_accessibility_violation(browse, server, axe, lang, kind):
    page = browse("zh-TW" if lang == "zh_TW" else "en-US")
    path = page_of_kind(lang, kind)
    page.goto(f"{server}/{lang}/{path}")  # settle() below waits for what comes after load
    if kind == "search":
        page.wait_for_function(
            "typeof Search !== 'undefined' && Search.title?.innerText"
            " === Documentation.gettext('Search Results')",
            timeout=20_000,
        )
    settle(page)
    page.add_script_tag(path=str(axe))
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    serious = [v for v in result["violations"] if v["impact"] in ("serious", "critical")]
    report = [
        f"{v['impact']} {v['id']}: {v['help']} ({len(v['nodes'])}x, "
        f"e.g. {v['nodes'][0]['html'][:200]})"
        for v in serious
    ]
    assert not serious, f"{lang}/{path}:\n" + "\n".join(report)


def test_section_navigation_toggles_are_named_after_their_entry():
    from course_a11y import label_toggles

    markup = (
        '<li><a aria-current="page" class="current reference internal" href="#">M00 '
        '<code>fx</code> &amp; graphs</a><details open="open"><summary><span></span></summary>'
        '<ul><li><a class="reference internal" href="a.html">M00-1</a></li></ul></details></li>'
        '<li><a class="reference internal" href="m01.html">M01</a><details><summary><span>'
    )
    labelled = label_toggles(markup, "zh_TW")
    assert re.findall(r'<summary aria-label="([^"]*)">', labelled) == [
        "M00 fx &amp; graphs 的頁面",
        "M01 的頁面",
    ]
    assert 'aria-label="Pages in M01"' in label_toggles(markup, "en")


def inline_pictures(page):
    return page.locator("article.bd-article svg.course-graph")


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_hovering_a_node_in_a_lesson_picture_shows_its_tooltip_with_a_dtype(browse, server, lang):
    page = browse()
    for lesson in lesson_pages(lang):
        page.goto(f"{server}/{lang}/{lesson.as_posix()}")
        if inline_pictures(page).count():
            break
    else:
        pytest.fail(f"no {lang} lesson shows an inline graph picture")
    graph_images = page.locator("article.bd-article img[src*='sphx_glr_'][src$='.svg']")
    assert graph_images.count() == 0, "a graph shown through <img> shows no tooltip"
    nodes = inline_pictures(page).first.locator("g.node")
    titles = [nodes.nth(i).locator("title").first.text_content() for i in range(nodes.count())]
    index = next((i for i, title in enumerate(titles) if DTYPE.search(title)), None)
    assert index is not None, f"{lang}/{lesson}: no node tooltip has a dtype: {titles}"
    node = nodes.nth(index)
    node.scroll_into_view_if_needed()
    node.hover()
    # The tooltip a browser shows is the <title> of the innermost hovered element that has one.
    shown = page.evaluate(
        """() => [...document.querySelectorAll('svg.course-graph :hover')].reverse()
                .find(el => el.querySelector(':scope > title'))
                ?.querySelector(':scope > title').textContent"""
    )
    assert shown and DTYPE.search(shown), f"{lang}/{lesson}: hovering shows {shown!r}"
    folder = ARTIFACTS / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    inline_pictures(page).first.screenshot(path=folder / f"{lang}-graph-hovered.png")


def chart_images(page):
    return page.locator("article.bd-article img[src*='sphx_glr_'][src$='.png']")


def check_charts(charts: list[dict], where: str, chinese: bool) -> None:
    """Every chart (as LESSON_PAGE reads them) is loaded, not empty, and in Chinese labelled in
    Chinese."""
    for i, chart in enumerate(charts):
        assert chart["sized"] and chart["loaded"], f"{where}: chart {i} is empty"
        if chinese and chart["alt"]:
            assert re.search(r"[\u4e00-\u9fff]", chart["alt"]), f"{where}: chart {i}"


# What a lesson page shows, read in one call per page (a call per element costs a round trip
# to the browser each: a dozen pictures on thirty-two pages made these checks take a minute).
LESSON_PAGE = """() => {
    const article = document.querySelector('article.bd-article');
    const sized = el => {
        const box = el.getBoundingClientRect();
        return box.width > 0 && box.height > 0;
    };
    const loaded = el => el.tagName !== 'IMG' || (el.complete && el.naturalWidth > 0);
    return {
        theme: document.documentElement.dataset.theme,
        pictures: [...article.querySelectorAll('img, svg')].map(
            el => ({sized: sized(el), loaded: loaded(el)})),
        graphs: [...article.querySelectorAll('svg.course-graph')].map(el => ({
            role: el.getAttribute('role'),
            label: el.getAttribute('aria-label') || '',
            ground: el.querySelector('g.graph > polygon')?.getAttribute('fill'),
            filter: getComputedStyle(el).filter,
        })),
        charts: [...article.querySelectorAll("img[src*='sphx_glr_'][src$='.png']")].map(
            el => ({sized: sized(el), loaded: loaded(el), alt: el.getAttribute('alt') || ''})),
    };
}"""


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_lesson_pages_draw_every_picture_and_chart_readably_in_dark_mode(browse, server, lang):
    """Every picture and chart of every lesson page is loaded and has a size; each graph picture
    has a text alternative and keeps its white ground in dark mode; Chinese charts speak Chinese.

    The build itself fails a chart whose characters its fonts cannot draw (common.gallery).
    """
    page = browse()
    page.emulate_media(color_scheme="dark")  # the theme's default mode follows the system
    words = "個 node 的圖" if lang == "zh_TW" else "A graph of"
    for lesson in lesson_pages(lang):
        where = f"{lang}/{lesson}"
        page.goto(f"{server}/{lang}/{lesson.as_posix()}")  # returns once the images are loaded
        shown = page.evaluate(LESSON_PAGE)
        assert shown["theme"] == "dark", where
        assert shown["pictures"], f"{where}: no picture"
        for i, picture in enumerate(shown["pictures"]):
            assert picture["sized"], f"{where}: picture {i} is empty"
            assert picture["loaded"], f"{where}: picture {i} did not load"
        for i, graph in enumerate(shown["graphs"]):
            assert graph["role"] == "img", f"{where} #{i}: not role=img"
            assert words in graph["label"], f"{where} #{i}: no text alternative"
            # Dark mode keeps the picture's own white ground under its dark text, dimmed a
            # little as the theme dims images.
            assert graph["ground"] == "white", f"{where} #{i}: ground {graph['ground']}"
            assert "brightness" in graph["filter"], f"{where} #{i}: not dimmed"
        check_charts(shown["charts"], where, chinese=lang == "zh_TW")
    picture = inline_pictures(page).first
    picture.scroll_into_view_if_needed()
    folder = ARTIFACTS / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=folder / f"{lang}-lesson-dark.png")


PICTURES_LESSON = '''\
"""
Pictures
========

A graph diff in each language, and a chart with Chinese labels.
"""

import copy

import matplotlib.pyplot as plt

from common.charts import use_course_style
from common.models import example_inputs, get_model
from common.pt2e import export_module
from common.viz import draw_diff

use_course_style()
gm = export_module(get_model("conv_relu"), example_inputs(1))
before = copy.deepcopy(gm)
relu = next(node for node in gm.graph.nodes if node.name == "relu")
relu.replace_all_uses_with(relu.args[0])
gm.graph.erase_node(relu)
gm.recompile()
draw_diff(before, gm, title="Step 6: relu removed")
draw_diff(before, gm, title="步驟 6：移除 relu")

# %%
# A chart
# -------

figure, axes = plt.subplots(figsize=(4, 3))
axes.bar(["量化前", "量化後"], [4.0, 1.0])
axes.set_title("模型大小")
'''


@pytest.fixture(scope="module")
def pictures_site(tmp_path_factory) -> Path:
    """A one-lesson English site whose lesson draws two graph diffs and a chart."""
    from built_site import make_site, sphinx_build

    root = make_site(
        tmp_path_factory.mktemp("pictures"), {"m99_fixture/m99_1_pictures.py": PICTURES_LESSON}
    )
    result = sphinx_build(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "build" / "html"


@pytest.mark.browser
@needs_dot
def test_a_diff_picture_shows_its_legend_in_the_title_language(chromium, pictures_site):
    httpd = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=pictures_site)
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        port = httpd.server_address[1]
        page.goto(f"http://127.0.0.1:{port}/en/lessons/m99_fixture/m99_1_pictures.html")
        pictures = inline_pictures(page)
        assert pictures.count() == 2
        legends = [
            ["+ added", "− removed", "→ rewired edge"],
            ["+ 新增的 node", "− 移除的 node", "→ 改接的邊"],
        ]
        for i, legend in enumerate(legends):
            texts = pictures.nth(i).locator("text")
            shown = {
                texts.nth(j).text_content(): texts.nth(j).bounding_box()
                for j in range(texts.count())
            }
            for word in legend:
                box = shown.get(word)
                assert box and box["width"] > 0, f"picture {i}: legend {word!r} not drawn"
            ghosts = pictures.nth(i).locator("g.node title", has_text=legend[1])
            assert ghosts.count() == 1, "the removed relu is drawn, ghosted"
        folder = ARTIFACTS / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        pictures.nth(1).screenshot(path=folder / "fixture-diff-zh_TW.png")
        charts = page.evaluate(LESSON_PAGE)["charts"]
        assert len(charts) == 1, "the fixture draws one chart"
        check_charts(charts, "fixture", chinese=True)
        chart_images(page).first.screenshot(path=folder / "fixture-chart-zh_TW.png")
    finally:
        context.close()
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_copy_button_copies_exactly_the_code(browse, server, lang):
    page = browse()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    page.goto(f"{server}/{lang}/{lesson_pages(lang)[-1].as_posix()}")
    blocks = page.locator("article.bd-article div.highlight-Python:has(button.copybtn)")
    assert blocks.count() > 3, "every code cell has a copy button"
    outputs = page.locator(".sphx-glr-script-out button.copybtn")
    assert outputs.count() == 0, "output blocks have no copy button"
    for i in range(3):
        block = blocks.nth(i)
        block.scroll_into_view_if_needed()
        block.hover()
        block.locator("button.copybtn").click()
        copied = page.evaluate("navigator.clipboard.readText()")
        shown = block.locator("pre").inner_text()
        assert copied.rstrip("\n") == shown.rstrip("\n"), f"{lang}: block {i} copies other text"


def test_theme_speaks_traditional_chinese_on_zh_tw_pages(site):
    """The theme's strings come from docs/locale/zh_TW/LC_MESSAGES/sphinx.po, not its zh catalog."""
    page = lesson_pages("zh_TW")[-1]
    html = (site / "zh_TW" / page).read_text("utf-8")
    pairs = (("Skip to main content", "跳到主要內容"), ("On this page", "本頁內容"))
    for english, chinese in pairs:
        assert chinese in html and english not in html, f"zh_TW/{page}: {english!r} untranslated"
    assert "当前" not in html, f"zh_TW/{page}: Simplified Chinese from the theme's own catalog"


# ------------------------------------------- readable graphs, code that fits, front door (#34)

DESKTOP = {"width": 1366, "height": 900}
PHONE = {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True}

# Per graph of a lesson page: its rendered width over its own (the SVG's width attribute); for
# each one shown below half its size, a click on it and the width of the copy the viewer opens.
GRAPH_SIZES = """() => [...document.querySelectorAll('article.bd-article svg.course-graph')].map(
    svg => {
        const natural = svg.width.baseVal.value;
        const shown = svg.getBoundingClientRect().width / natural;
        if (shown >= 0.5) return {shown, opened: null};
        svg.dispatchEvent(new MouseEvent('click', {bubbles: true}));
        const copy = document.querySelector('dialog.course-graph-viewer[open] svg');
        const opened = copy ? copy.getBoundingClientRect().width / natural : 0;
        document.querySelector('dialog.course-graph-viewer')?.close();
        return {shown, opened};
    })"""


def report(name: str, line: str) -> None:
    """Keep a measurement of the site where the reader of the test run finds it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / f"{name}.txt", "a", encoding="utf-8") as out:
        out.write(line + "\n")
    print(line)


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_lesson_graph_is_readable_at_half_its_size_or_opens_full_size(browse, server, lang):
    """At 1366 px, a graph squeezed below half its own size opens at full size when clicked."""
    page = browse(viewport=DESKTOP)
    shown, small = [], []
    for lesson in lesson_pages(lang):
        page.goto(f"{server}/{lang}/{lesson.as_posix()}")
        sizes = page.evaluate(GRAPH_SIZES)
        for i, size in enumerate(sizes):
            shown.append((size["shown"], lesson, i))
            if size["opened"] is not None:
                small.append(f"{lesson.stem} #{i}: {size['shown']:.0%}")
                assert size["opened"] == pytest.approx(1, abs=0.01), (
                    f"{lang}/{lesson} graph {i}: shown at {size['shown']:.0%}, opened at "
                    f"{size['opened']:.0%} of its size"
                )
    assert shown, f"no {lang} lesson shows a graph"
    report(
        "graphs",
        f"{lang}: {len(shown)} graphs at 1366 px, {len(small)} shown below 50 % of their size, "
        f"each opened full size by a click: {', '.join(small)}",
    )
    # The smallest once more with a real click, then the keyboard's way: the button, Escape.
    _, lesson, index = min(shown, key=lambda found: found[0])
    page.goto(f"{server}/{lang}/{lesson.as_posix()}")
    graph = inline_pictures(page).nth(index)
    graph.scroll_into_view_if_needed()
    graph.click(position={"x": 2, "y": 2})
    viewer = page.locator("dialog.course-graph-viewer")
    assert viewer.evaluate("d => d.open")
    width = page.evaluate(
        "() => document.querySelector('dialog[open] svg').getBoundingClientRect().width"
    )
    natural = graph.evaluate("svg => svg.width.baseVal.value")
    assert width == pytest.approx(natural, rel=0.01), "the click opens the graph at its own size"
    page.keyboard.press("+")
    zoomed = page.evaluate(
        "() => document.querySelector('dialog[open] svg').getBoundingClientRect().width"
    )
    assert zoomed > width * 1.2, "+ zooms in"
    page.keyboard.press("Escape")
    assert not viewer.evaluate("d => d.open"), "Escape closes the viewer"
    opener = page.locator(".course-graph-open").nth(index).element_handle()
    # The dialog's close event gives the focus back, a turn of the event loop after Escape (a
    # check made at once failed once in a full run): wait for it, the way a reader's next key does.
    page.wait_for_function("b => b === document.activeElement", arg=opener, timeout=5_000)
    opener.press("Enter")
    assert viewer.evaluate("d => d.open"), "the button opens the graph from the keyboard"
    page.keyboard.press("Tab")
    info = page.locator(".course-graph-viewer__info").inner_text()
    assert DTYPE.search(info) or page.evaluate("() => !!document.activeElement.closest('g.node')")


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_tap_on_a_node_shows_its_tooltip_on_a_phone(browse, server, lang):
    """Touch screens never show an SVG <title>: a tap on a node opens the graph full size with
    that node's tooltip shown, and a tap on another node there shows that one's."""
    page = browse(**PHONE)
    for lesson in lesson_pages(lang):
        page.goto(f"{server}/{lang}/{lesson.as_posix()}")
        if inline_pictures(page).count():
            break
    graph = inline_pictures(page).first
    nodes = graph.locator("g.node")
    titles = [nodes.nth(i).locator("title").first.text_content() for i in range(nodes.count())]
    typed = [i for i, title in enumerate(titles) if DTYPE.search(title)]
    assert len(typed) >= 2, f"{lang}/{lesson}: fewer than two nodes with a dtype"
    nodes.nth(typed[0]).scroll_into_view_if_needed()
    nodes.nth(typed[0]).tap()
    info = page.locator(".course-graph-viewer__info")

    def words(text: str) -> list[str]:
        return text.split()

    assert words(info.inner_text()) == words(titles[typed[0]]), "the tapped node's tooltip"
    # The whole graph in the window, then a tap on another node of it.
    page.locator(".course-graph-viewer__bar button", has_text=re.compile("^(Fit|整張)$")).tap()
    box = page.locator(".course-graph-viewer__stage g.node").nth(typed[1]).bounding_box()
    page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert words(info.inner_text()) == words(titles[typed[1]]), "a tap in the viewer shows another"
    folder = ARTIFACTS / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=folder / f"{lang}-phone-graph-viewer.png")


# Per code or output block of a lesson page: does it scroll sideways, is it an output.
CODE_BLOCKS = """() => [...document.querySelectorAll('article.bd-article div.highlight pre')].map(
    pre => ({wide: pre.scrollWidth > pre.clientWidth + 1,
             output: !!pre.closest('.sphx-glr-script-out, div.output'),
             line: pre.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b)}))"""


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_code_and_output_fit_the_column_at_1366_px(browse, server, lang):
    """At most 5 % of a lesson page's code and output blocks scroll sideways at 1366 px, and no
    output does: an assert message or a printed line is never cut."""
    page = browse(viewport=DESKTOP)
    blocks, scrolling, outputs = 0, [], []
    for lesson in lesson_pages(lang):
        page.goto(f"{server}/{lang}/{lesson.as_posix()}")
        fonts_loaded(page)  # not the theme's tab stops (settle): widths are all this reads
        for block in page.evaluate(CODE_BLOCKS):
            blocks += 1
            if block["wide"]:
                scrolling.append(f"{lesson.stem}: {block['line'][:120]}")
                if block["output"]:
                    outputs.append(scrolling[-1])
    report(
        "code-blocks",
        f"{lang}: {len(scrolling)} of {blocks} code and output blocks scroll sideways at 1366 px "
        f"({len(scrolling) / blocks:.1%})",
    )
    assert not outputs, "outputs cut at 1366 px:\n" + "\n".join(outputs)
    assert len(scrolling) <= 0.05 * blocks, "blocks that scroll:\n" + "\n".join(scrolling)


# Whatever pushes a page wider than the phone: elements wider than the window that are not
# inside a box that scrolls on its own (a code block, a table's container, the viewer).
PAGE_OVERFLOW = """() => {
    const width = document.documentElement.clientWidth;
    const inScroller = el => {
        for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
            const style = getComputedStyle(p);
            if (['auto', 'scroll'].includes(style.overflowX) || p.tagName === 'PRE') return true;
        }
        return false;
    };
    const wide = [...document.querySelectorAll('article.bd-article *')].filter(el => {
        const box = el.getBoundingClientRect();
        return box.right > width + 1 && !inScroller(el) && box.width > 0;
    });
    return {scroll: document.documentElement.scrollWidth, width,
            wide: wide.slice(0, 3).map(el => el.outerHTML.slice(0, 160))};
}"""


@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_no_page_is_wider_than_a_phone(browse, server, lang):
    """On a 390 px phone no page scrolls sideways: wide tables and code scroll in their own box,
    long inline code (in headings too) wraps, and the results table keeps its lesson column."""
    page = browse(**PHONE)
    problems = []
    for path in ["index.html", *(p.as_posix() for p in lesson_pages(lang))]:
        page.goto(f"{server}/{lang}/{path}")
        found = page.evaluate(PAGE_OVERFLOW)
        if found["scroll"] > found["width"] or found["wide"]:
            problems.append(f"{path}: {found['scroll']} px > {found['width']}: {found['wide']}")
    assert not problems, "\n".join(problems)
    page.goto(f"{server}/{lang}/index.html")
    table = page.locator("table.course-results")
    lesson = table.locator("tbody tr td:nth-child(3) a").first
    lesson.scroll_into_view_if_needed()
    box, frame = lesson.bounding_box(), page.viewport_size
    assert box and 0 <= box["x"] and box["x"] + box["width"] <= frame["width"], (
        "the results table's lesson column is on screen once scrolled to"
    )


@pytest.mark.browser
@pytest.mark.parametrize("viewport", [DESKTOP, PHONE["viewport"]], ids=["desktop", "phone"])
@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_landing_page_starts_with_the_quickstart(browse, server, lang, viewport):
    """Above the fold, the article's first control is the way to the quickstart; the tab names
    the site once, the page has one viewport, and the theme logs no error."""
    page = browse(viewport=viewport)
    errors = []
    # (Not the browser's own request for /favicon.ico, which the site does not have.)
    page.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    page.goto(f"{server}/{lang}/index.html", wait_until="networkidle")
    controls = "article.bd-article :is(a[href]:not(.headerlink), button):visible"
    first = page.locator(controls).first
    assert first.get_attribute("href").endswith("lessons/quickstart/quickstart.html"), (
        f"the article's first control leads to {first.get_attribute('href')}"
    )
    box = first.bounding_box()
    assert box["y"] + box["height"] <= viewport["height"], "the quickstart link is above the fold"
    title = page.title()
    name = course_conf.TEXT[lang]["project"]
    assert title.count(name) == 1, f"the tab says {title!r}"
    assert page.locator('meta[name="viewport"]').count() == 1, "one viewport meta"
    caption = page.locator("table.course-results caption").inner_text().strip()
    headings = [h.strip() for h in page.locator("article h2").all_inner_texts()]
    assert caption and all(caption not in h and h not in caption for h in headings if h), (
        f"the table's caption repeats a heading: {caption!r}"
    )
    report_link = page.locator("a.course-report-link")
    assert report_link.count() == 1, "the report link is still on the page"
    assert not errors, f"console errors: {errors}"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_lesson_pages_open_on_their_title_and_paragraph(site, lang):
    """No download note above the title, no cell holding only the license comment: the page's
    text (and so its search snippet) starts with its title and its own paragraph."""
    for page in lesson_pages(lang):
        html = (site / lang / page).read_text("utf-8")
        article = html.split('<article class="bd-article">', 1)[1]
        assert "sphx-glr-download-link-note" not in html, f"{lang}/{page}: the download note"
        assert "SPDX-License-Identifier" not in article, f"{lang}/{page}: the license cell"
        first_text = re.search(r"<(h1|p|pre)\b", article)
        assert first_text and first_text[1] == "h1", f"{lang}/{page} opens with <{first_text[1]}>"


def test_build_by_products_are_not_published(site):
    assert not (site / "jupyter_execute").exists(), "myst-nb's executed notebooks"
    for lang in LANGUAGES:
        assert not (site / lang / "webpack-macros.html").exists(), "the theme's macros"
        assert not (site / lang / "_static" / "webpack-macros.html").exists()
