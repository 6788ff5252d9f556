"""Marks the test modules share: a skip where Graphviz is missing, and an xdist group."""

import shutil

import pytest

__all__ = ["ON_THE_PATTERN_WORKER", "needs_dot"]

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz 'dot' is not installed (apt-get install graphviz)"
)

# Tests that make torchao export its BatchNorm patterns (~15 s the first time in a worker) run
# on one worker: the lowering matrix (which its test_matrix_reaches_every_rewrite reads whole),
# handmade's and the edge matrix's unfolded_bn cases. Their modules also request the fixture
# torchao_patterns_exported_once (conftest.py), so each pattern is exported once per worker.
ON_THE_PATTERN_WORKER = pytest.mark.xdist_group("torchao_patterns")
