"""The session's fixtures: a test gets the ones it asks for, and the heavy ones only then."""

import os
import subprocess
import sys
import textwrap

from lesson_scripts import ROOT

# One of test_zh_spacing.py's checks, run in a pytest of its own: it quantizes nothing.
UNQUANTIZED = "tests/test_zh_spacing.py::test_the_check_finds_every_artefact"


def test_a_test_that_quantizes_nothing_imports_neither_torchao_nor_executorch():
    """torchao_patterns_exported_once (conftest.py) imports both: the modules that prepare and
    convert models request it, and it would fail this test were it autouse again. (Selecting
    tests with ``-k`` still collects, so imports, every test module and common's doctests.)"""
    code = textwrap.dedent(
        f"""
        import sys
        import pytest

        exit_code = pytest.main(["-q", "-p", "no:cacheprovider", "-n", "0", {UNQUANTIZED!r}])
        assert exit_code == 0, f"pytest exited with {{exit_code}}"
        packages = {{name.split(".")[0] for name in sys.modules}}
        loaded = sorted(packages & {{"torchao", "executorch"}})
        assert not loaded, f"running {UNQUANTIZED} imported {{loaded}}"
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
