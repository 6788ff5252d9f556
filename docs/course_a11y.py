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


def setup(app):
    # After the theme has put generate_toctree_html into the page context.
    app.connect("html-page-context", _page_context, priority=900)
    app.add_js_file("course-a11y.js")  # docs/_static
    # Graphs open full size with pan and zoom; a tap or Tab on a node shows its tooltip, which
    # touch screens and keyboards never get from an SVG <title> (docs/_static/course-graph.js).
    app.add_js_file("course-graph.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
