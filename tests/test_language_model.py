"""common.language_model: the text, the cache's equivalence, export, and the checks' errors.

Untrained, small decoders: what these tests check does not depend on the weights.
"""

import pytest
import torch

from common.language_model import (
    MAX_LEN,
    VOCAB,
    WINDOW,
    Decoder,
    decode,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    unigram_perplexity,
)


def small(seed: int = 0, **shape) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(**{"dim": 32, "layers": 2, "heads": 4, "kv_heads": 2, "hidden": 64, **shape})


def test_the_text_round_trips_and_a_foreign_character_is_named():
    assert decode(encode(VOCAB)) == VOCAB
    with pytest.raises(ValueError, match=r"'€'.*use only these"):
        encode("5 €")


def test_held_out_text_is_never_trained_on():
    train, held_out = split("train"), split("held_out")
    assert len(train) > 8 * len(held_out) > 0
    assert torch.equal(torch.cat([train, held_out]), encode(decode(torch.cat([train, held_out]))))
    with pytest.raises(ValueError, match="'train' or 'held_out'"):
        split("test")


def test_prefill_then_decode_equals_one_pass_without_the_cache():
    model = small().eval()
    tokens = encode("def f(x):\n    return x")
    with torch.no_grad():
        whole = model.caching(False)(tokens[None], torch.arange(len(tokens)))
        model.caching(True)
        steps = [model(tokens[None, :5], torch.arange(5))]
        for position in range(5, len(tokens)):
            steps.append(model(tokens[None, position : position + 1], torch.tensor([position])))
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-5, atol=1e-5)


def test_what_the_cache_held_before_is_never_read():
    model = small().eval()
    first = generate(model, "while True:", 20)
    for name, buffer in model.named_buffers():
        if name.endswith("cache"):
            buffer.normal_()  # another conversation's keys and values
    assert generate(model, "while True:", 20) == first
    reset_cache(model)
    assert all(b.abs().sum() == 0 for n, b in model.named_buffers() if n.endswith("cache"))


def test_the_exported_program_prefills_and_decodes_as_the_model_does():
    model = small().eval()
    program = export_decoder(model)
    mutated = program.run_decompositions().graph_signature.buffers_to_mutate.values()
    assert sorted(mutated) == sorted(
        f"layers.{i}.attention.{kind}_cache" for i in range(2) for kind in "kv"
    )
    assert generate(program.module(), "class A:", 30) == generate(model, "class A:", 30)


def test_generate_and_perplexity_refuse_what_does_not_fit():
    model = small().eval()
    with pytest.raises(ValueError, match="must fit the cache"):
        generate(model, "x" * (MAX_LEN - 3), 4)
    with pytest.raises(ValueError, match="windows must be 1"):
        perplexity(model, windows=0)
    with pytest.raises(ValueError, match="size 1 specialises"):
        export_decoder(model, prompt="x")


def test_an_untrained_model_is_no_better_than_character_frequencies():
    # The bar the trained model must clear (M08-1 asserts it does): an untrained one is at it
    # or worse, so the bar can tell a model that learned from one that did not.
    assert perplexity(small().eval(), windows=2) > unigram_perplexity() > 10
    assert len(split("held_out")) // WINDOW >= 20


def test_training_lets_a_timing_of_the_other_build_in_after_every_step(monkeypatch, tmp_path):
    """Training takes about 100 s in one cache entry: in the site's build, a timing of the other
    language's build waits for the next pause point (common.turns), so there is one per step."""
    import common.language_model as language_model

    pauses = []
    monkeypatch.setattr("common.cache.cache_folder", lambda: tmp_path)
    monkeypatch.setattr(language_model, "let_a_timing_in", lambda: pauses.append(len(pauses)))
    _, losses = language_model.train_decoder(steps=3, dim=32, layers=1, heads=4, kv_heads=2)
    assert len(losses) == len(pauses) == 3
