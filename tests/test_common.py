"""Unit tests of the common package: versions, model zoo, export, quiet, draw, cpu, timing."""

import logging
import re
import tomllib
import warnings
from dataclasses import replace

import pytest
import torch
from lesson_scripts import ROOT
from marks import needs_dot

import common
from common import cpu as cpu_module
from common.cpu import ISA_PATHS, describe, isa_environment, run_under_isa, weaker_paths
from common.models import (
    MODEL_NAMES,
    TRANSFORMER_NAMES,
    EncoderBlock,
    example_inputs,
    get_model,
    input_shape,
)
from common.pt2e import calibrate, export_module, quiet
from common.timing import Timing, compare_speed, timing_threads
from common.viz import GraphvizMissingError, draw, to_dot


def test_supported_versions_match_pyproject_pins():
    with open(ROOT / "pyproject.toml", "rb") as f:
        pins = tomllib.load(f)["project"]["dependencies"]
    for name, version in common.SUPPORTED_VERSIONS.items():
        assert f"{name}=={version}" in pins


@pytest.mark.parametrize(
    ("installed", "message"),
    [
        (
            {"torch": "2.9.1", "torchao": "0.18.0"},
            "needs torch==2.13.0 but torch 2.9.1 is installed",
        ),
        ({"torch": "2.13.0", "torchao": "0.17.0"}, "needs torchao==0.18.0 but torchao 0.17.0"),
    ],
)
def test_wrong_versions_are_refused_with_the_fix(installed, message):
    with pytest.raises(ImportError, match=message) as info:
        common.check_versions(installed)
    assert "pip install torch==2.13.0 torchao==0.18.0" in str(info.value)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_models_are_deterministic_and_accept_example_inputs(name):
    first, second = get_model(name), get_model(name)
    assert not first.training
    for (key, a), (_, b) in zip(
        first.state_dict().items(), second.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), key
    with torch.no_grad():
        assert torch.equal(first(*example_inputs(2)), second(*example_inputs(2)))


@pytest.mark.parametrize("name", TRANSFORMER_NAMES)
def test_transformers_are_deterministic_and_export_equal_to_eager(name):
    first, second = get_model(name), get_model(name)
    assert not first.training
    for (key, a), (_, b) in zip(
        first.state_dict().items(), second.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), key
    x = example_inputs(2, shape=input_shape(name))
    with torch.no_grad():
        expected = first(*x)
        torch.testing.assert_close(export_module(first, x)(*x), expected)
    assert expected.shape == ((2, 10) if name.startswith("vit") else x[0].shape)


def test_both_attention_styles_compute_the_same_function():
    """q/k/v linears + SDPA given nn.MultiheadAttention's packed weights give its outputs."""
    torch.manual_seed(0)
    mha, sdpa = EncoderBlock(16, 4, 32, attention="mha"), EncoderBlock(16, 4, 32, attention="sdpa")
    state = {k: v for k, v in mha.state_dict().items() if not k.startswith("attn.")}
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        state[f"attn.{proj}.weight"] = mha.attn.in_proj_weight[16 * i : 16 * (i + 1)]
        state[f"attn.{proj}.bias"] = mha.attn.in_proj_bias[16 * i : 16 * (i + 1)]
    state["attn.out_proj.weight"] = mha.attn.out_proj.weight
    state["attn.out_proj.bias"] = mha.attn.out_proj.bias
    sdpa.load_state_dict(state)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(sdpa.eval()(x), mha.eval()(x))


def test_an_unknown_attention_style_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown attention style 'flash' \(one of: mha, sdpa\)"):
        EncoderBlock(16, 4, 32, attention="flash")


def test_get_model_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    get_model("small_cnn")
    assert torch.equal(state, torch.random.get_rng_state())


def test_unknown_model_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"unknown model 'resnet' \(one of: conv_relu, ") as info:
        get_model("resnet")
    assert all(name in str(info.value) for name in MODEL_NAMES)


@pytest.mark.parametrize("batch", [0, -1, 1.5, True])
def test_example_inputs_refuses_bad_batches(batch):
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        example_inputs(batch)


def test_example_inputs_seed_picks_the_batch():
    assert torch.equal(example_inputs(3)[0], example_inputs(3, seed=0)[0])
    assert not torch.equal(example_inputs(3, seed=0)[0], example_inputs(3, seed=1)[0])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_export_matches_eager(name):
    model, args = get_model(name), example_inputs(2)
    gm = export_module(model, args)
    assert isinstance(gm, torch.fx.GraphModule)
    with torch.no_grad():
        assert torch.equal(gm(*args), model(*args))


def test_export_refuses_a_non_module():
    with pytest.raises(TypeError, match=r"export_module needs an nn\.Module, got function"):
        export_module(lambda x: x, example_inputs(1))


def test_export_failure_says_what_to_do():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(RuntimeError, match=r"torch\.export could not trace DataDependent") as info:
        export_module(DataDependent(), example_inputs(1))
    assert "torch.cond" in str(info.value)


def test_calibrate_feeds_the_batch_size_the_model_was_exported_with():
    gm = export_module(get_model("conv_relu"), example_inputs(3))
    seen = []
    gm.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    calibrate(gm, batches=2)
    assert seen == [3, 3]


def test_calibrate_asks_for_the_batch_when_the_graph_does_not_tell():
    gm = torch.fx.symbolic_trace(get_model("conv_relu"))  # no example values recorded
    with pytest.raises(ValueError, match=r"pass it: calibrate\(model, batch=N\)"):
        calibrate(gm)


def test_quiet_drops_only_the_known_noise(caplog):
    quiet()
    quiet()  # idempotent: one filter per logger, however often it is called
    torchao_logger = logging.getLogger("torchao")
    assert len(torchao_logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="torchao"):
        torchao_logger.warning("Failed to load /x/_C_cutlass.so: nope")
        torchao_logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet()
        warnings.warn("`torch.jit.script_method` is deprecated.", DeprecationWarning, stacklevel=1)
        warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]


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


# ----------------------------------------------------------------------------- charts


@pytest.fixture
def pyplot():
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context():  # each test starts from, and leaves, matplotlib's defaults
        matplotlib.rcdefaults()
        yield plt
        plt.close("all")


def test_course_style_sets_the_cjk_font_and_a_second_call_changes_nothing(pyplot):
    import matplotlib as mpl

    from common.charts import CJK_FONTS, use_course_style

    font = use_course_style()
    first = dict(mpl.rcParams)
    assert font in CJK_FONTS and mpl.rcParams["font.sans-serif"] == [font, "DejaVu Sans"]
    assert use_course_style() == font and dict(mpl.rcParams) == first


def test_chinese_labels_are_drawn_with_cjk_glyphs(pyplot):
    from matplotlib import font_manager

    from common.charts import use_course_style

    from course_gallery import missing_glyphs

    figure, axes = pyplot.subplots()
    axes.set_title("校準後的 scale")
    assert missing_glyphs(figure), "matplotlib's default font has no Chinese glyphs"
    use_course_style()
    figure, axes = pyplot.subplots()
    title = axes.set_title("校準後的 scale")
    axes.set_xlabel("數值 −1")
    assert missing_glyphs(figure) == []
    path = font_manager.findfont(title.get_fontproperties(), fallback_to_default=False)
    assert font_manager.get_font(path).get_char_index(ord("校")), path


def test_the_gallery_refuses_a_chart_whose_chinese_has_no_font(pyplot):
    from course_gallery import check_chart_glyphs

    pyplot.subplots()[1].set_ylabel("準確度")
    with pytest.raises(RuntimeError, match=r"'度' of '準確度'.*use_course_style\(\)"):
        check_chart_glyphs()


def test_the_font_is_set_in_one_place_for_the_course():
    """Charts get their font from use_course_style; the gallery resets matplotlib per lesson."""
    from course_conf import make_config

    gallery = make_config("en")["sphinx_gallery_conf"]
    assert "matplotlib" in gallery["image_scrapers"] and "matplotlib" in gallery["reset_modules"]
    font_setting = re.compile(r"rcParams\[.font\.|rc\(.font|font_manager|fontproperties|fontname")
    for path in sorted((ROOT / "examples").rglob("*.py")):
        code = path.read_text(encoding="utf-8")
        assert not font_setting.search(code), f"{path.name} sets a font; use use_course_style()"
        if "matplotlib" in code:
            assert "use_course_style()" in code, f"{path.name} charts without use_course_style()"


@pytest.mark.parametrize(
    ("text", "width"),
    [("recipe", 6), ("配方", 4), ("x86 預設設定", 12), ("int8 q/dq（模擬）", 17), ("2.83×", 5)],
)
def test_display_width_counts_two_columns_per_chinese_character(text, width):
    from common.charts import display_width

    assert display_width(text) == width


def test_pad_lines_up_chinese_and_ascii_cells_by_columns():
    from common.charts import display_width, pad

    assert pad("配方", 8) == "配方    " and pad("配方", 8, align=">") == "    配方"
    labels = ["便宜的配方", "HistogramObserver", "x86 預設設定 + reduce_range"]
    left = [pad(label, 30) + "|" for label in labels]
    assert {display_width(line) for line in left} == {31}
    assert left[1] == f"{labels[1]:<30}|" and pad(labels[1], 30, align=">") == f"{labels[1]:>30}"
    assert pad("便宜的配方", 4) == "便宜的配方", "a cell wider than its column is not cut"
    with pytest.raises(ValueError, match="align must be '<' or '>'"):
        pad("配方", 8, align="^")


# --------------------------------------------------------------- common.cpu and common.timing


def uncapped(monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("flags", "path"),
    [
        ({"avx512_vnni": True, "amx_int8": True}, "AVX512_CORE_AMX"),
        (
            {"avx512_vnni": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True},
            "AVX512_CORE_VNNI",
        ),
        ({"avx512_bw": True, "avx512_vl": True, "avx512_dq": True}, "AVX512_CORE"),
        ({"avx_vnni": True}, "AVX2_VNNI"),
        ({"avx2": True}, "AVX2"),
    ],
    ids=["amx", "avx512-vnni", "avx512-without-vnni", "avx-vnni", "avx2"],
)
def test_describe_names_the_int8_path_from_the_cpu_flags(flags, path, monkeypatch):
    uncapped(monkeypatch)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"cpu_name": "Test CPU", **flags})
    info = describe()
    assert info.onednn == path
    assert info.vnni == path.endswith(("VNNI", "AMX")), "VNNI: the int8 sums are exact"
    assert info.amx_int8 == (path == "AVX512_CORE_AMX")
    assert not info.emulated
    yes_no = "yes" if info.vnni else "no"
    assert f"oneDNN int8 path {path}; VNNI {yes_no}" in info.verdict
    assert info.verdict.startswith("Test CPU: ")


def test_describe_follows_the_isa_cap_down_but_never_up(monkeypatch):
    uncapped(monkeypatch)
    native = describe()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = describe()
    assert (capped.onednn, capped.vnni, capped.amx_int8, capped.bf16) == (
        "AVX2",
        False,
        False,
        False,
    )
    assert capped.emulated and "capped by ONEDNN_MAX_CPU_ISA" in capped.verdict
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert describe().onednn == native.onednn, "a cap above the hardware changes nothing"


def test_verdict_and_kernel_path_say_threads_and_both_isas():
    info = describe()
    assert f"{info.threads} of {info.cores} threads" in info.verdict
    assert info.kernel_path == f"{info.aten}+{info.onednn}"
    assert set(info.as_dict()) >= {"onednn", "vnni", "amx_int8", "bf16", "threads"}


@pytest.mark.parametrize(
    ("path", "weaker"),
    [
        ("AVX2", []),
        ("AVX2_VNNI", ["AVX2"]),
        ("AVX512_CORE", ["AVX2"]),
        ("AVX512_CORE_VNNI", ["AVX2", "AVX512_CORE"]),
        ("AVX512_CORE_AMX", ["AVX2", "AVX512_CORE", "AVX512_CORE_VNNI"]),
    ],
)
def test_weaker_paths_are_those_a_cap_can_reach(path, weaker):
    assert weaker_paths(cpu=replace(describe(), onednn=path)) == weaker


def test_isa_environment_caps_every_library_and_refuses_unknown_names():
    assert isa_environment("native") == {}
    assert isa_environment("AVX2") == {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # torch.compile's float linears run on MKL
    }
    assert all(isa_environment(isa)["ONEDNN_MAX_CPU_ISA"] == isa for isa in ISA_PATHS)
    with pytest.raises(ValueError, match=r"unknown ISA 'avx2' \(one of: native, AVX2, "):
        isa_environment("avx2")


def test_run_under_isa_runs_a_fresh_capped_interpreter():
    found = run_under_isa("AVX2", "import torch\nresult = torch.backends.cpu.get_cpu_capability()")
    assert found["result"] == "AVX2", "ATen capped at AVX2"
    assert found["cpu"]["onednn"] == "AVX2" and found["cpu"]["emulated"]
    assert not found["cpu"]["vnni"]


def test_run_under_isa_reports_the_failing_line():
    with pytest.raises(RuntimeError, match=r"under ISA AVX2 failed \(exit 1\): ZeroDivisionError"):
        run_under_isa("AVX2", "result = 1 / 0")


def test_run_under_isa_refuses_an_unknown_isa_before_starting_anything(monkeypatch):
    monkeypatch.setattr(cpu_module.subprocess, "run", None)  # would fail if it were called
    with pytest.raises(ValueError, match="unknown ISA"):
        run_under_isa("SSE4", "result = 1")


def test_compare_speed_interleaves_rounds_in_a_rotating_order():
    calls = []
    models = {label: (lambda x, label=label: calls.append(label)) for label in "abc"}
    timings = compare_speed(models, (None,), rounds=5, warmup=1)
    rounds = [calls[i : i + 3] for i in range(0, len(calls), 3)]
    assert len(rounds) == 6 and all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert [r[0] for r in rounds] == ["a", "b", "c", "a", "b", "c"], "each model leads in turn"
    assert all(timings[label].rounds == 5 for label in "abc"), "warm-up rounds are not timed"


def test_compare_speed_times_on_its_threads_and_restores_the_callers():
    before, seen = torch.get_num_threads(), []
    timings = compare_speed({"m": lambda x: seen.append(torch.get_num_threads())}, (0,), rounds=5)
    assert set(seen) == {timing_threads()} and timings.threads == timing_threads()
    assert torch.get_num_threads() == before
    compare_speed({"m": lambda x: seen.append(torch.get_num_threads())}, (0,), rounds=5, threads=1)
    assert seen[-1] == 1


def test_compare_speed_table_says_how_the_numbers_were_taken():
    timings = compare_speed({"fp32": torch.neg, "int8": torch.abs}, (torch.ones(64),), rounds=5)
    table = timings.table()
    for piece in ("fp32", "int8", "median ms", "p10–p90", "spread", "load average"):
        assert piece in table
    assert f"timed with {timings.threads} thread(s), 5 interleaved rounds" in table
    assert describe().verdict.split(";")[0] in table, "the CPU's int8 verdict"
    t = timings["fp32"]
    assert t.low <= t.median <= t.high
    assert timings.ratio("fp32", "int8") == t.median / timings["int8"].median


def test_timing_spread_is_the_middle_range_over_the_median():
    assert Timing(median=10.0, low=9.0, high=12.0, rounds=5).spread == pytest.approx(0.3)
    assert Timing(median=0.0, low=0.0, high=0.0, rounds=5).spread == 0.0


@pytest.mark.parametrize(
    ("models", "rounds", "message"),
    [({}, 30, "at least one model"), ({"m": abs}, 4, "rounds=4 gives no usable median")],
    ids=["no-models", "too-few-rounds"],
)
def test_compare_speed_refuses_unusable_settings(models, rounds, message):
    with pytest.raises(ValueError, match=message):
        compare_speed(models, (1,), rounds=rounds)


# ------------------------------------------------------------------------------ common.aoti
def test_package_key_follows_the_program_its_weights_and_its_input_shape():
    from common.aoti import package_key

    def program(weight=1.0, batch=2):
        torch.manual_seed(0)  # the bias too
        model = torch.nn.Linear(3, 2)
        with torch.no_grad():
            model.weight.fill_(weight)
        return torch.export.export(model, (torch.ones(batch, 3),))

    assert package_key(program()) == package_key(program())
    assert package_key(program(weight=2.0)) != package_key(program())
    assert package_key(program(batch=4)) != package_key(program())


def test_compiled_package_refuses_a_graph_module_and_says_how_to_export_it():
    from common.aoti import compiled_package

    gm = export_module(torch.nn.Linear(3, 2), (torch.ones(2, 3),))
    with pytest.raises(TypeError, match=r"got GraphModule; export it first: torch\.export"):
        compiled_package(gm, "linear")


def test_kernel_calls_counts_the_generated_cpp_calls(tmp_path):
    import zipfile

    from common.aoti import kernel_calls

    package = tmp_path / "model.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr(
            "model/data/aotinductor/model/abc.wrapper.cpp",
            "aoti_torch_cpu__qlinear_pointwise_tensor(a);\n"
            "aoti_torch_cpu__qlinear_pointwise_tensor(b);\n"
            "aoti_torch_cpu__qlinear_pointwise_binary_tensor(c);\n"
            "aoti_torch_cpu_scaled_dot_product_flash_attention_for_cpu(d);\n",
        )
        archive.writestr("model/data/weights.bin", "aoti_torch_cpu__linear_pointwise(x);")
    assert kernel_calls(package) == {
        "qlinear_pointwise": 2,
        "qlinear_pointwise_binary": 1,
        "scaled_dot_product_flash_attention_for_cpu": 1,
    }


def test_a_step_naming_a_temporary_file_is_keyed_by_the_files_contents(tmp_path):
    """run_under_isa's default key: two runs of a lesson save the same weights under new
    temporary names (M04-2), and the other language's build must find the first one's answer;
    other weights are another step."""
    from common.cpu import _what_source_computes

    first, second, other = (tmp_path / name for name in ("a.pt", "b.pt", "c.pt"))
    first.write_bytes(b"weights")
    second.write_bytes(b"weights")
    other.write_bytes(b"other weights")
    step = "model.load_state_dict(torch.load({!r}))  # {}"
    assert _what_source_computes(step.format(str(first), "en")) == _what_source_computes(
        step.format(str(second), "中文")
    )
    assert _what_source_computes(step.format(str(first), "")) != _what_source_computes(
        step.format(str(other), "")
    )
