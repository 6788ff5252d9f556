"""What the build does again when its other inputs change: every lesson runs again when the
code that makes its page changed, and every page is read again when the site's extensions did.

sphinx-gallery redoes a lesson only when its own script changes, and Sphinx re-reads pages
when a setting changes but not when an extension's code does.
"""

import hashlib
from pathlib import Path

from course_conf import DOCS, ROOT
from course_sources import results_folder


def digest(paths) -> str:
    """SHA-256 of the files' names and contents, in name order."""
    found = hashlib.sha256()
    for path in sorted(paths):
        found.update(path.name.encode() + b"\0" + path.read_bytes())
    return found.hexdigest()


def _rerun_when_outputs_may_differ(app) -> None:
    """Before the gallery runs: redo every lesson when what else makes its page has changed.

    sphinx-gallery redoes a lesson only when its own script changes (it keeps the script's MD5
    beside the page), yet the pictures, the printed output and the asserts come from
    ``common/`` as much as from the lesson, the pictures reach the page through
    docs/course_gallery.py, and the notebook starts with ``first_notebook_cell``.
    """
    lessons = Path(app.srcdir, "lessons")
    inputs = [*(ROOT / "common").glob("*.py"), DOCS / "course_gallery.py"]
    first_cell = app.config.sphinx_gallery_conf["first_notebook_cell"]
    stamp = digest(inputs) + hashlib.sha256(first_cell.encode()).hexdigest()
    recorded = lessons / "inputs.sha256"
    # The landing page's figures are published by the lessons as they run: none without a run.
    results = results_folder(app.config.language)
    if recorded.exists() and recorded.read_text() == stamp and results.is_dir():
        return
    for md5 in lessons.glob("*/*.py.md5"):
        md5.unlink()
    lessons.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    recorded.write_text(stamp)


def setup(app) -> dict:
    # Sphinx re-reads every page when an "env" setting changes, but not when the code of an
    # extension does: this setting is that code, so a page never keeps what older code wrote
    # into it (the download line, the built-with line, the zh spacing).
    app.add_config_value("course_extension_code", digest(DOCS.glob("*.py")), "env")
    # Before sphinx-gallery's own builder-inited handler (priority 500) runs the lessons.
    app.connect("builder-inited", _rerun_when_outputs_may_differ, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
