"""Where the site's extensions find a lesson: its script, its number, its page and its figures.

Not an extension: the directives (course_directives.py), the per-page links (course_links.py),
the re-run stamp (course_rerun.py) and the gallery hooks (course_gallery.py) share it.
"""

import re
from pathlib import Path

from course_conf import ROOT, module_folders

__all__ = [
    "MEASURED_ONCE",
    "is_lesson_page",
    "lesson_label",
    "lesson_number",
    "lesson_sources",
    "module_scripts",
    "results_folder",
]

_NUMBERED = re.compile(r"m(\d\d)_(\d+)_")


def module_scripts(lang: str, folder: str) -> list[Path]:
    """A module's scripts in course order (M00-2 before M00-10; unnumbered ones by name)."""

    def order(script: Path):
        match = _NUMBERED.match(script.name)
        return (0, int(match[2]), "") if match else (1, 0, script.name)

    scripts = (ROOT / "examples" / lang / folder).glob("*.py")
    return sorted((s for s in scripts if s.name != "__init__.py"), key=order)


def lesson_number(script: Path) -> str | None:
    """The lesson's number ("M01-2") from its file name; None for an unnumbered script."""
    match = _NUMBERED.match(script.name)
    return f"M{match[1]}-{match[2]}" if match else None


def lesson_sources(lang: str) -> dict[str, Path]:
    """Lesson number ("M01-2") -> its script under examples/<lang>, in course order."""
    found = {}
    for folder in module_folders(lang):
        for script in module_scripts(lang, folder):
            number = lesson_number(script)
            if number:
                found[number] = script
    return found


def lesson_label(script: Path) -> str:
    """The label sphinx-gallery gives a lesson's page (from its path under the source dir)."""
    return f"sphx_glr_lessons_{script.parent.name}_{script.name}"


def is_lesson_page(pagename: str) -> bool:
    """A page sphinx-gallery made from a lesson (not a module's or the lessons' index)."""
    return pagename.startswith("lessons/") and not pagename.endswith("index")


def results_folder(lang: str) -> Path:
    """Where the lessons of one language publish their figures while the site is built."""
    return ROOT / "build" / "results" / lang


#: Where timings are kept while the site is built, shared by both languages' builds
#: (common.timing.measured_once): keyed by what was timed, so both pages show one measurement.
MEASURED_ONCE = ROOT / "build" / "cache" / "measured"
