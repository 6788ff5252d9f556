"""Chinese text without stray spaces: drop the whitespace a browser would show between CJK.

A browser shows a line break inside a paragraph as a space. Chinese has no spaces between
words, so a source line break between two Chinese characters shows as a gap
(「把模型 執行一次」); and reST needs whitespace around inline markup, so the writer's space
between ``x`` and a full-width comma shows too (「x ，」). This transform removes, in the text
of every page of a Chinese build:

- a whitespace run that holds a line break, between two CJK characters;
- a whitespace run next to full-width punctuation (its own width is the spacing);
- a whitespace run between two CJK characters at an inline-markup boundary: reST needs
  whitespace around ``*em*``, ``**strong**`` and links, so 「把 **量化後** 的」 would show
  as 「把 量化後 的」.

It keeps the space between Chinese and Latin words (「呼叫 quantizer」, 「呼叫 ``x``」) and a
space written on one line between two Chinese characters inside one run of text, and it never
touches code, literal blocks or raw HTML. The python-docs-zh-tw translators write zh-TW this way.

So a writer may (and, before an opening bracket such as 「（」, must) leave a space between
reST inline markup and full-width punctuation or Chinese: ``x`` （ parses where ``x``（ does
not, and the page shows x（.

On zh pages it also gives the HTML writer's field lists (the API page's 「參數」「回傳」)
a full-width colon: docutils writes a half-width one after every field name.
"""

import re

from docutils import nodes
from docutils.transforms import Transform

from common.charts import CJK_CHARACTERS

__all__ = ["CJK", "FULL_WIDTH_PUNCTUATION", "ZhSpacing", "setup", "tidy"]

#: Full-width punctuation: CJK symbols and punctuation (、。「」…) and half/full-width forms
#: (，：；！？（）／…). The em dash (—) is not in it: the sources write 「——」 against its
#: neighbours, and a list may use it as a separator between spaces (the M00 README).
FULL_WIDTH_PUNCTUATION = "\u3000-\u303f\uff00-\uffef"
#: Characters written without spaces between them: Han, kana and full-width punctuation.
CJK = CJK_CHARACTERS + FULL_WIDTH_PUNCTUATION

_IS_CJK = re.compile(f"[{CJK}]")
_IS_PUNCTUATION = re.compile(f"[{FULL_WIDTH_PUNCTUATION}]")
_WHITESPACE = re.compile(r"\s+")

# Text inside these nodes is shown as written (code, literal blocks, raw HTML, math).
_VERBATIM = (nodes.FixedTextElement, nodes.literal, nodes.raw, nodes.math, nodes.comment)


def tidy(text: str, before: str = "", after: str = "") -> str:
    """``text`` without the whitespace a browser would show as a stray space in Chinese.

    Args:
        text: the text of one docutils ``Text`` node.
        before: the character shown just before ``text`` in the same block ("" at its start).
        after: the character shown just after it ("" at the block's end).

    Returns:
        The text with each whitespace run removed that holds a line break between two CJK
        characters, touches full-width punctuation, or lies between two CJK characters at the
        edge of ``text`` (an inline-markup boundary: ``before``/``after`` come from another node).

    >>> tidy("把模型\\n執行一次")
    '把模型執行一次'
    >>> tidy(" ，寫明", before="x")
    '，寫明'
    >>> tidy("呼叫\\nquantizer 的 annotate")
    '呼叫\\nquantizer 的 annotate'
    >>> tidy(" 代價", before="有")  # after *有沒有*
    '代價'
    """

    def replace(match: re.Match) -> str:
        start, end = match.span()
        left = text[start - 1] if start else before[-1:]
        right = text[end] if end < len(text) else after[:1]
        if not left or not right:  # the block's edge: the browser drops it anyway
            return match.group()
        if _IS_PUNCTUATION.match(left) or _IS_PUNCTUATION.match(right):
            return ""
        between_cjk = _IS_CJK.match(left) and _IS_CJK.match(right)
        at_boundary = start == 0 or end == len(text)
        if between_cjk and ("\n" in match.group() or at_boundary):
            return ""
        return match.group()

    return _WHITESPACE.sub(replace, text)


def _verbatim(node: nodes.Node) -> bool:
    return any(isinstance(parent, _VERBATIM) for parent in _ancestors(node))


def _ancestors(node: nodes.Node):
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _block(node: nodes.Node):
    """The paragraph, title, term, ... whose text a browser flows as one run with ``node``."""
    return next(
        (
            parent
            for parent in _ancestors(node)
            if isinstance(parent, nodes.TextElement) and not isinstance(parent, nodes.Inline)
        ),
        None,
    )


class ZhSpacing(Transform):
    """Apply :func:`tidy` to the text of a Chinese document (see the module docstring)."""

    # After Sphinx's own transforms have produced the final text, before it is written.
    default_priority = 870

    def apply(self, **kwargs) -> None:
        env = getattr(self.document.settings, "env", None)
        language = env.config.language if env else self.document.settings.language_code
        if not _is_chinese(language):
            return
        texts = list(self.document.findall(nodes.Text))
        blocks = [_block(text) for text in texts]
        verbatim = [_verbatim(text) for text in texts]
        for i, text in enumerate(texts):
            if verbatim[i] or blocks[i] is None:
                continue
            # What the reader sees on either side: the nearest text of the same block, code
            # included (a code span is Latin text to the eye); parsers leave empty Text nodes.
            before = self._neighbour(texts, blocks, i, -1)
            after = self._neighbour(texts, blocks, i, +1)
            new = tidy(str(text), before, after)
            if new != str(text):
                texts[i] = nodes.Text(new)  # the next node's "before" is the tidied text
                parent = text.parent
                # By identity: Text nodes are strings, and list.index would find the first
                # equal one ("\n" often occurs several times in one paragraph).
                position = next(k for k, child in enumerate(parent.children) if child is text)
                parent[position] = texts[i]

    @staticmethod
    def _neighbour(texts, blocks, i: int, step: int) -> str:
        j = i + step
        while 0 <= j < len(texts) and blocks[j] is blocks[i]:
            if str(texts[j]):
                return str(texts[j])
            j += step
        return ""


class FullWidthFieldColon:
    """HTML translator mixin: 「參數：」, not docutils' 「參數:」, after a field list's name."""

    def depart_field_name(self, node) -> None:
        self.body.append('<span class="colon">：</span></dt>\n')


def _full_width_field_colon(app) -> None:
    if app.builder.format != "html" or not _is_chinese(app.config.language):
        return
    base = app.registry.translators.get(app.builder.name, app.builder.default_translator_class)
    # Before the theme's builder-inited handler, which wraps whatever translator is registered.
    translator = type("ZhHTMLTranslator", (FullWidthFieldColon, base), {})
    app.set_translator(app.builder.name, translator, override=True)


def _is_chinese(language: str | None) -> bool:
    return (language or "").lower().startswith("zh")


def setup(app) -> dict:
    app.add_transform(ZhSpacing)
    app.add_post_transform(ZhSpacing)  # text that cross-references bring at write time
    app.connect("builder-inited", _full_width_field_colon, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
