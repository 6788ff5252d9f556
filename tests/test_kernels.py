"""The run-time kernel check (common.kernels) and the fair race (common.timing.race)."""

import itertools

import pytest
import torch

from common import timing
from common.kernels import KernelsRun, kernels_run
from common.timing import compare_speed, measured_once, race, timing_key


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


def test_race_refuses_a_model_compiled_already():
    with pytest.raises(TypeError, match=r"already torch\.compile'd"):
        race({"fp32": torch.compile(tiny_conv_net())}, (torch.randn(1, 3, 8, 8),))


def test_race_raises_when_the_kernels_change_during_the_timing(monkeypatch):
    answers = itertools.cycle(
        [KernelsRun(int8={"onednn::qconv_pointwise": 1}, float={}), KernelsRun(int8={}, float={})]
    )
    monkeypatch.setattr(timing, "kernels_run", lambda model, args: next(answers))
    monkeypatch.setattr(torch, "compile", lambda model, **options: model)
    monkeypatch.setattr(torch._inductor.config, "freezing", False)
    with pytest.raises(RuntimeError, match="recompiled"):
        race({"int8": tiny_conv_net()}, (torch.randn(1, 3, 8, 8),), rounds=5, warmup=0)


def test_race_compiles_with_freezing_for_the_process_and_reports_what_ran(monkeypatch):
    monkeypatch.setattr(torch._inductor.config, "freezing", False)
    raced = race({"fp32": tiny_conv_net()}, (torch.randn(2, 3, 8, 8),), rounds=5, warmup=1)
    assert torch._inductor.config.freezing, "a later recompile keeps freezing"
    assert hasattr(raced.models["fp32"], "_orig_mod"), "the timed model is the compiled copy"
    assert raced.kernels["fp32"].float and not raced.kernels["fp32"].int8
    assert raced["fp32"].rounds == 5 and "ran int8: none" in raced.table()


def test_timing_key_follows_the_weights_and_the_input_shape():
    x = (torch.randn(2, 3, 8, 8),)
    model = tiny_conv_net()
    key = timing_key({"m": model}, x)
    assert key == timing_key({"m": tiny_conv_net()}, x), "same code, same weights"
    with torch.no_grad():
        model[0].weight[0, 0, 0, 0] += 1
    assert timing_key({"m": model}, x) != key
    assert timing_key({"m": tiny_conv_net()}, (torch.randn(4, 3, 8, 8),)) != key
    assert timing_key({"m": lambda t: t}, x) is None, "code it cannot read: no key"
    assert timing_key({"m": torch.compile(tiny_conv_net())}, x) is None


def test_a_timing_is_measured_once_while_the_site_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(measured_once, "folder", tmp_path)
    x = (torch.randn(2, 3, 8, 8),)
    first = compare_speed({"m": tiny_conv_net()}, x, rounds=5)
    again = compare_speed({"m": tiny_conv_net()}, x, rounds=5)
    assert again == first, "the other language's build shows the same figures"
    assert len(list(tmp_path.glob("*.json"))) == 1
    monkeypatch.setattr(measured_once, "folder", None)
    compare_speed({"m": tiny_conv_net()}, x, rounds=5)
    assert len(list(tmp_path.glob("*.json"))) == 1, "a reader's run measures afresh"
