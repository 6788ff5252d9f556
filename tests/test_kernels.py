"""The run-time kernel check (common.kernels): which kernels a model really ran."""

import pytest
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


def int8_linears(*, add: bool, unary: torch.nn.Module | None = None):
    """Two int8 linears compiled with freezing under no_grad, the first followed by a
    residual add (x86 fuses it: one qlinear with an add post-op) or not."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from common.pt2e import export_module, x86_quantizer

    class Linears(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
            self.act = unary or torch.nn.Identity()

        def forward(self, x):
            y = self.fc1(x)
            return self.act(self.fc2(y + x if add else y))

    torch.manual_seed(0)
    x = (torch.randn(8, 64),)
    prepared = prepare_pt2e(export_module(Linears().eval(), x), x86_quantizer())
    prepared(*x)
    return torch.compile(convert_pt2e(prepared)), x


@pytest.fixture
def freezing(monkeypatch):
    monkeypatch.setattr(torch._inductor.config, "freezing", True)


@pytest.mark.usefixtures("freezing")
def test_a_fused_add_and_a_plain_linear_do_not_print_the_same_line():
    lines = {}
    for add in (True, False):
        model, x = int8_linears(add=add, unary=torch.nn.ReLU())
        with torch.no_grad():
            model(*x)
            ran = kernels_run(model, x)
        assert ran.int8 == {"onednn::qlinear_pointwise": 2} and not ran.float, ran.summary
        lines[add] = ran.summary
        expected = {"add": 1, "relu": 1} if add else {"relu": 1}
        assert ran.post_ops == {"onednn::qlinear_pointwise": expected}, ran.summary
    assert lines[True] != lines[False]
    assert "(+add ×1, +relu ×1)" in lines[True] and "+add" not in lines[False]


@pytest.mark.usefixtures("freezing")
def test_the_implementation_onednn_ran_is_read_beside_the_post_ops():
    model, x = int8_linears(add=True)
    with torch.no_grad():
        model(*x)
        ran = kernels_run(model, x)
    (found,) = ran.implementations.values()  # e.g. brg_matmul:avx512_core_amx, gemm:jit
    assert sum(found.values()) == 2 and all(":" in name for name in found), found


@pytest.mark.usefixtures("freezing")
def test_after_a_dynamo_reset_an_int8_model_shows_no_float_kernel():
    """The call after reset compiles: the compiler's own aten::addmm/mm are not reported."""
    model, x = int8_linears(add=False)
    with torch.no_grad():
        model(*x)
        torch._dynamo.reset()
        ran = kernels_run(model, x)
    assert ran.warmed_up and not ran.float, ran.summary
    assert ran.int8 == {"onednn::qlinear_pointwise": 2}
    assert ran.summary.endswith("(read on a second call: the first one compiled)")


def test_a_model_that_compiles_at_every_call_is_refused(monkeypatch):
    from common import kernels

    moves = iter(range(100))
    monkeypatch.setattr(kernels, "_compiles", lambda: next(moves))
    with pytest.raises(RuntimeError, match="compiled at two calls in a row"):
        kernels_run(torch.nn.Linear(4, 2), (torch.ones(1, 4),))


def test_what_it_cannot_see_is_what_its_docstring_says():
    """Inductor inlines a batch-1 GEMM with a weight of at most 16×16 into its C++ loop:
    the float linear runs, and no kernel of FLOAT_KERNELS is called for it."""
    from torch._inductor.utils import run_and_get_code

    import common.kernels

    tiny = torch.compile(torch.nn.Linear(4, 4).eval())
    x = (torch.randn(1, 4),)
    with torch.no_grad():
        _, code = run_and_get_code(tiny, *x)
        ran = kernels_run(tiny, x)
    assert not ran.float and not ran.int8, ran.summary
    code = "".join(code)
    assert "cpp_fused_addmm" in code, "the GEMM is a loop of inductor's own C++"
    assert "extern_kernels.addmm" not in code and "extern_kernels.mm" not in code
    assert "16×16" in common.kernels.__doc__ and "output_code" in common.kernels.__doc__


def test_post_ops_are_read_from_onednns_words():
    from common.kernels import _post_ops

    line = "onednn_verbose,v1,primitive,exec,cpu,matmul,x,undef,src:u8 dst:f32,attr-post-ops:"
    assert _post_ops(line + "binary_add:f32:3:ab+eltwise_relu,,8x64:64x64,0.01") == ["add", "relu"]
    assert _post_ops(line + "eltwise_gelu_erf,,8x64,0.01") == ["gelu"]
    assert _post_ops(line + "sum:1:0:u8+eltwise_relu,,8x64,0.01") == ["add", "relu"]
    assert _post_ops("onednn_verbose,v1,primitive,exec,cpu,matmul,x,undef,src:u8,,8x64,0.01") == []


def test_sdpas_float_matmuls_are_not_in_the_float_kernels():
    """scaled_dot_product_attention computes its matmuls in float inside one aten op that
    FLOAT_KERNELS does not list: 'float: none' means no float conv or linear kernel."""
    from common.kernels import FLOAT_KERNELS

    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    qkv = tuple(torch.randn(1, 2, 8, 16) for _ in range(3))
    ran = kernels_run(attention, qkv)
    assert not ran.float and not ran.int8, ran.summary
    assert not any("scaled_dot_product" in name for name in FLOAT_KERNELS)


def test_time_by_kind_runs_at_the_thread_count_it_is_given_and_restores_the_callers():
    from common.kernels import time_by_kind

    seen, before = [], torch.get_num_threads()
    split = time_by_kind(lambda x: seen.append(torch.get_num_threads()) or x, (1,), threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == before
    assert split["int8"] == split["float"] == 0.0 and split["total"] >= split["other"]


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor.*deprecated:UserWarning")
@pytest.mark.parametrize("engine", ["x86", "fbgemm", "onednn"])
def test_eager_torch_ao_int8_convs_and_linears_count_as_int8(engine, monkeypatch):
    """A legacy (eager torch.ao) int8 model runs quantized::conv2d and quantized::linear, on
    fbgemm or oneDNN: int8, not "int8: none; float: none"."""
    import torch.ao.nn.quantized as nnq
    import torch.ao.nn.quantized.dynamic as nnqd

    if engine not in torch.backends.quantized.supported_engines:
        pytest.skip(f"no {engine} quantized engine in this torch")
    monkeypatch.setattr(torch.backends.quantized, "engine", engine)
    torch.manual_seed(0)
    conv, linear, dynamic = nnq.Conv2d(3, 4, 3), nnq.Linear(8, 4), nnqd.Linear(8, 4)
    image = torch.quantize_per_tensor(torch.randn(1, 3, 8, 8), 0.1, 128, torch.quint8)
    rows = torch.quantize_per_tensor(torch.randn(2, 8), 0.1, 128, torch.quint8)
    weight = torch.quantize_per_tensor(torch.randn(4, 8), 0.1, 0, torch.qint8)

    def legacy(image, rows):
        torch.ops.quantized.linear_prepack(weight, None)  # prepacking: not int8 compute
        return conv(image), linear(rows), dynamic(rows.dequantize())

    ran = kernels_run(legacy, (image, rows))
    expected = {"quantized::conv2d": 1, "quantized::linear": 1, "quantized::linear_dynamic": 1}
    assert ran.int8 == expected and not ran.float, ran.summary
    assert ran.summary_in("en").startswith("int8: quantized::conv2d ×1, quantized::linear ×1")
