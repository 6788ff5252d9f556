"""
M08-1 A decoder and its KV cache
================================

A language model writes text one token at a time, each from everything written before. Done
naively, every new token runs the model over the whole text again. A **KV cache** keeps each
attention layer's keys and values for the positions already seen, so a step processes only the
new token. This lesson trains the small decoder M08 takes to a phone, shows that its cache
changes the work and not the result, and exports it, cache included, as one program that does
both the prompt (**prefill**) and each new token (**decode**).

**What you will learn**

- What a small modern decoder is made of, and which of its weights a quantizer will see
- How a KV cache works: written in place with ``index_copy_``, read under a mask, equal to a
  pass without it
- How the cache looks in an exported program (an in-place op, then ``buffers_to_mutate``), and
  how one ``Dim`` lets the same program prefill and decode

**Prerequisites**:
:ref:`M00-1 · Getting a graph <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`,
:ref:`M05-2 · Static vs dynamic int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`,
:ref:`M06-4 · Shapes that change <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The text, the model and the few things every M08 page does with them live in
# ``common.language_model``: ``train_decoder``, ``perplexity``, ``generate``,
# ``export_decoder``.

import math
import pydoc_data.topics
from collections import Counter

import torch
from torch import nn

from common.charts import pad
from common.expect import expect_error
from common.language_model import (
    MAX_LEN,
    TEXT,
    VOCAB,
    WINDOW,
    RMSNorm,
    decode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    train_decoder,
    unigram_perplexity,
)
from common.pt2e import quiet
from common.viz import draw

quiet()

PROMPT = "The import statement"
index_copy = torch.ops.aten.index_copy_.default

# %%
# Step 1 — The text
# -----------------
# ``TEXT`` is every ``help()`` topic of the standard library (``pydoc_data.topics``, shipped
# with every Python: nothing to download), joined in the order of their names: English
# technical prose with code in it, as the start of the first topic shows. The model reads it
# character by character, so its vocabulary ``VOCAB`` is the text's distinct characters: a
# token is one character.

print(f"{len(pydoc_data.topics.topics)} topics, {len(TEXT):,} characters")
print(f"{len(TEXT.encode()):,} bytes of UTF-8, {len(VOCAB)} distinct characters:")
print(repr(VOCAB))
print(TEXT[:180])
assert len(TEXT.encode()) > 400_000, "more than 400 kB of text"
assert len(VOCAB) < 128, "fewer than 128 tokens: the vocabulary of a character model is tiny"

# %%
# The last tenth is held out: the model never trains on it, and the perplexity below is
# measured on it. Training reads windows of ``WINDOW`` characters from the rest.

train, held_out = split("train"), split("held_out")
print(f"train {len(train):,} characters, held out {len(held_out):,}, windows of {WINDOW}")
assert len(train) + len(held_out) == len(TEXT), "the two parts cover the text"
assert decode(held_out) == TEXT[len(train) :], "the held-out part is the end of the text"
assert len(held_out) == len(TEXT) - int(len(TEXT) * 0.9), "the last tenth"

# %%
# Step 2 — The model
# ------------------
# ``Decoder`` holds, scaled down, what small open LLMs hold: an embedding from token to
# vector, pre-norm blocks (``RMSNorm``, attention with rotary positions, a SwiGLU MLP),
# a last ``RMSNorm`` and an output linear back to one score per token. The output linear has
# its own weight (an **untied** embedding), so quantizing one leaves the other alone.

model, losses = train_decoder()
print(model)

# %%
# The attention is **grouped-query**: 4 query heads share 2 key/value heads, so ``wk`` and
# ``wv`` are half as wide as ``wq`` and the cache holds 2 heads instead of 4. Rotary
# positions have no weights: they rotate queries and keys by an angle per position, from the
# ``cos``/``sin`` tables the model keeps as buffers.

attention = model.layers[0].attention
dim, vocab = model.tok_embeddings.embedding_dim, model.tok_embeddings.num_embeddings
hidden, layers = model.layers[0].feed_forward.w1.out_features, len(model.layers)
kv_dim = attention.kv_heads * attention.head_dim
print(f"dim {dim}, {layers} blocks, heads {attention.heads}, key/value heads {attention.kv_heads}")
print(f"head size {attention.head_dim}: wq {dim} → {dim}, wk and wv {dim} → {kv_dim}")
assert (attention.heads, attention.kv_heads) == (4, 2), "4 query heads, 2 key/value heads"
assert model.output.weight.data_ptr() != model.tok_embeddings.weight.data_ptr(), "untied"

# %%
# Its parameters, counted from the shapes: per block, ``wq`` and ``wo`` (dim × dim), ``wk``
# and ``wv`` (dim × kv_dim), the SwiGLU's three (dim × hidden) and two norms; then the
# embedding, the last norm and the output linear. The count is the model's own.

per_block = 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden + 2 * dim
from_shapes = vocab * dim + layers * per_block + dim + dim * vocab
total = sum(p.numel() for p in model.parameters())
print(f"from the shapes: {vocab}×{dim} + {layers}×{per_block:,} + {dim} + {dim}×{vocab}")
print(f"               = {from_shapes:,}; the model has {total:,} parameters")
assert total == from_shapes, "every parameter accounted for"

# %%
# A quantizer for linears sees the weights of every ``nn.Linear``: 7 per block and the
# output, 98 % of the parameters. The embedding is a table read by index, not a matrix
# product: which quantizers touch it, and how, is M08-2's question. The norms' weights are
# too few to matter.

kinds = {nn.Linear: "linear", nn.Embedding: "embedding", RMSNorm: "RMSNorm"}
modules, parameters = Counter(), Counter()
for module in model.modules():
    if type(module) in kinds:
        modules[kinds[type(module)]] += 1
        parameters[kinds[type(module)]] += sum(p.numel() for p in module.parameters())
for kind in kinds.values():
    share = parameters[kind] / total
    print(f"{pad(kind, 10)} {modules[kind]:>3} modules {parameters[kind]:>9,} {share:>7.2%}")
assert modules["linear"] == 7 * layers + 1, "7 linears per block and the output"
assert sum(parameters.values()) == total, "linears, embedding and norms hold every parameter"

# %%
# Step 3 — Training
# -----------------
# ``train_decoder`` (called above) trains 300 steps of AdamW on 32 random windows each,
# deterministically, and keeps the weights in the course's cache folder: the first run trains
# (about 100 s), later ones load. The loss is the cross-entropy of the next character. It starts
# near ln 103, a uniform guess over the vocabulary, and falls.

for step in (1, 50, 100, 200, len(losses)):
    print(f"step {step:>3}: loss {losses[step - 1]:.3f}")
print(f"uniform guess over {len(VOCAB)} characters: ln {len(VOCAB)} = {math.log(len(VOCAB)):.3f}")
assert losses[-1] < losses[0] / 2, "the loss falls to less than half"

# %%
# **Perplexity** is ``exp`` of the mean cross-entropy on text the model never saw: the number
# of characters it is, on average, as unsure between as if it picked uniformly among them.
# The bar is the unigram model, which predicts every character by its frequency alone and
# ignores the context. The decoder is over four times better.

fp32_perplexity, unigram = perplexity(model), unigram_perplexity()
print(f"held-out perplexity: decoder {fp32_perplexity:.2f}, unigram {unigram:.2f}")
assert fp32_perplexity < unigram / 4, "the context makes it over four times less unsure"

# %%
# ``generate`` is greedy: one call on the prompt, then one call per new character, each time
# the likeliest. The words are English; a model this small, always taking its likeliest
# character, soon repeats itself.

sample = generate(model, PROMPT, 60)
print(f"{PROMPT!r} → {sample!r}")
repeats = any(sample.count(sample[i : i + 12]) > 1 for i in range(len(sample) - 12))
print(f"repeats a 12-character piece: {repeats}")

# %%
# Step 4 — The KV cache
# ---------------------
# Each attention layer keeps two buffers, ``k_cache`` and ``v_cache`` of shape
# ``(1, key/value heads, MAX_LEN, head size)``. A call writes its keys and values into them at
# ``positions`` (``index_copy_``, in place) and then attends over the whole cache. Prefill 20
# characters of held-out text in one call, then feed the next 20 one per call: the logits equal
# those of one pass over all 40 with the cache off (``caching(False)``, as in training).

tokens = held_out[:40]
reset_cache(model)
with torch.no_grad():
    steps = [model(tokens[None, :20], torch.arange(20))]
    steps += [model(tokens[None, p : p + 1], torch.tensor([p])) for p in range(20, 40)]
    cached = torch.cat(steps, dim=1)
    one_pass = model.caching(False)(tokens[None], torch.arange(40))
    model.caching(True)
print(f"cached {tuple(cached.shape)}, one pass {tuple(one_pass.shape)}")
print(f"largest difference: {(cached - one_pass).abs().max():.2e}")
torch.testing.assert_close(cached, one_pass, rtol=0, atol=1e-4)  # float sums in another order

# %%
# The work: a hook on the first block's ``wq`` counts the tokens each call processes. With the
# cache (``generate``, 20 new characters), the prompt once and then one token per call. Without
# it, each of the same 21 calls runs over the whole text so far.

processed = []
hook = attention.wq.register_forward_hook(lambda m, args, out: processed.append(out.shape[1]))
with torch.no_grad():
    generate(model, decode(tokens[:20]), 20)
    model.caching(False)
    for end in range(20, 41):
        model(tokens[None, :end], torch.arange(end))
    model.caching(True)
hook.remove()
with_cache, without = processed[:21], processed[21:]
print(f"with the cache, tokens per call: {with_cache} (total {sum(with_cache)})")
print(f"without it: {without[:3]} … {without[-1]} (total {sum(without)})")
assert with_cache == [20] + [1] * 20, "the prompt once, then one token per call"

# %%
# The attention still reads all ``MAX_LEN`` positions of the cache, written or not: a mask
# hides every position after each query's own, so what the cache held before (an earlier
# text, or anything) is never read. Fill the caches with noise and repeat: the logits are
# identical, bit for bit. The caches take the same memory whatever was written.

with torch.no_grad():
    for name, buffer in model.named_buffers():
        if name.endswith("cache"):
            buffer.normal_(std=100)
    again = [model(tokens[None, :20], torch.arange(20))]
    again += [model(tokens[None, p : p + 1], torch.tensor([p])) for p in range(20, 40)]
cache_bytes = sum(b.nbytes for n, b in model.named_buffers() if n.endswith("cache"))
print(f"identical after noise: {torch.equal(torch.cat(again, dim=1), cached)}")
print(f"{2 * layers} caches of {tuple(attention.k_cache.shape)}: {cache_bytes:,} bytes")
assert torch.equal(torch.cat(again, dim=1), cached), "the mask hides what the cache held"

# %%
# Step 5 — Export it with its cache
# ---------------------------------
# ``export_decoder`` calls ``torch.export.export`` with a sequence length that may be anything
# from 1 to ``MAX_LEN`` (a ``Dim``, M06-4), under ``torch.no_grad()`` (a cache update in a
# graph that tracks gradients fails to lower, M08-3). The picture is one block's attention,
# exported alone on 7 positions: the rotary rotations of q and k, then the two ``index_copy_``
# nodes (highlighted) writing k and v into the cache buffers in place, and
# ``scaled_dot_product_attention`` reading the caches they return.

program = export_decoder(model)
positions = torch.arange(7)
mask = torch.arange(MAX_LEN) <= positions[:, None]
inputs = (torch.zeros(1, 7, dim), model.cos[positions], model.sin[positions], positions, mask)
with torch.no_grad():
    block_attention = torch.export.export(attention, inputs).graph_module
copies = block_attention.graph.find_nodes(op="call_function", target=index_copy)
title = "Block 0's attention: k, v into the cache"
draw(block_attention, highlight=[n.name for n in copies], title=title)
assert [n.args[0].name for n in copies] == ["b_k_cache", "b_v_cache"], "k and v, in place"
# sphinx_gallery_start_ignore
# The picture's attention is the same ops as block 0's attention inside the whole program.
in_block = [
    n
    for n in program.graph.nodes
    if n.op == "call_function"
    and any(
        path == "layers.0.attention" or path.startswith("layers.0.attention.")
        for path, _ in n.meta.get("nn_module_stack", {}).values()
    )
]
assert Counter(n.target for n in in_block) == Counter(
    n.target for n in block_attention.graph.nodes if n.op == "call_function"
), "the picture is block 0's attention"
# sphinx_gallery_end_ignore

# %%
# The whole program has two such nodes per block. In this graph (the training IR, what
# ``torch.export`` returns) the mutation is an op like any other: the signature's
# ``buffers_to_mutate`` is empty. ``run_decompositions()``, which ExecuTorch's lowering runs,
# makes the graph functional: each ``index_copy_`` becomes an ``index_put`` that returns a new
# tensor, and the signature records which output is written back to which buffer. There the
# 8 caches appear, the mutable state ExecuTorch will keep between calls (M08-3).

writes = program.graph.find_nodes(op="call_function", target=index_copy)
decomposed = program.run_decompositions()
mutated = decomposed.graph_signature.buffers_to_mutate
cache_names = [n for n, _ in model.named_buffers() if n.endswith("cache")]
before = program.graph_signature.buffers_to_mutate
print(f"training IR: {len(writes)} index_copy_ nodes, buffers_to_mutate = {before}")
print("after run_decompositions():")
for output, buffer in mutated.items():
    print(f"  {pad(output, 12)} → {buffer}")
assert len(writes) == 2 * layers and not before, "in place, nothing to write back"
assert sorted(mutated.values()) == sorted(cache_names), "the 8 caches, written back"

# %%
# The length is one symbol in the program: ``tokens`` has shape ``[1, s]`` and ``positions``
# ``[s]``, and ``range_constraints`` bounds ``s`` by the ``Dim``'s range. So one program takes
# a prompt of 20 (prefill) and then a single token (decode), and its logits match the model's
# from Step 4.

shapes = {n.name: list(n.meta["val"].shape) for n in program.graph.nodes if n.op == "placeholder"}
print(f"tokens {shapes['tokens']}, positions {shapes['positions']}")
print(f"range_constraints: {program.range_constraints}")
(length_range,) = program.range_constraints.values()
assert (length_range.lower, length_range.upper) == (1, MAX_LEN), "1 … MAX_LEN"
exported = program.module()
with torch.no_grad():
    prefill = exported(tokens[None, :20], torch.arange(20))
    step = exported(tokens[None, 20:21], torch.tensor([20]))
print(f"prefill {tuple(prefill.shape)}, decode {tuple(step.shape)}, one program")
torch.testing.assert_close(torch.cat([prefill, step], dim=1), cached[:, :21], rtol=0, atol=1e-4)

# %%
# Greedy generation through the exported program gives the model's text, token for token.

exported_sample = generate(exported, PROMPT, 60)
print(f"exported: {exported_sample!r}")
assert exported_sample == generate(model, PROMPT, 60), "the same 60 characters"

# %%
# Past the cache: a call of ``MAX_LEN + 1`` tokens. The eager model fails deep inside, on the
# rotary table's 256 rows; the exported program refuses at its door, with the bound in the
# message.

too_long = (torch.zeros(1, MAX_LEN + 1, dtype=torch.long), torch.arange(MAX_LEN + 1))
with expect_error(IndexError, match="out of bounds"):
    model(*too_long)
with expect_error(AssertionError, match=f"<= {MAX_LEN}"):
    exported(*too_long)

# %%
# Summary
# -------
# - The decoder: 103 characters in, 4 pre-norm blocks (RMSNorm, rotary, grouped-query
#   attention with 4 query and 2 key/value heads, SwiGLU), an untied output linear; its linears
#   hold 98 % of the weights. Trained on the standard library's ``help()`` texts, it reaches a
#   held-out perplexity over four times below the unigram bar.
# - The KV cache is two buffers per block, written in place by ``index_copy_`` and read under a
#   mask. It turns each new token's work from the whole text into one token, and leaves the
#   logits unchanged; what it held before is never read.
# - ``export_decoder`` keeps the cache: in-place ``index_copy_`` nodes in the training IR (no
#   ``buffers_to_mutate``), the 8 caches in ``buffers_to_mutate`` after
#   ``run_decompositions()``. One length ``Dim`` (1 … ``MAX_LEN``) makes one program for prefill
#   and decode; it generates the model's text token for token and refuses ``MAX_LEN + 1``.
#
# Exercises
# ---------
# 1. Predict how many ``index_copy_`` nodes the 4-block program has and which buffer each
#    writes. Then export a 1-block ``Decoder(layers=1)``: how many there?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from common.language_model import Decoder
#
#          found = program.graph.find_nodes(op="call_function", target=index_copy)
#          targets = {n.args[0].name for n in found}
#          print(f"{len(found)} index_copy_ nodes writing {sorted(targets)}")
#          assert len(found) == len(targets) == 8, "each k and v cache of each block, once"
#          small = export_decoder(Decoder(layers=1).eval())
#          one_block = small.graph.find_nodes(op="call_function", target=index_copy)
#          assert len(one_block) == 2, "one block: its k and its v cache"
#
# 2. Export the model with its cache off (``caching(False)`` on a copy). Predict
#    ``buffers_to_mutate`` after ``run_decompositions()``, and whether the caches are still
#    buffers of the program.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          import copy
#
#          no_cache = export_decoder(copy.deepcopy(model).caching(False))
#          written = no_cache.run_decompositions().graph_signature.buffers_to_mutate
#          print(f"buffers_to_mutate: {written}")
#          assert not written, "nothing writes a buffer"
#          assert set(cache_names) <= set(no_cache.graph_signature.buffers), "kept, unused"
#          assert not no_cache.graph.find_nodes(op="call_function", target=index_copy)
#
# 3. Change ``kv_heads`` to 1 (all 4 query heads share one key/value head) and to 4 (one
#    each, classic multi-head attention). Predict the caches' bytes for each.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from common.language_model import Decoder
#
#          for kv_heads in (1, 2, 4):
#              other = Decoder(kv_heads=kv_heads)
#              found = sum(b.nbytes for n, b in other.named_buffers() if n.endswith("cache"))
#              predicted = layers * 2 * kv_heads * MAX_LEN * attention.head_dim * 4
#              print(f"kv_heads {kv_heads}: {found:,} bytes")
#              assert found == predicted, "blocks × (k, v) × heads × positions × size × 4 bytes"
#          assert predicted == 2 * cache_bytes, "4 key/value heads: twice this model's cache"
#
# Further reading
# ---------------
# - `torch.export: dynamic shapes
#   <https://docs.pytorch.org/docs/stable/export.html#expressing-dynamism>`_
# - `ExecuTorch: exporting LLMs
#   <https://docs.pytorch.org/executorch/stable/llm/export-llm.html>`_, the recipe M08 follows
#   at a smaller scale
#
# Next
# ----
# :ref:`M08-2 · Quantized three ways
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>` quantizes this decoder
# with torchao's ``quantize_`` and with two PT2E quantizers, and compares what each costs.
