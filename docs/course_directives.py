"""The pages the course writes from its lessons: the course map, the landing page's module cards
and measured results, the lessons index, and the ``{lesson}`` role.

Each directive notes the files it reads, so Sphinx reads its page again exactly when one of
them changed.
"""

import ast
import json
import os
import re
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

from course_conf import ROOT, TEXT, module_folders
from course_sources import (
    lesson_label,
    lesson_number,
    lesson_sources,
    module_scripts,
    results_folder,
)
from zh_spacing import CJK

# How a lesson names its gallery thumbnail's picture (sphinx-gallery's per-file setting).
_THUMBNAIL_NUMBER = re.compile(r"^# sphinx_gallery_thumbnail_number = (\d+)$", re.M)


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


def card_picture(srcdir: Path, script: Path) -> str | None:
    """The picture a lesson's card stems from, as a path from the source dir: the picture the
    gallery thumbnail shows (``sphinx_gallery_thumbnail_number``, else 1), or its focus picture
    when there is one (docs/course_gallery.py writes one, ``<name>_focus.svg``, beside each
    ``draw(..., highlight=...)`` picture). None before the lesson's first run."""
    found = _THUMBNAIL_NUMBER.search(script.read_text("utf-8"))
    picture = f"lessons/{script.parent.name}/images/sphx_glr_{script.stem}_"
    picture += f"{int(found.group(1)) if found else 1:03d}"
    # The focus picture when there is one, else the picture: the lesson's next run writes it
    # again, and a page that noted it is read again then (a missing file would make it every
    # build).
    for candidate in (f"{picture}_focus.svg", f"{picture}.svg", f"{picture}.png"):
        if (srcdir / candidate).exists():
            return candidate
    return None


def _focus(picture: str | None) -> str | None:
    """``picture`` if it is a focus picture: the only kind a card or a thumbnail shows."""
    return picture if picture and picture.endswith("_focus.svg") else None


def _thumbnail_focus(srcdir: Path, thumb: Path, language: str) -> str | None:
    """The focus picture of the lesson a sphinx-gallery thumbnail
    (``lessons/<module>/images/thumb/sphx_glr_<lesson>_thumb.svg``) belongs to, if any."""
    lesson = thumb.name.removeprefix("sphx_glr_").rsplit("_thumb", 1)[0]
    script = ROOT / "examples" / language / thumb.parents[2].name / f"{lesson}.py"
    return _focus(card_picture(srcdir, script)) if script.is_file() else None


def _module_page_thumbnails(app) -> None:
    """A module page's thumbnails show what the course map's cards show: sphinx-gallery shrinks
    a lesson's first picture, a whole graph, to 160 px, where no label can be read. A lesson
    with a focus picture gets it as its thumbnail (written only when it differs, so that an
    unchanged build reads no page again); _drop_unreadable_thumbnails takes the others' off."""
    srcdir = Path(app.srcdir)
    for thumb in srcdir.glob("lessons/*/images/thumb/sphx_glr_*_thumb.svg"):
        focus = _thumbnail_focus(srcdir, thumb, app.config.language)
        if focus:
            focus = (srcdir / focus).read_bytes()
            if thumb.read_bytes() != focus:
                thumb.write_bytes(focus)


def _drop_unreadable_thumbnails(app, doctree) -> None:
    """On a module page, a lesson without a focus picture gets no thumbnail (its title stays):
    its first picture is a whole graph, a diff or a chart, unreadable at 160 px."""
    if not re.fullmatch(r"lessons/[^/]+/index", app.env.docname):
        return
    srcdir = Path(app.srcdir)
    for image in list(doctree.findall(nodes.image)):
        uri = image.get("uri", "")
        if "/images/thumb/" not in uri:
            continue
        if not _thumbnail_focus(srcdir, Path(uri), app.config.language):
            image.parent.remove(image)


class _GeneratedContent(SphinxDirective):
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
        return _focus(picture)

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


def speedup(ratio: float, spreads: list, load: float, text: dict) -> str:
    """A speed-up with the spreads of the two timings behind it and the load they ran under."""
    spread = text["spread_sep"].join(f"{s:.0%}" for s in spreads)
    return text["speedup"].format(ratio=ratio, spread=spread, load=load)


def accuracy_gap(accuracy: dict, text: dict) -> str:
    """How many test images apart fp32 and int8 are: 98.6 % / 98.8 % on 500 images is one image,
    not a gain from quantizing."""
    images = accuracy["test_images"]
    apart = round(abs(accuracy["fp32_accuracy"] - accuracy["int8_accuracy"]) * images)
    if apart <= 1:
        return text["accuracy_close"].format(images=images)
    return text["accuracy_apart"].format(images=images, n=apart)


def ties_within_noise(figures: dict) -> list[tuple[str, str]]:
    """Pairs of speed-ups too close to rank: their gap is within the timings' spreads.

    A spread is the p10–p90 width over the median, so each timing is known to about half of
    it; a ratio of two timings to about the sum of those halves. Two ratios whose relative gap
    is inside both ratios' uncertainties are a tie, not a ranking.

    >>> ties_within_noise({"A": (2.0, [0.1, 0.1], 1.0), "B": (2.1, [0.1, 0.1], 1.0)})
    [('A', 'B')]
    >>> ties_within_noise({"A": (2.0, [0.02, 0.02], 1.0), "B": (3.0, [0.02, 0.02], 1.0)})
    []
    """
    names = list(figures)
    ties = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            (ra, sa, _), (rb, sb, _) = figures[a], figures[b]
            gap = abs(ra - rb) / ((ra + rb) / 2)
            if gap <= sum(sa) / 2 + sum(sb) / 2:
                ties.append((a, b))
    return ties


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
            "compiled_spreads",
            "compiled_load",
            "int8_speedup_eager",
            "eager_spreads",
            "eager_loads",
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
        eager = {
            path: (ratio, speed["eager_spreads"][path], speed["eager_loads"][path])
            for path, ratio in speed["int8_speedup_eager"].items()
        }
        paths = " · ".join(f"{path} {speedup(*figure, text)}" for path, figure in eager.items())
        ties = [f"{a} ≈ {b}" for a, b in ties_within_noise(eager)]
        if ties:
            paths += text["within_noise"].format(pairs=", ".join(ties))
        compiled = (
            speed["int8_speedup_compiled"],
            speed["compiled_spreads"],
            speed["compiled_load"],
        )
        qat_figures = (qat[k] for k in ("fp32_accuracy", "ptq_accuracy", "qat_accuracy"))
        rows = [
            (
                text["result_compiled"].format(path=native),
                speedup(*compiled, text),
                "M03-3",
            ),
            (text["result_eager"], paths, "M03-3"),
            (text["result_size"], f"{speed['size_ratio']:.2f}×", "M03-3"),
            (
                text["result_accuracy"].format(images=accuracy["test_images"]),
                f"{accuracy['fp32_accuracy']:.1%} / {accuracy['int8_accuracy']:.1%}"
                + accuracy_gap(accuracy, text),
                "M04-1",
            ),
            (text["result_qat"], " / ".join(f"{f:.1%}" for f in qat_figures), "M04-3"),
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
        note = text["results_note"]
        out += [note.format(cpu=speed["cpu"], threads=speed["timing_threads"], native=native), ""]
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
    app.add_directive("course-results", CourseResults)
    app.add_directive("course-lessons", CourseLessons)
    # After sphinx-gallery has written the module pages and their thumbnails.
    app.connect("builder-inited", _module_page_thumbnails, priority=900)
    app.connect("doctree-read", _drop_unreadable_thumbnails)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
