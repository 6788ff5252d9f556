"""ExecuTorch's lowering: ``CoursePartitioner`` written by hand (M06-2), ``to_executorch``.

``CoursePartitioner`` delegates exactly the nodes that ExecuTorch's ``XnnpackPartitioner``
delegates in a graph quantized with ``XNNPACKQuantizer`` (int8 activations, static qparams),
in the same partitions, so the two programs give ``torch.equal`` outputs on the ExecuTorch
runtime (``tests/test_edge.py`` checks this model by model, ``tests/test_atlas.py`` on every
model of the op atlas). Its knowledge is the table of ``common.backends.xnnpack.table``:
:data:`SUPPORTED`, each op XNNPACK can run, whether it has an int8 kernel, and the constraint
that keeps it off XNNPACK; and :data:`PORTABLE`, the ops XNNPACK has no config for, left to
the portable kernels. An op in neither raises ``NotImplementedError`` naming the node, so a
partition never differs silently.

A conv or linear the quantizer left float (an LSTM's, a layer set to a None config) is
delegated as XNNPACK does, as a float GEMM when its weight and bias are constants.

What it refuses, loudly: a graph with no quantize/dequantize node (``XnnpackPartitioner``
also delegates float graphs), uint8 activations (``X86InductorQuantizer``'s), and dynamic
quantization.

Around it: ``xnnpack_quantizer`` (the quantizer it expects), ``to_executorch`` (export, lower,
convert) and ``delegated`` (the nodes each delegate runs). What a ``.pte`` does when it runs
is ``common.runtime``'s.
"""

import operator

import torch
from executorch.backends.xnnpack.utils.quant_utils import tag_as_implicit_q_dq
from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
    generate_grouped_partitions_from_list_of_nodes,
)
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from common.backends.xnnpack.table import (
    _KEPT_WHOLE_BY_XNNPACK,
    BATCH_NORM,
    DQ,
    DQ_CHANNEL,
    GEMMS,
    PORTABLE,
    SUPPORTED,
    Op,
    Q,
    _conv_absorbs,
)
from common.graph import calls_overload, op_name

__all__ = [
    "PORTABLE",
    "SUPPORTED",
    "CoursePartitioner",
    "Op",
    "delegated",
    "left_outside",
    "to_executorch",
    "xnnpack_quantizer",
]

# Dtypes XNNPACK takes as an op's tensors: float ones, and (q/dq nodes only) the int8 ones.
_FLOAT = (torch.float32, torch.float16)
_QUANTIZED = (*_FLOAT, torch.int8, torch.qint8, torch.quint8, torch.qint32)


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
        f"(node {node.name!r}: {node.format_node()}); add it to SUPPORTED in "
        "common/backends/xnnpack/table.py with XNNPACK's constraint "
        "(executorch/backends/xnnpack/partition/config/), or to PORTABLE there if XNNPACK "
        "has no config for it, or use XnnpackPartitioner for this model"
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
    qdq = [
        n
        for n in program.graph.nodes
        if calls_overload(n, Q) or calls_overload(n, DQ) or calls_overload(n, DQ_CHANNEL)
    ]
    if not qdq:
        raise ValueError(
            "CoursePartitioner delegates quantized graphs, and this one has no quantize or "
            "dequantize node: quantize it first (prepare_pt2e with "
            "common.edge.xnnpack_quantizer(), calibrate, convert_pt2e), or use "
            "XnnpackPartitioner, which also delegates float graphs"
        )
    for node in qdq:
        if calls_overload(node, Q) and node.args[5] != torch.int8:
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
                    if (
                        calls_overload(member, Q)
                        or calls_overload(member, DQ)
                        or calls_overload(member, DQ_CHANNEL)
                    ):
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
        if not (
            calls_overload(weight, DQ) or calls_overload(weight, DQ_CHANNEL)
        ):  # float: weight, [fused act]
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
            and calls_overload(x, "constant_pad_nd.default")
            and len(x.users) == 1
            and _conv_absorbs(x)
        ):
            deps += [x, x.args[0]]  # dequantize -> pad -> conv: the pad becomes the conv's
        elif calls_overload(x, DQ):
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
        return [*taken, user] if calls_overload(user, Q) else None

    def _int8_pattern(self, node: Node, op: Op) -> list[Node]:
        """The dequantized inputs and output quantize of an int8 op, or [] to run it alone."""
        if not op.int8 or not all(calls_overload(n, DQ) for n in node.all_input_nodes):
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


def left_outside(program: ExportedProgram) -> dict[str, str]:
    """Each op a lowered program runs outside its delegates, with why XNNPACK did not take it.

    The reason is the course's table of XNNPACK's partitioner
    (``common/backends/xnnpack/table.py``): the constraint of the op's config that the node
    fails (``SUPPORTED[op].why_not``), the words of ``PORTABLE`` for an op XNNPACK has no config
    for, the dtype check every config runs, or, for an op XNNPACK takes that was left at a
    delegate's edge (a lone quantize after a float op, say), that it is one.

    Args:
        program: ``edge.exported_program()`` after ``to_edge_transform_and_lower``, or the
            ``exported_program()`` of :func:`to_executorch`'s result.

    Returns:
        dict: ``{node name: "<op>: <reason>"}``, in graph order; empty when every op is
        delegated.
    """
    found = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        name = op_name(node.target)
        if name.startswith("executorch_call_delegate"):
            continue
        rule = SUPPORTED.get(name)
        if rule is None:
            reason = PORTABLE.get(name, "XNNPACK's partitioner has no config for it")
        elif not _dtypes_ok(node):
            reason = "its tensors are not float of one dtype (the check every XNNPACK config runs)"
        else:
            reason = rule.why_not(node) or (
                "XNNPACK takes this op, but not alone here: left at a delegate's edge"
            )
        found[node.name] = f"{name}: {reason}"
    return found
