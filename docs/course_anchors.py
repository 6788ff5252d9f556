"""Section anchors: a lesson's sections have the ids of its English twin's, in both languages.

docutils makes a section's id from its title, so a Chinese title gave ``#id1``, ``#id2``: a
shared link to a zh_TW section said nothing, and the language switch could not keep the reader's
place. Twins have the same sections in the same order, so each section of a lesson page (and of a
module's page) takes the id made from the English twin's title of the same rank, in both builds:
the ids are computed from the English source the same way in each, whatever else the page holds.
tests/test_zh_pages.py compares the built pages.
"""

import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

from course_sources import page_source

_ADORNMENT = re.compile(r"([!-/:-@\[-`{-~])\1+\s*$")  # a line of one punctuation character
_MARKUP = [
    (re.compile(r":[\w:.-]+:`([^`<]*?)\s*(?:<[^`]*>)?`"), r"\1"),  # :ref:`title <target>`
    (re.compile(r"``(.+?)``"), r"\1"),
    (re.compile(r"`([^`<]*?)\s*(?:<[^`]*>)?`_{1,2}"), r"\1"),
    (re.compile(r"\*\*(.+?)\*\*|\*(.+?)\*"), lambda m: m[1] or m[2]),
    (re.compile(r"\\(.)"), r"\1"),
]


def english_titles(path: Path) -> list[str]:
    """The titles of the sections of an English lesson (or README.txt), in document order, as
    text (inline markup removed): reST titles are a line underlined (and perhaps overlined) with
    one punctuation character. Read by hand: docutils' own parser, inside a Sphinx build, would
    call the build's roles."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        from sphinx_gallery.py_source_parser import split_code_and_text_blocks

        _, blocks = split_code_and_text_blocks(str(path))
        text = "\n\n".join(block.content for block in blocks if block.type == "text")
    lines = ["", *text.splitlines(), ""]
    titles = []
    for i in range(1, len(lines) - 1):
        line, before, after = lines[i], lines[i - 1], lines[i + 1]
        if not line.strip() or line[0].isspace() or _ADORNMENT.match(line):
            continue
        if not _ADORNMENT.match(after) or len(after.rstrip()) < 2:
            continue
        if before.strip() and not (_ADORNMENT.match(before) and before[0] == after[0]):
            continue
        title = line.strip()
        for pattern, replacement in _MARKUP:
            title = pattern.sub(replacement, title)
        titles.append(title)
    return titles


def section_ids(titles: list[str]) -> list[str]:
    """An id per title, as docutils makes it, numbered from 2 where a title repeats.

    >>> section_ids(["Step 1 — insert a ``call_module`` node", "Exercises", "Exercises"])
    ['step-1-insert-a-call-module-node', 'exercises', 'exercises-2']
    """
    ids, seen = [], {}
    for title in titles:
        base = nodes.make_id(title) or "section"
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return ids


class EnglishSectionIds(SphinxTransform):
    """Each section's own id (its first) becomes the English twin's; links to it follow."""

    # After docutils has named the sections and resolved the references (up to 850), before
    # Sphinx emits doctree-read (880), where the page's table of contents is collected.
    default_priority = 870

    def apply(self, **kwargs) -> None:
        # The English file a page's sections come from: a lesson's script, a module's README.txt.
        source = page_source("en", self.env.docname)
        if source is None:
            return
        self.env.note_dependency(str(source))
        sections = list(self.document.findall(nodes.section))
        wanted = section_ids(english_titles(source))
        if len(wanted) != len(sections):
            return  # not twins section for section: tests/test_zh_pages.py reports it
        # A label's id stays (sphinx-gallery's sphx_glr_... label takes the first place of a title
        # with no Latin letter in it): the English id is added before it.
        labelled = {i for n, i in self.document.nameids.items() if self.document.nametypes.get(n)}
        renamed = {}
        for section, new in zip(sections, wanted, strict=True):
            old = section["ids"][0] if section["ids"] else None
            if old == new or new in self.document.ids:
                continue
            if old in labelled:
                section["ids"] = [new, *section["ids"]]
                self.document.ids[new] = section
                continue
            section["ids"] = [new, *section["ids"][1:]]
            self.document.ids[new] = section
            if old is not None:
                self.document.ids.pop(old, None)
                renamed[old] = new
        if not renamed:
            return
        for name, target in list(self.document.nameids.items()):
            if target in renamed:
                self.document.nameids[name] = renamed[target]
        for node in self.document.findall(nodes.Element):
            if node.get("refid") in renamed:
                node["refid"] = renamed[node["refid"]]


def setup(app) -> dict:
    app.add_transform(EnglishSectionIds)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
