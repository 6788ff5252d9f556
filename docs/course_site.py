"""The site's own Sphinx additions, shared by both language builds.

Language switch, Colab and report-a-problem links per page, the built-with line of a lesson
page and what running its download needs, the {lesson} role, the directives that write the
course map, the landing page's module cards and measured results, the lessons index and the
API page's sections (each notes the files it reads, so Sphinx reads its page again exactly
when one of them changed), the lessons' re-run when what else makes their pages changed, and
each language's sitemap. The settings they read live in
course_conf.py; the site root (index.html, 404.html, the sitemap index) is written by
languages.write_site_root.
"""

import ast
import datetime
import functools
import hashlib
import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote
from xml.sax.saxutils import escape

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective
from zh_spacing import CJK

from common.results import RESULTS_FOLDER

from course_conf import (
    API_MODULES,
    COLAB_NOTEBOOKS,
    COURSE_REPOSITORY,
    DOCS,
    GALLERY_ZH_TW,
    ROOT,
    SITE_URL,
    TEXT,
    module_folders,
    other_language,
)

try:
    import fcntl
except ImportError:  # not on Windows: there the two builds' kernels run unguarded
    fcntl = None


def setup(app) -> dict:
    lang = app.config.language
    # The lessons publish their headline figures there as they run (common.results); the
    # landing page's course-results directive reads them.
    os.environ[RESULTS_FOLDER] = str(results_folder(lang))
    # Sphinx re-reads every page when an "env" setting changes, but not when the code of an
    # extension does: this setting is that code, so a page never keeps what older code wrote
    # into it (the download line, the built-with line, the zh spacing).
    app.add_config_value("course_extension_code", _digest(sorted(DOCS.glob("*.py"))), "env")
    app.add_role("lesson", _lesson_role)
    app.add_directive("course-map", CourseMap)
    app.add_directive("course-results", CourseResults)
    app.add_directive("course-lessons", CourseLessons)
    app.add_directive("course-api", CourseApi)
    app.connect("html-page-context", lambda *args: _page_context(lang, *args))
    app.connect("autodoc-process-docstring", lambda *args: _lessons_using(lang, *args))
    app.connect("builder-inited", _rerun_when_outputs_may_differ, priority=100)
    app.connect("source-read", lambda app, docname, source: _source_read(lang, docname, source))
    app.connect("source-read", _hold_kernel_lock)
    app.connect("doctree-read", _release_kernel_lock)
    app.connect("build-finished", lambda app, exc: _sitemap(app, lang, exc))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def _sitemap(app, lang: str, exc) -> None:
    """<lang>/sitemap.xml: every page of the language, each with its twin in the other language.

    Written by hand because sphinx-sitemap lists only the pages a build wrote, so an
    incremental build gives an incomplete sitemap (jdillard/sphinx-sitemap#13, open as of
    2.9); the extension can replace this once that is fixed.
    """
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


def _digest(paths) -> str:
    """SHA-256 of the files' names and contents, in name order."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# Workaround for jupyter/jupyter_client#487 (port race between concurrent kernels; open, still
# in jupyter_client 8.10): a kernel's TCP ports are picked before the kernel binds them, so the
# kernel of the other language build, running at the same time, can take one ("Address
# already in use"). A build holds this lock from reading a MyST notebook page until its
# doctree is done (its kernel is shut down by then); pages served from the execution cache
# start no kernel and wait only briefly. Remove it when the issue is closed (myst-nb's
# "inline" mode would not help: it starts the same kind of kernel).
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
    title = app.env.titles.get(pagename)  # the page's own title (not an admonition's)
    context["report_url"] = report_url(lang, pagename, title.astext() if title else pagename)
    context["report_label"] = TEXT[lang]["report"]
    context["report_title"] = TEXT[lang]["report_title"]
    if _is_lesson_page(pagename):
        context["built_with"] = built_with(lang, Path(app.env.doc2path(pagename)))
    # sphinx-gallery links a lesson's notebook with :download:; Sphinx's download node says
    # where in the site it copied the file (its "filename": <hash>/<name>.ipynb).
    if doctree is not None and pagename.startswith("lessons/"):
        notebook = f"{pagename.rsplit('/', 1)[-1]}.ipynb"
        for node in doctree.findall(addnodes.download_reference):
            if node.get("reftarget") == notebook and node.get("filename"):
                context["colab_url"] = f"{COLAB_NOTEBOOKS}{lang}/_downloads/{node['filename']}"


def report_url(lang: str, pagename: str, title: str) -> str:
    """A new-issue URL of the course's repository, its title and body naming the page."""
    address = f"{SITE_URL}{lang}/{pagename}.html"
    text = TEXT[lang]
    issue_title = text["report_issue_title"].format(title=title)
    body = text["report_issue_body"].format(address=address)
    query = f"title={quote(issue_title, safe='')}&body={quote(body, safe='')}"
    return f"{COURSE_REPOSITORY}/issues/new?{query}"


def _is_lesson_page(pagename: str) -> bool:
    """A page sphinx-gallery made from a lesson (not a module's or the lessons' index)."""
    return pagename.startswith("lessons/") and not pagename.endswith("index")


@functools.cache
def _stack() -> str:
    """The versions of torch, torchao and executorch and the CPU verdict of this process, the
    one that ran the lessons."""
    from common.cpu import describe

    versions = ", ".join(f"{name} {_version(name)}" for name in ("torch", "torchao", "executorch"))
    return f"{versions} · {describe().verdict}"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "—"


def built_with(lang: str, page_source: Path) -> str:
    """A lesson page's built-with line: the stack and CPU, and the day its lesson ran.

    The day is that of the gallery's page source, which sphinx-gallery writes when it runs
    the lesson (and only then): a page written again later still gives the day of the run.
    """
    ran = datetime.datetime.fromtimestamp(page_source.stat().st_mtime, datetime.UTC).date()
    return TEXT[lang]["built_with"].format(stack=_stack(), date=ran.isoformat())


def run_needs(lang: str, scripts: list[Path]) -> str:
    """The line beside a page's download buttons: what running its scripts needs.

    The course's helpers with their pinned torch and torchao (one pip command from the
    course's repository), ExecuTorch for the lessons that import it, Graphviz, and a C++
    compiler for the lessons that call ``torch.compile``.
    """
    trees = [ast.parse(script.read_text("utf-8")) for script in scripts]
    nodes_ = [node for tree in trees for node in ast.walk(tree)]
    install = f"pt2e-course @ git+{COURSE_REPOSITORY}"
    extra = ""
    imported = {a.name for node in nodes_ if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module for node in nodes_ if isinstance(node, ast.ImportFrom) and node.module}
    if any(name.split(".")[0] == "executorch" for name in imported):
        extra = f" executorch=={_version('executorch')}"  # the release that built the page
    text = TEXT[lang]
    line = text["run_needs"].format(command=f'``pip install "{install}"{extra}``')
    if any(_is_torch_compile(node) for node in nodes_):
        line += text["run_needs_compiler"]
    return line + text["run_needs_end"]


def _is_torch_compile(node) -> bool:
    """A call of ``torch.compile(...)`` in a lesson's code (not in its comments or strings)."""
    function = getattr(node, "func", None) if isinstance(node, ast.Call) else None
    return (
        isinstance(function, ast.Attribute)
        and function.attr == "compile"
        and getattr(function.value, "id", None) == "torch"
    )


def module_scripts(lang: str, folder: str) -> list[Path]:
    """A module's scripts in course order (M00-2 before M00-10; unnumbered ones by name)."""

    def order(script: Path):
        match = re.match(r"m\d\d_(\d+)_", script.name)
        return (0, int(match[1]), "") if match else (1, 0, script.name)

    scripts = (ROOT / "examples" / lang / folder).glob("*.py")
    return sorted((s for s in scripts if s.name != "__init__.py"), key=order)


def lesson_sources(lang: str) -> dict[str, Path]:
    """Lesson number ("M01-2") -> its script under examples/<lang>, in course order."""
    found = {}
    for folder in module_folders(lang):
        for script in module_scripts(lang, folder):
            match = re.match(r"m(\d\d)_(\d+)_", script.name)
            if match:
                found[f"M{match[1]}-{match[2]}"] = script
    return found


def _label(script: Path) -> str:
    """The label sphinx-gallery gives a lesson's page (from its path under the source dir)."""
    return f"sphx_glr_lessons_{script.parent.name}_{script.name}"


def _lesson_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """{lesson}`M01-2`: a link to lesson M01-2 of this language, whatever its file name."""
    env = inliner.document.settings.env
    script = lesson_sources(env.config.language).get(text.strip())
    # Its page is read again when lessons come or go (see _GeneratedContent.parse).
    env.glob_toctrees.add(env.docname)
    if script is None:
        # Not written yet: plain text, marked so that tests/test_site.py reports it.
        return [nodes.inline(rawtext, text, classes=["lesson-missing"])], []
    ref = addnodes.pending_xref(
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


_CJK_EDGE = re.compile(f"[{CJK}]")


def _paragraphs(text: str) -> list[str]:
    """Paragraphs of a reST text, each on one line (no space where a line break split CJK text)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        joined = lines[0]
        for line in lines[1:]:
            gap = "" if _CJK_EDGE.match(joined[-1]) and _CJK_EDGE.match(line[0]) else " "
            joined += gap + line
        paragraphs.append(joined)
    return paragraphs


def _title(paragraph: str) -> str:
    """The title of a reST text's first paragraph ("M00 Reading graphs ====" -> its words)."""
    return paragraph.split(" ===")[0].rstrip("= ").strip()


class _GeneratedContent(SphinxDirective):
    """A directive whose content is written from files: each file it reads is noted, so Sphinx
    reads its page again exactly when one of them changed."""

    def read(self, path: Path) -> str:
        self.env.note_dependency(str(path))
        return path.read_text("utf-8")

    def thumbnail(self, script: Path) -> str | None:
        """The path (from the source dir) of the gallery's thumbnail of a lesson: SVG from a
        graph picture, PNG from a chart or sphinx-gallery's placeholder."""
        folder = f"lessons/{script.parent.name}/images/thumb"
        for suffix in (".svg", ".png"):
            thumb = f"{folder}/sphx_glr_{script.stem}_thumb{suffix}"
            if Path(self.env.srcdir, thumb).exists():
                self.env.note_dependency(thumb)
                return thumb
        return None

    def parse(self, text: str, *, lists_lessons: bool) -> list:
        if lists_lessons:
            # Pages come and go with lessons: read this page again then, as Sphinx does a page
            # whose globbed toctree lists pages it does not name.
            self.env.glob_toctrees.add(self.env.docname)
        return self.parse_text_to_nodes(text, allow_section_headings=True)


class CourseMap(_GeneratedContent):
    """``{course-map}`` (in a MyST page): per module its title, paragraph and one card per
    lesson with the lesson's claim and its thumbnail. With ``:modules:`` (the landing page):
    one card per module, in course order, with the first sentence of its paragraph and the
    thumbnail of its first lesson, linking to the module's page."""

    option_spec: ClassVar = {"modules": directives.flag}

    def run(self) -> list:
        if "modules" in self.options:
            return self.module_cards()
        lang = self.config.language
        out = []
        for folder in module_folders(lang):
            header = _paragraphs(self.read(ROOT / "examples" / lang / folder / "README.txt"))
            out += [f"## {_title(header[0])}", ""]
            if len(header) > 1:
                out += [_rst_to_myst(header[1]), ""]
            out += ["::::{grid} 1 2 2 2", ":gutter: 3", ""]
            for script in module_scripts(lang, folder):
                doc = ast.get_docstring(ast.parse(self.read(script))) or script.stem
                parts = _paragraphs(doc)
                title = _title(parts[0])
                match = re.match(r"m(\d\d)_(\d+)_", script.name)
                number = f"M{match[1]}-{match[2]}" if match else None
                if number and not title.startswith(number):
                    title = f"{number} · {title}"
                claim = _first_sentence(parts[1]) if len(parts) > 1 else ""
                out += [f":::{{grid-item-card}} {title}"]
                out += [f":link: {_label(script)}", ":link-type: ref", ":class-card: course-card"]
                thumb = self.thumbnail(script)
                if thumb:
                    out += [f":img-top: /{thumb}", f":img-alt: {number or title}"]
                out += ["", _rst_to_myst(claim), ":::", ""]
            out += ["::::", ""]
        return self.parse("\n".join(out), lists_lessons=True)

    def module_cards(self) -> list:
        lang = self.config.language
        out = ["::::{grid} 1 2 3 3", ":gutter: 3", ""]
        for folder in module_folders(lang):
            header = _paragraphs(self.read(ROOT / "examples" / lang / folder / "README.txt"))
            out += [f":::{{grid-item-card}} {_title(header[0])}"]
            out += [f":link: lessons/{folder}/index", ":link-type: doc"]
            out += [":class-card: course-card course-module-card"]
            scripts = module_scripts(lang, folder)
            thumb = self.thumbnail(scripts[0]) if scripts else None
            if thumb:
                out += [f":img-top: /{thumb}", f":img-alt: {_title(header[0])}"]
            summary = _first_sentence(header[1]) if len(header) > 1 else ""
            out += ["", _rst_to_myst(summary), ":::", ""]
        out += ["::::", ""]
        return self.parse("\n".join(out), lists_lessons=True)


def results_folder(lang: str) -> Path:
    """Where the lessons of one language publish their figures while the site is built."""
    return ROOT / "build" / "results" / lang


class CourseResults(_GeneratedContent):
    """``{course-results}`` (the landing page): the course's headline figures as the lessons
    of this build measured them, from the files they published (common.results), in a table
    that links each figure to its lesson. A figure missing is an error naming its lesson."""

    #: lesson -> the figures the table reads from what it published.
    SOURCES: ClassVar = {
        "M03-3": (
            "cpu",
            "int8_path",
            "timing_threads",
            "int8_speedup_compiled",
            "int8_speedup_eager",
            "size_ratio",
        ),
        "M04-1": ("test_images", "fp32_accuracy", "int8_accuracy"),
        "M04-3": ("fp32_accuracy", "ptq_accuracy", "qat_accuracy"),
        "M02-3": ("bit_exact_cases",),
    }

    def figures(self, lesson: str) -> dict:
        lang = self.config.language
        script = lesson_sources(lang)[lesson]
        path = results_folder(lang) / f"{script.stem}.json"
        if not path.exists():
            raise self.error(
                f"{path} is missing: {script.name} publishes it when it runs in this build "
                "(delete docs/<lang>/lessons/*/*.md5 to run the lessons again)"
            )
        found = json.loads(self.read(path))
        missing = [name for name in self.SOURCES[lesson] if name not in found]
        if missing:
            raise self.error(f"{script.name} published no {', '.join(missing)} (in {path})")
        return found

    def run(self) -> list:
        text = TEXT[self.config.language]
        speed, qat = self.figures("M03-3"), self.figures("M04-3")
        accuracy, handmade = self.figures("M04-1"), self.figures("M02-3")
        native = speed["int8_path"]
        paths = " · ".join(f"{p} {v:.2f}×" for p, v in speed["int8_speedup_eager"].items())
        rows = [
            (
                text["result_compiled"].format(path=native),
                f"{speed['int8_speedup_compiled']:.2f}×",
                "M03-3",
            ),
            (text["result_eager"], paths, "M03-3"),
            (text["result_size"], f"{speed['size_ratio']:.2f}×", "M03-3"),
            (
                text["result_accuracy"].format(images=accuracy["test_images"]),
                f"{accuracy['fp32_accuracy']:.1%} / {accuracy['int8_accuracy']:.1%}",
                "M04-1",
            ),
            (
                text["result_qat"],
                " / ".join(
                    f"{qat[k]:.1%}" for k in ("fp32_accuracy", "ptq_accuracy", "qat_accuracy")
                ),
                "M04-3",
            ),
            (
                text["result_bit_exact"],
                text["result_cases"].format(n=handmade["bit_exact_cases"]),
                "M02-3",
            ),
        ]
        out = [
            f":::{{list-table}} {text['results_caption']}",
            ":header-rows: 1",
            ":class: course-results",
            "",
        ]
        what, value, lesson = text["results_head"]
        out += [f"* - {what}", f"  - {value}", f"  - {lesson}"]
        for what, value, lesson in rows:
            out += [f"* - {what}", f"  - {value}", f"  - {{lesson}}`{lesson}`"]
        out += [":::", ""]
        out += [
            text["results_note"].format(
                cpu=speed["cpu"], threads=speed["timing_threads"], native=native
            ),
            "",
        ]
        return self.parse("\n".join(out), lists_lessons=False)


class CourseLessons(_GeneratedContent):
    """``.. course-lessons::`` (in a reST page): each module's page (its README.txt) with its
    lessons' thumbnails, and the toctree of the module pages, in course order."""

    def run(self) -> list:
        lang = self.config.language
        out = []
        for folder in module_folders(lang):
            out += [self.read(ROOT / "examples" / lang / folder / "README.txt"), ""]
            scripts = module_scripts(lang, folder)
            for script in scripts:
                self.env.note_dependency(str(script))  # minigallery reads its title and intro
                self.thumbnail(script)
            # sphinx-gallery's thumbnails, as on the module's own page (paths from docs/<lang>).
            out += [".. minigallery::", ""]
            out += [f"   {os.path.relpath(script, self.env.srcdir)}" for script in scripts]
            out += [""]
        out += [".. toctree::", "   :hidden:", ""]
        out += [f"   {folder}/index" for folder in module_folders(lang)]
        return self.parse("\n".join(out) + "\n", lists_lessons=True)


class CourseApi(_GeneratedContent):
    """``{course-api}`` (in a MyST page): one section per module of API_MODULES, its public
    names in order. autodoc writes reST, so each module goes through MyST's eval-rst block;
    autodoc itself notes each module's source file."""

    def run(self) -> list:
        from common.pt2e import quiet

        quiet()  # before autodoc imports torchao, which announces its CUDA-only kernels
        out = []
        for module in API_MODULES:
            out += [f"## `{module}`", "", "```{eval-rst}", f".. automodule:: {module}"]
            out += ["   :members:", "```", ""]
        return self.parse("\n".join(out), lists_lessons=False)


def _lessons_using(lang: str, app, what: str, name: str, obj, options, lines: list[str]) -> None:
    """Below a function's or class's docstring: the lessons whose code uses it, as cards.

    sphinx-gallery records, as it runs the lessons, which ``doc_module`` names each one uses
    (backreferences_all.json, rewritten only when that changes); its ``minigallery``
    directive shows them.
    """
    if what not in ("function", "class"):
        return
    folder = Path(app.srcdir, app.config.sphinx_gallery_conf["backreferences_dir"])
    found = folder / "backreferences_all.json"
    app.env.note_dependency(str(found))
    if found.exists() and name in json.loads(found.read_text("utf-8")):
        lines += ["", f".. rubric:: {TEXT[lang]['used_in']}", "", f".. minigallery:: {name}", ""]


_FOOTER = re.compile(
    r"^(  \.\. container:: sphx-glr-footer sphx-glr-footer-(example|gallery)\n)", re.M
)


def _source_read(lang: str, docname: str, source: list[str]) -> None:
    if not docname.startswith("lessons/"):
        return
    parts = docname.split("/")
    if len(parts) == 3:  # lessons/<module>/<page>: a lesson's or a module's page
        folder = ROOT / "examples" / lang / parts[1]
        scripts = [folder / f"{parts[2]}.py"] if parts[2] != "index" else [*folder.glob("*.py")]
        scripts = [script for script in scripts if script.exists()]
        if scripts:
            needs = f"  .. rst-class:: course-run-needs\n\n  {run_needs(lang, scripts)}\n\n"
            source[0] = _FOOTER.sub(lambda match: needs + match[1], source[0], count=1)
    if lang == "zh_TW":
        for english, chinese in GALLERY_ZH_TW.items():
            source[0] = source[0].replace(english, chinese)


def _rerun_when_outputs_may_differ(app) -> None:
    """Before the gallery runs: redo every lesson when what else makes its page has changed.

    sphinx-gallery redoes a lesson only when its own script changes (it keeps the script's MD5
    beside the page), yet the pictures, the printed output and the asserts come from
    ``common/`` as much as from the lesson, the pictures reach the page through
    docs/course_gallery.py, and the notebook starts with ``first_notebook_cell``.
    """
    lessons = Path(app.srcdir, "lessons")
    inputs = [*(ROOT / "common").glob("*.py"), DOCS / "course_gallery.py"]
    stamp = _digest(inputs) + _sha256(app.config.sphinx_gallery_conf["first_notebook_cell"])
    recorded = lessons / "inputs.sha256"
    # The landing page's figures are published by the lessons as they run: none without a run.
    results = results_folder(app.config.language)
    if recorded.exists() and recorded.read_text() == stamp and results.is_dir():
        return
    for md5 in lessons.glob("*/*.py.md5"):
        md5.unlink()
    lessons.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    recorded.write_text(stamp)
