"""What this CPU gives int8 kernels (common.cpu): describe, the ISA caps, run_under_isa."""

from dataclasses import replace

import pytest
import torch

from common import cpu as cpu_module
from common.cpu import ISA_PATHS, describe, isa_environment, run_under_isa, weaker_paths


def uncapped(monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("flags", "path"),
    [
        ({"avx512_vnni": True, "amx_int8": True}, "AVX512_CORE_AMX"),
        (
            {"avx512_vnni": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True},
            "AVX512_CORE_VNNI",
        ),
        ({"avx512_bw": True, "avx512_vl": True, "avx512_dq": True}, "AVX512_CORE"),
        ({"avx_vnni": True}, "AVX2_VNNI"),
        ({"avx2": True}, "AVX2"),
    ],
    ids=["amx", "avx512-vnni", "avx512-without-vnni", "avx-vnni", "avx2"],
)
def test_describe_names_the_int8_path_from_the_cpu_flags(flags, path, monkeypatch):
    uncapped(monkeypatch)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"cpu_name": "Test CPU", **flags})
    info = describe()
    assert info.onednn == path
    assert info.vnni == path.endswith(("VNNI", "AMX")), "VNNI: the int8 sums are exact"
    assert info.amx_int8 == (path == "AVX512_CORE_AMX")
    assert not info.emulated
    yes_no = "yes" if info.vnni else "no"
    assert f"oneDNN int8 path {path}; VNNI {yes_no}" in info.verdict
    assert info.verdict.startswith("Test CPU: ")


def test_describe_follows_the_isa_cap_down_but_never_up(monkeypatch):
    uncapped(monkeypatch)
    native = describe()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = describe()
    assert (capped.onednn, capped.vnni, capped.amx_int8, capped.bf16) == (
        "AVX2",
        False,
        False,
        False,
    )
    assert capped.emulated and "capped by ONEDNN_MAX_CPU_ISA" in capped.verdict
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert describe().onednn == native.onednn, "a cap above the hardware changes nothing"


def test_verdict_and_kernel_path_say_threads_and_both_isas():
    info = describe()
    assert f"{info.threads} of {info.cores} threads" in info.verdict
    assert info.kernel_path == f"{info.aten}+{info.onednn}"
    assert set(info.as_dict()) >= {"onednn", "vnni", "amx_int8", "bf16", "threads"}


@pytest.mark.parametrize(
    ("path", "weaker"),
    [
        ("AVX2", []),
        ("AVX2_VNNI", ["AVX2"]),
        ("AVX512_CORE", ["AVX2"]),
        ("AVX512_CORE_VNNI", ["AVX2", "AVX512_CORE"]),
        ("AVX512_CORE_AMX", ["AVX2", "AVX512_CORE", "AVX512_CORE_VNNI"]),
    ],
)
def test_weaker_paths_are_those_a_cap_can_reach(path, weaker):
    assert weaker_paths(cpu=replace(describe(), onednn=path)) == weaker


def test_isa_environment_caps_every_library_and_refuses_unknown_names():
    assert isa_environment("native") == {}
    assert isa_environment("AVX2") == {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # torch.compile's float linears run on MKL
    }
    assert all(isa_environment(isa)["ONEDNN_MAX_CPU_ISA"] == isa for isa in ISA_PATHS)
    with pytest.raises(ValueError, match=r"unknown ISA 'avx2' \(one of: native, AVX2, "):
        isa_environment("avx2")


def test_run_under_isa_runs_a_fresh_capped_interpreter():
    found = run_under_isa("AVX2", "import torch\nresult = torch.backends.cpu.get_cpu_capability()")
    assert found["result"] == "AVX2", "ATen capped at AVX2"
    assert found["cpu"]["onednn"] == "AVX2" and found["cpu"]["emulated"]
    assert not found["cpu"]["vnni"]


def test_run_under_isa_reports_the_failing_line():
    with pytest.raises(RuntimeError, match=r"under ISA AVX2 failed \(exit 1\): ZeroDivisionError"):
        run_under_isa("AVX2", "result = 1 / 0")


def test_run_under_isa_refuses_an_unknown_isa_before_starting_anything(monkeypatch):
    monkeypatch.setattr(cpu_module.subprocess, "run", None)  # would fail if it were called
    with pytest.raises(ValueError, match="unknown ISA"):
        run_under_isa("SSE4", "result = 1")


def test_a_step_naming_a_temporary_file_is_keyed_by_the_files_contents(tmp_path):
    """run_under_isa's default key: two runs of a lesson save the same weights under new
    temporary names (M04-2), and the other language's build must find the first one's answer;
    other weights are another step."""
    from common.cpu import _what_source_computes

    first, second, other = (tmp_path / name for name in ("a.pt", "b.pt", "c.pt"))
    first.write_bytes(b"weights")
    second.write_bytes(b"weights")
    other.write_bytes(b"other weights")
    step = "model.load_state_dict(torch.load({!r}))  # {}"
    assert _what_source_computes(step.format(str(first), "en")) == _what_source_computes(
        step.format(str(second), "中文")
    )
    assert _what_source_computes(step.format(str(first), "")) != _what_source_computes(
        step.format(str(other), "")
    )


def test_a_capped_process_reads_the_answer_the_builds_native_process_got(tmp_path, monkeypatch):
    """run_under_isa's key holds the ISA asked for, not the asking process's kernel path: a
    reader run capped at AVX2 reads the build's AVX2 step instead of starting it again."""
    from common import lesson

    answers = iter([{"result": "the build's"}, {"result": "started again"}])
    monkeypatch.setattr(cpu_module, "_run_under_isa", lambda *_: next(answers))
    native = describe()
    lesson.start(lang="en", name="m09_1_x", measured=tmp_path, inputs="inputs", pictures=False)
    try:
        first = run_under_isa("AVX2", "result = 1")["result"]
        # Another path than this CPU's, whatever it is (on an AVX2-only CPU, AVX2 is its own)
        other = "AVX512_CORE" if native.onednn == "AVX2" else "AVX2"
        capped = replace(native, aten=other, onednn=other, vnni=False, amx_int8=False)
        assert capped.kernel_path != native.kernel_path
        monkeypatch.setattr(cpu_module, "describe", lambda: capped)
        again = run_under_isa("AVX2", "result = 1")["result"]
    finally:
        lesson.stop()
    assert first == again == "the build's"
