"""prepare and convert written by hand: the same graphs and numbers as torchao's PT2E passes.

``prepare(model, quantizer)`` and ``convert(model, fold_quantize=True)`` have the contract of
torchao's ``prepare_pt2e`` and ``convert_pt2e``. Every step is one of the graph edits of
M00-4; the tests check, model by model and quantizer by quantizer, that the results are
bit-for-bit torchao's (the same code, the same state dict, ``torch.equal`` outputs).

The parts, in the order the passes use them:

* :func:`fold_batch_norm` -- fold eval-mode BatchNorm into the conv/linear before it.
* :func:`collect_qspecs`, :func:`sharing_groups`, :func:`create_observers` -- from the
  annotations, decide which edges and outputs are observed, and by which observer instance.
* :func:`insert_observers` -- put those observers into the graph.
* :func:`replace_observer` -- one observer becomes a quantize/dequantize pair (static int),
  ``choose_qparams -> quantize -> dequantize`` (dynamic), a float16 round trip, or nothing
  (a float observer).
* :func:`duplicate_shared_dequantize` -- give every annotated user its own dequantize.
* :func:`fold_weight_quantize` -- quantize constant weights ahead of time (int8 constants).

Not supported, each raising ``NotImplementedError`` that names the node:

* higher-order ops (``cond``, ``scan``, ``while_loop``): torchao prepares and converts their
  subgraphs recursively; the course's graphs have none, and recursion would hide the edits.
* one conv/linear weight shared by two conv/linear + BatchNorm pairs: torchao then removes the
  second BatchNorm without folding it ("fake fuse", meant for QAT), which changes the numbers
  of an eval model; we would rather refuse than copy that.
* observers that convert themselves (an observer with a ``convert`` method, such as torchao's
  affine-quantized observers): convert would only call that method, nothing is written here.
* a tensor passed to an annotated node as a keyword argument: torchao refuses it too
  (an ``AssertionError``), because the edge could not be observed.
* a model on several devices: both passes put every observer and constant on the one device.
"""

import dataclasses
import operator
import warnings
from functools import reduce

import torch
from torch._inductor.freezing_utils import maybe_set_is_frozen_param
from torch._subclasses import FakeTensor
from torch.ao.quantization import QConfigMapping
from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401
from torch.ao.quantization.fx.custom_config import PrepareCustomConfig
from torch.ao.quantization.fx.prepare import _save_state
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights
from torch.utils import _pytree as pytree
from torchao.quantization.pt2e import DerivedObserverOrFakeQuantize
from torchao.quantization.pt2e.observer import FixedQParamsObserver, _is_activation_post_process
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)
from torchao.quantization.pt2e.utils import _disallow_eval_train

from common.pt2e import remove_unused_constants, replace_with_constant

__all__ = [
    "collect_qspecs",
    "convert",
    "create_observers",
    "duplicate_shared_dequantize",
    "fold_batch_norm",
    "fold_weight_quantize",
    "insert_observers",
    "is_observer_node",
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

_CONV_OPS = {
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
    aten.conv1d.padding,  # padding="same" / "valid"
    aten.conv2d.padding,
    aten.conv3d.padding,
}
_CONV_TRANSPOSE_OPS = {
    aten.conv_transpose1d.default,
    aten.conv_transpose2d.input,
    aten.conv_transpose3d.input,
}
_BATCH_NORM_EPS_INDEX = {  # where eps sits in each batch-norm op's arguments
    aten.batch_norm.default: 7,
    aten._native_batch_norm_legit_no_training.default: 6,
}
_SYM = (aten.sym_size, aten.sym_numel)  # shape queries are not real users of a dequantize
_QUANTIZE_OPS = {
    qd.quantize_per_tensor.default,
    qd.quantize_per_tensor.tensor,
    qd.quantize_per_channel.default,
}
_DEQUANTIZE_OPS = {
    qd.dequantize_per_tensor.default,
    qd.dequantize_per_tensor.tensor,
    qd.dequantize_per_channel.default,
}
# Ops whose output fold_quantize keeps in the graph even when it could compute it now:
# the dequantize (a backend fuses dq -> op -> q), and the float16 round trip.
_NEVER_FOLDED = {*_DEQUANTIZE_OPS, qd.convert_element_type.no_fuse}
# The dtypes of the observers convert turns into quantize/dequantize ops (torch.q* are the
# old quantized dtypes; the ops take the plain dtype underneath).
_STATIC_DTYPE = {
    torch.quint8: torch.uint8,
    torch.qint8: torch.int8,
    torch.qint32: torch.int32,
    torch.uint8: torch.uint8,
    torch.int8: torch.int8,
    torch.uint16: torch.uint16,
    torch.int16: torch.int16,
    torch.int32: torch.int32,
    torch.float8_e5m2: torch.float8_e5m2,
    torch.float8_e4m3fn: torch.float8_e4m3fn,
}
# Dynamic quantization computes scale and zero point at run time, with one of these ops.
_CHOOSE_QPARAMS = {
    torch.per_tensor_affine: qd.choose_qparams.tensor,
    torch.per_tensor_symmetric: qd.choose_qparams_symmetric.tensor,
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
    """Whether ``node`` calls an observer (or fake-quantize) submodule of ``model``.

    Args:
        model: a ``GraphModule``.
        node: anything; only a ``call_module`` node of an observer gives ``True``.

    Returns:
        ``True`` for an observer call.
    """
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


# --- 1. BatchNorm folding -----------------------------------------------------------------------


def _set_parameter(model: GraphModule, target: str, value: torch.nn.Parameter) -> None:
    owner, _, name = target.rpartition(".")
    model.get_submodule(owner).register_parameter(name, value)


def _fold_one(model: GraphModule, producer: Node, bn: Node) -> None:
    """Fold the batch norm ``bn`` into the conv/linear ``producer`` (its weight and bias)."""
    graph = model.graph
    weight_node = producer.args[1]
    bias_node = producer.args[2] if len(producer.args) > 2 else None
    schema = bn.target._schema.arguments
    bn_args = [  # every argument, defaults filled in: input, weight, bias, mean, var, ...
        bn.kwargs.get(a.name, bn.args[i] if i < len(bn.args) else a.default_value)
        for i, a in enumerate(schema)
    ]
    gamma, beta, mean, var = (_fetch(model, n) for n in bn_args[1:5])
    eps = bn_args[_BATCH_NORM_EPS_INDEX[bn.target]]
    weight, bias = _fetch(model, weight_node), _fetch(model, bias_node)
    if producer.target == aten.linear.default:
        new_weight, new_bias = fuse_linear_bn_weights(weight, bias, mean, var, eps, gamma, beta)
    else:  # a transposed conv keeps its output channels on axis 1 of the weight
        transpose = producer.target in _CONV_TRANSPOSE_OPS
        new_weight, new_bias = fuse_conv_bn_weights(
            weight, bias, mean, var, eps, gamma, beta, transpose=transpose
        )

    _set_parameter(model, weight_node.target, new_weight)
    args = list(producer.args) + [None] * (3 - len(producer.args))
    if bias_node is not None:
        _set_parameter(model, bias_node.target, new_bias)
    else:  # a conv without bias gets one: the folded beta - mean * scale
        _set_parameter(model, weight_node.target + "_bias", new_bias)
        with graph.inserting_before(producer):
            args[2] = graph.get_attr(weight_node.target + "_bias")
        if producer.target != aten.linear.default:  # torchao gives only the conv's a value
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


def _skip_3d_linear(linear: Node) -> bool:
    value = linear.args[0].meta.get("val") if isinstance(linear.args[0], Node) else None
    if isinstance(value, torch.Tensor) and value.ndim > 2:
        # BatchNorm1d on (N, C, L) normalises dim 1, linear mixes the last dim: no folding.
        # torchao's words, so a reader sees the same warning from both.
        warnings.warn(
            f"Not fusing linear+bn for node '{linear.name}': the linear input "
            f"is {value.ndim}-D so Linear and BatchNorm operate on different dimensions",
            stacklevel=1,
        )
        return True
    return False


def fold_batch_norm(model: GraphModule) -> None:
    """Fold each ``conv -> batch_norm`` (and 2-D ``linear -> batch_norm``) into the conv/linear.

    In eval mode BatchNorm is ``y = (x - mean) / sqrt(var + eps) * gamma + beta``, an affine map
    per channel, so it can be baked into the weight and bias before it
    (``torch.nn.utils.fusion.fuse_conv_bn_weights``). The batch-norm node then disappears.
    Convs are folded first (also ``padding="same"`` and transposed convs), then linears; a
    linear on a 3-D input keeps its BatchNorm, with torchao's warning. A BatchNorm after
    anything else stays in the graph and runs in float, as in torchao.

    Args:
        model: an exported ``GraphModule``; edited in place.

    Raises:
        NotImplementedError: one weight feeds two conv/linear + BatchNorm pairs.
    """
    graph = model.graph
    if not any(node.target in _BATCH_NORM_EPS_INDEX for node in graph.nodes):
        return
    for kinds in (_CONV_OPS | _CONV_TRANSPOSE_OPS, {aten.linear.default}):
        folded_weights = set()
        for bn in list(graph.nodes):
            if bn._erased or bn.op != "call_function" or bn.target not in _BATCH_NORM_EPS_INDEX:
                continue
            producer = bn.args[0]
            if not isinstance(producer, Node) or producer.op != "call_function":
                continue
            if producer.target not in kinds:
                continue
            if producer.target == aten.linear.default and _skip_3d_linear(producer):
                continue
            if producer.args[1] in folded_weights:
                raise _unsupported(
                    producer, "a weight shared by two conv/linear + batch norm pairs"
                )
            folded_weights.add(producer.args[1])
            _fold_one(model, producer, bn)
        graph.eliminate_dead_code()
        model.recompile()


# --- 2. From annotations to observers -----------------------------------------------------------


def collect_qspecs(model: GraphModule) -> dict:
    """Every annotated place, in graph order: ``(producer, user)`` edges and output nodes.

    Args:
        model: an annotated ``GraphModule``.

    Returns:
        ``{key: spec}``: the keys are input edges (from ``input_qspec_map``) and nodes (their
        ``output_qspec``); the values are the specs, ``None`` meaning "leave this edge float".

    Raises:
        TypeError: an annotation has a key that is not a ``Node`` or a value that is not a spec.
    """
    qspecs = {}
    for node in model.graph.nodes:
        annotation = node.meta.get(ANNOTATION)
        if annotation is None:
            continue
        for source, qspec in annotation.input_qspec_map.items():
            _check_annotation(node, source, qspec)
            qspecs[(source, node)] = qspec
        if annotation.output_qspec is not None:
            _check_annotation(node, None, annotation.output_qspec)
            qspecs[node] = annotation.output_qspec
    return qspecs


def _check_annotation(node: Node, source, qspec) -> None:
    """A quantizer's mistakes, named: torchao reports them later, or as an AttributeError."""
    where = f"the annotation of node {node.name!r}"
    if source is not None and not isinstance(source, Node):
        inputs = ", ".join(n.name for n in node.all_input_nodes)
        raise TypeError(
            f"{where}: input_qspec_map has the key {source!r} ({type(source).__name__}), but its "
            f"keys must be the Nodes the node reads (here: {inputs}); write "
            "input_qspec_map={node.args[0]: spec}"
        )
    if qspec is not None and not isinstance(qspec, QuantizationSpecBase):
        raise TypeError(
            f"{where}: {qspec!r} is not a quantization spec; use QuantizationSpec, "
            "SharedQuantizationSpec, DerivedQuantizationSpec or FixedQParamsQuantizationSpec "
            "(or None to keep that edge float)"
        )


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

    Args:
        qspecs: the result of :func:`collect_qspecs`.

    Returns:
        ``{key: root key}``; keys with the same root share one observer.

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


def _new_observer(key, qspec, observers: dict):
    if isinstance(qspec, DerivedQuantizationSpec):
        # Its qparams are computed from other observers (e.g. bias scale = input x weight).
        missing = [k for k in qspec.derived_from if k not in observers]
        if missing:
            raise ValueError(
                f"the DerivedQuantizationSpec on node {_key_node(key).name!r} derives from "
                f"{missing}, which no annotation before it observes; annotate those edges first"
            )
        return DerivedObserverOrFakeQuantize.with_args(
            dtype=qspec.dtype,
            derive_qparams_fn=qspec.derive_qparams_fn,
            quant_min=qspec.quant_min,
            quant_max=qspec.quant_max,
            qscheme=qspec.qscheme,
            ch_axis=qspec.ch_axis,
            obs_or_fqs=[observers[k] for k in qspec.derived_from],
        )()
    kwargs = {f.name: getattr(qspec, f.name) for f in dataclasses.fields(qspec)}
    if isinstance(qspec, FixedQParamsQuantizationSpec):  # scale and zero point given
        return FixedQParamsObserver.with_args(**kwargs)()
    if not isinstance(qspec, QuantizationSpec):
        raise _unsupported(_key_node(key), f"the quantization spec {type(qspec).__name__}")
    constructor = kwargs.pop("observer_or_fake_quant_ctr")
    cls = getattr(getattr(constructor, "p", None), "func", constructor)  # with_args(...) wraps it
    if "PerChannel" not in cls.__name__:
        kwargs.pop("ch_axis")  # only per-channel observers take an axis
    return constructor.with_args(**kwargs)()


def create_observers(qspecs: dict, groups: dict) -> dict:
    """One observer per sharing group, made from the spec of the group's first member.

    Args:
        qspecs: the result of :func:`collect_qspecs`.
        groups: the result of :func:`sharing_groups`.

    Returns:
        ``{key: observer or None}``; keys of one group map to the same observer instance.
    """
    observers, by_group = {}, {}
    for key, qspec in qspecs.items():
        group = groups[key]
        if group not in by_group:
            if qspec is None:
                by_group[group] = None
            elif isinstance(qspec, SharedQuantizationSpec):
                by_group[group] = observers[qspec.edge_or_node]
            else:
                by_group[group] = _new_observer(key, qspec, observers)
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
    if _writes_to_buffer(model, user, source):
        return arg  # a buffer an in-place op updates keeps its float value
    if observers.get(source) is observer:
        return arg  # arg is already the producer's output observer: reuse it
    for other in arg.users:  # another user of arg already inserted this very observer
        if is_observer_node(model, other) and model.get_submodule(other.target) is observer:
            return other
    return _insert_observer_after(model, arg, observer)


def _constant_producers(node: Node):
    """The nodes ``node`` is computed from, or ``None`` if it depends on a model input."""
    nodes, frontier = [node], [node]
    while frontier:
        current = frontier.pop()
        for arg in [*current.args, *current.kwargs.values()]:
            if not isinstance(arg, Node):
                continue
            if arg.op == "placeholder":
                return None
            nodes.append(arg)
            if not (arg.op == "call_function" and arg.target is getattr):
                frontier.append(arg)
    return nodes


def _writes_to_buffer(model: GraphModule, user: Node, source: Node) -> bool:
    """Whether ``user`` is an in-place op (``add_``, ``copy_``...) writing into a buffer."""
    schema = getattr(user.target, "_schema", None)
    if user.op != "call_function" or schema is None or not user.args or user.args[0] is not source:
        return False
    alias = schema.arguments[0].alias_info if schema.arguments else None
    if alias is None or not alias.is_write:
        return False
    producers = _constant_producers(source)
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    return producers is not None and any(
        p.op == "get_attr" and str(p.target) in buffers for p in producers
    )


def observe_node(model: GraphModule, node: Node, observers: dict) -> None:
    """Insert the observers one annotated node asks for: its input edges, then its output.

    Args:
        model: the ``GraphModule`` being prepared; edited in place.
        node: an annotated node.
        observers: the result of :func:`create_observers`.

    Raises:
        NotImplementedError: a tensor reaches ``node`` through a keyword argument.
    """
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
    """Insert all observers, annotated node by annotated node in graph order.

    Args:
        model: the ``GraphModule`` being prepared; edited in place.
        observers: the result of :func:`create_observers`.
    """
    for node in list(model.graph.nodes):
        if ANNOTATION in node.meta:
            observe_node(model, node, observers)


def _check_model(model, function: str) -> None:
    if isinstance(model, torch.export.ExportedProgram):
        raise TypeError(
            f"{function} needs the GraphModule of the exported program, got the ExportedProgram "
            "itself; pass torch.export.export(model, args).module()"
        )
    if not isinstance(model, GraphModule):
        raise TypeError(
            f"{function} needs an exported GraphModule, got {type(model).__name__}; "
            "export it first: torch.export.export(model, args).module()"
        )


def _check_quantizer(quantizer) -> None:
    if isinstance(quantizer, type) and issubclass(quantizer, Quantizer):
        raise TypeError(
            f"prepare needs a quantizer instance, got the class {quantizer.__name__}; "
            f"write {quantizer.__name__}()"
        )
    if not isinstance(quantizer, Quantizer):
        hint = (
            " (torch.ao.quantization's quantizers are the old API: use torchao's)"
            if type(quantizer).__module__.startswith("torch.ao")
            else ""
        )
        raise TypeError(
            f"prepare needs a torchao Quantizer (torchao.quantization.pt2e.quantizer.Quantizer),"
            f" got {type(quantizer).__name__}{hint}; e.g. CourseQuantizer() or "
            "X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())"
        )


def prepare(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Hand-written ``prepare_pt2e``: fold batch norm, annotate, insert observers.

    Args:
        model: ``torch.export.export(model, args).module()`` of a model in eval mode.
        quantizer: an instance of a torchao ``Quantizer`` (its annotations decide everything).

    Returns:
        The observed ``GraphModule``, ready for calibration and for :func:`convert` (or
        torchao's ``convert_pt2e``).

    Raises:
        TypeError: ``model`` is not an exported ``GraphModule``, ``quantizer`` is not a torchao
            ``Quantizer`` instance, or an annotation is malformed (the message names the node).
        NotImplementedError: the graph has something listed in this module's docstring.
    """
    _check_model(model, "prepare")
    _check_quantizer(quantizer)
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
    """M00-4 step 4: replace one observer call by the ops that do what it measured.

    * static int (and float8): ``quantize -> dequantize`` with its qparams. Per-tensor scale and
      zero point become Python numbers in the arguments; per-channel ones become buffers
      (``<module>_scale_N``, ``<module>_zero_point_N``) read by ``get_attr``;
    * dynamic: ``choose_qparams`` computes scale and zero point from each input at run time,
      then ``quantize -> dequantize`` (their ``.tensor`` variants) use them;
    * float16: a round trip ``to float16 -> to float32``;
    * any other dtype (a float32 observer): the observer is simply removed.

    Args:
        model: the prepared ``GraphModule``; edited in place.
        node: the ``call_module`` node of one observer.
        scopes: node name -> (module name, class), as :func:`prepare` saved them.

    Raises:
        NotImplementedError: the observer converts itself (it has a ``convert`` method).
    """
    graph = model.graph
    observer = model.get_submodule(node.target)
    if hasattr(observer, "convert"):
        raise _unsupported(node, f"an observer that converts itself ({type(observer).__name__})")
    dtype = observer.dtype
    dynamic = getattr(observer, "is_dynamic", False)
    source = node.args[0]
    out_dtype = source.meta["val"].dtype if "val" in source.meta else torch.float32
    dq_kwargs = {} if out_dtype == torch.float32 else {"out_dtype": out_dtype}
    with graph.inserting_before(node):
        if dtype in _STATIC_DTYPE and not dynamic:
            quantize, dequantize, qparams = _static_qparams(model, observer, source, scopes)
        elif dynamic:
            quantize, dequantize = qd.quantize_per_tensor.tensor, qd.dequantize_per_tensor.tensor
            qparams = _dynamic_qparams(graph, observer, source)
        elif dtype == torch.float16:
            half = graph.call_function(qd.convert_element_type.no_fuse, (source, torch.float16))
            back = graph.call_function(qd.convert_element_type.no_fuse, (half, torch.float))
            node.replace_all_uses_with(back)
            graph.erase_node(node)
            return
        else:  # nothing to convert (e.g. float32): the observer only watched
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            return
        q = graph.call_function(quantize, (source, *qparams))
        dq = graph.call_function(dequantize, (q, *qparams), dq_kwargs)
    node.replace_all_uses_with(dq)
    graph.erase_node(node)


def _static_qparams(model: GraphModule, observer, source: Node, scopes: dict):
    scale, zero_point = observer.calculate_qparams()
    dtype = _STATIC_DTYPE[observer.dtype]
    if observer.qscheme in (torch.per_channel_affine, torch.per_channel_symmetric):
        module_path = scopes.get(source.name, ("", None))[0]
        qparams = (
            _buffer_node(model, module_path + "_scale_", scale),
            _buffer_node(model, module_path + "_zero_point_", zero_point),
            int(observer.ch_axis),
            observer.quant_min,
            observer.quant_max,
            dtype,
        )
        return qd.quantize_per_channel.default, qd.dequantize_per_channel.default, qparams
    qparams = (float(scale), int(zero_point), observer.quant_min, observer.quant_max, dtype)
    return qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default, qparams


def _dynamic_qparams(graph, observer, source: Node) -> tuple:
    dtype = _STATIC_DTYPE.get(observer.dtype, observer.dtype)
    if dtype not in (torch.uint8, torch.int8):
        raise _unsupported(source, f"dynamic quantization to {dtype} (uint8 and int8 only)")
    qmin, qmax = observer.quant_min, observer.quant_max
    eps = getattr(observer, "eps", torch.finfo(torch.float32).eps)
    qscheme = getattr(observer, "qscheme", torch.per_tensor_affine)
    choose = graph.call_function(_CHOOSE_QPARAMS[qscheme], (source, qmin, qmax, eps, dtype))
    scale = graph.call_function(operator.getitem, (choose, 0))
    zero_point = graph.call_function(operator.getitem, (choose, 1))
    return (scale, zero_point, qmin, qmax, dtype)


def _give_own_copy(graph, dq: Node, user: Node) -> None:
    with graph.inserting_after(dq):
        copy = graph.node_copy(dq)
    user.args = map_arg(user.args, lambda n: copy if n is dq else n)
    user.kwargs = map_arg(user.kwargs, lambda n: copy if n is dq else n)


def _is_dynamic_dequantize(dq: Node) -> bool:
    """``choose_qparams -> getitem -> quantize -> dq``: torchao leaves these shared."""
    q = dq.args[0]
    if not (isinstance(q, Node) and q.op == "call_function" and q.target in _QUANTIZE_OPS):
        return False
    item = q.args[1]
    return (
        isinstance(item, Node)
        and item.target is operator.getitem
        and isinstance(item.args[0], Node)
        and item.args[0].target == qd.choose_qparams.tensor
    )


def duplicate_shared_dequantize(model: GraphModule) -> None:
    """Give each annotated user of a shared dequantize its own copy.

    A backend fuses ``dequantize -> op -> quantize`` into one integer op, which needs the
    dequantize to belong to that op alone. Users without an annotation keep the original.
    Dynamic quantization's dequantize (affine ``choose_qparams``) stays shared, as in torchao.

    Args:
        model: a converted ``GraphModule``; edited in place.
    """
    graph = model.graph
    for dq in list(graph.nodes):
        if dq.op != "call_function" or dq.target not in _DEQUANTIZE_OPS:
            continue
        users = [u for u in dq.users if getattr(u.target, "overloadpacket", u.target) not in _SYM]
        if len(users) <= 1 or _is_dynamic_dequantize(dq):
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


class _Unknown:
    """The value of a node that depends on a model input: not known before run time."""


_UNKNOWN = _Unknown()
_RANDOM = torch.Tag.nondeterministic_seeded


def _mutated_buffers(model: GraphModule) -> set:
    """Nodes a ``copy_``/``put_`` writes into a buffer through: their users must not be folded."""
    buffers = {name for name, _ in model.named_buffers()}
    mutated = set()
    for node in model.graph.nodes:
        name = str(node.target)
        if node.op != "call_function" or not hasattr(node.target, "_schema"):
            continue
        if ("copy_" in name or "put_" in name) and node.args and isinstance(node.args[0], Node):
            producers = _constant_producers(node.args[0])
            if producers is not None and any(
                p.op == "placeholder" or (p.op == "get_attr" and str(p.target) in buffers)
                for p in producers
            ):
                mutated.update(producers)
    return mutated


def _known_value(model: GraphModule, node: Node, env: dict, mutated: set):
    """What ``node`` computes from constants alone, or ``_UNKNOWN``.

    The rules of torchao's constant folder: a node is computed when all its inputs are known,
    except random ops, constructors without tensor inputs (``zeros``...), higher-order ops,
    and, for tensor results, dequantize ops and readers of a mutated buffer. Computing runs
    the op, so an in-place op on a buffer really updates it here, as it does in torchao.
    """
    if node.op == "get_attr":
        return _fetch(model, node)
    if node.op in ("placeholder", "output"):
        return _UNKNOWN
    args, kwargs = map_arg((node.args, node.kwargs), lambda n: env[n])
    inputs = pytree.tree_leaves((args, kwargs))
    if any(value is _UNKNOWN for value in inputs):
        return _UNKNOWN
    target = node.target
    if (
        target == aten._efficientzerotensor.default
        or not any(isinstance(value, torch.Tensor) for value in inputs)
        or (
            isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags
        )
        or isinstance(target, torch._ops.HigherOrderOperator)
    ):
        return _UNKNOWN
    if node.op == "call_module":
        value = model.get_submodule(target)(*args, **kwargs)
    elif node.op == "call_method":
        value = getattr(args[0], target)(*args[1:], **kwargs)
    else:
        value = target(*args, **kwargs)
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        if target in _NEVER_FOLDED or any(isinstance(a, Node) and a in mutated for a in node.args):
            return _UNKNOWN
    return value


def fold_weight_quantize(model: GraphModule) -> None:
    """Run each ``quantize`` whose input is a constant now and keep its result as a constant.

    This is ``fold_quantize=True``: ``get_attr(weight) -> quantize -> dequantize`` becomes
    ``get_attr(_frozen_paramN) -> dequantize``, also when the weight is computed first
    (``weight -> t() -> quantize``). The ``get_attr`` keeps the quantize node's name;
    ``get_attr`` nodes nobody reads any more are removed (with their attribute, if it sits on
    the model itself). A buffer that an in-place op updates is not a constant.

    Args:
        model: a converted ``GraphModule``; edited in place.
    """
    graph = model.graph
    mutated = _mutated_buffers(model)
    env, folded = {}, {}
    replaced_uses, last_use = {}, {}
    for node in graph.nodes:  # which node reads each node last (the output does not count)
        for arg in node.all_input_nodes:
            if node.op != "output":
                last_use[arg] = node
    with torch.utils._python_dispatch._disable_current_modes():
        for node in graph.nodes:
            env[node] = value = _known_value(model, node, env, mutated)
            if node.op == "get_attr" or not isinstance(value, torch.Tensor):
                continue
            if value.device.type == "meta":
                continue
            folded[node] = value
            for arg in pytree.tree_leaves((node.args, node.kwargs)):
                if isinstance(arg, Node):
                    replaced_uses[arg] = replaced_uses.get(arg, 0) + 1
            for arg in node.all_input_nodes:  # an input only folded nodes read need no constant
                if last_use.get(arg) is node and replaced_uses.get(arg, 0) == len(arg.users):
                    folded.pop(arg, None)
    for q, value in folded.items():
        if q.target in _QUANTIZE_OPS:
            replace_with_constant(model, q, value)
            maybe_set_is_frozen_param(value)
    remove_unused_constants(model)
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

    Raises:
        TypeError: ``model`` is not a ``GraphModule``.
        ValueError: ``model`` never went through ``prepare`` (or ``prepare_pt2e``).
        NotImplementedError: the graph has something listed in this module's docstring.
    """
    _check_model(model, "convert")
    prepared = model.meta.get(_PREPARED)
    if prepared is None:
        raise ValueError(
            "convert needs a prepared and calibrated model, but this GraphModule was never "
            "prepared; run model = prepare(model, quantizer), feed it calibration data, then "
            "convert(model)"
        )
    original_meta = model.meta
    _check_graph(model)
    scopes = prepared.node_name_to_scope
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
