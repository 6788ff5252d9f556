"""
M05-1 What the quantizer sees in attention
==========================================

Quantize a small vision transformer with ``X86InductorQuantizer``'s defaults and half of it
stays float. Written with ``nn.MultiheadAttention``, none of the attention projections gets
int8 weights; written as modern code writes it — separate q/k/v ``nn.Linear`` layers and
``F.scaled_dot_product_attention`` — all of them do, and still the two matrix products
inside attention stay float. This lesson reads why from the graph and from the quantizer's
source, makes the projections quantize, and follows the graph into lowering: eager lowering
gives no int8 op to any 3-D linear, ``torch.compile`` with freezing gives one to every one,
and the course's own lowering stays bit-exact with torchao's on a graph with a class token.

**What you will learn**

- How ``X86InductorQuantizer`` finds the linears it quantizes, and why
  ``nn.MultiheadAttention`` hides its projections from it
- What the quantizer does with ``matmul`` and ``scaled_dot_product_attention``
- Why eager lowering leaves 3-D linears in float and ``torch.compile`` with freezing does not

**Prerequisites**: :ref:`M00-3 · finding patterns
<sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`, :ref:`M03-1 · the lowered graph
<sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`, :ref:`M03-2 · lowering by hand
<sphx_glr_lessons_m03_lowering_m03_2_lowering_by_hand.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``vit_mha`` and ``vit_sdpa`` are the same ViT-style classifier for the 8×8 digits of M04
# (``common.models.DigitsViT``): a 2×2 patch embedding (a conv), a class token, position
# embeddings, two pre-norm encoder blocks and a linear head. Only the attention differs:
# ``nn.MultiheadAttention`` in one, q/k/v ``nn.Linear`` + SDPA in the other. Random weights
# are enough here; the images come from the digits' calibration split.

import warnings
from collections import Counter

import torch
from torch import nn
from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

from common.cpu import describe
from common.data import digits, export_digits_model
from common.kernels import kernels_run
from common.models import DigitsViT, SelfAttention, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer

from common import lowering

images, _ = digits("calibration")
x = (images[:8],)
aten, qd = torch.ops.aten, torch.ops.quantized_decomposed

# %%
# Helpers: ``quantized`` runs the PT2E flow on a model (calibrated on the 200 calibration
# images); ``linears`` lists a graph's linear nodes with the module they came from (the
# innermost entry of ``meta["nn_module_stack"]``) and whether their weight is int8;
# ``quantized_block`` quantizes one encoder block alone, on random tokens, for the pictures,
# where ``in_attention`` picks out the nodes of its attention.


def quantized(model, quantizer=None):
    prepared = prepare_pt2e(export_digits_model(model), quantizer or x86_quantizer())
    with torch.no_grad():
        prepared(images)
    return convert_pt2e(prepared)


def linears(gm) -> list[tuple[str, str, str, bool]]:
    """(node, module path, module class, int8 weight?) for each linear node."""
    rows = []
    for node in gm.graph.find_nodes(op="call_function", target=aten.linear.default):
        path, cls = list(node.meta["nn_module_stack"].values())[-1]
        int8 = node.args[1].target == qd.dequantize_per_channel.default
        rows.append((node.name, path, str(cls).rsplit(".", 1)[-1].strip("'>"), int8))
    return rows


def in_attention(node) -> bool:
    return any(path.startswith("attn") for path, _ in node.meta.get("nn_module_stack", {}).values())


tokens = (torch.randn(8, 17, 32, generator=torch.Generator().manual_seed(0)),)


def quantized_block(name):
    """The first encoder block of ``name``, quantized on its own (small enough to draw)."""
    prepared = prepare_pt2e(export_module(get_model(name).blocks[0], tokens), x86_quantizer())
    prepared(*tokens)
    return convert_pt2e(prepared)


def show(rows):
    for name, path, cls, int8 in rows:
        print(f"{name:10} {path:22} {cls:19} {'int8' if int8 else 'float'}")


# %%
# Step 1 — Quantize both styles and read which linears got int8
# --------------------------------------------------------------
# With ``nn.MultiheadAttention`` the two attention linears of each block — the packed
# q/k/v projection and the output projection — keep float weights; the MLP's ``fc1``/``fc2``
# and the head are int8. With separate linears every one of the 13 linears is int8.

mha = quantized(get_model("vit_mha"))
sdpa = quantized(get_model("vit_sdpa"))
print("nn.MultiheadAttention:")
show(linears(mha))
float_mha = [(path, cls) for _, path, cls, int8 in linears(mha) if not int8]
assert float_mha == [
    ("blocks.0.attn", "MultiheadAttention"),
    ("blocks.0.attn", "MultiheadAttention"),
    ("blocks.1.attn", "MultiheadAttention"),
    ("blocks.1.attn", "MultiheadAttention"),
]
assert sum(int8 for *_, int8 in linears(mha)) == 5, "fc1, fc2 of both blocks and the head"

# %%
# The other style: all linears, the attention projections among them, read int8 weights.

print("q/k/v nn.Linear + SDPA:")
show(linears(sdpa))
assert all(int8 for *_, int8 in linears(sdpa)) and len(linears(sdpa)) == 13

# %%
# The pictures show the first encoder block of each style, quantized alone, attention
# highlighted. In the first, the attention's ``linear`` nodes read a float
# ``‹in_proj_weight›``; in the second each projection reads a dequantized int8 weight. In
# both, ``scaled_dot_product_attention`` reads float q, k, v: no quantize before it, none after.

mha_block, sdpa_block = quantized_block("vit_mha"), quantized_block("vit_sdpa")
attention = [n.name for n in mha_block.graph.nodes if in_attention(n)]
draw(mha_block, highlight=attention, title="nn.MultiheadAttention: attention stays float")

# %%

attention = [n.name for n in sdpa_block.graph.nodes if in_attention(n)]
draw(sdpa_block, highlight=attention, title="q/k/v linears + SDPA: int8 projections")
sdpa_node = next(
    iter(
        sdpa.graph.find_nodes(op="call_function", target=aten.scaled_dot_product_attention.default)
    )
)
assert all(arg.target == aten.transpose.int for arg in sdpa_node.args[:3]), "float q, k, v"
assert all(user.target != qd.quantize_per_tensor.default for user in sdpa_node.users)

# %%
# Step 2 — Why: how the quantizer finds a linear
# ----------------------------------------------
# ``X86InductorQuantizer._annotate_linear`` does not look at ``aten.linear`` nodes directly:
# it asks ``get_source_partitions(graph, [nn.Linear, F.linear])`` for the nodes that came
# from an ``nn.Linear`` module or an ``F.linear`` call. A non-strict export records no
# ``source_fn_stack``, so ``get_source_partitions`` falls back to the innermost module of
# ``nn_module_stack`` and keeps the node if that module's class is ``nn.Linear`` or a
# subclass of it. ``nn.MultiheadAttention`` keeps its q/k/v weights in one parameter,
# ``in_proj_weight``, and never calls its ``out_proj`` module: ``F.multi_head_attention_forward``
# reads ``out_proj.weight`` and calls ``F.linear`` itself. Both linears are recorded inside
# ``MultiheadAttention``, which is no ``nn.Linear``, so the quantizer never sees them.

found = {
    label: {
        p.nodes[-1].name
        for parts in get_source_partitions(gm.graph, [nn.Linear, nn.functional.linear]).values()
        for p in parts
    }
    for label, gm in (("vit_mha", mha), ("vit_sdpa", sdpa))
}
print({label: len(nodes) for label, nodes in found.items()}, "linears found")
assert len(found["vit_mha"]) == 5 and len(found["vit_sdpa"]) == 13
in_proj = next(n for n in mha.graph.nodes if n.name == "linear")
print(in_proj.format_node(), "\n  from", list(in_proj.meta["nn_module_stack"].values())[-1])
assert in_proj.args[1].target == "blocks.0.attn.in_proj_weight", "one packed float weight"
assert "source_fn_stack" not in in_proj.meta, "non-strict export: no source_fn_stack"

# %%
# ``out_proj`` *is* an ``nn.Linear`` (a subclass, ``NonDynamicallyQuantizableLinear``), but
# its module is never called, so no node is recorded inside it.

assert issubclass(nn.modules.linear.NonDynamicallyQuantizableLinear, nn.Linear)
modules = {path for n in mha.graph.nodes for path, _ in n.meta.get("nn_module_stack", {}).values()}
assert "blocks.0.attn.out_proj" not in modules and "blocks.0.attn" in modules

# %%
# And the two products inside attention, q·kᵀ and the weighted sum of v? The quantizer's
# recipe has two sets of ops. ``default_quantizable_ops`` are annotated under
# ``set_global``; ``aten.matmul`` is only in the larger ``quantizable_ops``, annotated when
# you ask for it by function or module name (M05-3). ``scaled_dot_product_attention`` is in
# neither: this quantizer never annotates SDPA, whatever its config. (torchao 0.18 has a
# prototype int8 SDPA fusion for x86, in ``torchao.prototype.inductor``: a separate path, not
# this quantizer's.)

ops = x86_inductor_quantizer
print(
    f"matmul by default: {aten.matmul.default in ops.default_quantizable_ops}"
    f" | on request: {aten.matmul.default in ops.quantizable_ops}"
)
assert aten.matmul.default not in ops.default_quantizable_ops
assert aten.matmul.default in ops.quantizable_ops
assert aten.scaled_dot_product_attention.default not in ops.quantizable_ops

# %%
# Step 3 — Make the projections quantize
# --------------------------------------
# The quantizer matches modules, so give it modules: replace each ``nn.MultiheadAttention``
# by a ``SelfAttention`` with separate q/k/v linears holding the same weights (the packed
# ``in_proj_weight`` cut in three). The float model computes the same function; now all
# 13 linears are int8.


def split_attention(model: DigitsViT) -> DigitsViT:
    for block in model.blocks:
        mha_module, dim = block.attn, block.attn.embed_dim
        attention = SelfAttention(dim, mha_module.num_heads)
        for i, proj in enumerate((attention.q_proj, attention.k_proj, attention.v_proj)):
            proj.weight.data = mha_module.in_proj_weight.data[i * dim : (i + 1) * dim].clone()
            proj.bias.data = mha_module.in_proj_bias.data[i * dim : (i + 1) * dim].clone()
        attention.out_proj.load_state_dict(mha_module.out_proj.state_dict())
        block.attn = attention
    return model


split = split_attention(get_model("vit_mha"))
with torch.no_grad():
    torch.testing.assert_close(split(images), get_model("vit_mha")(images))
split_q = quantized(split)
print(Counter(int8 for *_, int8 in linears(split_q)), "(True: int8 weights)")
assert all(int8 for *_, int8 in linears(split_q)) and len(linears(split_q)) == 13

# %%
# Step 4 — Lower eagerly: no int8 op for a 3-D linear
# ---------------------------------------------------
# ``lower_pt2e_quantized_to_x86`` (M03-1) on the SDPA model gives exactly two oneDNN ops: the
# patch embedding's conv and the head, the only linear whose input is 2-D (the class token's
# row). The twelve linears inside the blocks read ``(batch, 17, 32)`` tensors; the strict
# re-export records each as ``view → addmm → view``, still between dequantize and quantize.

lowered = lower_pt2e_quantized_to_x86(sdpa, x)
lowered_ops = Counter(str(n.target) for n in lowered.graph.nodes if n.op == "call_function")
print({op: k for op, k in lowered_ops.items() if "onednn" in op or "addmm" in op})
assert lowered_ops["onednn.qconv_pointwise.default"] == 1
assert lowered_ops["onednn.qlinear_pointwise.default"] == 1, "only the head"
addmms = lowered.graph.find_nodes(op="call_function", target=aten.addmm.default)
assert len(addmms) == 12
assert all(a.args[1].target == aten.view.default for a in addmms), "view → addmm"
assert all(a.args[1].args[0].target == qd.dequantize_per_tensor.default for a in addmms)

# %%
# Why: inductor's int8-linear patterns for inputs of more than two dimensions are written
# with ``aten.reshape`` around the ``addmm`` (``_may_generate_pattern_with_reshape`` in
# ``torch/_inductor/fx_passes/quantization.py``), and the re-export wrote ``aten.view``.
# ``torch.compile`` runs ``view_to_reshape`` on the graph before its freezing passes
# (``torch/_inductor/freezing.py``); torchao's eager lowering does not. It is the same
# ``view`` that makes ``small_cnn``'s lowered graph fail in M03-1.
#
# Step 5 — torch.compile with freezing: every linear prepacked
# ------------------------------------------------------------
# Compile the quantized first block of the SDPA model (from Step 1) with freezing (M03-3)
# and count what inductor's int8 patterns did: all six linears of the block — q, k, v, out,
# fc1, fc2 — are prepacked for oneDNN. Compiling takes seconds, so one block stands for the
# model; SDPA itself stays a float kernel. (One compile thread: a pool of compile workers
# would take longer to start than these kernels take to build.)

with torch.no_grad():
    simulated_out = sdpa_block(*tokens)
torch._inductor.config.freezing = True  # for the process: a recompile keeps it (m99_3)
with torch._inductor.config.patch(compile_threads=1), torch.no_grad():
    with warnings.catch_warnings():  # inductor's own "To copy construct from a tensor" warning
        warnings.filterwarnings("ignore", message="To copy construct from a tensor")
        compiled_block = torch.compile(sdpa_block, dynamic=False)
        compiled_out = compiled_block(
            *tokens
        ).clone()  # a second call returns the same storage: keep a copy
    ran = kernels_run(compiled_block, tokens)
print(ran.summary)
assert sum(ran.int8.values()) == 6 and not ran.float, "q, k, v, out, fc1, fc2"

# %%
# The compiled block runs real int8 kernels. With VNNI its output agrees with the simulated
# block's to rounding; without it, oneDNN adds pairs of uint8 × int8 products in 16 bits,
# which can saturate (M03-1), and the agreement is looser. The verdict line says which
# case this page was built on.

noise = (compiled_out - simulated_out).pow(2).mean()
sqnr = 10 * torch.log10(simulated_out.pow(2).mean() / noise).item()
cpu = describe()
print(cpu.verdict)
print(f"compiled int8 vs q/dq block: SQNR {sqnr:.1f} dB")
assert sqnr > 20, "the same int8 computation"
if cpu.vnni:
    assert sqnr > 60, "with VNNI: rounded differently at most"

# %%
# Step 6 — A class token on constants only
# ----------------------------------------
# Two things in this graph are new to the lowering. The class token is
# ``expand(cls_token, [8, -1, -1])``, an op that reads constants only: torchao's lowering
# (inductor's constant folding) runs it once and keeps the result as a constant
# ``_frozen_paramN``, which ``cat`` now reads. The position embedding is an ``add`` of a
# constant after that ``cat``; no folding applies to it, and it stays.

(cat,) = lowered.graph.find_nodes(op="call_function", target=aten.cat.default)
token = cat.args[0][0]
print(f"torchao: cat reads {token.op} {token.target} {tuple(getattr(lowered, token.target).shape)}")
assert token.op == "get_attr" and "aten.expand.default" not in lowered_ops
assert torch.equal(getattr(lowered, token.target), sdpa.cls_token.expand(8, -1, -1))
(pos_add,) = cat.users
assert pos_add.target == aten.add.Tensor and pos_add.args[1].target == "pos_embed"

# %%
# ``common.lowering`` (M03-2) does the same in ``fold_constants``, one more M00 move: run
# the node on its constants, register the result as a buffer, put a ``get_attr`` in its
# place. With it, ``common.lowering.lower`` gives torchao's lowered graph bit for bit on this
# model: the same ops, the same constants, equal outputs.

mine = lowering.lower(sdpa, x)
mine_ops = Counter(str(n.target) for n in mine.graph.nodes if n.op == "call_function")
assert mine_ops == lowered_ops, "the same ops"
assert mine.state_dict().keys() == lowered.state_dict().keys(), "the same constants"
for key, value in lowered.state_dict().items():
    ours = mine.state_dict()[key]
    if value.layout == torch._mkldnn:  # a prepacked weight: read its numbers back
        ours, value = ours.to_dense(), value.to_dense()
    assert torch.equal(ours, value), f"{key} differs"
assert torch.equal(mine(*x), lowered(*x)), "equal outputs"

# %%
# Summary
# -------
# ===============================================  ==============================================
# in the graph                                     int8?
# ===============================================  ==============================================
# ``nn.MultiheadAttention`` in_proj, out_proj      no: inside ``MultiheadAttention``, not a Linear
# q/k/v/out ``nn.Linear``                          yes: found by ``get_source_partitions``
# ``matmul``                                       only on request (``quantizable_ops``)
# ``scaled_dot_product_attention``                 never
# 3-D linear, eager lowering                       no oneDNN op: ``view``, not ``reshape``
# 3-D linear, ``torch.compile`` + freezing         prepacked: ``view_to_reshape`` runs first
# class token ``expand``                           folded into a constant by both lowerings
# ===============================================  ==============================================
#
# Exercises
# ---------
# 1. ``set_module_type_qconfig(nn.MultiheadAttention, config)`` asks for int8 in every
#    ``nn.MultiheadAttention``. Predict how many linears of ``vit_mha`` get int8 weights.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config()
#          by_type = x86_inductor_quantizer.X86InductorQuantizer().set_global(config)
#          with warnings.catch_warnings(record=True) as caught:
#              warnings.simplefilter("always")
#              by_type.set_module_type_qconfig(nn.MultiheadAttention, config)
#          assert any("Unable to customize" in str(w.message) for w in caught), (
#              "torchao warns that it cannot"
#          )
#          rows = linears(quantized(get_model("vit_mha"), by_type))
#          assert sum(int8 for *_, int8 in rows) == 5, "still 5: the partitions are the same"
#
# 2. Give torchao's lowering what ``torch.compile`` gives it: re-export as it does
#    (``lowering.reexport``), turn the views into reshapes (``lowering.reshape_views``), then
#    run inductor's ``freezing_passes``. Predict the number of ``qlinear_pointwise`` ops.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from torch._inductor.fx_passes.freezing_patterns import freezing_passes
#
#          graph = lowering.reexport(sdpa, x)
#          lowering.reshape_views(graph)
#          freezing_passes(graph, x)
#          qlinears = [n for n in graph.graph.nodes if "qlinear_pointwise" in str(n.target)]
#          assert len(qlinears) == 13, "every linear, the twelve 3-D ones too"
#
# 3. Compile ``mha_block`` the same way. Predict the prepack count.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          with torch._inductor.config.patch(compile_threads=1), torch.no_grad():
#              with warnings.catch_warnings():
#                  warnings.filterwarnings("ignore", message="To copy construct")
#                  compiled_mha = torch.compile(mha_block, dynamic=False)
#                  compiled_mha(*tokens)
#              ran = kernels_run(compiled_mha, tokens)
#          print(ran.summary)
#          assert sum(ran.int8.values()) == 2, "fc1, fc2"
#
# Further reading
# ---------------
# - `X86InductorQuantizer source
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `torch.nn.MultiheadAttention
#   <https://docs.pytorch.org/docs/stable/generated/torch.nn.MultiheadAttention.html>`_
#
# Next
# ----
# :ref:`M05-2 · static vs dynamic int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>` quantizes the activations
# of the trained ViT per batch instead of once.
