"""Measure what the course costs to build, test and draw; print a table and write RESULTS.md.

Run it with ``nox -s bench`` (or ``python benchmarks/bench.py`` in an environment with the
course installed and nox on PATH). It rebuilds the site several times: expect ~10 minutes.
``--m03-only`` measures only the M03-3 speed-and-size table (`nox -s bench -- --m03-only`).
"""

import argparse
import contextlib
import datetime
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from languages import LANGUAGES  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
EDITED_LESSON = Path("m00_graphs") / "m00_4_graph_surgery.py"


def lesson_paths() -> list[Path]:
    return sorted(
        path for lang in LANGUAGES for path in (ROOT / "examples" / lang).glob("*/m[0-9][0-9]_*.py")
    )


def run_floor() -> None:
    """Execute every lesson of both languages in this one process, as sphinx-gallery does."""
    import torch  # noqa: F401  (imported once, before the clock of the first lesson)

    for path in lesson_paths():
        with contextlib.redirect_stdout(open(os.devnull, "w")), _chdir(path.parent):
            runpy.run_path(str(path), run_name="__main__")


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
    shutil.rmtree(ROOT / "build" / "html", ignore_errors=True)
    shutil.rmtree(ROOT / "build" / "jupyter_cache", ignore_errors=True)
    for lang in LANGUAGES:
        shutil.rmtree(ROOT / "docs" / lang / "lessons", ignore_errors=True)


def example_pages() -> dict[Path, float]:
    """Generated lesson pages and their modification times (a rewrite means re-executed)."""
    pages = {}
    for lang in LANGUAGES:
        for path in (ROOT / "docs" / lang / "lessons").glob("*/m[0-9][0-9]_*.rst"):
            pages[path] = path.stat().st_mtime_ns
    return pages


def measure_edit_rebuild(nox: list[str]) -> tuple[float, int]:
    """Touch the content of one lesson's twins; return the rebuild time and pages re-executed."""
    twins = [ROOT / "examples" / lang / EDITED_LESSON for lang in LANGUAGES]
    originals = {path: path.read_bytes() for path in twins}
    before = example_pages()
    try:
        for path in twins:
            path.write_bytes(originals[path] + b"\n# benchmark edit\n")
        elapsed = timed(nox)
        after = example_pages()
    finally:
        for path, content in originals.items():
            path.write_bytes(content)
    timed(nox)  # back to the committed lessons, so the cache matches them again
    rewritten = sum(1 for path, mtime in after.items() if before.get(path) != mtime)
    return elapsed, rewritten


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
    timings, base = lesson["timings"], lesson["timings"]["fp32 eager"]
    lines = [
        M03_HEADING,
        "",
        f"`conv_net`, batch {lesson['BATCH']} of {lesson['input_shape']('conv_net')} images, "
        f"CPU {lesson['cpu']}; medians of 5 runs after a warm-up (the lesson's own numbers).",
        "",
        "| way | ms per batch | speed vs fp32 eager |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {name} | {ms:.1f} | {base / ms:.2f}x |" for name, ms in timings.items()]
    fp32, int8 = lesson["fp32_bytes"], lesson["int8_bytes"]
    lines += [
        "",
        f"`torch.export.save` size: fp32 {fp32 / 1e3:.0f} kB, int8 {int8 / 1e3:.0f} kB "
        f"({int8 / fp32:.2f}x).",
    ]
    return lines


def write_m03_section(lines: list[str]) -> None:
    """Replace (or add) the M03-3 section at the end of RESULTS.md, leaving the rest as is."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    text = text.split(f"\n{M03_HEADING}\n")[0].rstrip("\n")
    RESULTS.write_text(text + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cheap measurement")
    parser.add_argument("--floor-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--m03-only", action="store_true", help="only the M03-3 speed table")
    args = parser.parse_args()
    if args.floor_only:
        run_floor()
        return
    if args.m03_only:
        lines = measure_m03()
        print("\n".join(lines))
        write_m03_section(lines)
        return

    nox = [shutil.which("nox") or "nox", "-s", "docs"]
    python = [sys.executable, str(Path(__file__).resolve()), "--floor-only"]
    print("floor: every lesson in one process ...", flush=True)
    floor = median_of(args.repeat, lambda: timed(python))
    print("clean build ...", flush=True)
    clean_generated()
    clean = timed(nox)
    print("no-op rebuild ...", flush=True)
    noop = median_of(args.repeat, lambda: timed(nox))
    print("edit rebuild ...", flush=True)
    edit, re_executed = measure_edit_rebuild(nox)
    print("tests ...", flush=True)
    tests = timed([nox[0], "-s", "tests"])
    print("draw ...", flush=True)
    draw_rows = measure_draw(args.repeat)

    lessons = len(lesson_paths())
    checks = [
        (
            "clean build <= floor + 30 s",
            clean <= floor + 30,
            f"{clean:.1f} s vs {floor + 30:.1f} s",
        ),
        ("no-op rebuild <= 10 s", noop <= 10, f"{noop:.1f} s"),
        ("edit re-executes only the twins", re_executed == len(LANGUAGES), f"{re_executed}"),
    ]
    for row in draw_rows:
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

    lines = [
        "# Benchmark results",
        "",
        f"Measured {datetime.date.today().isoformat()} with `nox -s bench` "
        f"(`python benchmarks/bench.py --repeat {args.repeat}`) on {os.cpu_count()} cores; "
        f"medians of {args.repeat} runs for floor, no-op rebuild and draw, single runs otherwise.",
        "",
        "| measurement | value |",
        "| --- | --- |",
        f"| floor: {lessons} lessons in one process | {floor:.1f} s |",
        f"| clean build, both languages concurrently (`nox -s docs`) | {clean:.1f} s |",
        f"| no-op rebuild (`nox -s docs`) | {noop:.1f} s |",
        f"| edit rebuild, {EDITED_LESSON.name} twins changed | {edit:.1f} s, "
        f"{re_executed} lesson pages re-executed |",
        f"| tests (`nox -s tests`, venv present) | {tests:.1f} s |",
    ]
    for row in draw_rows:
        (ours_s, ours_bytes), (fx_s, fx_bytes) = row["draw"], row["fx"]
        lines.append(
            f"| draw, {row['layers']}-layer encoder ({row['nodes']} nodes) | "
            f"{ours_s:.2f} s, {ours_bytes / 1e3:.0f} kB vs FxGraphDrawer "
            f"{fx_s:.2f} s, {fx_bytes / 1e3:.0f} kB |"
        )
    lines += ["", "| target | met | figures |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'yes' if ok else 'NO'} | {detail} |" for name, ok, detail in checks]
    report = "\n".join(lines) + "\n"
    print(report)
    RESULTS.write_text(report, encoding="utf-8")
    print("M03-3 speed and size ...", flush=True)
    m03 = measure_m03()
    print("\n".join(m03))
    write_m03_section(m03)


if __name__ == "__main__":
    main()
