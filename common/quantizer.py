"""The course's own PT2E quantizer: conv and linear in int8, small enough to read in one sitting."""

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

__all__ = ["ACTIVATION_SPEC", "WEIGHT_SPEC", "CourseQuantizer"]

aten = torch.ops.aten

#: Activations: one scale and zero point per tensor, int8 over the full range [-128, 127].
ACTIVATION_SPEC = QuantizationSpec(
    dtype=torch.int8,
    quant_min=-128,
    quant_max=127,
    qscheme=torch.per_tensor_affine,
    observer_or_fake_quant_ctr=MinMaxObserver,
)

#: Weights: one scale per output channel (axis 0 of conv and linear weights), symmetric, so the
#: zero point is 0; [-127, 127] keeps the range symmetric around 0.
WEIGHT_SPEC = QuantizationSpec(
    dtype=torch.int8,
    quant_min=-127,
    quant_max=127,
    qscheme=torch.per_channel_symmetric,
    ch_axis=0,
    observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
)

_WEIGHTED_OPS = {
    aten.conv1d.default,
    aten.conv2d.default,
    aten.linear.default,
}
_RELU_OPS = {aten.relu.default, aten.relu_.default}
# Ops that only move or select values: their output can keep their input's scale and zero point.
_PASS_THROUGH_OPS = {
    aten.max_pool2d.default,
    aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    aten.flatten.using_ints,
}


def _annotate(node: Node, inputs=None, output=None) -> None:
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map=inputs or {}, output_qspec=output, _annotated=True
    )


def _output_is_quantized(node) -> bool:
    annotation = isinstance(node, Node) and node.meta.get("quantization_annotation")
    return bool(annotation) and annotation.output_qspec is not None


class CourseQuantizer(Quantizer):
    """Annotates conv/linear (+ a following relu), pooling/flatten and cat for int8.

    * conv1d, conv2d, linear: the input activation gets :data:`ACTIVATION_SPEC`, the weight
      :data:`WEIGHT_SPEC`, the bias stays float. The output is quantized after the relu when a
      relu is the only user (conv+relu run as one fused op on a backend), else right after the op.
    * max/avg pooling, adaptive avg pooling and flatten whose input is already quantized: the
      output shares the input's scale and zero point (``SharedQuantizationSpec``).
    * cat whose inputs are all quantized: every input and the output share one scale and zero point.

    Everything else stays float.
    """

    def annotate(self, model: GraphModule) -> GraphModule:
        """Write ``node.meta["quantization_annotation"]`` on the nodes the rules above cover.

        Nodes already annotated are left as they are.

        Args:
            model: an exported ``GraphModule``; ``prepare_pt2e`` calls this for you.

        Returns:
            GraphModule: the same ``model``, annotated in place.
        """
        for node in model.graph.nodes:
            if node.op != "call_function" or "quantization_annotation" in node.meta:
                continue
            if node.target in _WEIGHTED_OPS:
                self._annotate_weighted(node)
            elif node.target in _PASS_THROUGH_OPS and _output_is_quantized(node.args[0]):
                source = node.args[0]
                _annotate(
                    node,
                    inputs={source: ACTIVATION_SPEC},
                    output=SharedQuantizationSpec((source, node)),
                )
            elif node.target == aten.cat.default and all(map(_output_is_quantized, node.args[0])):
                first, *rest = node.args[0]
                shared = SharedQuantizationSpec((first, node))
                inputs = {first: ACTIVATION_SPEC} | {other: shared for other in rest}
                _annotate(node, inputs=inputs, output=shared)
        return model

    def _annotate_weighted(self, node: Node) -> None:
        x, weight = node.args[0], node.args[1]
        users = list(node.users)
        fused_relu = users[0] if len(users) == 1 and users[0].target in _RELU_OPS else None
        if fused_relu is None:
            _annotate(
                node, inputs={x: ACTIVATION_SPEC, weight: WEIGHT_SPEC}, output=ACTIVATION_SPEC
            )
        else:
            _annotate(node, inputs={x: ACTIVATION_SPEC, weight: WEIGHT_SPEC})
            _annotate(fused_relu, output=ACTIVATION_SPEC)

    def validate(self, model: GraphModule) -> None:
        """Nothing to check: every annotation above is one torchao's prepare accepts."""
