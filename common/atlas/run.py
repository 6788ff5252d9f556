"""Running the atlas: the quantizers by column name, the op's status read from a converted
graph, ``coverage``'s report on it, and :func:`run_entry` / :func:`run_cached`, which ask each
backend's run reader (``common.backends``) what ran it.

``run_cached``'s key holds this file and every ``common`` file it may run whole (``recipe.py``,
the backends' run readers, ``common.coverage``); not ``entries.py``, so a new row computes
only itself.
"""

import warnings
from pathlib import Path

import torch

from common.atlas.recipe import Entry
from common.graph import (
    DEQUANTIZE,
    QUANTIZE,
    base_name,
    calls,
    tensor_inputs,
    users_through_getitem,
)

#: The quantizers of the atlas, in its columns' order.
QUANTIZERS = ("x86", "xnnpack", "openvino", "arm")


# --- Reading graphs ---------------------------------------------------------------------------

#: Ops whose value is computed from int8 inputs even when their output is left float. Not
#: ``scaled_dot_product_attention``: no quantizer of the atlas annotates it, and between int8
#: linears it reads their dequantized outputs and computes in float (XNNPACK's float ``bmm``
#: and softmax, OpenVINO's bf16 or f32), so, as for the other ops, its own annotation counts.
_COMPUTE = {
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "linear",
    "matmul",
    "bmm",
    "embedding",
    "lstm",
    "gru",
}


def nodes_of(item: Entry, graph: torch.fx.Graph) -> list:
    """The nodes of ``graph`` that stand for the entry's op (see ``Entry.ops``)."""
    return [node for node in graph.nodes if item.holds(node)]


def _int8_compute(node) -> bool:
    """A conv/linear/matmul whose inputs are all dequantized int8."""
    inputs = tensor_inputs(node)
    return (
        base_name(node.target) in _COMPUTE
        and bool(inputs)
        and all(calls(a, DEQUANTIZE) for a in inputs)
    )


def annotation(item: Entry, converted: torch.fx.GraphModule) -> str:
    """The op's status in a converted (q/dq) graph: ``int8``, ``int8 shared``, ``int8 fused``
    or ``float``; several nodes of the op: the least quantized of them."""
    order = ("float", "int8 fused", "int8", "int8 shared")
    statuses = [_node_status(item, n) for n in converted.graph.nodes if item.holds(n)]
    if not statuses:
        raise ValueError(f"{item.name}: no node of {item.ops} in the converted graph")
    return min(statuses, key=order.index)


#: Activations a quantizer fuses into the op before them: an op's output quantized after one
#: of these counts as quantized (XNNPACK's add + ReLU, x86's linear + add + ReLU).
_TAIL = ("relu", "relu_", "hardtanh", "hardtanh_")


def _quantized_after(node) -> bool:
    users = users_through_getitem(node)
    if len(users) == 1 and calls(users[0], _TAIL) and _annotated(users[0]):
        users = users_through_getitem(users[0])
    return bool(users) and all(calls(u, QUANTIZE) for u in users)


def _annotated(node) -> bool:
    """The quantizer annotated the node itself (part of a pattern), not only its neighbours:
    a spec of its own, or the end of a pattern (x86 marks a fused activation
    ``_is_output_of_quantized_pattern`` with no spec: the op after it quantizes its output)."""
    annotation = node.meta.get("quantization_annotation")
    if annotation is None:
        return False
    return (
        bool(annotation.input_qspec_map)
        or annotation.output_qspec is not None
        or getattr(annotation, "_is_output_of_quantized_pattern", False)
    )


def _in_pattern(node) -> bool:
    """The quantizer matched the node as a piece of a pattern (its ``_annotated`` flag, set
    also on a piece with no spec: x86's linear + add + ReLU's add); ``OpenVINOQuantizer``
    sets no such flag, its output spec on a node is for the op after it."""
    annotation = node.meta.get("quantization_annotation")
    return bool(getattr(annotation, "_annotated", False))


def _node_status(item: Entry, node) -> str:
    inputs = tensor_inputs(node)
    out_q = _quantized_after(node)
    in_q = bool(inputs) and all(calls(a, DEQUANTIZE) for a in inputs)
    if base_name(node.target) in _COMPUTE:
        if item.op == "embedding":  # the table (its weight) int8, the indices as they are
            return "int8" if calls(node.args[0], DEQUANTIZE) else "float"
        weights = [a for a in node.args[1:2] if isinstance(a, torch.fx.Node)]
        if base_name(node.target) in ("conv1d", "conv2d", "conv_transpose2d", "linear"):
            in_q = in_q and all(calls(w, DEQUANTIZE) for w in weights)
        return "int8" if in_q else "float"
    if in_q and out_q and _annotated(node):
        users = users_through_getitem(node)
        same = item.shared and all(inputs[0].args[1:3] == u.args[1:3] for u in users)
        return "int8 shared" if same else "int8"
    fed = [a for a in inputs if not calls(a, DEQUANTIZE)]
    direct = fed and _int8_compute(fed[0]) and len(fed[0].users) == 1
    if out_q and direct and _in_pattern(node):  # a post-op of the int8 conv or linear
        return "int8 fused"
    return "float"


# --- The quantizers -----------------------------------------------------------------------


def make_quantizer(name: str):
    """A new quantizer of the atlas by column name (``x86``, ``xnnpack``, ``openvino``, ``arm``).

    Raises:
        ValueError: naming the columns, for another name.
    """
    from common.backends import arm, openvino
    from common.edge import xnnpack_quantizer
    from common.pt2e import x86_quantizer

    makers = {
        "x86": x86_quantizer,
        "xnnpack": xnnpack_quantizer,
        "openvino": openvino.quantizer,
        "arm": arm.quantizer,
    }
    if name not in makers:
        raise ValueError(f"unknown quantizer {name!r} (one of: {', '.join(QUANTIZERS)})")
    return makers[name]()


def quantize(item: Entry, quantizer_name: str, *, fold_quantize: bool = True):
    """Export the entry's model, prepare, calibrate on 2 batches, convert
    (:meth:`Entry.quantized` with the column's quantizer)."""
    return item.quantized(make_quantizer(quantizer_name), fold_quantize=fold_quantize)


# --- What ran it, what the report says ---------------------------------------------------------


def _runs() -> dict:
    """Each backend's run reader, by column: what ran the converted model."""
    from common.backends import openvino
    from common.backends.x86 import runs as x86
    from common.backends.xnnpack import runs as xnnpack

    return {
        "x86": x86.x86_runs,
        "xnnpack": xnnpack.xnnpack_runs,
        "openvino": openvino.openvino_runs,
    }


def _error(error: Exception) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"


def reported(item: Entry, quantizer_name: str) -> dict:
    """``common.coverage``'s report on the entry's op (``every_op=True``): its status and the
    reason the quantizer's rules give, in English and in Chinese; several nodes of the op:
    the least quantized of them."""
    from common.coverage import coverage

    order = ("float", "int8 fused", "int8 dynamic", "int8 static", "int8 shared")
    args = item.example_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(item.build(), args).module()
        report = coverage(exported, make_quantizer(quantizer_name), every_op=True)
    mine = {node.name for node in nodes_of(item, exported.graph)}
    ops = sorted((o for o in report.ops if o.node in mine), key=lambda o: order.index(o.status))
    if not ops:
        return {"status": "not reported", "reason": {"en": "", "zh_TW": ""}}
    return {
        "status": ops[0].status,
        "reason": {lang: ops[0].reason_in(lang) for lang in ("en", "zh_TW")},
    }


def run_entry(item: Entry) -> dict:
    """Everything the atlas knows about one entry, as plain data.

    A quantizer or backend that fails on the model leaves ``error`` (``"<type>: <first
    line>"``) where its result would be.

    Returns:
        dict: per quantizer, ``annotation`` (:func:`annotation` of the converted graph),
        ``coverage`` (:func:`reported`: the status and reason the page shows); and for ``x86``,
        ``xnnpack`` and ``openvino`` what ran (:func:`x86_runs`, :func:`xnnpack_runs`,
        :func:`openvino_runs`).
    """
    runs = _runs()
    result = {}
    for name in QUANTIZERS:
        result[name] = found = {}
        try:
            converted = quantize(item, name, fold_quantize=name != "openvino")
            found["annotation"] = annotation(item, converted)
        except Exception as error:  # a quantizer refusing the model is a fate too
            found.update(annotation="error", error=_error(error))
            continue
        found["coverage"] = reported(item, name)
        if name in runs:
            try:
                found.update(runs[name](item, converted))
            except Exception as error:  # so is a backend refusing it
                found["error"] = _error(error)
    return result


def _key_files() -> list[Path]:
    """The files whose code makes a result: this one and every ``common`` file it may run
    (``common.digest.import_closure``: ``recipe.py``, the backends' run readers and quantizer
    makers, ``common.coverage``, ``common.graph``, ...), but the rows (``entries.py``)."""
    from common.digest import import_closure

    here = Path(__file__).resolve()
    common = here.parents[1]
    # The rows, and the build's bookkeeping (its lesson, cache, keys and turns), make no result.
    bookkeeping = ("lesson", "cache", "digest", "turns")
    skip = [here.with_name("entries.py"), *(common / f"{m}.py" for m in bookkeeping)]
    return [here, *import_closure(here, skip=skip)]


def run_cached(item: Entry) -> dict:
    """:func:`run_entry`, kept in the course's cache (``common.cache.cached``).

    The key names what produced the result: the entry (its name, ops, input shape and its
    model: code and weights), the files that run and read it whole (``common/atlas/run.py``
    and every ``common`` file it may run: ``_key_files``; not the rows of ``entries.py``: a
    new row computes only itself), the installed stack (torch, torchao, ExecuTorch, NNCF,
    OpenVINO) and the CPU's kernel path (OpenVINO's CPU plugin picks its float precision by
    it). It holds no timing.

    When another process is making this row (the other language's build, walking the rows in
    the same order), it makes the atlas's later rows that nobody has started meanwhile, instead
    of waiting: two builds split the atlas rather than take turns on each row.
    """
    from common.cache import cached, cached_state

    key = _row_key(item)
    if cached_state("op_atlas", key) == "being made":
        _make_later_rows_meanwhile(item, key)
    return cached("op_atlas", key, lambda: run_entry(item))


def _row_key(item: Entry) -> str:
    from importlib.metadata import version

    from common.cpu import describe
    from common.digest import digest

    stack = [version("nncf"), version("openvino"), describe().kernel_path]
    model = item.build()
    return digest(item.name, list(item.ops), list(item.shape), model, _key_files(), stack)


def _make_later_rows_meanwhile(item: Entry, key: str) -> None:
    """Make the rows after ``item`` that are neither kept nor being made, one at a time, while
    ``item``'s own row is still being made elsewhere."""
    from common.atlas.entries import ENTRIES
    from common.cache import cached, cached_state

    at = next((i for i, row in enumerate(ENTRIES) if row is item), len(ENTRIES))
    for row in ENTRIES[at + 1 :]:
        if cached_state("op_atlas", key) != "being made":
            return
        row_key = _row_key(row)
        if cached_state("op_atlas", row_key) == "missing":
            cached("op_atlas", row_key, lambda row=row: run_entry(row))
