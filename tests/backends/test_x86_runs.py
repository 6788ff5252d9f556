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


def test_a_weight_two_linears_read_runs_int8_lowered_and_float_compiled():
    """One int8 constant, a dequantize per reader: the lowering prepacks each; a compile first
    merges the two dequantize nodes into one with two users, which its weight pattern does not
    match. The reader reads the compile."""
    from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86

    from common.kernels import kernels_run

    item = atlas.entry("linear · weight shared")
    converted = atlas.quantize(item, "x86")
    (readers,) = runs.shared_weights(converted).values()
    assert len(readers) == 2, readers
    assert not runs.shared_weights(atlas.quantize(atlas.entry("linear"), "x86"))
    with torch.no_grad():
        lowered = lower_pt2e_quantized_to_x86(converted, item.example_args())
        assert kernels_run(lowered, item.example_args()).int8 == {"onednn::qlinear_pointwise": 3}
    ran = runs.x86_runs(item, atlas.quantize(item, "x86"))
    assert ran["path"] == "compiled", ran
    assert ran["int8"] == {"onednn::qlinear_pointwise": 1} and ran["float"] == {"aten::addmm": 2}
    assert ran["op"] == "oneDNN: qlinear_pointwise; fp32: aten::addmm", ran


def test_the_lowering_keeps_a_gelu_whole_that_a_compile_fuses():
    """The freezing passes' unary patterns match inductor's decomposed GELU, which only a
    compile produces; after a linear, a LeakyReLU has no int8 post-op in either."""
    gelu, leaky = atlas.entry("gelu"), atlas.entry("leaky_relu · after linear")
    assert runs.x86_runs(gelu, atlas.quantize(gelu, "x86"))["op"] == "loop fp32"
    assert runs.x86_compiled(gelu)["post_ops"] == {"onednn::qlinear_pointwise": ["gelu"]}
    assert runs.x86_runs(leaky, atlas.quantize(leaky, "x86"))["op"] == "loop fp32"
    assert runs.x86_compiled(leaky)["post_ops"] == {"onednn::qlinear_pointwise": []}


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
