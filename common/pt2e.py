"""Exporting models for the lessons, counting and finding nodes in their graphs, frozen constants
in them, and silencing the stack's known import noise."""

import difflib
import logging
import types
import warnings
from collections import Counter

import torch
from torch import nn

__all__ = [
    "calibrate",
    "export_module",
    "node_named",
    "op_counts",
    "quiet",
    "remove_unused_constants",
    "replace_with_constant",
    "x86_quantizer",
]


def export_module(model: nn.Module, args: tuple) -> torch.fx.GraphModule:
    """Export ``model`` with ``torch.export`` and return the graph as a ``GraphModule``.

    This is ``torch.export.export(model, args).module()``, the form PT2E quantizes.

    Args:
        model: the ``nn.Module`` to export, usually in eval mode.
        args: a tuple of example inputs, e.g. ``example_inputs(4)``.

    Returns:
        torch.fx.GraphModule: the exported graph, with parameters read by ``get_attr`` nodes.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module`` or ``args`` is not a tuple.
        RuntimeError: if ``torch.export`` cannot trace the model; the message gives its first
            line and what to check (the original error is chained).

    >>> from common.models import example_inputs, get_model
    >>> gm = export_module(get_model("conv_relu"), example_inputs(2))
    >>> [n.name for n in gm.graph.nodes if n.op == "call_function"]
    ['conv2d', 'relu']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"export_module needs an nn.Module, got {type(model).__name__}; "
            "wrap a function in an nn.Module whose forward calls it"
        )
    if not isinstance(args, tuple):
        raise TypeError(
            f"export_module needs the example inputs as a tuple, got {type(args).__name__}; "
            "write (x,) for a single input"
        )
    try:
        program = torch.export.export(model, args)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(
            f"torch.export could not trace {type(model).__name__}: {first}\n"
            "Check that forward() runs eagerly on these inputs, avoid Python control flow "
            "on tensor values (use torch.cond), and see the full error above."
        ) from e
    return program.module()


def _graph_of(gm, caller: str) -> torch.fx.Graph:
    graph = getattr(gm, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        raise TypeError(
            f"{caller} needs a torch.fx.GraphModule, got {type(gm).__name__}; "
            "export the model first: export_module(model, args)"
        )
    return graph


def _op_name(target) -> str:
    if isinstance(target, types.FunctionType):  # str() would give its address
        return f"{target.__module__}.{target.__qualname__}"
    return str(target).removeprefix("quantized_decomposed.")


def op_counts(gm: torch.fx.GraphModule) -> Counter:
    """How many ``call_function`` nodes of ``gm`` call each operator.

    An operator is named as ``str(node.target)`` writes it: namespace, op and overload
    (``aten.conv2d.default``, ``onednn.qconv_pointwise.default``), or ``<built-in function
    getitem>``; except the q/dq ops, written without their ``quantized_decomposed.``
    namespace (``quantize_per_tensor.default``), and a Python function, by its module and
    name (``str`` would give its address).

    Args:
        gm: a ``GraphModule`` (an ``ExportedProgram`` works too).

    Returns:
        collections.Counter: operator name -> number of nodes; a missing name counts 0.

    Raises:
        TypeError: if ``gm`` has no ``torch.fx`` graph (export the model first).

    >>> from common.models import example_inputs, get_model
    >>> gm = export_module(get_model("conv_relu"), example_inputs(2))
    >>> op_counts(gm)
    Counter({'aten.conv2d.default': 1, 'aten.relu.default': 1})
    >>> op_counts(gm)["quantize_per_tensor.default"]
    0
    """
    graph = _graph_of(gm, "op_counts")
    return Counter(_op_name(node.target) for node in graph.nodes if node.op == "call_function")


def node_named(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    """The node of ``gm`` called ``name``, the name ``print(gm.graph)`` shows.

    Args:
        gm: a ``GraphModule`` (an ``ExportedProgram`` works too).
        name: a node's name, e.g. ``"conv2d"``.

    Returns:
        torch.fx.Node: that node.

    Raises:
        TypeError: if ``gm`` has no ``torch.fx`` graph (export the model first).
        ValueError: if no node has that name; the message lists the closest names.

    >>> from common.models import example_inputs, get_model
    >>> gm = export_module(get_model("conv_relu"), example_inputs(2))
    >>> node_named(gm, "conv2d").args[0].name
    'x'
    >>> node_named(gm, "conv")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: no node named 'conv' in this graph; close names: conv2d, conv_bias, ...
    """
    graph = _graph_of(gm, "node_named")
    for node in graph.nodes:
        if node.name == name:
            return node
    names = [node.name for node in graph.nodes]
    close = difflib.get_close_matches(str(name), names, n=5, cutoff=0.5)
    hint = f"close names: {', '.join(close)}" if close else f"its nodes: {', '.join(names[:8])}"
    if not close and len(names) > 8:
        hint += ", ..."
    raise ValueError(
        f"no node named {name!r} in this graph; {hint} (print(gm.graph) lists all {len(names)})"
    )


def calibrate(model: torch.fx.GraphModule, *, batches: int = 4, batch: int | None = None) -> None:
    """Feed ``batches`` deterministic image batches through a prepared model.

    Batch ``i`` is ``example_inputs(batch, seed=i)``, so two models calibrated with the
    same arguments have seen exactly the same data (the lessons compare them bit by bit).

    Args:
        model: an exported (usually prepared) ``GraphModule``.
        batches: how many batches to feed.
        batch: images per batch; by default the batch size the model was exported with,
            the only one its graph accepts.

    Raises:
        ValueError: if ``batch`` is omitted and the graph does not tell its batch size.
    """
    from common.models import example_inputs

    if batch is None:
        batch = _exported_batch(model)
    with torch.no_grad():
        for seed in range(batches):
            model(*example_inputs(batch, seed=seed))


def _exported_batch(model: torch.fx.GraphModule) -> int:
    for node in model.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ValueError(
        "cannot tell which batch size this model was exported with; "
        "pass it: calibrate(model, batch=N)"
    )


def x86_quantizer():
    """Return torchao's ``X86InductorQuantizer`` with its default (static, per-channel) config.

    Returns:
        X86InductorQuantizer: a quantizer to pass to ``prepare_pt2e``.
    """
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())


class _DropMessages(logging.Filter):
    """Drops records whose message contains one of the given fragments."""

    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


# Each entry: logger name -> message fragments known to be harmless on a CPU machine.
_KNOWN_LOG_NOISE = {
    # torchao tries to load its CUDA-only kernels at import.
    "torchao": ("Failed to load",),
    # torchao registers an Enum with pytree; torch 2.13 says this is no longer needed.
    "torch.utils._pytree": ("is now natively supported",),
}


def quiet() -> None:
    """Silence the known, harmless import and log noise of torch 2.13 + torchao 0.18.

    Only these are silenced: torchao's "Failed to load ... .so" lines for CUDA kernels,
    the pytree "Enum subclass ... natively supported" line, the
    ``torch.jit.script_method`` DeprecationWarning raised by importing the x86
    quantizer, and the ``isinstance(treespec, LeafSpec)`` FutureWarning that
    ``copy.deepcopy`` of an exported GraphModule raises inside torch. Everything else
    still reaches you. Call it before importing torchao; calling it again changes nothing.
    """
    for name, fragments in _KNOWN_LOG_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(*fragments))
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.jit\.script_method` is deprecated",
        category=DeprecationWarning,
    )
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
    )


def replace_with_constant(
    model: torch.fx.GraphModule, node: torch.fx.Node, value: torch.Tensor
) -> torch.fx.Node:
    """Replace ``node`` by a ``get_attr`` of a new buffer holding ``value``.

    As torchao's and inductor's constant folding name it: ``_frozen_paramN``, N counted on
    from the model's ``_frozen_param_count``, skipping names already taken. The ``get_attr``
    keeps the node's name and meta. ``common.handmade`` (``fold_quantize``) and
    ``common.lowering`` (prepacked weights) both fold this way.

    Args:
        model: the ``GraphModule`` holding ``node``; edited in place.
        node: the node whose value is known now; erased.
        value: the tensor (or packed weight) it computes.

    Returns:
        torch.fx.Node: the ``get_attr`` node that now stands where ``node`` stood.
    """
    i = getattr(model, "_frozen_param_count", 0)
    while hasattr(model, f"_frozen_param{i}"):
        i += 1
    model._frozen_param_count = i + 1
    name = f"_frozen_param{i}"
    model.register_buffer(name, value)
    graph = model.graph
    with graph.inserting_before(node):
        constant = graph.create_node("get_attr", name)
    node.replace_all_uses_with(constant)
    constant.meta.update(node.meta)
    graph.erase_node(node)
    constant.name = node.name
    return constant


def remove_unused_constants(model: torch.fx.GraphModule) -> None:
    """Erase the ``get_attr`` nodes nobody reads, and their attribute when it sits on the model
    itself (attributes of submodules stay, as torchao and inductor leave them).

    Args:
        model: a ``GraphModule``; edited in place.
    """
    graph = model.graph
    for node in list(graph.find_nodes(op="get_attr")):
        if not node.users:
            if hasattr(model, node.target):
                delattr(model, node.target)
            graph.erase_node(node)
