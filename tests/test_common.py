"""Unit tests of the common package: versions, model zoo, export, quiet, draw."""

import logging
import tomllib
import warnings

import pytest
import torch

import common
from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import GraphvizMissingError, draw, to_dot

from conftest import ROOT, needs_dot


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
