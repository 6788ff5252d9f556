"""Graphs as pictures (common.viz): to_dot, draw, tooltips, diffs, values, the picture the
site's build collects."""

import re

import pytest
import torch
from marks import needs_dot

from common import lesson
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import GraphvizMissingError, _value_colour, draw, to_dot, to_svg


def node_statement(source: str, name: str) -> str:
    """The `name [...]` statement of a DOT source (labels may span lines)."""
    start = source.index(f"\t{name} [")
    return source[start : source.index("]\n", start)]


@pytest.fixture
def conv_relu_gm():
    return export_module(get_model("conv_relu"), example_inputs(1))


def test_to_dot_folds_get_attr_and_marks_the_highlight(conv_relu_gm):
    source = to_dot(conv_relu_gm, highlight=["relu"], title="t").source
    assert "‹conv_weight›" in source and "‹conv_bias›" in source
    assert "\tconv_weight [" not in source, "get_attr nodes are not boxes of their own"
    assert "penwidth=3" in node_statement(source, "relu")
    assert "penwidth" not in node_statement(source, "conv2d")
    assert "label=t" in source


def test_to_dot_names_the_existing_nodes_for_an_unknown_highlight(conv_relu_gm):
    with pytest.raises(ValueError, match=r"cannot highlight 'nope'.*\(nodes: .*conv2d.*relu"):
        to_dot(conv_relu_gm, highlight=["nope"])


def test_draw_refuses_what_is_not_a_graph_module():
    with pytest.raises(TypeError, match=r"draw needs a torch\.fx\.GraphModule, got Linear"):
        draw(torch.nn.Linear(2, 2))


@needs_dot
def test_draw_writes_svg_when_asked(conv_relu_gm, tmp_path, monkeypatch):
    monkeypatch.setenv("PT2E_COURSE_DRAW_DIR", str(tmp_path))
    draw(conv_relu_gm, highlight=["relu"], title="改圖之前")
    (svg,) = tmp_path.glob("*.svg")
    text = svg.read_text(encoding="utf-8")
    assert "改圖之前" in text and ">relu<" in text and "‹conv_weight›" in text


def test_draw_without_dot_says_how_to_install_graphviz(conv_relu_gm, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(GraphvizMissingError, match=r"install Graphviz.*apt-get install graphviz"):
        draw(conv_relu_gm)


# ------------------------------------------------------------------ tooltips, diffs (viz)


def svg_of(dot) -> str:
    from common.viz import to_svg

    return to_svg(dot)


def node_titles(svg: str) -> list[str]:
    """The hover text of each node of a rendered picture, unescaped."""
    import html
    import re

    return [html.unescape(t) for t in re.findall(r'<g class="node">\n<title>([^<]*)</title>', svg)]


def test_draw_options_are_keyword_only(conv_relu_gm):
    with pytest.raises(TypeError, match="positional"):
        draw(conv_relu_gm, ["relu"])


@needs_dot
def test_every_node_tooltip_names_op_target_dtype_and_source(conv_relu_gm):
    titles = node_titles(svg_of(to_dot(conv_relu_gm)))
    conv = next(t for t in titles if t.startswith("call_function aten.conv2d.default"))
    assert "float32[1, 3, 16, 16]" in conv or "float32[1, 8, 16, 16]" in conv
    assert "‹conv_weight› float32[8, 3, 3, 3]" in conv
    assert re.search(r"models\.py:\d+ +return self\.relu\(self\.conv\(x\)\)", conv), conv
    assert len(titles) == sum(1 for n in conv_relu_gm.graph.nodes if n.op != "get_attr")
    assert all(title.strip() for title in titles)


def test_source_of_a_re_exported_node_does_not_count_the_graphs_compiled_before():
    from common.viz import _source_text

    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["stack_trace"] = (
        'File "<eval_with_key>.868", line 16, in forward\n    relu = torch.ops.aten.relu(x)\n'
    )
    assert _source_text(node) == "<eval_with_key>:16 relu = torch.ops.aten.relu(x)"


def test_source_of_a_node_is_the_courses_model_when_the_course_is_pip_installed(monkeypatch):
    from common import viz

    site = "/venv/lib/python3.11/site-packages/"  # torch and common side by side
    monkeypatch.setattr(viz, "_LIBRARY", site)
    monkeypatch.setattr(viz, "_COURSE", site + "common/")
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["stack_trace"] = (
        f'File "{site}common/models.py", line 53, in forward\n'
        "    return self.relu(self.bn(self.conv(x)))\n"
        f'File "{site}torch/nn/modules/conv.py", line 565, in forward\n'
        "    return self._conv_forward(input, self.weight, self.bias)\n"
    )
    assert viz._source_text(node) == "models.py:53 return self.relu(self.bn(self.conv(x)))"


@needs_dot
def test_tooltips_give_qparams_of_observers_and_qdq(conv_relu_gm):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from common.pt2e import x86_quantizer

    quiet()
    prepared = prepare_pt2e(conv_relu_gm, x86_quantizer())
    fresh = "\n".join(node_titles(svg_of(to_dot(prepared))))
    assert "HistogramObserver" in fresh and "dtype=torch.uint8" in fresh
    assert "no data observed yet" in fresh, "an observer before calibration has no qparams"
    calibrate(prepared)
    observer = next(m for m in prepared.modules() if type(m).__name__ == "HistogramObserver")
    scale, zero_point = observer.calculate_qparams()
    calibrated = "\n".join(node_titles(svg_of(to_dot(prepared))))
    assert f"scale={scale.item():.6g}" in calibrated
    assert f"zero_point={zero_point.item()}" in calibrated
    converted = convert_pt2e(prepared)
    q = next(n for n in converted.graph.nodes if "quantize_per_tensor" in str(n.target))
    titles = "\n".join(node_titles(svg_of(to_dot(converted))))
    assert f"scale={q.args[1]:.6g} zero_point={q.args[2]}" in titles
    assert "dtype=torch.int8" in titles and "axis=0" in titles, "per-channel weight dequantize"


def test_tooltip_shows_one_line_per_output_of_a_tuple():
    from common.viz import _value_text

    value = (torch.zeros(2, 3), torch.zeros(4, dtype=torch.int8))
    assert _value_text(value) == "[0] float32[2, 3]\n[1] int8[4]"


@needs_dot
def test_pictures_have_no_ids_comments_or_graph_name(conv_relu_gm):
    svg = svg_of(to_dot(conv_relu_gm, title="t"))
    assert " id=" not in svg and "<!--" not in svg and "%3" not in svg
    assert "xlink:title" not in svg, "tooltips are <title> elements"


def edited(gm):
    """(a copy of ``gm``, ``gm`` with a neg inserted after relu and relu's users moved to it)"""
    import copy

    quiet()
    before = copy.deepcopy(gm)
    graph = gm.graph
    relu = next(n for n in graph.nodes if n.name == "relu")
    with graph.inserting_after(relu):
        neg = graph.call_function(torch.ops.aten.neg.default, (relu,))
    relu.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
    return before, gm


def removed_relu(gm):
    """(a copy of ``gm``, ``gm`` with relu erased and its users reading conv2d)"""
    import copy

    quiet()
    before = copy.deepcopy(gm)
    relu = next(n for n in gm.graph.nodes if n.name == "relu")
    relu.replace_all_uses_with(relu.args[0])
    gm.graph.erase_node(relu)
    return before, gm


def test_diff_marks_added_nodes_and_rewired_edges(conv_relu_gm):
    from common.viz import diff_dot

    before, after = edited(conv_relu_gm)
    source = diff_dot(before, after, title="Step 2").source
    assert "penwidth=2.5" in node_statement(source, "neg_default") and "+ neg_default" in source
    assert "penwidth" not in node_statement(source, "relu")
    assert re.search(r"\tneg_default -> output \[color=\"#c2410c\"", source), "output now reads neg"
    assert re.search(r"\trelu -> output \[color=\"#94a3b8\" style=dashed", source), "old edge"
    assert "+ added" in source and "rewired edge" in source


def test_diff_ghosts_removed_nodes_where_they_were(conv_relu_gm):
    from common.viz import diff_dot

    before, after = removed_relu(conv_relu_gm)
    source = diff_dot(before, after).source
    ghost = node_statement(source, '"relu (removed)"')
    assert "dashed" in ghost and "− relu" in ghost
    assert '\tconv2d -> "relu (removed)" [color="#94a3b8"' in source
    assert re.search(r"\tconv2d -> output \[color=\"#c2410c\"", source), "output reads conv2d"


@pytest.mark.parametrize(
    ("title", "labels", "expected"),
    [
        ("Step 2", None, ["added", "removed", "rewired edge"]),
        (None, None, ["added", "removed", "rewired edge"]),
        ("步驟 2：改接", None, ["新增的 node", "移除的 node", "改接的邊"]),
        ("x", {"added": "A", "removed": "R", "rewired": "W"}, ["A", "R", "W"]),
    ],
    ids=["english-title", "no-title", "chinese-title", "labels-given"],
)
def test_diff_legend_speaks_the_title_language(conv_relu_gm, title, labels, expected):
    from common.viz import diff_dot

    before, after = edited(conv_relu_gm)
    source = diff_dot(before, after, title=title, labels=labels).source
    for word in expected:
        assert word in source


def test_diff_labels_must_name_all_three_marks(conv_relu_gm):
    from common.viz import diff_dot

    with pytest.raises(ValueError, match=r"labels lacks removed, rewired: give all of added"):
        diff_dot(conv_relu_gm, conv_relu_gm, labels={"added": "A"})


def test_draw_diff_refuses_what_is_not_a_graph_module(conv_relu_gm):
    from common.viz import draw_diff

    with pytest.raises(TypeError, match=r"draw_diff needs a torch\.fx\.GraphModule, got Linear"):
        draw_diff(torch.nn.Linear(2, 2), conv_relu_gm)


def test_a_graph_against_itself_marks_nothing(conv_relu_gm):
    from common.viz import diff_dot

    source = diff_dot(conv_relu_gm, conv_relu_gm).source
    assert (
        "penwidth=2.5" not in source
        and "(removed)" not in source
        and '#c2410c"' not in (source.split("label=<", 1)[0] + source.split("</table>>", 1)[1])
    )


@needs_dot
def test_draw_diff_writes_a_picture_with_its_legend(conv_relu_gm, tmp_path, monkeypatch):
    from common.viz import draw_diff

    monkeypatch.setenv("PT2E_COURSE_DRAW_DIR", str(tmp_path))
    before, after = removed_relu(conv_relu_gm)
    draw_diff(before, after, title="步驟 6：清理")
    (svg,) = tmp_path.glob("*.svg")
    text = svg.read_text(encoding="utf-8")
    assert "步驟 6：清理" in text and "移除的 node" in text and "− relu" in text


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        (
            "Step 6",
            "Step 6. A graph of 4 nodes: x, _guards_fn, conv2d, output. Removed: relu. "
            "Rewired edges: 1.",
        ),
        (
            "步驟 6：",
            "步驟 6。共 4 個 node 的圖：x、_guards_fn、conv2d、output。"
            "移除：relu。改接的邊：1 條。",
        ),
    ],
)
def test_text_alternative_says_what_the_picture_shows(conv_relu_gm, title, expected):
    from common.viz import _Diff, describe

    before, after = removed_relu(conv_relu_gm)
    assert describe(after, title=title, diff=_Diff(before, after)) == expected


@pytest.fixture(scope="module")
def gm():
    return export_module(get_model("conv_relu"), example_inputs(1))


def test_lowest_is_red_highest_green_and_middle_yellow():
    assert _value_colour(10, 10, 30) == "#f87171"
    assert _value_colour(30, 10, 30) == "#4ade80"
    assert _value_colour(20, 10, 30) == "#fde047"
    assert _value_colour(99, 10, 30) == "#4ade80", "clamped"
    assert _value_colour(5, 5, 5) == "#fde047", "one value: the middle colour"


def test_coloured_nodes_legend_and_tooltip(gm):
    dot = to_dot(gm, title="SQNR", values={"conv2d": 12.0, "relu": 40.0}, value_name="SQNR dB")
    source = dot.source

    def node(name):  # the node's statement: its attributes end at the first "]" + newline
        return source.split(f"\t{name} [", 1)[1].split("]\n", 1)[0]

    assert 'fillcolor="#f87171"' in node("conv2d") and "SQNR dB: 12.00" in node("conv2d")
    assert 'fillcolor="#4ade80"' in node("relu") and "SQNR dB: 40.00" in node("relu")
    legend = source.split("label=<", 1)[1].split("labelloc", 1)[0]
    assert "SQNR dB" in legend and "12.0" in legend and "40.0" in legend, "name and scale"
    assert "<svg" in to_svg(dot)


def test_without_values_nothing_changes(gm):
    assert to_dot(gm, title="t").source == to_dot(gm, title="t", values={}).source


def test_unknown_node_is_refused_by_name(gm):
    with pytest.raises(ValueError, match="cannot colour 'nope'"):
        to_dot(gm, values={"nope": 1.0})


@needs_dot
def test_draw_hands_its_picture_to_the_build_while_the_site_is_built(conv_relu_gm, tmp_path):
    lesson.start(lang="en", name="m00_1_getting_a_graph")
    try:
        draw(conv_relu_gm, title="conv → relu", highlight=["conv2d"])
        (picture,) = lesson.take_pictures()
    finally:
        lesson.stop()
    svg, alt, focus = picture
    assert svg.startswith("<?xml") and "conv → relu" in alt and "<svg" in focus
    assert lesson.take_pictures() == [], "taken once; a reader's draw collects nothing"
