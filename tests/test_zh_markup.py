"""Every text block of every lesson renders its inline markup: no stray asterisks or backticks.

reST recognizes inline markup only at a word boundary: bold or a code span opens after
whitespace or punctuation, and closes before whitespace or closing punctuation. A Chinese
character is neither, nor is an opening bracket, so 「以**有上限**的」 shows its asterisks, and a
code span closed right before 「（」 does not close: it runs on to the next code span and
swallows the prose between (docs/zh_spacing.py: leave a space there; the site's spacing step
removes it). Neither is an error for docutils, so the check looks at what the page would show.
Each text block of a lesson (its docstring and every ``# %%`` comment block, split as
sphinx-gallery splits them) is parsed with docutils, and a block fails on

- a docutils warning or error (「Inline strong start-string without end-string」);
- text docutils cannot render: a name ending in ``_`` outside a code span is a link, to a
  target no page has (the build fails on it: ``Unknown target name``);
- ``**`` or a backtick left in the text a reader sees;
- single backticks, which the site (no default role) shows in italics;
- a code span that holds prose: a Chinese full stop, a backtick, more than MAX_CODE_SPAN
  characters or more than MAX_HAN_IN_CODE Chinese ones.

Sphinx's roles (``:ref:``) and directives (``.. dropdown::``) are unknown to plain docutils:
each one a block uses is registered as a stand-in, a directive's content parsed like a note's.
"""

import io
import re
from pathlib import Path

import pytest
from docutils import nodes
from docutils.core import publish_doctree
from docutils.parsers.rst import Directive, directives, roles
from docutils.parsers.rst.languages import en as english
from lesson_scripts import EXAMPLES, lessons
from sphinx_gallery.py_source_parser import split_code_and_text_blocks

from site_facts import LANGUAGES

#: A code span longer than this, or with more Han characters than MAX_HAN_IN_CODE, has
#: swallowed prose (the longest code on the pages is a 98-character call, M07-2; the most
#: Chinese, 「(長度, 批次, 維度)」).
MAX_CODE_SPAN = 120
MAX_HAN_IN_CODE = 12
HAN = re.compile(r"[\u3400-\u9fff]")
ROLE = re.compile(r"(?<![\w`]):([\w.:+-]+):`")
DIRECTIVE = re.compile(r"^\s*\.\. ([\w:-]+)::", re.MULTILINE)
# Text shown as written, where ** and backticks are the writer's.
VERBATIM = (nodes.FixedTextElement, nodes.literal, nodes.comment, nodes.raw, nodes.system_message)


def _stand_in_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    return [nodes.inline(rawtext, text)], []


class _AnyOption(dict):
    """An option spec that takes every option as a string (the stand-in knows none of them)."""

    def __missing__(self, key):
        return directives.unchanged


class _StandIn(Directive):
    """A directive docutils does not know: its content is parsed as body elements."""

    optional_arguments = 1
    final_argument_whitespace = True
    option_spec = _AnyOption()
    has_content = True

    def run(self):
        container = nodes.container("\n".join(self.content))
        self.state.nested_parse(self.content, self.content_offset, container)
        return [container]


def _register_stand_ins(text: str) -> None:
    """Register a stand-in for each role and directive of ``text`` that docutils lacks."""
    for name in set(ROLE.findall(text)) - set(english.roles):
        roles.register_local_role(name, _stand_in_role)
    for name in set(DIRECTIVE.findall(text)) - set(english.directives):
        directives.register_directive(name, _StandIn)


def markup_problems(text: str) -> list[tuple[int, str]]:
    """(line within ``text``, problem) for each piece of inline markup that does not render."""
    _register_stand_ins(text)
    doctree = publish_doctree(
        text,
        settings_overrides={
            "report_level": 2,
            "halt_level": 5,
            "warning_stream": io.StringIO(),
            "syntax_highlight": "none",
            "file_insertion_enabled": False,
            "raw_enabled": False,
        },
    )
    problems = []
    for message in doctree.findall(nodes.system_message):
        if message["level"] >= 2:
            problems.append((message.get("line") or 0, message.astext().splitlines()[0]))
    # A name ending in "_" (index_copy_) is a link; its missing target is reported by a
    # transform the build runs, not here: the text it marks is left as a problematic node.
    for marked in doctree.findall(nodes.problematic):
        problems.append(
            (_line(marked), f"{marked.astext()!r} does not render (a link to nothing?)")
        )
    for node in doctree.findall(nodes.Text):
        if any(isinstance(parent, VERBATIM) for parent in _ancestors(node)):
            continue
        shown = str(node)
        for mark in ("**", "`"):
            if mark in shown:
                problems.append((_line(node), f"{mark!r} shown as written in {shown.strip()!r}"))
    for cited in doctree.findall(nodes.title_reference):
        problems.append((_line(cited), f"single backticks show {cited.astext()!r} in italics"))
    for literal in doctree.findall(nodes.literal):
        code = literal.astext()
        if (
            "。" in code
            or "`" in code
            or len(code) > MAX_CODE_SPAN
            or len(HAN.findall(code)) > MAX_HAN_IN_CODE
        ):
            problems.append((_line(literal), f"a code span swallows prose: {code!r}"))
    return problems


def _ancestors(node):
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _line(node) -> int:
    for element in [node, *_ancestors(node)]:
        if getattr(element, "line", None):
            return element.line
    return 0


def text_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line in the file, text) of the docstring and each ``# %%`` block, as sphinx-gallery
    splits them."""
    _, blocks = split_code_and_text_blocks(str(path))[:2]
    return [(line, text) for kind, text, line in blocks if kind == "text"]


LESSONS = [(lang, path) for lang in LANGUAGES for path in lessons(lang)]


@pytest.mark.parametrize(("lang", "path"), LESSONS, ids=[f"{lang}/{p}" for lang, p in LESSONS])
def test_every_text_block_of_a_lesson_renders_its_markup(lang, path):
    found = [
        f"line ~{start + line}: {problem}"
        for start, text in text_blocks(EXAMPLES / lang / path)
        for line, problem in markup_problems(text)
    ]
    assert not found, "inline markup that does not render:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("這一課以**有上限**的批次匯出。", "'**' shown as written"),
        ("圖裡是 ``aten.batch_norm``（下面第一行）。其次是 ``convert_pt2e`` 。", "swallows prose"),
        ("取決於 CPU。**有 VNNI**（或 AMX）時，結果不同。", "Inline strong start-string"),
        ("訊息 `x` 沒有預設角色。", "in italics"),
        ("a list: gru, a KV cache's index_copy_), each", "'index_copy_' does not render"),
        ("一段 **粗體** 與 ``x`` 。", None),
        (f"``{'x' * (MAX_CODE_SPAN + 1)}``", "swallows prose"),
        ("``x``的值與 ``y`` 。", "swallows prose"),
    ],
    ids=[
        "bold glued to Chinese",
        "code span closed before （",
        "bold unclosed",
        "single backticks",
        "a name ending in _ (a link)",
        "fine",
        "long code span",
        "code span glued to Chinese",
    ],
)
def test_the_markup_check_catches_what_does_not_render(text, problem):
    found = [found for _, found in markup_problems(text)]
    if problem is None:
        assert found == []
    else:
        assert any(problem in one for one in found), found


def test_sphinx_roles_and_directives_are_not_markup_problems():
    text = (
        "見 :ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_x_m01_1_flow.py>` 與 :class:`A` 。\n\n"
        ".. dropdown:: 解答\n   :color: info\n\n"
        "   .. code-block:: python\n\n      print(`x`)\n\n"
        "   一格 **以內** 。\n"
    )
    assert markup_problems(text) == []
