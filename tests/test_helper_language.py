"""The helpers print their lines in the lesson's language: ``describe().verdict``,
``Timings.table()``/``header()`` and common.coverage's reports read it from the lesson that calls
them (common.lesson's ``lesson_language``), so a downloaded zh_TW script or notebook prints Chinese
with no setting."""

import runpy
import sys
import types
from dataclasses import replace

import pytest

from common.cpu import CpuInfo, describe
from common.lesson import lesson_language
from common.timing import Race, Timing, Timings

CHINESE = "\u4e00-\u9fff"
INFO = CpuInfo("Test CPU", "AVX512", "AVX512_CORE_VNNI", True, False, False, 1, 2, False)
TIMINGS = Timings(
    times={
        "fp32": Timing(median=2.0, low=1.9, high=2.2, rounds=9),
        "int8 量化": Timing(median=1.0, low=1.0, high=1.0, rounds=9),
    },
    threads=1,
    load=(0.5, 0.25, 0.0),
    cpu=INFO.verdict_in("en"),
)


def lesson(tmp_path, folder: str, docstring: str):
    """A lesson file that prints what the helpers print, as a reader's run of it would."""
    path = tmp_path / folder / "m00_9_lesson.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        f'"""{docstring}"""\n'
        "from common.cpu import describe\nfrom common.lesson import lesson_language\n"
        "LANGUAGE = lesson_language()\n"
        "VERDICT = describe().verdict\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("folder", "docstring", "expected"),
    [
        ("zh_TW", "M00-9 一課\n\n說明。", "zh_TW"),
        ("zh_TW", "Only English here", "zh_TW"),
        ("Downloads", "M00-9 一課\n\n下載後直接執行。", "zh_TW"),
        ("Downloads", "M00-9 A lesson\n\nRun as downloaded.", "en"),
        ("en", "M00-9 A lesson", "en"),
    ],
    ids=[
        "examples-zh-tw",
        "a-zh-tw-folder-decides",
        "a-downloaded-chinese-script",
        "a-downloaded-english-script",
        "examples-en",
    ],
)
def test_the_language_is_read_from_the_lesson(tmp_path, folder, docstring, expected):
    found = runpy.run_path(str(lesson(tmp_path, folder, docstring)), run_name="__main__")
    assert found["LANGUAGE"] == expected
    chinese = any("\u4e00" <= c <= "\u9fff" for c in found["VERDICT"])
    assert chinese == (expected == "zh_TW"), found["VERDICT"]


def test_sphinx_gallery_runs_a_zh_tw_lesson_under_its_own_path():
    """sphinx-gallery compiles each block with the lesson's path as the file name."""
    code = compile("LANGUAGE = lesson_language()", "/x/examples/zh_TW/m00/m00_1.py", "exec")
    namespace = {"lesson_language": lesson_language}
    exec(code, namespace)
    assert namespace["LANGUAGE"] == "zh_TW"


def test_a_notebook_is_read_from_its_cells(monkeypatch):
    main = types.ModuleType("__main__")
    main.In = ["", "# 在 Google Colab 執行時，這一格會安裝課程", "x = 1"]
    monkeypatch.setitem(sys.modules, "__main__", main)
    code = compile("LANGUAGE = lesson_language()", "/tmp/ipykernel_1/123.py", "exec")
    namespace = {"lesson_language": lesson_language}
    exec(code, namespace)
    assert namespace["LANGUAGE"] == "zh_TW"
    main.In = ["", "x = 1"]
    exec(code, namespace)
    assert namespace["LANGUAGE"] == "en"


def test_this_test_file_is_english():
    assert lesson_language() == "en"


@pytest.mark.parametrize("emulated", [False, True], ids=["native", "capped"])
def test_an_english_verdict_reads_back(emulated):
    info = replace(INFO, emulated=emulated)
    assert CpuInfo.from_verdict(info.verdict_in("en")) == info
    assert CpuInfo.from_verdict(describe().verdict_in("en")) == describe()
    assert CpuInfo.from_verdict("not a verdict") is None


def test_the_verdict_in_chinese_is_chinese_and_says_the_same():
    zh = INFO.verdict_in("zh_TW")
    assert zh == (
        "Test CPU：ATen AVX512，oneDNN int8 路徑 AVX512_CORE_VNNI；VNNI 有，AMX 無，bf16 無；"
        "使用 2 個執行緒中的 1 個"
    )
    with pytest.raises(ValueError, match="one of: en, zh_TW"):
        INFO.verdict_in("fr")


def test_timings_print_in_the_language_asked():
    en, zh = TIMINGS.table(lang="en"), TIMINGS.table(lang="zh_TW")
    assert "timed with 1 thread(s), 9 interleaved rounds" in en and "median ms" in en
    assert "以 1 個執行緒計時，交錯 9 輪；平均負載 0.50（1 分鐘）、0.25（5 分鐘）" in zh
    assert "中位數 ms" in zh and "timed with" not in zh and "median" not in zh
    assert INFO.verdict_in("zh_TW") in zh and INFO.verdict_in("en") in en
    assert TIMINGS.table() == en, "from an English caller the table is English"


def test_a_zh_tw_table_keeps_its_columns_aligned():
    from common.charts import display_width

    rows = TIMINGS.table(lang="zh_TW").splitlines()[:3]
    ends = {display_width(row[: row.index("ms") + 2]) for row in rows[:1]}
    medians = {display_width(row[: row.index(".") + 4]) for row in rows[1:]}
    assert ends == medians, rows


def test_a_race_says_which_kernels_ran_in_the_language_asked():
    from collections import Counter

    from common.kernels import KernelsRun

    race = Race(**vars(TIMINGS), kernels={"fp32": KernelsRun(Counter(), Counter({"aten::mm": 1}))})
    assert "執行的 kernel：int8：無；浮點數：aten::mm ×1" in race.table(lang="zh_TW")
    assert "fp32  ran int8: none" in race.table(lang="en")


def test_a_zh_tw_lesson_gets_its_timings_cpu_line_in_chinese(tmp_path):
    """Timings keep the English line; the lesson that measures gets it in its own language."""
    path = tmp_path / "zh_TW" / "m03_9_timed.py"
    path.parent.mkdir()
    path.write_text(
        '"""M03-9 計時"""\n'
        "import torch\n"
        "from common.timing import compare_speed\n"
        "T = compare_speed({'id': lambda x: x}, (torch.ones(2),), rounds=5)\n",
        encoding="utf-8",
    )
    timings = runpy.run_path(str(path), run_name="__main__")["T"]
    measured = CpuInfo.from_verdict(timings.cpu)
    assert measured == replace(describe(), threads=timings.threads), timings.cpu
    assert timings.cpu == measured.verdict_in("zh_TW")
    assert timings.header(lang="en").startswith(measured.verdict_in("en"))


def test_a_zh_tw_lesson_gets_its_coverage_report_in_chinese(tmp_path):
    """``coverage`` keeps each reason in English (asserts compare it); ``why``, ``summary()``
    and the tables are in the lesson's language."""
    path = tmp_path / "zh_TW" / "m07_9_coverage.py"
    path.parent.mkdir()
    path.write_text(
        '"""M07-9 覆蓋"""\n'
        "import torch\n"
        "from common.coverage import coverage, side_by_side, spec_table\n"
        "from common.pt2e import export_module, x86_quantizer\n"
        "gm = export_module(torch.nn.Linear(4, 4), (torch.ones(2, 4),))\n"
        "R = coverage(gm, x86_quantizer())\n"
        "SHOWN = [R.ops[0].why, R.summary(), R.table(), side_by_side(R), spec_table(R)]\n",
        encoding="utf-8",
    )
    found = runpy.run_path(str(path), run_name="__main__")
    why, summary, table, both, specs = found["SHOWN"]
    report = found["R"]
    assert report.ops[0].reason == "u8 per-tensor affine × s8 per-channel symmetric"
    assert why == "u8 per-tensor 仿射 × s8 per-channel 對稱"
    assert summary == "X86InductorQuantizer：1 個計算運算中有 1 個是 int8（linear 1/1）"
    assert table.splitlines()[0].split() == ["node", "運算", "模組", "X86InductorQuantizer", "原因"]
    assert both.splitlines()[1].split() == ["linear", "linear", "（模型）", "int8", "靜態"]
    assert specs.splitlines()[0].split() == ["quantizer", "活化值", "weight", "int8", "運算"]
    assert report.summary() == "X86InductorQuantizer: 1 of 1 compute ops int8 (linear 1/1)", (
        "from this English test the same report is English"
    )
