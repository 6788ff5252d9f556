"""
M00-4 改圖：PT2E 會用到的 torch.fx 圖操作
==========================================

前三課只「讀」圖；PT2E 的兩個步驟卻都在「改」圖：
``prepare_pt2e`` 在圖裡插入 observer，
``convert_pt2e`` 再把 observer 換成 quantize／dequantize node，並事先把 weight 量化成 int8。
本課在一個 conv → relu 的小圖上，把這些動作拆成六個步驟，
每一步都畫出圖、印出證據，並用 ``assert`` 驗證。

**你會學到**

- 在某個 node 後面插入新 node，並把下游改接過去（M02-2 插入 observer 的做法）
- 把 ``call_module`` 換成 ``call_function``、把張量常數放進圖裡（M02-3 convert 的做法）
- 改完圖之後為什麼一定要 ``recompile``、``eliminate_dead_code`` 會留下什麼，以及怎麼用
  ``lint`` 檢查

**先備知識**：M00-1 到 M00-3 三課，
即 :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`、
:ref:`M00-2 · 拆解一個 node <sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>`、
:ref:`M00-3 · 找出模式 <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`；
或〈:ref:`FX Graph 與 Node 基礎 <fx-basics>`〉一文。

.. note::
   六個步驟都原地修改同一個 ``gm``。在 Jupyter 筆記本裡請由上而下依序執行；
   跳著執行或重跑某個儲存格，圖就會和說明對不上。要重來，就重新啟動 kernel，從頭執行。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 4

# %%
# 準備
# ----
# ``export_module`` 就是 ``torch.export.export(model, args).module()``。
# ``base`` 留下原始輸出，後面每一步都拿它來比對。

import copy

import torch

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet
from common.viz import draw, draw_diff

quiet()

x = example_inputs(4)[0]
gm = export_module(get_model("conv_relu"), (x,))
with torch.no_grad():
    base = gm(x).clone()
graph = gm.graph
nodes = {node.name: node for node in graph.nodes}
relu = nodes["relu"]
draw(gm, title="改圖之前的 gm")

# %%
# 新的 ``call_module`` node 要呼叫的就是 ``Scale``：它把輸入乘上 ``k``，效果在輸出上一看就知道。


class Scale(torch.nn.Module):
    """把輸入乘上 k 的小模組，只是為了有一個看得出效果的 call_module 目標。"""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


# %%
# 改圖時，每個 node 都有兩個方向要顧：``args`` 是它讀取的上游，``users`` 是讀取它的下游。

print(f"relu.args  = {relu.args}    （上游：relu 讀誰）")
print(f"relu.users = {list(relu.users)}    （下游：誰讀 relu）")
assert relu.args == (nodes["conv2d"],), "relu 讀的是 conv2d"
assert list(relu.users) == [nodes["output"]], "只有 output 讀 relu"

# %%
# 步驟 1 — 插入新 node
# --------------------
# ``call_module`` 要呼叫的模組，必須先用 ``add_submodule`` 掛到 GraphModule 上。
# ``graph.inserting_after(relu)`` 設定插入點：在這個區塊裡建立的 node 會排在 relu 後面。

before = copy.deepcopy(gm)
gm.add_submodule("scale_out", Scale(2.0))
with graph.inserting_after(relu):
    scale = graph.call_module("scale_out", (relu,))
draw_diff(before, gm, title="步驟 1：新增 scale_out(relu)")

# %%
# 新 node 讀 relu，可是還沒有人讀它：``output`` 仍然接在 relu 後面。
# 建立 node 並不會把它接進資料流，接線是下一步的事。

print(f"scale.args  = {scale.args}")
print(f"scale.users = {list(scale.users)}")
assert scale.args == (relu,) and not scale.users, "scale_out 已建立，但還沒有下游"

# %%
# 步驟 2 — 把下游改接到新 node
# ----------------------------
# 直覺的寫法是 ``relu.replace_all_uses_with(scale)``。
# 先在副本 ``gm_bad`` 上試，看看會出什麼事。

gm_bad = copy.deepcopy(gm)
relu_bad = next(n for n in gm_bad.graph.nodes if n.name == "relu")
scale_bad = next(n for n in gm_bad.graph.nodes if n.name == "scale_out")
relu_bad.replace_all_uses_with(scale_bad)
draw_diff(gm, gm_bad, title="錯誤示範：少了 delete_user_cb")

# %%
# scale_out 變成讀它自己（圖上那個繞回自己的箭頭），relu 反而沒有下游了。
# 原因是 scale_out 本身也是 relu 的使用者，而 ``replace_all_uses_with`` 會改掉每一個使用者，
# 連它自己也不例外。``lint`` 會抓到這種先使用、後定義的圖。

print(f"gm_bad 的 scale_out.args = {scale_bad.args}")
assert scale_bad.args == (scale_bad,), "scale_out 讀到了自己：形成自我迴圈"
with expect_error(RuntimeError, match="used before it has been defined"):
    gm_bad.graph.lint()

# %%
# 正確的做法是用 ``delete_user_cb`` 把新 node 自己排除在外：

before = copy.deepcopy(gm)
relu.replace_all_uses_with(scale, delete_user_cb=lambda user: user is not scale)
draw_diff(before, gm, title="步驟 2：output 改讀 scale_out")

# %%
# 這就是「在 A 後面插入 B」的標準寫法：B 讀 A，其他原本讀 A 的 node 都改讀 B。
# ``prepare_pt2e`` 插入 observer 用的正是這一招。

print(f"relu.users = {list(relu.users)}    scale.args = {scale.args}")
assert list(relu.users) == [scale] and scale.args == (relu,), "relu 只剩 scale_out 一個使用者"
assert list(scale.users) == [nodes["output"]], "output 現在讀 scale_out"
graph.lint()

# %%
# 步驟 3 — recompile
# ------------------
# 圖已經改好了，``gm(x)`` 的結果變了嗎？
# GraphModule 的 ``forward`` 是從圖產生出來的 Python 程式碼，改圖並不會自動重新產生它。

with torch.no_grad():
    unchanged_before = torch.equal(gm(x), base)
gm.recompile()
with torch.no_grad():
    doubled_after = torch.equal(gm(x), base * 2)
print(f"改完圖、還沒 recompile：輸出仍等於原本的輸出？ {unchanged_before}")
print(f"recompile 之後：輸出等於原本的 2 倍？         {doubled_after}")
assert unchanged_before, "recompile 之前，forward 還是舊的程式碼"
assert doubled_after, "recompile 之後，forward 多了 scale_out"

# %%
# 每次改完圖都要呼叫 ``recompile()``；``gm.code`` 可以看到新產生的 forward：

print(gm.code.strip())
assert "self.scale_out(relu)" in gm.code, "新產生的 forward 拿 relu 呼叫 scale_out"

# %%
# 步驟 4 — 用 call_function 取代 call_module
# ------------------------------------------
# 接著把 scale_out 這個 ``call_module`` 換成 ``aten.mul`` 的 ``call_function``。
# ``convert_pt2e`` 把 observer 換成 q/dq 也是這個做法：建新 node → 下游改讀新 node → 刪掉舊 node。
# 先看看順序顛倒、還有人讀舊 node 就想刪它，會發生什麼：

before = copy.deepcopy(gm)
with graph.inserting_before(scale):
    mul = graph.call_function(torch.ops.aten.mul.Tensor, (relu, 2.0))
with expect_error(RuntimeError, match="still had 1 users"):
    graph.erase_node(scale)
assert mul.name == "mul_tensor", "新 node 的名字由 op 名稱 aten.mul.Tensor 而來"

# %%
# 只要還有使用者就不能刪。照正確的順序再做一次：

scale.replace_all_uses_with(mul)
graph.erase_node(scale)
gm.delete_submodule("scale_out")
gm.recompile()
with torch.no_grad():
    assert torch.equal(gm(x), base * 2), "換成 aten.mul 之後，輸出仍是原本的 2 倍"
assert not hasattr(gm, "scale_out"), "模組也一併移除了"
draw_diff(before, gm, title="步驟 4：scale_out 換成 aten.mul")

# %%
# ``mul_tensor`` 的第二個引數 ``2.0`` 是直接寫在 ``args`` 裡的 Python 常數；
# 它不是 node，所以圖上看不到。

print(f"mul.args = {mul.args}")
assert mul.args == (relu, 2.0), "2.0 是 args 裡的常數，不是 node"

# %%
# 步驟 5 — 把張量常數放進圖裡
# -------------------------------
# Python 數字可以直接寫進引數，per-tensor 的 scale／zero point 就是這樣存的（M01 會看到）。
# 張量常數（例如 per-channel 的 scale）則要先用 ``register_buffer`` 註冊，
# 再由 ``get_attr`` node 讀出來。

before = copy.deepcopy(gm)
gm.register_buffer("two", torch.tensor(2.0))
with graph.inserting_before(mul):
    two = graph.get_attr("two")
    mul_t = graph.call_function(torch.ops.aten.mul.Tensor, (relu, two))
mul.replace_all_uses_with(mul_t)
graph.erase_node(mul)
gm.recompile()
with torch.no_grad():
    assert torch.equal(gm(x), base * 2), "常數改由 buffer 提供，輸出不變"
draw_diff(before, gm, title="步驟 5：常數改成 buffer + get_attr")

# %%
# ``two`` 是 ``get_attr`` node；圖上不另畫一個框，而是寫在讀它的 node 標籤裡，記作 ``‹two›``。

print(f"two.op = {two.op!r}   two.target = {two.target!r}   mul_t.args = {mul_t.args}")
assert two.op == "get_attr" and mul_t.args == (relu, two), "mul 透過 two 讀取 buffer"
assert torch.equal(gm.get_buffer("two"), torch.tensor(2.0)), "buffer 裡存的是 2.0"

# %%
# 步驟 6 — 清理與檢查
# -------------------
# 故意插入一個沒有人讀的 ``neg``，再用死碼消除（``eliminate_dead_code``）清掉：
# 它會刪除每一個沒有使用者的 node，除非 ``node.is_impure()`` 說它非留不可。
# ``lint`` 則檢查圖的結構（例如每個 node 都先定義再使用），有問題就引發例外。
# 加上 ``neg`` 之後圖裡有 10 個 node：``x``、兩個讀 weight 的 ``get_attr``、``_guards_fn``、
# ``conv2d``、``relu``、``two``、``mul_tensor``、``neg`` 和 ``output``。

with graph.inserting_after(relu):
    neg = graph.call_function(torch.ops.aten.neg.default, (relu,))
before = copy.deepcopy(gm)
nodes_with_neg = len(graph.nodes)
graph.eliminate_dead_code()
nodes_after_cleanup = len(graph.nodes)
graph.lint()
gm.recompile()
print(f"node 數：插入 neg 後 {nodes_with_neg} → eliminate_dead_code 後 {nodes_after_cleanup}")
assert (nodes_with_neg, nodes_after_cleanup) == (10, 9), "只有 neg 被清掉"
assert not any(node.name.startswith("neg") for node in graph.nodes), "neg 不見了"
draw_diff(before, gm, title="步驟 6：清理之後")

# %%
# ``_guards_fn`` 也沒有使用者，卻留了下來。原因不在於它是 ``call_module``：
# ``node.is_impure()`` 會去問被呼叫的模組有沒有 ``_is_impure`` 屬性，
# 而 ``.module()`` 在 ``_guards_fn`` 上把它設成 ``True``，好讓輸入檢查不被清掉。

guards = nodes["_guards_fn"]
marked = gm.get_submodule("_guards_fn")._is_impure
print(f"_guards_fn：users={list(guards.users)}  is_impure()={guards.is_impure()}")
print(f"gm._guards_fn._is_impure = {marked}")
assert not guards.users and guards.name in {n.name for n in graph.nodes}, "沒有使用者也被留下"
assert marked is True and guards.is_impure(), "留下的原因是它的模組被標成 impure"

# %%
# 一般的 ``call_module`` 如果沒有人讀，就和 ``neg`` 一樣是死碼：沒有使用者的 ``Scale`` 會被刪掉。
# 它的 submodule 則會一直掛在 ``gm`` 上，直到呼叫 ``delete_submodule``。

gm.add_submodule("unused", Scale(3.0))
with graph.inserting_after(relu):
    unused = graph.call_module("unused", (relu,))
print(f"unused.is_impure() = {unused.is_impure()}")
assert not unused.is_impure(), "一般的模組沒有被標成 impure"
graph.eliminate_dead_code()
assert "unused" not in {n.name for n in graph.nodes}, "沒人讀的 call_module 會被刪掉"
assert hasattr(gm, "unused"), "死碼消除不會動到 submodule 本身"
gm.delete_submodule("unused")
gm.recompile()

# %%
# convert 把 weight 預先量化、改用 ``get_attr`` 讀取 int8 副本之後，
# 原本的 weight node 就沒人讀了，同樣會這樣被清掉（M02-3）。

with torch.no_grad():
    assert torch.equal(gm(x), base * 2), "六個步驟之後，輸出是原本的 2 倍"

# %%
# 小結
# ----
# ====================  ==================================================================
# 要做的事              用到的動作
# ====================  ==================================================================
# 插入 observer         ``add_submodule`` + ``inserting_after`` + ``call_module`` +
#                       ``replace_all_uses_with(delete_user_cb=...)``
# observer → q/dq       ``inserting_before`` + ``call_function`` + ``replace_all_uses_with``
#                       + ``erase_node`` （+ ``delete_submodule``）
# 存 scale／zero point  Python 常數寫在引數裡，或 ``register_buffer`` + ``get_attr``
# 收尾                  ``eliminate_dead_code`` （留下 ``is_impure()`` 標記的 node）、
#                       ``lint``、``recompile``
# ====================  ==================================================================
#
# M02-2 親手插入 observer 用的是步驟 1～3；
# M02-3 把 observer 換成 q/dq、預先量化 weight，用的是步驟 4～6。

# %%
# 練習
# ----
# 1. 在 ``gm`` 的副本上，用步驟 1～2 的做法在 ``conv2d`` 與 ``relu`` 之間插入 ``Scale(0.5)``。
#    預測輸出：它和 ``base`` 相比如何？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          half_gm = copy.deepcopy(gm)
#          conv2d = next(n for n in half_gm.graph.nodes if n.name == "conv2d")
#          half_gm.add_submodule("scale_in", Scale(0.5))
#          with half_gm.graph.inserting_after(conv2d):
#              scale_in = half_gm.graph.call_module("scale_in", (conv2d,))
#          conv2d.replace_all_uses_with(scale_in, delete_user_cb=lambda user: user is not scale_in)
#          half_gm.recompile()
#          assert [n.name for n in scale_in.users] == ["relu"], "relu 現在讀 scale_in"
#          with torch.no_grad():
#              # relu(0.5 * c) * 2 == relu(c)：浮點數乘以 0.5 再乘以 2 沒有誤差
#              assert torch.equal(half_gm(x), base), "逐位元回到原本的輸出"
#
# 2. 幫一個 ``Scale`` 模組加上屬性 ``_is_impure = True``，再從一個沒有人讀的 node 呼叫它。
#    預測 ``eliminate_dead_code`` 會怎麼處理這個 node。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          kept_gm = copy.deepcopy(gm)
#          relu_node = next(n for n in kept_gm.graph.nodes if n.name == "relu")
#          keep = Scale(3.0)
#          keep._is_impure = True
#          kept_gm.add_submodule("keep", keep)
#          with kept_gm.graph.inserting_after(relu_node):
#              kept = kept_gm.graph.call_module("keep", (relu_node,))
#          kept_gm.graph.eliminate_dead_code()
#          assert kept.is_impure() and not kept.users, "標成 impure，沒有使用者"
#          assert "keep" in {n.name for n in kept_gm.graph.nodes}, "和 _guards_fn 一樣被留下"
#
# 3. 重新匯出 ``conv_relu``，用步驟 4 的做法把 ``relu`` 換成 ``aten.sigmoid``。
#    預測 node 的數量與輸出。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          model = get_model("conv_relu")
#          sig_gm = export_module(model, (x,))
#          old = next(n for n in sig_gm.graph.nodes if n.name == "relu")
#          count = len(sig_gm.graph.nodes)
#          with sig_gm.graph.inserting_after(old):
#              sigmoid = sig_gm.graph.call_function(torch.ops.aten.sigmoid.default, old.args)
#          old.replace_all_uses_with(sigmoid)
#          sig_gm.graph.erase_node(old)
#          sig_gm.graph.lint()
#          sig_gm.recompile()
#          assert len(sig_gm.graph.nodes) == count, "進一個 node、出一個 node"
#          with torch.no_grad():
#              assert torch.equal(sig_gm(x), torch.sigmoid(model.conv(x))), "sigmoid(conv(x))"

# %%
# 延伸閱讀
# --------
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_：``Graph``、``Node``、
#   ``GraphModule`` 與改圖的 API。
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_：``.module()``
#   回傳的是什麼，包括 guard。
# - :ref:`疑難排解：prepare 與 convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# M01 單元開始讀 torchao 產生的圖：
# :ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`。
