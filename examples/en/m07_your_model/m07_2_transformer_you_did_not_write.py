"""
M07-2 A transformer you did not write
=====================================

``nn.TransformerEncoder`` is code you cannot edit: its layers call ``self.self_attn(...)``, an
``nn.MultiheadAttention`` whose projections ``X86InductorQuantizer`` never sees, and half of
its linears stay float. Swap each layer's ``self_attn`` for a drop-in attention module with
``nn.MultiheadAttention``'s call signature and the attributes the layer reads, its q/k/v and
output projections four ``nn.Linear`` layers loaded from the MHA's weights: the float encoder
computes the same outputs, every one of its twelve linears gets int8 weights, static and
dynamic, and compiled with freezing both int8 encoders run oneDNN int8 kernels and no float
linear.

**What you will learn**

- What ``nn.TransformerEncoderLayer`` asks of its ``self_attn``, read from its source
- How to write a drop-in attention that keeps the layer's fast path off and its outputs equal
- How to check a whole encoder's linears are int8, from the graph and from the kernels that ran

**Prerequisites**: :ref:`M07-1 · what will my quantizer leave in float?
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`, :ref:`M05-1 · what the
quantizer sees in attention <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`,
:ref:`M05-2 · static vs dynamic int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# The model a reader brings: a two-layer ``nn.TransformerEncoder`` (width 128, 4 heads,
# feed-forward 256, ``batch_first=True``, PyTorch's defaults otherwise), random weights, in
# eval mode; a batch of 8 sequences of 32 tokens.

import copy
import inspect
import re
import warnings
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from common.coverage import coverage
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import race
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(128, 4, 256, batch_first=True)
encoder = nn.TransformerEncoder(layer, num_layers=2).eval()
x = (torch.randn(8, 32, 128, generator=torch.Generator().manual_seed(1)),)
aten, qd = torch.ops.aten, torch.ops.quantized_decomposed

# %%
# The drop-in: ``Attention`` takes ``nn.MultiheadAttention``'s arguments and returns
# ``(output, None)`` (it never computes the attention weights). It has no packed
# ``in_proj_weight``: q, k and v are separate ``nn.Linear`` layers, so it says
# ``_qkv_same_embed_dim = False`` and ``in_proj_weight = None`` (as ``nn.MultiheadAttention``
# does when its q/k/v weights are separate), and ``in_proj_bias = None``: its biases live in
# the linears. Masks follow MHA's rules: a boolean mask marks the positions *not* to attend,
# a float mask is added.
# ``from_mha`` cuts the packed weights in three; ``swap_attention`` puts one in every layer.


class Attention(nn.Module):
    def __init__(self, embed_dim, num_heads, *, dropout=0.0, bias=True, batch_first=False):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self._qkv_same_embed_dim = False  # no packed q/k/v weight: the fast path stays off
        self.register_parameter("in_proj_weight", None)
        self.register_parameter("in_proj_bias", None)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention) -> "Attention":
        bias = mha.in_proj_bias is not None
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=bias)
        new.batch_first, dim = mha.batch_first, mha.embed_dim
        for i, proj in enumerate((new.q_proj, new.k_proj, new.v_proj)):
            proj.weight.data.copy_(mha.in_proj_weight.data[i * dim : (i + 1) * dim])
            if bias:
                proj.bias.data.copy_(mha.in_proj_bias.data[i * dim : (i + 1) * dim])
        new.out_proj.load_state_dict(mha.out_proj.state_dict())
        return new.train(mha.training)

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        if not self.batch_first:  # (length, batch, dim) -> (batch, length, dim)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        batch, length, _ = query.shape

        def heads(t):
            return t.view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(key)), heads(self.v_proj(value))
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as MHA)")
        mask = None
        if not (is_causal and key_padding_mask is None):  # MHA's rule for the causal hint
            is_causal, mask = False, additive(attn_mask, q.dtype)
            if key_padding_mask is not None:
                padding = additive(key_padding_mask, q.dtype).view(batch, 1, 1, -1)
                mask = padding if mask is None else mask + padding
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, mask, p, is_causal=is_causal)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, self.embed_dim))
        return (out if self.batch_first else out.transpose(0, 1)), None


def additive(mask, dtype):
    """MHA's masks as SDPA's float mask: True (do not attend) becomes -inf."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, float("-inf"))


def swap_attention(model: nn.TransformerEncoder) -> nn.TransformerEncoder:
    for encoder_layer in model.layers:
        encoder_layer.self_attn = Attention.from_mha(encoder_layer.self_attn)
    # TransformerEncoder.__init__ chose nested tensors from the MHA's attributes; with
    # _qkv_same_embed_dim False it would have chosen not to.
    model.use_nested_tensor = False
    return model


def quantized(model, *, dynamic=False):
    config = get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    prepared = prepare_pt2e(export_module(model, x), X86InductorQuantizer().set_global(config))
    prepared(*x)  # calibration: one batch (the dynamic config observes only the weights here)
    # The observers that recorded a range: with the dynamic config only the weights' per-channel
    # observers; the activations' PlaceholderObservers hold no state, their scale is measured per
    # batch at run time. The static config adds the activations' histograms.
    empty = torch.tensor([])
    recorded = {
        type(m).__name__
        for m in prepared.modules()
        if getattr(m, "min_val", empty).isfinite().any()
    }
    weights_only = {"PerChannelMinMaxObserver"}
    assert recorded == (weights_only if dynamic else weights_only | {"HistogramObserver"}), (
        f"observers that recorded a range during calibration: {sorted(recorded)}"
    )
    return convert_pt2e(prepared)


def attention_linears(gm) -> list[str]:
    """The linear nodes recorded inside a layer's ``self_attn``."""
    linears = gm.graph.find_nodes(op="call_function", target=aten.linear.default)
    return [
        n.name for n in linears if "self_attn" in list(n.meta["nn_module_stack"].values())[-1][0]
    ]


def int8_linears(gm) -> int:
    """Linears whose weight is dequantized from int8 per channel, counted on the graph."""
    linears = gm.graph.find_nodes(op="call_function", target=aten.linear.default)
    return sum(n.args[1].target == qd.dequantize_per_channel.default for n in linears)


# %%
# Step 1 — Read what the layer asks of its self_attn
# --------------------------------------------------
# Every attribute ``TransformerEncoderLayer.forward`` reads from ``self.self_attn``, found in
# its source: most of them only to decide whether to take the fast path, a fused C++ kernel
# (``torch._transformer_encoder_layer_fwd``) fed with the packed weights. The slow path calls
# ``self.self_attn(x, x, x, attn_mask=..., key_padding_mask=..., need_weights=False,
# is_causal=...)[0]``: the module's call signature is all it needs.

source = inspect.getsource(nn.TransformerEncoderLayer.forward)
read = sorted(set(re.findall(r"self\.self_attn\.(\w+)", source)))
print(read)
assert read == [
    "_qkv_same_embed_dim",
    "batch_first",
    "embed_dim",
    "in_proj_bias",
    "in_proj_weight",
    "merge_masks",
    "num_heads",
    "out_proj",
]

# %%
# Step 2 — What x86 leaves float in the encoder as written
# --------------------------------------------------------
# The coverage report of M07-1: of the eight linears, the four feed-forward ones are int8;
# the packed q/k/v projection and the output projection of each layer are ``F.linear``
# calls inside ``nn.MultiheadAttention`` and stay float.

report = coverage(export_module(encoder, x), x86_quantizer())
print(report.summary())
assert report.counts()["linear"] == (4, 8), "4 of the 8 linears int8"

# %%
# The first layer, quantized: the attention's linears (highlighted) read float weights.

first = quantized(encoder.layers[0])
draw(first, highlight=attention_linears(first), title="nn.MultiheadAttention: two float linears")
assert int8_linears(first) == 2, "linear1 and linear2 only"

# %%
# Step 3 — Swap the attention, keep the outputs
# ---------------------------------------------
# In eval mode without grad the original encoder takes the fast path (the mock counts its
# calls); ours never does: it has no packed weights to give it. The fast path computes the
# layer in one fused kernel, so the two differ by float rounding; stated tolerance 1e-5.

ours = swap_attention(copy.deepcopy(encoder))
fast = mock.patch.object(
    torch, "_transformer_encoder_layer_fwd", wraps=torch._transformer_encoder_layer_fwd
)
with torch.no_grad(), fast as fused:
    original_out, fast_calls = encoder(*x), fused.call_count
    ours_out = ours(*x)
print(f"fast path calls: original {fast_calls}, ours {fused.call_count - fast_calls}")
assert (fast_calls, fused.call_count) == (2, 2), "the original takes the fast path, ours never"
torch.testing.assert_close(ours_out, original_out, rtol=0, atol=1e-5)

# %%
# With grad enabled the original takes its slow path, the one ours reproduces: the same
# function with and without masks (a causal mask, padding on the last three tokens).

causal = nn.Transformer.generate_square_subsequent_mask(32)
padding = torch.zeros(8, 32, dtype=torch.bool)
padding[:, -3:] = True
for kwargs in ({}, {"mask": causal, "is_causal": True}, {"src_key_padding_mask": padding}):
    diff = (ours(*x, **kwargs) - encoder(*x, **kwargs)).abs().max().item()
    print(f"{sorted(kwargs) or 'no mask'}: largest difference {diff:.1e}")
    torch.testing.assert_close(ours(*x, **kwargs), encoder(*x, **kwargs), rtol=0, atol=1e-5)

# %%
# Step 4 — Every linear int8, static and dynamic
# ----------------------------------------------
# The report on our encoder: twelve linears (q, k, v, out, and the two feed-forward ones per
# layer), all int8, with the static config and with ``is_dynamic=True``. The attention's
# SDPA stays float, in no op set of x86's, and so do the residual adds: each add's input
# comes from a linear through an eval-mode dropout node (the layer's ``dropout1`` and
# ``dropout2``: no-ops in eval mode, kept by the non-strict export), and x86 fuses an add only
# right after its linear. The summary names the dropouts.

for dynamic in (False, True):
    config = get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    ours_report = coverage(export_module(ours, x), X86InductorQuantizer().set_global(config))
    print(ours_report.summary())
    assert ours_report.counts()["linear"] == (12, 12), "all 12 linears int8"
    adds = [ours_report[name] for name in ours_report.names(kind="add")]
    assert all("eval-mode dropout" in add.reason for add in adds), "a dropout before each add"

# %%
# An independent count, from the converted graphs: every linear reads an int8 weight through
# ``dequantize_per_channel``; the static model's activations come through
# ``dequantize_per_tensor.default`` (scale fixed at calibration), the dynamic model's through
# ``dequantize_per_tensor.tensor`` (scale computed per batch by ``choose_qparams``).

static, dynamic = quantized(ours), quantized(ours, dynamic=True)
for label, gm, dq in (
    ("static", static, qd.dequantize_per_tensor.default),
    ("dynamic", dynamic, qd.dequantize_per_tensor.tensor),
):
    linears = gm.graph.find_nodes(op="call_function", target=aten.linear.default)
    print(f"{label}: {int8_linears(gm)} of {len(linears)} linears read int8 weights")
    assert int8_linears(gm) == len(linears) == 12
    assert all(n.args[0].target == dq for n in linears), f"{label} int8 activations"

# %%
# The first layer of ours, quantized statically: six linears, each between dequantize nodes.

ours_first = quantized(ours.layers[0])
draw(ours_first, highlight=attention_linears(ours_first), title="Attention: int8 q, k, v, out")
assert len(attention_linears(ours_first)) == 4 and int8_linears(ours_first) == 6

# %%
# Step 5 — Race them, and read the kernels
# ----------------------------------------
# ``race`` (M03-3) compiles each model with freezing, in the timing's thread count, and
# reads which kernels each one ran. Both int8 encoders run oneDNN's int8 linear for all
# twelve linears and no float linear kernel (``aten::addmm``, MKL's or oneDNN's float
# linear). The times are this machine's, printed, never asserted. With VNNI the int8 rows are
# the faster ones, by less than the 4× of M03-3's ceiling, since attention, layer norm and
# quantizing the activations stay float; without VNNI (AVX2) oneDNN's int8 linears can lose
# to fp32 (M03-3). The CPU line under the table says which case this page was built on.

timings = race({"fp32": export_module(ours, x), "int8 static": static, "int8 dynamic": dynamic}, x)
print(timings.table())
for label in ("int8 static", "int8 dynamic"):
    ran = timings.kernels[label]
    assert ran.int8["onednn::qlinear_pointwise"] == 12, f"{label}: 12 int8 linears ran"
    assert not ran.float, f"{label}: no float linear left"

# %%
# Summary
# -------
# ==========================================  ==============================================
# the encoder                                 int8 linears (x86)
# ==========================================  ==============================================
# as written (``nn.MultiheadAttention``)      4 of 8: the attention's are ``F.linear`` calls
# ``Attention`` swapped in, static            12 of 12, weights and activations int8
# ``Attention`` swapped in, dynamic           12 of 12, activations scaled per batch
# float outputs, ours vs the original         equal within 1e-5 (fast path), masks too
# compiled with freezing                      oneDNN int8 linears only, no float linear
# ==========================================  ==============================================
#
# The drop-in needs MHA's signature, its return value ``(output, weights)``, and the
# attributes the layer and the encoder read: ``batch_first`` for the layout,
# ``_qkv_same_embed_dim`` and ``in_proj_weight``/``in_proj_bias``, which switch the fast path
# off (exercise 3 shows another switch: a hook).
#
# Exercises
# ---------
# 1. Swap the attention in the first layer only. Predict the linears and how many are int8.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          half = copy.deepcopy(encoder)
#          half.layers[0].self_attn = Attention.from_mha(half.layers[0].self_attn)
#          half.use_nested_tensor = False
#          counts = coverage(export_module(half, x), x86_quantizer()).counts()
#          assert counts["linear"] == (8, 10), "6 in the first layer, 2 of 4 in the second"
#
# 2. Change ``batch_first`` to ``False`` (inputs ``(length, batch, dim)``). Predict whether
#    the swapped encoder still equals the original.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          seq_first = nn.TransformerEncoder(
#              nn.TransformerEncoderLayer(128, 4, 256), num_layers=2, enable_nested_tensor=False
#          ).eval()
#          tokens = x[0].transpose(0, 1)
#          swapped = swap_attention(copy.deepcopy(seq_first))
#          torch.testing.assert_close(swapped(tokens), seq_first(tokens), rtol=0, atol=1e-5)
#
# 3. Register a forward hook on each original layer's ``self_attn`` (still an
#    ``nn.MultiheadAttention``). Predict the fast-path calls in eval mode without grad.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          hooked = copy.deepcopy(encoder)
#          for hooked_layer in hooked.layers:
#              hooked_layer.self_attn.register_forward_hook(lambda module, args, out: None)
#          with torch.no_grad(), mock.patch.object(
#              torch, "_transformer_encoder_layer_fwd", wraps=torch._transformer_encoder_layer_fwd
#          ) as fused:
#              hooked(*x)
#          assert fused.call_count == 0, "a hook anywhere in the layer turns the fast path off"
#
# Further reading
# ---------------
# - `torch.nn.TransformerEncoderLayer
#   <https://docs.pytorch.org/docs/stable/generated/torch.nn.TransformerEncoderLayer.html>`_
# - `torch/nn/modules/transformer.py
#   <https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/transformer.py>`_
# - `torch.nn.functional.scaled_dot_product_attention
#   <https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html>`_
#
# Next
# ----
# :ref:`sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py` takes one graph through every
# quantizer that runs here. The
# :ref:`troubleshooting entries <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`
# start from the errors a model of your own may raise.
