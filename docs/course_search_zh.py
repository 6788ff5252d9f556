"""zh_TW search: the index and the query typed into the box split by one function, written twice.

Sphinx's Chinese search splits the pages with jieba's default (Simplified) dictionary and sends
the query to the index unsplit, so a Traditional term was cut in two in the index (捨入 → 捨/入)
and a query of several words (無聲的失敗) matched no term. Here both sides split alike: every run of
Chinese characters gives each of its character pairs (the index of CJK search engines) and every
course term it contains, the glossary's Chinese terms and :data:`EXTRA_TERMS`; other words stay
whole. A query therefore finds every page that holds it, and a course term is also a word of its
own. :func:`split` is the Python side, :data:`SPLITTER_JS` the same function for the browser
(Sphinx writes it into ``language_data.js`` as ``splitQuery``); tests/test_search.py checks that
the two agree and that the site's search finds the pages in a browser.

A job of its own besides: the search page's result-count line, which Sphinx's zh_TW catalog leaves
empty, comes from docs/locale/zh_TW/LC_MESSAGES/sphinx.po like the theme's strings.
"""

import json
import re
from pathlib import Path

from sphinx.search.zh import SearchChinese

DOCS = Path(__file__).resolve().parent
GLOSSARY = DOCS / "zh_TW" / "glossary.md"
CATALOG = DOCS / "locale" / "zh_TW" / "LC_MESSAGES" / "sphinx.po"

#: Chinese characters: the CJK Unified Ideographs, Extension A and the compatibility block.
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
#: Course words that head no glossary entry but are searched for.
EXTRA_TERMS = ("捨入", "截斷", "活化值", "逐位元", "除錯器", "詞彙表", "疑難排解", "不報錯的失敗")

_PARTS = re.compile(f"[{HAN}]+|[^{HAN}]+")
_IS_HAN = re.compile(f"[{HAN}]")


def glossary_terms(path: Path = GLOSSARY) -> list[str]:
    """The Chinese words that head the glossary's entries, plus :data:`EXTRA_TERMS`, sorted.

    A term line of a ``{glossary}`` block is an unindented line; its runs of Chinese characters
    are the words ("PT2E 量化" gives 量化).
    """
    text = path.read_text(encoding="utf-8")
    words = set(EXTRA_TERMS)
    for block in re.findall(r"```\{glossary\}\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line and not line[0].isspace():
                words.update(re.findall(f"[{HAN}]+", line))
    return sorted(words)


def split(text: str, terms: frozenset[str], *, query: bool = False) -> list[str]:
    """The words of ``text`` the index holds (or, with ``query``, the words a query looks up).

    For the index, a run of Chinese characters gives the course terms of three or more
    characters it contains, then each pair of neighbouring characters (a lone character stays
    as it is). A query asks for fewer: a run that is one such term gives the term alone, any
    other run its pairs; Sphinx's search wants every word of the query on a page, except that a
    page holding as many words as the query has words of three or more characters is found too,
    so a query never mixes the two kinds within a run. Either way, every other word (Latin
    letters, digits, ``_``) stays whole, and a query's words are among the index's words of any
    text that contains it.

    >>> split("無聲的失敗：int8 捨入", frozenset({"無聲的失敗"}))
    ['無聲的失敗', '無聲', '聲的', '的失', '失敗', 'int8', '捨入']
    >>> split("無聲的失敗：int8 捨入", frozenset({"無聲的失敗"}), query=True)
    ['無聲的失敗', 'int8', '捨入']
    """
    longest = max(map(len, terms), default=0)
    words = []
    for token in re.findall(r"\w+", text):  # in JS: [\p{L}\p{N}_]+
        for part in _PARTS.findall(token):
            if not _IS_HAN.match(part):
                words.append(part)
                continue
            if query and len(part) > 2 and part in terms:
                words.append(part)
                continue
            for i in range(len(part) if not query else 0):
                for n in range(min(longest, len(part) - i), 2, -1):
                    if part[i : i + n] in terms:
                        words.append(part[i : i + n])
            words.extend(part[i : i + 2] for i in range(len(part) - 1))
            if len(part) == 1:
                words.append(part)
    return words


#: :func:`split` with ``query=True`` in JavaScript, as Sphinx's ``splitQuery``; ``TERMS`` and
#: ``HAN`` are filled in. Words of one character are dropped, as the index drops them
#: (``word_filter``).
SPLITTER_JS = """\
/* docs/course_search_zh.py: the query splits as the index did (Python's split(query=True)). */
var splitQuery = (function () {
  const terms = new Set(TERMS);
  const han = /[HAN]/u;
  const parts = /[HAN]+|[^HAN]+/gu;
  const split = (text) => {
    const words = [];
    for (const token of text.match(/[\\p{L}\\p{N}_]+/gu) || []) {
      for (const part of token.match(parts)) {
        const chars = [...part];
        if (!han.test(part)) words.push(part);
        else if (chars.length > 2 && terms.has(part)) words.push(part);
        else if (chars.length === 1) words.push(part);
        else for (let i = 0; i + 1 !== chars.length; i += 1) words.push(chars[i] + chars[i + 1]);
      }
    }
    return words;
  };
  return (query) => split(query).filter((word) => [...word].length > 1);
})();
"""


class CourseChinese(SearchChinese):
    """Sphinx's Chinese search (its stemming of Latin words kept) with the course's splitter."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__({**options, "dict": ""})  # jieba is not used (nor installed)
        self.terms = frozenset(glossary_terms())
        self.js_splitter_code = SPLITTER_JS.replace("HAN", HAN).replace(
            "TERMS", json.dumps(sorted(self.terms), ensure_ascii=False)
        )

    def split(self, input: str) -> list[str]:  # Sphinx's parameter name
        words = split(input, self.terms)
        self.latin_terms.update(w for w in words if w.isascii())
        return words


# ---------------------------------------------------------------------- the result-count line


def _catalog_messages(path: Path) -> dict[str, str | list[str]]:
    """The translated messages of a .po catalog, as Sphinx's translations.js holds them."""
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        catalog = read_po(f)
    messages = {}
    for message in catalog:
        if not message.id or not message.string:
            continue
        if isinstance(message.id, tuple):
            messages[message.id[0]] = list(message.string)
        else:
            messages[message.id] = message.string
    return messages


def _translate_search_page(app, exception) -> None:
    """Fill the JS catalog (translations.js) with the course catalog's messages it lacks.

    Sphinx copies its own zh_TW ``sphinx.js`` there, where the search page's result-count line
    is an empty string; the course's sphinx.po translates it.
    """
    if exception or app.builder.format != "html" or app.config.language != "zh_TW":
        return
    path = Path(app.outdir, "_static", "translations.js")
    if not path.is_file():
        return
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition("(")
    body, _, tail = rest.rpartition(")")
    data = json.loads(body)
    ours = _catalog_messages(CATALOG)
    for key, value in ours.items():
        if key in data["messages"]:
            data["messages"][key] = value
    path.write_text(f"{head}({json.dumps(data, ensure_ascii=False, indent=4)}){tail}", "utf-8")


def _depend_on_the_glossary(app, doctree) -> None:
    """Every zh_TW page is indexed again when the glossary's terms change: a query holds the new
    terms whole, and a page indexed without them would no longer be found."""
    if app.config.language == "zh_TW":
        app.env.note_dependency(str(GLOSSARY))


def setup(app) -> dict:
    app.add_search_language(CourseChinese)
    app.connect("doctree-read", _depend_on_the_glossary)
    app.connect("build-finished", _translate_search_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
