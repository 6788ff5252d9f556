"""sphinx-gallery hooks: collect the pictures ``draw`` makes while a lesson runs on the site.

Kept apart from common.viz so that resolving these hooks does not import torch: a docs
rebuild with no lesson to run then never pays for it.
"""

from pathlib import Path

__all__ = ["reset", "scraper"]


def reset(gallery_conf, fname) -> None:
    """``reset_modules`` hook, run before each lesson: quiet the stack, collect pictures.

    Args:
        gallery_conf: sphinx-gallery's configuration (unused).
        fname: the lesson's file name (unused).
    """
    from common.pt2e import quiet
    from common.viz import _collector

    quiet()
    _collector.active = True
    _collector.pictures.clear()


def scraper(block, block_vars, gallery_conf) -> str:
    """Image scraper, run after each cell: write its pictures as SVG, return their reST.

    Args:
        block: the code cell that just ran (unused).
        block_vars: sphinx-gallery's per-cell data; its ``image_path_iterator`` names the
            files the pictures go to.
        gallery_conf: sphinx-gallery's configuration (its ``src_dir``).

    Returns:
        str: the reST of one figure per picture ``draw`` made in the cell ("" when none).
    """
    from sphinx_gallery.scrapers import figure_rst

    from common.viz import _collector

    rst = ""
    for svg, title in _collector.pictures:
        path = Path(next(block_vars["image_path_iterator"])).with_suffix(".svg")
        path.write_text(svg, encoding="utf-8")
        rst += figure_rst([str(path)], gallery_conf["src_dir"], fig_titles=title)
    _collector.pictures.clear()
    return rst
