"""The ops ``coverage`` reports, by kind: data, read by the classifier and the rules."""

import torch

aten = torch.ops.aten

#: The compute ops the report covers, by kind. ``add`` and ``mul`` count only between two
#: tensors (a residual add, a squeeze-excitation scale), not with a Python number.
COMPUTE_OPS = {
    aten.conv1d.default: "conv",
    aten.conv2d.default: "conv",
    aten.conv3d.default: "conv",
    aten.convolution.default: "conv",
    aten.conv_transpose1d.default: "conv",
    aten.conv_transpose2d.input: "conv",
    aten.conv_transpose3d.input: "conv",
    aten.linear.default: "linear",
    aten.matmul.default: "matmul",
    aten.bmm.default: "matmul",
    aten.mm.default: "matmul",
    aten.addmm.default: "matmul",
    aten.baddbmm.default: "matmul",
    aten.scaled_dot_product_attention.default: "attention",
    aten.add.Tensor: "add",
    aten.add_.Tensor: "add",
    aten.mul.Tensor: "mul",
    aten.mul_.Tensor: "mul",
}


def _targets(kind: str, *names: str) -> dict:
    """``{aten.<name>: kind}`` for the overloads named ``op.overload`` that this torch has."""
    found = {}
    for name in names:
        packet, overload = name.split(".")
        target = getattr(getattr(aten, packet, None), overload, None)
        if target is not None:
            found[target] = kind
    return found


#: Every op ``coverage(..., every_op=True)`` reports, by kind: ``COMPUTE_OPS``; the ops that
#: can pass int8 values through (``pool``, ``cat``, ``pad``, ``slice``, ``layout``); ``norm``,
#: ``activation``, ``resample``, ``reduction``, ``embedding``, ``recurrent``; ``sub`` and
#: ``div`` between two tensors, and ``rsqrt`` and ``pow`` (an RMSNorm written out, as Llama
#: writes it: ``elementwise``); and the in-place writes of a KV cache (``cache update``:
#: ``index_copy_``, ``index_put_``). An eval-mode dropout, an identity, is not listed.
#:
#: ``cache update`` is a kind of its own, not a ``layout`` op: it writes its source's values
#: into a buffer that outlives the call (the cache a language model's next call reads), so the
#: dtype it writes is the cache's, kept in memory from call to call; a layout op hands its
#: input's values to the next op of the same call (and ``grouped(with_layout=False)`` would
#: leave the cache out).
OPS = {
    **COMPUTE_OPS,
    **_targets(
        "pool",
        "max_pool1d.default",
        "max_pool2d.default",
        "max_pool3d.default",
        "max_pool2d_with_indices.default",
        "avg_pool1d.default",
        "avg_pool2d.default",
        "avg_pool3d.default",
        "adaptive_avg_pool1d.default",
        "adaptive_avg_pool2d.default",
        "adaptive_avg_pool3d.default",
        "adaptive_max_pool1d.default",
        "adaptive_max_pool2d.default",
    ),
    **_targets("cat", "cat.default", "stack.default", "concat.default"),
    **_targets(
        "pad",
        "pad.default",
        "constant_pad_nd.default",
        "reflection_pad1d.default",
        "reflection_pad2d.default",
        "replication_pad1d.default",
        "replication_pad2d.default",
    ),
    **_targets(
        "slice",
        "slice.Tensor",
        "split.Tensor",
        "split_with_sizes.default",
        "chunk.default",
        "narrow.default",
        "select.int",
        "unbind.int",
    ),
    **_targets(
        "layout",
        "view.default",
        "reshape.default",
        "flatten.using_ints",
        "unflatten.int",
        "permute.default",
        "transpose.int",
        "t.default",
        "squeeze.dim",
        "squeeze.dims",
        "squeeze.default",
        "unsqueeze.default",
        "contiguous.default",
        "expand.default",
    ),
    **_targets(
        "norm",
        "layer_norm.default",
        "group_norm.default",
        "batch_norm.default",
        "_native_batch_norm_legit_no_training.default",
        "instance_norm.default",
        "rms_norm.default",
    ),
    **_targets(
        "activation",
        "relu.default",
        "relu_.default",
        "relu6.default",
        "hardtanh.default",
        "hardtanh_.default",
        "leaky_relu.default",
        "leaky_relu_.default",
        "gelu.default",
        "silu.default",
        "silu_.default",
        "mish.default",
        "hardswish.default",
        "hardswish_.default",
        "hardsigmoid.default",
        "hardsigmoid_.default",
        "sigmoid.default",
        "tanh.default",
        "elu.default",
        "prelu.default",
        "softplus.default",
        "softmax.int",
        "_softmax.default",
        "log_softmax.int",
        "clamp.default",
        "clamp_.default",
        "clamp_min.default",
    ),
    **_targets(
        "resample",
        "upsample_nearest1d.vec",
        "upsample_nearest2d.vec",
        "upsample_nearest2d.default",
        "upsample_bilinear2d.vec",
        "upsample_bilinear2d.default",
        "upsample_bicubic2d.vec",
        "pixel_shuffle.default",
        "pixel_unshuffle.default",
        "grid_sampler.default",
    ),
    **_targets(
        "reduction",
        "mean.dim",
        "mean.default",
        "sum.dim_IntList",
        "sum.default",
        "amax.default",
        "amin.default",
        "max.dim",
        "min.dim",
        "var.correction",
        "std.correction",
    ),
    **_targets("embedding", "embedding.default", "embedding_bag.default"),
    **_targets("recurrent", "lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input"),
    **_targets("elementwise", "sub.Tensor", "div.Tensor", "rsqrt.default", "pow.Tensor_Scalar"),
    **_targets(
        "cache update",
        "index_copy_.default",
        "index_copy.default",
        "index_put_.default",
        "index_put.default",
    ),
}
#: The kinds of ``OPS`` whose ops move values without arithmetic (``grouped(with_layout=False)``
#: leaves them out).
MOVING_KINDS = ("layout", "slice")
#: Ops of ``OPS`` that compute on two tensors, reported only when both operands are tensors
#: (not ``rsqrt`` and ``pow(x, 2)``: elementwise ops of one tensor).
_BINARY = {target for target, kind in OPS.items() if kind in ("add", "mul")} | {
    aten.sub.Tensor,
    aten.div.Tensor,
}
#: The kinds of ``COMPUTE_OPS``: an op of another kind is read by ``_classify_other``.
_COMPUTE_KINDS = frozenset(COMPUTE_OPS.values())


def _float_cache(node) -> str:
    """The buffer a cache update (``index_copy_``, ``index_put_``) writes, by its name, when it
    holds float values; ``""`` otherwise."""
    target = node.args[0] if node.args else None
    value = target.meta.get("val") if isinstance(target, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
        return ""
    return str(target.target) if target.op == "get_attr" else target.name
