"""The ops XNNPACK takes, each with its constraint: :data:`SUPPORTED` and :data:`PORTABLE`.

The one answer to "does XNNPACK take op X", read by ``common.edge.CoursePartitioner`` (M06-2).
:data:`SUPPORTED` holds each op XNNPACK can run, whether it has an int8 kernel, and the
constraint that keeps a node of it off XNNPACK; :data:`PORTABLE` the ops XNNPACK has no config
for, left to ExecuTorch's portable kernels. Each constraint follows one of ExecuTorch's
configs (``executorch/backends/xnnpack/partition/config/``), whose words its docstring quotes.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node

from common.graph import calls_overload, op_name

__all__ = [
    "BATCH_NORM",
    "DQ",
    "DQ_CHANNEL",
    "GEMMS",
    "PORTABLE",
    "SUPPORTED",
    "Op",
    "Q",
    "op_name",
]

Q, DQ = "quantize_per_tensor.default", "dequantize_per_tensor.default"
DQ_CHANNEL = "dequantize_per_channel.default"
GEMMS = {"convolution.default", "linear.default"}  # weight args[1], bias args[2], input args[0]
# Ops XNNPACK asks ExecuTorch to keep whole (not decomposed) that this table does not cover:
# decomposed, their pieces would be partitioned differently.
_KEPT_WHOLE_BY_XNNPACK = {"prelu.default"}
BATCH_NORM = "_native_batch_norm_legit_no_training.default"


# --- Constraints: each returns why XNNPACK cannot run the node, or None when it can ----------


def _pool_sizes(node: Node):
    kernel = list(node.args[1]) * (2 if len(node.args[1]) == 1 else 1)
    stride = node.args[2] if len(node.args) > 2 and node.args[2] else kernel
    stride = list(stride) * (2 if len(stride) == 1 else 1)
    padding = node.args[3] if len(node.args) > 3 else [0, 0]
    return kernel, stride, [padding] * 2 if isinstance(padding, int) else list(padding)


def _dynamic(node: Node) -> bool:
    return not all(isinstance(d, int) for d in node.meta["val"].shape)


def _max_pool(node: Node):
    """MaxPool2dConfig: "XNNPACK's maxpool2d does not support ceil mode and requires stride <=
    kernel_size" (ceil mode: on a dynamic shape only)."""
    kernel, stride, _ = _pool_sizes(node)
    if len(node.args) > 5 and node.args[5] and _dynamic(node):
        return "ceil_mode on a dynamic shape (XNNPACK pads for it, statically)"
    if any(s > k for s, k in zip(stride, kernel, strict=True)):
        return f"stride {stride} larger than the kernel {kernel}"
    return None


def _avg_pool(node: Node):
    """AvgPoolingConfig: "XNNPACK does not support ceil_mode = True, or count_include_pad = True
    when the node has non-zero padding. Additionally, we only support divisor_override if
    divisor_override = pooling region"."""
    kernel, _, padding = _pool_sizes(node)
    args = (*node.args, *[None] * 7)[:7]
    if args[4]:
        return "ceil_mode"
    if args[5] is not False and any(padding):
        return "padding counted in the average"
    if args[6] is not None and args[6] != kernel[0] * kernel[1]:
        return "a divisor_override"
    return None


def _mean(node: Node):
    """MeanDimConfig: "Mean Dim currently only supports averaging 4D tensors across the innermost
    dimensions" (with keepdim, and no dtype)."""
    rank = node.args[0].meta["val"].dim()
    dims = sorted(d % rank for d in node.args[1])
    keepdim = len(node.args) > 2 and node.args[2]
    if rank != 4 or dims != [2, 3]:
        return f"a mean over dims {node.args[1]} of a {rank}-D tensor (only H and W of 4-D)"
    if not keepdim:
        return "a mean without keepdim=True (XNNPACK's global average pool keeps H and W as 1)"
    if node.kwargs.get("dtype") is not None:
        return "a mean with a dtype"
    return None


def _view(node: Node):
    """ViewCopyConfig: "XNNPACK's static_reshape only supports 1 dynamic dimension"."""
    shape = node.args[1]
    if not all(isinstance(d, int) for d in shape) or list(shape).count(-1) > 1:
        return f"a view to {shape} (symbolic, or more than one -1)"
    return None


def _unsqueeze(node: Node):
    """UnsqueezeCopyConfig: "unsqueeze_copy only supported on the trailing dimension"."""
    dim, rank = node.args[1], node.args[0].meta["val"].dim()
    if dim not in (-1, rank):
        return f"an unsqueeze at dim {dim} (only after the last of {rank} dims)"
    return None


def _same_dim_order(node: Node):
    """CloneDimOrderConfig: "Only dim-order preserving clones are supported"."""
    wanted = node.kwargs.get("dim_order")
    if wanted is not None and list(node.args[0].meta["val"].dim_order()) != list(wanted):
        return "a copy that changes the dim order"
    return None


def _conv(node: Node):
    """ConvolutionConfig: "Currently we have no support for convolution 3d", nor for a transposed
    conv with per-channel weights quantized on an axis other than 1, or with groups."""
    weight = node.args[1]
    if weight.meta["val"].dim() > 4:
        return "a 3-D convolution"
    transposed, groups = node.args[6], node.args[8]
    if transposed and calls_overload(weight, DQ_CHANNEL) and (groups > 1 or weight.args[3] != 1):
        return "a transposed conv with per-channel weights on an axis other than 1, or groups"
    return None


def _gelu(node: Node):
    """GeluConfig: "GELU does not support fp16"."""
    return "a float16 GELU" if node.meta["val"].dtype == torch.float16 else None


def _pow(node: Node):
    """PowConfig: "Only support powers of two" (an int power, and that power 2: a square)."""
    power = node.args[1]
    if not isinstance(power, int) or power != 2:
        return f"a power of {power} (only x ** 2)"
    return None


def _softmax(node: Node):
    """SoftmaxConfig: "Check that dim is always the last dim"."""
    dim, rank = node.args[1], node.args[0].meta["val"].dim()
    return None if dim in (-1, rank - 1) else f"a softmax over dim {dim} of {rank} (only the last)"


def _add_sub(node: Node):
    """AddConfig: "Add node doesn't support alpha != 1" (and sub's alike)."""
    if node.kwargs.get("alpha", 1) != 1:
        return "alpha != 1"
    return None


def _cat(node: Node):
    """CatConfig: "only support concatenation of > 2 tensors" (2 or more, as it counts)."""
    return None if len(node.all_input_nodes) >= 2 else "a cat of fewer than 2 tensors"


def _slice(node: Node):
    """SliceCopyConfig: "Support slicing with stride = 1, no zero-dim tensors, Slice isn't supported
    if the input or output is dynamic"; an int8 slice keeps its input's scale and zero point."""
    step = node.args[4] if len(node.args) > 4 else 1
    if step != 1:
        return f"a slice with step {step} (only 1)"
    source = node.args[0]
    if calls_overload(source, DQ) and len(node.users) == 1:
        (user,) = node.users
        if calls_overload(user, Q) and tuple(source.args[1:6]) != tuple(user.args[1:6]):
            return "an int8 slice whose output scale or zero point differs from its input's"
    for value in (source.meta["val"], node.meta["val"]):
        if not all(isinstance(d, int) and d != 0 for d in value.shape):
            return f"a slice of a {tuple(value.shape)} tensor (only static, non-empty shapes)"
    return None


def _pad(node: Node):
    """ConstantPadConfig: "XNNPACK does not support cropping with negative padding sizes"."""
    if any(p < 0 for p in node.args[1]):
        return f"a pad by {node.args[1]} (a negative pad crops: XNNPACK only pads)"
    return None


def _conv_absorbs(pad: Node) -> bool:
    """XNNPACK folds a zero pad of the spatial dims that only this int8 conv reads into the
    conv's own padding (ConvolutionConfig._get_act_deps)."""
    amounts = pad.args[1]
    value = pad.args[2] if len(pad.args) > 2 else 0.0
    (conv,) = pad.users
    spatial = 2 * (conv.args[1].meta["val"].dim() - 2)  # 2 amounts per spatial dim
    return (
        value == 0.0
        and all(a >= 0 for a in amounts)
        and all(a == 0 for a in amounts[spatial:])
        and spatial in (2, 4)
        and calls_overload(pad.args[0], DQ)
    )


def _static_shape(node: Node):
    """UpsampleBilinear2dConfig: "XNNPACK's static_resize_bilinear does not support dynamic
    output sizes"."""
    if _dynamic(node):
        return "a dynamic output size"
    return None


def _batch_norm(node: Node):
    """XNNPACK folds it into the conv before it, or else turns it into a 1x1 depthwise conv:
    in an int8 graph the conv's output is quantized first, so only the second applies."""
    rank = node.args[0].meta["val"].dim()
    if rank not in (2, 3, 4):
        return f"a batch norm of a {rank}-D tensor (only 2-D, 3-D or 4-D)"
    if any(not (calls_overload(user, "getitem") and user.args[1] == 0) for user in node.users):
        return "a batch norm whose mean or variance output is read"
    if not isinstance(node.args[0].meta["val"].shape[1], int):
        return "a batch norm over a dynamic number of channels"
    if isinstance(node.args[-1], Node):
        return "a computed epsilon"
    return None  # (its weight, bias, mean and variance must be constants: CoursePartitioner._match)


@dataclass(frozen=True)
class Op:
    """What XNNPACK does with one op.

    Attributes:
        int8: XNNPACK has an int8 kernel for it: when every input comes from a dequantize
            and its one user is a quantize (through ``fused``), those join its partition and
            XNNPACK folds them into int8 tensors. Without one it runs the op in float.
        why_not: the constraint: a function of the node returning why XNNPACK cannot run it,
            or None when it can.
        fused: the activation XNNPACK fuses into it (between the op and its quantize).
        keep_whole: ExecuTorch must not decompose it (``ops_to_not_decompose``).
    """

    int8: bool
    why_not: Callable[[Node], str | None] = lambda node: None
    fused: tuple[str, ...] = ()
    keep_whole: object = None


aten = torch.ops.aten
_ACTIVATIONS = ("relu.default", "hardtanh.default")

#: Every op this partitioner knows, by name without namespace (as in the edge graph).
SUPPORTED: dict[str, Op] = {
    # Standalone quantize/dequantize: XNNPACK converts float <-> int8 itself.
    Q: Op(int8=True),
    DQ: Op(int8=True),
    # conv and linear: dequantize(input), dequantize(int8 weight), float bias, optional
    # relu/hardtanh, then a quantize: one int8 GEMM (dequantize -> zero pad -> conv: the pad
    # joins the conv, as its padding). With a float weight (a layer the quantizer left float):
    # a float GEMM of constant weight and bias, with its relu/hardtanh. See
    # common.edge.CoursePartitioner._gemm.
    "convolution.default": Op(int8=True, why_not=_conv, fused=_ACTIVATIONS),
    "linear.default": Op(int8=True, fused=_ACTIVATIONS, keep_whole=aten.linear.default),
    "add.Tensor": Op(int8=True, why_not=_add_sub, fused=("relu.default",)),
    "sub.Tensor": Op(int8=True, why_not=_add_sub),
    "mul.Tensor": Op(int8=True),
    "relu.default": Op(int8=True),
    "hardtanh.default": Op(int8=True),
    "clamp.default": Op(int8=True),
    "cat.default": Op(int8=True, why_not=_cat),
    "slice_copy.Tensor": Op(int8=True, why_not=_slice),
    "max_pool2d.default": Op(int8=True, why_not=_max_pool, keep_whole=aten.max_pool2d.default),
    "mean.dim": Op(int8=True, why_not=_mean),
    "view_copy.default": Op(int8=True, why_not=_view),
    "permute_copy.default": Op(int8=True),
    "unsqueeze_copy.default": Op(int8=True, why_not=_unsqueeze),
    "_to_dim_order_copy.default": Op(
        int8=True,
        why_not=lambda n: (
            "a dtype conversion" if n.args[0].meta["val"].dtype != n.meta["val"].dtype else None
        ),
    ),
    # Float kernels only: in a quantized graph they run in float between a dequantize and a
    # quantize, each a partition member of its own.
    "avg_pool2d.default": Op(int8=False, why_not=_avg_pool),
    "_clone_dim_order.default": Op(int8=False, why_not=_same_dim_order),
    "sigmoid.default": Op(int8=False),
    "tanh.default": Op(int8=False),
    "div.Tensor": Op(int8=False),
    "hardswish.default": Op(int8=False, keep_whole=aten.hardswish.default),
    "gelu.default": Op(int8=False, why_not=_gelu),
    "_softmax.default": Op(int8=False, why_not=_softmax),
    "bmm.default": Op(int8=False),
    "leaky_relu.default": Op(int8=False),
    "exp.default": Op(int8=False),
    # An RMSNorm as Llama writes it, x * rsqrt(mean(x ** 2) + eps) * weight: its square and
    # its reciprocal square root (its mean: MeanDimConfig, above).
    "pow.Tensor_Scalar": Op(int8=False, why_not=_pow),
    "rsqrt.default": Op(int8=False),
    # (a zero pad read by one int8 conv alone joins the conv's pattern: see CoursePartitioner._gemm)
    "constant_pad_nd.default": Op(int8=False, why_not=_pad),
    "upsample_bilinear2d.vec": Op(
        int8=False, why_not=_static_shape, keep_whole=aten.upsample_bilinear2d.vec
    ),
    # With its weight, bias, running mean and variance (constants) and its getitem users.
    BATCH_NORM: Op(int8=False, why_not=_batch_norm),
    # Not an op XNNPACK runs alone: only inside a conv or linear, as its weight.
    DQ_CHANNEL: Op(int8=False, why_not=lambda node: "a per-channel dequantize outside a GEMM"),
}


#: Ops this partitioner knows XNNPACK does not run: they stay on ExecuTorch's portable kernels.
PORTABLE: dict[str, str] = {
    "mean.default": "XNNPACK has no config for a mean over all elements",
    "_adaptive_avg_pool2d.default": "XNNPACK has no config for adaptive average pooling",
    "max_pool2d_with_indices.default": "the max pool XNNPACK refused, decomposed (with indices)",
    "split_with_sizes_copy.default": "XNNPACK has no config for split (nor chunk)",
    "native_layer_norm.default": "XNNPACK has no config for layer norm",
    "select_copy.int": "XNNPACK has no config for select (x[:, 0])",
    "squeeze_copy.dims": "XNNPACK has no config for squeeze",
    "expand_copy.default": "XNNPACK has no config for expand",
    "mul.Scalar": "XNNPACK's mul config is for mul.Tensor only",
    "sum.dim_IntList": "XNNPACK has no config for sum",
    "embedding.default": "XNNPACK has no config for embedding (a gather)",
    # A KV cache's in-place write (index_copy_, index_put_), functionalized in the edge graph:
    "index_put.default": "XNNPACK has no config for index_put (a KV cache's write)",
    "native_group_norm.default": "XNNPACK has no config for group norm",
    "upsample_nearest2d.vec": "XNNPACK's only resize config is bilinear",
    # Softplus (in mish) is where(x > 20, x, log1p(exp(x))):
    "gt.Scalar": "XNNPACK has no config for comparisons",
    "log1p.default": "XNNPACK has no config for log1p (its log config is log.default)",
    # A recurrent layer's initial state, zeros:
    "full.default": "XNNPACK has no config for full",
    # Decomposed attention zeroes the rows whose scores are all -inf, with these:
    "eq.Scalar": "XNNPACK has no config for comparisons",
    "any.dim": "XNNPACK has no config for any",
    "logical_not.default": "XNNPACK has no config for logical ops",
    "full_like.default": "XNNPACK has no config for full_like",
    "where.self": "XNNPACK has no config for where",
    "getitem": "reads one output of a multi-output op; XNNPACK takes only a batch norm's",
}
