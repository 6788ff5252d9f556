"""Section anchors: a lesson's sections have the ids of its English twin's, in both languages.

docutils makes a section's id from its title, so a Chinese title gave ``#id1``, ``#id2``: a
shared link to a zh_TW section said nothing, and the language switch could not keep the reader's
place. Twins have the same sections in the same order, so each section of a lesson page (and of a
module's page) takes the id made from the English twin's title of the same rank, in both builds:
the ids are computed from the English source the same way in each, whatever else the page holds.
tests/test_anchors.py compares the built pages.
"""

import io
from pathlib import Path

from docutils import nodes
from docutils.core import publish_doctree
from sphinx.transforms import SphinxTransform

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def english_source(docname: str) -> Path | None:
    """The English file a page's sections come from: a lesson's script, a module's README.txt.

    >>> english_source("lessons/m00_graphs/index").name
    'README.txt'
    >>> english_source("glossary") is None
    True
    """
    parts = docname.split("/")
    if len(parts) != 3 or parts[0] != "lessons":
        return None
    folder = EXAMPLES / "en" / parts[1]
    path = folder / "README.txt" if parts[2] == "index" else folder / f"{parts[2]}.py"
    return path if path.is_file() else None


def english_titles(path: Path) -> list[str]:
    """The titles of the sections of an English lesson (or README.txt), in document order."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        from sphinx_gallery.py_source_parser import split_code_and_text_blocks

        _, blocks = split_code_and_text_blocks(str(path))
        text = "\n\n".join(block.content for block in blocks if block.type == "text")
    settings = {
        "doctitle_xform": False,  # as Sphinx: the title section stays a section
        "report_level": 5,
        "halt_level": 5,
        "warning_stream": io.StringIO(),
    }
    doctree = publish_doctree(text, settings_overrides=settings)
    return [section[0].astext() for section in doctree.findall(nodes.section)]


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

    default_priority = 900  # after docutils has named the sections and resolved the references

    def apply(self, **kwargs) -> None:
        source = english_source(self.env.docname)
        if source is None:
            return
        self.env.note_dependency(str(source))
        sections = list(self.document.findall(nodes.section))
        wanted = section_ids(english_titles(source))
        if len(wanted) != len(sections):
            return  # not twins section for section: tests/test_anchors.py reports it
        renamed = {}
        for section, new in zip(sections, wanted, strict=True):
            old = section["ids"][0] if section["ids"] else None
            if old == new or new in self.document.ids:
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
