"""What a language's build publishes beside its pages: ``<lang>/sitemap.xml`` lists every page
with its twin, and the theme's template macros are not published.

Written by hand because sphinx-sitemap lists only the pages a build wrote, so an incremental
build gives an incomplete sitemap (jdillard/sphinx-sitemap#13, open as of 2.9); the extension
can replace this once that is fixed. The sitemap index at the site's root is written by
site_build.write_site_root.
"""

from pathlib import Path
from xml.sax.saxutils import escape

from course_conf import TEXT
from site_facts import SITE_URL, other_language


def _sitemap(app, exc) -> None:
    """<lang>/sitemap.xml: every page of the language, each with its twin in the other language."""
    if exc is not None or app.builder.format != "html":
        return
    lang = app.config.language
    other = other_language(lang)
    entries = [
        f"  <url><loc>{escape(f'{SITE_URL}{lang}/{page}.html')}</loc>\n"
        f'    <xhtml:link rel="alternate" hreflang="{TEXT[other]["hreflang"]}" '
        f'href="{escape(f"{SITE_URL}{other}/{page}.html")}"/></url>'
        for page in sorted(app.env.found_docs - {"genindex", "search"})
    ]
    (Path(app.outdir) / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:xhtml="http://www.w3.org/1999/xhtml">\n' + "\n".join(entries) + "\n</urlset>\n",
        encoding="utf-8",
    )


def _drop_theme_macros(app, exc) -> None:
    """pydata-sphinx-theme's webpack-macros.html is a template, not a page, yet Sphinx copies it
    into the output at every build, an incremental one included: removed after each build, not
    once after both, so a build of one language (tests/test_build.py) publishes none either."""
    if app.builder.format != "html":
        return
    for folder in (Path(app.outdir), Path(app.outdir) / "_static"):
        (folder / "webpack-macros.html").unlink(missing_ok=True)


def setup(app) -> dict:
    app.connect("build-finished", _sitemap)
    app.connect("build-finished", _drop_theme_macros)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
