"""AOTInductor packages (common.aoti): the key they are kept by, the kernels they call, and the
numbers they compute, checked against the program they came from."""

import pytest
import torch

from common.pt2e import export_module, x86_quantizer


def test_package_key_follows_the_program_its_weights_and_its_input_shape():
    from common.aoti import package_key

    def program(weight=1.0, batch=2):
        torch.manual_seed(0)  # the bias too
        model = torch.nn.Linear(3, 2)
        with torch.no_grad():
            model.weight.fill_(weight)
        return torch.export.export(model, (torch.ones(batch, 3),))

    assert package_key(program()) == package_key(program())
    assert package_key(program(weight=2.0)) != package_key(program())
    assert package_key(program(batch=4)) != package_key(program())


def test_compiled_package_refuses_a_graph_module_and_says_how_to_export_it():
    from common.aoti import compiled_package

    gm = export_module(torch.nn.Linear(3, 2), (torch.ones(2, 3),))
    with pytest.raises(TypeError, match=r"got GraphModule; export it first: torch\.export"):
        compiled_package(gm, "linear")


def test_kernel_calls_counts_the_generated_cpp_calls(tmp_path):
    import zipfile

    from common.aoti import kernel_calls

    package = tmp_path / "model.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr(
            "model/data/aotinductor/model/abc.wrapper.cpp",
            "aoti_torch_cpu__qlinear_pointwise_tensor(a);\n"
            "aoti_torch_cpu__qlinear_pointwise_tensor(b);\n"
            "aoti_torch_cpu__qlinear_pointwise_binary_tensor(c);\n"
            "aoti_torch_cpu_scaled_dot_product_flash_attention_for_cpu(d);\n",
        )
        archive.writestr("model/data/weights.bin", "aoti_torch_cpu__linear_pointwise(x);")
    assert kernel_calls(package) == {
        "qlinear_pointwise": 2,
        "qlinear_pointwise_binary": 1,
        "scaled_dot_product_flash_attention_for_cpu": 1,
    }


def linear_program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))


@pytest.mark.parametrize(
    "error, passes",
    [(0.0, True), (1e-3, True), (1.0, False)],
    ids=["equal outputs pass", "rounding passes", "noise is refused"],
)
def test_check_package_compares_the_package_with_its_program(monkeypatch, error, passes):
    from common.aoti import check_package

    program = linear_program()
    (x,), _ = program.example_inputs
    expected = program.module()(x).detach()
    noise = error * torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(
        torch._inductor, "aoti_load_package", lambda path: lambda x: expected + noise
    )
    if passes:
        assert check_package("linear.pt2", program) > 15
    else:
        with pytest.raises(RuntimeError, match=r"^linear\.pt2 computes other numbers .* SQNR -?\d"):
            check_package("linear.pt2", program)


def test_check_package_needs_the_programs_example_inputs():
    from common.aoti import check_package

    program = linear_program()
    program.example_inputs = None
    with pytest.raises(ValueError, match=r"no example inputs .* torch\.export\.export"):
        check_package("linear.pt2", program)


def conv_flatten_int8(channels: int) -> torch.export.ExportedProgram:
    """An int8 (x86) conv and a flatten, exported with a batch from 1 to 4."""
    from torch.export import Dim
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(channels, 8, 3), torch.nn.Flatten()).eval()
    x, batch = torch.randn(3, channels, 6, 5), ({0: Dim("batch", min=1, max=4)},)
    prepared = prepare_pt2e(
        torch.export.export(model, (x,), dynamic_shapes=batch).module(), x86_quantizer()
    )
    prepared(x)
    return torch.export.export(convert_pt2e(prepared), (x,), dynamic_shapes=batch)


def test_compiled_package_refuses_a_dynamic_int8_conv_package_on_one_input_channel():
    """torch 2.13's inductor declares the int8 conv's output contiguous when its input has one
    channel and the batch is symbolic, while oneDNN writes it channels-last (M06-4, m99_3).
    When an upgrade fixes it, this test fails: update those pages."""
    from common.aoti import check_package, compiled_package

    program = conv_flatten_int8(channels=1)
    with pytest.raises(RuntimeError, match=r"computes other numbers .* one channel"):
        compiled_package(program, "conv_flatten_1ch_batch_1_4")
    path = compiled_package(program, "conv_flatten_1ch_batch_1_4", check=False)
    assert check_package(path, program, min_sqnr=-float("inf")) < 10, "noise, unchecked"


def test_compiled_package_keeps_a_dynamic_int8_conv_package_on_three_input_channels():
    from common.aoti import check_package, compiled_package

    program = conv_flatten_int8(channels=3)
    path = compiled_package(program, "conv_flatten_3ch_batch_1_4")  # checked: no error
    assert check_package(path, program) >= 10, "int8 rounding (coarser on AVX2), not noise"
