"""common.numerics: record, sqnr (torchao's compute_error), fold_batch_norm_modules, and their
errors."""

import math

import pytest
import torch

from common.data import DigitsCNN
from common.numerics import (
    DIGITS_CONV_BN,
    fold_batch_norm_modules,
    int8_conv_steps,
    record,
    sqnr,
)


def _trained_like_digits_cnn():
    """A DigitsCNN with BatchNorm statistics and affine terms far from their defaults."""
    torch.manual_seed(0)
    model = DigitsCNN()
    with torch.no_grad():
        for bn in (model.bn1, model.bn2, model.bn3):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.2, 3)
            bn.weight.uniform_(0.5, 2)
            bn.bias.uniform_(-0.5, 0.5)
    return model.eval()


def test_record_keeps_every_node_output_by_name():
    model = _trained_like_digits_cnn()
    gm = torch.fx.symbolic_trace(model)
    x = torch.rand(4, 1, 8, 8)
    outputs = record(gm, x)
    assert list(outputs) == [node.name for node in gm.graph.nodes]
    assert torch.equal(outputs["output"], model(x))
    assert torch.equal(outputs["conv1"], model.conv1(x))


def test_record_refuses_an_eager_module_and_says_what_it_needs():
    with pytest.raises(TypeError, match=r"needs a torch\.fx\.GraphModule.*got DigitsCNN"):
        record(DigitsCNN(), torch.rand(1, 1, 8, 8))


@pytest.mark.parametrize(
    "shape", [(500, 10), (64, 8, 8, 8), (16, 8, 3, 3), (7,)], ids=["logits", "act", "weight", "1d"]
)
def test_sqnr_is_the_formula_bit_for_bit_and_what_the_numeric_debugger_computes(shape):
    from torch.ao.ns.fx.utils import compute_sqnr  # what compare_results reports

    generator = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=generator)
    noisy = x + 0.01 * torch.randn(shape, generator=generator)
    formula = 20 * torch.log10(torch.linalg.vector_norm(x) / torch.linalg.vector_norm(x - noisy))
    assert torch.equal(sqnr(x, noisy), formula)
    assert torch.equal(sqnr(x, noisy), compute_sqnr(x, noisy))


@pytest.mark.parametrize(
    ("noise", "expected"), [(0.1, 20.0), (0.01, 40.0), (0.5, 20 * math.log10(2))]
)
def test_sqnr_of_a_scaled_copy_is_minus_20_log10_of_the_scale(noise, expected):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert sqnr(x, x * (1 - noise)).item() == pytest.approx(expected, abs=1e-3)


def test_sqnr_of_equal_tensors_is_infinite():
    x = torch.ones(3)
    assert sqnr(x, x.clone()).item() == math.inf


def test_sqnr_refuses_tensors_of_different_shapes():
    with pytest.raises(ValueError, match=r"one shape, got \(2, 3\) and \(3,\)"):
        sqnr(torch.ones(2, 3), torch.ones(3))


def test_fold_batch_norm_modules_computes_the_same_function_and_leaves_the_model_alone():
    model = _trained_like_digits_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = fold_batch_norm_modules(model, pairs=DIGITS_CONV_BN)
    x = torch.rand(32, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)
    assert all(isinstance(getattr(folded, bn), torch.nn.Identity) for bn in ("bn1", "bn2", "bn3"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "untouched"
    assert isinstance(model.bn1, torch.nn.BatchNorm2d)


@pytest.mark.parametrize(
    "pairs", [(("conv1", "bn9"),), (("bn1", "conv1"),), (("fc1", "bn1"),)], ids=str
)
def test_fold_batch_norm_modules_refuses_names_that_are_not_a_conv_and_its_batch_norm(pairs):
    with pytest.raises(ValueError, match=r"must name a Conv2d and a BatchNorm2d.*conv1, conv2"):
        fold_batch_norm_modules(DigitsCNN().eval(), pairs=pairs)


def test_fold_batch_norm_names_the_graph_pass_only():
    from common import handmade, numerics

    assert callable(handmade.fold_batch_norm)
    assert not hasattr(numerics, "fold_batch_norm"), "the module copy is fold_batch_norm_modules"


def _digits_q_dq(*, reduce_range):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    from common.data import digits, export_digits_model

    config = x86.get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
    quantizer = x86.X86InductorQuantizer().set_global(config)
    prepared = prepare_pt2e(export_digits_model(_trained_like_digits_cnn()), quantizer)
    with torch.no_grad():
        prepared(digits("calibration")[0][:32])
    return convert_pt2e(prepared)


def test_int8_conv_steps_compares_every_conv_and_reduce_range_stays_within_one_step():
    from common.data import digits

    steps = int8_conv_steps(_digits_q_dq(reduce_range=True), digits("test")[0][:64])
    assert [s["conv"] for s in steps] == ["conv2d", "conv2d_1", "conv2d_2"]
    assert all(s["max_steps"] <= 1 and s["share"] == 0 for s in steps), steps
    assert [s["values"] for s in steps] == [64 * 8 * 64, 64 * 16 * 64, 64 * 16 * 16]


def test_int8_conv_steps_refuses_a_graph_that_is_not_quantized():
    from common.data import digits

    float_graph = torch.fx.symbolic_trace(_trained_like_digits_cnn())
    with pytest.raises(ValueError, match="every aten conv2d reads a dequantize"):
        int8_conv_steps(float_graph, digits("test")[0][:4])
