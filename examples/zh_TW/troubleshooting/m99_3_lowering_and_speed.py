"""
疑難排解：lowering 與速度
=========================

``convert_pt2e`` 之後：比浮點模型還慢的 int8 模型、一執行就失敗的 lowering 後的圖，以及
attention 仍是浮點數的 Transformer。每個條目的標題是錯誤訊息的第一行原文（或讀者口中的症狀），
在本站的環境（torch 2.13、torchao 0.18）上重現它，指出原因，以 assert 驗證修正方法，並連到
解釋它的那一課。

**先備知識**：無；每個條目都連到解釋它的那一課。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 和 lowering 的幾課一樣，用 ``X86InductorQuantizer`` 量化 ``small_cnn`` 。

import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor import config as inductor_config

from common.expect import expect_error
from common.lowering import reshape_views
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

x = example_inputs(8)
floating = get_model("small_cnn")


def quantize(model, args) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_module(model, args), x86_quantizer())
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


simulated = quantize(floating, x)

# %%
# int8 比浮點數還慢
# -----------------
# ``convert_pt2e`` 回傳的模型比原本的浮點模型還慢。計時結果（單一執行緒、交錯輪流量測；
# 只印出，從不 assert）：

print(compare_speed({"fp32": floating, "int8 q/dq": simulated}, x, rounds=20).table())

# %%
# **原因**，在圖上看：圖裡沒有任何運算用 int8 計算。每個 conv 與 linear 仍然用浮點數執行，
# 夾在只是「模擬」int8 的 dequantize 與 quantize 之間（標示處）——比浮點模型多做了工。

floats = [
    n.name
    for n in simulated.graph.nodes
    if n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
]
draw(simulated, highlight=floats, title="convert_pt2e 之後：夾在 q/dq 之間的浮點 conv 與 linear")
assert len(floats) == 2, "conv 與 linear 仍然用浮點數計算"

# %%
# **修正**：把圖下放（lowering）到 int8 kernel。``torch.compile`` 只有在
# ``torch._inductor.config.freezing = True`` 時才會這麼做，而它預設是關閉的（這就是陷阱：
# 沒有它，編譯後的 int8 模型仍然只是模擬）；不編譯時，用 ``lower_pt2e_quantized_to_x86``
# （還需要下一個條目的修正）。int8 之後是否比 fp32 快，取決於模型大小與 CPU；量測見
# :ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。

assert inductor_config.freezing is False, "除非你打開，freezing 是關閉的"
lowered = lower_pt2e_quantized_to_x86(simulated, x)
reshape_views(lowered)
int8_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
print(f"int8 kernel：{int8_ops}")
assert len(int8_ops) == 2, "conv 與 linear 現在以 oneDNN 的 int8 kernel 執行"
print(
    compare_speed(
        {"fp32": floating, "int8 q/dq": simulated, "int8 lowered": lowered}, x, rounds=20
    ).table()
)

# %%
# RuntimeError: view size is not compatible with input tensor\'s size and stride
# ------------------------------------------------------------------------------
# 以 ``lower_pt2e_quantized_to_x86`` lowering 的圖，若 int8 conv 之後接著 ``flatten`` ，
# 不編譯直接執行就會失敗（torchao 0.18）。訊息後半是：「(at least one dimension spans
# across two contiguous subspaces). Use .reshape(...) instead.」

failing = lower_pt2e_quantized_to_x86(simulated, x)
with expect_error(RuntimeError, match="view size is not compatible"):
    failing(*x)

# %%
# **原因**，在圖上看：oneDNN 的 int8 conv 回傳 **channels-last** 的張量（記憶體裡是
# NHWC）；``flatten`` 追蹤成的 ``view`` （標示處）不複製就無法重組 NHWC 張量。
# ``torch.compile`` 自己選擇記憶體排列，不受影響。

views = failing.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default)
draw(failing, highlight=[n.name for n in views], title="int8 conv 之後的 view")
assert len(views) == 1

# %%
# **修正**：把每個 ``view`` 換成只在必要時才複製的 ``reshape``
# （ ``common.lowering.reshape_views`` ）；數值完全相同。說明見
# :ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`。

print(f"改了：{reshape_views(failing)}")
assert torch.equal(failing(*x), lowered(*x)), "修正後的圖能執行，數值也相同"

# %%
# Transformer 的 attention 仍是浮點數
# -----------------------------------
# 以預設的 x86 config 量化 ``nn.TransformerEncoderLayer`` ，只有兩個前饋（feed-forward）
# linear 拿到 int8 weight；attention 的投影仍是浮點數。

tokens = (torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(0)),)
torch.manual_seed(0)
encoder = quantize(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval(), tokens)


def linears(gm) -> dict[str, bool]:
    """每個 linear node：它的 weight 是經過 dequantize（int8），還是維持浮點數？"""
    return {
        n.name: "dequantize" in str(n.args[1].target)
        for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    }


print(f"每個 linear 是否為 int8 weight：{linears(encoder)}")
assert list(linears(encoder).values()) == [False, False, True, True], "attention 的仍是浮點數"

# %%
# **原因**，在圖上看：``nn.MultiheadAttention`` 在自己的 ``forward`` 裡，用打包好的
# ``in_proj_weight`` 呼叫 ``F.linear`` ，``out_proj`` 也是這樣呼叫的：quantizer 找的是
# ``nn.Linear`` 模組，而這些 node 的 ``nn_module_stack`` 裡只有 ``MultiheadAttention`` 。

for node in encoder.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
    print(node.name, "來自", list(node.meta["nn_module_stack"].values())[-1][1])

# %%
# **修正**：每個投影用一個 ``nn.Linear`` ，再用 ``F.scaled_dot_product_attention`` 寫
# attention；四個投影就都拿到 int8 weight。說明見 :ref:`M02-1 · quantizer 在圖上寫了什麼
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`。


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


attention = quantize(Attention().eval(), tokens)
print(f"每個 linear 是否為 int8 weight：{linears(attention)}")
assert all(linears(attention).values()) and len(linears(attention)) == 4

# %%
# 下一頁
# ------
# :ref:`疑難排解：準確度、eval 與 QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`。
