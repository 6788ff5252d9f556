"""prepare and convert written by hand: the same graphs and numbers as torchao's PT2E passes.

``prepare(model, quantizer)`` and ``convert(model, fold_quantize=True)`` have the contract of
torchao's ``prepare_pt2e`` and ``convert_pt2e``. Every step is one of the graph edits of
M00-4; the tests check, model by model, that the results are bit-for-bit torchao's. A graph
that needs something written here does not do raises ``NotImplementedError`` naming the node,
so a difference is never silent.

The parts, in the order the passes use them:

* :func:`fold_batch_norm` -- fold eval-mode BatchNorm into the conv/linear before it.
* :func:`collect_qspecs`, :func:`sharing_groups`, :func:`create_observers` -- from the
  annotations, decide which edges and outputs are observed, and by which observer instance.
* :func:`insert_observers` -- put those observers into the graph.
* :func:`replace_observer` -- one observer becomes a quantize/dequantize pair.
* :func:`duplicate_shared_dequantize` -- give every annotated user its own dequantize.
* :func:`fold_weight_quantize` -- quantize constant weights ahead of time (int8 constants).
"""

import dataclasses
import operator
from functools import reduce

import torch
from torch._subclasses import FakeTensor
from torch.ao.quantization import QConfigMapping
from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401
from torch.ao.quantization.fx.custom_config import PrepareCustomConfig
from torch.ao.quantization.fx.prepare import _save_state
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights
from torchao.quantization.pt2e.observer import _is_activation_post_process
from torchao.quantization.pt2e.quantizer import (
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)
from torchao.quantization.pt2e.utils import _disallow_eval_train

__all__ = [
    "collect_qspecs",
    "convert",
    "create_observers",
    "duplicate_shared_dequantize",
    "fold_batch_norm",
    "fold_weight_quantize",
    "insert_observers",
    "is_observer_node",
    "lower",
    "observe_node",
    "prepare",
    "replace_observer",
    "sharing_groups",
]

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
ANNOTATION = "quantization_annotation"
# Where prepare leaves its bookkeeping for convert (the key torchao's convert_pt2e reads too).
_PREPARED = "_observed_graph_module_attrs"

_CONV_OPS = {aten.conv1d.default, aten.conv2d.default, aten.conv3d.default}
_BATCH_NORM_EPS_INDEX = {  # where eps sits in each batch-norm op's arguments
    aten.batch_norm.default: 7,
    aten._native_batch_norm_legit_no_training.default: 6,
}
_SYM = (aten.sym_size, aten.sym_numel)  # shape queries are not real users of a dequantize
_QUANTIZE_OPS = {qd.quantize_per_tensor.default, qd.quantize_per_channel.default}
_DEQUANTIZE_OPS = {qd.dequantize_per_tensor.default, qd.dequantize_per_channel.default}
# Integer dtypes of the observers convert turns into quantize/dequantize ops (torch.q* are the
# old quantized dtypes; the ops take the plain integer dtype underneath).
_INTEGER_DTYPE = {
    torch.quint8: torch.uint8,
    torch.qint8: torch.int8,
    torch.qint32: torch.int32,
    torch.uint8: torch.uint8,
    torch.int8: torch.int8,
    torch.uint16: torch.uint16,
    torch.int16: torch.int16,
    torch.int32: torch.int32,
}
# The fields two specs must agree on for one observer to serve both (implicit sharing).
_SAME_SPEC_FIELDS = (
    "dtype",
    "is_dynamic",
    "quant_min",
    "quant_max",
    "qscheme",
    "ch_axis",
    "scale",
    "zero_point",
)


def _unsupported(node: Node, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"common.handmade does not handle {what} (node {node.name!r}: {node.format_node()}); "
        "use torchao's prepare_pt2e/convert_pt2e for this model"
    )


def _fetch(model: GraphModule, node):
    """The tensor a ``get_attr`` node reads (``None`` for a missing optional argument)."""
    if node is None:
        return None
    return reduce(getattr, node.target.split("."), model)


def _free_name(model: torch.nn.Module, prefix: str) -> str:
    """``prefix0``, or ``prefix1`` if that is taken, and so on."""
    prefix = prefix.replace(".", "_")
    i = 0
    while hasattr(model, f"{prefix}{i}"):
        i += 1
    return f"{prefix}{i}"


def _device(model: torch.nn.Module):
    devices = {t.device for t in [*model.parameters(), *model.buffers()]}
    if len(devices) > 1:
        raise NotImplementedError(f"a model on several devices ({devices}) is not handled")
    return next(iter(devices), None)


def is_observer_node(model: GraphModule, node) -> bool:
    """Whether ``node`` calls an observer (or fake-quantize) submodule of ``model``."""
    return (
        isinstance(node, Node)
        and node.op == "call_module"
        and _is_activation_post_process(model.get_submodule(node.target))
    )


def _module_scopes(model: GraphModule) -> dict[str, tuple[str, type]]:
    """Node name -> (name of the innermost module it came from, that module's class).

    convert names per-channel qparam buffers after it (``fc_scale_0`` for a node of ``self.fc``).
    """
    scopes = {}
    for node in model.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path, cls = list(stack.values())[-1]
            scopes[node.name] = (path.split(".")[-1], cls)
        else:
            scopes[node.name] = ("", type(None))
    return scopes


def _check_graph(model: GraphModule) -> None:
    """Refuse graphs with constructs the passes below do not reproduce."""
    for node in model.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            raise _unsupported(node, "higher-order ops (scan, while_loop, cond, ...)")
        if node.target in _BATCH_NORM_EPS_INDEX or node.target in (
            aten._native_batch_norm_legit.default,
            aten.cudnn_batch_norm.default,
        ):
            raise _unsupported(node, "a batch norm that does not follow a conv or a 2-D linear")


# --- 1. BatchNorm folding -----------------------------------------------------------------------


def _set_parameter(model: GraphModule, target: str, value: torch.nn.Parameter) -> None:
    owner, _, name = target.rpartition(".")
    model.get_submodule(owner).register_parameter(name, value)


def fold_batch_norm(model: GraphModule) -> None:
    """Fold each ``conv -> batch_norm`` (and 2-D ``linear -> batch_norm``) into the conv/linear.

    In eval mode BatchNorm is ``y = (x - mean) / sqrt(var + eps) * gamma + beta``, an affine map
    per channel, so it can be baked into the weight and bias before it
    (``torch.nn.utils.fusion.fuse_conv_bn_weights``). The batch-norm node then disappears.
    """
    graph = model.graph
    if not any(node.target in _BATCH_NORM_EPS_INDEX for node in graph.nodes):
        return
    folded_weights = set()
    for bn in list(graph.nodes):
        if bn._erased or bn.op != "call_function" or bn.target not in _BATCH_NORM_EPS_INDEX:
            continue
        producer = bn.args[0]
        if not isinstance(producer, Node) or producer.op != "call_function":
            continue
        if producer.target in _CONV_OPS:
            fuse = fuse_conv_bn_weights
        elif producer.target == aten.linear.default:
            fuse = fuse_linear_bn_weights
            if producer.args[0].meta["val"].ndim > 2:
                continue  # BatchNorm1d on (N, C, L) normalises dim 1, linear mixes the last dim
        else:
            continue
        weight_node = producer.args[1]
        bias_node = producer.args[2] if len(producer.args) > 2 else None
        if weight_node in folded_weights:
            raise _unsupported(producer, "a weight shared by two conv/linear + batch norm pairs")
        folded_weights.add(weight_node)

        schema = bn.target._schema.arguments
        bn_args = [  # every argument, defaults filled in: input, weight, bias, mean, var, ...
            bn.kwargs.get(a.name, bn.args[i] if i < len(bn.args) else a.default_value)
            for i, a in enumerate(schema)
        ]
        gamma, beta, mean, var = (_fetch(model, n) for n in bn_args[1:5])
        eps = bn_args[_BATCH_NORM_EPS_INDEX[bn.target]]
        weight, bias = _fetch(model, weight_node), _fetch(model, bias_node)
        if fuse is fuse_conv_bn_weights:
            new_weight, new_bias = fuse(weight, bias, mean, var, eps, gamma, beta, transpose=False)
        else:
            new_weight, new_bias = fuse(weight, bias, mean, var, eps, gamma, beta)

        _set_parameter(model, weight_node.target, new_weight)
        args = list(producer.args) + [None] * (3 - len(producer.args))
        if bias_node is not None:
            _set_parameter(model, bias_node.target, new_bias)
        else:  # a conv without bias gets one: the folded beta - mean * scale
            _set_parameter(model, weight_node.target + "_bias", new_bias)
            with graph.inserting_before(producer):
                args[2] = graph.get_attr(weight_node.target + "_bias")
            fake_mode = producer.meta["val"].fake_mode
            args[2].meta["val"] = fake_mode.from_tensor(new_bias, static_shapes=True)
        producer.args = tuple(args)

        if bn.target == aten.batch_norm.default:
            bn.replace_all_uses_with(producer)
        else:  # the older op returns (out, mean, rstd); users read item 0 via getitem
            for user in list(bn.users):
                if user.target is operator.getitem and user.args[1] == 0:
                    user.replace_all_uses_with(producer)
        graph.eliminate_dead_code()
        if not bn._erased and not bn.users:
            graph.erase_node(bn)
    graph.eliminate_dead_code()
    model.recompile()


# --- 2. From annotations to observers -----------------------------------------------------------


def collect_qspecs(model: GraphModule) -> dict:
    """Every annotated place, in graph order: ``(producer, user)`` edges and output nodes.

    The keys are input edges (from ``input_qspec_map``) and nodes (their ``output_qspec``);
    the values are the specs, ``None`` meaning "leave this edge float".
    """
    qspecs = {}
    for node in model.graph.nodes:
        annotation = node.meta.get(ANNOTATION)
        if annotation is None:
            continue
        for source, qspec in annotation.input_qspec_map.items():
            qspecs[(source, node)] = qspec
        if annotation.output_qspec is not None:
            qspecs[node] = annotation.output_qspec
    return qspecs


def _same_spec(a, b) -> bool:
    return all(
        (hasattr(a, f) and hasattr(b, f) and getattr(a, f) == getattr(b, f))
        or (not hasattr(a, f) and not hasattr(b, f))
        for f in _SAME_SPEC_FIELDS
    )


class _Groups:
    """Union-find over edges and nodes: members of one group share one observer."""

    def __init__(self, qspecs: dict):
        self.qspecs = qspecs
        self.parent = {key: key for key in qspecs}

    def root(self, key):
        parent = self.parent[key]
        if parent == key:
            return key
        self.parent[key] = self.root(parent)
        return self.parent[key]

    def join(self, parent, child) -> None:
        root_parent, root_child = self.root(parent), self.root(child)
        parent_spec = self.qspecs[root_parent]
        if (
            isinstance(parent_spec, SharedQuantizationSpec)
            and parent_spec.edge_or_node == root_child
        ):
            self.parent[root_parent] = root_child  # the other way round would close a cycle
        else:
            self.parent[root_child] = root_parent

    def resolve(self, qspec):
        """Follow ``SharedQuantizationSpec`` links to the spec that really makes an observer."""
        while isinstance(qspec, SharedQuantizationSpec):
            qspec = self.qspecs[self.root(qspec.edge_or_node)]
        return qspec


def sharing_groups(qspecs: dict) -> dict:
    """Map every key of ``qspecs`` to the root of its sharing group.

    Two rules put keys in one group:

    * explicit: a ``SharedQuantizationSpec(other)`` joins the key to ``other``;
    * implicit: an input edge ``(a, n)`` is the same tensor as ``a``'s output and as every
      other edge ``(a, m)``, so it joins them when their specs agree (dtype, range, scheme...),
      unless ``n``'s annotation sets ``allow_implicit_sharing=False``.
    """
    groups = _Groups(qspecs)
    for key, qspec in qspecs.items():
        if isinstance(key, tuple):
            source, user = key
            wanted = groups.resolve(qspec)
            if user.meta[ANNOTATION].allow_implicit_sharing:
                # Other users of the same tensor first, then its output (this order avoids cycles).
                others = [(source, other) for other in source.users if other is not user]
                for same_tensor in [*others, source]:
                    if same_tensor in qspecs:
                        spec = groups.resolve(qspecs[same_tensor])
                        if spec is not None and _same_spec(spec, wanted):
                            groups.join(same_tensor, key)
        if isinstance(qspec, SharedQuantizationSpec):
            groups.join(qspec.edge_or_node, key)
    return {key: groups.root(key) for key in qspecs}


def _key_node(key) -> Node:
    return key[1] if isinstance(key, tuple) else key


def _new_observer(key, qspec):
    if not isinstance(qspec, QuantizationSpec):
        kind = type(qspec).__name__
        raise _unsupported(_key_node(key), f"{kind} (only QuantizationSpec and Shared...)")
    if qspec.is_dynamic:
        raise _unsupported(_key_node(key), "dynamic quantization")
    kwargs = {f.name: getattr(qspec, f.name) for f in dataclasses.fields(qspec)}
    constructor = kwargs.pop("observer_or_fake_quant_ctr")
    cls = getattr(getattr(constructor, "p", None), "func", constructor)  # with_args(...) wraps it
    if "PerChannel" not in cls.__name__:
        kwargs.pop("ch_axis")  # only per-channel observers take an axis
    return constructor.with_args(**kwargs)()


def create_observers(qspecs: dict, groups: dict) -> dict:
    """One observer per sharing group, made from the spec of the group's first member."""
    observers, by_group = {}, {}
    for key, qspec in qspecs.items():
        group = groups[key]
        if group not in by_group:
            if qspec is None:
                by_group[group] = None
            elif isinstance(qspec, SharedQuantizationSpec):
                by_group[group] = observers[qspec.edge_or_node]
            else:
                by_group[group] = _new_observer(key, qspec)
        observers[key] = by_group[group]
    return observers


# --- 3. Inserting observers ---------------------------------------------------------------------


def _insert_observer_after(model: GraphModule, node: Node, observer) -> Node:
    """M00-4 step 1: register the observer as a submodule and call it on ``node``."""
    device = _device(model)
    if device is not None:
        observer.to(device)
    name = _free_name(model, "activation_post_process_")
    model.add_submodule(name, observer)
    with model.graph.inserting_after(node):
        return model.graph.call_module(name, (node,))


def _reroute_users(node: Node, observer: Node) -> None:
    """M00-4 step 2: every user of ``node`` but the observer itself now reads the observer."""
    node.replace_all_uses_with(observer, delete_user_cb=lambda user: user is not observer)


def _observe_input(model: GraphModule, user: Node, arg, observers: dict):
    """Return what ``user`` should read instead of ``arg``: ``arg`` or an observer of it."""
    if isinstance(arg, (list, tuple)):  # cat([a, b]) takes a list of nodes
        return type(arg)(_observe_input(model, user, a, observers) for a in arg)
    if not isinstance(arg, Node):
        return arg
    source = arg
    while is_observer_node(model, source):  # the edge is named after the original producer
        source = source.args[0]
    observer = observers.get((source, user))
    if observer is None:
        return arg
    schema = getattr(user.target, "_schema", None)
    if schema and schema.arguments and (alias := schema.arguments[0].alias_info) and alias.is_write:
        raise _unsupported(user, "an annotated in-place op")
    if observers.get(source) is observer:
        return arg  # arg is already the producer's output observer: reuse it
    for other in arg.users:  # another user of arg already inserted this very observer
        if is_observer_node(model, other) and model.get_submodule(other.target) is observer:
            return other
    return _insert_observer_after(model, arg, observer)


def observe_node(model: GraphModule, node: Node, observers: dict) -> None:
    """Insert the observers one annotated node asks for: its input edges, then its output."""
    node.args = tuple(_observe_input(model, node, arg, observers) for arg in node.args)
    for name, value in node.kwargs.items():
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, Node):
                raise _unsupported(node, f"a tensor passed as keyword argument {name!r}")
    if not isinstance(node.meta.get("val"), FakeTensor) or observers.get(node) is None:
        return
    observer = _insert_observer_after(model, node, observers[node])
    _reroute_users(node, observer)


def insert_observers(model: GraphModule, observers: dict) -> None:
    """Insert all observers, annotated node by annotated node in graph order."""
    for node in list(model.graph.nodes):
        if ANNOTATION in node.meta:
            observe_node(model, node, observers)


def prepare(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Hand-written ``prepare_pt2e``: fold batch norm, annotate, insert observers.

    Args:
        model: ``torch.export.export(...).module()`` of a model in eval mode.
        quantizer: any torchao ``Quantizer`` (its annotations decide everything).

    Returns:
        The observed ``GraphModule``, ready for calibration and for :func:`convert` (or
        torchao's ``convert_pt2e``).
    """
    original_meta = model.meta
    scopes = _module_scopes(model)
    fold_batch_norm(model)
    model = quantizer.transform_for_annotation(model)
    quantizer.annotate(model)
    quantizer.validate(model)
    _check_graph(model)

    qspecs = collect_qspecs(model)
    observers = create_observers(qspecs, sharing_groups(qspecs))
    quantizer.prepare_obs_or_fq_callback(model, observers)
    insert_observers(model, observers)

    model = GraphModule(model, model.graph)  # keeps only the attributes the graph uses
    # The same bookkeeping as torchao, so torchao's convert_pt2e accepts this model too.
    _save_state(model, {}, scopes, PrepareCustomConfig(), {}, QConfigMapping(), False, set())
    model.meta.update(original_meta)
    return _disallow_eval_train(model)


# --- 4. Observers become quantize/dequantize ----------------------------------------------------


def _buffer_node(model: GraphModule, prefix: str, value: torch.Tensor) -> Node:
    """M00-4 step 5: a tensor constant is a buffer read by a ``get_attr`` node."""
    name = _free_name(model, prefix)
    model.register_buffer(name, value.detach().clone())
    return model.graph.get_attr(name)


def replace_observer(model: GraphModule, node: Node, scopes: dict) -> None:
    """M00-4 step 4: replace one observer call by ``quantize -> dequantize`` with its qparams.

    Per-tensor scale and zero point become Python numbers in the arguments; per-channel ones
    become buffers (``<module>_scale_N``, ``<module>_zero_point_N``) read by ``get_attr``.
    """
    graph = model.graph
    observer = model.get_submodule(node.target)
    if hasattr(observer, "convert"):
        raise _unsupported(node, f"an observer that converts itself ({type(observer).__name__})")
    if getattr(observer, "is_dynamic", False) or observer.dtype not in _INTEGER_DTYPE:
        raise _unsupported(node, f"an observer of dtype {observer.dtype} (static integer only)")
    scale, zero_point = observer.calculate_qparams()
    dtype = _INTEGER_DTYPE[observer.dtype]
    source = node.args[0]
    module_path = scopes.get(source.name, ("", None))[0]
    with graph.inserting_before(node):
        if observer.qscheme in (torch.per_channel_affine, torch.per_channel_symmetric):
            quantize, dequantize = (
                qd.quantize_per_channel.default,
                qd.dequantize_per_channel.default,
            )
            qparams = (
                _buffer_node(model, module_path + "_scale_", scale),
                _buffer_node(model, module_path + "_zero_point_", zero_point),
                int(observer.ch_axis),
                observer.quant_min,
                observer.quant_max,
                dtype,
            )
        else:
            quantize, dequantize = qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default
            qparams = (float(scale), int(zero_point), observer.quant_min, observer.quant_max, dtype)
        out_dtype = source.meta["val"].dtype if "val" in source.meta else torch.float32
        kwargs = {} if out_dtype == torch.float32 else {"out_dtype": out_dtype}
        q = graph.call_function(quantize, (source, *qparams))
        dq = graph.call_function(dequantize, (q, *qparams), kwargs)
    node.replace_all_uses_with(dq)
    graph.erase_node(node)


def _give_own_copy(graph, dq: Node, user: Node) -> None:
    with graph.inserting_after(dq):
        copy = graph.node_copy(dq)
    user.args = map_arg(user.args, lambda n: copy if n is dq else n)
    user.kwargs = map_arg(user.kwargs, lambda n: copy if n is dq else n)


def duplicate_shared_dequantize(model: GraphModule) -> None:
    """Give each annotated user of a shared dequantize its own copy.

    A backend fuses ``dequantize -> op -> quantize`` into one integer op, which needs the
    dequantize to belong to that op alone. Users without an annotation keep the original.
    """
    graph = model.graph
    for dq in list(graph.nodes):
        if dq.op != "call_function" or dq.target not in _DEQUANTIZE_OPS:
            continue
        users = [u for u in dq.users if getattr(u.target, "overloadpacket", u.target) not in _SYM]
        if len(users) <= 1:
            continue
        for user in users:
            annotation = user.meta.get(ANNOTATION)
            if annotation is None or (
                not annotation.input_qspec_map and not annotation.output_qspec
            ):
                continue
            _give_own_copy(graph, dq, user)
    graph.eliminate_dead_code()
    model.recompile()


def _reads_only_constants(node: Node) -> bool:
    if node.op == "placeholder":
        return False
    return all(_reads_only_constants(n) for n in node.all_input_nodes)


def fold_weight_quantize(model: GraphModule) -> None:
    """Run each ``quantize`` of a constant now and keep its int8 result as a constant.

    This is ``fold_quantize=True``: ``get_attr(weight) -> quantize -> dequantize`` becomes
    ``get_attr(_frozen_paramN) -> dequantize``. The ``get_attr`` keeps the quantize node's name;
    get_attr nodes nobody reads any more are removed.
    """
    graph = model.graph
    if any("copy_" in str(n.target) or "put_" in str(n.target) for n in graph.nodes):
        node = next(n for n in graph.nodes if "copy_" in str(n.target) or "put_" in str(n.target))
        raise _unsupported(node, "buffer mutation together with fold_quantize=True")
    for q in list(graph.nodes):
        if q.op != "call_function" or q.target not in _QUANTIZE_OPS:
            continue
        source = q.args[0]
        if source.op != "get_attr":
            if _reads_only_constants(source):
                raise _unsupported(q, "folding a quantize of a computed constant")
            continue
        args = [_fetch(model, a) if isinstance(a, Node) else a for a in q.args]
        value = q.target(*args, **q.kwargs)  # e.g. the int8 weight
        i = getattr(model, "_frozen_param_count", 0)
        while hasattr(model, f"_frozen_param{i}"):
            i += 1
        model._frozen_param_count = i + 1
        with graph.inserting_before(q):
            constant = graph.create_node("get_attr", f"_frozen_param{i}")
        q.replace_all_uses_with(constant)
        constant.meta.update(q.meta)
        graph.erase_node(q)
        constant.name = q.name
        model.register_buffer(f"_frozen_param{i}", value)
    for node in list(graph.find_nodes(op="get_attr")):
        if not node.users:
            if hasattr(model, node.target):  # top-level attributes only, as torchao does
                delattr(model, node.target)
            graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    model.recompile()


def convert(model: GraphModule, fold_quantize: bool = True) -> GraphModule:
    """Hand-written ``convert_pt2e``: observers become quantize/dequantize pairs.

    Args:
        model: a model from :func:`prepare` (or torchao's ``prepare_pt2e``), calibrated.
        fold_quantize: quantize constant weights now and store them as int8 constants.

    Returns:
        The quantized ``GraphModule`` in the q/dq ("reference") representation.
    """
    original_meta = model.meta
    _check_graph(model)
    prepared = model.meta.get(_PREPARED)
    scopes = prepared.node_name_to_scope if prepared is not None else _module_scopes(model)
    for node in list(model.graph.nodes):
        if is_observer_node(model, node):
            replace_observer(model, node, scopes)
    model.graph.eliminate_dead_code()  # M00-4 step 6
    model = GraphModule(model, model.graph)
    model.delete_all_unused_submodules()  # the observers
    duplicate_shared_dequantize(model)
    if fold_quantize:
        fold_weight_quantize(model)
    model.meta["_user_preserved_attributes"] = {}  # torch.fx's key, as torchao's convert sets
    model.meta.update(original_meta)  # like torchao, this brings back prepare's bookkeeping too
    return _disallow_eval_train(model)


from common.lowering import lower  # noqa: E402  (M03-2 lives in its own module)
