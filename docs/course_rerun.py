"""What the build does again when its other inputs change: a lesson runs again when a module of
``common/`` it imports changed (directly or through other modules), and every page is read
again when the site's extensions did. ``PT2E_COURSE_LESSON`` builds one lesson alone.

sphinx-gallery redoes a lesson only when its own script changes, and Sphinx re-reads pages
when a setting changes but not when an extension's code does.
"""

import hashlib
import json
import shutil
from pathlib import Path

from sphinx.errors import ConfigError

from course_conf import DOCS, ROOT, module_folders, selected_lessons
from course_sources import (
    MEASURED_ONCE,
    common_closure,
    inputs_digest,
    measured_key,
    module_scripts,
    results_folder,
)

__all__ = ["digest", "lesson_inputs", "stale_inputs"]

#: What every lesson's page is also made by: the gallery hooks that put its pictures on it.
SHARED_INPUTS = (DOCS / "course_gallery.py",)


def digest(paths) -> str:
    """SHA-256 of the files' names and contents, in name order."""
    found = hashlib.sha256()
    for path in sorted(paths):
        found.update(path.name.encode() + b"\0" + path.read_bytes())
    return found.hexdigest()


def lesson_inputs(script: Path, first_cell: str) -> dict[str, str]:
    """What a lesson's page is made from besides its script, each file by its SHA-256: the
    ``common`` modules it imports (``common_closure``), the gallery hooks, the notebook's
    first cell and the stack's versions (under ``"stack"``)."""
    files = {
        path.relative_to(ROOT).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in [*common_closure(script), *SHARED_INPUTS]
    }
    files["first notebook cell"] = hashlib.sha256(first_cell.encode()).hexdigest()
    files["stack"] = inputs_digest([])
    return files


def stale_inputs(recorded: dict, now: dict) -> list[str]:
    """The inputs that changed, were added or went away since ``recorded``.

    >>> stale_inputs({"common/graph.py": "a", "common/lesson.py": "b"}, {"common/lesson.py": "b"})
    ['common/graph.py']
    """
    return sorted(name for name in {*recorded, *now} if recorded.get(name) != now.get(name))


def _rerun_when_inputs_changed(app) -> None:
    """Before the gallery runs: forget the run of every lesson whose inputs changed.

    sphinx-gallery redoes a lesson only when its own script changes (it keeps the script's MD5
    beside the page); its pictures, printed output and asserts also come from the ``common``
    modules it imports, the pictures reach the page through docs/course_gallery.py, and the
    notebook starts with ``first_notebook_cell``. Each lesson's inputs are kept beside its
    page (``<name>.py.inputs``); removing its ``.md5`` makes sphinx-gallery run it again. With
    ``PT2E_COURSE_LESSON`` set, only the lessons it names are considered (and run).
    """
    lang = app.config.language
    lessons = Path(app.srcdir, "lessons")
    first_cell = app.config.sphinx_gallery_conf["first_notebook_cell"]
    selected = selected_lessons()
    (lessons / "inputs.sha256").unlink(missing_ok=True)  # the one stamp of older builds
    # The landing page's figures are published by the lessons as they run: none without a run.
    results = results_folder(lang)
    everything = not results.is_dir()
    results.mkdir(parents=True, exist_ok=True)
    scripts = [s for folder in module_folders(lang) for s in module_scripts(lang, folder)]
    unknown = [n for n in selected if not any(s.stem.startswith(n) for s in scripts)]
    if unknown:
        names = ", ".join(s.stem for s in scripts)
        raise ConfigError(
            f"--lesson / PT2E_COURSE_LESSON names no lesson: {', '.join(unknown)}; give the start "
            f"of a lesson's file name (m07_4), one of: {names}"
        )
    if not selected:
        forget_old_timings({measured_key(script) for script in scripts})
    for script in scripts:
        if selected and not script.stem.startswith(tuple(selected)):
            continue
        now = lesson_inputs(script, first_cell)
        kept = lessons / script.parent.name / f"{script.name}.inputs"
        recorded = json.loads(kept.read_text()) if kept.exists() else {}
        changed = ["(no figures published yet)"] if everything else stale_inputs(recorded, now)
        if not changed:
            continue
        md5 = kept.with_name(f"{script.name}.md5")
        if md5.exists():  # a lesson that ran before: the build's output says why it runs again
            md5.unlink()
            print(f"{lang}: {script.stem} runs again: {', '.join(changed[:4])}", flush=True)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")


def forget_old_timings(keys: set[str]) -> None:
    """Remove the timings no lesson's inputs name any more (``common.cache.measured_once``
    keeps each lesson's under ``course_sources.measured_key``); the build's locks stay."""
    if not MEASURED_ONCE.is_dir():
        return
    for entry in MEASURED_ONCE.iterdir():
        if entry.is_dir() and entry.name not in keys:
            shutil.rmtree(entry, ignore_errors=True)


def setup(app) -> dict:
    # Sphinx re-reads every page when an "env" setting changes, but not when the code of an
    # extension does: this setting is that code, so a page never keeps what older code wrote
    # into it (the download line, the built-with line, the zh spacing).
    app.add_config_value("course_extension_code", digest(DOCS.glob("*.py")), "env")
    # Before sphinx-gallery's own builder-inited handler (priority 500) runs the lessons.
    app.connect("builder-inited", _rerun_when_inputs_changed, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
