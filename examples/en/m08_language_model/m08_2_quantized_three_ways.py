"""
M08-2 Quantized three ways
==========================

The decoder of M08-1 is quantized here the three ways its users meet: torchao's ``quantize_``
with ExecuTorch's LLM recipe (**8da4w**: int8 dynamic activations, int4 weights in groups of
32, plus an int8 embedding), PT2E with ``XNNPACKQuantizer`` (dynamic int8, the way to a phone),
and PT2E with ``X86InductorQuantizer`` (dynamic int8) run under ``torch.compile``, timed in
tokens per second against compiled fp32. Each is judged as a language model is: perplexity on
held-out text, the text it writes, the bytes of its weights, and what it left float. The lesson
ends on a trap of grouped weights: a layer width that the group size does not divide, which
torchao refuses loudly and ExecuTorch's recipe skips without a word.

**What you will learn**

- What each recipe turns the weights and the graph into, and what it leaves float
- How close each comes to fp32 in perplexity and in greedy text, and what its weights weigh;
  what compiled int8 on x86 does to prefill and decode tokens per second
- Why a group size must divide every linear's input width, and how to check that a recipe
  quantized every linear

**Prerequisites**:
:ref:`M05-2 · Static vs dynamic int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`,
:ref:`M05-4 · PT2E or quantize_()? <sphx_glr_lessons_m05_transformers_m05_4_pt2e_or_quantize.py>`,
:ref:`M08-1 · A decoder and its KV cache
<sphx_glr_lessons_m08_language_model_m08_1_a_decoder_and_its_cache.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# The trained decoder of M08-1 (``train_decoder``, loaded from the course's cache) and its
# greedy text for a prompt, the reference every variant is compared with.

import copy
import io
import math
import operator
import os
import time
import warnings
from collections import Counter
from contextlib import redirect_stdout

import matplotlib.pyplot as plt
import torch
from torch import nn

from common.charts import display_width, pad, use_course_style
from common.coverage import MOVING_KINDS, coverage
from common.cpu import describe
from common.expect import expect_error
from common.kernels import kernels_run, native_stderr_silenced
from common.language_model import (
    WINDOW,
    Decoder,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    train_decoder,
    unigram_perplexity,
)
from common.pt2e import quiet
from common.results import publish
from common.timing import as_compiled, race, timing_threads
from common.viz import draw

quiet()
# inductor's int8 lowering copies a zero-point tensor in a way torch itself warns about (M03-3).
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

qd = torch.ops.quantized_decomposed
model, _ = train_decoder()
PROMPT, LENGTH = "The import statement", 60
fp32_text = generate(model, PROMPT, LENGTH)
LINEARS = 4 * 7 + 1  # 7 per block (wq, wk, wv, wo, w1, w3, w2), and the output

# %%
# Three helpers: ``weight_bytes`` counts the bytes of the weights a model reads (quantized
# codes with their scales and zero points; not the KV cache or the rotary tables, buffers that
# are not weights), ``same_start`` how many leading characters a text shares with fp32's, and
# ``float_linears`` names the ``nn.Linear`` modules whose weight is still a float tensor.


def weight_bytes(m) -> int:
    """Bytes of the weights ``m`` reads, quantized ones with their scales and zero points."""
    if isinstance(m, torch.fx.GraphModule):  # a converted graph keeps its float weights, unread
        names = {node.target for node in m.graph.find_nodes(op="get_attr")}
        tensors = {name: operator.attrgetter(name)(m) for name in names}
    else:
        tensors = m.state_dict()
    total = 0
    for name, t in tensors.items():
        if name.endswith(("k_cache", "v_cache", "cos", "sin")):
            continue
        if hasattr(t, "__tensor_flatten__"):  # a torchao subclass: its inner tensors
            parts = [getattr(t, inner) for inner in t.__tensor_flatten__()[0]]
        else:
            parts = [t]
        total += sum(part.nbytes for part in parts)
    return total


def same_start(text: str) -> int:
    """How many leading characters ``text`` shares with fp32's sample."""
    pairs = zip(text, fp32_text, strict=True)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), len(fp32_text))


def float_linears(m: nn.Module) -> list[str]:
    """The ``nn.Linear`` modules of ``m`` whose weight is still a plain float parameter."""
    return [
        name
        for name, module in m.named_modules()
        if isinstance(module, nn.Linear) and type(module.weight) is nn.Parameter
    ]


fp32_perplexity = perplexity(model)
print(f"fp32: {fp32_perplexity:.3f} perplexity, {weight_bytes(model) / 1e3:.0f} kB of weights")
print(f"{PROMPT!r} -> {fp32_text!r}")
assert len(float_linears(model)) == LINEARS, "29 linears, all float"

# %%
# Step 1 — ``quantize_``: int4 weights in groups, an int8 embedding
# -----------------------------------------------------------------
# ExecuTorch's LLM recipe in two ``quantize_`` calls (with torchao's default min/max scales;
# ``export_llama`` picks them with HQQ, Step 6). ``Int8DynamicActivationIntxWeightConfig``
# with ``weight_dtype=torch.int4`` and ``PerGroup(32)`` (**8da4w**) applies to every
# ``nn.Linear`` (``quantize_``'s default filter); ``IntxWeightOnlyConfig`` with int8 and
# ``PerAxis(0)`` (a scale per row, one row per token) applies to the embedding, through a
# ``filter_fn``. The model keeps its class and modules; what changes is each weight: a torchao
# tensor subclass.

INT4 = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int4, weight_granularity=PerGroup(32)
)
EMBEDDING = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))


def is_embedding(module: nn.Module, name: str) -> bool:
    return isinstance(module, nn.Embedding)


int4 = copy.deepcopy(model)
quantize_(int4, INT4)
quantize_(int4, EMBEDDING, filter_fn=is_embedding)
kinds = Counter(type(t).__name__ for t in int4.state_dict().values() if t.dim() == 2)
print(f"{type(int4).__name__}, 2-D weights now: {dict(kinds)}")
assert kinds == {"IntxUnpackedToInt8Tensor": LINEARS + 1}, "29 linears and the embedding"
assert not float_linears(int4), "no float linear left"

# %%
# Inside ``wq``'s weight: ``qdata``, the codes, between −8 and 7 (int4's range) but stored one
# per byte in an int8 tensor (the class name says it: *unpacked to int8*); a scale (and a zero
# point) per group of 32 weights along a row, so 128 / 32 = 4 per row; and the activations'
# scheme, int8 with a scale per token, computed at each call. The embedding holds int8 codes
# with one scale per row.

w = int4.layers[0].attention.wq.weight
e = int4.tok_embeddings.weight
print(f"wq: qdata {w.qdata.dtype} {tuple(w.qdata.shape)}, {w.qdata.min()}..{w.qdata.max()}")
print(f"    scale {tuple(w.scale.shape)}, block_size {w.block_size}")
print(f"    activations: {w.activation_quantization}")
print(f"embedding: qdata {e.qdata.dtype} {tuple(e.qdata.shape)}, scale {tuple(e.scale.shape)}")
assert w.qdata.dtype == torch.int8 and -8 <= w.qdata.min() and w.qdata.max() <= 7, "int4 codes"
assert tuple(w.scale.shape) == (128, 128 // 32), "4 groups per row"
assert tuple(e.scale.shape) == (103, 1), "a scale per embedding row"

# %%
# Each weight is its code times its group's scale, within half a scale of the float weight:
# rounding to the nearest of 16 levels.

step = w.scale.repeat_interleave(32, dim=1)
error = (w.dequantize() - model.layers[0].attention.wq.weight).abs()
print(f"largest error: {(error / step).max():.3f} of its group's scale")
assert (error <= step / 2 * (1 + 1e-5)).all(), "within half a scale"
int4_perplexity = perplexity(int4)
int4_text = generate(int4, PROMPT, LENGTH)

# %%
# Step 2 — PT2E with ``XNNPACKQuantizer``, dynamic
# ------------------------------------------------
# The phone's path: ``get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)``
# on the graph ``export_decoder`` gives (prefill and decode in one program, M08-1). What
# ``prepare_pt2e`` inserts: a ``PlaceholderObserver`` marked dynamic on each linear's input
# (it records nothing; at run time the convert graph computes the scale from each call's
# values), and a ``PerChannelMinMaxObserver`` on each weight. Linears that read the same tensor
# share one input observer: ``wq``/``wk``/``wv``, then ``w1``/``w3``, then ``wo`` and ``w2``, four
# per block, and the output's: 17.

xnnpack = XNNPACKQuantizer().set_global(
    get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
)
prepared = prepare_pt2e(export_decoder(model).module(), xnnpack)
observers = [m for name, m in prepared.named_children() if name.startswith("activation_post")]
inserted = Counter(f"{type(o).__name__}{' (dynamic)' * o.is_dynamic}" for o in observers)
print(dict(inserted))
assert inserted == {"PlaceholderObserver (dynamic)": 4 * 4 + 1, "PerChannelMinMaxObserver": 29}

# %%
# "Dynamic needs no calibration" is true of the activations, not of the weights: their
# observers have seen nothing yet (``min_val`` is empty). One call, here with the prompt, runs
# every weight observer once; skip it and ``convert_pt2e`` quantizes with default values
# (exercise 2).

weight_observers = [o for o in observers if not o.is_dynamic]
print(f"before the call: min_val of shape {tuple(weight_observers[0].min_val.shape)}")
prompt = encode(PROMPT)
with torch.no_grad():
    prepared(prompt[None], torch.arange(len(prompt)))
print(f"after one call:  min_val of shape {tuple(weight_observers[0].min_val.shape)}")
assert all(o.min_val.numel() for o in weight_observers), "every weight observer has run"

# %%
# ``convert_pt2e``. A linear is int8 when its weight comes from a ``dequantize_per_channel``
# (int8 codes, a scale per output channel): all 29 are.


def int8_linears(gm: torch.fx.GraphModule) -> int:
    """The linears of ``gm`` whose weight is an int8 constant read through a dequantize."""
    linears = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    return sum(node.args[1].target == qd.dequantize_per_channel.default for node in linears)


xnnpack_model = convert_pt2e(prepared)
reset_cache(xnnpack_model)
print(f"{int8_linears(xnnpack_model)} of {LINEARS} linears read int8 weights")
assert int8_linears(xnnpack_model) == LINEARS, "every linear: int8 weights"

# %%
# Block 0's SwiGLU feed-forward alone, through the same quantizer, shows what each linear
# became (q/dq nodes marked): its input quantized per call (``choose_qparams`` → ``quantize``
# → ``dequantize``, the scale computed from the call's own values), its weight read as int8
# codes through ``dequantize_per_channel``. ``w1`` and ``w3`` read the same input: one
# quantization serves both.

ffn = copy.deepcopy(model.layers[0].feed_forward)
ffn_input = torch.randn(1, 8, 128)
ffn_prepared = prepare_pt2e(torch.export.export(ffn, (ffn_input,)).module(), xnnpack)
ffn_prepared(ffn_input)
ffn_int8 = convert_pt2e(ffn_prepared)
qdq = [n.name for n in ffn_int8.graph.nodes if "quantized_decomposed" in str(n.target)]
draw(ffn_int8, highlight=qdq, title="block 0's feed-forward, XNNPACK dynamic int8")
per_channel = [name for name in qdq if name.startswith("dequantize_per_channel")]
assert len(per_channel) == 3 and len(qdq) == 3 + 2 * 3, "3 weights; 2 inputs: w1, w3 share x"

# %%
# What stays float, from ``coverage`` (``common.coverage``), leaving out the ops that only
# move values: the embedding; RMSNorm (``pow``, ``mean``, ``rsqrt``, the ``mul`` by its weight);
# the rotary positions (``mul``, ``sub``, ``stack``); SwiGLU's ``silu`` and its product; the
# residual ``add``; attention; and the cache's write, ``index_copy_``: the cache keeps float
# keys and values. The dynamic config annotates linears only.

report = coverage(export_decoder(model).module(), xnnpack, every_op=True)
print(report.summary().splitlines()[0])
print(report.grouped(only="float", with_layout=False))
float_ops = {op.op for op in report.ops if not op.int8 and op.kind not in MOVING_KINDS}
expected = {"embedding", "pow", "mean", "rsqrt", "mul", "sub", "stack", "silu", "add"}
expected |= {"scaled_dot_product_attention", "index_copy_"}
assert {op.op for op in report.ops if op.int8} == {"linear"}, "int8: the linears only"
assert report.counts()["linear"] == (LINEARS, LINEARS), "coverage: 29 of 29 linears int8"
assert expected <= float_ops, "embedding, RMSNorm, rotary, SiLU, attention: float"
assert report.statuses("index_copy_") == {"float": 8}, "8 cache writes (k, v × 4), float"
xnnpack_perplexity = perplexity(xnnpack_model)
xnnpack_text = generate(xnnpack_model, PROMPT, LENGTH)

# %%
# Step 3 — PT2E with ``X86InductorQuantizer``, compiled
# -----------------------------------------------------
# The same flow with the x86 quantizer's dynamic config (uint8 activations with a scale per
# call, int8 weights per channel). ``pt2e`` does what Step 2 did: export, prepare, one call,
# convert. The x86 quantizer also puts dynamic q/dq on both inputs of SwiGLU's product and
# fuses the residual ``add`` after ``wo`` and ``w2`` into their linears.


def pt2e(quantizer) -> torch.fx.GraphModule:
    """Export the decoder, prepare, one call (the weights' observers), convert."""
    prepared = prepare_pt2e(export_decoder(model).module(), quantizer)
    with torch.no_grad():
        prepared(prompt[None], torch.arange(len(prompt)))
    converted = convert_pt2e(prepared)
    reset_cache(converted)
    return converted


x86 = X86InductorQuantizer().set_global(
    get_default_x86_inductor_quantization_config(is_dynamic=True)
)
x86_report = coverage(export_decoder(model).module(), x86)
print(x86_report.summary().splitlines()[0])
x86_model = pt2e(x86)
assert int8_linears(x86_model) == LINEARS, "x86: every linear, int8 weights"
assert x86_report.counts()["mul"][0] == 4, "x86: SwiGLU's product in each block"
assert x86_report.counts()["add"][0] == 8, "x86: the residual add after wo and w2, fused"

# %%
# ``torch.compile`` with freezing turns the q/dq pairs into oneDNN's int8 kernels. The course's
# rules (M03-3, M05-4): freezing set for the process, grad off, compiled inside the thread
# count the course times with. One static shape is enough for perplexity, a prefill of
# ``WINDOW`` tokens at positions 0 … 127, which is all ``perplexity`` calls: one compile. (A
# greedy sample would call it with two more shapes, the prompt and one token, and compile
# twice more: the table takes the x86 sample from the uncompiled q/dq graph.) Inductor keeps
# the C++ it generates in its cache (``build/inductor_cache`` in the course's build), so the
# next run skips the C++ compiler; it still traces and lowers the graph again, because inductor
# does not cache a whole graph that holds frozen constants. ``kernels_run`` (``common.kernels``)
# reads, with the profiler, which kernels a prefill runs.

held_out = split("held_out")
window = (held_out[None, :WINDOW], torch.arange(WINDOW))
torch._inductor.config.freezing = True  # for the process (M05-4)
threads = timing_threads()
with as_compiled(threads):
    compiled = torch.compile(x86_model, dynamic=False)
    start = time.perf_counter()
    compiled(*window)  # the first call compiles
    seconds = time.perf_counter() - start
    ran = kernels_run(compiled, window)
    x86_perplexity = perplexity(compiled)
print(
    f"first call (compiles): {seconds:.1f} s at {threads} thread(s), load {os.getloadavg()[0]:.1f}"
)
print(ran.summary)
assert ran.int8 == Counter({"onednn::qlinear_pointwise": LINEARS}), "29 int8 linears ran"
assert not ran.float, "no float linear kernel"

# %%
# The kernels that ran are the 29 int8 linears, the residual adds inside them. SwiGLU's
# product, which the quantizer annotated int8, has no int8 kernel of its own among them: what
# inductor makes of its q/dq pairs runs inside the code it generates, which ``kernels_run``
# does not list. The ``coverage`` status says what the quantizer asked for; the kernels say
# what ran.

x86_text = generate(x86_model, PROMPT, LENGTH)

# %%
# Step 4 — Tokens per second on x86, compiled
# -------------------------------------------
# M08-3 times eager fp32, eager 8da4w and the ``.pte`` at a prefill of 64 tokens and a decode
# step (one token at position 64). Here are the same two shapes for what x86 runs compiled: the
# fp32 graph ``export_decoder`` gives, and Step 3's ``x86_model``. ``race`` (``common.timing``)
# compiles a copy of each as Step 3 did (freezing for the process, grad off, at
# ``timing_threads()``, static shapes), times them in interleaved rounds as ``compare_speed``
# does, and reads the kernels each ran before and after the rounds. Each shape is a compile of
# its own: two shapes, two models, four compiles (cached by inductor, as in Step 3).

LABELS = {"fp32": "fp32 compiled", "int8": "int8 x86 compiled"}
pair = {LABELS["fp32"]: export_decoder(model).module(), LABELS["int8"]: x86_model}
prompt_64 = held_out[:64][None]
shapes = {
    "prefill": (prompt_64, torch.arange(64)),
    # a copy: a slice of the row keeps its stride (64), and a one-token input of another
    # stride, as in the check below, would fail dynamo's static guards and compile again
    "decode": (prompt_64[:, :1].clone(), torch.tensor([64])),
}
races = {name: race(pair, args) for name, args in shapes.items()}

# %%
# Each rate with the 95 % interval of its median in brackets; then how much longer a prefill
# call takes than a decode call, for 64 times the tokens. Machine-dependent: printed with the
# CPU, the thread count and the load, never asserted. Each call writes the KV cache at its
# positions, the prefill slots 0–63 and the decode slot 64: every round rewrites the same slots
# with the same values, and a decode reads all 128 slots under its mask whatever they hold, so
# the rounds repeat the same work without resetting the cache.


prefills, decodes = races["prefill"], races["decode"]
width = max(display_width(label) for label in pair)
columns = pad("prefill tokens/s", 24, align=">"), pad("decode tokens/s", 18, align=">")
print(f"{pad('', width)}  {columns[0]}  {columns[1]}  prefill / decode time")
for label in pair:
    ratio = prefills[label].median / decodes[label].median
    print(
        f"{pad(label, width)}  {prefills[label].rate(64):>24}  {decodes[label].rate(1):>18}"
        f"  {ratio:20.1f}×"
    )
print(decodes.header())

# %%
# On a decoder this small a call is mostly fixed costs: 29 linears of 128 or 352 inputs, each a
# kernel call, and inductor's code between them, which is why a prefill call costs a small
# multiple of a decode call (the last column) for 64 times the tokens. The int8 model also
# quantizes each linear's input at every call (dynamic activations: a min and a max, a scale,
# a pass of rounding), work fp32 does not do; at one token there is little multiplying for int8
# to save, so compiled int8 need not beat compiled fp32 here, and where it stands at each shape
# depends on the CPU (the table is this build's).
#
# What ran, at both shapes: the int8 model the 29 int8 linears of Step 3 and no float linear;
# the fp32 model float linears only.

for name, raced in races.items():
    for label, ran in raced.kernels.items():
        print(f"{pad(name, 8)} {pad(label, width)}  {ran.summary}")
    int8_ran, fp32_ran = raced.kernels[LABELS["int8"]], raced.kernels[LABELS["fp32"]]
    assert int8_ran.int8 == Counter({"onednn::qlinear_pointwise": LINEARS}), f"{name}: 29 int8"
    assert not int8_ran.float, f"{name}: no float linear in the int8 model"
    assert not fp32_ran.int8 and sum(fp32_ran.float.values()) == LINEARS, f"{name}: fp32, float"

# %%
# And what it computed. The compiled int8 model (decode shape) and the uncompiled q/dq graph it
# came from each read the prompt one token per call, at positions 0, 1, …, as a decode loop
# does; each call's logits depend on the keys and values the calls before it wrote into the
# cache. The last step again on a zeroed cache shows how much the cache matters.


def decode_steps(m, tokens: torch.Tensor) -> torch.Tensor:
    """Zero ``m``'s cache, then feed ``tokens`` one per call; the logits of every step."""
    reset_cache(m)
    return torch.cat([m(t.view(1, 1), torch.tensor([i])) for i, t in enumerate(tokens)], dim=1)


fast = decodes.models[LABELS["int8"]]
with as_compiled(decodes.threads):  # as it was compiled: another count would recompile
    got, want, fp32_logits = (decode_steps(m, prompt) for m in (fast, x86_model, model))
    reset_cache(fast)
    fresh = fast(prompt[-1].view(1, 1), torch.tensor([len(prompt) - 1]))

# %%
# With VNNI oneDNN's int8 sums are exact, and the two differ only where the compiled code rounds
# an activation to the neighbouring code (it computes each call's scale in its own code): a few
# hundredths of a logit, asserted below a quarter (int8's own distance from fp32 is printed
# beside it for scale), and far below what a missing cache write does. Without VNNI oneDNN adds
# pairs of uint8 × int8 products in 16 bits, which this config's full-range activations can
# saturate (M04-2): the logits move further. The CPU line under the timings says which case
# this build is.

differ, same = (got - want).abs().max(), (got.argmax(-1) == want.argmax(-1)).sum()
print(f"compiled int8 vs q/dq, {len(prompt)} steps: largest logit difference {differ:.3f}")
print(f"    the greedy choice the same at {same} of {len(prompt)} steps")
print(f"q/dq vs fp32: largest difference {(want - fp32_logits).abs().max():.3f}")
print(f"the last step on a zeroed cache: {(fresh - got[:, -1:]).abs().max():.2f} away")
assert (fresh - got[:, -1:]).abs().max() > 1, "the last step read what the steps before wrote"
assert torch.equal(got[0, -1].argmax(), want[0, -1].argmax()), "the same next character"
if describe().vnni:
    assert differ < 0.25, "with VNNI: int8 sums exact, a rounding apart at most"

# %%
# Step 5 — Side by side
# ---------------------
# Perplexity on the same 20 held-out windows, the greedy text of the same prompt, the bytes of
# the weights, and the linears left float. The unigram perplexity, predicting each character
# by its frequency alone, is the bar of a model that learned nothing about context.

rows = {
    "fp32": (fp32_perplexity, fp32_text, weight_bytes(model), len(float_linears(model))),
    "int4 (quantize_ 8da4w)": (
        int4_perplexity,
        int4_text,
        weight_bytes(int4),
        len(float_linears(int4)),
    ),
    "int8 XNNPACK (PT2E)": (
        xnnpack_perplexity,
        xnnpack_text,
        weight_bytes(xnnpack_model),
        LINEARS - int8_linears(xnnpack_model),
    ),
    "int8 x86 (PT2E, compiled)": (
        x86_perplexity,
        x86_text,
        weight_bytes(x86_model),
        LINEARS - int8_linears(x86_model),
    ),
}
unigram = unigram_perplexity()
print(f"{pad('', 26)} perplexity  vs fp32  same start  weights  float linears")
for label, (value, text, size, floats) in rows.items():
    change = value / fp32_perplexity - 1
    print(
        f"{pad(label, 26)} {value:10.3f}  {change:+6.2%}  {same_start(text):4d} / {LENGTH}"
        f"  {size / 1e3:4.0f} kB  {floats:13d}"
    )
print(f"{pad('unigram (no context)', 26)} {unigram:10.3f}")

# %%
# The margins asserted leave room to spare: int8 within 2 % of fp32's perplexity, int4 within
# 5 %. Both int8 models write fp32's greedy text for at least half of its 60 characters; the
# int4 model's text may part from it sooner, at the first near-tie between two characters,
# and go on differently (greedy text repeats itself; it is the perplexity that measures).

for label, (_, text, _, _) in rows.items():
    print(f"{pad(label, 26)} {text!r}")
assert xnnpack_perplexity < 1.02 * fp32_perplexity, "int8 XNNPACK: within 2 % of fp32"
assert x86_perplexity < 1.02 * fp32_perplexity, "int8 x86: within 2 % of fp32"
assert int4_perplexity < 1.05 * fp32_perplexity, "int4: within 5 % of fp32"
assert min(same_start(xnnpack_text), same_start(x86_text)) >= LENGTH // 2, (
    "int8: fp32's first 30 characters"
)
assert max(value for value, *_ in rows.values()) < unigram / 4, "all far better than unigram"

# %%
# The sizes say what is stored where. int4's codes take one byte each here, exactly as many
# bytes as the int8 weights of PT2E; with a scale and a zero point for every 32 weights the
# int4 model is not smaller than the int8 ones in memory. The two-codes-per-byte packing
# happens when it is lowered for XNNPACK (M08-3 measures the ``.pte``). PT2E's graphs keep a
# float embedding and torchao's zero points as int64.

codes = sum(m.weight.qdata.nbytes for m in int4.modules() if isinstance(m, nn.Linear))
linears = xnnpack_model.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
dequantized = [node.args[1] for node in linears]  # each weight's dequantize_per_channel
int8_weights = sum(
    operator.attrgetter(dq.args[0].target)(xnnpack_model).nbytes for dq in dequantized
)
zero_point = operator.attrgetter(dequantized[0].args[2].target)(xnnpack_model)
embedding = xnnpack_model.tok_embeddings.weight
print(f"linear weights: int4 codes {codes / 1e3:.0f} kB, int8 weights {int8_weights / 1e3:.0f} kB")
assert codes == int8_weights, "int4 codes, unpacked: one byte each, as int8"
print(f"PT2E: zero points {zero_point.dtype}, embedding {embedding.dtype}")
assert weight_bytes(int4) >= weight_bytes(xnnpack_model), "int4 in memory: not smaller than int8"
assert (zero_point.dtype, embedding.dtype) == (torch.int64, torch.float32)

# %%
# The figures for the course's landing page, and the table as a chart.

publish("perplexity_fp32", fp32_perplexity)
publish("perplexity_int4", int4_perplexity)
publish("perplexity_int8_xnnpack", xnnpack_perplexity)
publish("perplexity_int8_x86", x86_perplexity)
publish("unigram_perplexity", unigram)

use_course_style()
fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
labels = ["fp32", "int4", "int8 XNNPACK", "int8 x86"]
colours = ["#94a3b8", "#f59e0b", "#2563eb", "#16a34a"]
left.bar(labels, [100 * (row[0] / fp32_perplexity - 1) for row in rows.values()], color=colours)
left.set_title("perplexity above fp32's (%)")
right.bar(labels, [row[2] / 1e3 for row in rows.values()], color=colours)
right.set_title("weights in memory (kB)")
fig.tight_layout()
plt.show()

# %%
# Step 6 — The group-size trap
# ----------------------------
# A group of 32 weights runs along a row, so 32 must divide every linear's input width
# (``in_features``). Here it does: 128 and 352. A decoder with a SwiGLU width of 344 is another
# matter: ``w2`` reads 344 = 32 × 10 + 24. Which linears a recipe quantizes depends on their
# shapes, not their values, so an untrained ``Decoder(hidden=344)`` shows it. torchao refuses.

wide = Decoder(hidden=344).eval()
widths = sorted({m.in_features for m in wide.modules() if isinstance(m, nn.Linear)})
print(f"in_features: {widths}")
with expect_error(AssertionError, match="divisible by block_size"):
    quantize_(copy.deepcopy(wide), INT4)

# %%
# ExecuTorch's newer entry point, ``quantize_model_`` (``executorch.extension.llm.export``),
# refuses too, and names its way out: ``skip_incompatible_shapes=True``.

with native_stderr_silenced():  # pytorch_tokenizers, imported here, logs a C++ line to stderr
    from executorch.examples.models.llama.source_transformation.quantize import quantize
    from executorch.extension.llm.export.quantize import quantize_model_
warnings.filterwarnings("ignore", message="quantize_model_ is experimental")

with expect_error(RuntimeError, match="skip_incompatible_shapes"):
    quantize_model_(copy.deepcopy(wide), qlinear_config="8da4w", qlinear_group_size=32)

# %%
# The recipe ``export_llama`` runs (``quantize`` in ``executorch/examples/models/llama/``,
# through ``get_quant_weight_transform``, with ``qmode="8da4w"``; it also picks the scales with
# HQQ) passes ``quantize_`` a ``filter_fn`` that keeps only the linears whose ``in_features``
# the group size divides (pytorch/executorch#22044). No error, no warning, nothing printed:
# the four ``w2`` stay fp32.

with warnings.catch_warnings(record=True) as said, redirect_stdout(io.StringIO()) as printed:
    warnings.simplefilter("always")
    recipe = quantize(copy.deepcopy(wide), "8da4w", group_size=32)
left_float = float_linears(recipe)
print(f"{len(left_float)} float linears, {len(said)} warnings: {left_float}")
assert len(left_float) == 4, "4 linears left float"
assert all(name.endswith("feed_forward.w2") for name in left_float), "the 4 w2"
assert not said and not printed.getvalue(), "no warning, nothing printed"

# %%
# Two fixes, each checked by counting the float linears again. A group size that divides every
# input width (``math.gcd``: 8 here, more scales to store), or a second ``quantize_`` on the
# linears left float, with a scale per row (``PerAxis(0)``).

group = math.gcd(32, *widths)
by_gcd = copy.deepcopy(wide)
quantize_(
    by_gcd,
    Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(group)
    ),
)
per_row = copy.deepcopy(recipe)
quantize_(
    per_row,
    Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerAxis(0)),
    filter_fn=lambda module, name: name in left_float,
)
for label, m in (
    ("recipe", recipe),
    (f"PerGroup({group})", by_gcd),
    ("recipe + PerAxis(0)", per_row),
):
    print(
        f"{pad(label, 20)} {len(float_linears(m))} float linears, {weight_bytes(m) / 1e3:4.0f} kB"
    )
w2_bytes = sum(recipe.get_submodule(name).weight.nbytes for name in left_float)
print(
    f"the 4 float w2 of the recipe: {w2_bytes / 1e3:.0f} kB, {w2_bytes / weight_bytes(recipe):.0%}"
)
assert group == 8 and not float_linears(by_gcd) and not float_linears(per_row), "none float"
assert w2_bytes > 0.4 * weight_bytes(recipe), "the 4 float w2: nearly half the bytes"

# %%
# Summary
# -------
# ======================  ================================  ==================================
# recipe                  weights                           float
# ======================  ================================  ==================================
# ``quantize_`` 8da4w     int4 codes, a byte each until     RMSNorm, rotary, SiLU·mul, the
#                         lowered, a scale per 32; an int8  residual adds, attention, the
#                         embedding                         cache write
# PT2E, XNNPACK dynamic   int8, a scale per channel         the same, and the embedding
# PT2E, x86 dynamic       int8, a scale per channel; run    the same, and the embedding; not
#                         by oneDNN's int8 linear once      the residual adds (fused into the
#                         compiled                          int8 linear)
# ======================  ================================  ==================================
#
# - ``quantize_`` changes the weights of the eager model into torchao subclasses; PT2E rewrites
#   an exported graph. Both quantize every linear of this decoder, with dynamic int8
#   activations, and stay within a few percent of fp32's perplexity.
# - Dynamic PT2E still needs one call before ``convert_pt2e``: the weights' observers.
# - Compiled on x86, the int8 model runs oneDNN's int8 linear at both the prefill and the decode
#   shape; against compiled fp32, on a decoder this small, its tokens per second depend on
#   fixed costs per call and on quantizing the activations at every call (Step 4's table).
# - A group size must divide each linear's ``in_features``. torchao and ExecuTorch's
#   ``quantize_model_`` raise when it does not; the 8da4w recipe of ``export_llama`` skips such
#   linears without a word. Count the float linears after any recipe.
#
# Exercises
# ---------
# 1. Groups of 64 instead of 32 on this decoder. Predict: does ``quantize_`` accept it, and
#    what is the largest group size that fits every linear?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          config = Int8DynamicActivationIntxWeightConfig(
#              weight_dtype=torch.int4, weight_granularity=PerGroup(64)
#          )
#          with expect_error(AssertionError, match="352"):
#              quantize_(copy.deepcopy(model), config)
#          widths = {m.in_features for m in model.modules() if isinstance(m, nn.Linear)}
#          largest = math.gcd(*widths)
#          print(f"largest group size: {largest}")
#          assert largest == 32, "352 = 11 × 32: w2 refuses 64"
#
# 2. Leave out Step 2's calibration call. Predict what ``convert_pt2e`` says, the logits, and
#    the greedy text.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          with warnings.catch_warnings(record=True) as said:
#              warnings.simplefilter("always")
#              unready = convert_pt2e(prepare_pt2e(export_decoder(model).module(), xnnpack))
#          print({str(w.message) for w in said})
#          with torch.no_grad():
#              logits = unready(prompt[None], torch.arange(len(prompt)))
#          text = generate(unready, PROMPT, 10)
#          print(f"largest logit {logits.abs().max()}, text {text!r}")
#          assert any("must run observer" in str(w.message) for w in said), "only a warning"
#          assert logits.abs().max() == 0, "every weight quantized with default values: 0"
#          assert set(text) == {"\n"}, "token 0, again and again"
#
# 3. One scale per row for the int4 weights (``PerAxis(0)``) instead of one per 32 weights.
#    Predict the scale's shape and whether perplexity moves much on this small model.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          rows_only = copy.deepcopy(model)
#          quantize_(
#              rows_only,
#              Int8DynamicActivationIntxWeightConfig(
#                  weight_dtype=torch.int4, weight_granularity=PerAxis(0)
#              ),
#          )
#          scale = rows_only.layers[0].attention.wq.weight.scale
#          value = perplexity(rows_only)
#          print(f"scale {tuple(scale.shape)}, perplexity {value:.3f}")
#          print(f"(groups of 32: {int4_perplexity:.3f})")
#          assert tuple(scale.shape) == (128, 1), "one scale per row"
#          assert abs(value / int4_perplexity - 1) < 0.02, "within 2 % of groups of 32, here"
#
# Further reading
# ---------------
# - `torchao: quantize_
#   <https://docs.pytorch.org/ao/stable/api_reference/generated/torchao.quantization.quantize_.html>`_
#   and `Int8DynamicActivationIntxWeightConfig
#   <https://docs.pytorch.org/ao/main/api_reference/generated/torchao.quantization.Int8DynamicActivationIntxWeightConfig.html>`_
# - `ExecuTorch: Exporting LLMs <https://docs.pytorch.org/executorch/stable/llm/export-llm.html>`_,
#   its quantization options (``8da4w``, group size, embedding)
# - `pytorch/executorch#22044 <https://github.com/pytorch/executorch/issues/22044>`_: the
#   8da4w recipe skips the linears whose width the group size does not divide
#
# Next
# ----
# :ref:`M08-3 · To a phone <sphx_glr_lessons_m08_language_model_m08_3_to_a_phone.py>` lowers the
# quantized decoder, cache included, to a ``.pte`` and generates text on the ExecuTorch
# runtime.
