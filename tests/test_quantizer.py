"""common.quantizer: CourseQuantizer annotates what its docstring says, and nothing else."""

import pytest
import torch
from torch import nn

from common.models import example_inputs, get_model
from common.pt2e import export_module, node_named, quiet

quiet()

from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec  # noqa: E402

from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer  # noqa: E402


def annotated(model, args=None) -> torch.fx.GraphModule:
    gm = export_module(model.eval(), args or example_inputs(2))
    assert CourseQuantizer().annotate(gm) is gm, "annotates in place"
    return gm


def annotation(gm, name):
    return node_named(gm, name).meta.get("quantization_annotation")


def test_course_quantizer_specs_are_what_the_docs_say():
    assert (ACTIVATION_SPEC.dtype, ACTIVATION_SPEC.qscheme) == (torch.int8, torch.per_tensor_affine)
    assert (WEIGHT_SPEC.qscheme, WEIGHT_SPEC.ch_axis) == (torch.per_channel_symmetric, 0)


def test_a_conv_whose_only_user_is_a_relu_is_quantized_after_the_relu():
    gm = annotated(get_model("conv_relu"))
    conv, relu = annotation(gm, "conv2d"), annotation(gm, "relu")
    x, weight = node_named(gm, "x"), node_named(gm, "conv_weight")
    assert conv.input_qspec_map == {x: ACTIVATION_SPEC, weight: WEIGHT_SPEC}, "the bias stays float"
    assert conv.output_qspec is None and relu.output_qspec is ACTIVATION_SPEC


class TwoReaders(nn.Module):
    """A conv read by a relu and by an add: nothing to fuse, the conv's output is quantized."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y.relu() + y


def test_a_conv_with_other_readers_is_quantized_right_after_it_and_the_add_stays_float():
    gm = annotated(TwoReaders())
    assert annotation(gm, "conv2d").output_qspec is ACTIVATION_SPEC
    assert annotation(gm, "relu") is None and annotation(gm, "add") is None


class PoolCat(nn.Module):
    """Pooling and cat after quantized convs share their input's qparams; after float: float."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        pooled = torch.nn.functional.max_pool2d(self.a(x), 2)
        both = torch.cat([pooled, torch.nn.functional.max_pool2d(self.b(x), 2)], dim=1)
        float_pool = torch.nn.functional.max_pool2d(x.sigmoid(), 2)
        return both, torch.cat([pooled, float_pool], dim=1)


def test_pooling_and_cat_share_their_quantized_inputs_qparams():
    gm = annotated(PoolCat())
    conv, pool = node_named(gm, "conv2d"), node_named(gm, "max_pool2d")
    assert annotation(gm, "max_pool2d").output_qspec == SharedQuantizationSpec((conv, pool))
    cat = annotation(gm, "cat")
    first, second = node_named(gm, "cat").args[0]
    shared = SharedQuantizationSpec((first, node_named(gm, "cat")))
    assert cat.input_qspec_map == {first: ACTIVATION_SPEC, second: shared}
    assert cat.output_qspec == shared
    assert annotation(gm, "max_pool2d_2") is None, "its input (a sigmoid) is float"
    assert annotation(gm, "cat_1") is None, "one of its inputs is float"


def test_a_node_already_annotated_is_left_as_it_is():
    gm = export_module(get_model("conv_relu"), example_inputs(2))
    conv = node_named(gm, "conv2d")
    conv.meta["quantization_annotation"] = mine = object()
    CourseQuantizer().annotate(gm)
    assert conv.meta["quantization_annotation"] is mine
    assert annotation(gm, "relu") is None, "the relu follows a conv the quantizer did not annotate"


@pytest.mark.parametrize("name", ["small_cnn", "conv_bn_relu"])
def test_validate_accepts_what_annotate_wrote(name):
    gm = annotated(get_model(name))
    assert CourseQuantizer().validate(gm) is None
