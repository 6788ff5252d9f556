"""The classifier: ``coverage()`` prepares a copy of an exported graph and reads each op's
annotations, backend-neutrally: int8 static, dynamic, fused or shared, or float. Why an op
stays float is the quantizer's rules' to say: ``Rules`` here says only which input is not
quantized; ``common.backends.<name>.rules`` hold the rules the course knows, their words
beside them (``_rules_for`` picks them by the quantizer's class).
"""

import contextlib
import copy
import importlib
import logging
import warnings

import torch

from common.coverage.ops import _BINARY, _COMPUTE_KINDS, COMPUTE_OPS, OPS, aten
from common.coverage.report import Coverage, OpCoverage
from common.coverage.words import _LIST, _Text, _text

_KEY = "quantization_annotation"
_INTEGER = {torch.int8, torch.uint8, torch.int16, torch.int32}


def coverage(
    model: torch.fx.GraphModule, quantizer, *, label: str | None = None, every_op: bool = False
) -> Coverage:
    """Run ``prepare_pt2e`` on a copy of ``model`` and report every compute op: int8 or float, why.

    Each op of ``COMPUTE_OPS`` in the graph is int8 when the quantizer's annotation
    (``node.meta["quantization_annotation"]``) gives each input it computes on (activation and
    weight; both operands of add, mul, matmul; q, k, v of attention) an integer quantization
    spec, or when the quantizer annotated the output of the node that produces that input (an
    integer observer sits on the edge, or before a flatten/view/reshape: ``OpenVINOQuantizer``
    annotates this way; for an op without weights, only when its output is quantized again;
    never for attention, which only its own annotation makes int8: between int8 linears it
    computes in float on their dequantized outputs), or when that input comes straight from
    the int8 conv or linear it is fused into (x86's conv + add).
    A float op gets the reason that this quantizer's rules give for it, for
    ``X86InductorQuantizer`` and ExecuTorch's ``XNNPACKQuantizer``: op not in the
    quantizer's set, a linear recorded inside a module that is not an ``nn.Linear``
    (``nn.MultiheadAttention``), ``matmul`` only on request, a broadcast ``mul``, an ``add``
    with no conv or linear to fuse into, a dynamic config that covers linears and convs only,
    a ``None`` config. For other quantizers, float ops say only which input is not quantized.

    With ``every_op=True`` the report covers every op of ``OPS``: also pooling, cat, pad,
    slices, layout ops, norms, activations, resampling, reductions, embeddings, recurrent
    layers, elementwise ops, a KV cache's writes. Such an op is ``int8 fused`` when it runs
    inside the int8 conv, linear or add before it (a ReLU or GELU the quantizer annotated as
    that pattern's end), ``int8 shared`` when the quantizer gave it int8 input and output with
    its input's qparams (max-pool, cat, XNNPACK's propagated ops), ``int8 static`` when int8 in
    and out with qparams of its own, else ``float`` with the quantizer's rule: for x86, a
    propagation op whose input is float, an activation that x86 fuses only after certain convs
    and linears, an op x86 has no int8 form of; for XNNPACK, an op no pattern covers, a
    pass-through op after a float output, and an op XNNPACK's partitioner refuses (its
    ``check_constraints``, as ``mean`` over anything but H and W of a 4-D tensor with
    ``keepdim``), which ExecuTorch's portable kernels then run in float even where the quantizer
    annotated it.

    When ``prepare_pt2e`` puts no observer in the graph, every report the result prints says
    first that nothing was quantized (``Coverage.nothing_quantized``), and why where the graph
    shows it: a ``forward`` under ``@torch.no_grad()`` exports as a
    ``wrap_with_set_grad_enabled`` subgraph, which ``prepare_pt2e`` does not annotate.

    Args:
        model: an exported graph, ``torch.export.export(model, args).module()``; not changed.
        quantizer: a PT2E quantizer, configured (``set_global``).
        label: the quantizer's name in tables; by default its class name, plus ``dynamic``
            when its global config quantizes activations dynamically.
        every_op: report every op of ``OPS``, not only ``COMPUTE_OPS``.

    Returns:
        Coverage: one ``OpCoverage`` per compute op (per op of ``OPS`` with ``every_op``), in
        graph order.

    Raises:
        TypeError: if ``model`` is not a ``torch.fx.GraphModule`` or ``quantizer`` has no
            ``annotate``.
        ValueError: if the quantizer cannot annotate the graph because a module is called at
            several places (a reused ``nn.ReLU``); the message names the modules and the fix.

    >>> from common.pt2e import export_module, x86_quantizer
    >>> gm = export_module(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.ones(2, 4),))
    >>> coverage(gm, x86_quantizer()).summary()
    'X86InductorQuantizer: 1 of 1 compute ops int8 (linear 1/1)'
    """
    with _quiet():
        return _coverage(model, quantizer, label=label, every_op=every_op)


@contextlib.contextmanager
def _quiet():
    """``common.pt2e.quiet()`` for the time of one call: the stack's known import and log
    noise stays silent while ``coverage`` prepares, and the process's warning filters and
    loggers are as they were after it (a query changes no state)."""
    from common.pt2e import _KNOWN_LOG_NOISE, quiet

    loggers = [logging.getLogger(name) for name in _KNOWN_LOG_NOISE]
    before = [list(logger.filters) for logger in loggers]
    with warnings.catch_warnings():
        quiet()
        try:
            yield
        finally:
            for logger, filters in zip(loggers, before, strict=True):
                for added in [f for f in logger.filters if f not in filters]:
                    logger.removeFilter(added)


def _coverage(model, quantizer, *, label: str | None, every_op: bool) -> Coverage:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    if not isinstance(model, torch.fx.GraphModule):
        raise TypeError(
            f"coverage reads an exported graph, got {type(model).__name__}; pass "
            "torch.export.export(model, args).module() (common.pt2e.export_module)"
        )
    if not callable(getattr(quantizer, "annotate", None)):
        raise TypeError(
            f"{type(quantizer).__name__} is not a PT2E quantizer (it has no annotate); pass e.g. "
            "common.pt2e.x86_quantizer()"
        )
    wanted = _compute_nodes(model, every_op=every_op)
    try:
        prepared = prepare_pt2e(copy.deepcopy(model), quantizer)
    except ValueError as error:
        if "more than one output node" not in str(error):
            raise
        raise ValueError(_reused_message(model, quantizer, error)) from error
    rules = _rules_for(quantizer, prepared)
    nodes = {node.name: node for node in prepared.graph.nodes}
    originals = {node.name: node for node in model.graph.nodes}
    ops = []
    for name, kind in wanted:
        node = nodes.get(name)
        if node is None:  # removed by prepare (none of COMPUTE_OPS is, on the course's models)
            continue
        module, module_type = _module(node)
        if kind in _COMPUTE_KINDS:
            int8, mode, said, specs = _classify(prepared, node, kind, rules)
        else:
            int8, mode, said, specs = _classify_other(prepared, node, kind, rules)
        refusal = rules.refusal(originals[name], f"int8 {mode}" if int8 else "")
        if refusal is not None:  # the backend runs it in float all the same
            int8, mode, said, specs = False, "", refusal, ()
        op = node.target._overloadpacket.__name__
        reason = said.render("en")
        ops.append(OpCoverage(name, op, kind, module, module_type, int8, mode, reason, specs, said))
    nothing = _nothing_quantized(prepared)
    if label:
        return Coverage(label, tuple(ops), every_op=every_op, nothing_quantized=nothing)
    said = _label(quantizer)
    return Coverage(
        said.render("en"), tuple(ops), said, every_op=every_op, nothing_quantized=nothing
    )


def _nothing_quantized(graph: torch.fx.GraphModule) -> _Text | None:
    """Why a prepared (or converted) graph quantizes nothing: no observer, fake quantize or
    quantize node in it; None when it holds one.

    A ``forward`` under ``@torch.no_grad()`` exports as one ``wrap_with_set_grad_enabled``
    node calling a subgraph (``torch/_export/passes/replace_set_grad_with_hop_pass.py``);
    ``prepare_pt2e`` annotates the top-level graph and goes into the subgraphs of ``scan`` and
    ``while_loop`` only, so nothing in it is quantized.
    """
    nodes = graph.graph.nodes
    if any(_is_observer(node) or _is_quantize(node) for node in nodes):
        return None
    wrapped = tuple(
        node.args[1].target if isinstance(node.args[1], torch.fx.Node) else node.name
        for node in nodes
        if node.op == "call_function"
        and node.target is torch.ops.higher_order.wrap_with_set_grad_enabled
    )
    if wrapped:
        return _text("nothing quantized: no_grad", nodes=wrapped)
    return _text("nothing quantized")


def _is_quantize(node: torch.fx.Node) -> bool:
    """A quantize node of a converted graph (``quantize_per_tensor``, ``quantize_affine``)."""
    packet = getattr(node.target, "_overloadpacket", None) if node.op == "call_function" else None
    return packet is not None and packet.__name__.startswith("quantize_")


def _compute_nodes(model: torch.fx.GraphModule, *, every_op: bool) -> list[tuple[str, str]]:
    table = OPS if every_op else COMPUTE_OPS
    found = []
    for node in model.graph.nodes:
        kind = table.get(node.target) if node.op == "call_function" else None
        if node.target in _BINARY and not all(_is_tensor(a) for a in node.args[:2]):
            continue
        if kind:
            found.append((node.name, kind))
    return found


def _is_tensor(arg) -> bool:
    return isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)


def _module(node: torch.fx.Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1].strip("'>")
    return path, name


def _label(quantizer) -> _Text:
    name = type(quantizer).__name__
    config = getattr(quantizer, "global_config", None)
    activation = getattr(config, "input_activation", None)
    return _text(
        "label dynamic" if getattr(activation, "is_dynamic", False) else "label", name=name
    )


def _reused_message(model, quantizer, error) -> str:
    calls: dict[str, set] = {}  # module path -> the keys of its calls ("...act", "...act@1")
    types = {}
    for node in model.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if node.op == "call_function" and stack:
            key, (path, _) = list(stack.items())[-1]
            calls.setdefault(path, set()).add(key)
            types[path] = _module(node)[1]
    reused = [f"'{p}' ({types[p]}, {len(k)} calls)" for p, k in calls.items() if len(k) > 1]
    return (
        f"{type(quantizer).__name__} could not annotate this graph ({error}): its fusion "
        "patterns find modules through the nn_module_stack a non-strict export records, one "
        f"partition per module, and these modules are called at several places: "
        f"{', '.join(reused) or 'none found'}. Export with "
        "torch.export.export(model, args, strict=True) (its source_fn_stack names each call), "
        "or give each call its own module"
    )


def _annotation(node):
    return node.meta.get(_KEY)


def _is_observer(arg) -> bool:
    return (
        isinstance(arg, torch.fx.Node)
        and arg.op == "call_module"
        and "activation_post_process" in str(arg.target)
    )


def _unobserved(arg):
    """The producer of an input, looking through an observer prepare inserted."""
    while _is_observer(arg):
        arg = arg.args[0]
    return arg


def _computed_inputs(node: torch.fx.Node, kind: str, *, observed: bool = False) -> list:
    """The inputs the op computes on; as the prepared graph has them (observers included)
    when ``observed``, else their producers."""
    args = list(node.args) if observed else [_unobserved(a) for a in node.args]
    if kind in ("conv", "linear"):
        return args[:2]
    if kind == "attention":
        return args[:3]
    if node.target in (aten.addmm.default, aten.baddbmm.default):
        return args[1:3]
    return [a for a in args[:2] if _is_tensor(_unobserved(a))]


def _spec_text(spec) -> str:
    """``u8 per-tensor affine``: a ``QuantizationSpec``'s or an observer's dtype and qscheme."""
    from torchao.quantization.pt2e.quantizer import QuantizationSpecBase

    if isinstance(spec, QuantizationSpecBase) and not hasattr(spec, "qscheme"):
        return "shared"
    dtype = {torch.int8: "s8", torch.uint8: "u8"}.get(spec.dtype, str(spec.dtype).split(".")[-1])
    scheme = str(spec.qscheme).split(".")[-1]  # torch.per_channel_symmetric
    scheme = scheme.replace("per_tensor_", "per-tensor ").replace("per_channel_", "per-channel ")
    return f"{dtype} {scheme}" + (" dynamic" if getattr(spec, "is_dynamic", False) else "")


_RESHAPES = {aten.flatten.using_ints, aten.view.default, aten.reshape.default}


def _through_reshapes(arg):
    """Back through flatten/view/reshape, which move int8 values without changing them (a
    pooled, observed output flattened for a linear)."""
    while isinstance(arg, torch.fx.Node) and arg.op == "call_function" and arg.target in _RESHAPES:
        arg = arg.args[0]
    return arg


def _requantized(prepared, node) -> bool:
    """The op's output, or that of the one ReLU after it, goes through an integer observer."""
    users = list(node.users)
    if len(users) == 1 and users[0].target in (aten.relu.default, aten.relu_.default):
        users += list(users[0].users)
    return any(_integer_observer(prepared, user) is not None for user in users)


def _integer_observer(prepared, arg):
    """The observer prepare put on this edge, when it quantizes to an integer dtype."""
    if not _is_observer(arg):
        return None
    observer = prepared.get_submodule(arg.target)
    return observer if getattr(observer, "dtype", None) in _INTEGER else None


def _is_fused_into(producer, node) -> bool:
    """``producer`` is a conv or linear annotated as part of a pattern ending later (x86's
    conv + add): its output is not quantized, its value never leaves the int8 kernel."""
    if not isinstance(producer, torch.fx.Node) or COMPUTE_OPS.get(producer.target) not in (
        "conv",
        "linear",
    ):
        return False
    annotation = _annotation(producer)
    return (
        annotation is not None
        and bool(annotation.input_qspec_map)
        and annotation.output_qspec is None
        and not getattr(annotation, "_is_output_of_quantized_pattern", False)
        and list(producer.users) == [node]
    )


def _classify(prepared, node, kind, rules) -> tuple[bool, str, _Text, tuple]:
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    annotation = _annotation(node)
    specs = annotation.input_qspec_map if annotation is not None else {}
    raw = _computed_inputs(node, kind, observed=True)
    if kind == "attention" and not specs:
        # As for the ops beyond COMPUTE_OPS, only its own annotation makes it int8: q, k and v
        # quantized as the outputs of int8 linears, and its output quantized for the next one,
        # leave it float between them (XNNPACK lowers it to float bmm and softmax, OpenVINO
        # runs it in bf16 or f32: M07-4).
        if annotation is not None and annotation.output_qspec is not None:
            return False, "", _text("output only"), ()  # OpenVINOQuantizer: for the op after it
        return False, "", rules(node, kind, annotation, [_unobserved(a) for a in raw]), ()
    # An input not annotated as this op's input is quantized all the same when the quantizer
    # annotated its producer's output (an integer observer on the edge). An op without weights
    # then computes in int8 only when its output is quantized again, as a backend fuses
    # dq -> op [-> relu] -> q; else it computes in float on values an earlier op quantized.
    edges_count = kind in ("conv", "linear") or _requantized(prepared, node)
    missing, fused, texts, roles, dynamic = [], [], [], [], False
    for index, edge in enumerate(raw):
        arg = _unobserved(edge)
        role = "weight" if kind in ("conv", "linear") and index == 1 else "activation"
        spec = specs.get(arg)
        if not isinstance(spec, QuantizationSpec) and (edges_count or spec is not None):
            # the observer on the edge says what a shared spec or a producer's output spec is
            spec = _integer_observer(prepared, _through_reshapes(edge)) or spec
        if spec is None:
            (fused if _is_fused_into(arg, node) else missing).append(arg)
            continue
        if hasattr(spec, "dtype"):
            if spec.dtype not in _INTEGER:
                missing.append(arg)
                continue
            dynamic = dynamic or getattr(spec, "is_dynamic", False)
        texts.append(_spec_text(spec))
        roles.append((role, texts[-1]))
    if kind == "add" and fused and missing and not texts and _annotated_empty(annotation):
        # x86's linear + add: the add runs as the qlinear's post-op, and x86 puts no
        # quantize before its extra input ("accuracy issues", _annotate_linear_binary_unary)
        names = tuple(a.name for a in fused)
        extra = _LIST["en"].join(a.name for a in missing if isinstance(a, torch.fx.Node))
        return True, "fused", _text("fused, extra input float", nodes=names, extra=extra), ()
    if not missing and texts:
        mode = "fused" if fused else "dynamic" if dynamic else "static"
        if fused:
            detail = _text("int8 fused", specs=tuple(texts), nodes=tuple(a.name for a in fused))
        else:
            detail = _text("int8", specs=tuple(texts))
        return True, mode, detail, tuple(roles)
    return False, "", rules(node, kind, annotation, missing), ()


def _annotated_empty(annotation) -> bool:
    """Annotated as part of a pattern, with no spec of its own (x86's linear + add's add)."""
    return (
        annotation is not None
        and getattr(annotation, "_annotated", False)
        and not annotation.input_qspec_map
        and annotation.output_qspec is None
    )


def _fused_root(node):
    """The int8 conv, linear, add or mul whose kernel runs ``node`` as a post-op, or None.

    A quantizer annotates a fusion pattern (x86's conv + ReLU, linear + GELU, linear + add +
    ReLU; XNNPACK's conv + ReLU, add + ReLU) by quantizing the first op's inputs and the last
    op's output, and nothing between: each op after the first is annotated, and the op before
    it has no output spec and no other user.
    """
    annotation = _annotation(node)
    if annotation is None or not getattr(annotation, "_annotated", False):
        return None
    if annotation.input_qspec_map and node.target not in COMPUTE_OPS:
        return None  # an op quantized on its own
    for producer in node.args[:2]:
        if (
            not isinstance(producer, torch.fx.Node)
            or producer.op != "call_function"
            or list(producer.users) != [node]
        ):
            continue
        before = _annotation(producer)
        if (
            before is None
            or before.output_qspec is not None
            or getattr(before, "_is_output_of_quantized_pattern", False)
        ):
            continue
        if before.input_qspec_map and COMPUTE_OPS.get(producer.target) in _FUSING_KINDS:
            return producer
        root = _fused_root(producer)
        if root is not None:
            return root
    return None


_FUSING_KINDS = ("conv", "linear", "add", "mul")


def _value_inputs(node) -> list:
    """The inputs an op of ``OPS`` computes on, as the prepared graph has them: cat's tensors,
    both operands of a binary op, else the first argument."""
    if node.target in (aten.cat.default, aten.stack.default) or (
        hasattr(aten, "concat") and node.target == aten.concat.default
    ):
        return list(node.args[0])
    if node.target in _BINARY:
        return [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
    return [a for a in node.args[:1] if isinstance(a, torch.fx.Node)]


def _classify_other(prepared, node, kind, rules) -> tuple[bool, str, _Text, tuple]:
    """``_classify`` for an op of ``OPS`` beyond ``COMPUTE_OPS``: fused, shared, static, float."""
    from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

    root = _fused_root(node)
    if root is not None:
        said = _text("post-op", root=root.name, root_op=root.target._overloadpacket.__name__)
        return True, "fused", said, ()
    annotation = _annotation(node)
    edges = _value_inputs(node)
    observers = [_integer_observer(prepared, edge) for edge in edges]
    if annotation is not None and annotation.input_qspec_map:
        outputs = [o for o in (_integer_observer(prepared, u) for u in node.users) if o]
        if edges and all(o is not None for o in observers) and outputs:
            specs = [*annotation.input_qspec_map.values(), annotation.output_qspec]
            shared = any(isinstance(spec, SharedQuantizationSpec) for spec in specs)
            text = _spec_text(observers[0])
            dynamic = getattr(observers[0], "is_dynamic", False)
            mode = "shared" if shared else "dynamic" if dynamic else "static"
            said = _text("int8 shared" if shared else "int8", specs=(text,))
            return True, mode, said, (("activation", text),)
    missing = [_unobserved(e) for e, o in zip(edges, observers, strict=True) if o is None]
    if annotation is not None and not annotation.input_qspec_map and annotation.output_qspec:
        return False, "", _text("output only"), ()  # OpenVINOQuantizer: for the op after it
    return False, "", rules(node, kind, annotation, missing), ()


class Rules:
    """What a quantizer's rules say of the ops it left float; what the backend that runs the
    quantized program refuses.

    This default, for a quantizer the course has no rules for, says which input is not
    quantized and refuses nothing. ``common.backends.x86.rules`` and
    ``common.backends.xnnpack.rules`` subclass it with their quantizer's rules and words.
    """

    def __init__(self, quantizer, prepared):
        self.quantizer = quantizer

    def __call__(self, node, kind, annotation, missing) -> _Text:
        """Why ``node`` (of the prepared graph), of ``kind``, stays float: ``annotation`` is
        its annotation (or None), ``missing`` the inputs it computes on that are not quantized.
        """
        return _generic_reason(node, kind, annotation, missing)

    def refusal(self, node, status: str) -> _Text | None:
        """Why the backend runs ``node`` (of the exported graph) in float all the same, its
        ``status`` as read so far (``int8 static``; ``""``: float); None: it does not refuse."""
        return None


#: The rules the course knows, by the module that defines the quantizer's class: the module
#: of ``common.backends`` that holds them (its ``RULES``, a subclass of ``Rules``).
_RULES = {
    "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer": "common.backends.x86.rules",
    "executorch.backends.xnnpack.quantizer": "common.backends.xnnpack.rules",
}


def _rules_for(quantizer, prepared) -> Rules:
    """The rules of ``quantizer``'s backend, or ``Rules`` for a quantizer the course has none of."""
    module = type(quantizer).__module__
    for prefix, home in _RULES.items():
        if module.startswith(prefix):
            return importlib.import_module(home).RULES(quantizer, prepared)
    return Rules(quantizer, prepared)


def _generic_reason(node, kind, annotation, missing) -> _Text:
    if annotation is None:
        return _text("not annotated")
    names = tuple(a.name if isinstance(a, torch.fx.Node) else repr(a) for a in missing)
    return _text("no integer spec", nodes=names)


def _op_name(node) -> str:
    """``conv2d`` for a call of aten.conv2d; the node's kind (``placeholder``) otherwise."""
    if node.op == "call_function" and hasattr(node.target, "_overloadpacket"):
        return node.target._overloadpacket.__name__
    return node.op
