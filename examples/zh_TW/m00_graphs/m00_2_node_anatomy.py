"""
M00-2 拆解一個 node
===================

``torch.fx`` 的圖就是一串 ``Node`` 物件，而每個 node 只有少數幾個欄位：
它是哪一種 node（``op``）、呼叫什麼（``target``）、讀取什麼（``args``／``kwargs``）、
被誰讀取（``users``），以及一個由 export 記下各種資訊的 ``meta`` 字典。
本課把一個小 CNN 的 node 逐欄拆開，並把每個欄位拿回模型上驗證：
``meta`` 裡的形狀對照真正執行一次的結果，``meta`` 裡的模組名稱對照模型自己的 submodule。
quantizer 決定在哪裡量化，靠的正是這些欄位。

**你會學到**

- 六種 ``op``，以及匯出的圖裡會出現哪幾種
- ``target``、``args``、``users`` 與 ``all_input_nodes``：node 呼叫什麼、node 之間怎麼相連
- ``meta["val"]``、``meta["nn_module_stack"]`` 與 ``meta["source_fn_stack"]``：形狀、dtype，
  以及每個 node 來自哪個模組

**先備知識**：:ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# ``small_cnn`` 是 conv → batch norm → relu → max pool → flatten → linear。
# ``export_module`` 就是 M00-1 的 ``torch.export.export(model, args).module()``。

from collections import Counter

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

model = get_model("small_cnn")
x = example_inputs(2)[0]
gm = export_module(model, (x,))
nodes = {node.name: node for node in gm.graph.nodes}
draw(gm, title="匯出後的 small_cnn")

# %%
# 步驟 1 — 六種 node
# ------------------
# ``node.op`` 是六個字串之一。為了把六種都看到，這裡把匯出的圖
# 和 ``torch.fx.symbolic_trace`` 產生的圖並排比較；symbolic_trace 是較早的 tracer，
# 它用代理物件（proxy）走過 ``forward`` 的 Python 程式碼，而不是執行 ATen 運算。
# 另外再加上一個呼叫張量「方法」的一行函式。

OP_KINDS = ("placeholder", "get_attr", "call_function", "call_module", "call_method", "output")
exported = Counter(node.op for node in gm.graph.nodes)
traced = Counter(node.op for node in torch.fx.symbolic_trace(model).graph.nodes)
method = Counter(node.op for node in torch.fx.symbolic_trace(lambda t: t.flatten(1)).graph.nodes)
print(f"{'op':14} {'export':>7} {'symbolic_trace':>15} {'t.flatten(1)':>13}")
for op in OP_KINDS:
    print(f"{op:14} {exported[op]:7} {traced[op]:15} {method[op]:13}")
assert set(exported) | set(traced) | set(method) == set(OP_KINDS), "只有這六種"

# %%
# 在匯出的圖裡，所有計算都是呼叫 ATen 運算子的 ``call_function``；
# weight 是 ``get_attr`` node（``state_dict`` 的每一項各一個）；
# 唯一的 ``call_module`` 是 M00-1 提過的 ``_guards_fn``。
# ``symbolic_trace`` 則把每個 submodule 保留成一個 ``call_module`` node，weight 留在模組裡面；
# 像 ``t.flatten(1)`` 這樣的張量方法會變成 ``call_method``。
# export 的圖裡沒有 ``call_method``：它記下的是方法背後的 ATen 運算子。

leaf_modules = [name for name, m in model.named_modules() if not list(m.children())]
module_calls = [node.target for node in gm.graph.find_nodes(op="call_module")]
print(f"匯出的圖裡，call_module 的 target：{module_calls}")
print(f"模型最底層的 submodule：{leaf_modules}")
assert exported["get_attr"] == len(model.state_dict()), "每個 parameter 或 buffer 一個 get_attr"
assert module_calls == ["_guards_fn"], "唯一的 call_module 是 _guards_fn"
assert exported["call_method"] == 0, "export 的圖沒有 call_method"
assert traced["get_attr"] == 0, "symbolic_trace：weight 留在各個模組裡"
assert traced["call_module"] == len(leaf_modules), "symbolic_trace：每一層一個 call_module"

# %%
# 步驟 2 — target：node 呼叫什麼
# -------------------------------
# 匯出的圖裡，``call_function`` node 的 ``target`` 是 ``OpOverload``：
# 一個 ATen 運算子（``aten.conv2d``）加上它的某一個 overload（``default``），
# overload 決定了確切的 signature。其他種類的 node，``target`` 則是字串：名字或屬性路徑。

conv = nodes["conv2d"]
print(f"{type(conv.target).__name__}: {conv.target}")
print(f"schema: {conv.target._schema}")
for name in ("x", "conv_weight", "_guards_fn", "output"):
    print(f"{nodes[name].op:12} {name:12} target={nodes[name].target!r}")
assert isinstance(conv.target, torch._ops.OpOverload), "target 是一個 OpOverload"
assert conv.target == torch.ops.aten.conv2d.default, "直接拿 op 本身來比較 target"
other_targets = [n.target for n in gm.graph.nodes if n.op != "call_function"]
assert all(isinstance(t, str) for t in other_targets), "其他種類的 target 是字串"

# %%
# overload 不能忽略：``torch.flatten(x, 1)`` 被記成 ``aten.flatten.using_ints``，
# 而不是 ``.default``。找 ``aten.flatten.default`` 的 pass 會什麼都找不到；
# 哪個 overload 都可以的時候，就比較 ``target.overloadpacket``。

flatten = nodes["flatten"]
print(f"{flatten.target.name()}   overloadpacket: {flatten.target.overloadpacket}")
assert flatten.target == torch.ops.aten.flatten.using_ints, "是 using_ints，不是 .default"
assert flatten.target.overloadpacket == torch.ops.aten.flatten, (
    "overloadpacket 涵蓋 flatten 的每個 overload"
)

# %%
# 步驟 3 — args 與 kwargs：node 讀取什麼
# --------------------------------------
# ``args`` 依運算子 schema 的順序排列。有些項目是其他 node（也就是張量），
# 有些是直接寫進圖裡的 Python 常數（stride 與 padding）。
# 維持預設值的引數（``dilation``、``groups``）就乾脆不寫。

schema_args = conv.target._schema.arguments
for argument, value in zip(schema_args, conv.args, strict=False):
    kind = "node" if isinstance(value, torch.fx.Node) else "常數"
    print(f"{argument.name:8} = {value!s:12}（{kind}）")
print(f"kwargs = {conv.kwargs}")
assert [a.name for a in conv.args[:3]] == ["x", "conv_weight", "conv_bias"], "張量引數是 node"
assert conv.args[3:] == ([1, 1], [1, 1]) and conv.kwargs == {}, "stride 為 1、padding 為 1"
assert len(conv.args) == 5 < len(schema_args) == 7, "dilation 與 groups 維持預設值"

# %%
# ``all_input_nodes`` 只留下 ``args`` 與 ``kwargs`` 裡的 node，也就是圖上的邊。
# ``max_pool2d`` 則是另一個極端：除了輸入之外全是常數，
# 視窗大小（ ``kernel_size`` ）2、stride 2（ ``nn.MaxPool2d(2)`` 沒給 stride 時就用視窗大小）。

pool = nodes["max_pool2d"]
print(f"conv2d.all_input_nodes     = {conv.all_input_nodes}")
print(f"max_pool2d.args            = {pool.args}")
print(f"max_pool2d.all_input_nodes = {pool.all_input_nodes}")
assert conv.all_input_nodes == [a for a in conv.args if isinstance(a, torch.fx.Node)], (
    "all_input_nodes 就是 args 裡的 node"
)
assert pool.args[1:] == ([2, 2], [2, 2]), "視窗大小 2、stride 2"
assert pool.all_input_nodes == [nodes["relu"]], "它唯一的輸入 node 是 relu"

# %%
# 步驟 4 — users 與 all_input_nodes：兩個方向
# -------------------------------------------
# ``all_input_nodes`` 指向上游，``users`` 指向下游。``x`` 有兩個使用者：conv 和 guard 檢查。
# ``users`` 是一個以 node 為鍵的字典（值沒有用途），所以要寫 ``list(node.users)``。

print(f"x.users = {list(nodes['x'].users)}")
print(f"conv2d.all_input_nodes = {conv.all_input_nodes}   conv2d.users = {list(conv.users)}")
assert list(nodes["x"].users) == [conv, nodes["_guards_fn"]], "讀 x 的是 conv 和 guard"
assert list(conv.users) == [nodes["batch_norm"]], "batch_norm 讀 conv2d"
draw(gm, highlight=["x", "conv2d", "_guards_fn"], title="x 與它的兩個使用者")

# %%
# FX 讓兩個方向永遠一致：只要 B 讀 A，A 的 users 裡就有 B。M00-4 只改 ``args`` 就能重新接線，
# 靠的就是這一點。兩端的 node 各有一邊是空的：placeholder 不讀任何 node，output node 沒有使用者。

for node in gm.graph.nodes:
    for source in node.all_input_nodes:
        assert node in source.users, f"{source.name} -> {node.name} 不在 users 裡"
    for user in node.users:
        assert node in user.all_input_nodes, f"{node.name} -> {user.name} 不在輸入裡"
assert not nodes["x"].all_input_nodes, "placeholder 不讀任何 node"
assert not nodes["output"].users, "沒有 node 讀 output"
print("每條邊在兩個方向都找得到")

# %%
# 步驟 5 — meta["val"]：不必執行就知道形狀與 dtype
# -------------------------------------------------
# export 是拿「假」張量（fake tensor）追蹤模型的（M00-1）：它有形狀、dtype、device，卻沒有資料。
# 每個 node 把自己的假結果存在 ``meta["val"]``。要讀它的數值就會失敗。

val = conv.meta["val"]
print(f"{type(val).__name__}  shape={tuple(val.shape)}  dtype={val.dtype}  device={val.device}")
assert isinstance(val, FakeTensor), "meta['val'] 是 FakeTensor"
with expect_error(DataDependentOutputException):
    torch.equal(val, val)

# %%
# 要拿真正的數值來核對這些形狀，就用 ``torch.fx.Interpreter`` 逐個 node 執行這張圖；
# 設定 ``garbage_collect_values=False`` 時，它會把每個 node 的真實結果留在 ``env`` 裡。
# 最後的結果必須等於 eager 模型的輸出。

interpreter = torch.fx.Interpreter(gm, garbage_collect_values=False)
with torch.no_grad():
    result = interpreter.run(x)
    assert torch.equal(result, model(x)), "Interpreter 算出的就是模型的輸出"
for node, real in interpreter.env.items():
    fake = node.meta.get("val")
    if isinstance(real, torch.Tensor) and node.op == "call_function":
        print(f"{node.name:11} 假 {tuple(fake.shape)!s:16} 真 {tuple(real.shape)}")
    if isinstance(real, torch.Tensor):
        assert fake.shape == real.shape and fake.dtype == real.dtype, (
            f"{node.name}：fake 與真實張量的形狀、dtype 相同"
        )

# %%
# 注意 ``meta["val"]`` 裡的批次大小是 2，也就是範例輸入的批次：
# 這正是 ``_guards_fn`` 檢查的那個固定下來的大小（M00-1）。

assert nodes["linear"].meta["val"].shape == (x.shape[0], 10), "批次大小 2，和匯出時一樣"

# %%
# 步驟 6 — meta["nn_module_stack"]：node 來自哪個模組
# ---------------------------------------------------
# ``nn_module_stack`` 列出記錄這個運算時正在執行 ``forward`` 的各層模組，由外而內，
# 每一項是（屬性路徑，類別名稱）。最後一項是最內層的模組：``conv2d`` 來自 ``model.conv``。
# ``flatten`` 是在 ``SmallCNN.forward`` 裡直接呼叫的，所以它最內層的模組就是根模組，
# 路徑是 ``""``。

calls = [node for node in gm.graph.nodes if node.op == "call_function"]
for node in calls:
    path, cls = list(node.meta["nn_module_stack"].values())[-1]
    print(f"{node.name:11} path={path!r:8} class={cls}")
conv_path, conv_cls = list(conv.meta["nn_module_stack"].values())[-1]
assert model.get_submodule(conv_path) is model.conv and conv_cls.endswith(".Conv2d")
flatten_stack = list(flatten.meta["nn_module_stack"].values())
assert flatten_stack == [("", "common.models.SmallCNN")], "由根模組自己的 forward 呼叫"

# %%
# 另一個記錄來源的欄位 ``source_fn_stack``，記的是產生這個 node 的 Python
# 層呼叫（模組類別或函式）。在 torch 2.13，預設的 export 把 ``forward`` 當一般 Python
# 執行（``strict=False``），並不填這個欄位，改為記錄 ``torch_fn``：一個唯一的名字，
# 加上被呼叫的 torch 函式的種類與名稱。

print(f"meta 裡有 source_fn_stack 嗎？{'source_fn_stack' in conv.meta}")
for node in calls:
    print(f"{node.name:11} torch_fn={node.meta['torch_fn']}")
assert not any("source_fn_stack" in node.meta for node in gm.graph.nodes), (
    "沒有填入 source_fn_stack"
)
assert conv.meta["torch_fn"][1] == "builtin_function_or_method.conv2d", "改為記錄 torch_fn"

# %%
# ``strict=True`` 的 export 用 TorchDynamo 追蹤 bytecode，就會記下 ``source_fn_stack``：
# 每個 node 來自哪個模組類別（或函式）。M00-3 會看到，
# 函式庫找模式的工具有 ``source_fn_stack`` 時就讀它，
# 沒有時改用 ``torch_fn`` 與 ``nn_module_stack``。

strict_gm = torch.export.export(model, (x,), strict=True).module()
for node in strict_gm.graph.nodes:
    if node.op != "call_function":
        continue
    name, source = node.meta["source_fn_stack"][-1]
    print(f"{node.name:11} source_fn_stack[-1]=({name!r}, {source.__name__})")
strict_conv = next(n for n in strict_gm.graph.nodes if n.name == "conv2d")
assert strict_conv.meta["source_fn_stack"][-1][1] is torch.nn.Conv2d, "strict 匯出記下模組類別"

# %%
# 小結
# ----
# ============================  ===========================================================
# 欄位                          在匯出的圖裡
# ============================  ===========================================================
# ``op``                        ``placeholder``、``get_attr``、``call_function``、
#                               ``output``；``call_module`` 只有 ``_guards_fn``；沒有
#                               ``call_method``
# ``target``                    ``aten.conv2d.default`` 這類 ``OpOverload``，其餘是字串
# ``args`` / ``kwargs``         node（圖的邊）與 Python 常數，依 schema 順序
# ``all_input_nodes``           args 裡的 node：上游
# ``users``                     讀這個 node 的 node：下游
# ``meta["val"]``               fake tensor：有形狀、dtype、device，沒有資料
# ``meta["nn_module_stack"]``   記錄當下所在的各層模組，最內層在最後
# ``meta["torch_fn"]``          被呼叫的 torch 函式（``source_fn_stack`` 要 ``strict=True``
#                               才有）
# ============================  ===========================================================
#
# quantizer 決定在哪裡量化，憑的就只是這些欄位。

# %%
# 練習
# ----
# 1. 匯出 ``linear_relu``。預測它有幾個 ``get_attr`` node、flatten node 的 ``target`` 是什麼，
#    以及 ``linear`` node 的 ``meta["val"]`` 形狀。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          lin = {n.name: n for n in export_module(get_model("linear_relu"), (x,)).graph.nodes}
#          assert [n.op for n in lin.values()].count("get_attr") == 2, "weight 與 bias"
#          assert lin["flatten"].target == torch.ops.aten.flatten.using_ints, "torch.flatten(x, 1)"
#          assert lin["linear"].meta["val"].shape == (2, 10), "批次 2，10 個輸出"
#
# 2. 再匯出一次 ``small_cnn``，這次讓批次大小是動態的：
#    ``dynamic_shapes=({0: torch.export.Dim("batch")},)``。預測 ``flatten`` 的
#    ``meta["val"]`` 形狀的第一個值：還是 ``x`` 的 2 嗎？``gm`` 和新的模組，哪個能跑批次大小
#    為 5 的輸入？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          batch = torch.export.Dim("batch")
#          dynamic = torch.export.export(model, (x,), dynamic_shapes=({0: batch},)).module()
#          flat = next(n for n in dynamic.graph.nodes if n.name == "flatten")
#          print(flat.meta["val"].shape)
#          assert isinstance(flat.meta["val"].shape[0], torch.SymInt), "是一個符號，不是 2"
#          calls = [n for n in dynamic.graph.nodes if n.op == "call_function"]
#          assert len({str(n.meta["val"].shape[0]) for n in calls}) == 1, "每個 node 都是同一個符號"
#          x5 = example_inputs(5)[0]
#          with torch.no_grad():
#              assert torch.equal(dynamic(x5), model(x5)), "動態的模組能跑批次大小 5"
#          with expect_error(AssertionError, match="Guard failed"):
#              gm(x5)  # gm 是以批次大小 2 匯出的，它的 _guards_fn 會檢查這一點
#
# 3. 預測 ``gm`` 的哪些 ``call_function`` node，``nn_module_stack`` 最內層的路徑是 ``bn``，
#    哪些是根模組 ``""``。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          def innermost_path(node):
#              return list(node.meta["nn_module_stack"].values())[-1][0]
#
#          from_bn = [n.name for n in calls if innermost_path(n) == "bn"]
#          from_root = [n.name for n in calls if innermost_path(n) == ""]
#          assert from_bn == ["batch_norm"] and from_root == ["flatten"], (from_bn, from_root)

# %%
# 延伸閱讀
# --------
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_：``Node`` 類別與它的欄位。
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_：它產生的 IR，
#   以及記在 node 上的中繼資料。
# - :ref:`疑難排解：匯入與匯出
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# :ref:`M00-3 · 找出模式 <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`
# 用這些欄位找出每一條 conv → batch norm → relu，先親手找，再用 quantizer 所用的函式庫工具找。
