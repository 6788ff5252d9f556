"""The site's own Sphinx additions, shared by both language builds.

Language switch and Colab link per page, the {lesson} role, the generated course map and API
page, per-module zips, and the site root (index.html, 404.html, sitemap.xml) that
languages.build_site writes once both languages are built. The settings they read live in
course_conf.py.
"""

import ast
import hashlib
import json
import re
import zipfile
from pathlib import Path
from urllib.parse import urlparse
from xml.sax.saxutils import escape

from course_conf import (
    API_MODULES,
    COLAB_NOTEBOOKS,
    DOCS,
    GALLERY_ZH_TW,
    ROOT,
    SITE_URL,
    TEXT,
    other_language,
)
from languages import LANGUAGES

try:
    import fcntl
except ImportError:  # not on Windows: there the two builds' kernels run unguarded
    fcntl = None


def setup(app) -> dict:
    lang = app.config.language
    app.add_role("lesson", _lesson_role)
    app.connect("html-page-context", lambda *args: _page_context(lang, *args))
    app.connect("autodoc-process-docstring", lambda *args: _lessons_using(lang, *args))
    app.connect("builder-inited", lambda app: _forget_stale_notebooks(app, lang), priority=100)
    app.connect("builder-inited", lambda app: _rerun_after_common_changed(lang), priority=100)
    app.connect("builder-inited", lambda app: _module_zips(app, lang), priority=900)
    app.connect("source-read", lambda app, docname, source: _source_read(lang, docname, source))
    app.connect("source-read", _hold_kernel_lock)
    app.connect("doctree-read", _release_kernel_lock)
    app.connect("env-get-outdated", _generated_pages)
    app.connect("build-finished", lambda app, exc: _sitemap(app, lang, exc))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def _sitemap(app, lang: str, exc) -> None:
    """<lang>/sitemap.xml: every page of the language (not only those this build wrote, as
    sphinx-sitemap 2.9 lists), each with its twin in the other language."""
    if exc is not None or app.builder.format != "html":
        return
    other = other_language(lang)
    entries = [
        f"  <url><loc>{escape(f'{SITE_URL}{lang}/{page}.html')}</loc>\n"
        f'    <xhtml:link rel="alternate" hreflang="{TEXT[other]["hreflang"]}" '
        f'href="{escape(f"{SITE_URL}{other}/{page}.html")}"/></url>'
        for page in sorted(app.env.found_docs - {"genindex", "search"})
    ]
    (Path(app.outdir) / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:xhtml="http://www.w3.org/1999/xhtml">\n' + "\n".join(entries) + "\n</urlset>\n",
        encoding="utf-8",
    )


def _generated_pages(app, env, added, changed, removed) -> list[str]:
    """Pages made from the lessons, read again when they may have changed.

    The course map (each lesson's picture) and the glossary (each term's lesson) when a lesson
    ran or a page came or went; the API page, which lists the lessons using each function,
    when those lists changed (reading it imports torch and every module it documents).
    """
    pages = []
    if app.config.sphinx_gallery_conf["passing_examples"] or added or removed:
        pages += ["course_map", "glossary"]
    lists = _digest(Path(app.config.sphinx_gallery_conf["backreferences_dir"]).glob("*.examples"))
    if getattr(env, "course_lessons_using", None) != lists:
        env.course_lessons_using = lists
        pages.append("api")
    return pages


def _digest(paths) -> str:
    """SHA-256 of the files' names and contents, in name order."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# MyST notebook pages run a Jupyter kernel while they are read. The two language builds run at
# once, and jupyter_client picks a kernel's TCP ports before the kernel binds them: meanwhile
# the other build's kernel connections can take one ("Address already in use"). So a build
# holds this lock from reading such a page until its doctree is done (the kernel is shut down
# by then); pages served from the execution cache start no kernel and wait only briefly.
# (myst-nb's "inline" execution mode would not help: it starts the same kind of kernel.)
_KERNEL_LOCK = ROOT / "build" / ".kernel.lock"
_held_locks = {}


def _hold_kernel_lock(app, docname: str, source: list[str]) -> None:
    if fcntl is None or "\nkernelspec:" not in source[0][:2000]:
        return
    _KERNEL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = open(_KERNEL_LOCK, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    _held_locks[docname] = handle


def _release_kernel_lock(app, doctree) -> None:
    handle = _held_locks.pop(app.env.docname, None)
    if handle is not None:
        handle.close()  # closing the file releases the lock


def _page_context(lang, app, pagename, templatename, context, doctree) -> None:
    """Per page: the URL of its twin in the other language, and of its notebook in Colab."""
    other = other_language(lang)
    up = "../" * (pagename.count("/") + 1)
    context["other_lang_url"] = f"{up}{other}/{pagename}.html"
    twin = f"{SITE_URL}{other}/{pagename}.html"
    alternate = f'<link rel="alternate" hreflang="{TEXT[other]["hreflang"]}" href="{twin}">\n'
    context["metatags"] = context.get("metatags", "") + alternate
    # sphinx-gallery links a lesson's notebook with :download:; Sphinx's download node says
    # where in the site it copied the file (its "filename": <hash>/<name>.ipynb).
    if doctree is not None and pagename.startswith("lessons/"):
        # Imported here: nox imports this module (write_site_root) where Sphinx is not installed.
        from sphinx import addnodes

        notebook = f"{pagename.rsplit('/', 1)[-1]}.ipynb"
        for node in doctree.findall(addnodes.download_reference):
            if node.get("reftarget") == notebook and node.get("filename"):
                context["colab_url"] = f"{COLAB_NOTEBOOKS}{lang}/_downloads/{node['filename']}"


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
            # The gallery's thumbnail: SVG from a graph picture, PNG from a chart.
            thumbs = [
                f"lessons/{folder}/images/thumb/sphx_glr_{script.stem}_thumb{suffix}"
                for suffix in (".svg", ".png")
            ]
            found = [thumb for thumb in thumbs if (DOCS / lang / thumb).exists()]
            out += [f":::{{grid-item-card}} {lesson_title}"]
            out += [f":link: {_label(script)}", ":link-type: ref", ":class-card: course-card"]
            if found:
                out += [f":img-top: {found[0]}", f":img-alt: {number}"]
            out += ["", _rst_to_myst(claim), ":::", ""]
        out += ["::::", ""]
    return "\n".join(out)


def _api_sections() -> str:
    """MyST for the API page: one section per module of API_MODULES, its public names in order.

    autodoc writes reST, so each module goes through MyST's eval-rst block.
    """
    out = []
    for module in API_MODULES:
        out += [f"## `{module}`", "", "```{eval-rst}", f".. automodule:: {module}"]
        out += ["   :members:", "```", ""]
    return "\n".join(out)


def _lessons_using(lang: str, app, what: str, name: str, obj, options, lines: list[str]) -> None:
    """Below a function's or class's docstring: the lessons whose code uses it, as cards.

    sphinx-gallery records, as it runs the lessons, which ``doc_module`` names each one uses
    (backreferences_all.json); its ``minigallery`` directive shows them.
    """
    if what not in ("function", "class"):
        return
    folder = Path(app.srcdir, app.config.sphinx_gallery_conf["backreferences_dir"])
    found = folder / "backreferences_all.json"
    if found.exists() and name in json.loads(found.read_text("utf-8")):
        lines += ["", f".. rubric:: {TEXT[lang]['used_in']}", "", f".. minigallery:: {name}", ""]


def _source_read(lang: str, docname: str, source: list[str]) -> None:
    if lang == "zh_TW" and docname.startswith("lessons/"):
        for english, chinese in GALLERY_ZH_TW.items():
            source[0] = source[0].replace(english, chinese)
    if docname == "course_map":
        source[0] = source[0].replace("<!-- lesson cards -->", _course_map(lang))
    if docname == "api":
        from common.pt2e import quiet

        quiet()  # before autodoc imports torchao, which announces its CUDA-only kernels
        source[0] = source[0].replace("<!-- api modules -->", _api_sections())
    match = re.fullmatch(r"lessons/(\w+)/index", docname)
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
    for notebook in (DOCS / lang / "lessons").glob("*/*.ipynb"):  # lessons and quickstart
        cells = json.loads(notebook.read_text("utf-8"))["cells"]
        if not cells or "".join(cells[0]["source"]).strip() != first_cell.strip():
            notebook.with_suffix(".py.md5").unlink(missing_ok=True)


def _rerun_after_common_changed(lang: str) -> None:
    """Before the gallery runs: redo every lesson when the code of ``common/`` has changed.

    sphinx-gallery redoes a lesson only when its own script changes, yet the pictures, the
    printed output and the asserts come from ``common/`` as much as from the lesson.
    """
    lessons = DOCS / lang / "lessons"
    common = _digest((ROOT / "common").glob("*.py"))
    stamp = lessons / "common.sha256"
    if stamp.exists() and stamp.read_text() == common:
        return
    for md5 in lessons.glob("*/*.py.md5"):  # the lessons and the quickstart
        md5.unlink()
    lessons.mkdir(parents=True, exist_ok=True)
    stamp.write_text(common)


def _module_zips(app, lang: str) -> None:
    """After the gallery ran: one .py zip and one .ipynb zip per module folder."""
    lessons = DOCS / lang / "lessons"
    for folder in sorted(p for p in lessons.iterdir() if p.is_dir() and p.name != "images"):
        for kind, suffix in (("python", ".py"), ("jupyter", ".ipynb")):
            files = sorted(folder.glob(f"*{suffix}"))
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


def write_site_root(html: Path) -> None:
    """Write the folder holding one build per language (``html/<lang>``): its language picker,
    its 404 page and the sitemap index pointing at each language's sitemap.

    languages.build_site calls it once, after every language has been built.
    """
    (html / "index.html").write_text((DOCS / "index.html").read_text("utf-8"), "utf-8")
    not_found = (DOCS / "404.html").read_text("utf-8")
    site_path = urlparse(SITE_URL).path
    (html / "404.html").write_text(not_found.replace("/SITE_PATH/", site_path), "utf-8")
    sitemaps = "".join(
        f"  <sitemap><loc>{SITE_URL}{lang}/sitemap.xml</loc></sitemap>\n" for lang in LANGUAGES
    )
    (html / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
        + sitemaps
        + "</sitemapindex>\n",
        "utf-8",
    )
