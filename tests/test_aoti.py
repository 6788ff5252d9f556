"""AOTInductor packages (common.aoti): the key they are kept by, the kernels they call."""

import pytest
import torch

from common.pt2e import export_module


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
