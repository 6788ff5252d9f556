"""The pages the course writes from its lessons: the course map, the landing page's module cards,
the lessons index, and the ``{lesson}`` role. (The landing page's measured results are
course_results.py's; the module pages' thumbnails, course_gallery_tidy.py's.)

Each directive notes the files it reads, so Sphinx reads its page again exactly when one of
them changed.
"""

import ast
import os
import re
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

from course_conf import module_folders
from course_sources import (
    card_picture,
    focus_picture,
    lesson_label,
    lesson_number,
    lesson_sources,
    module_readme,
    module_scripts,
)
from zh_spacing import CJK


def _lesson_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """{lesson}`M01-2`: a link to lesson M01-2 of this language, whatever its file name."""
    env = inliner.document.settings.env
    script = lesson_sources(env.config.language).get(text.strip())
    # Its page is read again when lessons come or go (see GeneratedContent.parse).
    env.glob_toctrees.add(env.docname)
    if script is None:
        # Not written yet: plain text, marked so that tests/test_site.py reports it.
        return [nodes.inline(rawtext, text, classes=["lesson-missing"])], []
    ref = addnodes.pending_xref(
        rawtext, refdomain="std", reftype="ref", reftarget=lesson_label(script), refexplicit=True
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


class GeneratedContent(SphinxDirective):
    """A directive whose content is written from files: each file it reads is noted, so Sphinx
    reads its page again exactly when one of them changed."""

    def read(self, path: Path) -> str:
        self.env.note_dependency(str(path))
        return path.read_text("utf-8")

    def gallery_thumbnail(self, script: Path) -> str | None:
        """The path (from the source dir) of the gallery's thumbnail of a lesson: SVG from a
        graph picture, PNG from a chart or sphinx-gallery's placeholder."""
        folder = f"lessons/{script.parent.name}/images/thumb"
        for suffix in (".svg", ".png"):
            thumb = f"{folder}/sphx_glr_{script.stem}_thumb{suffix}"
            if Path(self.env.srcdir, thumb).exists():
                self.env.note_dependency(thumb)
                return thumb
        return None

    def thumbnail(self, script: Path) -> str | None:
        """The path (from the source dir) of a lesson's card picture: the focus picture
        (docs/course_gallery.py writes it beside each ``draw(..., highlight=...)`` picture) of
        the picture its gallery thumbnail shows (``sphinx_gallery_thumbnail_number``, else 1).
        None when that picture highlights nothing (a chart, a diff, a plain graph): a whole
        graph shrunk to a card cannot be read."""
        self.env.note_dependency(str(script))
        picture = card_picture(Path(self.env.srcdir), script)
        if picture is not None:
            self.env.note_dependency(picture)
        return focus_picture(picture)

    def parse(self, text: str, *, lists_lessons: bool) -> list:
        if lists_lessons:
            # Pages come and go with lessons: read this page again then, as Sphinx does a page
            # whose globbed toctree lists pages it does not name.
            self.env.glob_toctrees.add(self.env.docname)
        return self.parse_text_to_nodes(text, allow_section_headings=True)


class CourseMap(GeneratedContent):
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
            header = _paragraphs(self.read(module_readme(lang, folder)))
            out += [f"## {_title(header[0])}", ""]
            if len(header) > 1:
                out += [_rst_to_myst(header[1]), ""]
            out += ["::::{grid} 1 2 2 2", ":gutter: 3", ""]
            for script in module_scripts(lang, folder):
                doc = ast.get_docstring(ast.parse(self.read(script))) or script.stem
                parts = _paragraphs(doc)
                title = _title(parts[0])
                number = lesson_number(script)
                if number and not title.startswith(number):
                    title = f"{number} · {title}"
                claim = _first_sentence(parts[1]) if len(parts) > 1 else ""
                out += [f":::{{grid-item-card}} {title}"]
                out += [f":link: {lesson_label(script)}", ":link-type: ref"]
                out += [":class-card: course-card"]
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
            header = _paragraphs(self.read(module_readme(lang, folder)))
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


class CourseLessons(GeneratedContent):
    """``.. course-lessons::`` (in a reST page): each module's page (its README.txt) with its
    lessons' thumbnails, and the toctree of the module pages, in course order."""

    def run(self) -> list:
        lang = self.config.language
        out = []
        for folder in module_folders(lang):
            out += [self.read(module_readme(lang, folder)), ""]
            scripts = module_scripts(lang, folder)
            for script in scripts:
                self.env.note_dependency(str(script))  # minigallery reads its title and intro
                self.gallery_thumbnail(script)
            # sphinx-gallery's thumbnails, as on the module's own page (paths from docs/<lang>).
            out += [".. minigallery::", ""]
            out += [f"   {os.path.relpath(script, self.env.srcdir)}" for script in scripts]
            out += [""]
        out += [".. toctree::", "   :hidden:", ""]
        out += [f"   {folder}/index" for folder in module_folders(lang)]
        return self.parse("\n".join(out) + "\n", lists_lessons=True)


def setup(app) -> dict:
    app.add_role("lesson", _lesson_role)
    app.add_directive("course-map", CourseMap)
    app.add_directive("course-lessons", CourseLessons)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
