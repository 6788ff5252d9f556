"""A partitioner written by hand: the int8 nodes XNNPACK runs, tagged for ExecuTorch (M06-2).

``CoursePartitioner`` delegates exactly the nodes that ExecuTorch's ``XnnpackPartitioner``
delegates in a graph quantized with ``XNNPACKQuantizer`` (int8 activations, static qparams),
in the same partitions, so the two programs give ``torch.equal`` outputs on the ExecuTorch
runtime (``tests/test_edge.py`` checks this model by model, ``tests/test_atlas.py`` on every
model of the op atlas). Its knowledge is two tables: :data:`SUPPORTED`, each op XNNPACK can
run, whether it has an int8 kernel, and the constraint that keeps it off XNNPACK; and
:data:`PORTABLE`, the ops XNNPACK has no config for, left to the portable kernels. An op in
neither raises ``NotImplementedError`` naming the node, so a partition never differs silently.

A conv or linear the quantizer left float (an LSTM's, a layer set to a None config) is
delegated as XNNPACK does, as a float GEMM when its weight and bias are constants.

What it refuses, loudly: a graph with no quantize/dequantize node (``XnnpackPartitioner``
also delegates float graphs), uint8 activations (``X86InductorQuantizer``'s), and dynamic
quantization.
"""

import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from executorch.backends.xnnpack.utils.quant_utils import tag_as_implicit_q_dq
from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
    generate_grouped_partitions_from_list_of_nodes,
)
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from common.lesson import lesson_language

__all__ = [
    "PORTABLE",
    "SUPPORTED",
    "CoursePartitioner",
    "LoadCheck",
    "Op",
    "OperatorsRun",
    "Refusal",
    "delegated",
    "load_check",
    "operators_run",
    "to_executorch",
    "xnnpack_quantizer",
]

# Dtypes XNNPACK takes as an op's tensors: float ones, and (q/dq nodes only) the int8 ones.
_FLOAT = (torch.float32, torch.float16)
_QUANTIZED = (*_FLOAT, torch.int8, torch.qint8, torch.quint8, torch.qint32)
Q, DQ = "quantize_per_tensor.default", "dequantize_per_tensor.default"
DQ_CHANNEL = "dequantize_per_channel.default"
GEMMS = {"convolution.default", "linear.default"}  # weight args[1], bias args[2], input args[0]
# Ops XNNPACK asks ExecuTorch to keep whole (not decomposed) that this table does not cover:
# decomposed, their pieces would be partitioned differently.
_KEPT_WHOLE_BY_XNNPACK = {"prelu.default"}
BATCH_NORM = "_native_batch_norm_legit_no_training.default"


def op_name(target) -> str:
    """``aten.relu.default`` or ``<EdgeOpOverload: aten.relu.default>`` -> ``relu.default``."""
    return ".".join(getattr(target, "__name__", str(target)).split(".")[-2:])


def _is(node, name: str) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and op_name(node.target) == name


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
    kernel, stride, _ = _pool_sizes(node)
    if len(node.args) > 5 and node.args[5] and _dynamic(node):
        return "ceil_mode on a dynamic shape (XNNPACK pads for it, statically)"
    if any(s > k for s, k in zip(stride, kernel, strict=True)):
        return f"stride {stride} larger than the kernel {kernel}"
    return None


def _avg_pool(node: Node):
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
    shape = node.args[1]
    if not all(isinstance(d, int) for d in shape) or list(shape).count(-1) > 1:
        return f"a view to {shape} (symbolic, or more than one -1)"
    return None


def _unsqueeze(node: Node):
    dim, rank = node.args[1], node.args[0].meta["val"].dim()
    if dim not in (-1, rank):
        return f"an unsqueeze at dim {dim} (only after the last of {rank} dims)"
    return None


def _same_dim_order(node: Node):
    wanted = node.kwargs.get("dim_order")
    if wanted is not None and list(node.args[0].meta["val"].dim_order()) != list(wanted):
        return "a copy that changes the dim order"
    return None


def _conv(node: Node):
    weight = node.args[1]
    if weight.meta["val"].dim() > 4:
        return "a 3-D convolution"
    transposed, groups = node.args[6], node.args[8]
    if transposed and _is(weight, DQ_CHANNEL) and (groups > 1 or weight.args[3] != 1):
        return "a transposed conv with per-channel weights on an axis other than 1, or groups"
    return None


def _gelu(node: Node):
    return "a float16 GELU" if node.meta["val"].dtype == torch.float16 else None


def _softmax(node: Node):
    dim, rank = node.args[1], node.args[0].meta["val"].dim()
    return None if dim in (-1, rank - 1) else f"a softmax over dim {dim} of {rank} (only the last)"


def _add_sub(node: Node):
    if node.kwargs.get("alpha", 1) != 1:
        return "alpha != 1"
    return None


def _cat(node: Node):
    return None if len(node.all_input_nodes) >= 2 else "a cat of fewer than 2 tensors"


def _slice(node: Node):
    step = node.args[4] if len(node.args) > 4 else 1
    if step != 1:
        return f"a slice with step {step} (only 1)"
    source = node.args[0]
    if _is(source, DQ) and len(node.users) == 1:
        (user,) = node.users
        if _is(user, Q) and tuple(source.args[1:6]) != tuple(user.args[1:6]):
            return "an int8 slice whose output scale or zero point differs from its input's"
    for value in (source.meta["val"], node.meta["val"]):
        if not all(isinstance(d, int) and d != 0 for d in value.shape):
            return f"a slice of a {tuple(value.shape)} tensor (only static, non-empty shapes)"
    return None


def _pad(node: Node):
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
        and _is(pad.args[0], DQ)
    )


def _static_shape(node: Node):
    if _dynamic(node):
        return "a dynamic output size"
    return None


def _batch_norm(node: Node):
    """XNNPACK folds it into the conv before it, or else turns it into a 1x1 depthwise conv:
    in an int8 graph the conv's output is quantized first, so only the second applies."""
    rank = node.args[0].meta["val"].dim()
    if rank not in (2, 3, 4):
        return f"a batch norm of a {rank}-D tensor (only 2-D, 3-D or 4-D)"
    if any(not (_is(user, "getitem") and user.args[1] == 0) for user in node.users):
        return "a batch norm whose mean or variance output is read"
    if not isinstance(node.args[0].meta["val"].shape[1], int):
        return "a batch norm over a dynamic number of channels"
    if isinstance(node.args[-1], Node):
        return "a computed epsilon"
    return None  # (its weight, bias, mean and variance must be constants: see _match)


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
    # a float GEMM of constant weight and bias, with its relu/hardtanh. See CoursePartitioner._gemm.
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
    # (a zero pad read by one int8 conv alone joins the conv's pattern: see _gemm)
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


def _dtypes_ok(node: Node) -> bool:
    """XNNPACK's common check: non-empty float tensors of one dtype in, float out (q/dq: int8)."""
    allowed = _QUANTIZED if op_name(node.target) in (Q, DQ, DQ_CHANNEL) else _FLOAT
    inputs = []
    for arg in node.args:  # cat's tensors come as a list
        inputs += arg if isinstance(arg, list | tuple) else [arg]
    first = None
    for arg in (a for a in inputs if isinstance(a, Node)):
        value = arg.meta.get("val")
        if value is None or isinstance(value, tuple):
            continue
        if not isinstance(value, torch.Tensor) or value.numel() == 0 or value.dtype not in allowed:
            return False
        first = first or value.dtype
        if value.dtype != first:
            return False
    outputs = node.meta.get("val")
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return all(o is None or (isinstance(o, torch.Tensor) and o.dtype in allowed) for o in outputs)


def _constants(program: ExportedProgram) -> set[str]:
    signature = program.graph_signature
    return {
        *signature.inputs_to_parameters,
        *signature.inputs_to_buffers,
        *signature.inputs_to_lifted_tensor_constants,
    }


def _unknown(node: Node) -> NotImplementedError:
    return NotImplementedError(
        f"CoursePartitioner does not know {op_name(node.target)} "
        f"(node {node.name!r}: {node.format_node()}); add it to common.edge.SUPPORTED with "
        "XNNPACK's constraint (executorch/backends/xnnpack/partition/config/), or to "
        "common.edge.PORTABLE if XNNPACK has no config for it, or use XnnpackPartitioner "
        "for this model"
    )


def _check_type(program, *, where: str) -> None:
    if isinstance(program, GraphModule):
        raise TypeError(
            f"CoursePartitioner.{where} expects an ExportedProgram, got a GraphModule; export "
            "the quantized model first: to_edge_transform_and_lower(torch.export.export(gm, "
            "example_inputs), partitioner=[CoursePartitioner()]), or "
            "common.edge.to_executorch(gm, example_inputs)"
        )
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"CoursePartitioner.{where} expects an ExportedProgram, got {type(program).__name__}"
        )


def _check_quantized(program: ExportedProgram) -> None:
    qdq = [n for n in program.graph.nodes if _is(n, Q) or _is(n, DQ) or _is(n, DQ_CHANNEL)]
    if not qdq:
        raise ValueError(
            "CoursePartitioner delegates quantized graphs, and this one has no quantize or "
            "dequantize node: quantize it first (prepare_pt2e with "
            "common.edge.xnnpack_quantizer(), calibrate, convert_pt2e), or use "
            "XnnpackPartitioner, which also delegates float graphs"
        )
    for node in qdq:
        if _is(node, Q) and node.args[5] != torch.int8:
            raise ValueError(
                f"CoursePartitioner expects int8 activations (XNNPACKQuantizer's), but node "
                f"{node.name!r} quantizes to {node.args[5]}; X86InductorQuantizer's uint8 "
                "graph is for the x86 lowering (M03): quantize with "
                "common.edge.xnnpack_quantizer() instead"
            )


class CoursePartitioner(Partitioner):
    """Tags the nodes of a quantized edge program that XNNPACK runs, as ``XnnpackPartitioner``.

    ``partition`` walks the graph once. Each node whose op is in :data:`SUPPORTED` and passes
    its constraint makes a *match*: the node, plus for an int8 pattern its dequantized inputs
    and the quantize after it (and a conv's or linear's weight and bias). Matches sharing a
    node are merged; ExecuTorch's ``GroupBasedPartitioner`` then cuts the matched nodes into
    partitions that create no cycle, each tagged for the XNNPACK backend.

    Example:
        ``to_edge_transform_and_lower(program, partitioner=[CoursePartitioner()])``
    """

    def ops_to_not_decompose(self, program):
        """The ops ExecuTorch must keep whole for XNNPACK, and the filter choosing the nodes.

        Args:
            program: the ATen-dialect ``ExportedProgram`` before decomposition.

        Returns:
            tuple: (ops, filter): the ``keep_whole`` ops of :data:`SUPPORTED` (``aten.linear``,
            ``aten.max_pool2d``, ``aten.hardswish``, ``aten.upsample_bilinear2d``), and a function
            telling for each node whether XNNPACK will take it whole (if not, it decomposes).

        Raises:
            TypeError: if ``program`` is a ``GraphModule`` (export it first).
            ValueError: if the graph is not quantized, or quantized to uint8.
            NotImplementedError: for an op XNNPACK keeps whole that this table lacks.
        """
        _check_type(program, where="ops_to_not_decompose")
        if not any(n.name.startswith("executorch_call_delegate") for n in program.graph.nodes):
            _check_quantized(program)  # (asked again after lowering, q/dq inside delegates)
        for node in program.graph.nodes:
            if node.op == "call_function" and op_name(node.target) in _KEPT_WHOLE_BY_XNNPACK:
                raise _unknown(node)
        constants = _constants(program)
        keep = [op.keep_whole for op in SUPPORTED.values() if op.keep_whole is not None]

        def keep_this_one(node: Node) -> bool:  # asked of every node: answer for ``keep``
            return node.target in keep and self._match(node, constants) is not None

        return keep, keep_this_one

    def partition(self, program):
        """Tag the nodes XNNPACK runs with ``node.meta["delegation_tag"]``.

        Args:
            program: an edge-dialect ``ExportedProgram`` of a graph quantized to int8.

        Returns:
            PartitionResult: the same program, tagged, and the tag -> ``DelegationSpec`` map.

        Raises:
            TypeError: if ``program`` is a ``GraphModule`` (export it first).
            ValueError: if the graph is not quantized, or quantized to uint8.
            NotImplementedError: naming the first node whose op is in neither
                :data:`SUPPORTED` nor :data:`PORTABLE`.
        """
        _check_type(program, where="partition")
        _check_quantized(program)
        constants = _constants(program)
        matches = []
        for node in program.graph.nodes:
            if node.op != "call_function":
                continue
            if op_name(node.target) in PORTABLE:
                continue
            if op_name(node.target) not in SUPPORTED:
                raise _unknown(node)
            match = self._match(node, constants)
            if match:
                matches.append(match)
                # XNNPACK folds a q/dq inside an int8 pattern into its int8 tensors.
                for member in match[1:]:
                    if _is(member, Q) or _is(member, DQ) or _is(member, DQ_CHANNEL):
                        tag_as_implicit_q_dq(member)
        groups = _merge(matches, constants)
        partitions = generate_grouped_partitions_from_list_of_nodes(program.graph_module, groups)
        spec = DelegationSpec(XnnpackBackend.__name__, [])
        tags = {}
        for partition in partitions:
            tag = f"tag{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = spec
        return PartitionResult(tagged_exported_program=program, partition_tags=tags)

    # --- One node's match ------------------------------------------------------------------

    def _match(self, node: Node, constants: set[str]) -> list[Node] | None:
        """The nodes XNNPACK takes with ``node`` (itself first), or None if it cannot run it."""
        op = SUPPORTED.get(op_name(node.target)) if node.op == "call_function" else None
        if op is None or not _dtypes_ok(node) or op.why_not(node) is not None:
            return None
        if op_name(node.target) in GEMMS:
            return self._gemm(node, op, constants)
        if op_name(node.target) == BATCH_NORM:
            weights = [w for w in node.args[1:5] if w is not None]
            if any(not isinstance(w, Node) or w.name not in constants for w in weights):
                return None  # XNNPACK folds constants into the conv it makes of the norm
            return [node, *weights, *node.users]
        if op_name(node.target) in (Q, DQ):
            return [node]
        return [node, *self._int8_pattern(node, op)]

    def _gemm(self, node: Node, op: Op, constants: set[str]) -> list[Node] | None:
        """dequantize(x), dequantize(int8 weight), bias -> conv/linear [-> act] -> quantize;
        or, its weight float (a layer the quantizer left float), a float GEMM."""
        x, weight, bias = (*node.args, None)[:3]
        deps = []
        if bias is not None:
            if bias.name not in constants:
                return None  # XNNPACK packs a constant bias only
            deps.append(bias)
        if not (_is(weight, DQ) or _is(weight, DQ_CHANNEL)):  # float: weight, [fused act]
            if weight.name not in constants:
                return None
            users = list(node.users)
            fused = [u for u in users if u.op == "call_function" and op_name(u.target) in op.fused]
            return [node, weight, *deps, *(fused if len(users) == 1 else [])]
        if weight.args[0].name not in constants:
            return None  # a computed weight (XNNPACK packs constants only)
        deps += [weight, *weight.all_input_nodes]  # int8 weight (and per-channel qparams)
        if (
            op_name(node.target) == "convolution.default"
            and not node.args[6]  # not transposed
            and _is(x, "constant_pad_nd.default")
            and len(x.users) == 1
            and _conv_absorbs(x)
        ):
            deps += [x, x.args[0]]  # dequantize -> pad -> conv: the pad becomes the conv's
        elif _is(x, DQ):
            deps.append(x)
        else:
            return None  # a float input
        output = self._output_quantize(node, op)
        return None if output is None else [node, *deps, *output]

    def _output_quantize(self, node: Node, op: Op) -> list[Node] | None:
        """[fused activation,] quantize after ``node``, or None if the int8 pattern ends here."""
        if len(node.users) != 1:
            return None
        (user,) = node.users
        taken = []
        if user.op == "call_function" and op_name(user.target) in op.fused:
            taken.append(user)
            if len(user.users) == 1:
                (user,) = user.users
        return [*taken, user] if _is(user, Q) else None

    def _int8_pattern(self, node: Node, op: Op) -> list[Node]:
        """The dequantized inputs and output quantize of an int8 op, or [] to run it alone."""
        if not op.int8 or not all(_is(n, DQ) for n in node.all_input_nodes):
            return []
        output = self._output_quantize(node, op)
        return [] if output is None else [*node.all_input_nodes, *output]


def _merge(matches: list[list[Node]], constants: set[str]) -> list[list[Node]]:
    """Merge matches that share a node; a constant already in a group is left out of the next
    (ExecuTorch copies a constant into every partition that reads it)."""
    parent: dict[Node, Node] = {}

    def root(node: Node) -> Node:
        while parent[node] is not node:
            node = parent[node]
        return node

    for match in matches:
        members = [n for n in match if not (n.name in constants and n in parent)]
        for node in members:
            parent.setdefault(node, node)
        for node in members[1:]:
            parent[root(members[0])] = root(node)
    groups: dict[Node, list[Node]] = {}
    for node in parent:
        groups.setdefault(root(node), []).append(node)
    return list(groups.values())


def xnnpack_quantizer(*, per_channel: bool = True):
    """``XNNPACKQuantizer`` with ExecuTorch's symmetric int8 config (static activations).

    Args:
        per_channel: one weight scale per output channel (the default) or per tensor.

    Returns:
        XNNPACKQuantizer: a quantizer to pass to ``prepare_pt2e``.
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    return XNNPACKQuantizer().set_global(config)


def to_executorch(
    model: GraphModule, example_inputs: tuple, *, partitioner=None, dynamic_shapes=None
):
    """A quantized ``GraphModule`` as an ExecuTorch program: exported, delegated, converted.

    ``torch.export.export``, then ``to_edge_transform_and_lower`` with the partitioner, then
    ``.to_executorch()``: the program a ``.pte`` file holds.

    Args:
        model: the ``GraphModule`` ``convert_pt2e`` returned.
        example_inputs: a tuple of inputs to export it with.
        partitioner: the partitioner, by default a new :class:`CoursePartitioner`.
        dynamic_shapes: the ``dynamic_shapes`` of ``torch.export.export``, as the model was
            exported with before quantizing (e.g. ``{"x": {0: Dim("batch", min=1, max=4)}}``):
            the ``.pte`` then accepts every size in the range, and its memory plan is sized
            for the largest.

    Returns:
        ExecutorchProgramManager: ``.buffer`` is the ``.pte`` file's bytes,
        ``.exported_program()`` the program with its delegates (see :func:`delegated`).
        ``to_executorch()`` rewrites that program in place (out variants, memory planning):
        read the delegated graph from it, not the ATen graph it was exported as.

    Raises:
        TypeError: if ``model`` is an ``ExportedProgram`` (pass ``program.module()``, or give
            the program to ``to_edge_transform_and_lower`` directly) or not a ``GraphModule``.
    """
    from executorch.exir import to_edge_transform_and_lower

    if isinstance(model, ExportedProgram):
        raise TypeError(
            "common.edge.to_executorch expects the GraphModule that convert_pt2e returns, got "
            "an ExportedProgram; pass program.module(), or give the program itself to "
            "to_edge_transform_and_lower(program, partitioner=[CoursePartitioner()])"
        )
    if not isinstance(model, GraphModule):
        raise TypeError(
            "common.edge.to_executorch expects the GraphModule that convert_pt2e returns, got "
            f"{type(model).__name__}"
        )
    program = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes)
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner or CoursePartitioner()])
    return edge.to_executorch()


def delegated(program: ExportedProgram) -> dict[str, list[str]]:
    """The nodes each ``lowered_module_N`` of a lowered program runs, by their names.

    Args:
        program: ``edge.exported_program()`` after ``to_edge_transform_and_lower``, or
            the ``exported_program()`` of :func:`to_executorch`'s result.

    Returns:
        dict: ``{"lowered_module_0": ["aten_convolution_default", ...], ...}``, the names of
        the call_function nodes inside each delegate, in graph order.
    """
    result = {}
    for node in program.graph.nodes:
        if node.op == "get_attr" and node.target.startswith("lowered_module_"):
            inner = getattr(program.graph_module, node.target).original_module
            result[node.target] = [n.name for n in inner.graph.nodes if n.op == "call_function"]
    return result


# --- Proof on the runtime: the operators XNNPACK ran, from an ETDump --------------------------

# XNNPACK names each operator with its layout and data types: "Convolution (NHWC, QC8) IGEMM",
# "Fully Connected (NC, QD8, F32, QC8W) GEMM". Q..8 are int8 types (QS8 static, QD8 dynamic,
# QC8/QC8W per-channel weights, QU8 unsigned), X8 moves int8 bytes; F32/F16 are float.
_INT8_TYPE = re.compile(r"^(Q[A-Z]*8[A-Z]*|X8)$")
_FLOAT_TYPE = re.compile(r"^(F16|F32|BF16|X16|X32)$")
# The runtime's own events, not operators.
_RUNTIME_EVENTS = {
    "Method::init",
    "Program::load_method",
    "Method::execute",
    "DELEGATE_CALL",
    "OPERATOR_CALL",
}


def _types(operator: str) -> list[str]:
    """``"Convolution (NHWC, QC8) IGEMM"`` -> ``["NHWC", "QC8"]``."""
    found = re.search(r"\(([^)]*)\)", operator)
    return [t.strip() for t in found[1].split(",")] if found else []


@dataclass(frozen=True)
class OperatorsRun:
    """The operators one call of a ``.pte`` ran on the ExecuTorch runtime, with counts.

    Attributes:
        xnnpack: XNNPACK's operators inside the delegates, by XNNPACK's name, which says the
            data types: ``Convolution (NHWC, QC8) IGEMM`` (int8 activations, per-channel int8
            weights), ``Fully Connected (NC, F32) GEMM`` (float).
        portable: the kernels outside any delegate (ExecuTorch's portable kernels), by the
            out variant the runtime calls, e.g. ``mean.out``.
    """

    xnnpack: Counter
    portable: Counter = field(default_factory=Counter)

    @property
    def int8(self) -> Counter:
        """XNNPACK's operators on int8 data (a type ``QS8``, ``QC8``, ``QD8``..., or ``X8``)."""
        return Counter(
            {op: n for op, n in self.xnnpack.items() if any(map(_INT8_TYPE.match, _types(op)))}
        )

    @property
    def float_only(self) -> Counter:
        """XNNPACK's operators on float data only (``F32``, ``F16``)."""
        return Counter(
            {
                op: n
                for op, n in self.xnnpack.items()
                if op not in self.int8 and any(map(_FLOAT_TYPE.match, _types(op)))
            }
        )

    @property
    def summary(self) -> str:
        """One line per kind, in the language of the lesson that asks (``lesson_language()``)."""
        return self.summary_in(lesson_language())

    def summary_in(self, lang: str) -> str:
        """``summary`` in ``lang``, ``"en"`` or ``"zh_TW"``.

        >>> run = OperatorsRun(Counter({"Convolution (NHWC, QC8) IGEMM": 2}))
        >>> print(run.summary_in("en"))
        XNNPACK int8: Convolution (NHWC, QC8) IGEMM ×2
        XNNPACK float: none
        portable: none
        """
        none = "無" if lang == "zh_TW" else "none"
        # zh: the glossary's 「kernel」 (核心 is a CPU core) and a full-width colon after it
        portable = "portable kernel：" if lang == "zh_TW" else "portable: "

        def listed(ops: Counter) -> str:
            return ", ".join(f"{op} ×{n}" for op, n in sorted(ops.items())) or none

        return (
            f"XNNPACK int8: {listed(self.int8)}\nXNNPACK float: {listed(self.float_only)}\n"
            f"{portable}{listed(self.portable)}"
        )


@contextlib.contextmanager
def _runtime_log_silenced():
    """The runtime's log (the ``[cpuinfo_utils.cpp:...]`` lines on first use, a delegate's
    errors) goes through Python's stderr or straight to file descriptor 2: drop both."""
    from common.kernels import native_stderr_silenced

    with contextlib.redirect_stderr(io.StringIO()), native_stderr_silenced():
        yield


def operators_run(pte: bytes, inputs, *, method: str = "forward") -> OperatorsRun:
    """Run ``pte`` once on the ExecuTorch runtime with an ETDump; return the operators it ran.

    The runtime on PyPI records a profiling event per XNNPACK operator it runs inside a
    delegate (and per portable kernel), named as XNNPACK names them, with their data types.
    A delegate that XNNPACK ran in float shows ``F32`` operators; an int8 one ``QS8``/``QC8``.

    Args:
        pte: the ``.pte`` file's bytes (``to_executorch(...).buffer``).
        inputs: the method's inputs, a list or tuple of tensors.
        method: the method to run.

    Returns:
        OperatorsRun: XNNPACK's operators and the portable kernels of that one call.

    Raises:
        TypeError: if ``pte`` is not bytes (pass ``program.buffer``).
    """
    from executorch.runtime import Runtime

    with warnings.catch_warnings():  # its schema is read with a deprecated importlib call
        warnings.filterwarnings("ignore", message="read_binary is deprecated")
        from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    if not isinstance(pte, bytes | bytearray):
        raise TypeError(
            f"operators_run expects the .pte file's bytes, got {type(pte).__name__}; pass "
            "program.buffer (or Path(file).read_bytes())"
        )
    with tempfile.TemporaryDirectory() as folder, _runtime_log_silenced():
        program = Runtime.get().load_program(bytes(pte), enable_etdump=True)
        program.load_method(method).execute(list(inputs))  # ``program`` outlives the method
        dump = Path(folder) / "run.etdp"
        program.write_etdump_result_to_file(str(dump), str(Path(folder) / "run.bin"))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="read_binary is deprecated")
            etdump = deserialize_from_etdump_flatcc(dump.read_bytes())
    xnnpack, portable = Counter(), Counter()
    for block in etdump.run_data:
        for event in block.events:
            profiled = event.profile_event
            if profiled is None:
                continue
            if profiled.delegate_debug_id_str:  # e.g. "Convolution (NHWC, QC8) IGEMM #1"
                xnnpack[re.sub(r" #\d+$", "", profiled.delegate_debug_id_str)] += 1
            elif profiled.name and profiled.name not in _RUNTIME_EVENTS:
                portable[profiled.name.removeprefix("native_call_")] += 1  # "mean.out"
    return OperatorsRun(xnnpack=xnnpack, portable=portable)


# --- Will it load? -----------------------------------------------------------------------------

_LOADER = """
import json, sys
from executorch.runtime import Runtime
program = Runtime.get().load_program(open(sys.argv[1], "rb").read())
errors = {}
for name in program.method_names:
    try:
        program.load_method(name)
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
print(json.dumps(errors))
"""
# XNNPACK's compiler names the node it could not build by the graph node's debug handle.
_XNNPACK_NODE = re.compile(r"\[XNNCompiler\.cpp:\d+\] (?P<text>.*\bnode (?P<handle>\d+)\b.*)")


@dataclass(frozen=True)
class Refusal:
    """One node of a delegate that XNNPACK refused to build when the method loaded.

    Attributes:
        delegate: the delegate, ``lowered_module_N`` (see :func:`delegated`).
        node: the node's name in that delegate's graph, e.g. ``aten_permute_copy_default``.
        op: its op, e.g. ``permute_copy.default``.
        xnnpack: XNNPACK's message, e.g. ``Failed to create static transpose node 6 with
            code: xnn_status_invalid_parameter``.
    """

    delegate: str
    node: str
    op: str
    xnnpack: str


@dataclass(frozen=True)
class LoadCheck:
    """Whether a program's methods load on the ExecuTorch runtime, and if not, why.

    Attributes:
        loads: every method loaded.
        errors: the error each method that failed raised, by method name.
        refused: the delegated nodes XNNPACK refused, named in the graph.
        log: the runtime's log of the loads (without its CPU-info lines).
    """

    loads: bool
    errors: dict
    refused: tuple[Refusal, ...]
    log: str

    def __str__(self) -> str:
        if self.loads:
            return "loads"
        lines = [f"{name}: {error}" for name, error in self.errors.items()]
        lines += [f"{r.delegate}: {r.node} ({r.op}): {r.xnnpack}" for r in self.refused]
        return "\n".join(lines)


def load_check(program, *, timeout: float = 120) -> LoadCheck:
    """Load every method of a lowered program on the ExecuTorch runtime, in a child process,
    and name the delegated node XNNPACK refuses, if any.

    A delegate is compiled by its backend when the method loads, not when the program is
    lowered: a program can lower, save and then fail with ``Failed to load method forward``.
    The runtime's log says which XNNPACK node failed, by its debug handle; this finds that
    node in the delegate's graph. The load runs in a child process, so that a backend that
    crashes takes only the child with it.

    Args:
        program: what :func:`to_executorch` (or ``edge.to_executorch()``) returned.
        timeout: seconds the child may take.

    Returns:
        LoadCheck: ``loads``, each method's error, the refused nodes and the runtime's log.

    Raises:
        TypeError: if ``program`` is not an ``ExecutorchProgramManager`` (call
            ``.to_executorch()`` on the result of ``to_edge_transform_and_lower`` first).
    """
    if not (hasattr(program, "buffer") and hasattr(program, "exported_program")):
        raise TypeError(
            "load_check expects the program to_executorch() returns (an "
            f"ExecutorchProgramManager), got {type(program).__name__}; call .to_executorch() "
            "on the result of to_edge_transform_and_lower first"
        )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "program.pte"
        path.write_bytes(program.buffer)
        child = subprocess.run(
            [sys.executable, "-c", _LOADER, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    log = "\n".join(line for line in child.stderr.splitlines() if "cpuinfo" not in line)
    if child.returncode != 0:
        last = (log.strip().splitlines() or [f"return code {child.returncode}"])[-1]
        errors = {"(process)": f"the loading process died: {last}"}
    else:
        errors = json.loads(child.stdout.strip().splitlines()[-1])
    by_handle: dict[int, list[tuple[str, Node]]] = {}
    exported = program.exported_program()
    for node in exported.graph.nodes:
        if node.op == "get_attr" and node.target.startswith("lowered_module_"):
            inner = getattr(exported.graph_module, node.target).original_module
            for member in inner.graph.nodes:
                if member.op == "call_function" and "debug_handle" in member.meta:
                    by_handle.setdefault(member.meta["debug_handle"], []).append(
                        (node.target, member)
                    )
    refused = []
    for line in log.splitlines():
        found = _XNNPACK_NODE.search(line)
        if not found:
            continue
        candidates = by_handle.get(int(found["handle"]), [])
        # q/dq nodes share their op's handle: name the op they surround
        ops = [c for c in candidates if "quantized_decomposed" not in str(c[1].target)]
        for delegate, member in ops or candidates:
            refused.append(Refusal(delegate, member.name, op_name(member.target), found["text"]))
    return LoadCheck(loads=not errors, errors=errors, refused=tuple(refused), log=log)
