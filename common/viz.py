"""Draw torch.fx graphs with Graphviz, inline in Jupyter and as pictures in the docs."""

import html
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

import graphviz
import torch

from common.charts import CJK_CHARACTERS
from common.lesson import collect_picture

__all__ = [
    "DIFF_LABELS",
    "GraphvizMissingError",
    "diff_dot",
    "draw",
    "draw_diff",
    "to_dot",
    "to_svg",
]

# One family list for dot (which measures the text with the first font it finds) and for
# the browser (which reads the same list from the SVG): CJK labels keep their size.
FONT = "Noto Sans CJK TC,WenQuanYi Micro Hei,sans-serif"

# A fixed look per kind of node, so a picture reads the same in every lesson.
_STYLES = {
    "placeholder": {"shape": "ellipse", "style": "filled", "fillcolor": "#dbeafe"},
    "output": {"shape": "ellipse", "style": "filled", "fillcolor": "#e5e7eb"},
    "call_function": {"shape": "box", "style": "filled", "fillcolor": "#f8fafc"},
    "call_method": {"shape": "box", "style": "filled", "fillcolor": "#f8fafc"},
    "call_module": {"shape": "box", "style": "rounded,filled", "fillcolor": "#ede9fe"},
    "get_attr": {"shape": "note", "style": "filled", "fillcolor": "#f1f5f9"},
    "observer": {"shape": "box", "style": "rounded,filled,dashed", "fillcolor": "#fef3c7"},
    "quantize": {"shape": "box", "style": "filled", "fillcolor": "#fecaca"},
    "dequantize": {"shape": "box", "style": "filled", "fillcolor": "#bbf7d0"},
}
_HIGHLIGHT = {"color": "#dc2626", "penwidth": "3", "fontcolor": "#991b1b"}


class GraphvizMissingError(RuntimeError):
    """Raised when the Graphviz ``dot`` program is not installed."""


def _kind(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        module = gm.get_submodule(node.target) if isinstance(node.target, str) else None
        names = {cls.__name__ for cls in type(module).__mro__}
        if names & {"ObserverBase", "FakeQuantizeBase"}:
            return "observer"
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if name.startswith("quantize_per"):
            return "quantize"
        if name.startswith("dequantize_per"):
            return "dequantize"
    return node.op


def _target_text(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        try:
            return type(gm.get_submodule(node.target)).__name__
        except AttributeError:  # a call_module whose submodule was deleted: lint catches it
            return f"{node.target} (missing)"
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            namespace, op = target.namespace, target._opname
            overload = target._overloadname
            # The q/dq ops all live in one namespace; their names say enough.
            name = op if namespace == "quantized_decomposed" else f"{namespace}.{op}"
            return name if overload == "default" else f"{name}.{overload}"
        return getattr(target, "__name__", str(target))
    if node.op == "call_method":
        return f".{node.target}()"
    return ""


def _qparam_text(node: torch.fx.Node) -> str:
    # Per-tensor quantize/dequantize args: (input, scale, zero_point, quant_min, quant_max, dtype)
    args = node.args
    if len(args) >= 3 and isinstance(args[1], float) and isinstance(args[2], int):
        return f"scale={args[1]:.4g}  zp={args[2]}"
    # Per-channel: (input, scales, zero_points, axis, quant_min, quant_max, dtype); the
    # scales and zero points are get_attr buffers (already in the label as ‹name›).
    if len(args) >= 4 and isinstance(args[1], torch.fx.Node) and isinstance(args[3], int):
        return f"per-channel  axis={args[3]}"
    return ""


def _label(
    gm: torch.fx.GraphModule, node: torch.fx.Node, kind: str, mark: str = "", compact=False
) -> str:
    """The node's name, its target, its folded constants, a q/dq node's qparams. ``compact``
    (a card's picture): no constants, and no target the name already says (``conv2d_1``)."""
    lines = [mark + node.name]
    target = _target_text(gm, node)
    op = target.removeprefix("aten.").split(".")[0]
    said = compact and op and node.name.startswith(op)
    if target and target != node.name and not said:
        lines.append(target)
    folded = not compact and [f"‹{n.name}›" for n in node.all_input_nodes if n.op == "get_attr"]
    if folded:
        lines.append(" ".join(folded))
    if kind in ("quantize", "dequantize"):
        qparams = _qparam_text(node)
        if qparams:
            lines.append(qparams)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ tooltips


def _value_text(value) -> str:
    """A meta["val"] as ``float32[1, 3, 8, 8]``; a tuple or list as one entry per output."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}]"
    if isinstance(value, tuple | list):
        return "\n".join(f"[{i}] {_value_text(item)}" for i, item in enumerate(value))
    if value is None:
        return ""
    return f"{type(value).__name__} {value}"


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n[ \t]*([^\n]*)')
# Frames under the folder torch is installed in (site-packages) are library code, except the
# course's own models: pip-installed, common/ sits in that folder too.
_LIBRARY = os.path.dirname(os.path.dirname(torch.__file__)) + os.sep
_COURSE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _source_text(node: torch.fx.Node) -> str:
    """``file.py:line  code`` of the deepest frame of the node's stack trace in the user's code.

    Only the file's name is kept: a full path would make the picture depend on the folder the
    course was built in. Where every frame is library code, the deepest frame is shown. A
    GraphModule's generated code is named ``<eval_with_key>.N``, N counting the graphs compiled
    so far in the process: the count is dropped, as it tells the reader nothing.
    """
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return ""
    users = [f for f in frames if f[0].startswith(_COURSE) or not f[0].startswith(_LIBRARY)]
    path, line, code = (users or frames)[-1]
    code = code.strip()
    if len(code) > 60:
        code = code[:59] + "…"
    name = re.sub(r"^(<eval_with_key>)\.\d+$", r"\1", os.path.basename(path))
    return f"{name}:{line} {code}"


def _tensor_summary(name: str, value) -> str:
    if not isinstance(value, torch.Tensor):
        return f"{name}={value}"
    if value.numel() == 1:
        return f"{name}={value.item():.6g}"
    flat = value.detach().flatten().double()
    return f"{name}: {value.numel()} values, {flat.min().item():.4g} … {flat.max().item():.4g}"


def _attribute(gm: torch.fx.GraphModule, node) -> object:
    """The tensor a get_attr node reads, or the argument itself when it is not a get_attr."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node.op != "get_attr":
        return f"‹{node.name}›"
    value = gm
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value


def _qdq_tooltip(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[str]:
    args = node.args
    per_channel = "per_channel" in str(node.target)
    if per_channel and len(args) >= 7:
        _, scale, zero_point, axis, qmin, qmax, dtype = args[:7]
        return [
            _tensor_summary("scale", _attribute(gm, scale)),
            _tensor_summary("zero_point", _attribute(gm, zero_point)),
            f"axis={axis} dtype={dtype} [{qmin}, {qmax}]",
        ]
    if not per_channel and len(args) >= 6:
        _, scale, zero_point, qmin, qmax, dtype = args[:6]
        scale, zero_point = _attribute(gm, scale), _attribute(gm, zero_point)
        scale = f"{scale:.6g}" if isinstance(scale, float) else scale
        return [f"scale={scale} zero_point={zero_point}", f"dtype={dtype} [{qmin}, {qmax}]"]
    return []


def _observer_tooltip(module: torch.nn.Module) -> list[str]:
    observer = getattr(module, "activation_post_process", module)  # a FakeQuantize wraps one
    dtype, qscheme = getattr(observer, "dtype", "?"), getattr(observer, "qscheme", "?")
    lines = [f"dtype={dtype} qscheme={qscheme}"]
    low = getattr(observer, "min_val", None)
    if not isinstance(low, torch.Tensor):
        return lines
    if low.numel() == 0 or not torch.isfinite(low).all():
        return [*lines, "scale=? zero_point=? (min_val=inf: no data observed yet)"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scale, zero_point = module.calculate_qparams()
    if scale.numel() == 1:
        return [*lines, f"scale={scale.item():.6g} zero_point={zero_point.item()}"]
    return [*lines, _tensor_summary("scale", scale), _tensor_summary("zero_point", zero_point)]


def _tooltip(gm: torch.fx.GraphModule, node: torch.fx.Node, kind: str) -> str:
    """What hovering a node shows: op and target, value, qparams, folded constants, source."""
    if node.op == "call_function":
        target = str(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        head = f"call_function {target or _target_text(gm, node)}"
    elif node.op == "call_module":
        head = f"call_module {node.target}: {_target_text(gm, node)}"
    elif node.op in ("get_attr", "call_method"):
        head = f"{node.op} {node.target}"
    else:
        head = node.op
    lines = [head, _value_text(node.meta.get("val"))]
    if kind in ("quantize", "dequantize"):
        lines += _qdq_tooltip(gm, node)
    elif kind == "observer":
        lines += _observer_tooltip(gm.get_submodule(node.target))
    for source in dict.fromkeys(node.all_input_nodes):
        if source.op == "get_attr":
            value = _attribute(gm, source)
            text = _value_text(value) if isinstance(value, torch.Tensor) else ""
            lines.append(f"‹{source.name}› {text}".rstrip())
    lines.append(_source_text(node))
    # DOT reads backslash escapes (\n, \N, ...) in attributes: a code line keeps its own.
    return "\n".join(line for line in lines if line).replace("\\", "\\\\").replace("\n", "\\n")


# --------------------------------------------------------------------------------- pictures

_CJK = re.compile(f"[{CJK_CHARACTERS}]")


def _language(title: str | None) -> str:
    """``"zh_TW"`` when the title has Chinese characters, else ``"en"``."""
    return "zh_TW" if title and _CJK.search(title) else "en"


def _check_graph_module(gm, function: str) -> None:
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(
            f"{function} needs a torch.fx.GraphModule, got {type(gm).__name__}; "
            "for an ExportedProgram pass program.module()"
        )


def _digraph() -> graphviz.Digraph:
    return graphviz.Digraph(
        graph_attr={"rankdir": "TB", "fontname": FONT, "nodesep": "0.25", "ranksep": "0.3"},
        node_attr={"fontname": FONT, "fontsize": "11", "margin": "0.12,0.04", "height": "0.3"},
        edge_attr={"color": "#64748b", "arrowsize": "0.6"},
    )


def _drawn(node: torch.fx.Node) -> bool:
    # A get_attr is drawn inside its users' labels; only an unused one gets a box.
    return not (node.op == "get_attr" and node.users)


def _edges(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    return [
        (source.name, node.name)
        for node in gm.graph.nodes
        if _drawn(node)
        for source in dict.fromkeys(node.all_input_nodes)
        if source.op != "get_attr"
    ]


def _value_colour(value: float, low: float, high: float) -> str:
    """Red at ``low``, yellow in the middle, green at ``high`` (a hex colour)."""
    t = 0.5 if high <= low else min(1.0, max(0.0, (value - low) / (high - low)))
    red, yellow, green = (0xF8, 0x71, 0x71), (0xFD, 0xE0, 0x47), (0x4A, 0xDE, 0x80)
    a, b, u = (red, yellow, 2 * t) if t < 0.5 else (yellow, green, 2 * t - 1)
    return "#" + "".join(f"{round(x + (y - x) * u):02x}" for x, y in zip(a, b, strict=True))


def _values_legend(title: str | None, name: str, low: float, high: float) -> str:
    """The title and a low-to-high colour scale as one Graphviz HTML-like label."""
    cells = "".join(
        f'<td bgcolor="{_value_colour(v, low, high)}"><font point-size="11">{v:.1f}</font></td>'
        for v in (low, (low + high) / 2, high)
    )
    heading = f'<tr><td colspan="4"><font point-size="15">{html.escape(title)}</font></td></tr>'
    return (
        f'<<table border="0" cellspacing="4">{heading if title else ""}<tr>'
        f'<td><font point-size="12">{html.escape(name)}</font></td>{cells}</tr></table>>'
    )


def to_dot(
    gm, *, highlight=(), title=None, values=None, value_name="value", only=None
) -> graphviz.Digraph:
    """Build (without rendering) the Graphviz picture of ``gm.graph``.

    ``get_attr`` nodes are folded into the label of each node that reads them, as
    ``‹name›``; Python constants in ``args`` are not drawn. Each node carries a tooltip
    (shown on hover): its op and target, the dtype and shape of ``meta["val"]``, the
    scale / zero point / dtype of q/dq nodes and observers, and its line of source code.

    Args:
        gm: a ``torch.fx.GraphModule``.
        highlight: names of nodes to mark (a red, thick border).
        title: text drawn above the graph.
        values: node name to a number (e.g. an SQNR in dB): those nodes are filled from red
            (lowest) through yellow to green (highest), a legend shows the scale, and the
            tooltip gives the number.
        value_name: what the numbers are, for the legend and the tooltips.
        only: names of the nodes to draw, with the edges between them and short labels
            (a card's picture: ``focus_svg``); default: every node, labelled in full.

    Raises:
        TypeError: if ``gm`` is not a ``GraphModule``.
        ValueError: if a name in ``highlight`` or ``values`` is not a node of the graph.

    >>> from common.models import example_inputs, get_model
    >>> from common.pt2e import export_module
    >>> gm = export_module(get_model("conv_relu"), example_inputs(1))
    >>> dot = to_dot(gm, highlight=["relu"])
    >>> "‹conv_weight›" in dot.source, "\\tconv_weight [" in dot.source
    (True, False)
    """
    _check_graph_module(gm, "draw")
    if isinstance(highlight, str):
        highlight = [highlight]
    nodes = list(gm.graph.nodes)
    names = {node.name for node in nodes}
    unknown = [name for name in highlight if name not in names]
    if unknown:
        raise ValueError(
            f"cannot highlight {', '.join(map(repr, unknown))}: not a node of this graph "
            f"(nodes: {', '.join(sorted(names))})"
        )
    marked = set(highlight)
    values = dict(values or {})
    unknown = [name for name in values if name not in names]
    if unknown:
        raise ValueError(
            f"cannot colour {', '.join(map(repr, unknown))}: not a node of this graph "
            f"(nodes: {', '.join(sorted(names))})"
        )
    low, high = (min(values.values()), max(values.values())) if values else (0.0, 0.0)

    dot = _digraph()
    if values:
        dot.attr(label=_values_legend(title, value_name, low, high), labelloc="t")
    elif title:
        dot.attr(label=title, labelloc="t", fontsize="15")
    shown = names if only is None else set(only)
    for node in filter(_drawn, nodes):
        if node.name not in shown:
            continue
        kind = _kind(gm, node)
        attrs = dict(_STYLES[kind])
        tooltip = _tooltip(gm, node, kind)
        if node.name in values:
            attrs["fillcolor"] = _value_colour(values[node.name], low, high)
            tooltip = f"{value_name}: {values[node.name]:.2f}\\n{tooltip}"
        if node.name in marked:
            attrs.update(_HIGHLIGHT)
        label = _label(gm, node, kind, compact=only is not None)
        dot.node(node.name, label, tooltip=tooltip, **attrs)
    for source, target in _edges(gm):
        if source in shown and target in shown:
            dot.edge(source, target)
    return dot


# ------------------------------------------------------------------------------- focus pictures

#: The largest focus picture, in points as dot measures it: scaled into the smallest card that
#: shows it (the landing page's, about 262 × 144 px), its 11-pt labels stay 8 px or larger.
FOCUS_SIZE = (340, 190)


def _svg_size(svg: str) -> tuple[float, float]:
    width, height = re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups()
    return float(width), float(height)


def focus_svg(gm, highlight) -> str | None:
    """The card picture of a highlighted graph: its first highlighted nodes (in graph order)
    with their direct inputs and outputs, no title, as many as fit ``FOCUS_SIZE``.

    The site's cards show it instead of the whole graph (docs/course_directives.py), which a
    card shrinks until no label can be read. None when the first highlighted node and its
    neighbours alone do not fit.
    """
    marked = set([highlight] if isinstance(highlight, str) else highlight)
    chosen = [node for node in gm.graph.nodes if node.name in marked and _drawn(node)]
    best, shown = None, set()
    for node in chosen:
        neighbours = [*node.all_input_nodes, *node.users]
        shown |= {node.name} | {n.name for n in neighbours if _drawn(n)}
        svg = _render_svg(to_dot(gm, highlight=highlight, only=shown))
        width, height = _svg_size(svg)
        if width > FOCUS_SIZE[0] or height > FOCUS_SIZE[1]:
            break
        best = svg
    return best


# ------------------------------------------------------------------------------------ diffs

#: The legend of a diff picture per language; ``draw_diff(..., labels=...)`` takes any dict
#: with these keys (the text alternative of the picture follows the title's language).
DIFF_LABELS = {
    "en": {"added": "added", "removed": "removed", "rewired": "rewired edge"},
    "zh_TW": {"added": "新增的 node", "removed": "移除的 node", "rewired": "改接的邊"},
}
_ADDED = {"color": "#15803d", "penwidth": "2.5"}
_REMOVED = {
    "style": "dashed,rounded",
    "color": "#94a3b8",
    "fontcolor": "#64748b",
    "fillcolor": "white",
}
_REWIRED = {"color": "#c2410c", "penwidth": "2"}
_GONE = {"style": "dashed", "color": "#94a3b8"}


def _legend(title: str | None, words: Mapping[str, str]) -> str:
    """The title and the legend as one Graphviz HTML-like label."""
    cells = (
        f'<td border="2" color="{_ADDED["color"]}">'
        f'<font point-size="12">+ {html.escape(words["added"])}</font></td>'
        f'<td border="1" style="dashed" color="{_REMOVED["color"]}"><font point-size="12" '
        f'color="{_REMOVED["fontcolor"]}">− {html.escape(words["removed"])}</font></td>'
        f'<td><font point-size="12" color="{_REWIRED["color"]}">'
        f"→ {html.escape(words['rewired'])}</font></td>"
    )
    heading = ""
    if title:
        heading = f'<tr><td colspan="3"><font point-size="15">{html.escape(title)}</font></td></tr>'
    return f'<<table border="0" cellspacing="6">{heading}<tr>{cells}</tr></table>>'


def _diff_words(title: str | None, labels) -> dict[str, str]:
    if labels is None:
        return DIFF_LABELS[_language(title)]
    missing = [key for key in DIFF_LABELS["en"] if key not in labels]
    if missing:
        raise ValueError(
            f"labels lacks {', '.join(missing)}: give all of {', '.join(DIFF_LABELS['en'])}, "
            'e.g. labels=DIFF_LABELS["zh_TW"]'
        )
    return dict(labels)


class _Diff:
    """Which nodes and edges of ``before`` and ``after`` differ (nodes are matched by name)."""

    def __init__(self, before: torch.fx.GraphModule, after: torch.fx.GraphModule):
        old = {n.name: n for n in before.graph.nodes}
        new = {n.name: n for n in after.graph.nodes}
        # A node is kept when a node of the same name, op and target is still there.
        self.kept = {
            name
            for name in old.keys() & new.keys()
            if (old[name].op, old[name].target) == (new[name].op, new[name].target)
        }
        self.added = [n for n in after.graph.nodes if _drawn(n) and n.name not in self.kept]
        self.removed = [n for n in before.graph.nodes if _drawn(n) and n.name not in self.kept]
        old_edges = {(self.old_id(s), self.old_id(t)) for s, t in _edges(before)}
        new_edges = _edges(after)
        # Rewired: an input a node that was already there did not have before.
        self.rewired = {e for e in new_edges if e[1] in self.kept and e not in old_edges}
        self.new_edges = new_edges
        self.gone_edges = [e for e in dict.fromkeys(old_edges) if e not in set(new_edges)]

    def old_id(self, name: str) -> str:
        # Not "removed:name": Graphviz reads a colon in an edge's end as a port.
        return name if name in self.kept else f"{name} (removed)"


def diff_dot(before, after, *, title=None, labels=None) -> graphviz.Digraph:
    """Build (without rendering) the picture of ``after`` marked against ``before``.

    Nodes are matched by name (and op and target): nodes only in ``after`` are drawn with a
    green border and ``+``; nodes only in ``before`` are ghosted (dashed, grey, ``−``) where
    their edges were; an edge into a node that was already there, new in ``after``, is drawn
    thick and orange (rewired); an edge of ``before`` that is gone is dashed grey. A legend
    under the title names the three marks.

    Args:
        before: the ``GraphModule`` before the change (e.g. a ``copy.deepcopy`` snapshot).
        after: the ``GraphModule`` after it.
        title: text drawn above the graph; Chinese characters in it make the legend Chinese.
        labels: legend words, a dict with the keys ``added``, ``removed`` and ``rewired``
            (default: ``DIFF_LABELS["zh_TW"]`` or ``DIFF_LABELS["en"]``, from the title).

    Raises:
        TypeError: if ``before`` or ``after`` is not a ``GraphModule``.
        ValueError: if ``labels`` lacks a key.

    >>> import copy
    >>> from common.models import example_inputs, get_model
    >>> from common.pt2e import export_module, quiet
    >>> quiet()  # deepcopy of an exported module warns about a torch deprecation
    >>> gm = export_module(get_model("conv_relu"), example_inputs(1))
    >>> before = copy.deepcopy(gm)
    >>> relu = next(n for n in gm.graph.nodes if n.name == "relu")
    >>> with gm.graph.inserting_after(relu):
    ...     neg = gm.graph.call_function(torch.ops.aten.neg.default, (relu,))
    >>> _ = relu.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
    >>> source = diff_dot(before, gm, title="改圖之後").source
    >>> "新增的 node" in source, "+ neg" in source
    (True, True)
    """
    _check_graph_module(before, "draw_diff")
    _check_graph_module(after, "draw_diff")
    words = _diff_words(title, labels)
    diff = _Diff(before, after)
    dot = _digraph()
    dot.attr(label=_legend(title, words), labelloc="t")
    added = {n.name for n in diff.added}
    for node in filter(_drawn, after.graph.nodes):
        kind = _kind(after, node)
        attrs, mark, tip = dict(_STYLES[kind]), "", _tooltip(after, node, kind)
        if node.name in added:
            attrs.update(_ADDED)
            mark, tip = "+ ", f"+ {words['added']}\\n{tip}"
        dot.node(node.name, _label(after, node, kind, mark), tooltip=tip, **attrs)
    for node in diff.removed:
        kind = _kind(before, node)
        attrs = {**_STYLES[kind], **_REMOVED}
        tip = f"− {words['removed']}\\n{_tooltip(before, node, kind)}"
        dot.node(diff.old_id(node.name), _label(before, node, kind, "− "), tooltip=tip, **attrs)
    for source, target in diff.new_edges:
        dot.edge(source, target, **(_REWIRED if (source, target) in diff.rewired else {}))
    for source, target in diff.gone_edges:
        dot.edge(source, target, **_GONE)
    return dot


# --------------------------------------------------------------------------- text alternative

_ALT = {
    "en": {
        "graph": "A graph of {n} nodes: {names}.",
        "more": "and {n} more",
        "sep": ", ",
        "added": "Added: {names}.",
        "removed": "Removed: {names}.",
        "rewired": "Rewired edges: {n}.",
        "title": "{title}.",
        "join": " ",
    },
    "zh_TW": {
        "graph": "共 {n} 個 node 的圖：{names}。",
        "more": "另有 {n} 個",
        "sep": "、",
        "added": "新增：{names}。",
        "removed": "移除：{names}。",
        "rewired": "改接的邊：{n} 條。",
        "title": "{title}。",
        "join": "",
    },
}
_ALT_NAMES = 30  # beyond this, a list of names stops helping a listener


def _names(nodes, words) -> str:
    names = [node.name for node in nodes]
    if len(names) > _ALT_NAMES:
        rest = words["more"].format(n=len(names) - _ALT_NAMES)
        names = [*names[:_ALT_NAMES], rest]
    return words["sep"].join(names)


def describe(gm, *, title=None, diff=None) -> str:
    """The text alternative of a picture: its title, its nodes in order, what a diff changed."""
    words = _ALT[_language(title)]
    nodes = [n for n in gm.graph.nodes if _drawn(n)]
    parts = [words["title"].format(title=title.rstrip(".。:："))] if title else []
    parts.append(words["graph"].format(n=len(nodes), names=_names(nodes, words)))
    if diff is not None:
        for key, changed in (("added", diff.added), ("removed", diff.removed)):
            if changed:
                parts.append(words[key].format(names=_names(changed, words)))
        if diff.rewired:
            parts.append(words["rewired"].format(n=len(diff.rewired)))
    return words["join"].join(parts)


# -------------------------------------------------------------------------------- rendering


# Graphviz wraps a node with a tooltip in <a xlink:title=...>; browsers show an SVG element's
# <title> child on hover (and screen readers read it), so the tooltip replaces the node's
# <title> (its bare name) and the wrapper goes: smaller, and the same in every browser.
_LINKED_TOOLTIP = re.compile(
    r'<title>[^<]*</title>\n<g id="a_[^"]*"><a xlink:title="([^"]*)">\n(.*?)</a>\n</g>\n', re.S
)


def _tidy_svg(svg: str) -> str:
    """Tooltips as <title>; no comments, no ids (several pictures share a page), no graph title."""
    svg = _LINKED_TOOLTIP.sub(r"<title>\1</title>\n\2", svg)
    svg = re.sub(r"<!--.*?-->\n", "", svg, flags=re.S)
    svg = re.sub(r' id="[^"]*"', "", svg)
    # The root graph's <title> is its DOT name ("%3"), which would show on hover anywhere.
    return re.sub(r'(<g class="graph"[^>]*>\n)<title>[^<]*</title>\n', r"\1", svg, count=1)


def _render_svg(dot: graphviz.Digraph) -> str:
    if shutil.which("dot") is None:
        raise GraphvizMissingError(
            "Graphviz's 'dot' program was not found on PATH; install Graphviz "
            "(Debian/Ubuntu: sudo apt-get install graphviz fonts-noto-cjk; macOS: brew install "
            "graphviz; conda: conda install -c conda-forge graphviz)"
        )
    return _tidy_svg(dot.pipe(format="svg", encoding="utf-8"))


def _show_in_jupyter(svg: str) -> bool:
    try:
        from IPython import get_ipython
        from IPython.display import SVG, display
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False
    display(SVG(data=svg))
    return True


def _show(svg: str, alt: str, focus=lambda: None) -> None:
    if collect_picture(svg, alt, focus):  # the site's build keeps it for the page
        return
    if not _show_in_jupyter(svg) and os.environ.get("PT2E_COURSE_DRAW_DIR"):
        folder = Path(os.environ["PT2E_COURSE_DRAW_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        index = len(list(folder.glob("graph_*.svg"))) + 1
        (folder / f"graph_{index:03d}.svg").write_text(svg, encoding="utf-8")


def to_svg(dot: graphviz.Digraph) -> str:
    """Render a picture of ``to_dot`` or ``diff_dot`` as the SVG text ``draw`` shows.

    Raises:
        GraphvizMissingError: if Graphviz's ``dot`` is not installed.
    """
    return _render_svg(dot)


def draw(gm, *, highlight=(), title=None, values=None, value_name="value") -> None:
    """Draw ``gm.graph``: inline in Jupyter, as a picture on the course site, else rendered.

    As a plain script the picture is rendered (so a broken graph still fails) and
    discarded, unless the environment variable ``PT2E_COURSE_DRAW_DIR`` names a folder to
    write numbered SVG files into. Hovering a node shows its tooltip (see ``to_dot``). On
    the site, a picture with ``highlight`` also gets a small one for the lessons' cards
    (``focus_svg``).

    Args:
        gm: a ``torch.fx.GraphModule``.
        highlight: names of nodes to mark.
        title: text drawn above the graph.
        values: node name to a number, drawn as a colour with a legend (see ``to_dot``).
        value_name: what the numbers are.

    Raises:
        TypeError: if ``gm`` is not a ``GraphModule``.
        ValueError: if a name in ``highlight`` or ``values`` is not a node of the graph.
        GraphvizMissingError: if Graphviz's ``dot`` is not installed.
    """
    dot = to_dot(gm, highlight=highlight, title=title, values=values, value_name=value_name)
    svg = _render_svg(dot)
    _show(svg, describe(gm, title=title), lambda: focus_svg(gm, highlight) if highlight else None)


def draw_diff(before, after, *, title=None, labels=None) -> None:
    """Draw ``after`` marked against ``before``: added, removed (ghosted) and rewired.

    Shown like ``draw``'s pictures; the marks and the legend are described in ``diff_dot``.
    The legend is Chinese when the title has Chinese characters, else English, unless
    ``labels`` gives its words.

    Args:
        before: the ``GraphModule`` before the change, e.g. ``copy.deepcopy(gm)`` taken then.
        after: the ``GraphModule`` after it.
        title: text drawn above the graph.
        labels: legend words, a dict with the keys ``added``, ``removed`` and ``rewired``.

    Raises:
        TypeError: if ``before`` or ``after`` is not a ``GraphModule``.
        ValueError: if ``labels`` lacks a key.
        GraphvizMissingError: if Graphviz's ``dot`` is not installed.

    Example::

        before = copy.deepcopy(gm)
        ...  # edit gm
        draw_diff(before, gm, title="Step 2: after replace_all_uses_with")
    """
    svg = _render_svg(diff_dot(before, after, title=title, labels=labels))
    _show(svg, describe(after, title=title, diff=_Diff(before, after)))
