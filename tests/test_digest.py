"""The one key (common.digest): files, tensors, containers and modules, always with the
stack's versions, and the same in every process."""

import os
import subprocess
import sys

import torch
from lesson_scripts import ROOT

from common import digest


def test_digest_covers_the_stack_and_reads_files_tensors_and_containers(tmp_path, monkeypatch):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"w")
    key = digest.digest(path, torch.ones(2), {"b": 1, "a": [1, 2]})
    assert key == digest.digest(path, torch.ones(2), {"a": [1, 2], "b": 1})
    assert key != digest.digest(path, torch.ones(2, dtype=torch.int8), {"a": [1, 2], "b": 1})
    assert digest.digest("ab", "c") != digest.digest("a", "bc"), "parts do not run together"
    monkeypatch.setattr(digest, "stack_versions", lambda: (("torch", "9.9"),))
    assert key != digest.digest(path, torch.ones(2), {"b": 1, "a": [1, 2]}), "another torch"


def test_a_modules_digest_is_the_same_in_a_new_process():
    """The other language's build is another process: the key must not hold an address."""
    probe = (
        "import torch\nfrom common.digest import digest\nfrom common.models import get_model\n"
        "from common.pt2e import export_module\nfrom common.models import example_inputs\n"
        "m = get_model('conv_relu')\n"
        "print(digest(m), digest(export_module(m, example_inputs(1))))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    keys = [
        subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert keys[0] == keys[1] and len(keys[0]) == 2


def test_import_closure_follows_packages_names_and_subprocess_code(tmp_path):
    """What a lesson may run of ``common``: a package's ``__init__`` and its relative imports,
    a module imported by name (``importlib``), code handed to a subprocess as a string; a name
    that is no module of ``common`` is not a file."""
    common = tmp_path / "common"
    (common / "pkg").mkdir(parents=True)
    (common / "__init__.py").write_text("")
    (common / "pkg" / "__init__.py").write_text("from .inner import X\n")
    (common / "pkg" / "inner.py").write_text("X = 1\n")
    (common / "named.py").write_text("")
    (common / "sub.py").write_text("")
    (common / "unused.py").write_text("")
    lesson = tmp_path / "lesson.py"
    lesson.write_text(
        "import importlib\nimport common.pkg\nfrom common import SUPPORTED_VERSIONS\n"
        'importlib.import_module("common.named")\n'
        'STEP = "from common import sub\\nresult = 1\\n"\n'
    )
    found = [p.relative_to(common).as_posix() for p in digest.import_closure(lesson, tmp_path)]
    assert found == ["__init__.py", "named.py", "pkg/__init__.py", "pkg/inner.py", "sub.py"]
    skipped = digest.import_closure(lesson, tmp_path, skip=[common / "pkg" / "__init__.py"])
    assert "pkg/inner.py" not in {p.relative_to(common).as_posix() for p in skipped}
