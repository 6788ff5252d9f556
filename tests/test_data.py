"""common.data: the digits splits, deterministic training, the weight cache, errors."""

import pytest
import torch

from common import cache, data
from common.data import (
    SPLITS,
    accuracy,
    digits,
    export_digits_model,
    fit,
    train_digits_cnn,
    train_digits_vit,
)
from common.models import ATTENTION_STYLES


@pytest.mark.parametrize(("split", "size"), SPLITS.items(), ids=list(SPLITS))
def test_each_split_has_its_size_and_8x8_images_in_0_1(split, size):
    images, labels = digits(split)
    assert images.shape == (size, 1, 8, 8) and labels.shape == (size,)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert 0 <= images.min() and images.max() <= 1
    assert set(labels.tolist()) == set(range(10)), "every digit appears in every split"


def test_the_splits_together_are_the_1797_digits():
    from sklearn.datasets import load_digits

    everything = load_digits()
    labels = torch.cat([digits(split)[1] for split in SPLITS])
    pixel_sums = torch.cat([digits(split)[0].sum(dim=(1, 2, 3)) for split in SPLITS]) * 16
    assert len(labels) == sum(SPLITS.values()) == len(everything.target) == 1797
    assert torch.equal(labels.bincount(), torch.tensor(everything.target).bincount())
    expected = torch.tensor(everything.images.sum(axis=(1, 2)), dtype=torch.float32)
    assert torch.equal(pixel_sums.sort().values, expected.sort().values), "each image once"


def test_a_split_is_the_same_in_every_call():
    first, second = digits("calibration"), digits("calibration")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("split", ["validation", "", "Test"])
def test_an_unknown_split_is_refused_with_the_valid_names(split):
    with pytest.raises(ValueError, match="one of: train, calibration, test"):
        digits(split)


def test_two_trainings_give_identical_weights_and_restore_the_callers_settings():
    threads = torch.get_num_threads()
    rng = torch.random.get_rng_state()
    one = train_digits_cnn(seed=3, epochs=1, cache=False)
    two = train_digits_cnn(seed=3, epochs=1, cache=False)
    for (name, a), (_, b) in zip(one.state_dict().items(), two.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name} differs between two trainings"
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert not torch.are_deterministic_algorithms_enabled()
    other = train_digits_cnn(seed=4, epochs=1, cache=False)
    assert not torch.equal(one.fc2.weight, other.fc2.weight), "the seed matters"


def test_the_cache_returns_the_trained_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "cache_folder", lambda: tmp_path)
    trained = train_digits_cnn(seed=5, epochs=1)
    (stored,) = tmp_path.glob("weights/digits_cnn-*-s5-e1.pt")
    assert not list(tmp_path.glob("weights/.*")), "no temporary file is left behind"
    loaded = train_digits_cnn(seed=5, epochs=1)
    assert not loaded.training
    for name, value in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert stored.exists()


def test_the_cache_is_keyed_by_the_kernel_path(tmp_path, monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(cache, "cache_folder", lambda: tmp_path)
    native = data.describe()
    train_digits_cnn(seed=5, epochs=1)
    other = replace(native, aten=f"not-{native.aten}")
    monkeypatch.setattr(data, "describe", lambda: other)
    train_digits_cnn(seed=5, epochs=1)
    names = sorted(p.name for p in tmp_path.glob("weights/digits_cnn-*-s5-e1.pt"))
    assert len(names) == 2, f"one file per kernel path, got {names}"
    for cpu in (native, other):
        assert any(f"-{cpu.kernel_path}-" in name for name in names), cpu.kernel_path


def test_the_trained_model_reads_digits():
    assert accuracy(train_digits_cnn()) > 0.95


def test_the_exported_model_takes_any_batch_size():
    model = train_digits_cnn()
    gm = export_digits_model(model)
    images, _ = digits("test")
    for batch in (1, 7, 500):
        with torch.no_grad():
            torch.testing.assert_close(gm(images[:batch]), model(images[:batch]))


@pytest.mark.parametrize("attention", ATTENTION_STYLES)
def test_two_vit_trainings_give_identical_weights(attention):
    rng = torch.random.get_rng_state()
    one = train_digits_vit(attention=attention, seed=3, epochs=1, cache=False)
    two = train_digits_vit(attention=attention, seed=3, epochs=1, cache=False)
    for (name, a), (_, b) in zip(one.state_dict().items(), two.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name} differs between two trainings"
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert not one.training


def test_the_vit_cache_is_keyed_by_style_and_kernel_path(tmp_path, monkeypatch):
    from common.cpu import describe

    monkeypatch.setattr(cache, "cache_folder", lambda: tmp_path)
    trained = train_digits_vit(attention="mha", seed=5, epochs=1)
    (stored,) = tmp_path.glob("weights/digits_vit_mha-*-s5-e1.pt")
    assert describe().kernel_path in stored.name
    assert not list(tmp_path.glob("weights/.*")), "no temporary file is left behind"
    loaded = train_digits_vit(attention="mha", seed=5, epochs=1)
    for name, value in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


@pytest.mark.parametrize("attention", ATTENTION_STYLES)
def test_the_trained_vit_reads_digits_with_any_batch_size(attention):
    model = train_digits_vit(attention=attention)
    assert accuracy(model) > 0.9
    gm = export_digits_model(model)
    images, _ = digits("test")
    for batch in (1, 7, 500):
        with torch.no_grad():
            torch.testing.assert_close(gm(images[:batch]), model(images[:batch]))


def test_an_unknown_vit_attention_style_is_refused():
    with pytest.raises(ValueError, match="unknown attention style 'flash'"):
        train_digits_vit(attention="flash", cache=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": 1.5}, "seed must be an integer"),
        ({"seed": True}, "seed must be an integer"),
        ({"epochs": 0}, "epochs must be a positive integer"),
        ({"epochs": "6"}, "epochs must be a positive integer"),
    ],
    ids=["float seed", "bool seed", "zero epochs", "string epochs"],
)
def test_bad_training_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_digits_cnn(**kwargs)


def test_fit_refuses_zero_epochs():
    with pytest.raises(ValueError, match="epochs must be a positive integer"):
        fit(data.DigitsCNN(), epochs=0)


def test_export_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match=r"needs an nn\.Module"):
        export_digits_model(lambda x: x)
