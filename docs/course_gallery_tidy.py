"""sphinx-gallery's output, tidied: what the generated pages show that the course does not want
(the same kind of job as scikit-learn's doc/sphinxext/move_gallery_links.py, done here on the
pages as Sphinx reads them rather than on the written HTML).

- A lesson page opens on its title and its own paragraph (LessonTop).
- A module page's thumbnails are readable: a lesson's focus picture, or none
  (_module_page_thumbnails, _drop_unreadable_thumbnails).
- On zh_TW pages, the gallery's English phrases are in Chinese (GALLERY_ZH_TW).

What a page says about itself and where it leads (the download line, the twin, Colab) is
course_links.py's.
"""

import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform

from course_sources import card_picture, focus_picture, page_source

# ------------------------------------------------------------------ a lesson page's top


class LessonTop(SphinxTransform):
    """A lesson page opens on its title and its own paragraph: without sphinx-gallery's "Go to
    the end to download the full example code" note above the title (the download buttons are
    at the end, and the note began every search snippet), and without the code cell that holds
    only the script's license comment (``# SPDX-License-Identifier``), which stays in the
    downloaded script.

    sphinx-gallery 0.22 writes the note unconditionally (its ``EXAMPLE_HEADER``), and renders
    the comment lines after the docstring as a cell when a ``# %%`` follows them.
    """

    default_priority = 700

    def apply(self) -> None:
        if not self.env.docname.startswith("lessons/"):
            return
        for note in list(self.document.findall(nodes.note)):
            if "sphx-glr-download-link-note" in note["classes"]:
                parent = note.parent
                parent.remove(note)
                if isinstance(parent, addnodes.only) and not parent.children:
                    parent.parent.remove(parent)
        for block in list(self.document.findall(nodes.literal_block)):
            lines = [line.strip() for line in block.astext().splitlines() if line.strip()]
            if (
                lines
                and all(line.startswith("#") for line in lines)
                and any("SPDX-License-Identifier" in line for line in lines)
            ):
                block.parent.remove(block)
                break


# ------------------------------------------------------------------ module pages' thumbnails


def _thumbnail_focus(srcdir: Path, thumb: Path, language: str) -> str | None:
    """The focus picture of the lesson a sphinx-gallery thumbnail
    (``lessons/<module>/images/thumb/sphx_glr_<lesson>_thumb.svg``) belongs to, if any."""
    lesson = thumb.name.removeprefix("sphx_glr_").rsplit("_thumb", 1)[0]
    script = page_source(language, f"lessons/{thumb.parents[2].name}/{lesson}")
    return focus_picture(card_picture(srcdir, script)) if script else None


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


# ------------------------------------------------------------------ zh_TW: the gallery's phrases
# sphinx-gallery writes these phrases into every page it generates (the link to the download
# buttons, the buttons' labels) and has no message catalog of its own, so they are swapped in
# the generated reST as Sphinx reads it (they sit inside its roles' titles).

#: sphinx-gallery's phrase -> the zh_TW page's.
GALLERY_ZH_TW = {
    "`Go to the end <": "`前往頁尾 <",
    "to download the full example code.": "下載完整的程式碼。",
    "Download Jupyter notebook: ": "下載 Jupyter 筆記本：",
    "Download Python source code: ": "下載 Python 原始碼：",
    "Download zipped: ": "下載 zip 壓縮檔：",
    "Download all examples in Python source code: ": "下載本單元的全部課程（Python 原始碼）：",
    "Download all examples in Jupyter notebooks: ": "下載本單元的全部課程（Jupyter 筆記本）：",
}


def _translate(app, docname: str, source: list[str]) -> None:
    if app.config.language != "zh_TW" or not docname.startswith("lessons/"):
        return
    for english, chinese in GALLERY_ZH_TW.items():
        source[0] = source[0].replace(english, chinese)


def setup(app) -> dict:
    app.add_transform(LessonTop)
    # After sphinx-gallery has written the module pages and their thumbnails.
    app.connect("builder-inited", _module_page_thumbnails, priority=900)
    app.connect("doctree-read", _drop_unreadable_thumbnails)
    app.connect("source-read", _translate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
