"""Accessibility fixes to the theme's markup, checked by axe-core in tests/test_site.py."""

import html
import re

# pydata-sphinx-theme gives each collapsible entry of the section navigation a <summary>
# holding only a chevron icon: a toggle a screen reader can name only as "disclosure".
# No upstream issue found for it (pydata-sphinx-theme 0.24.0 still does it); remove this when
# the theme names its toggles (tests/test_site.py's axe check fails without it).
_TOGGLE = re.compile(
    r'(<a [^>]*class="[^"]*reference internal[^"]*"[^>]*>((?:(?!</a>).)*)</a>\s*<details[^>]*>\s*)'
    r"<summary>",
    re.S,
)
_TOGGLE_LABEL = {"zh_TW": "{title} 的頁面", "en": "Pages in {title}"}


def label_toggles(markup: str, language: str) -> str:
    """Name every section-navigation toggle after the entry it opens."""
    template = _TOGGLE_LABEL.get(language, _TOGGLE_LABEL["en"])

    def named(match: re.Match) -> str:
        title = html.unescape(re.sub(r"<[^>]+>", "", match[2])).strip()
        label = html.escape(template.format(title=title), quote=True)
        return f'{match[1]}<summary aria-label="{label}">'

    return _TOGGLE.sub(named, markup)


def _page_context(app, pagename, templatename, context, doctree) -> None:
    generate = context.get("generate_toctree_html")
    if generate is None:
        return

    def generate_labelled(*args, **kwargs):
        return label_toggles(str(generate(*args, **kwargs)), app.config.language)

    context["generate_toctree_html"] = generate_labelled


def _theme_pygments_from_the_start(app) -> None:
    """Write the theme's code colours where Sphinx writes its own.

    Each HTML build writes ``_static/pygments.css`` twice: Sphinx's own stylesheet (tango
    colours, unprefixed) when it copies the static files, then, at build-finished,
    pydata-sphinx-theme's (its light and dark styles, under ``html[data-theme=...]``). A page
    loaded between the two, seconds apart under load, showed tango's strings (#4e9a06) on the
    theme's code background (#f3f4f5): contrast 3.2, axe's colour-contrast check failed on the
    FX article's 18 string literals while another build of the site ran (tests/test_site.py,
    a test worker's no-op build; issue #43). No upstream issue found (pydata-sphinx-theme
    0.24.0 still does it); remove this when the theme writes its stylesheet in Sphinx's place.
    """
    builder = app.builder
    if not hasattr(builder, "create_pygments_style_file"):
        return
    from pydata_sphinx_theme.pygments import overwrite_pygments_css

    builder.create_pygments_style_file = lambda: overwrite_pygments_css(app)


def setup(app):
    # After the theme has put generate_toctree_html into the page context.
    app.connect("html-page-context", _page_context, priority=900)
    app.connect("builder-inited", _theme_pygments_from_the_start)
    app.add_js_file("course-a11y.js")  # docs/_static
    # Graphs open full size with pan and zoom; a tap or Tab on a node shows its tooltip, which
    # touch screens and keyboards never get from an SVG <title> (docs/_static/course-graph.js).
    app.add_js_file("course-graph.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
