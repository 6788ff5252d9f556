"""Sphinx configuration shared by the per-language builds (docs/<lang>/conf.py)."""

import logging
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

TEXT = {
    "zh_TW": {
        "project": "PT2E 量化：從圖開始",
        "gallery_title": "課程",
    },
    "en": {
        "project": "PT2E quantization from the graph up",
        "gallery_title": "Lessons",
    },
}


def make_config(lang: str) -> dict:
    """Return the Sphinx settings for one language ("zh_TW" or "en")."""
    if lang == "zh_TW":
        import jieba  # segments Chinese words for the search index

        # jieba announces on stderr, at every build, how it loads its dictionary.
        jieba.setLogLevel(logging.WARNING)
    text = TEXT[lang]
    return {
        "project": text["project"],
        "author": "pt2e-course contributors",
        "copyright": "2026, pt2e-course contributors",
        "language": lang,
        "extensions": ["myst_nb", "sphinx_gallery.gen_gallery", "sphinx_design"],
        "html_theme": "pydata_sphinx_theme",
        "html_title": text["project"],
        "html_static_path": [str(DOCS / "_static")],
        "html_theme_options": {
            "navigation_with_keys": False,
            "show_toc_level": 2,
            "footer_start": ["copyright"],
            "footer_end": [],
        },
        "html_show_sourcelink": False,
        # jieba segments Chinese words for the search index; English keeps the default.
        "html_search_language": "zh" if lang == "zh_TW" else "en",
        "exclude_patterns": [
            "_build",
            # The gallery writes its .py/.ipynb downloads next to the pages; they are not
            # Sphinx sources (myst-nb would read the notebooks and run them again).
            "lessons/**/*.ipynb",
            "lessons/**/*.py",
            "lessons/**/*.zip",
            "lessons/*.ipynb",
            "lessons/*.py",
        ],
        "myst_enable_extensions": ["colon_fence", "deflist"],
        "nb_execution_mode": "cache",
        "nb_execution_cache_path": str(ROOT / "build" / "jupyter_cache" / lang),
        "nb_execution_raise_on_error": True,
        "nb_execution_timeout": 300,
        "sphinx_gallery_conf": {
            # Relative to docs/<lang>/: sphinx-gallery links pages by these paths.
            "examples_dirs": f"../../examples/{lang}",
            "gallery_dirs": "lessons",
            "filename_pattern": r"/m\d\d_\d+_",
            "ignore_pattern": r"__init__\.py",
            "image_scrapers": ("common.viz.gallery_scraper",),
            "reset_modules": ("common.viz.gallery_reset",),
            # A lesson that raises must fail the build, never become a page with a traceback.
            "abort_on_example_error": True,
            "only_warn_on_example_error": False,
            "capture_repr": (),
            "write_computation_times": False,
            "download_all_examples": True,
            "remove_config_comments": True,
            "show_signature": False,
            "plot_gallery": "True",
            "min_reported_time": 3600,
        },
    }
