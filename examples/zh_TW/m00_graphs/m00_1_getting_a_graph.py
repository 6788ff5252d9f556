"""
M00-1 取得計算圖：torch.export 與 ExportedProgram
=================================================

PT2E 量化的對象是計算圖，而不是 Python 程式碼。
``torch.export.export`` 會「追蹤」（trace）模型：它把 ``forward`` 的 Python 程式碼執行一次，
但用的是 fake tensor，只有範例輸入的形狀與 dtype，沒有數值；過程中呼叫的每一個 ATen 運算都被記下來。
得到的 ``ExportedProgram`` 裝著這張圖、模型的 weight，
以及一份說明「圖的每個輸入是什麼」的 signature。
接著 ``.module()`` 把它轉成 ``torch.fx.GraphModule``，也就是 PT2E 讀取、修改的形式。
本課在 conv → batch norm → relu 的模型上走一遍這兩步，
並驗證這張圖算出來的結果和原本的模型一模一樣。

**你會學到**

- ``ExportedProgram`` 裝了什麼：一張把 weight 也當成輸入的圖，以及它的 signature
- ``.module()`` 改了什麼：weight 改由 ``get_attr`` node 讀取，並多出檢查輸入的 ``_guards_fn``
- 怎麼把圖印成 Python 程式碼，並和 eager 模型的輸出比對

**先備知識**：會用 PyTorch 即可（``nn.Module`` 與它的 ``forward``，見
`torch.nn.Module <https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html>`_），
還不需要懂 ``torch.fx``。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 課程的模型庫提供 weight 固定的小模型。
# ``conv_bn_relu`` 同時有 parameter（conv 與 batch norm 的 weight）
# 和 buffer（batch norm 的統計量），它的 graph signature 因此比較值得一看。

import torch

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import quiet
from common.viz import draw

quiet()

model = get_model("conv_bn_relu")
x = example_inputs(2)[0]
print(model)
print(f"x: {tuple(x.shape)}")

# %%
# 步驟 1 — 匯出模型
# -----------------
# ``torch.export.export(model, args)`` 的範例輸入要包成 tuple，只有一個也一樣。
# 圖上每個方框是 export 記下的一個 ATen 運算，每個橢圓是圖的一個輸入。
# 每個 node 都有提示框，列出它的 op、dtype 與 shape、weight 和原始碼行：滑鼠移到 node 上，
# 或在觸控螢幕上點一下 node，就會顯示。點一下圖（或圖下方的「放大檢視」按鈕），
# 可以用原始大小開啟它，並且拖曳與縮放：課程後面較大的圖需要這樣看。

program = torch.export.export(model, (x,))
print(type(program).__name__)
assert isinstance(program, torch.export.ExportedProgram), "export 回傳 ExportedProgram"
draw(program.graph_module, title="ExportedProgram：weight 是圖的輸入")

# %%
# export 執行了一次 ``forward`` 的 Python 程式碼，用的卻不是 ``x`` 裡的數值。
# 在 conv 上掛一個 forward pre-hook，就能看到 export 時 conv 收到的是什麼：
# fake tensor（M00-2 會細看），連 weight 也是。範例輸入只有形狀和 dtype 有意義：
# 拿一批全是 0 的輸入來匯出，記下的是同一張圖。

seen = []
hook = model.conv.register_forward_pre_hook(
    lambda conv, args: seen.append((type(args[0]).__name__, type(conv.weight).__name__))
)
zeros_program = torch.export.export(model, (torch.zeros_like(x),))
hook.remove()
print(f"export 時 conv 收到的輸入與 weight：{seen}")
assert seen == [("FakeTensor", "FakeTensor")], "forward 只執行一次，用的是 fake tensor"
assert zeros_program.graph_module.code == program.graph_module.code, "數值不影響圖"

# %%
# 圖有八個輸入，而不是一個。export 會把每個 parameter 和 buffer「提升」（lift）成獨立的輸入，
# 讓整張圖成為只依賴輸入的純函式：前七個是模型狀態裡的張量，最後是 ``x``，
# 名字沿用 ``forward()`` 的參數名稱。

placeholders = [node.name for node in program.graph.nodes if node.op == "placeholder"]
print(placeholders)
assert len(placeholders) == len(model.state_dict()) + 1, "每個狀態張量一個輸入，再加上 x"
assert placeholders[-1] == "x", "使用者的輸入排最後，名字和 forward(self, x) 相同"

# %%
# 步驟 2 — 讀 graph signature
# ---------------------------
# ``program.graph_signature`` 說明每個輸入是什麼：``PARAMETER``、``BUFFER`` 或 ``USER_INPUT``；
# 提升的參數（lifted parameter）與 buffer 還會註明它代表模型的哪個屬性。

signature = program.graph_signature
for spec in signature.input_specs:
    print(f"{spec.arg.name:26} {spec.kind.name:11} {spec.target}")
for spec in signature.output_specs:
    print(f"{spec.arg.name:26} {spec.kind.name:11}")

# %%
# parameter 與 buffer 正好就是模型的那些，順序也相同。
# 輸入的命名有規則：parameter 加 ``p_``、buffer 加 ``b_``，
# 後面接屬性路徑，並把 ``.`` 換成 ``_`` （``conv.weight`` 變成 ``p_conv_weight``）。

parameters = [name for name, _ in model.named_parameters()]
assert list(signature.parameters) == parameters, "就是模型的 parameter，順序相同"
assert list(signature.buffers) == [name for name, _ in model.named_buffers()], "buffer 也是"
for spec in signature.input_specs:
    if spec.target is not None:
        prefix = "p_" if spec.kind.name == "PARAMETER" else "b_"
        assert spec.arg.name == prefix + spec.target.replace(".", "_"), f"p_/b_ 加路徑：{spec}"
# sphinx_gallery_start_ignore
assert signature.user_inputs == ("x",) and signature.user_outputs == ("relu",)
# sphinx_gallery_end_ignore

# %%
# 張量本身放在 ``program.state_dict`` 裡。export 並不複製它們：那就是模型自己的張量，
# 所以原地修改模型的 weight，program 也會跟著變。

print(list(program.state_dict))
assert program.state_dict["conv.weight"] is model.conv.weight, "是同一個張量物件"

# %%
# ``ExportedProgram`` 不能直接呼叫；錯誤訊息會告訴你該怎麼做。

with expect_error(RuntimeError, match="module()"):
    program(x)

# %%
# 步驟 3 — 用 .module() 取得 GraphModule
# --------------------------------------
# ``program.module()`` 回傳 ``torch.fx.GraphModule``：一個 ``forward`` 由圖產生的 ``nn.Module``。
# ``prepare_pt2e`` 與 ``convert_pt2e`` 吃的就是這個形式，
# ``common.pt2e.export_module`` 回傳的也是它。

gm = program.module()
is_graph_module, is_module = isinstance(gm, torch.fx.GraphModule), isinstance(gm, torch.nn.Module)
print(f"GraphModule? {is_graph_module}   nn.Module? {is_module}")
assert is_graph_module and is_module, "GraphModule 也是 nn.Module"
draw(gm, highlight=["_guards_fn"], title="program.module()：get_attr node 與 _guards_fn")

# %%
# 現在只剩 ``x`` 一個輸入。狀態張量又變回 ``gm`` 的屬性，
# 圖裡每個都由一個 ``get_attr`` node 讀取：它的 ``target`` 是屬性路徑，
# 名字是把 ``.`` 換成 ``_`` 的路徑（``conv_weight``，不再有 ``p_`` 前綴）。
# 圖上不替這些 node 另畫方框，而是寫在讀它的 node 標籤裡，記作 ``‹conv_weight›``。
# 只有 ``bn_num_batches_tracked`` 自成一框，因為沒有人讀它：
# eval 模式的 batch norm 不計算批次數。

attrs = {node.name: node.target for node in gm.graph.nodes if node.op == "get_attr"}
inputs = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
print(f"placeholders: {inputs}")
print(f"get_attr:     {attrs}")
assert inputs == ["x"], "圖的輸入只剩使用者的輸入"
assert set(attrs.values()) == set(model.state_dict()), "每個狀態張量一個 get_attr"
assert all(name == target.replace(".", "_") for name, target in attrs.items()), "路徑，. → _"
assert gm.get_parameter("conv.weight") is model.conv.weight, "仍然是模型自己的張量"
unread = next(n for n in gm.graph.nodes if n.name == "bn_num_batches_tracked")
assert not unread.users, "沒有人讀 bn_num_batches_tracked"

# %%
# 步驟 4 — _guards_fn 是做什麼的
# ------------------------------
# export 記下的是「這個」 ``x`` 的圖：沒有指定 ``dynamic_shapes`` 時，每個維度的大小都固定，
# 連批次大小 2 也是。所以 ``.module()`` 會在 placeholder 後面插入一個 ``call_module`` node，
# 拿輸入去呼叫 submodule ``_guards_fn``。它檢查輸入是否符合這些假設，不回傳任何東西，
# 因此這個 node 沒有使用者。

guards = next(node for node in gm.graph.nodes if node.name == "_guards_fn")
print(f"op={guards.op!r}  target={guards.target!r}")
print(f"args={guards.args}  users={list(guards.users)}")
assert guards.op == "call_module" and guards.target == "_guards_fn", "一個 call_module node"
assert [node.name for node in guards.args] == ["x"], "它讀取輸入"
assert not guards.users, "它不回傳任何東西，所以沒有人讀它"

# %%
# eager 模型吃得下批次大小為 3 的輸入，匯出的圖卻拒絕它；
# 失敗的檢查是 guard ``x.size()[0] == 2`` （2 就是範例輸入的批次大小）。

x3 = example_inputs(3)[0]
with torch.no_grad():
    print(f"model(x3): {tuple(model(x3).shape)}")
with expect_error(AssertionError, match=f"x.size()[0] == {x.shape[0]}"):
    gm(x3)

# %%
# ``program.module(check_guards=False)`` 不會產生 ``_guards_fn``。
# 輸入仍然會被檢查，只是改由圖執行「之前」的 forward pre-hook 負責，圖裡就只剩下計算本身。
# pre-hook 做的是 guard 檢查的一部分，但足以抓到形狀不符。

gm_unguarded = program.module(check_guards=False)
unguarded_names = [node.name for node in gm_unguarded.graph.nodes]
print(f"nodes: {unguarded_names}")
assert "_guards_fn" not in unguarded_names, "沒有 _guards_fn node"
assert len(unguarded_names) == len(gm.graph.nodes) - 1, "同一張圖，只少了 _guards_fn"
with expect_error(RuntimeError, match=f"to be equal to {x.shape[0]}"):
    gm_unguarded(x3)

# %%
# 對改圖的程式來說，``_guards_fn`` 和其他 node 沒有兩樣：
# 把每個 ``call_module`` 都當成 observer 的 pass，或是計算 node 數量的 pass，
# 都得把它考慮進去（M00-4 就是如此）。
#
# 步驟 5 — 把圖讀成程式碼
# -----------------------
# ``gm.code`` 是產生的程式碼，也就是 ``forward`` 的 Python 原始碼：依圖的順序，一個 node 一行。
# ``self.conv.weight`` 這類的行就是 ``get_attr`` node。

print(gm.code.strip())
assert "conv_weight = self.conv.weight" in gm.code, "get_attr node 就是讀取屬性"
assert "self._guards_fn(x)" in gm.code, "guard node 就是呼叫 submodule"

# %%
# ``print_readable`` 印出同樣的程式碼，並標上每個值的 dtype 與形狀（取自 node 的 ``meta["val"]``，
# 見 M00-2）。
# 它也會印出每個運算來自哪個檔案的哪一行，這裡只留下運算那幾行。
# conv 把 3 個通道變成 8 個，padding 1 讓大小維持 16 × 16，
# 所以輸出是 ``f32[2, 8, 16, 16]``。

readable = gm.print_readable(print_output=False)
for line in readable.splitlines():
    if "torch.ops.aten" in line:
        print(line.split(";")[0].strip())
conv_line = 'conv2d: "f32[2, 8, 16, 16]" = torch.ops.aten.conv2d.default'
assert conv_line in readable, "conv 的輸出是 f32[2, 8, 16, 16]"

# %%
# 步驟 6 — 和 eager 模型比對
# --------------------------
# 圖呼叫的 ATen kernel 和 eager 模型相同，輸入的張量相同，順序也相同，
# 所以輸出不只是接近，而是每個位元都相等。

with torch.no_grad():
    eager = model(x)
    from_graph = gm(x)
    from_unguarded = gm_unguarded(x)
print(f"max |gm(x) - model(x)| = {(from_graph - eager).abs().max().item()}")
assert torch.equal(from_graph, eager), "匯出的圖算出的結果和 eager 完全相同"
assert torch.equal(from_unguarded, eager), "check_guards 只影響檢查，不影響數值"

# %%
# 小結
# ----
# ======================  =================================================================
# 形式                    內容
# ======================  =================================================================
# ``ExportedProgram``     weight 被提升為輸入（``p_*``、``b_*``）的圖、
#                         ``graph_signature``、``state_dict``；不能直接呼叫
# ``program.module()``    ``GraphModule``：weight 由 ``get_attr`` 讀取，``_guards_fn``
#                         node 檢查輸入；``gm(x)`` 等於 ``model(x)``
# ``check_guards=False``  同一張圖但沒有 ``_guards_fn``，改由 pre-hook 檢查
# ======================  =================================================================
#
# export 用 fake tensor 追蹤 ``forward`` 一次；它記下的圖，對匯出時那個形狀的輸入，
# 算出的結果和模型完全相同。

# %%
# 練習
# ----
# 1. 改為匯出 ``small_cnn``。預測 ``ExportedProgram`` 的圖有幾個 placeholder，
#    以及使用者輸出的名字。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          cnn = get_model("small_cnn")
#          cnn_program = torch.export.export(cnn, (x,))
#          cnn_inputs = [n for n in cnn_program.graph.nodes if n.op == "placeholder"]
#          assert len(cnn_inputs) == len(cnn.state_dict()) + 1 == 10, "9 個狀態張量加上 x"
#          assert cnn_program.graph_signature.user_outputs == ("linear",), "fc 的 aten.linear"
#
# 2. 用批次大小為 4 的輸入匯出 ``conv_relu``。預測拿 ``x`` （批次大小 2）呼叫它的
#    ``.module()`` 會發生什麼事。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          gm4 = torch.export.export(get_model("conv_relu"), example_inputs(4)).module()
#          with expect_error(AssertionError, match="x.size()[0] == 4"):
#              gm4(x)
#
# 3. 加上 ``dynamic_shapes={"x": {0: torch.export.Dim("batch")}}`` 重新匯出 ``model``。
#    預測 ``.module()`` 遇到 ``x3`` 會怎樣，以及 ``conv2d`` 的 ``meta["val"]`` 裡批次大小是什麼。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          dynamic = {"x": {0: torch.export.Dim("batch")}}
#          gm_dynamic = torch.export.export(model, (x,), dynamic_shapes=dynamic).module()
#          with torch.no_grad():
#              assert torch.equal(gm_dynamic(x3), model(x3)), "現在批次大小為 3 也能用"
#          conv_val = next(n for n in gm_dynamic.graph.nodes if n.name == "conv2d").meta["val"]
#          assert isinstance(conv_val.shape[0], torch.SymInt), "批次大小是一個符號"

# %%
# 延伸閱讀
# --------
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_：``ExportedProgram``、
#   graph signature、dynamic shapes，以及 strict 與 non-strict 兩種追蹤方式。
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_：``GraphModule`` 與它產生的程式碼。
# - :ref:`疑難排解：匯入與匯出
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# :ref:`M00-2 · 拆解一個 node <sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>`
# 拆解單一個 node：它的 ``op``、``target``、``args``、``users`` 與 ``meta``。
# 〈:ref:`FX Graph 與 Node 基礎 <fx-basics>`〉一文則用一頁整理了整個單元的重點。
