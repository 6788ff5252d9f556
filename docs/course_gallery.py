"""The site's sphinx-gallery hooks: start each lesson as the build runs it (common.lesson: its
language, its figures' file, timings measured once), and put the pictures ``draw`` makes on the
lesson pages.

Part of the site's build (docs/course_conf.py names them), not of what readers import. Kept
apart from common.viz so that resolving these hooks does not import torch: a docs rebuild with
no lesson to run then never pays for it.
"""

import html
import sys
from pathlib import Path

__all__ = ["forget_earlier_pictures", "reset", "scraper"]


def reset(gallery_conf, fname) -> None:
    """``reset_modules`` hook, run before each lesson: quiet the stack, state the lesson
    (``common.lesson.start``: its language, its pictures collected, the figures it publishes
    sent to its own file, its timings kept for the other language's build under its inputs,
    ``course_sources.measured_key``), start it with
    inductor's default freezing (``common.timing.race`` sets freezing for its process, and
    every lesson of a language runs in one process), and once torchao is loaded, export its
    pattern graphs once for the whole build (docs/pattern_graphs.py).

    Args:
        gallery_conf: sphinx-gallery's configuration; its ``src_dir`` is the language's docs
            folder (docs/<lang>).
        fname: the lesson's file name.
    """
    from common import lesson
    from common.pt2e import quiet

    from course_sources import MEASURED_ONCE, find_lesson, measured_key, results_folder

    quiet()
    if "torch._inductor.config" in sys.modules:
        sys.modules["torch._inductor.config"].freezing = False
    forget_earlier_main()
    if "torchao.quantization.pt2e.utils" in sys.modules:
        from pattern_graphs import export_once

        export_once()
    lang = Path(gallery_conf["src_dir"]).name
    name = Path(fname).stem
    forget_earlier_pictures(Path(gallery_conf["src_dir"]), name)
    script = find_lesson(lang, Path(fname).name)
    lesson.start(
        lang=lang,
        name=name,
        results=results_folder(lang),
        measured=MEASURED_ONCE,
        inputs=measured_key(script) if script else None,
    )


def forget_earlier_pictures(src_dir: Path, name: str) -> None:
    """Remove the pictures an earlier run of lesson ``name`` left. sphinx-gallery overwrites
    the ones a run writes again but keeps the others, and takes a lesson's thumbnail from the
    first of ``_001.png``, ``_001.svg`` it finds: a lesson whose first picture became a graph
    (svg) kept its old chart (png) as its thumbnail."""
    images = [
        *src_dir.glob(f"lessons/*/images/sphx_glr_{name}_[0-9][0-9][0-9]*"),
        *src_dir.glob(f"lessons/*/images/thumb/sphx_glr_{name}_thumb.*"),
    ]
    for picture in images:
        picture.unlink()


def forget_earlier_main() -> None:
    """Let dynamo find this lesson's ``__main__``, not the first one it met in the process.

    sphinx-gallery runs each lesson in a ``__main__`` module of its own. Dynamo (torch 2.13)
    imports ``__main__`` once per process (``torch._dynamo.symbolic_convert._import_module``
    is a ``functools.cache``) and keeps it as ``__import___main__`` in the globals of the frame
    it compiles (``torch._dynamo.functional_export`` for a strict export). A later lesson's
    strict export of a class it defines then looks up its globals in an earlier lesson's
    module: ``AttributeError: module '__main__' has no attribute 'F'`` (m99_1 after M07-1). A
    reader runs one lesson per process and never meets it; no upstream issue was found as of
    torch 2.13.0. Both private names are checked before use, so a torch that renames them
    gets no patch and fails loudly in the lesson instead.
    """
    convert = sys.modules.get("torch._dynamo.symbolic_convert")
    cached = getattr(convert, "_import_module", None)
    if cached is None or not hasattr(cached, "cache_clear"):
        return
    cached.cache_clear()
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and "__import___main__" in namespace:
            del namespace["__import___main__"]


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


def missing_glyphs(figure) -> list[str]:
    """The characters of a matplotlib figure's texts that no font of theirs can draw.

    Each text is checked against the fonts matplotlib would draw it with (its family and the
    fallbacks after it), so a Chinese label set in DejaVu Sans alone is found, boxes and all.
    """
    from matplotlib import font_manager
    from matplotlib.text import Text

    missing = []
    for text in figure.findobj(Text):
        string = text.get_text()
        wanted = sorted({c for c in string if not c.isascii() and not c.isspace()})
        if not wanted or not text.get_visible() or "$" in string:  # mathtext has its own fonts
            continue
        # The fallback chain matplotlib's Agg and SVG backends draw text with.
        paths = font_manager.fontManager._find_fonts_by_props(text.get_fontproperties())
        fonts = [font_manager.get_font(path) for path in paths]
        for char in wanted:
            if not any(font.get_char_index(ord(char)) for font in fonts):
                missing.append(f"{char!r} of {string!r}")
    return missing


def check_chart_glyphs() -> None:
    """Fail if a chart open now draws a character its fonts lack (Chinese labels as boxes).

    Raises:
        RuntimeError: naming the text and the fix (``use_course_style()`` in the Setup cell).
    """
    if "matplotlib.pyplot" not in sys.modules:  # no chart without pyplot: nothing to import
        return
    import matplotlib.pyplot as plt

    for number in plt.get_fignums():
        missing = missing_glyphs(plt.figure(number))
        if missing:
            raise RuntimeError(
                f"chart {number} has characters its fonts cannot draw ({', '.join(missing[:3])}); "
                "call common.charts.use_course_style() in the lesson's Setup cell"
            )


def scraper(block, block_vars, gallery_conf) -> str:
    """Image scraper, run after each cell: write its pictures as SVG, return their reST.

    The SVG file feeds the gallery's thumbnail; the page shows the picture inline (see
    ``inline_html``). A picture with highlighted nodes also gets its focus picture beside it,
    ``<name>_focus.svg`` (``common.viz.focus_svg``): the course map's and the landing page's
    cards show that one (docs/course_directives.py). Open charts are checked for missing
    glyphs before matplotlib's own scraper (listed after this one) saves them.

    Args:
        block: the code cell that just ran (unused).
        block_vars: sphinx-gallery's per-cell data; its ``image_path_iterator`` names the
            files the pictures go to.
        gallery_conf: sphinx-gallery's configuration (unused).

    Returns:
        str: reST with one inline picture per ``draw`` call of the cell ("" when none).
    """
    from common.lesson import take_pictures
    from common.turns import let_a_timing_in

    let_a_timing_in()  # between two cells, a timing of the other build may run
    check_chart_glyphs()
    rst = ""
    for svg, alt, focus in take_pictures():
        path = Path(next(block_vars["image_path_iterator"])).with_suffix(".svg")
        path.write_text(svg, encoding="utf-8")
        focus_path = path.with_name(f"{path.stem}_focus.svg")
        if focus:
            focus_path.write_text(focus, encoding="utf-8")
        else:  # the picture lost its highlight since the last build
            focus_path.unlink(missing_ok=True)
        rst += _raw_html(inline_html(svg, alt))
    return rst
