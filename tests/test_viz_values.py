"""draw(..., values=...): nodes coloured by a number, a legend, the number in the tooltip."""

import pytest

from common.models import example_inputs, get_model
from common.pt2e import export_module
from common.viz import _value_colour, to_dot, to_svg


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
