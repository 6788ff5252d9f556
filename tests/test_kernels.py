"""The run-time kernel check (common.kernels): which kernels a model really ran."""

import torch

from common.kernels import kernels_run


def tiny_conv_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)
    ).eval()


def test_kernels_run_names_the_float_kernels_of_an_eager_model():
    ran = kernels_run(tiny_conv_net(), (torch.randn(2, 3, 8, 8),))
    assert ran.float == {"aten::convolution": 1, "aten::addmm": 1} and not ran.int8


def test_kernels_run_finds_onednn_int8_kernels_in_a_lowered_graph():
    from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from common.lowering import reshape_views
    from common.pt2e import export_module, x86_quantizer

    x = (torch.randn(2, 3, 8, 8),)
    prepared = prepare_pt2e(export_module(tiny_conv_net(), x), x86_quantizer())
    prepared(*x)
    lowered = lower_pt2e_quantized_to_x86(convert_pt2e(prepared), x)
    reshape_views(lowered)
    ran = kernels_run(lowered, x)
    assert ran.int8["onednn::qconv_pointwise"] == 1, ran.summary


def test_kernels_run_keeps_the_callers_grad_mode():
    seen = []
    kernels_run(lambda: seen.append(torch.is_grad_enabled()), ())
    with torch.no_grad():
        kernels_run(lambda: seen.append(torch.is_grad_enabled()), ())
    assert seen == [True, False], "a grad-mode change would recompile a compiled model"
