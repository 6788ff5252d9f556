"""Draw torch.fx graphs with Graphviz, inline in Jupyter and as pictures in the docs."""

import os
import shutil
from pathlib import Path

import graphviz
import torch

__all__ = ["GraphvizMissingError", "draw", "to_dot"]

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


def _label(gm: torch.fx.GraphModule, node: torch.fx.Node, kind: str) -> str:
    lines = [node.name]
    target = _target_text(gm, node)
    if target and target != node.name:
        lines.append(target)
    folded = [f"‹{n.name}›" for n in node.all_input_nodes if n.op == "get_attr"]
    if folded:
        lines.append(" ".join(folded))
    if kind in ("quantize", "dequantize"):
        qparams = _qparam_text(node)
        if qparams:
            lines.append(qparams)
    return "\n".join(lines)


def to_dot(gm, *, highlight=(), title=None) -> graphviz.Digraph:
    """Build (without rendering) the Graphviz picture of ``gm.graph``.

    ``get_attr`` nodes are folded into the label of each node that reads them, as
    ``‹name›``; Python constants in ``args`` are not drawn.

    Args:
        gm: a ``torch.fx.GraphModule``.
        highlight: names of nodes to mark (a red, thick border).
        title: text drawn above the graph.

    >>> from common.models import example_inputs, get_model
    >>> from common.pt2e import export_module
    >>> gm = export_module(get_model("conv_relu"), example_inputs(1))
    >>> dot = to_dot(gm, highlight=["relu"])
    >>> "‹conv_weight›" in dot.source, "\\tconv_weight [" in dot.source
    (True, False)
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(
            f"draw needs a torch.fx.GraphModule, got {type(gm).__name__}; "
            "for an ExportedProgram pass program.module()"
        )
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

    dot = graphviz.Digraph(
        graph_attr={"rankdir": "TB", "fontname": FONT, "nodesep": "0.25", "ranksep": "0.3"},
        node_attr={"fontname": FONT, "fontsize": "11", "margin": "0.12,0.04", "height": "0.3"},
        edge_attr={"color": "#64748b", "arrowsize": "0.6"},
    )
    if title:
        dot.attr(label=title, labelloc="t", fontsize="15")
    for node in nodes:
        # A get_attr is drawn inside its users' labels; only an unused one gets a box.
        if node.op == "get_attr" and node.users:
            continue
        kind = _kind(gm, node)
        attrs = dict(_STYLES[kind])
        if node.name in marked:
            attrs.update(_HIGHLIGHT)
        dot.node(node.name, _label(gm, node, kind), **attrs)
        for source in dict.fromkeys(node.all_input_nodes):
            if source.op != "get_attr":
                dot.edge(source.name, node.name)
    return dot


class _Collector:
    """Pictures drawn since the gallery scraper last ran (only while collecting)."""

    def __init__(self):
        self.active = False
        self.pictures: list[tuple[str, str]] = []  # (svg text, title)


_collector = _Collector()


def _render_svg(dot: graphviz.Digraph) -> str:
    if shutil.which("dot") is None:
        raise GraphvizMissingError(
            "Graphviz's 'dot' program was not found on PATH; install Graphviz "
            "(Debian/Ubuntu: sudo apt-get install graphviz fonts-noto-cjk; macOS: brew install "
            "graphviz; conda: conda install -c conda-forge graphviz)"
        )
    return dot.pipe(format="svg", encoding="utf-8")


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


def draw(gm, highlight=(), title=None) -> None:
    """Draw ``gm.graph``: inline in Jupyter, as a picture on the course site, else rendered.

    As a plain script the picture is rendered (so a broken graph still fails) and
    discarded, unless the environment variable ``PT2E_COURSE_DRAW_DIR`` names a folder to
    write numbered SVG files into.

    Args:
        gm: a ``torch.fx.GraphModule``.
        highlight: names of nodes to mark.
        title: text drawn above the graph.
    """
    dot = to_dot(gm, highlight=highlight, title=title)
    svg = _render_svg(dot)
    if _collector.active:
        _collector.pictures.append((svg, title or ""))
    elif not _show_in_jupyter(svg) and os.environ.get("PT2E_COURSE_DRAW_DIR"):
        folder = Path(os.environ["PT2E_COURSE_DRAW_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        index = len(list(folder.glob("graph_*.svg"))) + 1
        (folder / f"graph_{index:03d}.svg").write_text(svg, encoding="utf-8")
