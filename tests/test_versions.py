"""common/__init__.py: importing the course checks the pinned torch and torchao."""

import tomllib

import pytest
from lesson_scripts import ROOT

import common


def test_supported_versions_match_pyproject_pins():
    with open(ROOT / "pyproject.toml", "rb") as f:
        pins = tomllib.load(f)["project"]["dependencies"]
    for name, version in common.SUPPORTED_VERSIONS.items():
        assert f"{name}=={version}" in pins


@pytest.mark.parametrize(
    ("installed", "message"),
    [
        (
            {"torch": "2.9.1", "torchao": "0.18.0"},
            "needs torch==2.13.0 but torch 2.9.1 is installed",
        ),
        ({"torch": "2.13.0", "torchao": "0.17.0"}, "needs torchao==0.18.0 but torchao 0.17.0"),
    ],
)
def test_wrong_versions_are_refused_with_the_fix(installed, message):
    with pytest.raises(ImportError, match=message) as info:
        common.check_versions(installed)
    assert "pip install torch==2.13.0 torchao==0.18.0" in str(info.value)
