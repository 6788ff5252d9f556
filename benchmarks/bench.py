"""Measure what the course costs to build, test and draw; print a table and write RESULTS.md.

Run it with ``nox -s bench`` (or ``python benchmarks/bench.py`` in an environment with the
course installed and nox on PATH). It rebuilds the site several times, runs the tests and
runs ``.ci/run`` on a fresh clone (``--no-ci`` skips that): 34 minutes on 2 cores with
``--no-ci``, plus a whole ``.ci/run`` without it.
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
# Modules with a build budget of their own: seconds they may add to a clean build.
MODULE_BUDGETS = {"m07_your_model": 60}
TESTS_BUDGET = 300  # seconds of `nox -s tests`, the virtualenv present


def lesson_paths(languages=LANGUAGES) -> list[Path]:
    """Every lesson script of ``languages``, the quickstart and troubleshooting included."""
    return sorted(
        path
        for lang in languages
        for pattern in ("*/m[0-9][0-9]_*.py", "quickstart/quickstart.py")
        for path in (ROOT / "examples" / lang).glob(pattern)
    )


FLOOR_MARK = "@@floor@@"


def run_floor(lang: str, measured: Path) -> None:
    """Execute every lesson of ``lang`` in this one process, as sphinx-gallery does (one
    process per language: a lesson may change what the process can do, as m99_5's ExecuTorch
    kernels do), and print each lesson's seconds and the part of them its timing steps took
    (one JSON line after FLOOR_MARK). Timings are measured once, as in a build: the language
    run first measures into ``measured``, the other shows the same figures."""
    # The compiled kernels M03-3 reuses, where the builds keep them (docs/course_conf.py).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor_cache"))
    import matplotlib

    matplotlib.use("Agg")  # as sphinx-gallery's scraper does: plt.show() draws nothing
    import matplotlib.pyplot as plt
    import torch  # noqa: F401  (imported once, before the clock of the first lesson)

    sys.path.insert(0, str(ROOT))
    from common.lesson import running, start

    from course_gallery import forget_earlier_main

    seconds, timing = {}, {}
    for path in lesson_paths([lang]):
        # As the build's per-lesson hook does (docs/course_gallery.py, reset).
        start(lang=lang, name=path.stem, measured=measured, pictures=False)
        forget_earlier_main()
        if "torch._inductor.config" in sys.modules:
            sys.modules["torch._inductor.config"].freezing = False
        started, timed_before = time.perf_counter(), running.measuring
        print(f"floor: {path.relative_to(ROOT)}", file=sys.stderr, flush=True)
        with contextlib.redirect_stdout(open(os.devnull, "w")), _chdir(path.parent):
            runpy.run_path(str(path), run_name="__main__")
        plt.close("all")
        lesson = str(path.relative_to(ROOT / "examples"))
        seconds[lesson] = time.perf_counter() - started
        timing[lesson] = running.measuring - timed_before
    print(FLOOR_MARK + json.dumps({"seconds": seconds, "timing": timing}))


def measure_floor(repeat: int) -> tuple[float, dict[str, float], dict[str, float]]:
    """Median seconds of ``run_floor`` in a fresh process, each lesson's median seconds and
    the median seconds of its timing steps."""
    totals, per_lesson, timing = [], {}, {}
    for _ in range(repeat):
        total = 0.0
        with tempfile.TemporaryDirectory() as measured:  # empty: each timing measured once
            for lang in ("en", "zh_TW"):
                started = time.perf_counter()
                result = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--floor", lang, measured],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                total += time.perf_counter() - started
                if result.returncode:
                    sys.exit(f"the {lang} floor run failed:\n{result.stderr[-5000:]}")
                line = next(x for x in result.stdout.splitlines() if x.startswith(FLOOR_MARK))
                found = json.loads(line[len(FLOOR_MARK) :])
                for lesson, spent in found["seconds"].items():
                    per_lesson.setdefault(lesson, []).append(spent)
                    timing.setdefault(lesson, []).append(found["timing"][lesson])
        totals.append(total)
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


def timed(command: list[str], **kwargs) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, **kwargs)
    elapsed = time.perf_counter() - started
    if result.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed


def median_of(repeat: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeat))


def clean_generated() -> None:
    """Remove the built site and what sphinx-gallery wrote, as on a fresh clone; keep
    build/cache and the inductor cache (trained weights, compiled kernels and packages)."""
    shutil.rmtree(ROOT / "build" / "html", ignore_errors=True)
    shutil.rmtree(ROOT / "build" / "jupyter_cache", ignore_errors=True)
    for lang in LANGUAGES:
        # git's ignored files only: docs/<lang>/lessons/index.rst is written by hand.
        subprocess.run(["git", "clean", "-fdXq", f"docs/{lang}/lessons"], cwd=ROOT, check=True)


def example_pages() -> dict[Path, float]:
    """Generated lesson pages and their modification times (a rewrite means re-executed)."""
    pages = {}
    for lang in LANGUAGES:
        for path in (ROOT / "docs" / lang / "lessons").glob("*/m[0-9][0-9]_*.rst"):
            pages[path] = path.stat().st_mtime_ns
    return pages


@contextlib.contextmanager
def _edited_twins(nox: str):
    """EDITED_LESSON's twins with a line added, as a contributor's edit; then the committed
    lessons again, built, so the cache matches them."""
    twins = [ROOT / "examples" / lang / EDITED_LESSON for lang in LANGUAGES]
    originals = {path: path.read_bytes() for path in twins}
    try:
        for path in twins:
            path.write_bytes(originals[path] + b"\n# benchmark edit\n")
        yield
    finally:
        for path, content in originals.items():
            path.write_bytes(content)
    timed([nox, "-s", "docs"])


def measure_edit_rebuild(nox: str) -> tuple[float, int]:
    """Edit one lesson's twins, then ``nox -s docs``: its time and the pages re-executed."""
    before = example_pages()
    with _edited_twins(nox):
        elapsed = timed([nox, "-s", "docs"])
        after = example_pages()
    rewritten = sum(1 for path, mtime in after.items() if before.get(path) != mtime)
    return elapsed, rewritten


def measure_edit_tests(nox: str) -> float:
    """A contributor's loop: edit one lesson's twins, then ``nox -s tests -- -k <lesson>``."""
    with _edited_twins(nox):
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


def measure_tests(nox: str) -> tuple[float, list[tuple[str, float, int]], str]:
    """``nox -s tests`` wall time, where its workers' time went (seconds per test function),
    and pytest's summary line. A failing test is reported in RESULTS.md, not fatal: the
    measurement still holds."""
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
    return elapsed, profile, summary[-1] if summary else f"exit code {result.returncode}"


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
    floor: float
    modules: dict[str, dict[str, float]]  # module_seconds of the floor run
    timing: dict[str, dict[str, float]]  # module_seconds of its timing steps
    clean: float
    noop: float
    twins: float
    edit: float
    re_executed: int  # lesson pages the edit rebuild wrote again
    tests: float
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
    print("floor: every lesson in one process ...", flush=True)
    floor, per_lesson, timing = measure_floor(floor_repeat)
    print("clean build ...", flush=True)
    clean_generated()
    clean = timed(docs)
    print("no-op rebuild ...", flush=True)
    noop = median_of(repeat, lambda: timed(docs))
    print("edit rebuild ...", flush=True)
    twins = median_of(repeat, lambda: run_time(EDITED_LESSON))
    edit, re_executed = measure_edit_rebuild(nox)
    print("tests ...", flush=True)
    tests, profile, tests_summary = measure_tests(nox)
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
        re_executed=re_executed,
        tests=tests,
        tests_summary=tests_summary,
        noop_after_tests=noop_after_tests,
        lesson_run=lesson_run,
        edit_tests=edit_tests,
        profile=profile,
        ci=ci_seconds,
        ci_docs=ci_docs,
        draw_rows=draw_rows,
    )


def check(m: Measurements) -> list[tuple[str, bool, str]]:
    """Each target against its figure: (target, met, figures)."""
    checks = [
        (
            "clean build <= floor + 15 s",
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
            m.re_executed == len(LANGUAGES),
            f"{m.re_executed} pages re-executed",
        ),
        (
            "... and costs <= their run time + 5 s",
            m.edit <= m.twins + 5,
            f"{m.edit:.1f} s vs {m.twins + 5:.1f} s",
        ),
        (
            f"`nox -s tests -- -k {EDITED_LESSON.stem}` after editing it <= its run + 5 s",
            m.edit_tests <= m.lesson_run + 5,
            f"{m.edit_tests:.1f} s vs {m.lesson_run + 5:.1f} s",
        ),
        (
            f"`nox -s tests` <= {TESTS_BUDGET} s",
            m.tests <= TESTS_BUDGET,
            f"{m.tests:.1f} s",
        ),
    ]
    # What a module adds to a clean build: both languages' lessons, run at once on two cores.
    for module, budget in MODULE_BUDGETS.items():
        added = sum(m.modules[module].values()) / len(LANGUAGES)
        checks.append(
            (f"{module} adds <= {budget} s to a clean build", added <= budget, f"{added:.1f} s")
        )
    if m.ci is not None:
        checks.append(
            ("`bash .ci/run` on a fresh clone <= 15 min", m.ci <= 900, f"{m.ci / 60:.1f} min")
        )
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


def report(m: Measurements, checks: list[tuple[str, bool, str]]) -> str:
    """RESULTS.md's measured part: the figures, the targets, each module, the tests' profile."""
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
        f"| floor: {m.lessons} lessons, each language in one process, one after the other "
        f"| {m.floor:.1f} s |",
        f"| clean build, both languages concurrently (`nox -s docs`) | {m.clean:.1f} s |",
        f"| no-op rebuild (`nox -s docs`) | {m.noop:.1f} s |",
        f"| {EDITED_LESSON.name} twins run as scripts, at once | {m.twins:.1f} s |",
        f"| edit rebuild, {EDITED_LESSON.name} twins changed | {m.edit:.1f} s, "
        f"{m.re_executed} lesson pages re-executed |",
        f"| tests (`nox -s tests`, venv present) | {m.tests:.1f} s ({m.tests_summary}) |",
        f"| first no-op rebuild after the tests (`nox -s docs`) | {m.noop_after_tests:.1f} s |",
        f"| {EDITED_LESSON.name} (en) run as a script | {m.lesson_run:.1f} s |",
        f"| `nox -s tests -- -k {EDITED_LESSON.stem}` after editing its twins "
        f"| {m.edit_tests:.1f} s |",
    ]
    if m.ci is not None:
        lines.append(f"| `bash .ci/run` on a fresh clone (apt packages present) | {m.ci:.0f} s |")
        lines.append(
            f"| ... its cold first build (no trained weights, kernels or packages cached) "
            f"| {m.ci_docs:.0f} s, {m.ci_docs - m.clean:+.0f} s against the warm clean build |"
        )
    for row in m.draw_rows:
        (ours_s, ours_bytes), (fx_s, fx_bytes) = row["draw"], row["fx"]
        lines.append(
            f"| draw, {row['layers']}-layer encoder ({row['nodes']} nodes) | "
            f"{ours_s:.2f} s, {ours_bytes / 1e3:.0f} kB vs FxGraphDrawer "
            f"{fx_s:.2f} s, {fx_bytes / 1e3:.0f} kB |"
        )
    lines += ["", "| target | met | figures |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'yes' if ok else 'NO'} | {detail} |" for name, ok, detail in checks]
    lines += [
        "",
        "## Each module's lessons in the floor run",
        "",
        "Seconds per language, in the order the floor ran them (one process, both languages): "
        "what each module's pages cost the build beyond Sphinx's own work. A clean build runs "
        "the two languages at once on two cores, so a module adds about the mean of its two "
        "columns. In brackets, the part its timing steps took: timings are measured once per "
        "build (`common.cache.measured_once`), so the language that runs second shows the "
        "first one's figures at almost no cost.",
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
    parser.add_argument("--floor", nargs=2, metavar=("LANG", "MEASURED"), help=argparse.SUPPRESS)
    parser.add_argument("--m03-only", action="store_true", help="only the M03-3 speed table")
    parser.add_argument("--no-ci", action="store_true", help="skip .ci/run on a fresh clone")
    args = parser.parse_args()
    if args.floor:
        run_floor(args.floor[0], Path(args.floor[1]))
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
