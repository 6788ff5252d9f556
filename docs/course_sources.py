"""Where the site's extensions find a lesson: its script, its number, its page, its pictures
and its figures, and which file a gallery page is made from (page_source).

Not an extension: the generated pages (course_directives.py), the landing page's results
(course_results.py), the per-page links (course_links.py), the section anchors
(course_anchors.py), the gallery's tidy-up (course_gallery_tidy.py), the re-run stamp
(course_rerun.py) and the gallery hooks (course_gallery.py) share it.
"""

import hashlib
import re
from importlib import metadata
from pathlib import Path

from course_conf import ROOT, module_folders

__all__ = [
    "MEASURED_ONCE",
    "card_picture",
    "common_closure",
    "find_lesson",
    "focus_picture",
    "inputs_digest",
    "is_lesson_page",
    "lesson_label",
    "lesson_number",
    "lesson_sources",
    "measured_key",
    "module_readme",
    "module_scripts",
    "page_scripts",
    "page_source",
    "results_folder",
]

_NUMBERED = re.compile(r"m(\d\d)_(\d+)_")
# How a lesson names its gallery thumbnail's picture (sphinx-gallery's per-file setting).
_THUMBNAIL_NUMBER = re.compile(r"^# sphinx_gallery_thumbnail_number = (\d+)$", re.M)


def module_scripts(lang: str, folder: str) -> list[Path]:
    """A module's scripts in course order (M00-2 before M00-10; unnumbered ones by name)."""

    def order(script: Path):
        match = _NUMBERED.match(script.name)
        return (0, int(match[2]), "") if match else (1, 0, script.name)

    scripts = (ROOT / "examples" / lang / folder).glob("*.py")
    return sorted((s for s in scripts if s.name != "__init__.py"), key=order)


def module_readme(lang: str, folder: str) -> Path:
    """A module's README.txt: its title and paragraph, the source of its gallery page."""
    return ROOT / "examples" / lang / folder / "README.txt"


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


def page_source(lang: str, docname: str) -> Path | None:
    """The file a gallery page is made from: a lesson page's script, a module page's README.txt
    (under examples/<lang>); None for any other page, or when the file is not there.

    >>> page_source("en", "lessons/m00_graphs/index").name
    'README.txt'
    >>> page_source("en", "glossary") is None
    True
    """
    parts = docname.split("/")
    if len(parts) != 3 or parts[0] != "lessons":  # lessons/<module>/<page>
        return None
    readme = module_readme(lang, parts[1])
    path = readme if parts[2] == "index" else readme.with_name(f"{parts[2]}.py")
    return path if path.is_file() else None


def page_scripts(lang: str, docname: str) -> list[Path]:
    """The scripts a gallery page offers for download: a lesson's own, or all of a module's."""
    source = page_source(lang, docname)
    if source is None:
        return []
    return [source] if source.suffix == ".py" else [*source.parent.glob("*.py")]


def card_picture(srcdir: Path, script: Path) -> str | None:
    """The picture a lesson's card stems from, as a path from the source dir: the picture the
    gallery thumbnail shows (``sphinx_gallery_thumbnail_number``, else 1), or its focus picture
    when there is one (docs/course_gallery.py writes one, ``<name>_focus.svg``, beside each
    ``draw(..., highlight=...)`` picture). None before the lesson's first run."""
    found = _THUMBNAIL_NUMBER.search(script.read_text("utf-8"))
    picture = f"lessons/{script.parent.name}/images/sphx_glr_{script.stem}_"
    picture += f"{int(found.group(1)) if found else 1:03d}"
    # The focus picture when there is one, else the picture: the lesson's next run writes it
    # again, and a page that noted it is read again then (a missing file would make it every
    # build).
    for candidate in (f"{picture}_focus.svg", f"{picture}.svg", f"{picture}.png"):
        if (srcdir / candidate).exists():
            return candidate
    return None


def focus_picture(picture: str | None) -> str | None:
    """``picture`` if it is a focus picture: the only kind a card or a thumbnail shows."""
    return picture if picture and picture.endswith("_focus.svg") else None


def results_folder(lang: str) -> Path:
    """Where the lessons of one language publish their figures while the site is built."""
    return ROOT / "build" / "results" / lang


#: Where timings are kept while the site is built, shared by both languages' builds
#: (common.timing.measured_once): keyed by what was timed, so both pages show one measurement.
MEASURED_ONCE = ROOT / "build" / "cache" / "measured"


# ------------------------------------------------------------- what a lesson's run depends on

COMMON = ROOT / "common"
#: The packages whose versions every lesson's inputs include: a new release runs it again.
STACK = ("torch", "torchao", "executorch")


def common_closure(script: Path) -> list[Path]:
    """The files of ``common/`` that running ``script`` may execute
    (``common.digest.import_closure``: what it imports, directly or through other ``common``
    modules, or in a code string it hands a subprocess).

    >>> lesson = ROOT / "examples/en/m00_graphs/m00_1_getting_a_graph.py"
    >>> [p.name for p in common_closure(lesson)][:2]
    ['__init__.py', 'charts.py']
    """
    from common.digest import import_closure

    return import_closure(script, ROOT)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def inputs_digest(paths, *extra: str) -> str:
    """SHA-256 of the files' names and contents, the stack's versions and ``extra``."""
    found = hashlib.sha256()
    for path in sorted(paths):
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        found.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for part in [*(f"{name} {_version(name)}" for name in STACK), *extra]:
        found.update(part.encode() + b"\0")
    return found.hexdigest()


def find_lesson(lang: str, file_name: str) -> Path | None:
    """The script ``file_name`` (``m03_3_speed_and_size.py``) under examples/<lang>, any module."""
    found = sorted((ROOT / "examples" / lang).glob(f"*/{file_name}"))
    return found[0] if found else None


def measured_key(script: Path) -> str:
    """The subfolder of ``MEASURED_ONCE`` the timings of a lesson are kept in while the site is
    built (``common.lesson.start(inputs=...)``): named by the stack and the lesson's ``common``
    closure, so its twin (the same code, the same closure) shares them, and an edit outside
    that closure keeps them."""
    return inputs_digest(common_closure(script))[:24]
