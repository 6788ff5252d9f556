"""The course's look for charts and printed tables: CJK fonts, and columns by display width."""

import unicodedata

__all__ = ["CJK_CHARACTERS", "CJK_FONTS", "display_width", "pad", "use_course_style"]

#: Fonts with Traditional Chinese glyphs, in order of preference (the same list as the pictures).
CJK_FONTS = ("Noto Sans CJK TC", "WenQuanYi Micro Hei")
#: The characters those fonts are for, Han and kana, as the body of a regular-expression class
#: (``re.compile(f"[{CJK_CHARACTERS}]")``); the one definition the course and its site use.
CJK_CHARACTERS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff"


def use_course_style() -> str:
    """Set matplotlib's fonts for the course's charts; return the CJK font in use.

    Only installed fonts are listed (matplotlib warns about every missing one), the first CJK
    one ahead of DejaVu Sans, which matplotlib falls back to for glyphs the CJK font lacks.
    Calling it again changes nothing.

    Returns:
        str: the name of the CJK font charts will use.

    Raises:
        RuntimeError: if no CJK font is installed; the message says how to install one.
    """
    import matplotlib as mpl
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    found = [name for name in CJK_FONTS if name in installed]
    if not found:
        raise RuntimeError(
            "no CJK font found for the charts' Chinese labels; install one "
            "(Debian/Ubuntu: sudo apt-get install fonts-wqy-microhei)"
        )
    mpl.rcParams["font.family"] = "sans-serif"
    mpl.rcParams["font.sans-serif"] = [found[0], "DejaVu Sans"]
    mpl.rcParams["axes.unicode_minus"] = False  # the CJK fonts may lack U+2212
    return found[0]


def display_width(text: str) -> int:
    """The columns ``text`` takes in a monospaced font: two per wide or full-width character.

    Han characters and full-width punctuation (「，」「：」「（」) take two columns; everything
    else, ambiguous-width symbols such as ``×`` and ``–`` included, takes one.

    Args:
        text: the string to measure.

    Returns:
        int: its width in columns.
    """
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def pad(text: str, width: int, *, align: str = "<") -> str:
    """``text`` padded with spaces to ``width`` columns, as ``f"{text:<{width}}"`` pads ASCII.

    Python's format pads by characters, so a Chinese label of four characters, eight columns,
    ends up four columns too wide; this pads by :func:`display_width` instead. Text already
    ``width`` columns or wider comes back unchanged.

    Args:
        text: the cell's text.
        width: the column's width, in display columns.
        align: ``"<"`` for left-aligned (spaces after), ``">"`` for right-aligned (before).

    Returns:
        str: the padded cell.

    Raises:
        ValueError: if ``align`` is neither ``"<"`` nor ``">"``.
    """
    if align not in ("<", ">"):
        raise ValueError(f"align must be '<' or '>', not {align!r}")
    spaces = " " * max(0, width - display_width(text))
    return text + spaces if align == "<" else spaces + text
