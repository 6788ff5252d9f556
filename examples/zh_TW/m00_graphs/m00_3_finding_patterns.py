"""
M00-3 找出模式：conv → batch norm → relu
============================================

quantizer 在決定 quantize／dequantize node 放在哪裡之前，
得先找出哪幾個 node 會融合成一個 kernel 執行，例如 conv → relu。
本課用三種方法，找出匯出的圖裡每一條 conv →（batch norm →）relu：
親手走訪 ``graph.nodes``、用 ``get_source_partitions`` （依 node 來自的模組分組），
以及用 ``SubgraphMatcher`` （拿一張小的模式圖逐個 node 比對）。
三種方法找到的 node 完全相同，而 torchao 的 ``X86InductorQuantizer`` 用的正是第二種。
接著再看 quantizer 實際拿到的是哪一張圖：做訓練後量化（PTQ）時，batch norm 早已折疊進 conv。

**你會學到**

- 怎麼沿著 ``users`` 走訪圖，認出一串 ATen 運算子
- ``get_source_partitions`` 與 ``SubgraphMatcher`` 各自比對什麼，又有哪些陷阱
- quantizer 拿到的是什麼圖，以及為什麼有的 quantizer 比對模組、有的比對 ATen target

**先備知識**：:ref:`M00-2 · 拆解一個 node <sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# ``small_cnn`` 裡有一條 conv → batch norm → relu，
# 後面接著不屬於任何鏈的 max pool、flatten 與 linear。

import copy
import inspect

import torch
import torch.nn.functional as F
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher
from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.graph_utils import find_sequential_partitions
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

from common.quantizer import CourseQuantizer

CONV = torch.ops.aten.conv2d.default
BATCH_NORM = torch.ops.aten.batch_norm.default
RELU = torch.ops.aten.relu.default

x = example_inputs(2)[0]
gm = export_module(get_model("small_cnn"), (x,))
draw(gm, title="small_cnn：conv → batch norm → relu 在哪裡？")

# %%
# 步驟 5 與 6 會用到兩個類別：一個什麼都不標註、只把拿到的圖複製一份留下來的 quantizer，
# 以及一個呼叫函式而不是模組的模型。


class SeenByAnnotate(Quantizer):
    """什麼都不標註；把 ``annotate`` 拿到的圖複製一份留下來。"""

    def annotate(self, model):
        self.graph_module = copy.deepcopy(model)
        return model

    def validate(self, model):
        pass

    def ops(self):
        """拿到的 call_function target，依圖的順序排列。"""
        return [str(n.target) for n in self.graph_module.graph.nodes if n.op == "call_function"]


class FunctionalConvReLU(torch.nn.Module):
    """用 torch.nn.functional 的函式、而不是 submodule 寫成的 conv → relu。"""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8, 3, 3, 3))  # 這裡用不到數值

    def forward(self, x):
        return F.relu(F.conv2d(x, self.weight, padding=1))


# %%
# 步驟 1 — 親手走訪圖
# --------------------
# 從每個 ``aten.conv2d`` node 出發，沿著 ``users`` 往下游走：
# 可有可無的 ``batch_norm``，然後是 ``relu``。每一步都要求「只有一個」使用者：
# 如果 conv 的輸出還有別人要讀，合併後的 kernel 不會把這個中間結果寫出來，另一個讀者就拿不到它。


def only_user(node):
    """讀取 ``node`` 的唯一一個 node；沒有或有好幾個使用者時回傳 None。"""
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
# 對整個模型庫做同樣的走訪。預期的結果可以從模型的定義看出來：
# 有兩個模型中間夾著 batch norm，``conv_relu`` 沒有，``linear_relu`` 則根本沒有 conv。

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
# ``get_source_partitions(graph, wanted_sources)`` 把來自指定模組類別（或函式）的 node
# 分組成 ``SourcePartition``：組內的 node、餵資料給它們的 node（``input_nodes``）、
# 結果會流到組外的 node（``output_nodes``），以及 weight（``params``）。

partitions = get_source_partitions(gm.graph, [torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU])
for source, found in partitions.items():
    for p in found:
        print(f"{source.__name__:11} nodes={p.nodes} inputs={p.input_nodes} ", end="")
        print(f"outputs={p.output_nodes} params={p.params}")
assert [len(found) for found in partitions.values()] == [1, 1, 1], "每個類別各有一個模組"
assert partitions[torch.nn.Conv2d][0].nodes[0].name == "conv2d", "conv 的分組：conv2d"

# %%
# 它怎麼知道的？M00-2 看過，預設的 export 不會留下 ``source_fn_stack``。
# 這時 ``get_source_partitions`` 改看 ``meta["torch_fn"]`` 與 ``meta["nn_module_stack"]`` 的最內層，
# 而且只看 ``call_function`` node。所以身為 ``get_attr`` node 的 weight 不在分組裡：
# 這裡的 ``params`` 是空的（用 ``strict=True`` 匯出的話就會列出它們）。

source_code = inspect.getsource(get_source_partitions)
assert "torch_fn" in source_code and "nn_module_stack" in source_code, "兩個備用來源"
assert all(not p.params for found in partitions.values() for p in found), "params 是空的"

# %%
# 鏈就是前後相接的幾個分組。
# torchao 的 ``find_sequential_partitions`` 以 ``get_source_partitions`` 為基礎：
# 清單裡每個類別取一個分組，每組都接到下一組。
# 用兩份清單涵蓋兩種鏈，它在每個模型上找到的 node 都和親手走訪的一樣。


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
# 步驟 3 — SubgraphMatcher：拿模式圖逐個 node 比對
# ------------------------------------------------------
# ``SubgraphMatcher`` 拿一張模式「圖」，找出圖中哪裡出現同樣的運算子、以同樣的方式相連。
# 模式圖由一個小模組匯出而來（範例輸入只有形狀有意義，數值無關緊要），
# 並且取 ``ExportedProgram`` 的圖（M00-1）：它的輸入都是 placeholder，也沒有 ``_guards_fn``。


class ConvBatchNormReLU(torch.nn.Module):
    """模式：每個張量都是輸入，所以能代表任何一組 conv 與 batch norm。"""

    def forward(self, x, weight, bias, bn_weight, bn_bias, mean, var):
        y = F.conv2d(x, weight, bias)
        y = F.batch_norm(y, mean, var, bn_weight, bn_bias, training=False)
        return F.relu(y)


pattern_args = (torch.ones(1, 3, 4, 4), torch.ones(2, 3, 1, 1), *(torch.ones(2) for _ in range(5)))
pattern = torch.export.export(ConvBatchNormReLU(), pattern_args).graph_module
draw(pattern, title="pattern 圖")

# %%
# 直接比對什麼都找不到：matcher 連常數引數也會比較。
# 模式的 conv 用預設的 padding ``[0, 0]``，模型的 conv 卻是 padding 1。
# ``ignore_literals=True`` 把常數當成萬用字元；模式的 placeholder 本來就能配上任何東西，
# 所以 ``weight`` 配到的是模型的 ``get_attr`` node ``conv_weight``。

strict_matches = SubgraphMatcher(pattern.graph).match(gm.graph)
matches = SubgraphMatcher(pattern.graph, ignore_literals=True).match(gm.graph)
print(f"ignore_literals=False：{len(strict_matches)} 處；True：{len(matches)} 處")
mapped = {p.name: g.name for p, g in matches[0].nodes_map.items()}
print(mapped)
assert not strict_matches and len(matches) == 1, "只有 ignore_literals=True 找得到這條鏈"
assert mapped["weight"] == "conv_weight", "pattern 的 placeholder 配到了 get_attr node"

# %%
# 配到的 call_function node，正是親手找到的那條鏈：

matched = tuple(g.name for p, g in matches[0].nodes_map.items() if p.op == "call_function")
assert tuple(sorted(matched)) == tuple(sorted(by_hand[0])), matched
draw(gm, highlight=matched, title="步驟 3：SubgraphMatcher 找到的鏈")

# %%
# 步驟 4 — quantizer 為什麼透過來源分割標註
# -------------------------------------------
# torchao 的 ``X86InductorQuantizer`` 以模組為單位思考：「每個後面接著 ``ReLU`` 的
# ``Conv2d`` 都要量化」。
# 不論模組變成了哪些 ATen 運算子與常數，來源分割（source partition）都能直接回答這個問題；
# 親手走訪或模式圖則得把每個運算子、overload 和常數一一寫出來。
# 它用 ``find_sequential_partitions`` 找 conv → relu，用 ``get_source_partitions`` 找單獨的 conv：

unary = inspect.getsource(X86InductorQuantizer._annotate_conv2d_unary)
single = inspect.getsource(X86InductorQuantizer._annotate_conv2d)
print([line.strip() for line in unary.splitlines() if "[torch.nn.Conv2d, torch.nn.ReLU]" in line])
assert "find_sequential_partitions(gm, unary_pattern)" in unary, "conv → relu：用分組找"
assert "get_source_partitions(" in single, "單獨的 conv：用分組找"

# %%
# 代價是一切都建立在 ``meta`` 上。替換 node 卻沒有複製 ``meta`` 的 pass，
# 會讓新 node 在來源分割裡消失。
# 下面用 M00-4 的做法，把 ``relu`` 換成一個一模一樣的新 ``aten.relu`` node：
# 親手走訪仍然找得到這條鏈，分組卻找不到了。

edited = copy.deepcopy(gm)
old_relu = next(n for n in edited.graph.nodes if n.name == "relu")
with edited.graph.inserting_after(old_relu):
    new_relu = edited.graph.call_function(RELU, old_relu.args)
old_relu.replace_all_uses_with(new_relu)
edited.graph.erase_node(old_relu)
edited.recompile()
print(f"親手走訪：{conv_chains(edited.graph)}   分組：{chains_from_partitions(edited)}")
assert conv_chains(edited.graph) == [("conv2d", "batch_norm", new_relu.name)], "仍然找得到"
assert chains_from_partitions(edited) == [], "新的 relu 沒有 nn_module_stack"

# %%
# 把舊 node 的 ``meta`` 複製到新 node 上，它就又看得見了。
# 改寫 node 的 pass 都應該把 ``meta`` 一併帶過去；M02 親手寫的 pass 也會這麼做。

new_relu.meta = dict(old_relu.meta)
found = chains_from_partitions(edited)
assert found == [("conv2d", "batch_norm", new_relu.name)], "有了 meta，分組又看得見它"

# %%
# 步驟 5 — quantizer 拿到的是什麼
# -------------------------------
# 前面的鏈都來自匯出的圖，但 quantizer 看到的並不是這張圖。
# 做訓練後量化時，``prepare_pt2e`` （M01-1）會先把每個 batch norm 折疊進它前面的 conv，
# 然後才呼叫 ``annotate``。``SeenByAnnotate`` 讓結果現形：quantizer 拿到的是 conv → relu。

ptq = SeenByAnnotate()
prepare_pt2e(export_module(get_model("conv_bn_relu"), (x,)), ptq)
print(f"annotate 拿到：{ptq.ops()}")
assert conv_chains(ptq.graph_module.graph) == [("conv2d", "relu")], "batch norm 已經折疊掉了"
draw(ptq.graph_module, highlight=["conv2d", "relu"], title="PTQ quantizer 拿到的圖")

# %%
# 量化感知訓練（QAT，M04-3）就不同了：``prepare_qat_pt2e`` 先標註、後折疊，
# 所以 QAT quantizer 看到的是 conv → batch norm → relu（``add_`` 是 batch norm 的批次計數器，
# 在 train 模式下才會動），
# 而 x86 quantizer 的 QAT 模式也都含有 ``BatchNorm2d``。
# 三個 node 的鏈在這裡才有意義；在 ``prepare`` 之前處理匯出圖的 pass（例如本課的）也是。

qat = SeenByAnnotate()
prepare_qat_pt2e(export_module(get_model("conv_bn_relu").train(), (x,)), qat)
print(f"annotate 拿到：{qat.ops()}")
assert conv_chains(qat.graph_module.graph) == [("conv2d", "batch_norm", "relu")], "QAT：還在"
qat_patterns = inspect.getsource(X86InductorQuantizer._annotate_qat_conv2d_bn_unary)
assert "torch.nn.BatchNorm2d" in qat_patterns, "x86 的 QAT pattern 含有 batch norm"

# %%
# 步驟 6 — 改比對 ATen target：本課程的 quantizer
# -----------------------------------------------
# 本課程自己的 ``CourseQuantizer`` （M02）走訪 ``graph.nodes``，比對 ATen target，和步驟 1 一樣。
# PTQ quantizer 拿到的是一個 conv 和它唯一的使用者 relu，用 target 就能描述得一清二楚；
# 而且 target 不依賴 ``meta``，也不管模型是怎麼寫的。

annotate_code = inspect.getsource(CourseQuantizer.annotate)
print([line.strip() for line in annotate_code.splitlines() if "node.target in" in line])
assert "node.target in _WEIGHTED_OPS" in annotate_code, "它比對的是 aten target"

# %%
# ``FunctionalConvReLU`` 呼叫的是 ``F.conv2d`` 與 ``F.relu``：
# ATen node 相同，卻沒有 ``Conv2d`` 模組。
# x86 quantizer 的分組找不到它們，所以什麼都沒標註；本課程的 quantizer 則兩個 node 都標註了。
# 反過來說，分組知道 node 來自哪個模組：要依模組類別或名稱設定量化方式，就少不了它。

annotated = {}
for quantizer in (x86_quantizer(), CourseQuantizer()):
    functional = export_module(FunctionalConvReLU(), (x,))
    quantizer.annotate(functional)
    marked = [n.name for n in functional.graph.nodes if "quantization_annotation" in n.meta]
    annotated[type(quantizer).__name__] = marked
print(annotated)
assert annotated["X86InductorQuantizer"] == [], "以模組為準的分組什麼都沒找到"
assert annotated["CourseQuantizer"] == ["conv2d", "relu"], "用 aten target 找到了 conv 與 relu"

# %%
# x86 quantizer 為什麼漏掉函式寫法的 conv：預設的 export 之後，
# ``get_source_partitions`` 只能用字串形式的函式名稱比對函式，
# 而 x86 quantizer 傳入的是函式 ``F.conv2d`` 本身。

assert not get_source_partitions(functional.graph, [F.conv2d]), "F.conv2d：找不到分組"
assert get_source_partitions(functional.graph, ["conv2d"]), "用字串 'conv2d'：找到了"

# %%
# 小結
# ----
# ==========================  =================================================================
# 方法                        比對的依據
# ==========================  =================================================================
# 走訪 ``graph.nodes``        ``target`` 與 ``users``：精確，但每個運算子都得自己寫出來
# ``get_source_partitions``   node 來自哪個模組或函式（``meta``）；x86 quantizer 用的就是它，
#                             所以改圖時要保留 ``meta``
# ``SubgraphMatcher``         模式圖：運算子、連接方式，以及常數（除非
#                             ``ignore_literals=True``）
# ==========================  =================================================================
#
# 做訓練後量化時，quantizer 拿到的是 conv → relu，batch norm 已經折疊掉了；
# conv → batch norm → relu 是 QAT quantizer 與 ``prepare`` 之前的 pass 才會看到的。

# %%
# 練習
# ----
# 1. 一個 conv 輸出被讀兩次的模型：``y = conv(x)``，回傳 ``relu(y) + y``。
#    預測 ``conv_chains`` 與 ``chains_from_partitions`` 各回傳什麼。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          class TwoReaders(torch.nn.Module):
#              def __init__(self):
#                  super().__init__()
#                  self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
#                  self.relu = torch.nn.ReLU()
#
#              def forward(self, x):
#                  y = self.conv(x)
#                  return self.relu(y) + y
#
#          two = export_module(TwoReaders(), (x,))
#          assert conv_chains(two.graph) == [], "親手走訪要求只有一個使用者"
#          assert chains_from_partitions(two) == [("conv2d", "relu")], "分組不檢查這一點"
#
# 2. 把 ``SeenByAnnotate`` 和 ``small_cnn`` 交給 ``prepare_pt2e``。
#    預測 ``annotate`` 拿到哪些運算子。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          seen = SeenByAnnotate()
#          prepare_pt2e(export_module(get_model("small_cnn"), (x,)), seen)
#          ops = ["conv2d", "relu", "max_pool2d", "flatten", "linear"]
#          assert [op.split(".")[1] for op in seen.ops()] == ops, "沒有 batch_norm：已折疊"
#
# 3. 照步驟 3 的做法，匯出一個 conv → relu 的模式（沒有 batch norm）。
#    預測 ``SubgraphMatcher(..., ignore_literals=True)`` 在每個模型裡各找到幾處。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          class ConvReLUPattern(torch.nn.Module):
#              def forward(self, x, weight, bias):
#                  return F.relu(F.conv2d(x, weight, bias))
#
#          args = (torch.ones(1, 3, 4, 4), torch.ones(2, 3, 1, 1), torch.ones(2))
#          conv_relu_pattern = torch.export.export(ConvReLUPattern(), args).graph_module
#          matcher = SubgraphMatcher(conv_relu_pattern.graph, ignore_literals=True)
#          counts = {name: len(matcher.match(g.graph)) for name, g in graphs.items()}
#          expected = {"conv_relu": 1, "conv_bn_relu": 0, "linear_relu": 0, "small_cnn": 0}
#          assert counts == expected, "中間夾著 batch norm 就配不上"

# %%
# 延伸閱讀
# --------
# - `torch.fx <https://docs.pytorch.org/docs/stable/fx.html>`_：
#   三種方法走訪的 ``Graph`` 與 ``Node``。
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_：
#   strict 與 non-strict 匯出，以及它們記在 node 上的中繼資料。
# - :ref:`疑難排解：prepare 與 convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`：同樣的錯誤，依錯誤訊息查
# - :ref:`疑難排解：匯入與匯出
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# 讀圖到此為止。下一課開始改圖：像 ``prepare_pt2e`` 和 ``convert_pt2e`` 那樣插入、改接、刪除 node，
# 見 :ref:`M00-4 · 改圖 <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`。
