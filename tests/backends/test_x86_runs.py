"""common.backends.x86.runs: what ran an atlas entry on x86, lowered or compiled."""

import ast
from pathlib import Path

import torch

from common import atlas
from common.backends.x86 import runs
from common.pt2e import quiet

quiet()


def test_a_conv_with_an_add_it_cannot_accumulate_in_place_is_compiled_with_freezing_set():
    """oneDNN's "accum tensor must be contiguous" sends the conv + add + ReLU to a compile;
    freezing is set for the process before it and stays set (a later recompile keeps it)."""
    item = atlas.entry("add · after conv")
    before = torch._inductor.config.freezing
    torch._inductor.config.freezing = False
    try:
        ran = runs.x86_runs(item, atlas.quantize(item, "x86"))
        assert ran["path"] == "compiled", ran
        assert ran["op"].startswith("fused: qconv2d_pointwise"), ran
        assert torch._inductor.config.freezing is True, "left set for the process"
    finally:
        torch._inductor.config.freezing = before


def test_the_x86_reader_compiles_with_no_config_patch():
    """The pattern the course warns against (m03, common.timing.race): freezing inside
    ``torch._inductor.config.patch``, lost at a recompile outside the block."""
    tree = ast.parse(Path(runs.__file__).read_text("utf-8"))
    patched = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "patch"
    ]
    assert not patched, f"config.patch at lines {patched}"
