"""common.models: the model zoo is deterministic, exports and refuses bad names and inputs."""

import pytest
import torch

from common.models import (
    MODEL_NAMES,
    TRANSFORMER_NAMES,
    EncoderBlock,
    example_inputs,
    get_model,
    input_shape,
)
from common.pt2e import export_module


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
