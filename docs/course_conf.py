"""Sphinx configuration shared by the per-language builds (docs/<lang>/conf.py)."""

import ast
import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path
from urllib.parse import urlparse
from xml.sax.saxutils import escape

from languages import LANGUAGES

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

# ---------------------------------------------------------------------------------------------
# THE ONE SETTING TO CHANGE when the course moves: its public repository.
# The notebooks' first cell pip-installs the course from it when they run in Google Colab, the
# "Open in Colab" links read the published notebooks from its gh-pages branch, and the site's
# address (GitHub Pages) is derived from it.
COURSE_REPOSITORY = "https://github.com/pt2e-course/pt2e-course"
# ---------------------------------------------------------------------------------------------

# The branch .github/workflows/pages.yml publishes build/html to (Colab opens notebooks from it).
PAGES_BRANCH = "gh-pages"
_OWNER, _REPO = urlparse(COURSE_REPOSITORY).path.strip("/").split("/")[:2]
# Read the Docs tells its build where the site will live; elsewhere it is GitHub Pages.
SITE_URL = (
    os.environ.get("READTHEDOCS_CANONICAL_URL") or f"https://{_OWNER.lower()}.github.io/{_REPO}/"
)
SITE_URL = SITE_URL.rstrip("/") + "/"

TEXT = {
    "zh_TW": {
        "project": "PT2E 量化：從圖開始",
        "short_title": "PT2E 量化：從圖開始",
        "gallery_title": "課程",
        "language_name": "繁體中文",
        "hreflang": "zh-Hant-TW",
        "switch_title": "閱讀本頁的繁體中文版",
        "colab": "在 Colab 開啟",
        "colab_title": "在 Google Colab 執行本課的筆記本",
        "module_zip": "下載本單元的全部課程",
        "module_zip_python": "Python 腳本",
        "module_zip_jupyter": "Jupyter 筆記本",
        "first_cell": (
            "# 在 Google Colab 執行時，這一格會安裝課程（連同它指定版本的 torch 與 torchao）\n"
            "# 以及 Graphviz 和中文字型；在自己的電腦上它什麼都不做：\n"
            "# 請在課程資料夾裡執行 pip install -e . 安裝課程。\n"
        ),
    },
    "en": {
        "project": "PT2E quantization from the graph up",
        "short_title": "PT2E from the graph up",
        "gallery_title": "Lessons",
        "language_name": "English",
        "hreflang": "en",
        "switch_title": "Read this page in English",
        "colab": "Open in Colab",
        "colab_title": "Run this lesson's notebook in Google Colab",
        "module_zip": "Download every lesson of this module",
        "module_zip_python": "Python scripts",
        "module_zip_jupyter": "Jupyter notebooks",
        "first_cell": (
            "# In Google Colab this cell installs the course (with its pinned torch and\n"
            "# torchao), Graphviz and a CJK font. On your own machine it does nothing:\n"
            "# install the course there with pip install -e . in its folder.\n"
        ),
    },
}

_FIRST_CELL_CODE = f"""import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run(
        "apt-get -qq update && apt-get -qq install -y graphviz fonts-wqy-microhei",
        shell=True,
        check=False,
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet",
         "pt2e-course @ git+{COURSE_REPOSITORY}"],
        check=True,
    )"""

# pydata-sphinx-theme ships only a Simplified Chinese catalog ("zh"), which zh_TW pages fell
# back to ("当前页面"): its interface strings in Traditional Chinese, compiled at config time.
THEME_ZH_TW = {
    "Click to expand": "展開",
    "Click to collapse": "收合",
    "Skip to main content": "跳到主要內容",
    "Back to top": "回到頁首",
    "Search": "搜尋",
    "Error": "錯誤",
    "Please activate JavaScript to enable the search functionality.": "請啟用 JavaScript 以搜尋。",
    "Breadcrumb": "導覽路徑",
    "Home": "首頁",
    "Edit on %(provider)s": "在 %(provider)s 上編輯",
    "Edit": "編輯",
    "Indices": "索引",
    "General Index": "總索引",
    "Global Module Index": "全域模組索引",
    "Python Module Index": "Python 模組索引",
    "Last updated on %(last_updated)s.": "最後更新於 %(last_updated)s。",
    "On this page": "本頁內容",
    "previous page": "上一頁",
    "previous": "上一頁",
    "next page": "下一頁",
    "next": "下一頁",
    "Section Navigation": "本節導覽",
    "Show Source": "顯示原始碼",
    "Light": "淺色",
    "Dark": "深色",
    "System Settings": "跟隨系統",
    "Collapse Sidebar": "收合側欄",
    "Expand Sidebar": "展開側欄",
    "Version warning": "版本警告",
    "Announcement": "公告",
    "Site navigation": "網站導覽",
}


def _theme_catalog(lang: str) -> list[str]:
    """Write build/locale/<lang>/LC_MESSAGES/sphinx.mo; return it as Sphinx's locale_dirs."""
    if lang != "zh_TW":
        return []
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    catalog = Catalog(locale="zh_Hant_TW")
    for msgid, msgstr in THEME_ZH_TW.items():
        catalog.add(msgid, msgstr)
    folder = ROOT / "build" / "locale" / lang / "LC_MESSAGES"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".sphinx.mo.{os.getpid()}"
    with open(tmp, "wb") as f:
        write_mo(f, catalog)
    tmp.replace(folder / "sphinx.mo")
    return [str(ROOT / "build" / "locale")]


_DOWNLOAD = re.compile(r'href="(?:\.\./)*(_downloads/[0-9a-f]+/[^"/]+\.ipynb)"')


def other_language(lang: str) -> str:
    """The language a page's switch leads to (the course has exactly two)."""
    (other,) = [code for code in LANGUAGES if code != lang]
    return other


def make_config(lang: str) -> dict:
    """Return the Sphinx settings for one language ("zh_TW" or "en")."""
    if lang == "zh_TW":
        import jieba  # segments Chinese words for the search index

        # jieba announces on stderr, at every build, how it loads its dictionary.
        jieba.setLogLevel(logging.WARNING)
    text = TEXT[lang]
    other = other_language(lang)
    return {
        "project": text["project"],
        "author": "pt2e-course contributors",
        "copyright": "2026, pt2e-course contributors",
        "language": lang,
        "extensions": ["myst_nb", "sphinx_gallery.gen_gallery", "sphinx_design"],
        "html_theme": "pydata_sphinx_theme",
        "locale_dirs": _theme_catalog(lang),
        # Pages without sections of their own need no left sidebar.
        "html_sidebars": {page: [] for page in ("index", "course_map", "glossary", "fx_basics")},
        "html_title": text["project"],
        "html_baseurl": f"{SITE_URL}{lang}/",
        "templates_path": [str(DOCS / "_templates")],
        "html_static_path": [str(DOCS / "_static")],
        "html_css_files": ["course.css"],
        "html_js_files": ["chinese-stemmer.js"] if lang == "zh_TW" else [],
        "html_context": {
            "other_lang_name": TEXT[other]["language_name"],
            "other_lang_hreflang": TEXT[other]["hreflang"],
            "other_lang_title": TEXT[other]["switch_title"],
            "colab_label": text["colab"],
            "colab_title": text["colab_title"],
        },
        "html_theme_options": {
            "navigation_with_keys": False,
            "logo": {"text": text["short_title"]},
            "show_toc_level": 2,
            "navbar_end": ["language-switch", "theme-switcher", "navbar-icon-links"],
            "article_header_end": ["colab-link"],
            "footer_start": ["copyright"],
            "footer_end": [],
        },
        "html_show_sourcelink": False,
        # jieba segments Chinese words for the search index; English keeps the default.
        "html_search_language": "zh" if lang == "zh_TW" else "en",
        "exclude_patterns": [
            "_build",
            # The gallery writes its .py/.ipynb downloads next to the pages; they are not
            # Sphinx sources (myst-nb would read the notebooks and run them again).
            "lessons/**/*.ipynb",
            "lessons/**/*.py",
            "lessons/**/*.zip",
            "lessons/*.ipynb",
            "lessons/*.py",
        ],
        "myst_enable_extensions": ["colon_fence", "deflist"],
        "nb_execution_mode": "cache",
        "nb_execution_cache_path": str(ROOT / "build" / "jupyter_cache" / lang),
        "nb_execution_raise_on_error": True,
        "nb_execution_timeout": 300,
        "sphinx_gallery_conf": {
            # Relative to docs/<lang>/: sphinx-gallery links pages by these paths.
            "examples_dirs": f"../../examples/{lang}",
            "gallery_dirs": "lessons",
            "filename_pattern": r"/m\d\d_\d+_",
            "ignore_pattern": r"__init__\.py",
            "image_scrapers": ("common.viz.gallery_scraper",),
            "reset_modules": ("common.viz.gallery_reset",),
            # A lesson that raises must fail the build, never become a page with a traceback.
            "abort_on_example_error": True,
            "only_warn_on_example_error": False,
            "capture_repr": (),
            "write_computation_times": False,
            "download_all_examples": True,
            "remove_config_comments": True,
            "show_signature": False,
            "plot_gallery": "True",
            "min_reported_time": 3600,
            # Harmless locally, makes the notebook run in a fresh Colab runtime.
            "first_notebook_cell": text["first_cell"] + _FIRST_CELL_CODE,
        },
        # Sphinx calls conf.py's setup(app): the site's own small additions (see below).
        "setup": lambda app: _setup(app, lang),
    }


# ---------------------------------------------------------------------------------------------
# The site's own additions: language switch and Colab link (per page), the {lesson} role,
# the generated course map, per-module zips, sitemaps and the site root (index.html, 404.html).


def _setup(app, lang: str) -> None:
    app.add_role("lesson", _lesson_role)
    app.connect("html-page-context", lambda *args: _page_context(lang, *args))
    app.connect("builder-inited", lambda app: _forget_stale_notebooks(app, lang), priority=100)
    app.connect("builder-inited", lambda app: _module_zips(app, lang), priority=900)
    app.connect("source-read", lambda app, docname, source: _source_read(lang, docname, source))
    app.connect("env-get-outdated", lambda *args: ["course_map", "glossary"])
    app.connect("build-finished", lambda app, exc: _build_finished(app, lang, exc))


def _page_context(lang, app, pagename, templatename, context, doctree) -> None:
    """Per page: the URL of its twin in the other language, and of its notebook in Colab."""
    other = other_language(lang)
    up = "../" * (pagename.count("/") + 1)
    context["other_lang_url"] = f"{up}{other}/{pagename}.html"
    twin = f"{SITE_URL}{other}/{pagename}.html"
    alternate = f'<link rel="alternate" hreflang="{TEXT[other]["hreflang"]}" href="{twin}">\n'
    context["metatags"] = context.get("metatags", "") + alternate
    found = _DOWNLOAD.search(context.get("body", "")) if pagename.startswith("lessons/") else None
    if found:
        context["colab_url"] = (
            f"https://colab.research.google.com/github/{_OWNER}/{_REPO}/blob/{PAGES_BRANCH}/"
            f"{lang}/{found.group(1)}"
        )


def lesson_sources(lang: str) -> dict[str, Path]:
    """Lesson number ("M01-2") -> its script under examples/<lang>, in course order."""
    found = {}
    for script in sorted((ROOT / "examples" / lang).glob("*/m[0-9][0-9]_*.py")):
        match = re.match(r"m(\d\d)_(\d+)_", script.name)
        if match:
            found[f"M{match[1]}-{match[2]}"] = script
    return dict(sorted(found.items(), key=lambda item: (item[0][:3], int(item[0][4:]))))


def _label(script: Path) -> str:
    return f"sphx_glr_lessons_{script.parent.name}_{script.name}"


def _lesson_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """{lesson}`M01-2`: a link to lesson M01-2 of this language, whatever its file name."""
    from docutils import nodes
    from sphinx.addnodes import pending_xref

    lang = inliner.document.settings.env.config.language
    script = lesson_sources(lang).get(text.strip())
    if script is None:
        # Not written yet: plain text, marked so that tests/test_site.py reports it.
        return [nodes.inline(rawtext, text, classes=["lesson-missing"])], []
    ref = pending_xref(
        rawtext, refdomain="std", reftype="ref", reftarget=_label(script), refexplicit=True
    )
    ref += nodes.inline(rawtext, text, classes=["xref", "std", "std-ref"])
    return [ref], []


def _rst_to_myst(text: str) -> str:
    """Inline reST of a docstring sentence -> MyST (literals and roles)."""
    text = re.sub(r":(\w+):`", r"{\1}`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _first_sentence(paragraph: str) -> str:
    match = re.match(r"(.+?(?:[.!?](?=\s|$)|[。！？]))", paragraph)
    return match[1] if match else paragraph


def _is_cjk(char: str) -> bool:
    return char >= "\u2e80"


def _paragraphs(text: str) -> list[str]:
    """Paragraphs of a reST text, each on one line (no space where a line break split CJK text)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        joined = lines[0]
        for line in lines[1:]:
            gap = "" if _is_cjk(joined[-1]) and _is_cjk(line[0]) else " "
            joined += gap + line
        paragraphs.append(joined)
    return paragraphs


def _course_map(lang: str) -> str:
    """MyST for the course map: per module its title, paragraph and one card per lesson."""
    out = []
    modules: dict[str, list[tuple[str, Path]]] = {}
    for number, script in lesson_sources(lang).items():
        modules.setdefault(script.parent.name, []).append((number, script))
    for folder, lessons in modules.items():
        header = _paragraphs((ROOT / "examples" / lang / folder / "README.txt").read_text("utf-8"))
        title = header[0].split(" ===")[0].rstrip("= ").strip()
        out += [f"## {title}", ""]
        if len(header) > 1:
            out += [_rst_to_myst(header[1]), ""]
        out += ["::::{grid} 1 2 2 2", ":gutter: 3", ""]
        for number, script in lessons:
            doc = ast.get_docstring(ast.parse(script.read_text("utf-8"))) or script.stem
            parts = _paragraphs(doc)
            lesson_title = parts[0].split(" ===")[0].rstrip("= ").strip()
            if not lesson_title.startswith(number):
                lesson_title = f"{number} · {lesson_title}"
            claim = _first_sentence(parts[1]) if len(parts) > 1 else ""
            thumb = f"lessons/{folder}/images/thumb/sphx_glr_{script.stem}_thumb.svg"
            out += [f":::{{grid-item-card}} {lesson_title}"]
            out += [f":link: {_label(script)}", ":link-type: ref", ":class-card: course-card"]
            if (DOCS / lang / thumb).exists():
                out += [f":img-top: {thumb}", f":img-alt: {number}"]
            out += ["", _rst_to_myst(claim), ":::", ""]
        out += ["::::", ""]
    return "\n".join(out)


def _source_read(lang: str, docname: str, source: list[str]) -> None:
    if docname == "course_map":
        source[0] = source[0].replace("<!-- lesson cards -->", _course_map(lang))
    match = re.fullmatch(r"lessons/(m\d\d_\w+)/index", docname)
    if match and (DOCS / lang / "lessons" / f"{match[1]}_python.zip").exists():
        text, folder = TEXT[lang], match[1]
        source[0] += (
            f"\n\n.. container:: sphx-glr-footer sphx-glr-footer-gallery\n\n"
            f"  .. container:: sphx-glr-download sphx-glr-download-python\n\n"
            f"    :download:`{text['module_zip']} ({text['module_zip_python']}): "
            f"{folder}_python.zip </lessons/{folder}_python.zip>`\n\n"
            f"  .. container:: sphx-glr-download sphx-glr-download-jupyter\n\n"
            f"    :download:`{text['module_zip']} ({text['module_zip_jupyter']}): "
            f"{folder}_jupyter.zip </lessons/{folder}_jupyter.zip>`\n"
        )


def _forget_stale_notebooks(app, lang: str) -> None:
    """Before the gallery runs: redo a lesson whose notebook lacks the current first cell.

    sphinx-gallery redoes a lesson only when its script changes (it keeps an MD5 beside the
    page), so a change of ``first_notebook_cell`` would otherwise leave old notebooks behind.
    """
    first_cell = app.config.sphinx_gallery_conf["first_notebook_cell"]
    for notebook in (DOCS / lang / "lessons").glob("*/m[0-9][0-9]_*.ipynb"):
        cells = json.loads(notebook.read_text("utf-8"))["cells"]
        if not cells or "".join(cells[0]["source"]).strip() != first_cell.strip():
            notebook.with_suffix(".py.md5").unlink(missing_ok=True)


def _module_zips(app, lang: str) -> None:
    """After the gallery ran: one .py zip and one .ipynb zip per module folder."""
    lessons = DOCS / lang / "lessons"
    for folder in sorted(p for p in lessons.glob("m[0-9][0-9]_*") if p.is_dir()):
        for kind, suffix in (("python", ".py"), ("jupyter", ".ipynb")):
            files = sorted(folder.glob(f"m[0-9][0-9]_*{suffix}"))
            if not files:
                continue
            target = lessons / f"{folder.name}_{kind}.zip"
            new = target.with_suffix(".zip.new")
            with zipfile.ZipFile(new, "w", zipfile.ZIP_DEFLATED) as archive:
                for file in files:
                    # Fixed timestamps: the zip only changes when a lesson does.
                    info = zipfile.ZipInfo(f"{folder.name}/{file.name}", (2026, 1, 1, 0, 0, 0))
                    archive.writestr(info, file.read_bytes(), zipfile.ZIP_DEFLATED)
            if target.exists() and target.read_bytes() == new.read_bytes():
                new.unlink()
            else:
                new.replace(target)


def _write(path: Path, text: str) -> None:
    """Write atomically: both language builds may write the site root at the same time."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _build_finished(app, lang: str, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    pages = sorted(d for d in app.env.found_docs if d not in {"genindex", "search"})
    other = other_language(lang)
    entries = []
    for page in pages:
        entries.append(
            f"  <url><loc>{escape(f'{SITE_URL}{lang}/{page}.html')}</loc>\n"
            f'    <xhtml:link rel="alternate" hreflang="{TEXT[other]["hreflang"]}" '
            f'href="{escape(f"{SITE_URL}{other}/{page}.html")}"/></url>'
        )
    _write(
        out / "sitemap.xml",
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:xhtml="http://www.w3.org/1999/xhtml">\n' + "\n".join(entries) + "\n</urlset>\n",
    )
    # The site root is the folder holding one build per language (build/html/<lang>):
    # its language picker, its 404 page and the sitemap index are written by every build.
    if out.name != lang:
        return
    root = out.parent
    shutil.copyfile(DOCS / "index.html", root / f".index.html.{os.getpid()}")
    (root / f".index.html.{os.getpid()}").replace(root / "index.html")
    site_path = urlparse(SITE_URL).path
    _write(
        root / "404.html", (DOCS / "404.html").read_text("utf-8").replace("/SITE_PATH/", site_path)
    )
    sitemaps = "".join(
        f"  <sitemap><loc>{SITE_URL}{code}/sitemap.xml</loc></sitemap>\n" for code in LANGUAGES
    )
    _write(
        root / "sitemap.xml",
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
        + sitemaps
        + "</sitemapindex>\n",
    )
