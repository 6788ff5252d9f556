"""common.vision_models against torchvision 0.28: what a quantizer sees follows from the forward.

torchvision does not import beside the CPU build of torch 2.13.0, so these tests check the
rewrite's statement order and modules against what torchvision's sources say, through the
effect a reader meets: which conv ``X86InductorQuantizer`` fuses into a residual add.
"""

import operator

import pytest
import torch
from torch import nn

from common.models import example_inputs, get_model, input_shape
from common.pt2e import quiet, x86_quantizer
from common.vision_models import BasicBlock, Bottleneck, EfficientNet, MobileNetV3

quiet()

from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e  # noqa: E402

ADDS = (operator.add, operator.iadd, torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor)


def module_of(node: torch.fx.Node) -> str:
    """The path of the module whose forward made ``node`` (from the export's nn_module_stack)."""
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def residual_adds(prepared: torch.fx.GraphModule) -> dict[str, tuple[str, str]]:
    """Each residual add by its block: (the conv fused into it, the conv its observed input
    comes from). x86 fuses a conv into the add by leaving the conv's output unobserved; the add's
    other input is quantized, so an observer sits between it and the add."""
    adds = {}
    for node in prepared.graph.nodes:
        if node.op != "call_function" or node.target not in ADDS:
            continue
        fused = [a for a in node.args if a.op == "call_function"]
        observed = [a.args[0] for a in node.args if a.op == "call_module"]
        assert len(fused) == 1 and len(observed) == 1, node.format_node()
        assert fused[0].target == torch.ops.aten.conv2d.default, fused[0].format_node()
        adds[module_of(node)] = (module_of(fused[0]), module_of(observed[0]))
    return adds


@pytest.fixture(scope="module")
def resnet18_adds():
    args = example_inputs(2, shape=input_shape("resnet18"))
    # strict: x86 refuses the non-strict export's reused self.relu (test_coverage)
    graph = torch.export.export(get_model("resnet18"), args, strict=True).module()
    return residual_adds(prepare_pt2e(graph, x86_quantizer()))


def test_x86_fuses_conv2_into_the_downsampling_blocks_add(resnet18_adds):
    """torchvision computes the downsample after bn2, just before the add: x86 fuses conv2 and
    quantizes the downsample conv's output as the add's extra input."""
    assert resnet18_adds["layer2.0"] == ("layer2.0.conv2", "layer2.0.downsample.0")
    for block in ("layer3.0", "layer4.0"):
        assert resnet18_adds[block] == (f"{block}.conv2", f"{block}.downsample.0")


def test_x86_fuses_conv2_into_every_add_of_resnet18(resnet18_adds):
    assert len(resnet18_adds) == 8
    assert all(fused == f"{block}.conv2" for block, (fused, _) in resnet18_adds.items())


def test_bottleneck_fuses_conv3_and_observes_the_downsample():
    downsample = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
    block = Bottleneck(8, 4, 2, downsample).eval()
    args = (torch.randn(2, 8, 8, 8),)
    graph = torch.export.export(block, args, strict=True).module()
    assert residual_adds(prepare_pt2e(graph, x86_quantizer())) == {"": ("conv3", "downsample.0")}


def test_basic_block_downsample_runs_after_the_residual_branch():
    """The order of the calls, read from the strict export (what a reader's export shows)."""
    downsample = nn.Sequential(nn.Conv2d(4, 8, 1, 2, bias=False), nn.BatchNorm2d(8))
    block = BasicBlock(4, 8, 2, downsample).eval()
    graph = torch.export.export(block, (torch.randn(1, 4, 8, 8),), strict=True).module()
    convs = [module_of(n) for n in graph.graph.nodes if n.target == torch.ops.aten.conv2d.default]
    assert convs == ["conv1", "conv2", "downsample.0"]


def test_mobilenet_v3_batch_norm_is_torchvisions():
    norms = [m for m in MobileNetV3().modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all((m.eps, m.momentum) == (0.001, 0.01) for m in norms)


def test_efficientnet_stochastic_depth_is_torchvisions_and_the_identity_in_eval():
    model = EfficientNet()
    depths = [m.stochastic_depth for m in model.modules() if hasattr(m, "stochastic_depth")]
    # 16 MBConvs, the drop rate 0.2 * i / 16 for block i
    assert [d.p for d in depths] == pytest.approx([0.2 * i / 16 for i in range(16)])
    x = torch.randn(2, 3, 4, 4)
    assert depths[-1].eval()(x) is x
    assert not torch.equal(depths[-1].train()(torch.ones(64, 1)), torch.ones(64, 1))


def test_vit_refuses_an_image_of_another_size_by_name():
    model = get_model("vit_tiny")
    with pytest.raises(AssertionError, match="Wrong image height! Expected 64 but got 32"):
        model(torch.randn(1, 3, 32, 64))
    assert not model.class_token.any()
    assert type(model.encoder.layers[0].mlp).__name__ == "MLPBlock"
