"""
M05-1 quantizer 在 attention 裡看見什麼
========================================

用 ``X86InductorQuantizer`` 的預設設定量化一個小型 Vision Transformer（ViT），有一半會留在浮點數。
用 ``nn.MultiheadAttention`` 寫的版本，attention 的投影沒有一個拿到 int8 weight；照現代程式碼
的寫法——分開的 q／k／v ``nn.Linear`` 加上 ``F.scaled_dot_product_attention``——投影全部
都是 int8，但 attention 內部的兩個矩陣乘法依然是浮點數。本課從圖和 quantizer 的原始碼讀出
原因，讓投影也量化，再跟著圖走進 lowering：eager lowering 不替任何 3-D linear 產生 int8
運算，開啟 freezing 的 ``torch.compile`` 則每一個都有；在帶有 class token 的圖上，課程
自己的 lowering 仍然與 torchao 的逐位元相同。

**你會學到**

- ``X86InductorQuantizer`` 怎麼找到它要量化的 linear，以及為什麼 ``nn.MultiheadAttention``
  把它的投影藏了起來
- quantizer 怎麼處理 ``matmul`` 與 ``scaled_dot_product_attention``
- 為什麼 eager lowering 把 3-D linear 留在浮點數，而開啟 freezing 的 ``torch.compile`` 不會

**先備知識**： :ref:`M00-3 · 找出模式
<sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`、 :ref:`M03-1 · lowering 之後的圖
<sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`、 :ref:`M03-2 · 親手做 lowering
<sphx_glr_lessons_m03_lowering_m03_2_lowering_by_hand.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# ``vit_mha`` 與 ``vit_sdpa`` 是同一個 ViT 式分類器，辨識 M04 的 8×8 手寫數字
# （ ``common.models.DigitsViT`` ）：2×2 的 patch embedding（一個 conv）、一個 class token、
# 位置嵌入、兩個 pre-norm encoder block，以及一個 linear 輸出層。兩者只有 attention 不同：
# 一個用 ``nn.MultiheadAttention`` ，另一個用 q／k／v ``nn.Linear`` 加上 SDPA。這裡用隨機
# weight 就夠了；影像取自手寫數字的校準集。

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
# 輔助函式： ``quantized`` 對模型跑一次 PT2E 流程（用 200 張校準影像校準）；
# ``linears`` 列出圖裡每個 linear node、它來自哪個模組（ ``meta["nn_module_stack"]``
# 最內層的那一項），以及它的 weight 是不是 int8； ``quantized_block`` 在隨機 token 上單獨
# 量化一個 encoder block，供畫圖使用，圖中由 ``in_attention`` 挑出屬於 attention 的 node。


def quantized(model, quantizer=None):
    prepared = prepare_pt2e(export_digits_model(model), quantizer or x86_quantizer())
    with torch.no_grad():
        prepared(images)
    return convert_pt2e(prepared)


def linears(gm) -> list[tuple[str, str, str, bool]]:
    """每個 linear node 的（node、模組路徑、模組類別、weight 是否為 int8）。"""
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
    """``name`` 的第一個 encoder block，單獨量化（小到可以畫出來）。"""
    prepared = prepare_pt2e(export_module(get_model(name).blocks[0], tokens), x86_quantizer())
    prepared(*tokens)
    return convert_pt2e(prepared)


def show(rows):
    for name, path, cls, int8 in rows:
        print(f"{name:10} {path:22} {cls:19} {'int8' if int8 else 'float'}")


# %%
# 步驟 1 — 量化兩種寫法，看哪些 linear 拿到 int8
# ----------------------------------------------
# 用 ``nn.MultiheadAttention`` 時，每個 block 的兩個注意力投影 linear——打包在一起的
# q／k／v 投影，以及輸出投影——都保留浮點 weight；MLP 的 ``fc1`` ／ ``fc2`` 和輸出層是 int8。
# 用分開的 linear 時，13 個 linear 全都是 int8。

mha = quantized(get_model("vit_mha"))
sdpa = quantized(get_model("vit_sdpa"))
print("nn.MultiheadAttention：")
show(linears(mha))
float_mha = [(path, cls) for _, path, cls, int8 in linears(mha) if not int8]
assert float_mha == [
    ("blocks.0.attn", "MultiheadAttention"),
    ("blocks.0.attn", "MultiheadAttention"),
    ("blocks.1.attn", "MultiheadAttention"),
    ("blocks.1.attn", "MultiheadAttention"),
]
assert sum(int8 for *_, int8 in linears(mha)) == 5, "兩個 block 的 fc1、fc2 與輸出層"

# %%
# 另一種寫法：所有 linear，包括 attention 的投影，都讀取 int8 weight。

print("q/k/v nn.Linear + SDPA：")
show(linears(sdpa))
assert all(int8 for *_, int8 in linears(sdpa)) and len(linears(sdpa)) == 13

# %%
# 下面兩張圖是兩種寫法各自的第一個 encoder block，單獨量化，attention 部分以醒目標示。
# 第一張圖裡，attention 的 ``linear`` node 讀取浮點的 ``‹in_proj_weight›`` ；第二張圖裡，
# 每個投影都讀取 dequantize 過的 int8 weight。兩張圖中的 ``scaled_dot_product_attention``
# 都讀取浮點的 q、k、v：它前面沒有 quantize，後面也沒有。

mha_block, sdpa_block = quantized_block("vit_mha"), quantized_block("vit_sdpa")
attention = [n.name for n in mha_block.graph.nodes if in_attention(n)]
draw(mha_block, highlight=attention, title="nn.MultiheadAttention：attention 留在浮點數")

# %%

attention = [n.name for n in sdpa_block.graph.nodes if in_attention(n)]
draw(sdpa_block, highlight=attention, title="q／k／v linear + SDPA：int8 投影")
sdpa_node = next(
    iter(
        sdpa.graph.find_nodes(op="call_function", target=aten.scaled_dot_product_attention.default)
    )
)
assert all(arg.target == aten.transpose.int for arg in sdpa_node.args[:3]), "浮點的 q、k、v"
assert all(user.target != qd.quantize_per_tensor.default for user in sdpa_node.users)

# %%
# 步驟 2 — 原因：quantizer 怎麼找到 linear
# ----------------------------------------
# ``X86InductorQuantizer._annotate_linear`` 不直接看 ``aten.linear`` node：它呼叫
# ``get_source_partitions(graph, [nn.Linear, F.linear])`` ，找出來自 ``nn.Linear`` 模組
# 或 ``F.linear`` 呼叫的 node。non-strict 匯出不記錄 ``source_fn_stack`` ，所以
# ``get_source_partitions`` 退而查看 ``nn_module_stack`` 最內層的模組，只有當那個模組
# 的類別是 ``nn.Linear`` 或它的子類別時才保留這個 node。 ``nn.MultiheadAttention`` 把 q／k／v
# 的 weight 放在同一個參數 ``in_proj_weight`` 裡，而且從不呼叫它的 ``out_proj`` 模組：
# ``F.multi_head_attention_forward`` 讀取 ``out_proj.weight`` ，自己呼叫 ``F.linear`` 。
# 兩個 linear 都記錄在 ``MultiheadAttention`` 裡，而它不是 ``nn.Linear`` ，所以 quantizer
# 根本看不到它們。

found = {
    label: {
        p.nodes[-1].name
        for parts in get_source_partitions(gm.graph, [nn.Linear, nn.functional.linear]).values()
        for p in parts
    }
    for label, gm in (("vit_mha", mha), ("vit_sdpa", sdpa))
}
print({label: len(nodes) for label, nodes in found.items()}, "← 各找到幾個 linear")
assert len(found["vit_mha"]) == 5 and len(found["vit_sdpa"]) == 13
in_proj = next(n for n in mha.graph.nodes if n.name == "linear")
print(in_proj.format_node(), "\n  來自", list(in_proj.meta["nn_module_stack"].values())[-1])
assert in_proj.args[1].target == "blocks.0.attn.in_proj_weight", "一個打包在一起的浮點 weight"
assert "source_fn_stack" not in in_proj.meta, "non-strict 匯出：沒有 source_fn_stack"

# %%
# ``out_proj`` 「是」 ``nn.Linear`` （子類別 ``NonDynamicallyQuantizableLinear`` ），但這個
# 模組從未被呼叫，所以沒有任何 node 記錄在它裡面。

assert issubclass(nn.modules.linear.NonDynamicallyQuantizableLinear, nn.Linear)
modules = {path for n in mha.graph.nodes for path, _ in n.meta.get("nn_module_stack", {}).values()}
assert "blocks.0.attn.out_proj" not in modules and "blocks.0.attn" in modules

# %%
# 那 attention 內部的兩個乘積，q·kᵀ 與 v 的加權和呢？quantizer 的配方有兩組運算。
# ``default_quantizable_ops`` 在 ``set_global`` 之下就會被標註； ``aten.matmul`` 只在較大
# 的 ``quantizable_ops`` 裡，要依函式或模組名稱指定時才會標註（M05-3）。
# ``scaled_dot_product_attention`` 兩組都不在：不論設定為何，這個 quantizer 都不會標註 SDPA。
# （torchao 0.18 在 ``torchao.prototype.inductor`` 裡有 x86 的 int8 SDPA 融合原型：那是另一條
# 路，不屬於這個 quantizer。）

ops = x86_inductor_quantizer
print(
    f"matmul 預設量化：{aten.matmul.default in ops.default_quantizable_ops}"
    f"｜指定時：{aten.matmul.default in ops.quantizable_ops}"
)
assert aten.matmul.default not in ops.default_quantizable_ops
assert aten.matmul.default in ops.quantizable_ops
assert aten.scaled_dot_product_attention.default not in ops.quantizable_ops

# %%
# 步驟 3 — 讓投影也量化
# ----------------------
# quantizer 比對的是模組，那就給它模組：把每個 ``nn.MultiheadAttention`` 換成一個
# ``SelfAttention`` ，裡面是分開的 q／k／v linear，weight 相同（把打包的 ``in_proj_weight``
# 切成三份）。浮點模型算出的函式不變；現在 13 個 linear 全都是 int8。


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
print(Counter(int8 for *_, int8 in linears(split_q)), "（True：int8 weight）")
assert all(int8 for *_, int8 in linears(split_q)) and len(linears(split_q)) == 13

# %%
# 步驟 4 — eager lowering：3-D linear 沒有 int8 運算
# --------------------------------------------------
# 對 SDPA 模型執行 ``lower_pt2e_quantized_to_x86`` （M03-1），只得到兩個 oneDNN 運算：
# patch embedding 的 conv，以及輸出層——唯一輸入是 2-D 的 linear（class token 那一列）。
# block 裡的十二個 linear 讀取 ``(batch, 17, 32)`` 張量；strict 重新匯出把每一個記成
# ``view → addmm → view`` ，仍然夾在 dequantize 與 quantize 之間。

lowered = lower_pt2e_quantized_to_x86(sdpa, x)
lowered_ops = Counter(str(n.target) for n in lowered.graph.nodes if n.op == "call_function")
print({op: k for op, k in lowered_ops.items() if "onednn" in op or "addmm" in op})
assert lowered_ops["onednn.qconv_pointwise.default"] == 1
assert lowered_ops["onednn.qlinear_pointwise.default"] == 1, "只有輸出層"
addmms = lowered.graph.find_nodes(op="call_function", target=aten.addmm.default)
assert len(addmms) == 12
assert all(a.args[1].target == aten.view.default for a in addmms), "view → addmm"
assert all(a.args[1].args[0].target == qd.dequantize_per_tensor.default for a in addmms)

# %%
# 原因：inductor 針對超過二維輸入的 int8 linear 模式，是以包在 ``addmm`` 外面的
# ``aten.reshape`` 寫成的（ ``torch/_inductor/fx_passes/quantization.py`` 裡的
# ``_may_generate_pattern_with_reshape`` ），而重新匯出寫下的是 ``aten.view`` 。
# ``torch.compile`` 在 freezing 的各個 pass 之前，會先對圖執行 ``view_to_reshape``
# （ ``torch/_inductor/freezing.py`` ）；torchao 的 eager lowering 則沒有。這和 M03-1 裡讓
# ``small_cnn`` lowering 後的圖執行失敗的，是同一個 ``view`` 。
#
# 步驟 5 — 開啟 freezing 的 torch.compile：每個 linear 都預先打包
# ----------------------------------------------------------------
# 開啟 freezing（M03-3）編譯 SDPA 模型量化後的第一個 block（來自步驟 1），再數一數 inductor 的
# int8 模式做了什麼：block 的六個 linear——q、k、v、out、fc1、fc2——全都為 oneDNN 預先打包。
# 編譯要花好幾秒，所以用一個 block 代表整個模型；SDPA 本身仍是浮點 kernel。（只用一個編譯
# 執行緒：啟動一整組編譯 worker 的時間，比建置這些 kernel 還久。）

with torch.no_grad():
    simulated_out = sdpa_block(*tokens)
torch._inductor.config.freezing = True  # 設在整個行程：重新編譯也保有它（m99_3）
with torch._inductor.config.patch(compile_threads=1), torch.no_grad():
    with warnings.catch_warnings():  # inductor 自己發出的「To copy construct from a tensor」警告
        warnings.filterwarnings("ignore", message="To copy construct from a tensor")
        compiled_block = torch.compile(sdpa_block, dynamic=False)
        compiled_out = compiled_block(*tokens).clone()  # 第二次呼叫會回傳同一塊記憶體：留一份副本
    ran = kernels_run(compiled_block, tokens)
print(ran.summary)
assert sum(ran.int8.values()) == 6 and not ran.float, "q, k, v, out, fc1, fc2"

# %%
# 編譯後的 block 執行真正的 int8 kernel。有 VNNI 時，它的輸出和模擬的 block 只差在捨入；
# 沒有 VNNI 時，oneDNN 以 16 位元把兩個 uint8 × int8 乘積相加，可能飽和（M03-1），兩者的差距
# 就比較大。下面印出的 CPU 說明這一頁是在哪一種情況下建置的。

noise = (compiled_out - simulated_out).pow(2).mean()
sqnr = 10 * torch.log10(simulated_out.pow(2).mean() / noise).item()
cpu = describe()
print(cpu.verdict)
print(f"編譯後的 int8 對 q/dq block：SQNR {sqnr:.1f} dB")
assert sqnr > 20, "同樣的 int8 計算"
if cpu.vnni:
    assert sqnr > 60, "有 VNNI 時：最多只是捨入不同"

# %%
# 步驟 6 — 只讀常數的 class token
# --------------------------------
# 這張圖裡有兩樣東西對 lowering 來說是新的。class token 是 ``expand(cls_token, [8, -1, -1])`` ，
# 一個只讀取常數的運算：torchao 的 lowering（inductor 的常數折疊）把它執行一次，結果存成常數
# ``_frozen_paramN`` ，改由 ``cat`` 讀取。位置嵌入是 ``cat`` 之後加上一個常數的 ``add`` ；
# 沒有任何折疊適用於它，所以它留了下來。

(cat,) = lowered.graph.find_nodes(op="call_function", target=aten.cat.default)
token = cat.args[0][0]
print(f"torchao：cat 讀取 {token.op} {token.target} {tuple(getattr(lowered, token.target).shape)}")
assert token.op == "get_attr" and "aten.expand.default" not in lowered_ops
assert torch.equal(getattr(lowered, token.target), sdpa.cls_token.expand(8, -1, -1))
(pos_add,) = cat.users
assert pos_add.target == aten.add.Tensor and pos_add.args[1].target == "pos_embed"

# %%
# ``common.lowering`` （M03-2）在 ``fold_constants`` 裡做同樣的事，又是一個 M00 的改圖動作：
# 用 node 的常數執行它，把結果登記成 buffer，再放一個 ``get_attr`` 取代它。有了它，
# ``common.lowering.lower`` 在這個模型上給出與 torchao 逐位元相同的圖：相同的運算、相同的
# 常數、相等的輸出。

mine = lowering.lower(sdpa, x)
mine_ops = Counter(str(n.target) for n in mine.graph.nodes if n.op == "call_function")
assert mine_ops == lowered_ops, "相同的運算"
assert mine.state_dict().keys() == lowered.state_dict().keys(), "相同的常數"
for key, value in lowered.state_dict().items():
    ours = mine.state_dict()[key]
    if value.layout == torch._mkldnn:  # 預先打包的 weight：把數值讀回來
        ours, value = ours.to_dense(), value.to_dense()
    assert torch.equal(ours, value), f"{key} 不同"
assert torch.equal(mine(*x), lowered(*x)), "輸出相等"

# %%
# 小結
# ----
# ===============================================  ==============================================
# 圖中的元素                                       是否 int8？
# ===============================================  ==============================================
# ``nn.MultiheadAttention`` 的 in_proj、out_proj   否：在 ``MultiheadAttention`` 裡，不是 Linear
# q／k／v／out ``nn.Linear``                       是：由 ``get_source_partitions`` 找到
# ``matmul``                                       只在指定時（ ``quantizable_ops`` ）
# ``scaled_dot_product_attention``                 永遠不會
# 3-D linear，eager lowering                       沒有 oneDNN 運算：是 ``view`` 不是 ``reshape``
# 3-D linear，開 freezing 的 ``torch.compile``     預先打包：先執行 ``view_to_reshape``
# class token 的 ``expand``                        兩種 lowering 都把它折疊成常數
# ===============================================  ==============================================
#
# 練習
# ----
# 1. ``set_module_type_qconfig(nn.MultiheadAttention, config)`` 要求每個
#    ``nn.MultiheadAttention`` 都用 int8。預測 ``vit_mha`` 有幾個 linear 會拿到 int8 weight。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config()
#          by_type = x86_inductor_quantizer.X86InductorQuantizer().set_global(config)
#          with warnings.catch_warnings(record=True) as caught:
#              warnings.simplefilter("always")
#              by_type.set_module_type_qconfig(nn.MultiheadAttention, config)
#          assert any("Unable to customize" in str(w.message) for w in caught), (
#              "torchao 警告它做不到"
#          )
#          rows = linears(quantized(get_model("vit_mha"), by_type))
#          assert sum(int8 for *_, int8 in rows) == 5, "仍然是 5：分割沒有改變"
#
# 2. 比照 ``torch.compile`` ，先替 torchao 的 lowering 把圖準備好：照它的方式重新匯出
#    （ ``lowering.reexport`` ），把 view 改成 reshape（ ``lowering.reshape_views`` ），再執行
#    inductor 的 ``freezing_passes`` 。預測會有幾個 ``qlinear_pointwise`` 運算。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from torch._inductor.fx_passes.freezing_patterns import freezing_passes
#
#          graph = lowering.reexport(sdpa, x)
#          lowering.reshape_views(graph)
#          freezing_passes(graph, x)
#          qlinears = [n for n in graph.graph.nodes if "qlinear_pointwise" in str(n.target)]
#          assert len(qlinears) == 13, "每個 linear，包括十二個 3-D 的"
#
# 3. 用同樣的方式編譯 ``mha_block`` 。預測預先打包的數量。
#
#    .. dropdown:: 解答
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
# 延伸閱讀
# --------
# - `X86InductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `torch.nn.MultiheadAttention
#   <https://docs.pytorch.org/docs/stable/generated/torch.nn.MultiheadAttention.html>`_
#
# 下一課
# ------
# :ref:`M05-2 · 靜態與動態 int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>` 對訓練好的 ViT，改成每個
# 批次量化一次活化值，而不是只量化一次。
