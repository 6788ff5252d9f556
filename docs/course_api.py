"""The API page: a section per module of ``common/``, and below each function and class the
lessons whose code uses it.

The modules are found in the package itself; ``API_ORDER`` only says in which order the page
shows them, and a module it does not name fails the build, saying where to add it.
"""

import importlib
import json
import pkgutil
from collections.abc import Iterable
from pathlib import Path

from sphinx.errors import ConfigError
from sphinx.util.docutils import SphinxDirective

from course_conf import TEXT, module_folders
from course_sources import lesson_label, module_scripts

#: The API page's order: the package, then its modules roughly as the lessons meet them.
API_ORDER = (
    "common",
    "common.models",
    "common.vision_models",
    "common.pt2e",
    "common.viz",
    "common.quantizer",
    "common.handmade",
    "common.lowering",
    "common.edge",
    "common.runtime",
    "common.expect",
    "common.cpu",
    "common.kernels",
    "common.timing",
    "common.aoti",
    "common.onnx_runtime",
    "common.numerics",
    "common.data",
    "common.qat",
    "common.language_model",
    "common.coverage",
    "common.atlas",
    "common.graph",
    "common.backends",
    "common.charts",
    "common.results",
    "common.lesson",
    "common.cache",
    "common.digest",
    "common.turns",
    "common.migration",
)


def package_modules(package: str = "common") -> set[str]:
    """The package and its modules, by their dotted names (found on disk: no module is imported)."""
    found = {package}
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        found.add(f"{package}.{module.name}")
    return found


def api_modules(found: Iterable[str] | None = None, order: Iterable[str] = API_ORDER) -> list[str]:
    """The modules the API page documents: those ``found`` (by default all of ``common``), in
    ``order``.

    Raises:
        ValueError: if a module found is not in ``order``, or ``order`` names one not found;
            the message names them and the list to edit.
    """
    found = set(package_modules() if found is None else found)
    order = list(order)
    unplaced = sorted(found - set(order))
    if unplaced:
        raise ValueError(
            f"the API page has no place for {', '.join(unplaced)}: add it to API_ORDER in "
            "docs/course_api.py, where a reader should meet it"
        )
    gone = [name for name in order if name not in found]
    if gone:
        raise ValueError(f"API_ORDER in docs/course_api.py names {', '.join(gone)}: no such module")
    return order


class CourseApi(SphinxDirective):
    """``{course-api}`` (in a MyST page): one section per module of ``common``, its public
    names in order. autodoc writes reST, so each module goes through MyST's eval-rst block;
    autodoc itself notes each module's source file."""

    def run(self) -> list:
        from common.pt2e import quiet

        quiet()  # before autodoc imports torchao, which announces its CUDA-only kernels
        try:
            modules = api_modules()
        except ValueError as error:
            raise self.error(str(error)) from None
        # autodoc notes each module's source file. A module added to common/ needs a line in
        # API_ORDER (the build fails until it has one), and that edit makes Sphinx read every
        # page again (course_rerun.py), this one with its new section.
        out = []
        for module in modules:
            out += [f"## `{module}`", "", "```{eval-rst}", f".. automodule:: {module}"]
            out += ["   :members:", "```", ""]
        return self.parse_text_to_nodes("\n".join(out), allow_section_headings=True)


def lessons_using(lang: str, name: str, backreferences: dict) -> list[str]:
    """The labels of the lessons whose code uses ``name``, in course order.

    ``backreferences`` is sphinx-gallery's backreferences_all.json: per name, one entry per
    lesson, ``[file name, examples folder, gallery folder, intro, title]``.
    """
    using = {Path(entry[2]).name + "/" + entry[0] for entry in backreferences.get(name, [])}
    course = [script for folder in module_folders(lang) for script in module_scripts(lang, folder)]
    return [lesson_label(s) for s in course if f"{s.parent.name}/{s.name}" in using]


def _lessons_using(app, what: str, name: str, obj, options, lines: list[str]) -> None:
    """Below a function's or class's docstring: the lessons whose code uses it, one link each.

    sphinx-gallery records, as it runs the lessons, which ``doc_module`` names each one uses
    (backreferences_all.json, rewritten only when that changes). A list of titles, not
    sphinx-gallery's ``minigallery`` of thumbnails: the page names some 270 uses, and as
    thumbnails they made it the heaviest page of the site.
    """
    if what not in ("function", "class"):
        return
    folder = Path(app.srcdir, app.config.sphinx_gallery_conf["backreferences_dir"])
    found = folder / "backreferences_all.json"
    app.env.note_dependency(str(found))
    if not found.exists():
        return
    labels = lessons_using(app.config.language, name, json.loads(found.read_text("utf-8")))
    if labels:
        lines += ["", f".. rubric:: {TEXT[app.config.language]['used_in']}", ""]
        lines += [".. container:: course-used-in", ""]
        lines += [f"   - :ref:`{label}`" for label in labels] + [""]


def _check_order(app) -> None:
    """Fail at the start of the build, not after the lessons ran, when API_ORDER is stale."""
    try:
        api_modules()
    except ValueError as error:
        raise ConfigError(str(error)) from None


def setup(app) -> dict:
    app.add_directive("course-api", CourseApi)
    app.connect("builder-inited", _check_order, priority=100)  # before the lessons run
    app.connect("autodoc-process-docstring", _lessons_using)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
