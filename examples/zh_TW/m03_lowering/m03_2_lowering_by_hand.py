"""
M03-2 親手做 lowering
=====================

torchao 用 inductor 的模式比對器（pattern matcher）做 lowering；但其中每一步都只需要 M00-4
的改圖動作。本課親手把 ``small_cnn`` 的 q/dq 圖改寫成 oneDNN 的 int8 運算——比對 conv 周圍的
那組 node、預先打包它的 weight、插入 int8 運算、刪掉舊的 node——最後得到的圖，運算、常數與輸出
都和 ``lower_pt2e_quantized_to_x86`` 的相同：不是很接近，而是完全相同。

**你會學到**

- lowering 的動作：比對、預先打包、替換、融合後置運算、折疊常數
- ``common.lowering.lower`` 做了什麼，又拒絕做什麼
- 當 weight 是不透明的 oneDNN 張量時，如何證明兩個 lowering 相同

**先備知識**：
:ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`、
:ref:`M00-4 · 改圖 <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 4

# %%
# 準備
# ----
# M03-1 量化過的 ``small_cnn`` ； ``reference`` 是 torchao 對它做的 lowering。

import copy

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet, x86_quantizer
from common.viz import draw, draw_diff

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common import lowering

aten, onednn = torch.ops.aten, torch.ops.onednn
x = example_inputs(8)


def quantize(model):
    prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
    calibrate(prepared)
    return convert_pt2e(prepared)


simulated = quantize(get_model("small_cnn"))
reference = lower_pt2e_quantized_to_x86(simulated, x)

# %%
# 步驟 1 — 從 torchao 的起點出發
# ------------------------------
# torchao 先把模型重新匯出（re-export），並拆解「複合」運算，這是它的模式所針對的形式：
# ``conv2d`` 變成 ``aten.convolution`` ， ``linear`` 變成 weight 的 ``permute`` 加上
# ``addmm`` ， ``flatten`` 變成 ``view`` 。 ``lowering.reexport`` 原封不動地做這一步；
# 其餘的由我們自己來。

gm = lowering.reexport(simulated, x)
graph = gm.graph
draw(gm, title="之前：重新匯出的 q/dq 圖")
print(dict(op_counts(gm)))
assert op_counts(gm)["aten.convolution.default"] == 1 and op_counts(gm)["aten.addmm.default"] == 1
assert not op_counts(gm)["aten.linear.default"], "linear 被拆解了"

# %%
# 步驟 2 — conv：比對、預先打包、替換
# ------------------------------------
# 模式是 ``convolution(dequantize(x_uint8), dequantize_per_channel(w_int8))`` 。int8 運算
# 直接讀 ``x_uint8`` ，把 dequantize 的 scale 和 zero point 當成引數；weight 經過
# ``onednn.qconv_prepack`` （目前還是一個 node；步驟 5 才執行它一次）。接著刪掉舊的 node：
# 先刪 conv，因為它還是 dequantize 的使用者時，dequantize 刪不掉。

before = copy.deepcopy(gm)
conv = next(iter(graph.find_nodes(op="call_function", target=aten.convolution.default)))
out = (1.0, 0, torch.float32, "none", [], "")  # 輸出 float32（scale 1、zero point 0），無後置運算
x_dq, w_dq, bias, stride, padding, dilation, _, _, groups = conv.args
qx, x_scale, x_zp = x_dq.args[:3]
qw, w_scale, w_zp = w_dq.args[:3]
with graph.inserting_before(conv):
    packed = graph.call_function(
        onednn.qconv_prepack.default,
        (qw, w_scale, x_scale, x_zp, stride, padding, dilation, groups, qx.meta["val"].shape),
    )
    qconv = graph.call_function(
        onednn.qconv_pointwise.default,
        (qx, x_scale, x_zp, packed, w_scale, w_zp, bias, stride, padding, dilation, groups, *out),
    )
conv.replace_all_uses_with(qconv)
qconv.meta.update(conv.meta)
for node in (conv, x_dq, w_dq):
    graph.erase_node(node)
gm.recompile()
draw_diff(before, gm, title="步驟 2：conv 成為 oneDNN 的 int8 運算")
assert qconv.args[0].target == torch.ops.quantized_decomposed.quantize_per_tensor.default

# %%
# 步驟 3 — linear，同樣的做法
# ---------------------------
# ``addmm(bias, dequantize(x), permute(dequantize_per_channel(w)))`` 變成讀
# ``qlinear_prepack(w)`` 的 ``qlinear_pointwise`` ； ``lowering.prepack_linear`` 就是用
# 步驟 2 的寫法做這件事（程式碼在 ``common/lowering.py`` ）。

addmm = next(iter(graph.find_nodes(op="call_function", target=aten.addmm.default)))
qlinear = lowering.prepack_linear(gm, addmm)
gm.recompile()
print(qlinear.format_node())
assert not graph.find_nodes(op="call_function", target=aten.addmm.default)

# %%
# 步驟 4 — 把後面的運算融合進 int8 運算
# --------------------------------------
# ``qconv → relu → quantize`` 變成一個 ``qconv_pointwise`` ：後置運算 ``relu`` ，以
# quantize 的 scale 輸出 uint8。一樣是替換再刪除，只是對象是三個 node 的鏈。
# ``lowering.fuse_post_ops`` 依 inductor 的順序嘗試它的模式（先 int8 輸出，再浮點數輸出；
# 也包括殘差的 ``add`` ）。

before = copy.deepcopy(gm)
lowering.fuse_post_ops(gm)
(qconv,) = graph.find_nodes(op="call_function", target=onednn.qconv_pointwise.default)
print(qconv.format_node())
assert (qconv.args[13], qconv.args[14]) == (torch.uint8, "relu")
assert not graph.find_nodes(op="call_function", target=aten.relu.default), "relu 被融合進去了"
draw_diff(before, gm, title="步驟 4：relu 與 quantize 融合進 int8 運算")

# %%
# 步驟 5 — 預先打包只執行一次：變成常數
# --------------------------------------
# prepack node 只依賴常數，所以就像 M02-3 折疊 weight 一樣，現在就執行它，把結果存成 buffer
# ``_frozen_paramN`` ，由一個沿用原 node 名稱的 ``get_attr`` 讀取。q/dq 圖的 int8 weight
# 沒有人再讀，就被刪掉了。

lowering.fold_prepacked_weights(gm)
frozen = [n for n in graph.nodes if n.op == "get_attr" and "prepack" in n.name]
draw(gm, highlight=[n.name for n in frozen], title="步驟 5：預先打包的 int8 weight 成為常數")
for node in frozen:
    print(f"{node.name} 讀取 {node.target}：{getattr(gm, node.target).layout}")
assert not any(n.target in lowering.PREPACK for n in graph.nodes)

# %%
# 步驟 6 — 和 torchao 比對
# ------------------------
# 運算相同、常數相同、輸出相同。預先打包的 weight 是不透明的 ``_mkldnn`` 張量
# （ ``torch.equal`` 不接受）： ``to_dense()`` 可以讀出它們的數值。兩張圖執行前都先套用
# M03-1 的 ``reshape_views`` 修正。


def dense(t):
    """預先打包的 weight 是不透明的 oneDNN 張量； ``to_dense`` 把數值讀回來。"""
    return t.to_dense() if t.layout == torch._mkldnn else t


def same_constants(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(dense(sa[k]), dense(sb[k])) for k in sa)


lowering.reshape_views(gm)
lowering.reshape_views(reference)
fresh = example_inputs(8, seed=123)
print(f"運算相同：{op_counts(gm) == op_counts(reference)}｜常數：{sorted(gm.state_dict())}")
assert op_counts(gm) == op_counts(reference), "運算的多重集合相同"
assert same_constants(gm, reference), "常數相同，包括預先打包的 weight"
assert torch.equal(gm(*fresh), reference(*fresh)), "和 lower_pt2e_quantized_to_x86 逐位元相同"

# %%
# 包裝好的版本 ``common.lowering.lower(model, example_inputs)`` 執行步驟 1～5，
# 再加上 Transformer 的圖需要的部分：動態量化的 linear、
# q/k/v 共用的 dequantize 分給每個使用者各一份，以及打包給 MKL 的浮點 linear。
# ``tests/test_lowering.py`` 在模型庫的每個模型、M02 的測試模型，
# 以及沒有參與開發的 Transformer 圖（``nn.TransformerEncoderLayer``、小型 ViT）上，
# 靜態與動態都逐位元地和 torchao 比對。

packaged = lowering.lower(simulated, x)
lowering.reshape_views(packaged)
assert torch.equal(packaged(*fresh), reference(*fresh))

# %%
# 遇到它沒有重現的模式，它會指名該 node 並引發錯誤，而不是回傳一張不同的圖。輸出再加上另一個
# 張量的 linear 就是一例：torchao 把這個加法融合進 ``qlinear_pointwise.binary`` ，這個模組
# 沒有做。


class LinearPlusInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        rows = x.flatten(0, 2)
        return self.fc(rows) + rows


with expect_error(NotImplementedError, match="linear + add"):
    lowering.lower(quantize(LinearPlusInput().eval()), x)

# %%
# 小結
# ----
# lowering 就是五種改圖動作：重新匯出成模式所針對的形式；對每個 conv／linear，在浮點數運算
# 之前插入 prepack 和 int8 運算、把使用者移過去、刪掉浮點數運算和它的 dequantize；把
# ``relu`` ／ ``add`` ／ ``quantize`` 鏈融合進 int8 運算；執行 prepack 一次，把結果留作常數。
# ``common.lowering.lower`` 和 torchao 的 lowering 逐位元相同，不會做的事則明確拒絕。
#
# 練習
# ----
# 1. 改成對 ``conv_bn_relu`` 做 lowering。預測：重新匯出的圖裡，哪些 node 被那一個
#    int8 運算取代（其中有 BatchNorm 嗎？），它的輸出 dtype 又是什麼？再和 torchao 比對。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          q = quantize(get_model("conv_bn_relu"))
#          start = lowering.reexport(q, x)
#          mine, theirs = lowering.lower(q, x), lower_pt2e_quantized_to_x86(q, x)
#          replaced = op_counts(start) - op_counts(mine)
#          print(dict(replaced))
#          assert replaced == {
#                  "dequantize_per_tensor.default": 1,
#                  "dequantize_per_channel.default": 1,
#                  "aten.convolution.default": 1,
#                  "aten.relu.default": 1,
#          }, "dq(x)、dq(w)、conv 和 relu；BatchNorm 已在 prepare 時折疊掉"
#          assert op_counts(mine) - op_counts(start) == {"onednn.qconv_pointwise.default": 1}
#          (op,) = [n for n in mine.graph.nodes if "onednn" in str(n.target)]
#          assert op.args[13] == torch.float32 and op.args[14] == "relu", (
#              "relu 已融合；沒有 quantize 讀它的輸出：float32"
#          )
#          assert op_counts(mine) == op_counts(theirs) and torch.equal(mine(*fresh), theirs(*fresh))
#
# 2. 在一份新的副本上跳過步驟 4 （``fuse_post_ops``）。預測：這張圖還是 torchao 的圖嗎？
#    conv 的 uint8 輸出現在和 torchao 的最多差幾格？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          unfused = lowering.reexport(simulated, x)
#          for node in reversed(list(unfused.graph.nodes)):
#              if node.target == aten.convolution.default:
#                  lowering.prepack_conv(unfused, node)
#              elif node.target == aten.addmm.default:
#                  lowering.prepack_linear(unfused, node)
#          lowering.fold_prepacked_weights(unfused)
#          lowering.reshape_views(unfused)
#          unfused_ops = op_counts(unfused)
#          assert unfused_ops["aten.relu.default"] == 1 and unfused_ops != op_counts(reference), (
#              "relu 和一個 quantize 回來了：不是 torchao 的圖"
#          )
#
#
#          def values(gm):
#              """每個 node 在 ``fresh`` 上的輸出，以 node 名稱為鍵。"""
#              run = torch.fx.Interpreter(gm, garbage_collect_values=False)
#              run.run(*fresh)
#              return {node.name: value for node, value in run.env.items()}
#
#
#          quantize_op = torch.ops.quantized_decomposed.quantize_per_tensor.default
#          quantizes = unfused.graph.find_nodes(op="call_function", target=quantize_op)
#          (requantize,) = [n for n in quantizes if n.args[0].target == aten.relu.default]
#          (fused,) = [n for n in reference.graph.nodes if n.target == lowering.QCONV]
#          ours, theirs = values(unfused)[requantize.name], values(reference)[fused.name]
#          assert ours.dtype == theirs.dtype == torch.uint8, "兩者都是 conv 的 uint8 輸出"
#          steps = (ours.int() - theirs.int()).abs().max().item()
#          print(f"{requantize.name} 與 torchao 的 {fused.name}：最多差 {steps} 格")
#          # int32 加總相同；原本由 oneDNN 捨入的值，現在改由 quantize_per_tensor 捨入，
#          # 剛好落在半格上的值可能偏向另一邊。
#          assert steps <= 1, "只差在捨入：最多 1 格"
#
# 延伸閱讀
# --------
# - `torch.fx：改寫圖（PyTorch） <https://docs.pytorch.org/docs/stable/fx.html>`_
# - `透過 Inductor 使用 x86 後端的 PT2E 量化（torchao）
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
#
# 下一課
# ------
# :ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`
# 量測 lowering 帶來了什麼。
