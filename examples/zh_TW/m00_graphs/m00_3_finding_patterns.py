"""
M00-3 找出 pattern：conv → batch norm → relu
============================================

量化器在決定 quantize／dequantize node 放在哪裡之前，得先找出哪幾個 node 會合併成一個
fused kernel 執行，例如 conv → batch norm → relu。本課用三種方法找出每一條這樣的鏈：親手
走訪 ``graph.nodes`` 、用 ``get_source_partitions`` （依 node 來自的模組分組），以及用
``SubgraphMatcher`` （拿一張小的 pattern 圖逐個 node 比對）。三種方法找到的 node 完全相同，
而 torchao 的 ``X86InductorQuantizer`` 用的正是第二種。

**你會學到**

- 怎麼沿著 ``users`` 走訪圖，認出一串 ATen 運算子
- ``get_source_partitions`` 與 ``SubgraphMatcher`` 各自比對什麼，又有哪些陷阱
- 量化器為什麼透過 source partition 標註，以及這對改圖的 pass 有什麼要求

**先備知識**：:ref:`sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py` 。
"""

# %%
# 準備
# ----
# ``small_cnn`` 裡有一條 conv → batch norm → relu，後面接著不屬於任何鏈的 max pool、
# flatten 與 linear。

import copy
import inspect

import torch
import torch.nn.functional as F
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher
from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

from torchao.quantization.pt2e.graph_utils import find_sequential_partitions  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
)

CONV = torch.ops.aten.conv2d.default
BATCH_NORM = torch.ops.aten.batch_norm.default
RELU = torch.ops.aten.relu.default

x = example_inputs(2)[0]
gm = export_module(get_model("small_cnn"), (x,))
draw(gm, title="small_cnn：conv → batch norm → relu 在哪裡？")

# %%
# 步驟 1 — 親手走訪圖
# --------------------
# 從每個 ``aten.conv2d`` node 出發，沿著 ``users`` 往下游走：可有可無的 ``batch_norm`` ，
# 然後是 ``relu`` 。每一步都要求「只有一個」使用者：如果 conv 的輸出還有別人要讀，合併後的
# kernel 不會把這個中間結果寫出來，另一個讀者就拿不到它。


def only_user(node):
    """讀取 ``node`` 的唯一一個 node；沒有或有好幾個使用者時傳回 None。"""
    return next(iter(node.users)) if len(node.users) == 1 else None


def conv_chains(graph):
    """找出每一條 conv → relu 與 conv → batch norm → relu，以 node 名稱的 tuple 表示。"""
    chains = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target != CONV:
            continue
        chain, step = [node], only_user(node)
        if step is not None and step.target == BATCH_NORM:
            chain, step = [*chain, step], only_user(step)
        if step is not None and step.target == RELU:
            chains.append(tuple(n.name for n in [*chain, step]))
    return chains


by_hand = conv_chains(gm.graph)
print(by_hand)
assert by_hand == [("conv2d", "batch_norm", "relu")], "small_cnn 裡有一條鏈"
draw(gm, highlight=by_hand[0], title="步驟 1：親手找到的鏈")

# %%
# 對整個模型庫做同樣的走訪。預期的結果可以從模型的定義看出來：有兩個模型中間夾著
# batch norm，``conv_relu`` 沒有，``linear_relu`` 則根本沒有 conv。

expected = {
    "conv_relu": [("conv2d", "relu")],
    "conv_bn_relu": [("conv2d", "batch_norm", "relu")],
    "linear_relu": [],
    "small_cnn": [("conv2d", "batch_norm", "relu")],
}
graphs = {name: export_module(get_model(name), (x,)) for name in MODEL_NAMES}
for name, graph_module in graphs.items():
    print(f"{name:13} {conv_chains(graph_module.graph)}")
    assert conv_chains(graph_module.graph) == expected[name], name

# %%
# 步驟 2 — get_source_partitions：依模組把 node 分組
# --------------------------------------------------
# ``get_source_partitions(graph, wanted_sources)`` 把來自指定模組類別（或函數）的 node
# 分組成 ``SourcePartition`` ：組內的 node、餵資料給它們的 node（``input_nodes`` ）、結果
# 會流到組外的 node（``output_nodes`` ），以及 weight（``params`` ）。

partitions = get_source_partitions(gm.graph, [torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU])
for source, found in partitions.items():
    for p in found:
        print(f"{source.__name__:11} nodes={p.nodes} inputs={p.input_nodes} ", end="")
        print(f"outputs={p.output_nodes} params={p.params}")
assert [len(found) for found in partitions.values()] == [1, 1, 1], "每個類別各有一個模組"
assert partitions[torch.nn.Conv2d][0].nodes[0].name == "conv2d"

# %%
# 它怎麼知道的？M00-2 看過，預設的 export 不會留下 ``source_fn_stack`` 。這時
# ``get_source_partitions`` 改看 ``meta["torch_fn"]`` 與 ``meta["nn_module_stack"]`` 的
# 最內層，而且只看 ``call_function`` node。所以身為 ``get_attr`` node 的 weight 不在分組裡：
# 這裡的 ``params`` 是空的（用 ``strict=True`` 匯出的話就會列出它們）。

source_code = inspect.getsource(get_source_partitions)
assert "source_fn_stack" in source_code and "nn_module_stack" in source_code
assert all(not p.params for found in partitions.values() for p in found)

# %%
# 鏈就是前後相接的幾個分組。torchao 的 ``find_sequential_partitions`` 以
# ``get_source_partitions`` 為基礎：清單裡每個類別取一個分組，每組都接到下一組。用兩份清單
# 涵蓋兩種鏈，它在每個模型上找到的 node 都和親手走訪的一樣。


def chains_from_partitions(graph_module):
    """torchao 的 find_sequential_partitions 找到的鏈，以 node 名稱的 tuple 表示。"""
    chains = []
    for types in (
        [torch.nn.Conv2d, torch.nn.ReLU],
        [torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU],
    ):
        for fused in find_sequential_partitions(graph_module, types):
            chains.append(tuple(p.output_nodes[0].name for p in fused))
    return chains


for name, graph_module in graphs.items():
    print(f"{name:13} {chains_from_partitions(graph_module)}")
    assert chains_from_partitions(graph_module) == conv_chains(graph_module.graph), name

# %%
# 步驟 3 — SubgraphMatcher：拿 pattern 圖逐個 node 比對
# ------------------------------------------------------
# ``SubgraphMatcher`` 拿一張 pattern「圖」，找出圖中哪裡出現同樣的運算子、以同樣的方式相連。
# pattern 由一個小模組匯出而來（範例輸入只有形狀有意義，數值無關緊要），並且取
# ``ExportedProgram`` 的圖（M00-1）：它的輸入都是 placeholder，也沒有 ``_guards_fn`` 。


class ConvBatchNormReLU(torch.nn.Module):
    """pattern：每個 tensor 都是輸入，所以能代表任何一組 conv 與 batch norm。"""

    def forward(self, x, weight, bias, bn_weight, bn_bias, mean, var):
        y = F.conv2d(x, weight, bias)
        y = F.batch_norm(y, mean, var, bn_weight, bn_bias, training=False)
        return F.relu(y)


pattern_args = (torch.ones(1, 3, 4, 4), torch.ones(2, 3, 1, 1), *(torch.ones(2) for _ in range(5)))
pattern = torch.export.export(ConvBatchNormReLU(), pattern_args).graph_module
draw(pattern, title="pattern 圖")

# %%
# 直接比對什麼都找不到：matcher 連常數參數也會比較。pattern 的 conv 用預設的 padding
# ``[0, 0]`` ，模型的 conv 卻是 padding 1。``ignore_literals=True`` 把常數當成萬用字元；
# pattern 的 placeholder 本來就能配上任何東西，所以 ``weight`` 配到的是模型的 ``get_attr``
# node ``conv_weight`` 。

strict_matches = SubgraphMatcher(pattern.graph).match(gm.graph)
matches = SubgraphMatcher(pattern.graph, ignore_literals=True).match(gm.graph)
print(f"ignore_literals=False：{len(strict_matches)} 處；True：{len(matches)} 處")
mapped = {p.name: g.name for p, g in matches[0].nodes_map.items()}
print(mapped)
assert not strict_matches and len(matches) == 1
assert mapped["weight"] == "conv_weight" and mapped["relu"] == "relu"

# %%
# 配到的 call_function node，正是親手找到的那條鏈：

matched = tuple(g.name for p, g in matches[0].nodes_map.items() if p.op == "call_function")
assert tuple(sorted(matched)) == tuple(sorted(by_hand[0])), matched
draw(gm, highlight=matched, title="步驟 3：SubgraphMatcher 找到的鏈")

# %%
# 步驟 4 — 量化器為什麼透過 source partition 標註
# ------------------------------------------------
# 量化器是以模組為單位思考的：「每個後面接著 ``ReLU`` 的 ``Conv2d`` 都要量化」。不論模組
# 變成了哪些 ATen 運算子與常數，source partition 都能直接回答這個問題；親手走訪或 pattern
# 圖則得把每個運算子、overload 和常數一一寫出來。torchao 的 ``X86InductorQuantizer`` 用
# ``find_sequential_partitions`` 找 conv → relu，用 ``get_source_partitions`` 找單獨的 conv：

unary = inspect.getsource(X86InductorQuantizer._annotate_conv2d_unary)
single = inspect.getsource(X86InductorQuantizer._annotate_conv2d)
print([line.strip() for line in unary.splitlines() if "[torch.nn.Conv2d, torch.nn.ReLU]" in line])
assert "find_sequential_partitions(gm, unary_pattern)" in unary
assert "get_source_partitions(" in single

# %%
# 代價是一切都建立在 ``meta`` 上。替換 node 卻沒有複製 ``meta`` 的 pass，會讓新 node 在
# source partition 眼中消失。下面用 M00-4 的做法，把 ``relu`` 換成一個一模一樣的新
# ``aten.relu`` node：親手走訪仍然找得到這條鏈，分組卻找不到了。

edited = copy.deepcopy(gm)
old_relu = next(n for n in edited.graph.nodes if n.name == "relu")
with edited.graph.inserting_after(old_relu):
    new_relu = edited.graph.call_function(RELU, old_relu.args)
old_relu.replace_all_uses_with(new_relu)
edited.graph.erase_node(old_relu)
edited.recompile()
print(f"親手走訪：{conv_chains(edited.graph)}   分組：{chains_from_partitions(edited)}")
assert conv_chains(edited.graph) == [("conv2d", "batch_norm", new_relu.name)]
assert chains_from_partitions(edited) == [], "新的 relu 沒有 nn_module_stack"

# %%
# 把舊 node 的 ``meta`` 複製到新 node 上，它就又看得見了。改寫 node 的 pass 都應該把
# ``meta`` 一併帶過去；M02 親手寫的 pass 也會這麼做。

new_relu.meta = dict(old_relu.meta)
assert chains_from_partitions(edited) == [("conv2d", "batch_norm", new_relu.name)]

# %%
# 小結
# ----
# ==========================  =================================================================
# 方法                        比對的依據
# ==========================  =================================================================
# 走訪 ``graph.nodes``        ``target`` 與 ``users`` ：精確，但每個運算子都得自己寫出來
# ``get_source_partitions``   node 來自哪個模組或函數（``meta`` ）；量化器用的就是它，
#                             所以改圖時要保留 ``meta``
# ``SubgraphMatcher``         pattern 圖：運算子、連接方式，以及常數（除非
#                             ``ignore_literals=True`` ）
# ==========================  =================================================================
#
# 讀圖到此為止。下一課 :ref:`sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py` 開始改圖：
# 像 ``prepare_pt2e`` 和 ``convert_pt2e`` 那樣插入、改接、刪除 node。
