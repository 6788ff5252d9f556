"""Lowering written by hand: the q/dq graph becomes oneDNN int8 ops, as torchao lowers it.

``lower(model, example_inputs)`` has the contract of torchao's
``lower_pt2e_quantized_to_x86`` and gives the same graph: the same multiset of ops, the same
constants, ``torch.equal`` outputs (the tests check this model by model). torchao gets there
with inductor's pattern matcher (``freezing_passes``); here every rewrite is one of the graph
edits of M00-4. A graph with a pattern torchao would rewrite and this module does not raises
``NotImplementedError`` naming the node, so a difference is never silent.

The steps, in the order :func:`lower` runs them:

* :func:`reexport` -- torchao's first step, kept as is: a strict re-export with the
  decompositions of composite ops (``linear`` becomes ``permute`` + ``addmm``).
* :func:`fold_constants` -- inductor's constant folding: an op that reads constants only (a
  transformer's class token expanded to the batch, a float linear's transposed weight) runs
  once and becomes a constant.
* :func:`promote_dequantize` -- an activation ``dequantize`` read by several ops is copied,
  one per reader, so each op can absorb its own.
* :func:`prepack_conv`, :func:`prepack_linear` -- ``dequantize -> conv/linear`` with a
  dequantized int8 weight becomes one ``onednn.qconv_pointwise`` / ``qlinear_pointwise`` that
  reads the uint8 activation and a prepacked weight. With dynamic quantization the
  activation's scale and zero point are tensors computed in the graph (``choose_qparams``):
  the op is then the ``.tensor`` overload of ``qlinear_pointwise``.
* :func:`pack_float_linear` -- a linear left in float (a constant weight) runs on MKL's
  ``_mkl_linear`` with a packed copy of its weight, as inductor packs it.
* :func:`fuse_post_ops` -- a following ``relu``, ``add`` and ``quantize`` go into that op.
* :func:`fold_prepacked_weights` -- inductor's constant folding once more: the prepack calls
  run once; their results are constants.
* :func:`reshape_views` -- not part of torchao's lowering: the fix that lets a lowered graph
  with ``flatten`` after an int8 conv run (M03-1).

What stays as it was, in both lowerings: every linear over a 3-D input. The re-export writes
it ``view -> addmm -> view`` (contiguous input) or ``expand -> view -> bmm`` (a transposed
input, as in ``nn.MultiheadAttention``), where torchao's patterns expect a ``reshape`` or no
view at all; its q/dq nodes stay (M05-1 shows ``torch.compile`` lowering them).
"""

from functools import reduce

import torch
from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401
from torch.fx import GraphModule, Node

from common.pt2e import remove_unused_constants, replace_with_constant

__all__ = [
    "fold_constants",
    "fold_prepacked_weights",
    "fuse_post_ops",
    "lower",
    "pack_float_linear",
    "prepack_conv",
    "prepack_linear",
    "promote_dequantize",
    "reexport",
    "reshape_views",
]

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
onednn = torch.ops.onednn

DQ = qd.dequantize_per_tensor.default
DQ_TENSOR = qd.dequantize_per_tensor.tensor  # dynamic quantization: scale, zero point as nodes
DQ_CHANNEL = qd.dequantize_per_channel.default
Q = qd.quantize_per_tensor.default
QCONV = onednn.qconv_pointwise.default
QCONV_ADD = onednn.qconv2d_pointwise.binary
QLINEAR = onednn.qlinear_pointwise.default
QLINEAR_TENSOR = onednn.qlinear_pointwise.tensor
PREPACK = (onednn.qconv_prepack.default, onednn.qlinear_prepack.default)
# Inductor writes these two as packets (``torch.ops.mkl._mkl_linear``), not ``.default``.
MKL_LINEAR = torch.ops.mkl._mkl_linear
MKL_PACK = torch.ops.mkl._mkl_reorder_linear_weight
# A fresh int8 op: float32 output (scale 1, zero point 0), no post-op yet.
_FLOAT_OUTPUT = (1.0, 0, torch.float32, "none", [], "")
# Inductor never folds a dequantize: its patterns need them (an int8 weight stays int8 until
# prepacking).
_NEVER_FOLDED = {DQ, DQ_TENSOR, DQ_CHANNEL}
# Ops this module refuses: torchao rewrites them in ways not reproduced here.
_REFUSED = {
    qd.dequantize_per_tensor.tensor2: "dequantize with tensor qparams and bounds (tensor2)",
    torch.ops.prims.convert_element_type.default: "dtype conversions (int8-mixed-bf16)",
}


def _unsupported(node: Node, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"common.lowering does not handle {what} (node {node.name!r}: {node.format_node()}); "
        "use torchao's lower_pt2e_quantized_to_x86 for this model"
    )


def _fetch(model: GraphModule, node):
    return reduce(getattr, node.target.split("."), model) if isinstance(node, Node) else node


def _is(node, target) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target == target


def _is_dequantize(node) -> bool:
    """An activation's dequantize, static (``DQ``) or dynamic (``DQ_TENSOR``)."""
    return _is(node, DQ) or _is(node, DQ_TENSOR)


# --- 0. The starting graph ------------------------------------------------------------------------


def reexport(model: GraphModule, example_inputs: tuple) -> GraphModule:
    """torchao's first step: strict re-export, composite ops decomposed, ``aten.t`` -> ``permute``.

    After it, ``conv2d`` is ``aten.convolution``, a 2-D ``linear`` is ``permute`` + ``addmm``
    (``mm`` without bias), ``flatten`` is ``aten.view``: the shapes the patterns below look for.

    Args:
        model: the converted (simulated int8) model.
        example_inputs: a tuple of inputs to trace it with.

    Returns:
        GraphModule: the re-exported graph; ``model`` is left as it was.
    """
    table = torch.export.default_decompositions()
    for op in list(table):
        if not torch._export.utils._is_cia_op(op):  # only composite ops, as torchao does
            del table[op]
    gm = torch.export.export(model, example_inputs, strict=True).run_decompositions(table).module()
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.t.default)):
        with gm.graph.inserting_before(node):
            permute = gm.graph.call_function(aten.permute.default, (node.args[0], [1, 0]))
        node.replace_all_uses_with(permute)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _foldable(node: Node, values: dict) -> bool:
    """Whether inductor's constant folding computes ``node`` now: every input is known."""
    if node.op != "call_function" or node.target in _NEVER_FOLDED:
        return False
    inputs = node.all_input_nodes
    if not inputs or any(n not in values for n in inputs):
        return False  # it reads an input, or builds a tensor from nothing (left to inductor)
    if isinstance(node.target, torch._ops.OpOverload):
        if node.target._schema.is_mutable:
            return False  # a buffer's update is not a constant (_check_graph refuses it)
        if torch.Tag.nondeterministic_seeded in node.target.tags:
            return False  # random numbers must differ from call to call
    return True


def _constant_values(model: GraphModule) -> dict:
    """Every node the constants alone decide, with its value, in graph order."""
    values = {}
    for node in model.graph.nodes:
        if node.op == "get_attr":
            values[node] = _fetch(model, node)
        elif _foldable(node, values):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            values[node] = node.target(*args, **kwargs)
    return values


def fold_constants(model: GraphModule) -> list[str]:
    """Run every op whose inputs are all constants now; keep its result as a constant.

    Inductor's constant folding (``torch._inductor.constant_folding.constant_fold``), which
    torchao runs before its patterns and once more after them: a ``get_attr``-only op (the
    class token's ``expand`` to the batch, a float linear's transposed weight, a prepack)
    becomes a buffer ``_frozen_paramN`` (``common.pt2e.replace_with_constant``). Of a chain of
    such ops only the last one, the one a computed node reads, gets a buffer: the names
    ``_frozen_paramN`` then count as inductor counts them. Dequantize nodes are never folded.

    Args:
        model: a re-exported graph (:func:`reexport`); edited in place.

    Returns:
        list[str]: the names of the nodes that became constants.
    """
    values = _constant_values(model)
    computed = [n for n, v in values.items() if n.op != "get_attr" and isinstance(v, torch.Tensor)]
    kept = set(computed)
    read_later = [n for n in computed if any(user not in kept for user in n.users)]
    for node in read_later:
        replace_with_constant(model, node, values[node])
    remove_unused_constants(model)
    model.graph.eliminate_dead_code()
    model.graph.lint()
    model.recompile()
    return [node.name for node in read_later]


# --- 1. Weight prepack ------------------------------------------------------------------------


def _activation(op: Node, arg: Node):
    """The ``dequantize`` an op reads its activation through, or ``None``.

    Static quantization writes the scale and zero point into it as numbers (``DQ``); dynamic
    quantization computes them per call (``choose_qparams``) and passes them as nodes
    (``DQ_TENSOR``).
    """
    if not _is_dequantize(arg):
        return None
    if len(arg.users) != 1:
        return None  # the op cannot erase it; promote_dequantize gives each op its own
    return arg


def promote_dequantize(model: GraphModule) -> list[str]:
    """Give each reader of a shared activation ``dequantize`` its own copy (dequant promotion).

    torchao's first pattern: an int8 op replaces ``dequantize -> op`` and erases the
    dequantize, which it cannot do while another op reads it. Static ``convert_pt2e``
    already writes one dequantize per reader; dynamic quantization shares one (the q, k and
    v projections read the same ``choose_qparams -> quantize -> dequantize``).

    Args:
        model: a re-exported graph (:func:`reexport`); edited in place.

    Returns:
        list[str]: the names of the dequantize nodes that were shared.
    """
    graph, shared = model.graph, []
    for dq in list(graph.nodes):
        if not _is_dequantize(dq) or len(dq.users) < 2:
            continue
        shared.append(dq.name)
        for user in list(dq.users)[1:]:
            with graph.inserting_before(user):
                own = graph.call_function(dq.target, dq.args, dq.kwargs)
            own.meta = dict(dq.meta)
            user.replace_input_with(dq, own)
    graph.lint()
    model.recompile()
    return shared


def prepack_conv(model: GraphModule, conv: Node) -> Node | None:
    """``dequantize(x) -> convolution(dequantize_per_channel(w))`` becomes ``qconv_pointwise``.

    The new op reads the uint8 ``x`` before its dequantize and a ``qconv_prepack`` of the int8
    weight, and returns float32 for now (``fuse_post_ops`` may change that).

    Args:
        model: the re-exported graph (``reexport``); edited in place.
        conv: an ``aten.convolution`` node of it.

    Returns:
        Node | None: the new ``qconv_pointwise`` node, or ``None`` if ``conv`` is not a
        quantized convolution.

    Raises:
        NotImplementedError: for a float 2-D/3-D, a transposed or a 3-D quantized convolution
            (torchao rewrites those, this function does not); the message names the node.
    """
    x, weight, bias, stride, padding, dilation, transposed, _, groups = conv.args
    dq = _activation(conv, x)
    if dq is None or not _is(weight, DQ_CHANNEL):
        packable = conv.meta["val"].dim() in (4, 5)  # inductor packs float 2-D/3-D convs
        if isinstance(weight, Node) and weight.op == "get_attr" and packable:
            raise _unsupported(conv, "a float 2-D/3-D convolution (torchao packs it for mkldnn)")
        return None
    if dq.target == DQ_TENSOR:
        return None  # torchao has no int8 conv pattern for a dynamically quantized input
    if transposed or conv.meta["val"].dim() not in (3, 4):
        raise _unsupported(conv, "a quantized transposed or 3-D convolution")
    qx, x_scale, x_zp = dq.args[:3]
    qw, w_scale, w_zp = weight.args[:3]
    graph = model.graph
    with graph.inserting_before(conv):
        packed = graph.call_function(
            onednn.qconv_prepack.default,
            (qw, w_scale, x_scale, x_zp, stride, padding, dilation, groups, qx.meta["val"].shape),
        )
        geometry = (stride, padding, dilation, groups)
        new = graph.call_function(
            QCONV, (qx, x_scale, x_zp, packed, w_scale, w_zp, bias, *geometry, *_FLOAT_OUTPUT)
        )
    conv.replace_all_uses_with(new)
    new.meta.update(conv.meta)
    for node in (conv, dq, weight):
        graph.erase_node(node)
    return new


def _linear_args(mm: Node) -> tuple:
    """``(bias, input, weight)`` of an ``addmm`` (bias first, as aten orders it) or ``mm``."""
    return mm.args if mm.target == aten.addmm.default else (None, *mm.args)


def prepack_linear(model: GraphModule, mm: Node) -> Node | None:
    """``dequantize(x) -> addmm/mm(permute(dequantize_per_channel(w)))`` -> ``qlinear_pointwise``.

    Only a 2-D activation matches: for a 3-D one the re-export writes ``view -> addmm ->
    view`` and torchao's pattern expects ``reshape``, so both leave it in float (q/dq kept).
    A dynamically quantized ``x`` gives ``qlinear_pointwise.tensor``: the same op, reading
    the scale and zero point ``choose_qparams`` computes as tensors.

    Args:
        model: the re-exported graph (``reexport``); edited in place.
        mm: an ``aten.addmm`` or ``aten.mm`` node of it.

    Returns:
        Node | None: the new ``qlinear_pointwise`` node, or ``None`` if ``mm`` is not a
        quantized linear (or its dequantize has other readers: :func:`promote_dequantize`).
    """
    bias, x, t = _linear_args(mm)
    if not _is(t, aten.permute.default) or not _is(t.args[0], DQ_CHANNEL):
        return None
    dq = _activation(mm, x)
    if dq is None:
        return None
    weight = t.args[0]
    qx, x_scale, x_zp = dq.args[:3]
    qw, w_scale, w_zp = weight.args[:3]
    target = QLINEAR_TENSOR if dq.target == DQ_TENSOR else QLINEAR
    graph = model.graph
    with graph.inserting_before(mm):
        packed = graph.call_function(onednn.qlinear_prepack.default, (qw, qx.meta["val"].shape))
        new = graph.call_function(
            target,
            (qx, x_scale, x_zp, packed, w_scale, w_zp, bias, *_FLOAT_OUTPUT),
        )
    mm.replace_all_uses_with(new)
    new.meta.update(mm.meta)
    for node in (mm, dq, t, weight):
        graph.erase_node(node)
    return new


def _value(model: GraphModule, node: Node) -> torch.Tensor:
    """A node's tensor: a constant's own value, or the example value export recorded."""
    return _fetch(model, node) if node.op == "get_attr" else node.meta["val"]


def _packable_float_linear(model: GraphModule, mm: Node) -> bool:
    """Inductor's test (``_is_packable_linear``): a 2-D float32 linear on a constant weight."""
    bias, x, weight = _linear_args(mm)
    if not (isinstance(weight, Node) and weight.op == "get_attr"):
        return False  # a weight computed in the graph: a dequantize, or not a linear at all
    if mm.kwargs.get("alpha", 1.0) != 1.0 or mm.kwargs.get("beta", 1.0) not in (0.0, 1.0):
        return False  # the packed linear computes x @ w + bias, nothing scaled
    x_val, w_val = _value(model, x), _value(model, weight)
    if torch.float64 in (x_val.dtype, w_val.dtype) or x_val.dim() != 2 or w_val.dim() != 2:
        return False
    if bias is not None:
        b_val = _value(model, bias)
        if b_val.dim() != 1 or b_val.shape[0] != w_val.shape[1]:
            return False  # a bias broadcast over rows is not a linear's bias
    mkl = torch._C.has_mkl and torch.backends.mkldnn.matmul.fp32_precision == "none"
    if (x_val.dtype, w_val.dtype) != (torch.float32, torch.float32) or not mkl:
        raise _unsupported(mm, "a float linear inductor packs for oneDNN, not MKL")
    return True


def pack_float_linear(model: GraphModule, mm: Node) -> Node | None:
    """A float ``addmm/mm`` on a constant weight becomes MKL's ``_mkl_linear``.

    A linear the quantizer left in float (``nn.MultiheadAttention``'s ``out_proj``, a layer
    taken out with ``set_module_name_qconfig(name, None)``) still gets inductor's weight
    prepacking: ``_mkl_reorder_linear_weight`` lays the weight out for MKL's matrix multiply,
    for this batch size. The op reads both the packed weight and the plain ``(out, in)`` one.
    The bias of ``addmm(bias, x, w, beta=0)`` is ignored, as ``addmm`` ignores it.

    Args:
        model: the graph after :func:`fold_constants` (the weight's ``permute`` folded into a
            constant); edited in place.
        mm: an ``aten.addmm`` or ``aten.mm`` node of it.

    Returns:
        Node | None: the new ``mkl._mkl_linear`` node, or ``None`` if inductor would leave
        ``mm`` as it is.

    Raises:
        NotImplementedError: for a bfloat16/float16 linear, or where MKL is not what inductor
            packs for; the message names the node.
    """
    if not _packable_float_linear(model, mm):
        return None
    bias, x, weight = _linear_args(mm)
    if mm.kwargs.get("beta", 1.0) == 0.0:
        bias = None
    batch = _value(model, x).shape[0]
    graph = model.graph
    with graph.inserting_before(mm):
        t = graph.call_function(aten.permute.default, (weight, (1, 0)))
        packed = graph.call_function(MKL_PACK, (t, batch))
        new = graph.call_function(MKL_LINEAR, (x, packed, t, bias, batch))
    mm.replace_all_uses_with(new)
    new.meta.update(mm.meta)
    graph.erase_node(mm)
    return new


# --- 2. Post-op fusion ------------------------------------------------------------------------


def _only_user(node: Node):
    return next(iter(node.users)) if len(node.users) == 1 else None


def _upstream(node: Node) -> set:
    """``node`` and every node it depends on."""
    seen, todo = {node}, [node]
    while todo:
        for parent in todo.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _chain(op: Node) -> tuple:
    """Walk ``op [-> add(op, dequantize)] [-> relu] [-> quantize]``.

    Returns ``(add, dq, relu, q)``, ``None`` for what is not there. Every node but the last
    must have a single user, as in inductor's patterns.
    """
    add = dq = relu = q = None
    node, user = op, _only_user(op)
    if _is(user, aten.add.Tensor) and len(user.args) == 2 and not user.kwargs:
        other = user.args[1] if user.args[0] is op else user.args[0]
        if other is not op and _is(other, DQ):
            same_shape = other.meta["val"].shape == op.meta["val"].shape
            if same_shape:
                add, dq, node = user, other, user
                user = _only_user(node)
    if _is(user, aten.relu.default):
        relu, node = user, user
        user = _only_user(node)
    if _is(user, Q):
        q = user
    return add, dq, relu, q


def _accumulator_free(op: Node, tensor: Node) -> bool:
    """oneDNN adds into ``tensor``'s buffer: no later op may read it, and ``op`` must not."""
    later = [u for u in tensor.users if u not in _upstream(op)]
    return len(later) <= 1 and tensor is not op.args[0]


def _replace(model: GraphModule, nodes: list, target, args: tuple) -> Node:
    """Put ``target(*args)`` in place of the chain ``nodes`` (first to last); erase them."""
    end = nodes[-1]
    with model.graph.inserting_before(end):
        new = model.graph.call_function(target, args)
    end.replace_all_uses_with(new)
    new.meta.update(end.meta)
    for node in reversed(nodes):
        model.graph.erase_node(node)
    return new


def _fuse_conv(model: GraphModule, conv: Node, int8_output: bool) -> None:
    add, dq, relu, q = _chain(conv)
    if int8_output:
        if q is None:
            return
        if add is not None:  # the accumulator is read as uint8: its dequantize goes too
            if len(dq.users) != 1 or not _accumulator_free(conv, dq.args[0]):
                return
            accum, accum_scale, accum_zp = dq.args[:3]
        out = (q.args[1], q.args[2], q.args[5])
        nodes = [conv, *(n for n in (dq, add, relu) if n is not None), q]
    else:
        if relu is None and add is None:
            return
        if add is not None:
            if not _accumulator_free(conv, dq):
                return
            accum, accum_scale, accum_zp = dq, 1.0, 0
        out = (1.0, 0, torch.float32)
        nodes = [conv, *(n for n in (add, relu) if n is not None)]
    head = conv.args[:6]  # x, x_scale, x_zp, packed weight, w_scale, w_zp
    bias, geometry = conv.args[6], conv.args[7:11]  # stride, padding, dilation, groups
    unary = ("relu" if relu is not None else "none", [], "")
    if add is None:
        _replace(model, nodes, QCONV, (*head, bias, *geometry, *out, *unary))
    else:
        args = (*head, accum, bias, *geometry, *out, accum_scale, accum_zp, "sum", 1.0, *unary)
        _replace(model, nodes, QCONV_ADD, args)


def _fuse_linear(model: GraphModule, linear: Node, int8_output: bool) -> None:
    user = _only_user(linear)
    if _is(user, aten.add.Tensor):
        raise _unsupported(user, "linear + add fusion (qlinear binary)")
    _, _, relu, q = _chain(linear)
    if (int8_output and q is None) or (not int8_output and relu is None):
        return
    out = (q.args[1], q.args[2], q.args[5]) if int8_output else (1.0, 0, torch.float32)
    nodes = [linear, relu] if not int8_output else [linear, *([relu] if relu else []), q]
    unary = ("relu" if relu is not None else "none", [], "")
    _replace(model, nodes, linear.target, (*linear.args[:7], *out, *unary))


def fuse_post_ops(model: GraphModule) -> None:
    """Fold what follows each int8 conv/linear into it, in inductor's order of priority.

    First with int8 output: ``op [-> add(dequantize)] [-> relu] -> quantize`` becomes one op
    that requantizes its result. Then with float output: ``op [-> add(dequantize)] -> relu``
    and ``conv -> add(dequantize)``. Ops are visited from the end of the graph back, as
    inductor's pattern matcher walks it.

    Args:
        model: a graph with ``qconv_pointwise`` / ``qlinear_pointwise`` nodes
            (``prepack_conv`` / ``prepack_linear``); edited in place.
    """
    for int8_output in (True, False):
        for node in reversed(list(model.graph.nodes)):
            if node._erased or node.op != "call_function":
                continue
            if node.target == QCONV and node.args[14] == "none":
                _fuse_conv(model, node, int8_output)
            elif node.target in (QLINEAR, QLINEAR_TENSOR) and node.args[10] == "none":
                _fuse_linear(model, node, int8_output)


# --- 3. Constants ---------------------------------------------------------------------------


def fold_prepacked_weights(model: GraphModule) -> list[str]:
    """Run every ``qconv_prepack`` / ``qlinear_prepack`` now; keep the result as a constant.

    torchao's last step, inductor's constant folding once more (:func:`fold_constants`): a
    prepack reads constants only, so the packed weight becomes a buffer ``_frozen_paramN``
    read by a ``get_attr`` that keeps the prepack node's name
    (``common.pt2e.replace_with_constant``); constants nobody reads any more (the int8
    weights) are deleted. MKL's packed float weights (:func:`pack_float_linear`) are folded
    the same way.

    Args:
        model: a graph whose prepacks ``prepack_conv`` / ``prepack_linear`` inserted; edited in
            place.

    Returns:
        list[str]: the names of the nodes that became constants.
    """
    return fold_constants(model)


def _check_graph(model: GraphModule) -> None:
    """Refuse what inductor's freezing passes would also change and this module does not."""
    constants = {n for n in model.graph.nodes if n.op == "get_attr"}
    for node in model.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in _REFUSED:
            raise _unsupported(node, _REFUSED[node.target])
        if node.target in _NEVER_FOLDED:
            continue
        if node.all_input_nodes and set(node.all_input_nodes) <= constants:
            raise _unsupported(node, "an op on constants only that fold_constants left")
        x = node.args[0] if node.target == aten.bmm.default else None
        if _is(x, aten.expand.default) and _is_dequantize(x.args[0]):
            # torchao turns bmm(expand(dequantize), expand(permute(dequantize_per_channel)))
            # into a qlinear. The re-export puts a view between expand and bmm, so neither
            # lowering sees this; should a graph have it, refuse.
            raise _unsupported(node, "a quantized linear over a non-contiguous 3-D input")
        if node.target in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor):
            # Inductor folds such arithmetic into a conv's weight and bias when the conv is the
            # other input (binary folding); after any other op it stays, as here.
            inputs = node.all_input_nodes
            if any(a in constants for a in inputs) and any(
                _is(a, aten.convolution.default) for a in inputs
            ):
                raise _unsupported(node, "arithmetic with a constant (inductor's binary folding)")


def lower(model: GraphModule, example_inputs: tuple) -> GraphModule:
    """Hand-written ``lower_pt2e_quantized_to_x86``: the q/dq graph on oneDNN's int8 ops.

    Args:
        model: a model from ``convert_pt2e`` (or ``common.handmade.convert``), quantized with
            ``X86InductorQuantizer``.
        example_inputs: a tuple of inputs of the shape the model will run on.

    Returns:
        A new ``GraphModule`` with ``onednn.qconv_pointwise`` / ``qconv2d_pointwise.binary`` /
        ``qlinear_pointwise`` ops on prepacked int8 weights, ``mkl._mkl_linear`` for 2-D float
        linears; the q/dq nodes no pattern absorbed stay.

    Raises:
        NotImplementedError: for a pattern torchao rewrites and this function does not (float
            conv packing, linear + add, bf16, ...); the message names the node.
    """
    gm = reexport(model, example_inputs)
    fold_constants(gm)
    _check_graph(gm)
    promote_dequantize(gm)
    for node in reversed(list(gm.graph.nodes)):  # inductor's matcher walks from the end
        if node._erased or node.op != "call_function":
            continue
        if node.target == aten.convolution.default:
            prepack_conv(gm, node)
        elif node.target in (aten.addmm.default, aten.mm.default):
            prepack_linear(gm, node) or pack_float_linear(gm, node)
    fuse_post_ops(gm)
    fold_prepacked_weights(gm)
    return gm


def reshape_views(model: GraphModule) -> list[str]:
    """Make every ``aten.view`` an ``aten.reshape``; return the names of the nodes changed.

    Not part of torchao's lowering. The re-export turned ``flatten`` into ``view``, which was
    valid for the contiguous tensors it was traced with. An int8 conv returns channels-last
    tensors, and a ``view`` of a channels-last tensor across channels fails; ``reshape`` gives
    the same values (copying only when it must).

    Args:
        model: a lowered graph (``lower``); edited in place.

    Returns:
        list[str]: the names of the nodes that were ``view`` and are now ``reshape``.
    """
    changed = []
    for node in model.graph.find_nodes(op="call_function", target=aten.view.default):
        node.target = aten.reshape.default
        changed.append(node.name)
    model.recompile()
    return changed
