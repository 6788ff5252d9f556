"""What each page says about itself and where it leads: its twin in the other language (the
switch and the hreflang link), its notebook in Colab, a report-a-problem link, and on lesson
pages the built-with line and, beside the download buttons, what running the download needs.

The links and the built-with line go into the page context, where the templates of
docs/_templates render them. The run-needs line sits in the page body, just before
sphinx-gallery's download buttons (a place no template reaches), so a transform adds it to
the page as the page is read: the buttons' container is found by its class.
"""

import ast
import datetime
import functools
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform

from course_conf import TEXT
from course_sources import common_closure, is_lesson_page, page_scripts
from site_facts import COLAB_NOTEBOOKS, COURSE_REPOSITORY, SITE_URL, other_language


def _page_context(app, pagename, templatename, context, doctree) -> None:
    """Per page: the URL of its twin in the other language, and of its notebook in Colab."""
    lang = app.config.language
    other = other_language(lang)
    up = "../" * (pagename.count("/") + 1)
    context["other_lang_url"] = f"{up}{other}/{pagename}.html"
    twin = f"{SITE_URL}{other}/{pagename}.html"
    alternate = f'<link rel="alternate" hreflang="{TEXT[other]["hreflang"]}" href="{twin}">\n'
    # docutils' HTML writer adds a viewport <meta> of its own to the page's metatags, beside
    # the one of Sphinx's layout (docs/_templates/layout.html drops the theme's): one stays.
    docutils_viewport = '<meta name="viewport" content="width=device-width, initial-scale=1" />'
    context["metatags"] = context.get("metatags", "").replace(docutils_viewport, "") + alternate
    title = app.env.titles.get(pagename)  # the page's own title (not an admonition's)
    context["report_url"] = report_url(lang, pagename, title.astext() if title else pagename)
    context["report_label"] = TEXT[lang]["report"]
    context["report_title"] = TEXT[lang]["report_title"]
    if is_lesson_page(pagename):
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


@functools.cache
def _stack(lang: str) -> str:
    """The versions of torch, torchao and executorch and the CPU verdict of this process, the
    one that ran the lessons, in the page's language."""
    from common.cpu import describe

    versions = ", ".join(f"{name} {_version(name)}" for name in ("torch", "torchao", "executorch"))
    return f"{versions} · {describe().verdict_in(lang)}"


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
    return TEXT[lang]["built_with"].format(stack=_stack(lang), date=ran.isoformat())


#: What running an ONNX export needs, all three named when a lesson or its ``common`` closure
#: imports one of them: ``torch.onnx.export(dynamo=True)`` translates with onnxscript, which
#: writes ``onnx``; ``onnxruntime`` runs the file (M03-5).
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def run_needs(lang: str, scripts: list[Path]) -> str:
    """The line beside a page's download buttons: what running its scripts needs, with its
    literals in reST's double backquotes.

    The course's helpers with their pinned torch and torchao (one pip command from the
    course's repository), ExecuTorch (and NNCF with OpenVINO), and ONNX with its exporter's
    onnxscript and ONNX Runtime (``ONNX_PACKAGES``) where the scripts or the
    ``common`` modules they import (``common_closure``) import them, Graphviz, and a C++
    compiler where they call ``torch.compile`` or compile an AOTInductor package.
    """
    files = {*scripts, *(path for script in scripts for path in common_closure(script))}
    trees = [ast.parse(path.read_text("utf-8")) for path in sorted(files)]
    nodes_ = [node for tree in trees for node in ast.walk(tree)]
    install = f"pt2e-course @ git+{COURSE_REPOSITORY}"
    extra = ""
    imported = {a.name for node in nodes_ if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module for node in nodes_ if isinstance(node, ast.ImportFrom) and node.module}
    if any(name.split(".")[0] == "executorch" for name in imported):
        extra = f" executorch=={_version('executorch')}"  # the release that built the page
    if any(
        name.startswith(("executorch.backends.openvino", "nncf", "openvino")) for name in imported
    ):
        extra += f" nncf=={_version('nncf')} openvino=={_version('openvino')}"  # OpenVINOQuantizer
    if any(name.split(".")[0] in ONNX_PACKAGES for name in imported):  # M03-5
        extra += "".join(f" {package}=={_version(package)}" for package in ONNX_PACKAGES)
    text = TEXT[lang]
    line = text["run_needs"].format(command=f'``pip install "{install}"{extra}``')
    if any(_is_torch_compile(node) for node in nodes_):
        line += text["run_needs_compiler"]
    return line + text["run_needs_end"]


def _is_torch_compile(node) -> bool:
    """A call that makes inductor write C++ (``torch.compile(...)``,
    ``torch._inductor.aoti_compile_and_package(...)``), in code (not in comments or strings)."""
    function = getattr(node, "func", None) if isinstance(node, ast.Call) else None
    if not isinstance(function, ast.Attribute):
        return False
    if function.attr == "aoti_compile_and_package":
        return True
    return function.attr == "compile" and getattr(function.value, "id", None) == "torch"


def _paragraph(text: str, classes: list[str]) -> nodes.paragraph:
    """A paragraph of plain text and ``literals`` (the only inline markup run_needs writes)."""
    children = [
        nodes.literal(part, part) if index % 2 else nodes.Text(part)
        for index, part in enumerate(text.split("``"))
        if part
    ]
    return nodes.paragraph("", "", *children, classes=classes)


class RunNeeds(SphinxTransform):
    """Before the download buttons of a lesson's or a module's page: what running them needs.

    A transform of the page as it is read, before Sphinx's smart quotes (priority 750), so
    the line's apostrophes and quotes are set as the rest of the page's text is.
    """

    default_priority = 700

    def apply(self) -> None:
        scripts = page_scripts(self.config.language, self.env.docname)
        footers = [
            node
            for node in self.document.findall(nodes.container)
            if "sphx-glr-footer" in node["classes"]
        ]
        if scripts and footers:
            line = _paragraph(run_needs(self.config.language, scripts), ["course-run-needs"])
            footers[0].parent.insert(footers[0].parent.index(footers[0]), line)


def setup(app) -> dict:
    app.connect("html-page-context", _page_context)
    app.add_transform(RunNeeds)
    app.add_js_file("course-language-switch.js")  # docs/_static: the switch keeps the section
    return {"parallel_read_safe": True, "parallel_write_safe": True}
