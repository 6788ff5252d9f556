"""
M08-3 To a phone: the .pte that generates
=========================================

The decoder of M08-1, quantized with ExecuTorch's LLM recipe (8da4w and an 8-bit embedding,
M08-2), becomes here the one file a phone app loads: a ``.pte`` that takes a prompt and then one
token per call, and keeps its KV cache between calls. This lesson lowers it to XNNPACK, finds
the cache in the program (memory the runtime plans, not bytes in the file), generates text on
the ExecuTorch runtime and compares it with the eager model, lists the operators that ran and
their data types, and measures tokens per second and bytes.

**What you will learn**

- How an 8da4w model with an 8-bit embedding lowers to one ``.pte`` for prefill and decode,
  and where its KV cache lives
- How close the runtime's text and perplexity are to the eager model's, and why not equal
- What runs in XNNPACK as int4 and what runs on portable kernels, and what it buys in tokens
  per second and bytes

**Prerequisites**:
:ref:`M06-2 · Lowering to ExecuTorch
<sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`,
:ref:`M06-3 · The .pte, inside out <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`,
:ref:`M08-2 · Quantized three ways
<sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# The trained decoder (M08-1), at the timing's thread count for the whole page: on two shared
# cores two threads wait for each other, and every eager call takes many times longer.
# XNNPACK's thread pool gets the same count, before any method is loaded (M06-3).

import contextlib
import copy
import io
import itertools
import json
import re
import textwrap
import warnings
from pathlib import Path

import torch
from torch import nn

from common.cache import cached_path
from common.charts import display_width, pad
from common.digest import digest
from common.language_model import (
    WINDOW,
    RMSNorm,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    train_decoder,
)
from common.pt2e import quiet
from common.results import publish
from common.timing import compare_speed, timing_threads
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import _get_extended_header
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.runtime import load_quantized_kernels, operators_run

threads_before = torch.get_num_threads()
torch.set_num_threads(timing_threads())
with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
    warnings.filterwarnings("ignore", message="This API is experimental")
    portable_lib._unsafe_reset_threadpool(timing_threads())

model, _ = train_decoder()
PROMPT, LENGTH = "The import statement", 60

# %%
# The recipe of M08-2: int8 dynamic activations with int4 weights in groups of 32 for every
# linear (**8da4w**), and one int8 per embedding value with a scale per row.

LINEARS_8DA4W = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int4, weight_granularity=PerGroup(32)
)
EMBEDDING_8BIT = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))


def quantized(*, embedding_8bit: bool = True) -> nn.Module:
    """A copy of the decoder with the recipe applied; its embedding stays fp32 if asked."""
    copied = copy.deepcopy(model)
    if embedding_8bit:
        quantize_(copied, EMBEDDING_8BIT, filter_fn=lambda m, _: isinstance(m, nn.Embedding))
    quantize_(copied, LINEARS_8DA4W)
    return copied


eager_8da4w = quantized()
print(f"embedding: {type(eager_8da4w.tok_embeddings.weight).__name__}")
print(f"linears:   {type(eager_8da4w.layers[0].attention.wq.weight).__name__}")

# %%
# Step 1 — Lower it
# -----------------
# M06-2's lowering on ``export_decoder`` (one program for every length from 1 to ``MAX_LEN``,
# M08-1), with two additions the recipe needs. Export (``export_decoder`` does it) and lowering
# run under ``torch.no_grad()``: a cache update in a graph that tracks gradients fails to lower
# (``a leaf Variable that requires grad is being used in an in-place operation``). And
# ``to_executorch`` gets
# ``do_quant_fusion_and_const_prop=True``, the setting ExecuTorch's own LLM export uses: XNNPACK
# takes no embedding, so the 8-bit embedding's ``dequantize_affine`` stays outside the
# delegates, and without that pass ``to_executorch`` stops on ``Missing out variants:
# {'torchao::dequantize_affine'}`` (:ref:`Troubleshooting: ExecuTorch and XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`); with it, the dequantize
# and the embedding become one ``quantized_decomposed::embedding_byte``.
#
# Lowering this graph takes a minute, so ``lowered`` keeps the ``.pte`` in ``build/cache/``
# under the digest of what made it, with what Step 2 reads from the lowered program's graph
# signature beside it. It empties the decoder's KV cache first: the digest reads every buffer,
# the cache's too, and Step 5's timings fill it when they run.


def lowered(name: str, make_model) -> tuple[bytes, dict]:
    """The ``.pte`` of ``make_model()`` and notes on its mutated buffers (cached)."""
    reset_cache(model)  # the program starts from an empty KV cache, whatever ran before

    def lower(folder: Path) -> None:
        exported = export_decoder(make_model())
        with torch.no_grad(), warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
            config = ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)
            program = edge.to_executorch(config)
        signature = program.exported_program().graph_signature
        buffers = {v: k for k, v in signature.inputs_to_buffers.items()}  # name -> placeholder
        placeholders = {n.name: n for n in program.exported_program().graph.nodes}
        specs = {}
        for buffer in signature.buffers_to_mutate.values():
            spec = placeholders[buffers[buffer]].meta["spec"]
            specs[buffer] = {"const": spec.const, "mem_id": spec.mem_id, "offset": spec.mem_offset}
        mutation = [str(w.message) for w in said if "Mutation on a buffer" in str(w.message)]
        folder.mkdir()
        (folder / "model.pte").write_bytes(program.buffer)
        notes = {"mutated": dict(signature.buffers_to_mutate), "specs": specs, "said": mutation}
        (folder / "notes.json").write_text(json.dumps(notes))

    recipe = [repr(LINEARS_8DA4W), repr(EMBEDDING_8BIT)]
    folder = cached_path("executorch", f"m08_3-{name}-{digest(model, name, recipe)}", lower)
    return (folder / "model.pte").read_bytes(), json.loads((folder / "notes.json").read_text())


pte, notes = lowered("8da4w", quantized)
print(f"8da4w .pte: {len(pte):,} bytes")

# %%
# The runtime must hold a kernel for every operator the ``.pte`` names outside the delegates.
# ``embedding_byte.out`` is not among the portable kernels: it is in ExecuTorch's quantized
# kernels, a library the app links (``quantized_ops_lib``). The runtime on PyPI ships it as
# ``lib/libexecutorch_kernels_quantized.so``, which ``import executorch.kernels.quantized``
# loads (with the quantize/dequantize ops it also adds to torch); loading the library alone
# registers the runtime's kernels (``common.runtime.load_quantized_kernels``). Without them,
# ``load_method`` fails with ``Missing operator: quantized_decomposed::embedding_byte.out`` in
# the runtime's log.

header = _get_extended_header(pte)
plan = _flatbuffer_to_program(pte[: header.program_size]).execution_plan[0]
operators = sorted(f"{op.name}.{op.overload}".rstrip(".") for op in plan.operators)
print(f"{len(operators)} operators outside the delegates:")
print(textwrap.fill(", ".join(operators), 96))
assert "quantized_decomposed::embedding_byte.out" in operators, "the 8-bit embedding's kernel"
load_quantized_kernels()

# %%
# Step 2 — The cache stays in the program
# ---------------------------------------
# The lowered program's graph signature lists the buffers the method writes: the eight caches
# (a key and a value cache per block). Each is an output of the method, a ``copy_`` back into
# the buffer of what ``index_put`` (``index_copy_``, decomposed) computed.

for output, buffer in notes["mutated"].items():
    print(f"{output:26} -> {buffer}")
caches = [f"layers.{i}.attention.{kv}_cache" for i in range(len(model.layers)) for kv in "kv"]
assert sorted(notes["mutated"].values()) == sorted(caches), "every cache, nothing else"

# %%
# A mutated buffer is not a constant: memory planning gives it a place in the method's arena
# (memory 1, the one the planner lays out), and the file holds its shape and dtype only.
# ExecuTorch's emitter says so itself when it writes the ``.pte``. The cache is 8 × 64 kB, more
# than every weight of the 8da4w program together.

cache_bytes = model.layers[0].attention.k_cache.numel() * 4
print(textwrap.fill(notes["said"][0].split(". ")[1], 96))
for buffer, spec in notes["specs"].items():
    print(f"{buffer:26} const={spec['const']}  memory {spec['mem_id']}, offset {spec['offset']:,}")
starts = sorted(spec["offset"] for spec in notes["specs"].values())
assert not any(spec["const"] for spec in notes["specs"].values()), "no cache is a constant"
assert {spec["mem_id"] for spec in notes["specs"].values()} == {1}, "planned in the arena"
assert all(b - a >= cache_bytes for a, b in itertools.pairwise(starts)), "8 places, no overlap"

# %%
# The file agrees: the tensors planned at those offsets have no data in the ``.pte``
# (``data_buffer_idx`` 0), the arena the runtime allocates holds them, and the constants (the
# portable kernels' constant segment and XNNPACK's named data) come to less than the cache.

tensors = [v.val for v in plan.values if type(v.val).__name__ == "Tensor"]
at = {t.allocation_info.memory_offset_low: t for t in tensors if t.allocation_info}
program = _flatbuffer_to_program(pte[: header.program_size])
payloads = {delegate.processed.index for delegate in plan.delegates}
constants = sum(s.size for i, s in enumerate(program.segments) if i not in payloads)
arena = plan.non_const_buffer_sizes[1]
print(f"cache {len(caches)} × {cache_bytes:,} bytes; arena {arena:,}; constants {constants:,}")
assert all(at[start].data_buffer_idx == 0 for start in starts), "no data stored for a cache"
assert max(starts) + cache_bytes <= arena, "the arena holds every cache"
assert constants < len(caches) * cache_bytes, "the cache weighs more than every weight"

# %%
# The ``.pte`` runs a chain of instructions (M06-3), kernel calls and delegate calls that read
# and write values by index. ``first_block`` turns the chain up to the second block into a
# graph: a node per call, an edge per planned tensor it reads (``et_view``, a view, is no
# node), then the ``copy_`` calls that end the chain for this block's two caches.


def first_block(plan, names: dict) -> torch.fx.GraphModule:
    """The method's chain of instructions up to the second block, as a graph: a node per kernel
    or delegate call, an edge per planned tensor it reads, then the copies into its caches
    (named by ``names``, arena offset to buffer name)."""
    calls = [instruction.instr_args for instruction in plan.chains[0].instructions]

    def name(call) -> str:  # e.g. "aten::mean.out"; a delegate call has no operator
        if type(call).__name__ == "DelegateCall":
            return "executorch_call_delegate"
        op = plan.operators[call.op_index]
        return f"{op.name}.{op.overload}".rstrip(".")

    def planned(index: int) -> bool:
        return getattr(plan.values[index].val, "allocation_info", None) is not None

    graph = torch.fx.Graph()
    made = {
        i: graph.placeholder(n) for i, n in zip(plan.inputs, ("tokens", "positions"), strict=True)
    }
    buffers = {
        i: graph.placeholder(names[plan.values[i].val.allocation_info.memory_offset_low])
        for i in range(min(plan.inputs))  # the buffers come before the inputs
        if planned(i)
    }
    made |= buffers
    means = [k for k, call in enumerate(calls) if name(call) == "aten::mean.out"]
    block = calls[: means[2]]  # up to the second block's first RMSNorm
    read = {a for call in block for a in call.args if a in buffers}
    copies = [c for c in calls if name(c) == "aten::copy_" and c.args[0] in read]
    for call in [*block, *copies]:
        if name(call) == "executorch_prim::et_view.default":  # a view: no computation
            made[call.args[-1]] = made[call.args[0]]
            continue
        if name(call) == "executorch_call_delegate":
            target = torch.ops.higher_order.executorch_call_delegate
            writes = [a for a in call.args if a not in made and planned(a)]
        else:  # an out variant: its last argument is the tensor it writes
            namespace, op = name(call).split("::")
            op, _, overload = op.partition(".")
            target = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
            writes = call.args[-1:]
        node = graph.call_function(target, tuple(made[a] for a in call.args if a in made))
        made |= {a: node for a in writes}
        if call is block[-1]:
            kept = [node]  # what the next block reads
    kept += [n for n in graph.nodes if n.target == torch.ops.aten.copy_.default]
    for unused in reversed(list(graph.nodes)):
        if not unused.users and unused not in kept:  # what only later blocks read
            graph.erase_node(unused)
    graph.output(tuple(kept))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# %%
# Block 0 as the runtime runs it: its key and value caches (highlighted) go into the two
# ``index_put`` calls, whose results the attention delegates read, and come back through the
# two ``copy_`` calls at the end of the chain. Every other box is a portable kernel or an
# XNNPACK delegate call; the line below counts the delegate calls of this one block.

names = {spec["offset"]: buffer.replace(".", "_") for buffer, spec in notes["specs"].items()}
block_0 = first_block(plan, names)
cache_ops = (torch.ops.aten.index_put.out, torch.ops.aten.copy_.default)
marked = [n.name for n in block_0.graph.nodes if n.name.endswith("_cache") or n.target in cache_ops]
draw(block_0, highlight=marked, title="8da4w .pte: the instructions of block 0")
delegate_calls = [n for n in block_0.graph.nodes if "delegate" in n.name]
print(f"{len(delegate_calls)} delegate calls, {len(marked)} nodes of the cache highlighted")
assert len(marked) == 6, "two caches, two index_put, two copy_"

# %%
# Step 3 — Generate on the runtime
# --------------------------------
# ``step`` makes the runtime's ``forward`` look like the model: ``step(tokens, positions) ->
# logits``, so ``generate`` and ``perplexity`` take it as they take the eager model. The cache
# lives in the loaded method, so the prompt's prefill and each decode call of ``generate`` fill
# it as the eager model's buffers are filled. Keep the ``Program`` alive as long as its method
# runs (M06-3).


def on_runtime(pte: bytes):
    """``(program, step)``: the loaded ``.pte`` and its ``forward`` as a model."""
    with contextlib.redirect_stderr(io.StringIO()):  # the runtime's CPU-info log (M06-3)
        program = Runtime.get().load_program(pte)
        forward = program.load_method("forward")

    def step(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return forward.execute([tokens, positions])[0]

    return program, step


runtime_program, step = on_runtime(pte)
texts = {
    "fp32 eager": generate(model, PROMPT, LENGTH),
    "8da4w eager": generate(eager_8da4w, PROMPT, LENGTH),
    "8da4w .pte": generate(step, PROMPT, LENGTH),
}
for label, text in texts.items():
    print(f"{label:12} {text!r}")
same = [a == b for a, b in zip(texts["8da4w .pte"], texts["8da4w eager"], strict=True)]
print(
    f"the .pte writes the eager 8da4w text: {all(same)}"
    + ("" if all(same) else f" (the first {same.index(False)} characters agree)")
)

# %%
# The runtime's text can part from the eager 8da4w model's, as the last line says. Both compute
# the same recipe with other arithmetic: torchao's eager linear quantizes each row of
# activations, dequantizes it and the int4 weights, and multiplies in fp32; XNNPACK's kernel
# quantizes the row its own way and sums int8 × int4 products in int32, block by block. The
# logits differ a little, and where two characters are nearly tied the greedy choice can flip;
# from there the text follows another path. Teacher-forced on the held-out text (every position
# given the true text before it), the gap is measured: each model's next-character choice and
# logits on the 20 windows ``perplexity`` reads, against the gap quantization itself opens.

held_out, positions = split("held_out"), torch.arange(WINDOW)
agree, gap = {"runtime": 0.0, "quantization": 0.0}, {"runtime": 0.0, "quantization": 0.0}
with torch.no_grad():
    for start in range(0, 20 * WINDOW, WINDOW):
        window = held_out[start : start + WINDOW][None]
        fp32 = model(window, positions)
        eager = eager_8da4w(window, positions)
        runtime = step(window, positions)
        for key, (a, b) in (("runtime", (runtime, eager)), ("quantization", (eager, fp32))):
            agree[key] += (a.argmax(-1) == b.argmax(-1)).sum().item() / (20 * WINDOW)
            gap[key] = max(gap[key], (a - b).abs().max().item())
for key, label in (("runtime", "runtime vs eager 8da4w"), ("quantization", "eager 8da4w vs fp32")):
    print(f"{pad(label, 22)}  same choice {agree[key]:.1%}, logits within {gap[key]:.3f}")
assert agree["runtime"] > 0.98, "the runtime makes the eager model's choice almost everywhere"
assert gap["runtime"] < gap["quantization"] / 4, "its gap is small next to the quantization's"

# %%
# Perplexity, through the same ``perplexity`` function: the runtime is within a fraction of a
# percent of the eager 8da4w model, and both a little above fp32 (M08-2).

scores = {"fp32": perplexity(model), "8da4w eager": perplexity(eager_8da4w)}
scores["8da4w .pte"] = perplexity(step)
print("  ".join(f"{label} {value:.3f}" for label, value in scores.items()))
assert abs(scores["8da4w .pte"] / scores["8da4w eager"] - 1) < 0.01, "within 1 % of eager"

# %%
# The float program, lowered the same way, shows where the gap comes from: its XNNPACK
# kernels sum in another order than eager fp32 too, but without quantization nothing lands on
# the other side of a rounding step. Its logits are within 1e-4 of the eager model's and its
# greedy text is the same, character for character.

fp32_pte, _ = lowered("fp32", lambda: model)
fp32_program, fp32_step = on_runtime(fp32_pte)
fp32_text = generate(fp32_step, PROMPT, LENGTH)
with torch.no_grad():
    fp32_gap = (fp32_step(window, positions) - model(window, positions)).abs().max().item()
print(f"fp32 .pte    {fp32_text!r}\nlogits within {fp32_gap:.1e} of eager fp32")
assert fp32_text == texts["fp32 eager"], "the float .pte writes the eager model's text"
assert fp32_gap < 1e-4, "float kernels: rounding only"

# %%
# Step 4 — What ran
# -----------------
# ``operators_run`` (M06-4) runs the ``.pte`` once with an ETDump and lists XNNPACK's operators
# by their names, which carry the data types, and the portable kernels outside the delegates:
# once for the prompt's prefill, once for a decode step at the position after it.

tokens = encode(PROMPT)
prefill = operators_run(pte, [tokens[None], torch.arange(len(tokens))])
decode_step = operators_run(pte, [tokens[None, -1:], torch.tensor([len(tokens)])])
print(prefill.summary)
assert decode_step.xnnpack == prefill.xnnpack, "decode runs the prefill's operators"
assert decode_step.portable == prefill.portable, "and the same portable kernels"

# %%
# Every linear ran as XNNPACK's ``Fully Connected`` with ``QB4W`` weights (4-bit, one scale
# per block of 32) on dynamically quantized int8 activations (``QD8``; ``QDU8`` is its
# unsigned form, which XNNPACK's x86 kernels use for VNNI's unsigned × signed products): 7 per
# block and the output, 29 per call. Attention ran in float (two batch matrix multiplies and a
# softmax per block).

linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
gemms = {op: n for op, n in prefill.xnnpack.items() if op.startswith("Fully Connected")}
for op, n in gemms.items():
    print(f"{op} ×{n}")
assert sum(gemms.values()) == len(linears) == 7 * len(model.layers) + 1, "every linear"
types = [re.search(r"\((.*)\)", op)[1].split(", ") for op in gemms]
assert all(t[1].startswith("QD") and t[-1] == "QB4W" for t in types), "dynamic int8 × int4"
assert prefill.xnnpack["Softmax (NC, F32)"] == len(model.layers), "attention: float softmax"
assert prefill.xnnpack["Batch Matrix Multiply (NC, F32) GEMM"] == 2 * len(model.layers), "QKᵀ, PV"

# %%
# Outside the delegates, on portable kernels: the 8-bit embedding (``embedding_byte``), the
# mean of every RMSNorm (XNNPACK's mean is a global average pool, over the two inner dimensions
# of a 4-D tensor; RMSNorm averages a 3-D tensor over its last), the cache writes
# (``index_put`` into a copy of the cache, then ``copy_`` back into the buffer), the rotary's
# slices and the attention mask. On a phone these are the C++ kernels the app links beside
# XNNPACK; the cache writes copy each 64 kB cache twice per call, which ExecuTorch's LLM export
# avoids with a custom cache-update op.

asked = ("embedding_byte.out", "mean.out", "index_put.out", "copy_")
print(f"{sum(prefill.portable.values())} portable kernel calls per call, among them:")
print(", ".join(f"{op} ×{prefill.portable[op]}" for op in asked))
norms = sum(isinstance(m, RMSNorm) for m in model.modules())
assert prefill.portable["embedding_byte.out"] == 1, "the 8-bit embedding"
assert prefill.portable["mean.out"] == norms, "one mean per RMSNorm"
assert prefill.portable["index_put.out"] == prefill.portable["copy_"] == len(caches), "caches"

# %%
# Step 5 — Tokens per second
# --------------------------
# A prefill of 64 tokens, and a decode step at position 64 (a decode step attends to the whole
# cache under its mask, so every position costs the same), timed in interleaved rounds for eager
# fp32, eager 8da4w and the ``.pte`` on the runtime, each rate with the 95 % interval of its
# median in brackets. Machine-dependent: printed with the load, the thread count and the CPU,
# never asserted. XNNPACK picks its kernels from the CPU itself; the CPU line describes
# PyTorch's.

LABELS = {"fp32": "fp32 eager", "eager": "8da4w eager", "pte": "8da4w .pte (runtime)"}
calls = {LABELS["fp32"]: model, LABELS["eager"]: eager_8da4w, LABELS["pte"]: step}
key = digest(pte, model, repr(LINEARS_8DA4W), repr(EMBEDDING_8BIT))
prompt_64 = held_out[:64][None]
prefills = compare_speed(calls, (prompt_64, torch.arange(64)), key=key)
decodes = compare_speed(calls, (prompt_64[:, :1], torch.tensor([64])), key=key)


width = max(display_width(label) for label in calls)
columns = pad("prefill tokens/s", 24, align=">"), pad("decode tokens/s", 18, align=">")
print(f"{pad('', width)}  {columns[0]}  {columns[1]}")
for label in calls:
    print(f"{pad(label, width)}  {prefills[label].rate(64):>24}  {decodes[label].rate(1):>18}")
print(decodes.header())

# %%
# Which row is fastest depends on the machine; the table is this build's. This decoder is
# small, so a call of the ``.pte`` is mostly fixed costs: 29 small GEMMs between the portable
# kernel calls of Step 4, the crossings in and out of the delegates and the cache copies.
# Eager 8da4w runs torchao's quantize and dequantize as separate ops around an fp32 matmul,
# with no fused kernel: it simulates the recipe, it does not speed it up. What the ``.pte``
# brings to a phone is a runtime of its own, without Python or PyTorch, and the bytes of Step 6.

# %%
# The landing page quotes the decode rates and the ``.pte``'s size.

publish("decode_tokens_per_s", round(1e3 / decodes[LABELS["pte"]].median, 1))
pte_decode = decodes[LABELS["pte"]]
publish(
    "decode_interval", [round(1e3 / t, 1) for t in (pte_decode.median_high, pte_decode.median_low)]
)
publish("decode_tokens_per_s_fp32", round(1e3 / decodes[LABELS["fp32"]].median, 1))
publish("timing_load", round(decodes.load[0], 2))
publish("pte_bytes", len(pte))

# %%
# Step 6 — Bytes
# --------------
# The same recipe with the embedding left fp32, and the fp32 program for reference. The
# embedding is a small share of this decoder (103 characters × 128); in a model with a vocabulary
# of 100 000 tokens it is often the largest tensor of all, which is why the recipe quantizes it.

fp32_embedding_pte, _ = lowered("8da4w-fp32-embedding", lambda: quantized(embedding_8bit=False))
embedding_bytes = model.tok_embeddings.weight.numel() * 4
sizes = {"8da4w, 8-bit embedding": pte, "8da4w, fp32 embedding": fp32_embedding_pte}
sizes["fp32"] = fp32_pte
for label, data in sizes.items():
    print(f"{pad(label, 24)} {len(data):>10,} bytes")
share = embedding_bytes / len(fp32_embedding_pte)
print(f"the fp32 embedding: {embedding_bytes:,} bytes, {share:.1%} of its .pte")
saved = len(fp32_embedding_pte) - len(pte)
assert 0 < saved < embedding_bytes, "8-bit saves most of the embedding's bytes, not more"
assert len(pte) < len(fp32_pte) / 4, "4-bit linears: under a quarter of the fp32 file"

# %%
# Step 7 — The other way: PT2E's dynamic int8
# -------------------------------------------
# M08-2's PT2E recipe for a phone, ``XNNPACKQuantizer`` with dynamic int8 activations and
# per-channel int8 weights, lowers the same way once converted: prepared, called once (its
# weight observers need that one call, M08-2), converted, then exported again by
# ``export_decoder``. It leaves the embedding fp32.


def pt2e_dynamic() -> nn.Module:
    """The decoder through ``XNNPACKQuantizer``'s dynamic int8: prepared, called once, converted."""
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    prepared = prepare_pt2e(export_decoder(model).module(), XNNPACKQuantizer().set_global(config))
    with torch.no_grad():
        prepared(tokens[None], torch.arange(len(tokens)))  # the one call the observers need
    return convert_pt2e(prepared)


pt2e_pte, _ = lowered("pt2e-dynamic-int8-per-channel", pt2e_dynamic)
pt2e_program, pt2e_step = on_runtime(pt2e_pte)
ran = operators_run(pt2e_pte, [tokens[None], torch.arange(len(tokens))])
pt2e_gemms = {op: n for op, n in ran.xnnpack.items() if op.startswith("Fully Connected")}
scores["PT2E .pte"] = perplexity(pt2e_step)
print(", ".join(f"{op} ×{n}" for op, n in pt2e_gemms.items()))
print(f"PT2E .pte: {len(pt2e_pte):,} bytes, perplexity {scores['PT2E .pte']:.3f}")
pt2e_types = [re.search(r"\((.*)\)", op)[1].split(", ") for op in pt2e_gemms]
assert sum(pt2e_gemms.values()) == len(linears), "every linear in XNNPACK"
assert all(t[1].startswith("QD") and t[-1] == "QC8W" for t in pt2e_types), "dynamic int8 × int8"
assert scores["fp32"] < scores["PT2E .pte"] < scores["8da4w .pte"], "8-bit weights: closer"
assert len(pte) < len(pt2e_pte) < len(fp32_pte), "between the 4-bit and the fp32 files"
torch.set_num_threads(threads_before)

# %%
# Summary
# -------
# - ``export_decoder`` → ``to_edge_transform_and_lower`` with ``XnnpackPartitioner`` →
#   ``to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))``, under
#   ``torch.no_grad()``, gives one ``.pte`` for prefill and decode. The 8-bit embedding becomes
#   ``embedding_byte``, a kernel of ExecuTorch's quantized library the runtime must link.
# - The KV cache is a mutated buffer: planned in the method's arena, not stored in the file.
# - On the runtime, the ``.pte`` makes the eager 8da4w model's choice at nearly every position
#   and matches its perplexity within a fraction of a percent; greedy text can still part
#   where two characters are nearly tied. The float ``.pte`` matches eager fp32 exactly.
# - Every linear ran in XNNPACK as dynamic int8 × int4 (``QB4W``); the embedding, RMSNorm's
#   mean, the cache writes and the attention mask ran on portable kernels.
# - PT2E's dynamic int8 lowers the same way once converted and exported again: per-channel
#   int8 weights (``QC8W``), a larger file and a perplexity closer to fp32.
#
# Exercises
# ---------
# 1. Prefill the ``.pte`` with 300 characters, more than the ``MAX_LEN`` of 256 it was
#    exported for. Predict what the runtime does.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#          from common.language_model import MAX_LEN
#
#          long = held_out[:300][None]
#          with expect_error(RuntimeError), contextlib.redirect_stderr(io.StringIO()):
#              step(long, torch.arange(300))
#          assert long.shape[1] > MAX_LEN, "the bound of the export's dynamic length"
#
# 2. Generate from the prompt a second time on the same loaded method, without resetting the
#    cache. Predict whether the text changes.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          again = generate(step, PROMPT, LENGTH)
#          print(repr(again))
#          # The prefill rewrites positions 0 … len(PROMPT) - 1 and the mask hides the rest.
#          assert again == texts["8da4w .pte"], "what the cache held before is never read"
#
# 3. XNNPACK keeps the 4-bit weights as named data (M06-3). Predict its bytes from the
#    number of linear weights: half a byte per weight, and per group of 32 one scale of 2 bytes
#    (XNNPACK keeps blockwise scales in bf16).
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          named = sum(program.segments[entry.segment_index].size for entry in program.named_data)
#          weights = sum(linear.weight.numel() for linear in linears)
#          print(f"{named:,} bytes for {weights:,} weights: {named / weights:.4f} bytes each")
#          assert named == weights // 2 + weights // 32 * 2, "half a byte each, 2 bytes per 32"
#
# Further reading
# ---------------
# - `ExecuTorch: Exporting LLMs
#   <https://docs.pytorch.org/executorch/stable/llm/export-llm.html>`_, the recipe this
#   lesson takes apart (8da4w, the 8-bit embedding, the cache)
# - `ExecuTorch: XNNPACK backend
#   <https://docs.pytorch.org/executorch/stable/backends/xnnpack/xnnpack-overview.html>`_
#
# Next
# ----
# The traps of this module, a dynamic recipe without a calibration call and a group size that
# does not divide a width, are listed with the other accuracy problems on
# :ref:`Troubleshooting: accuracy and QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`.
