"""
M07-2 不是你寫的 Transformer
============================

``nn.TransformerEncoder`` 是你改不了的程式碼：它的每一層呼叫 ``self.self_attn(...)`` ，也就是
一個 ``nn.MultiheadAttention`` ，而 ``X86InductorQuantizer`` 看不見它的投影，於是一半的 linear
留在浮點數。把每一層的 ``self_attn`` 換成一個可直接替換的 attention 模組：呼叫方式和
``nn.MultiheadAttention`` 相同，也有這一層會讀取的屬性，它的 q／k／v 與輸出投影是四個從 MHA
的 weight 載入的 ``nn.Linear`` 。浮點 encoder 算出相同的輸出，十二個 linear 全都拿到 int8
weight，靜態與動態皆然；開啟 freezing 編譯之後，兩個 int8 encoder 都執行 oneDNN 的 int8
kernel，沒有留下任何浮點 linear。

**你會學到**

- ``nn.TransformerEncoderLayer`` 要求它的 ``self_attn`` 提供什麼，從它的原始碼讀出來
- 怎麼寫一個可直接替換的 attention，讓這一層的快速路徑保持關閉、輸出保持相同
- 怎麼確認整個 encoder 的 linear 都是 int8：從圖，也從實際執行的 kernel

**先備知識**： :ref:`M07-1 · 我的 quantizer 會把什麼留在浮點數？
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`、 :ref:`M05-1 · quantizer 在
attention 裡看見什麼 <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`、 :ref:`M05-2 ·
靜態與動態 int8 <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 讀者帶來的模型：兩層的 ``nn.TransformerEncoder`` （寬度 128、4 個 head、前饋層 256、
# ``batch_first=True`` ，其餘用 PyTorch 的預設值），隨機 weight，eval 模式；輸入是一批 8 個
# 序列，每個 32 個 token。

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
# 可直接替換的模組： ``Attention`` 接受 ``nn.MultiheadAttention`` 的引數，回傳
# ``(output, None)`` （它從不計算 attention weight）。它沒有打包在一起的 ``in_proj_weight`` ：
# q、k、v 是分開的 ``nn.Linear`` ，所以它設定 ``_qkv_same_embed_dim = False`` 與
# ``in_proj_weight = None`` （q／k／v weight 分開時， ``nn.MultiheadAttention`` 自己也是
# 這樣），以及 ``in_proj_bias = None`` ：它的 bias 在各個 linear 裡。mask 依照 MHA 的規則：
# 布林 mask 標出「不」參與 attention 的位置，浮點 mask 則直接相加。 ``from_mha`` 把打包的
# weight 切成三份； ``swap_attention`` 在每一層放進一個。


class Attention(nn.Module):
    def __init__(self, embed_dim, num_heads, *, dropout=0.0, bias=True, batch_first=False):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self._qkv_same_embed_dim = False  # 沒有打包的 q/k/v weight：快速路徑保持關閉
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
        if not self.batch_first:  # (長度, 批次, 維度) -> (批次, 長度, 維度)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        batch, length, _ = query.shape

        def heads(t):
            return t.view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(key)), heads(self.v_proj(value))
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as MHA)")
        mask = None
        if not (is_causal and key_padding_mask is None):  # MHA 對 causal 提示的規則
            is_causal, mask = False, additive(attn_mask, q.dtype)
            if key_padding_mask is not None:
                padding = additive(key_padding_mask, q.dtype).view(batch, 1, 1, -1)
                mask = padding if mask is None else mask + padding
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, mask, p, is_causal=is_causal)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, self.embed_dim))
        return (out if self.batch_first else out.transpose(0, 1)), None


def additive(mask, dtype):
    """把 MHA 的 mask 轉成 SDPA 的浮點 mask：True（不參與）變成 -inf。"""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, float("-inf"))


def swap_attention(model: nn.TransformerEncoder) -> nn.TransformerEncoder:
    for encoder_layer in model.layers:
        encoder_layer.self_attn = Attention.from_mha(encoder_layer.self_attn)
    # TransformerEncoder.__init__ 建構時已依 MHA 的屬性選了 nested tensor；若當時
    # _qkv_same_embed_dim 就是 False，它本來會選擇不用，所以這裡自己關掉。
    model.use_nested_tensor = False
    return model


def quantized(model, *, dynamic=False):
    config = get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    prepared = prepare_pt2e(export_module(model, x), X86InductorQuantizer().set_global(config))
    prepared(*x)  # 校準：一個批次（動態設定在這裡只讓 weight 的 observer 看過資料）
    # 記下了範圍的 observer：動態設定只有 weight 的 per-channel observer；活化值的
    # PlaceholderObserver 沒有狀態，scale 在執行時逐批次量測。靜態設定還有活化值的直方圖。
    empty = torch.tensor([])
    recorded = {
        type(m).__name__
        for m in prepared.modules()
        if getattr(m, "min_val", empty).isfinite().any()
    }
    weights_only = {"PerChannelMinMaxObserver"}
    assert recorded == (weights_only if dynamic else weights_only | {"HistogramObserver"}), (
        f"校準時記下範圍的 observer：{sorted(recorded)}"
    )
    return convert_pt2e(prepared)


def attention_linears(gm) -> list[str]:
    """``nn_module_stack`` 記在某一層 ``self_attn`` 底下的 linear node。"""
    linears = gm.graph.find_nodes(op="call_function", target=aten.linear.default)
    return [
        n.name for n in linears if "self_attn" in list(n.meta["nn_module_stack"].values())[-1][0]
    ]


def int8_linears(gm) -> int:
    """在圖上數出 weight 由 per-channel int8 dequantize 而來的 linear。"""
    linears = gm.graph.find_nodes(op="call_function", target=aten.linear.default)
    return sum(n.args[1].target == qd.dequantize_per_channel.default for n in linears)


# %%
# 步驟 1 — 讀出這一層要求 self_attn 提供什麼
# -------------------------------------------
# 從原始碼找出 ``TransformerEncoderLayer.forward`` 向 ``self.self_attn`` 讀取的每個屬性：
# 大多只是用來決定要不要走快速路徑——一個融合的 C++ kernel
# （ ``torch._transformer_encoder_layer_fwd`` ），吃的是打包好的 weight。慢速路徑呼叫
# ``self.self_attn(x, x, x, attn_mask=..., key_padding_mask=..., need_weights=False,
# is_causal=...)[0]`` ：它需要的只有這個模組的呼叫方式。

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
# 步驟 2 — 原樣的 encoder，x86 把什麼留在浮點數
# ---------------------------------------------
# M07-1 的報告（ ``common.coverage`` ）：八個 linear 裡，前饋層的四個是 int8；每一層
# 打包的 q／k／v 投影與輸出投影，都是 ``nn.MultiheadAttention`` 裡的 ``F.linear`` 呼叫，
# 留在浮點數。

report = coverage(export_module(encoder, x), x86_quantizer())
print(report.summary())
assert report.counts()["linear"] == (4, 8), "8 個 linear 裡有 4 個是 int8"

# %%
# 量化後的第一層：attention 的 linear（醒目標示）讀取浮點 weight。

first = quantized(encoder.layers[0])
draw(first, highlight=attention_linears(first), title="nn.MultiheadAttention：兩個浮點 linear")
assert int8_linears(first) == 2, "只有 linear1 與 linear2"

# %%
# 步驟 3 — 換掉 attention，輸出不變
# ----------------------------------
# 在 eval 模式、不計算梯度時，原本的 encoder 走快速路徑（mock 數它被呼叫幾次）；我們的
# 從來不走：它沒有打包的 weight 可以交出去。快速路徑用一個融合 kernel 算完整層，所以兩者
# 只差在浮點捨入；容許誤差定為 1e-5。

ours = swap_attention(copy.deepcopy(encoder))
fast = mock.patch.object(
    torch, "_transformer_encoder_layer_fwd", wraps=torch._transformer_encoder_layer_fwd
)
with torch.no_grad(), fast as fused:
    original_out, fast_calls = encoder(*x), fused.call_count
    ours_out = ours(*x)
print(f"快速路徑呼叫次數：原本的 {fast_calls}，我們的 {fused.call_count - fast_calls}")
assert (fast_calls, fused.call_count) == (2, 2), "原本的走快速路徑，我們的從來不走"
torch.testing.assert_close(ours_out, original_out, rtol=0, atol=1e-5)

# %%
# 計算梯度時，原本的 encoder 走慢速路徑，也就是我們重現的那一條：不論有沒有 mask（causal
# mask、最後三個 token 的 padding），都是同一個函式。

causal = nn.Transformer.generate_square_subsequent_mask(32)
padding = torch.zeros(8, 32, dtype=torch.bool)
padding[:, -3:] = True
for kwargs in ({}, {"mask": causal, "is_causal": True}, {"src_key_padding_mask": padding}):
    diff = (ours(*x, **kwargs) - encoder(*x, **kwargs)).abs().max().item()
    print(f"{sorted(kwargs) or '沒有 mask'}：最大差異 {diff:.1e}")
    torch.testing.assert_close(ours(*x, **kwargs), encoder(*x, **kwargs), rtol=0, atol=1e-5)

# %%
# 步驟 4 — 每個 linear 都是 int8，靜態與動態皆然
# -----------------------------------------------
# 我們的 encoder 的報告：十二個 linear（每層的 q、k、v、out 與兩個前饋層），在靜態設定
# 與 ``is_dynamic=True`` 下全都是 int8。attention 的 SDPA 留在浮點數，它不在 x86 的任何
# 運算集合裡；殘差 add 也留在浮點數：每個 add 的輸入都是從 linear 經過一個 eval 模式的
# dropout node 才來的（這一層的 ``dropout1`` 與 ``dropout2`` ：在 eval 模式下什麼也不做，但
# non-strict 匯出留下了 node），而 x86 只在 add 緊接在它的 linear 之後時才把它融合進去。
# 報告的摘要點名了這些 dropout。

for dynamic in (False, True):
    config = get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    ours_report = coverage(export_module(ours, x), X86InductorQuantizer().set_global(config))
    print(ours_report.summary())
    assert ours_report.counts()["linear"] == (12, 12), "12 個 linear 全是 int8"
    adds = [ours_report[name] for name in ours_report.names(kind="add")]
    assert all("eval-mode dropout" in add.reason for add in adds), "每個 add 前面都有 dropout"

# %%
# 從 convert 之後的圖獨立再數一次：每個 linear 都經由 ``dequantize_per_channel`` 讀取 int8
# weight；靜態模型的活化值經由 ``dequantize_per_tensor.default`` 而來（scale 在校準時
# 固定），動態模型的則經由 ``dequantize_per_tensor.tensor`` （scale 由
# ``choose_qparams`` 逐批次計算）。

static, dynamic = quantized(ours), quantized(ours, dynamic=True)
for label, gm, dq in (
    ("靜態", static, qd.dequantize_per_tensor.default),
    ("動態", dynamic, qd.dequantize_per_tensor.tensor),
):
    linears = gm.graph.find_nodes(op="call_function", target=aten.linear.default)
    print(f"{label}：{int8_linears(gm)} 個 linear 讀取 int8 weight（共 {len(linears)} 個）")
    assert int8_linears(gm) == len(linears) == 12
    assert all(n.args[0].target == dq for n in linears), f"{label} 的活化值是 int8"

# %%
# 我們的第一層，靜態量化：六個 linear，每個都接在 dequantize node 之後。

ours_first = quantized(ours.layers[0])
draw(ours_first, highlight=attention_linears(ours_first), title="Attention：int8 的 q、k、v、out")
assert len(attention_linears(ours_first)) == 4 and int8_linears(ours_first) == 6

# %%
# 步驟 5 — 讓它們賽跑，再讀 kernel
# --------------------------------
# ``race`` （M03-3）以計時用的執行緒數、開啟 freezing 編譯每個模型，並讀出各自執行了哪些 kernel。
# 兩個 int8 encoder 的十二個 linear 都執行 oneDNN 的 int8 linear，沒有任何浮點 linear
# kernel（ ``aten::addmm`` 、MKL 或 oneDNN 的浮點 linear）。時間是這台機器的，只印出、從不
# assert。有 VNNI 時 int8 的幾列比較快，但不到 M03-3 那個 4× 上限，因為 attention、layer
# norm，以及量化活化值這一步，仍以浮點數計算；沒有 VNNI（AVX2）時，oneDNN 的 int8 linear
# 可能輸給 fp32（M03-3）。表格下方的 CPU 說明這一頁是在哪一種情況下建置的。

timings = race({"fp32": export_module(ours, x), "int8 靜態": static, "int8 動態": dynamic}, x)
print(timings.table())
for label in ("int8 靜態", "int8 動態"):
    ran = timings.kernels[label]
    assert ran.int8["onednn::qlinear_pointwise"] == 12, f"{label}：執行了 12 個 int8 linear"
    assert not ran.float, f"{label}：沒有留下浮點 linear"

# %%
# 小結
# ----
# ==========================================  ==============================================
# encoder                                     int8 linear（x86）
# ==========================================  ==============================================
# 原樣（ ``nn.MultiheadAttention`` ）         8 個中 4 個：attention 的是 ``F.linear`` 呼叫
# 換上 ``Attention`` ，靜態                   12 個中 12 個，weight 與活化值都是 int8
# 換上 ``Attention`` ，動態                   12 個中 12 個，活化值逐批次決定 scale
# 浮點輸出，我們的與原本的                    相差在 1e-5 內（快速路徑），有 mask 也一樣
# 開啟 freezing 編譯                          只有 oneDNN int8 linear，沒有浮點 linear
# ==========================================  ==============================================
#
# 可直接替換的模組需要 MHA 的呼叫方式、它的回傳值 ``(output, weights)`` ，以及這一層與
# encoder 會讀取的屬性： ``batch_first`` 決定維度順序， ``_qkv_same_embed_dim`` 與
# ``in_proj_weight`` ／ ``in_proj_bias`` 關閉快速路徑（練習 3 是另一個開關：hook）。
#
# 練習
# ----
# 1. 只替換第一層的 attention。預測會有幾個 linear，其中幾個是 int8。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          half = copy.deepcopy(encoder)
#          half.layers[0].self_attn = Attention.from_mha(half.layers[0].self_attn)
#          half.use_nested_tensor = False
#          counts = coverage(export_module(half, x), x86_quantizer()).counts()
#          assert counts["linear"] == (8, 10), "第一層 6 個，第二層 4 個中的 2 個"
#
# 2. 把 ``batch_first`` 改成 ``False`` （輸入是 ``(長度, 批次, 維度)`` ）。預測替換後的
#    encoder 是否仍與原本的相同。
#
#    .. dropdown:: 解答
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
# 3. 在原本每一層的 ``self_attn`` （仍是 ``nn.MultiheadAttention`` ）註冊一個 forward
#    hook。預測在 eval 模式、不計算梯度時，快速路徑會被呼叫幾次。
#
#    .. dropdown:: 解答
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
#          assert fused.call_count == 0, "這一層裡任何地方有 hook，快速路徑就關閉"
#
# 延伸閱讀
# --------
# - `torch.nn.TransformerEncoderLayer
#   <https://docs.pytorch.org/docs/stable/generated/torch.nn.TransformerEncoderLayer.html>`_
# - `torch/nn/modules/transformer.py
#   <https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/transformer.py>`_
# - `torch.nn.functional.scaled_dot_product_attention
#   <https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html>`_
#
# 下一課
# ------
# :ref:`sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py` 讓同一張圖走過這台機器上的
# 每個 quantizer。 :ref:`疑難排解 <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`
# 的條目從你自己的模型可能引發的錯誤出發。
