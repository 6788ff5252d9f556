"""sphinx-gallery hooks: collect the pictures ``draw`` makes while a lesson runs on the site.

Kept apart from common.viz so that resolving these hooks does not import torch: a docs
rebuild with no lesson to run then never pays for it.
"""

import html
import re
import sys
import warnings
from pathlib import Path

__all__ = ["reset", "scraper"]


def reset(gallery_conf, fname) -> None:
    """``reset_modules`` hook, run before each lesson: quiet the stack, collect pictures."""
    from common.pt2e import quiet
    from common.viz import _collector

    quiet()
    _collector.active = True
    _collector.pictures.clear()


def inline_html(svg: str, alt: str) -> str:
    """The picture as inline SVG for an HTML page: its node tooltips show on hover there.

    An SVG shown through ``<img>`` shows no tooltips. The XML prolog goes (HTML has none);
    ``role="img"`` with ``aria-label`` gives screen readers the text alternative; the SVG keeps
    its own width and height, and the CSS class (docs/_static/course.css) the ``<img>``'s
    layout: centred, never wider than the page.
    """
    start = svg.index("<svg")
    label = html.escape(alt, quote=True)
    opening = f'<svg class="course-graph" role="img" aria-label="{label}"'
    return '<div class="course-graph-box">' + opening + svg[start + 4 :].rstrip() + "</div>"


def _raw_html(markup: str) -> str:
    body = "\n".join("    " + line if line else "" for line in markup.splitlines())
    return f"\n\n.. raw:: html\n\n{body}\n\n"


_GLYPH_MISSING = r"Glyph \d+ .* missing from font"


def check_chart_glyphs() -> None:
    """Fail if a chart open now draws a character its font lacks (Chinese labels as boxes).

    Raises:
        RuntimeError: naming the text and the fix (``use_course_style()`` in the Setup cell).
    """
    if "matplotlib.pyplot" not in sys.modules:  # no chart without pyplot: nothing to import
        return
    import matplotlib.pyplot as plt

    for number in plt.get_fignums():
        figure = plt.figure(number)
        with warnings.catch_warnings(record=True) as caught:
            warnings.filterwarnings("always", message=_GLYPH_MISSING)
            figure.canvas.draw()
        missing = [str(w.message) for w in caught if re.match(_GLYPH_MISSING, str(w.message))]
        if missing:
            raise RuntimeError(
                f"chart {number} draws characters its font lacks ({missing[0]}); call "
                "common.charts.use_course_style() in the lesson's Setup cell"
            )


def scraper(block, block_vars, gallery_conf) -> str:
    """Image scraper, run after each cell: write its pictures as SVG, return their reST.

    The SVG file feeds the gallery's thumbnail; the page shows the picture inline (see
    ``inline_html``). Open charts are checked for missing glyphs before matplotlib's own
    scraper (listed after this one) saves them.
    """
    from common.viz import _collector

    check_chart_glyphs()
    rst = ""
    for svg, alt in _collector.pictures:
        path = Path(next(block_vars["image_path_iterator"])).with_suffix(".svg")
        path.write_text(svg, encoding="utf-8")
        rst += _raw_html(inline_html(svg, alt))
    _collector.pictures.clear()
    return rst
