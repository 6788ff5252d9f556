"""Measure what the course costs to build, test and draw; print a table and write RESULTS.md.

Run it with ``nox -s bench`` (or ``python benchmarks/bench.py`` in an environment with the
course installed and nox on PATH). What it runs, in order:

- the floor: every lesson through the build's own per-lesson hooks (``reset_modules``: the
  matplotlib reset and docs/course_gallery.py's ``reset``), each language in its own process,
  both at once as ``nox -s docs`` runs them, nothing written where the site keeps its pages,
  figures or timings;
- a clean ``nox -s docs`` (trained weights, compiled kernels and packages kept; pages, figures
  and timings removed), then no-op rebuilds;
- ``nox -s docs`` after an edit of one lesson's twins, after an edit of the op atlas
  (common/atlas/), and ``nox -s docs -- --lesson <lesson>`` after an edit of the twins: each
  edit is undone and the site built again afterwards;
- ``nox -s tests``, a no-op rebuild after it, and ``nox -s tests -- -k <lesson>`` after an
  edit of its twins;
- ``bash .ci/run`` on a fresh clone, whose cold first ``nox -s docs`` it reports too
  (``--no-ci`` skips it);
- draw()'s renderer against torch's FxGraphDrawer, and the M03-3 speed-and-size table.

About 30 minutes on 2 cores with ``--no-ci`` (the floor ~6, the clean build ~6, the tests
~13), plus a whole ``.ci/run`` (~30 minutes) without it.
``--m03-only`` measures only the M03-3 speed-and-size table (`nox -s bench -- --m03-only`).
"""

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from site_facts import LANGUAGES  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
EDITED_LESSON = Path("m00_graphs") / "m00_4_graph_surgery.py"
# The op atlas's lesson: an edit of the atlas (common/atlas/) must re-run it and nothing else.
ATLAS_LESSON = "m07_4_op_atlas"
# Modules with a build budget of their own: seconds they may add to a clean build.
MODULE_BUDGETS = {"m07_your_model": 60}
TESTS_BUDGET = 600  # seconds of `nox -s tests`, the virtualenv present
CI_BUDGET = 40 * 60  # seconds of `bash .ci/run` on a fresh clone
FLOOR_ROW = "floor: every lesson, each language in its own process, both at once"


def lesson_paths(languages=LANGUAGES) -> list[Path]:
    """Every lesson script of ``languages``, the quickstart and troubleshooting included."""
    return sorted(
        path
        for lang in languages
        for pattern in ("*/m[0-9][0-9]_*.py", "quickstart/quickstart.py")
        for path in (ROOT / "examples" / lang).glob(pattern)
    )


def atlas_file() -> Path:
    """The op atlas file the atlas edit changes: common/atlas/run.py once the atlas is a
    package, common/atlas.py before."""
    package = ROOT / "common" / "atlas" / "run.py"
    return package if package.is_file() else ROOT / "common" / "atlas.py"


FLOOR_MARK = "@@floor@@"


def build_order(lang: str, only: list[str] | None = None) -> list[Path]:
    """The lessons of ``lang`` in the order its build runs them: the galleries in
    ``module_folders`` order, each gallery's scripts by file name (``FileNameSortKey``).
    ``only``: those of these paths under examples/<lang> (``m00_graphs/m00_1_....py``)."""
    from course_conf import module_folders

    scripts = [
        script
        for folder in module_folders(lang)
        for script in sorted((ROOT / "examples" / lang / folder).glob("*.py"))
        if script.name != "__init__.py"
    ]
    if only is not None:
        scripts = [s for s in scripts if s.relative_to(ROOT / "examples" / lang).as_posix() in only]
    return scripts


def reset_hooks(lang: str) -> tuple[list, list]:
    """The build's per-lesson hooks for ``lang``, as sphinx-gallery resolves its
    ``reset_modules`` (docs/course_conf.py: the matplotlib reset, then
    ``course_gallery.reset``): those it calls before a lesson and those after it."""
    import importlib

    from sphinx_gallery.scrapers import _reset_dict

    from course_conf import make_config

    conf = make_config(lang)["sphinx_gallery_conf"]
    hooks = []
    for hook in conf["reset_modules"]:
        if isinstance(hook, str) and hook in _reset_dict:
            hook = _reset_dict[hook]
        elif isinstance(hook, str):
            module, _, name = hook.rpartition(".")
            hook = getattr(importlib.import_module(module), name)
        hooks.append(hook)
    order = conf.get("reset_modules_order", "before")
    return (hooks if order in ("before", "both") else []), (
        hooks if order in ("after", "both") else []
    )


def run_floor(lang: str, scratch: Path, only: list[str] | None = None) -> None:
    """Execute every lesson of ``lang`` (or ``only`` those) in this one process, as
    sphinx-gallery does (one process per language: a lesson may change what the process can
    do, as m99_5's ExecuTorch kernels do), calling the build's own per-lesson hooks
    (``reset_hooks``: docs/course_gallery.py's ``reset`` among them) before each, and print
    each lesson's seconds (its hooks included) and the part of them its timing steps took (one
    JSON line after FLOOR_MARK).

    The hooks write where ``scratch`` says, never where the site keeps things: the pictures
    they forget under ``<scratch>/<lang>/lessons/`` (the gallery's source folder they are
    given), the figures the lessons publish under ``<scratch>/results/<lang>``, the timings
    under ``<scratch>/measured``, shared by both languages' floor processes: measured once, as
    in a build (course_sources' ``results_folder`` and ``MEASURED_ONCE``, replaced in this
    process)."""
    import matplotlib

    matplotlib.use("Agg")  # as sphinx-gallery's scraper does: plt.show() draws nothing
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(ROOT))
    import course_sources

    course_sources.results_folder = lambda language: scratch / "results" / language
    course_sources.MEASURED_ONCE = scratch / "measured"
    # Before torch, as in the build: its settings set TORCHINDUCTOR_CACHE_DIR (the compiled
    # kernels M03-3 reuses, where the builds keep them).
    before, after = reset_hooks(lang)
    gallery_conf = {"src_dir": str(scratch / lang)}  # reset reads the language from its name
    (scratch / lang / "lessons").mkdir(parents=True, exist_ok=True)
    import torch  # noqa: F401  (imported once, before the clock of the first lesson)

    from common.lesson import running, take_pictures

    seconds, timing = {}, {}
    for path in build_order(lang, only):
        started = time.perf_counter()
        for hook in before:
            hook(gallery_conf, path.name)
        timed_before = running.measuring
        print(f"floor: {path.relative_to(ROOT)}", file=sys.stderr, flush=True)
        with contextlib.redirect_stdout(open(os.devnull, "w")), _chdir(path.parent):
            runpy.run_path(str(path), run_name="__main__")
        take_pictures()  # the gallery's scraper takes them after each cell
        plt.close("all")
        for hook in after:
            hook(gallery_conf, path.name)
        lesson = str(path.relative_to(ROOT / "examples"))
        seconds[lesson] = time.perf_counter() - started
        timing[lesson] = running.measuring - timed_before
    print(FLOOR_MARK + json.dumps({"seconds": seconds, "timing": timing}))


def floor_once(only: list[str] | None = None) -> tuple[float, dict, dict]:
    """One floor run: ``run_floor`` of each language in its own fresh process, all started
    together, as ``nox -s docs`` starts its sphinx-build processes. Returns the wall time of
    them all, and each lesson's seconds and timing steps' seconds."""
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        started = time.perf_counter()
        running = {}
        for lang in LANGUAGES:
            # Output to files, not pipes: a full pipe would stall a process the other outlives.
            out = open(scratch / f"{lang}.out", "w+")
            err = open(scratch / f"{lang}.err", "w+")
            command = [sys.executable, str(Path(__file__).resolve()), "--floor", lang, folder]
            process = subprocess.Popen([*command, *(only or [])], cwd=ROOT, stdout=out, stderr=err)
            running[lang] = (process, out, err)
        codes = {lang: process.wait() for lang, (process, _, _) in running.items()}
        wall = time.perf_counter() - started
        seconds, timing = {}, {}
        for lang, (_, out, err) in running.items():
            out.seek(0), err.seek(0)
            stdout, stderr = out.read(), err.read()
            out.close(), err.close()
            if codes[lang]:
                sys.exit(f"the {lang} floor run failed:\n{stderr[-5000:]}")
            line = next(x for x in stdout.splitlines() if x.startswith(FLOOR_MARK))
            found = json.loads(line[len(FLOOR_MARK) :])
            seconds |= found["seconds"]
            timing |= found["timing"]
    return wall, seconds, timing


def measure_floor(repeat: int) -> tuple[float, dict[str, float], dict[str, float]]:
    """Median wall time of ``floor_once``, each lesson's median seconds and the median seconds
    of its timing steps."""
    totals, per_lesson, timing = [], {}, {}
    for _ in range(repeat):
        wall, seconds, timed_steps = floor_once()
        totals.append(wall)
        for lesson, spent in seconds.items():
            per_lesson.setdefault(lesson, []).append(spent)
            timing.setdefault(lesson, []).append(timed_steps[lesson])
    medians = [{k: statistics.median(v) for k, v in d.items()} for d in (per_lesson, timing)]
    return statistics.median(totals), *medians


def module_seconds(per_lesson: dict[str, float]) -> dict[str, dict[str, float]]:
    """Module folder -> language -> seconds of its lessons in the floor run."""
    modules: dict[str, dict[str, float]] = {}
    for lesson, spent in per_lesson.items():
        lang, module = Path(lesson).parts[:2]
        modules.setdefault(module, {}).setdefault(lang, 0.0)
        modules[module][lang] += spent
    return dict(sorted(modules.items()))


@contextlib.contextmanager
def _chdir(folder: Path):
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def run(command: list[str], **kwargs) -> tuple[float, str]:
    """Seconds ``command`` took in the repository and its output (stdout, then stderr); a
    failure stops the benchmark."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, **kwargs)
    elapsed = time.perf_counter() - started
    if result.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed, result.stdout + result.stderr


def timed(command: list[str], **kwargs) -> float:
    return run(command, **kwargs)[0]


def median_of(repeat: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeat))


def clean_generated() -> None:
    """Remove the built site, what sphinx-gallery wrote, the lessons' published figures and
    their timings, as on a fresh clone (the floor measures every timing too); keep the rest of
    build/cache and the inductor cache (trained weights, compiled kernels and packages)."""
    sys.path.insert(0, str(ROOT / "docs"))
    from course_sources import MEASURED_ONCE

    shutil.rmtree(ROOT / "build" / "html", ignore_errors=True)
    shutil.rmtree(ROOT / "build" / "jupyter_cache", ignore_errors=True)
    shutil.rmtree(ROOT / "build" / "results", ignore_errors=True)
    shutil.rmtree(MEASURED_ONCE, ignore_errors=True)
    for lang in LANGUAGES:
        # git's ignored files only: docs/<lang>/lessons/index.rst is written by hand.
        subprocess.run(["git", "clean", "-fdXq", f"docs/{lang}/lessons"], cwd=ROOT, check=True)


def lesson_pages(stems=None) -> list[Path]:
    """The page each lesson (of ``stems``, or every one) gets in each language:
    docs/<lang>/lessons/<module>/<stem>.rst, whether built yet or not."""
    return [
        ROOT / "docs" / lang / "lessons" / script.parent.name / f"{script.stem}.rst"
        for lang in LANGUAGES
        for script in lesson_paths([lang])
        if stems is None or script.stem in stems
    ]


def example_pages() -> dict[Path, int | None]:
    """Every lesson page and its modification time, None when not built (a rewrite means
    re-executed)."""
    return {page: page.stat().st_mtime_ns if page.exists() else None for page in lesson_pages()}


def rewritten(before: dict[Path, int | None]) -> list[str]:
    """The lesson pages written since ``before`` (``example_pages``), from the repository."""
    after = example_pages()
    return sorted(
        page.relative_to(ROOT).as_posix()
        for page, mtime in after.items()
        if mtime is not None and before.get(page) != mtime
    )


RERUN = re.compile(rf"^({'|'.join(map(re.escape, LANGUAGES))}): (\S+) runs again: ", re.M)


def parse_reruns(output: str) -> list[tuple[str, str]]:
    """The (language, lesson stem) pairs a build's output says run again because an input
    besides their script changed (docs/course_rerun.py prints one line per lesson).

    >>> parse_reruns("--- sphinx-build en ---\\nen: m07_4_op_atlas runs again: common/x.py\\n")
    [('en', 'm07_4_op_atlas')]
    """
    return sorted(RERUN.findall(output))


EDIT_LINE = b"\n# benchmark edit\n"


@contextlib.contextmanager
def edited(nox: str, paths: list[Path]):
    """``paths`` with a comment line added, as a contributor's edit; on leaving, the files as
    they were, and ``nox -s docs`` so that the site and its caches match them again."""
    originals = {path: path.read_bytes() for path in paths}
    try:
        for path in paths:
            path.write_bytes(originals[path] + EDIT_LINE)
        yield
    finally:
        for path, content in originals.items():
            path.write_bytes(content)
    timed([nox, "-s", "docs"])


def twin_scripts(relative: Path = EDITED_LESSON) -> list[Path]:
    """A lesson's script in each language."""
    return [ROOT / "examples" / lang / relative for lang in LANGUAGES]


def measure_edit_rebuild(nox: str) -> tuple[float, list[str]]:
    """Edit one lesson's twins, then ``nox -s docs``: its time and the pages re-executed."""
    before = example_pages()
    with edited(nox, twin_scripts()):
        elapsed = timed([nox, "-s", "docs"])
        pages = rewritten(before)
    return elapsed, pages


def measure_atlas_edit(nox: str) -> tuple[float, list[tuple[str, str]], list[str]]:
    """Edit a file of the op atlas, then ``nox -s docs``: its time, the lessons its output
    says run again, and the pages re-executed."""
    before = example_pages()
    with edited(nox, [atlas_file()]):
        elapsed, output = run([nox, "-s", "docs"])
        pages = rewritten(before)
    return elapsed, parse_reruns(output), pages


def measure_one_lesson(nox: str) -> tuple[float, list[str]]:
    """Edit one lesson's twins, then build them alone (``nox -s docs -- --lesson <stem>``):
    its time and the pages re-executed."""
    before = example_pages()
    with edited(nox, twin_scripts()):
        elapsed = timed([nox, "-s", "docs", "--", "--lesson", EDITED_LESSON.stem])
        pages = rewritten(before)
    return elapsed, pages


def measure_edit_tests(nox: str) -> float:
    """A contributor's loop: edit one lesson's twins, then ``nox -s tests -- -k <lesson>``."""
    with edited(nox, twin_scripts()):
        return timed([nox, "-s", "tests", "--", "-k", EDITED_LESSON.stem])


def median_svg(repeat: int, render) -> tuple[float, int]:
    """Median seconds of ``render()`` and the size in bytes of the SVG it returns."""
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        size = len(render())
        times.append(time.perf_counter() - started)
    return statistics.median(times), size


def measure_draw(repeat: int) -> list[dict]:
    """draw()'s renderer versus torch's FxGraphDrawer on exported Transformer encoders."""
    import torch
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    from common.pt2e import export_module, quiet
    from common.viz import to_dot, to_svg

    quiet()
    rows = []
    for layers in (4, 24):
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
        gm = export_module(encoder, (torch.randn(2, 10, 64),))
        ours = median_svg(repeat, lambda gm=gm: to_svg(to_dot(gm, title="encoder")).encode())
        fx = median_svg(
            repeat, lambda gm=gm: FxGraphDrawer(gm, "encoder").get_main_dot_graph().create_svg()
        )
        # The same picture without its node tooltips (issue #14: they may add <= 30 % bytes).
        plain = to_dot(gm, title="encoder")
        plain.body = [re.sub(r' tooltip="(?:[^"\\]|\\.)*"', "", line) for line in plain.body]
        rows.append(
            {
                "layers": layers,
                "nodes": len(gm.graph.nodes),
                "draw": ours,
                "fx": fx,
                "untooltipped": len(to_svg(plain).encode()),
            }
        )
    return rows


M03_LESSON = ROOT / "examples" / "en" / "m03_lowering" / "m03_3_speed_and_size.py"
M03_HEADING = "## M03-3 speed and size"


def measure_m03() -> list[str]:
    """Run the M03-3 lesson (its timings and sizes); return its section of RESULTS.md."""
    with contextlib.redirect_stdout(open(os.devnull, "w")), _chdir(M03_LESSON.parent):
        lesson = runpy.run_path(str(M03_LESSON), run_name="__main__")
    rows = {  # the lesson's three timing steps, each fp32 beside int8 in one interleaved run
        "eager": lesson["eager"],
        "compile": lesson["plain"],
        "compile + freezing": lesson["frozen"],
    }
    base = rows["eager"]["fp32"].median
    lines = [
        M03_HEADING,
        "",
        f"`conv_net`, batch {lesson['BATCH']} of {lesson['input_shape']('conv_net')} images; "
        f"{rows['eager'].cpu}; {rows['eager'].threads} thread(s). The lesson's own numbers: "
        "medians of interleaved rounds, p10–p90 in brackets.",
        "",
        "| way | model | ms per batch (p10–p90) | speed vs fp32 eager |",
        "| --- | --- | --- | --- |",
    ]
    for way, timings in rows.items():
        for label, t in timings.times.items():
            lines.append(
                f"| {way} | {label} | {t.median:.2f} ({t.low:.2f}–{t.high:.2f}) | "
                f"{base / t.median:.2f}x |"
            )
    fp32, int8 = lesson["fp32_bytes"], lesson["int8_bytes"]
    lines += [
        "",
        f"`torch.export.save` size: fp32 {fp32 / 1e3:.0f} kB, int8 {int8 / 1e3:.0f} kB "
        f"({int8 / fp32:.2f}x).",
    ]
    return lines


NOTES_HEADING = "## Notes on the figures"


def kept_notes() -> str:
    """RESULTS.md's hand-written section (why a target is missed, what was tried): kept as is
    when the figures are measured again."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    if f"\n{NOTES_HEADING}\n" not in text:
        return ""
    notes = NOTES_HEADING + text.split(f"\n{NOTES_HEADING}\n", 1)[1]
    return "\n" + notes.split(f"\n{M03_HEADING}\n")[0].rstrip("\n") + "\n"


def write_m03_section(lines: list[str]) -> None:
    """Replace (or add) the M03-3 section at the end of RESULTS.md, leaving the rest as is."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    text = text.split(f"\n{M03_HEADING}\n")[0].rstrip("\n")
    RESULTS.write_text(text + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8")


def run_time(relative: Path, languages=LANGUAGES) -> float:
    """Seconds to run a lesson in ``languages`` as plain scripts, at once (both twins: as the
    two builds do; the English one alone: as a reader does)."""
    started = time.perf_counter()
    running = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / lang / relative)],
            cwd=ROOT / "build",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for lang in languages
    ]
    if any(process.wait() for process in running):
        sys.exit(f"{relative} failed as a script")
    return time.perf_counter() - started


def measure_tests(nox: str) -> tuple[float, list[tuple[str, float, int]], str, bool]:
    """``nox -s tests`` wall time, where its workers' time went (seconds per test function),
    pytest's summary line, and whether it passed. A failing test is reported in RESULTS.md,
    not fatal: the time still holds, but a session that fails meets no target."""
    started = time.perf_counter()
    result = subprocess.run(
        [nox, "-s", "tests", "--", "--durations=0"], cwd=ROOT, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    summary = re.findall(r"^=+ (.*(?:passed|failed).*) =+$", result.stdout, re.M)
    if result.returncode:
        print(f"nox -s tests failed:\n{result.stdout[-3000:]}", flush=True)
    seconds: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    durations = re.findall(r"^([\d.]+)s (?:call|setup|teardown) +(\S+)", result.stdout, re.M)
    for spent, test in durations:
        name = re.sub(r"\[.*|@.*", "", test)  # the test function, all its parameters together
        seconds[name] = seconds.get(name, 0.0) + float(spent)
        tests.setdefault(name, set()).add(test)
    profile = sorted(((n, t, len(tests[n])) for n, t in seconds.items()), key=lambda row: -row[1])
    summary_line = summary[-1] if summary else f"exit code {result.returncode}"
    return elapsed, profile, summary_line, result.returncode == 0


def measure_ci() -> tuple[float, float]:
    """``bash .ci/run`` in a fresh clone of this repository's HEAD (apt, pip, docs, tests):
    its seconds, and those of its cold first build (as ``nox -s docs`` reports them)."""
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        # As on a CI machine: none of this session's virtualenv on PATH.
        venv_bin = str(Path(sys.prefix) / "bin")
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": path}
        started = time.perf_counter()
        result = subprocess.run(
            ["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - started
    if result.returncode:
        sys.exit(f".ci/run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    built = re.search(r"site built in ([\d.]+) s", result.stdout + result.stderr)
    return elapsed, float(built.group(1)) if built else float("nan")


@dataclasses.dataclass
class Measurements:
    """What one ``nox -s bench`` run measured (seconds unless named otherwise)."""

    repeat: int  # runs per cheap measurement
    cpu: str  # torch's kernel path and threads
    lessons: int  # lesson scripts of both languages
    floor: float  # wall time of both languages' floor processes, run at once
    modules: dict[str, dict[str, float]]  # module_seconds of the floor run
    timing: dict[str, dict[str, float]]  # module_seconds of its timing steps
    clean: float
    noop: float
    twins: float
    edit: float
    edit_pages: list[str]  # lesson pages the edit rebuild wrote again
    atlas_file: str  # the atlas file edited, from the repository
    atlas_edit: float
    atlas_reruns: list[tuple[str, str]]  # (language, lesson) the build said run again
    atlas_pages: list[str]  # lesson pages the atlas edit's build wrote again
    one_lesson: float  # `nox -s docs -- --lesson <lesson>` after editing its twins
    one_lesson_pages: list[str]
    tests: float
    tests_passed: bool
    tests_summary: str  # pytest's last line: passed, failed, time
    noop_after_tests: float  # the first `nox -s docs` after `nox -s tests`
    lesson_run: float  # the edited lesson (en) as a plain script
    edit_tests: float  # `nox -s tests -- -k <lesson>` after editing it
    profile: list[tuple[str, float, int]]  # measure_tests' seconds per test function
    ci: float | None  # None with --no-ci
    ci_docs: float | None  # the cold first build inside it
    draw_rows: list[dict]


def measure(repeat: int, floor_repeat: int, *, ci: bool) -> Measurements:
    """Every measurement of RESULTS.md's tables, printing each step's name as it starts."""
    nox = shutil.which("nox") or "nox"
    docs = [nox, "-s", "docs"]
    print(f"{FLOOR_ROW} ...", flush=True)
    floor, per_lesson, timing = measure_floor(floor_repeat)
    print("clean build ...", flush=True)
    clean_generated()
    clean = timed(docs)
    print("no-op rebuild ...", flush=True)
    noop = median_of(repeat, lambda: timed(docs))
    print("edit rebuild ...", flush=True)
    twins = median_of(repeat, lambda: run_time(EDITED_LESSON))
    edit, edit_pages = measure_edit_rebuild(nox)
    print(f"edit of {atlas_file().relative_to(ROOT)} ...", flush=True)
    atlas = atlas_file().relative_to(ROOT).as_posix()
    atlas_edit, atlas_reruns, atlas_pages = measure_atlas_edit(nox)
    print("one-lesson build ...", flush=True)
    one_lesson, one_lesson_pages = measure_one_lesson(nox)
    print("tests ...", flush=True)
    tests, profile, tests_summary, tests_passed = measure_tests(nox)
    print("no-op rebuild after the tests ...", flush=True)
    noop_after_tests = timed(docs)
    print("a contributor's test loop ...", flush=True)
    lesson_run = median_of(repeat, lambda: run_time(EDITED_LESSON, ["en"]))
    edit_tests = measure_edit_tests(nox)
    ci_seconds = ci_docs = None
    if ci:
        print("CI on a fresh clone ...", flush=True)
        ci_seconds, ci_docs = measure_ci()
    print("draw ...", flush=True)
    draw_rows = measure_draw(repeat)

    import torch

    return Measurements(
        repeat=repeat,
        cpu=f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads",
        lessons=len(lesson_paths()),
        floor=floor,
        modules=module_seconds(per_lesson),
        timing=module_seconds(timing),
        clean=clean,
        noop=noop,
        twins=twins,
        edit=edit,
        edit_pages=edit_pages,
        atlas_file=atlas,
        atlas_edit=atlas_edit,
        atlas_reruns=atlas_reruns,
        atlas_pages=atlas_pages,
        one_lesson=one_lesson,
        one_lesson_pages=one_lesson_pages,
        tests=tests,
        tests_passed=tests_passed,
        tests_summary=tests_summary,
        noop_after_tests=noop_after_tests,
        lesson_run=lesson_run,
        edit_tests=edit_tests,
        profile=profile,
        ci=ci_seconds,
        ci_docs=ci_docs,
        draw_rows=draw_rows,
    )


def page_list(pages: list[str]) -> str:
    """Re-executed pages as RESULTS.md shows them: their count and their lessons."""
    stems = ", ".join(f"{Path(p).parts[1]} {Path(p).stem}" for p in pages) or "none"
    return f"{len(pages)} lesson pages re-executed ({stems})"


def expected_pages(stem: str) -> list[str]:
    """The pages of a lesson's twins, from the repository: what its re-run rewrites."""
    return sorted(page.relative_to(ROOT).as_posix() for page in lesson_pages({stem}))


def check(m: Measurements) -> list[tuple[str, bool | None, str]]:
    """Each target against its figure: (target, met (None: not measured), figures). Each can
    fail: a figure over its bound, a page or lesson besides the expected ones re-run, a test
    session that fails, a module missing from the floor run."""
    twin_pages = expected_pages(EDITED_LESSON.stem)
    atlas_runs = [(lang, ATLAS_LESSON) for lang in sorted(LANGUAGES)]
    reruns = ", ".join(f"{lang} {stem}" for lang, stem in m.atlas_reruns) or "none"
    checks = [
        (
            "clean build <= floor + 15 s (the floor: each language in its own process, both at "
            "once, as the build)",
            m.clean <= m.floor + 15,
            f"{m.clean:.1f} s vs {m.floor + 15:.1f} s",
        ),
        ("no-op `nox -s docs` <= 3 s", m.noop <= 3, f"{m.noop:.1f} s"),
        (
            "... also the first right after `nox -s tests`",
            m.noop_after_tests <= 3,
            f"{m.noop_after_tests:.1f} s",
        ),
        (
            "editing one lesson re-runs only its twins",
            m.edit_pages == twin_pages,
            page_list(m.edit_pages),
        ),
        (
            "... and costs <= their run time + 5 s",
            m.edit <= m.twins + 5,
            f"{m.edit:.1f} s vs {m.twins + 5:.1f} s",
        ),
        (
            f"editing {m.atlas_file} re-runs only {ATLAS_LESSON}, in both languages",
            m.atlas_reruns == atlas_runs and m.atlas_pages == expected_pages(ATLAS_LESSON),
            f"{len(m.atlas_reruns)} 'runs again' lines ({reruns}); {page_list(m.atlas_pages)}",
        ),
        (
            f"`nox -s docs -- --lesson {EDITED_LESSON.stem}` after editing it re-executes only "
            "its twins",
            m.one_lesson_pages == twin_pages,
            page_list(m.one_lesson_pages),
        ),
        (
            "... and costs <= their run time + 10 s",
            m.one_lesson <= m.twins + 10,
            f"{m.one_lesson:.1f} s vs {m.twins + 10:.1f} s",
        ),
        (
            f"`nox -s tests -- -k {EDITED_LESSON.stem}` after editing it <= its run + 5 s",
            m.edit_tests <= m.lesson_run + 5,
            f"{m.edit_tests:.1f} s vs {m.lesson_run + 5:.1f} s",
        ),
        (
            f"`nox -s tests` passes in <= {TESTS_BUDGET} s",
            m.tests_passed and m.tests <= TESTS_BUDGET,
            f"{m.tests:.1f} s, {m.tests_summary}",
        ),
    ]
    # What a module adds to a clean build: both languages' lessons, run at once on two cores.
    for module, budget in MODULE_BUDGETS.items():
        if module not in m.modules:
            checks.append((f"{module} adds <= {budget} s to a clean build", False, "not run"))
            continue
        added = sum(m.modules[module].values()) / len(LANGUAGES)
        checks.append(
            (f"{module} adds <= {budget} s to a clean build", added <= budget, f"{added:.1f} s")
        )
    ci_target = f"`bash .ci/run` on a fresh clone <= {CI_BUDGET // 60} min"
    if m.ci is None:
        checks.append((ci_target, None, "not measured (`--no-ci`)"))
    else:
        checks.append((ci_target, m.ci <= CI_BUDGET, f"{m.ci / 60:.1f} min"))
    for row in m.draw_rows:
        (ours_s, ours_bytes), (fx_s, fx_bytes) = row["draw"], row["fx"]
        ok = ours_s <= fx_s and ours_bytes <= fx_bytes
        detail = f"{ours_s / fx_s:.2f}x the time, {ours_bytes / fx_bytes:.2f}x the bytes"
        checks.append((f"draw <= FxGraphDrawer, {row['layers']} layers", ok, detail))
        growth = ours_bytes / row["untooltipped"]
        checks.append(
            (
                f"node tooltips add <= 30 % bytes, {row['layers']} layers",
                growth <= 1.3,
                f"{row['untooltipped'] / 1e3:.0f} kB without, {ours_bytes / 1e3:.0f} kB with "
                f"(+{growth - 1:.0%})",
            )
        )
    return checks


def report(m: Measurements, checks: list[tuple[str, bool | None, str]]) -> str:
    """RESULTS.md's measured part: the figures, the targets, each module, the tests' profile."""
    reruns = ", ".join(f"{lang} {stem}" for lang, stem in m.atlas_reruns) or "none"
    if m.ci_docs is None:
        cold = "not measured (`--no-ci`)"
    else:
        cold = f"{m.ci_docs:.0f} s, {m.ci_docs - m.clean:+.0f} s against the clean build above"
    lines = [
        "# Benchmark results",
        "",
        f"Measured {datetime.date.today().isoformat()} with `nox -s bench` "
        f"(`python benchmarks/bench.py --repeat {m.repeat}`) on {os.cpu_count()} cores "
        f"(CPU {m.cpu}); medians of {m.repeat} runs for no-op rebuild, twins, the lesson's run "
        "and draw, single runs otherwise, all in this one run. The machine is shared: figures "
        "move by 10-20 % between runs.",
        "",
        "| measurement | value |",
        "| --- | --- |",
        f"| {FLOOR_ROW} ({m.lessons} lessons) | {m.floor:.1f} s |",
        "| clean build (`nox -s docs`; trained weights, compiled kernels and packages cached) "
        f"| {m.clean:.1f} s |",
        f"| cold `nox -s docs` on a fresh clone (the first build of `.ci/run`) | {cold} |",
        f"| no-op rebuild (`nox -s docs`) | {m.noop:.1f} s |",
        f"| {EDITED_LESSON.name} twins run as scripts, at once | {m.twins:.1f} s |",
        f"| edit rebuild, {EDITED_LESSON.name} twins changed | {m.edit:.1f} s, "
        f"{page_list(m.edit_pages)} |",
        f"| edit of `{m.atlas_file}`, `nox -s docs` | {m.atlas_edit:.1f} s; runs again: "
        f"{reruns}; {page_list(m.atlas_pages)} |",
        f"| one-lesson build, `nox -s docs -- --lesson {EDITED_LESSON.stem}`, its twins changed "
        f"| {m.one_lesson:.1f} s, {page_list(m.one_lesson_pages)} |",
        f"| tests (`nox -s tests`, venv present) | {m.tests:.1f} s ({m.tests_summary}) |",
        f"| first no-op rebuild after the tests (`nox -s docs`) | {m.noop_after_tests:.1f} s |",
        f"| {EDITED_LESSON.name} (en) run as a script | {m.lesson_run:.1f} s |",
        f"| `nox -s tests -- -k {EDITED_LESSON.stem}` after editing its twins "
        f"| {m.edit_tests:.1f} s |",
    ]
    if m.ci is not None:
        lines.append(f"| `bash .ci/run` on a fresh clone (apt packages present) | {m.ci:.0f} s |")
    for row in m.draw_rows:
        (ours_s, ours_bytes), (fx_s, fx_bytes) = row["draw"], row["fx"]
        lines.append(
            f"| draw, {row['layers']}-layer encoder ({row['nodes']} nodes) | "
            f"{ours_s:.2f} s, {ours_bytes / 1e3:.0f} kB vs FxGraphDrawer "
            f"{fx_s:.2f} s, {fx_bytes / 1e3:.0f} kB |"
        )
    lines += ["", "| target | met | figures |", "| --- | --- | --- |"]
    met = {True: "yes", False: "NO", None: "not measured"}
    lines += [f"| {name} | {met[ok]} | {detail} |" for name, ok, detail in checks]
    lines += [
        "",
        "## Each module's lessons in the floor run",
        "",
        "Seconds per language, each lesson with the build's per-lesson hooks (one process per "
        "language, both at once, as the build runs them): what each module's pages cost the "
        "build beyond Sphinx's own work. The two processes share two cores, so a module adds "
        "about the mean of its two columns. In brackets, the part its timing steps took: "
        "timings are measured once per build (`common.cache.measured_once`), so the language "
        "that reaches a timing second shows the first one's figures at almost no cost.",
        "",
        f"| module | {' | '.join(LANGUAGES)} | added to a clean build |",
        "| --- | " + "--- | " * len(LANGUAGES) + "--- |",
    ]
    lines += [
        f"| {module} | "
        + " | ".join(
            f"{by_lang.get(lang, 0.0):.1f} s ({m.timing[module].get(lang, 0.0):.1f} s)"
            for lang in LANGUAGES
        )
        + f" | {sum(by_lang.values()) / len(LANGUAGES):.1f} s |"
        for module, by_lang in m.modules.items()
    ]
    total = sum(seconds for _, seconds, _ in m.profile)
    lines += [
        "",
        "## Where the test session's time goes",
        "",
        f"pytest's `--durations=0` of that `nox -s tests` run, summed per test function over its "
        f"parameters: {total:.0f} s of worker time on {os.cpu_count()} workers, "
        f"{m.tests:.0f} s of wall time.",
        "",
        "| test | runs | seconds | share |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| `{name}` | {runs} | {seconds:.1f} | {seconds / total:.0%} |"
        for name, seconds, runs in m.profile[:15]
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cheap measurement")
    parser.add_argument(
        "--floor-repeat", type=int, default=1, help="runs of the floor (several minutes each)"
    )
    # LANG SCRATCH [LESSON ...]: one language's floor process (floor_once starts it).
    parser.add_argument("--floor", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--m03-only", action="store_true", help="only the M03-3 speed table")
    parser.add_argument("--no-ci", action="store_true", help="skip .ci/run on a fresh clone")
    args = parser.parse_args()
    if args.floor:
        lang, scratch, *only = args.floor
        run_floor(lang, Path(scratch), only or None)
        return
    if not args.m03_only:
        measured = measure(args.repeat, args.floor_repeat, ci=not args.no_ci)
        results = report(measured, check(measured))
        print(results)
        RESULTS.write_text(results + kept_notes(), encoding="utf-8")
        print("M03-3 speed and size ...", flush=True)
    m03 = measure_m03()
    print("\n".join(m03))
    write_m03_section(m03)


if __name__ == "__main__":
    main()
