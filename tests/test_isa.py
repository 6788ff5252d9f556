"""The CPU-dependent lessons, with their solutions, run under a second kernel path (AVX2).

A sentence that holds only on the CPU that wrote it fails here: the lessons below read the
machine (``common.cpu``) and must hold both with and without VNNI. Natively they already run
in ``test_lessons.py`` (as a reader runs them, and with their solutions); this file runs them
once more, in one language (the code of the twins is identical), in a fresh interpreter capped
by ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``. Select it with ``-m isa``, leave it out
with ``-m "not isa"``.
"""

import json
import os
import subprocess
import sys

import pytest

from common.cpu import isa_environment

from conftest import EXAMPLES, ROOT, exercise_solutions, torch_threads

# The lessons whose numbers or prose depend on the CPU's int8 and float kernels.
CPU_DEPENDENT = [
    "m03_lowering/m03_1_lowered_graph.py",
    "m03_lowering/m03_3_speed_and_size.py",
    "m04_accuracy/m04_1_measuring_the_error.py",
    "m04_accuracy/m04_2_fixing_it.py",
    "m04_accuracy/m04_3_qat.py",
]
LANGUAGE = "en"

# Runs a lesson as __main__, then its solutions in its namespace (as test_lessons.py does),
# after checking that the cap took.
RUNNER = """
import json, runpy, sys
from common.cpu import describe
path, solutions, expected = json.load(sys.stdin)
assert describe().onednn == expected, f"not capped: {describe().verdict}"
namespace = runpy.run_path(path, run_name="__main__")
for number, code in enumerate(solutions, 1):
    exec(compile(code, f"{path} (solution {number})", "exec"), namespace)
"""


def test_every_cpu_dependent_lesson_exists():
    for relative in CPU_DEPENDENT:
        assert (EXAMPLES / LANGUAGE / relative).exists(), relative


@pytest.mark.slow
@pytest.mark.isa
@pytest.mark.parametrize("isa", ["AVX2"])
@pytest.mark.parametrize("relative", CPU_DEPENDENT)
def test_cpu_dependent_lesson_and_its_solutions_run_under_another_isa(relative, isa, tmp_path):
    import torch

    if not torch.cpu.get_capabilities().get("avx2"):
        pytest.skip("this CPU has no AVX2 to cap the kernels at")
    script = EXAMPLES / LANGUAGE / relative
    env = {**os.environ, **torch_threads(), **isa_environment(isa)}
    env["PT2E_COURSE_DRAW_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    job = json.dumps([str(script), exercise_solutions(script), isa])
    result = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=job,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"{relative} under {isa} failed:\n{result.stderr[-3000:]}"
    assert result.stderr == "", f"{relative} under {isa} wrote to stderr:\n{result.stderr[-3000:]}"
    assert list(tmp_path.glob("*.svg")), f"{relative} under {isa} drew no picture"
