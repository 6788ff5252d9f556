"""
M01-1 PT2E 全流程：export → prepare → 校準 → convert
=====================================================

用 PT2E 量化一個模型只要四個動作：``torch.export`` 取得圖；``prepare_pt2e`` 把 BatchNorm
折疊掉，並在 quantizer 要量化的每一條邊上插入 observer；餵幾批校準資料，讓 observer
記下統計值；最後 ``convert_pt2e`` 把每個 observer 換成一對 quantize／dequantize node，
scale 和 zero point 就由那些統計值算出來。得到的模型仍然用 float32 計算：它只是在「模擬」
int8。本課用 torchao 的 ``X86InductorQuantizer`` 在 ``small_cnn`` 上走完這四步，
畫出每一步對圖的改動，並清點 node。

**你會學到**

- 哪些邊會被插上 observer，以及為什麼一個 observer 可以同時掛在三條邊上
- ``convert_pt2e`` 怎麼把 observer 變成 q/dq node、量化後的輸出離浮點結果有多近，
  以及它為什麼比浮點模型還慢
- ``fold_quantize`` 會讓 convert 後的圖有什麼不同

**先備知識**：
:ref:`M00-4 · 改圖 <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`
（插入與替換 node）。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# 準備
# ----
# ``prepare_pt2e`` 和 ``convert_pt2e`` 來自 torchao，要從
# ``torchao.quantization.pt2e.quantize_pt2e`` 匯入。``x86_quantizer()`` 是公開的
# ``X86InductorQuantizer`` 加上預設的靜態量化設定；``calibrate`` 會餵進四批、每批八張的
# 固定影像。``Q`` 是 q/dq op 所在的命名空間。

import copy
from collections import Counter

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw, draw_diff

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
x = example_inputs(8)

# %%
# ``census`` 依角色清點圖裡的 node， ``is_observer`` 與 ``node_named`` 用來找 node。

from common.handmade import is_observer_node as is_observer
from common.pt2e import node_named


def census(gm):
    """清點 node 總數、observer 數，以及每一種 quantize／dequantize op 的數量。"""
    counts = Counter(nodes=len(gm.graph.nodes))
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", "").split(".")[0]
        if is_observer(gm, node):
            counts["observer"] += 1
        elif node.op == "call_function" and name.startswith(("quantize_per", "dequantize_per")):
            counts[name] += 1
    return counts


# %%
# 步驟 1 — 匯出浮點模型
# ----------------------
# 匯出的圖算出來的結果和 eager 模型一模一樣。匯出時用一批八張影像，和之後 ``calibrate``
# 餵的批次大小相同，因為 ``torch.export`` 會把批次大小記成 guard：四張一批就會被拒絕。

exported = export_module(model, x)
with torch.no_grad():
    reference = model(*x)
    assert torch.equal(exported(*x), reference), "同樣的 aten op，同樣的數字"
    with expect_error(AssertionError, match="Guard failed"):
        exported(*example_inputs(4))
stages = {"export": census(exported)}
draw(exported, highlight=["batch_norm"], title="步驟 1：匯出的浮點圖")

# %%
# 步驟 2 — prepare_pt2e：折疊 BatchNorm、插入 observer
# -----------------------------------------------------
# ``prepare_pt2e`` 會直接修改傳進去的圖，所以另外匯出一份給它，``exported`` 保持原樣。
# 圖上標出和 ``exported`` 相比改了哪些地方；虛線框、琥珀色的是 observer。

given = export_module(model, x)
prepared = prepare_pt2e(given, x86_quantizer())
assert prepared.graph is given.graph, "prepare_pt2e 改的就是傳進去的那張圖"
observers = [node for node in prepared.graph.nodes if is_observer(prepared, node)]
stages["prepare"] = census(prepared)
draw_diff(exported, prepared, title="步驟 2：prepare_pt2e 之後")

# %%
# 圖有兩處改變。BatchNorm 不見了：``batch_norm`` node，以及讀它參數和 buffer 的
# ``get_attr`` node 都被刪掉；而新加進來的 node，全部都是 observer。

before = {node.name for node in exported.graph.nodes}
after = {node.name for node in prepared.graph.nodes}
batch_norm_nodes = {
    node.name
    for node in exported.graph.nodes
    if node.name == "batch_norm" or str(node.target).startswith("bn.")
}
print(f"刪掉的：{sorted(before - after)}")
print(f"新增的：{sorted(after - before)}")
assert before - after == batch_norm_nodes, "prepare 刪掉的正好是 BatchNorm 的 node"
assert after - before == {node.name for node in observers}, "新增的只有 observer"

# %%
# BatchNorm 被併進 conv 裡了：``prepare_pt2e`` 把 conv 的 weight 和 bias 換成折疊後的值。
# 它用的是 ``torch.nn.utils.fusion.fuse_conv_bn_weights``，所以我們拿 eager 模型的參數
# 自己呼叫一次，得到的張量每個位元都相同。

bn = model.bn
weight, bias = fuse_conv_bn_weights(
    model.conv.weight, model.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
)
assert torch.equal(prepared.conv.weight, weight), "conv 的 weight 是折疊後的 weight"
assert torch.equal(prepared.conv.bias, bias), "conv 的 bias 是折疊後的 bias"
assert not torch.equal(prepared.conv.weight, model.conv.weight), "已經不是原本的 weight"

# %%
# 每個 observer 都掛在一條邊上：讀一個上游 node，也只被一個下游 node 讀。是哪些邊？
# ``conv2d`` 和 ``linear`` 要求輸入和 weight 都量化。``max_pool2d`` 和 ``flatten``
# 只是搬動數值，x86 quantizer 也把它們的輸入和輸出量化。這條規則預測出的邊，
# 和實際插了 observer 的邊完全一致：

wanted = set()
for node in exported.graph.nodes:
    if node.name in ("conv2d", "linear"):
        wanted |= {(node.args[0].name, node.name), (node.args[1].name, node.name)}
    if node.name in ("max_pool2d", "flatten"):
        wanted |= {(node.args[0].name, node.name)} | {(node.name, u.name) for u in node.users}
observed = set()
for obs in observers:
    (user,) = obs.users
    observed.add((obs.args[0].name, user.name))
    kind = type(prepared.get_submodule(obs.target)).__name__
    print(f"{obs.args[0].name:>12} → {obs.name} → {user.name:<10} {kind}")
assert observed == wanted and len(observers) == len(wanted), "每條要量化的邊各有一個 observer"

# %%
# 其他邊都沒有 observer：bias 維持浮點；``conv2d → relu`` 被當成一個融合的模式，
# 中間不插 observer；``linear`` 的輸出就是模型輸出，也維持浮點。

observed_sources = {source for source, _ in observed}
biases = {node_named(exported, name).args[2].name for name in ("conv2d", "linear")}
print(f"bias：{sorted(biases)}，被觀察的來源：{sorted(observed_sources)}")
assert not observed_sources & biases, "bias 上沒有 observer"
assert "conv2d" not in observed_sources, "conv2d 和 relu 之間沒有 observer"
assert "linear" not in observed_sources, "模型輸出上沒有 observer"

# %%
# observer node 有六個，observer 模組卻沒那麼多。``max_pool2d`` 和 ``flatten`` 不會產生輸入裡
# 沒有的數值，所以輸出沿用輸入的 scale 和 zero point：從 ``relu`` 到 ``linear`` 的三條邊由
# 同一個模組負責，只是掛在三個名字下。

modules = {obs.name: prepared.get_submodule(obs.target) for obs in observers}
chain = [
    modules[obs.name] for obs in observers if obs.args[0].name in ("relu", "max_pool2d", "flatten")
]
distinct = {id(module) for module in modules.values()}
print(f"observer node：{len(observers)} 個，不同的 observer 模組：{len(distinct)} 個")
assert len(chain) == 3 and chain[0] is chain[1] is chain[2], "三條邊共用一個模組"
assert len(distinct) == len(observers) - 2, "差的兩個就是共用造成的"

# %%
# 步驟 3 — 校準
# -------------
# observer 原封不動地把輸入傳下去，所以 prepare 後的模型算的仍是浮點結果。
# 但不是每個位元都相同：折疊後的 conv 和「conv 再接 BatchNorm」的捨入順序不同，
# 所以容許 1e-5 的誤差。執行 prepare 後的模型「本身就是」校準，因此這項檢查在副本上跑：
# ``prepared`` 的 observer 只能看到校準資料。

with torch.no_grad():
    observed_output = copy.deepcopy(prepared)(*x)
torch.testing.assert_close(
    observed_output,
    reference,
    rtol=0,
    atol=1e-5,
    msg="prepare 後的模型算出浮點結果，誤差在 1e-5 以內",
)
assert not torch.equal(observed_output, reference), "但不是每個位元都相同"
input_observer = modules[next(obs.name for obs in observers if obs.args[0].name == "x")]
print(f"校準前：min_val={input_observer.min_val}, max_val={input_observer.max_val}")
assert input_observer.min_val == float("inf"), "還沒看過資料的 observer，min 是 +inf"

# %%
# ``calibrate`` 依序餵進 ``example_inputs(8, seed=i)``，i = 0..3。輸入 ``x`` 上的
# observer 現在記著這 32 張影像的最小值和最大值，一點不差。

calibrate(prepared)
seen = torch.cat([example_inputs(8, seed=seed)[0] for seed in range(4)])
low, high = input_observer.min_val, input_observer.max_val
print(f"校準後：min_val={low:.6f}, max_val={high:.6f}")
assert torch.equal(input_observer.min_val, seen.min()), "所有校準影像的最小值"
assert torch.equal(input_observer.max_val, seen.max()), "所有校準影像的最大值"

# %%
# 步驟 4 — convert_pt2e：observer 變成 q/dq node
# -----------------------------------------------
# ``convert_pt2e`` 同樣會直接修改傳進去的圖；對副本做 convert，``prepared`` 才能留到
# 步驟 7。圖上標出和 ``prepared`` 相比改了哪些地方。紅色是 quantize node、綠色是
# dequantize node；per-tensor 的 node 會標出 scale 和 zero point。

to_convert = copy.deepcopy(prepared)
converted = convert_pt2e(to_convert)
assert converted.graph is to_convert.graph, "convert_pt2e 改的也是傳進去的那張圖"
stages["convert"] = census(converted)
draw_diff(prepared, converted, title="步驟 4：convert_pt2e 之後")

# %%
# 掛在活化值上的 observer，各自變成一對 ``quantize_per_tensor`` →
# ``dequantize_per_tensor``。掛在 weight 上的 observer 變成一個 ``dequantize_per_channel``，
# 它讀的是事先量化好的 int8 weight，另外多兩個 ``get_attr`` node 讀 per-channel 的
# scale 和 zero point。所以每個活化值 observer 讓圖多一個 node，每個 weight observer 多兩個。

on_weights = sum(obs.args[0].op == "get_attr" for obs in observers)
on_activations = len(observers) - on_weights
counts = stages["convert"]
print(dict(counts))
assert counts["observer"] == 0, "observer 一個都不剩"
assert counts["quantize_per_tensor"] == counts["dequantize_per_tensor"] == on_activations, (
    "每個活化值 observer 各變成一個 quantize_per_tensor 和一個 dequantize_per_tensor"
)
assert counts["dequantize_per_channel"] == on_weights and counts["quantize_per_channel"] == 0, (
    "每個 weight observer 變成一個 dequantize_per_channel，weight 不再有 quantize"
)
assert counts["nodes"] == stages["prepare"]["nodes"] + on_activations + 2 * on_weights, (
    "每個活化值 observer 多一個 node，每個 weight observer 多兩個"
)

# %%
# 步驟 5 — 量化後的模型離浮點有多近？
# -----------------------------------
# 換一批 observer 沒看過的資料，量化模型的輸出和浮點模型不同，差別來自 q/dq 帶進來的捨入。
# 用兩把尺來量：一是相對誤差 ``‖got − expected‖ / ‖expected‖`` 和對應的 SQNR，
# 也就是它的 ``−20·log10``，單位是分貝（越高越好；40 dB 就是 1%）；
# 二是最大差距換算成輸出自己的 8 位元刻度，輸出範圍除以 255 算一格。
# 每個活化值和 weight 都被捨入到各自的刻度上，這些小誤差經過 conv 和 linear 累加起來：
# 這裡斷言的界線是 30 dB 和 3 格。

test = example_inputs(8, seed=100)
with torch.no_grad():
    expected, got = model(*test), converted(*test)
relative = (got - expected).norm() / expected.norm()
sqnr = -20 * torch.log10(relative)
step = (expected.max() - expected.min()) / 255
error = (got - expected).abs().max()
print(f"相對誤差 {relative:.4f}，SQNR {sqnr:.1f} dB")
print(f"輸出範圍 {expected.min():.4f}..{expected.max():.4f}，一格 = {step:.5f}")
print(f"最大差距 = {error:.5f} = {error / step:.2f} 格")
assert not torch.equal(got, expected), "量化確實改變了數值"
assert sqnr >= 30, "SQNR 在 30 dB 以上"
assert error <= 3 * step, "每個輸出的變動都不超過它 8 位元刻度的 3 格"

# %%
# 步驟 6 — convert 後的模型只是在模擬 int8
# ----------------------------------------
# convert 後的圖裡，沒有任何運算是用 int8 做的。``conv2d`` 和 ``linear`` 還是原本那些
# float32 的 aten op；它們讀的是 dequantize node 的輸出，也就是剛好落在 8 位元刻度上的
# float32 數值。

for name in ("conv2d", "linear"):
    node = node_named(converted, name)
    inputs = [arg.target.__name__.split(".")[0] for arg in node.args[:2]]
    print(f"{node.target.__name__} 讀 {inputs}，輸出 {node.meta['val'].dtype}")
    dequantizes = (Q.dequantize_per_tensor.default, Q.dequantize_per_channel.default)
    assert all(arg.target in dequantizes for arg in node.args[:2]), "它讀的是 dequantize 後的值"
    assert node.meta["val"].dtype == torch.float32, "用 float32 計算"

# %%
# 所以 convert 後的模型除了原本所有的浮點運算，還要多做每一次 quantize 和 dequantize：
# 它比浮點模型「更慢」，不是更快。 ``compare_speed`` 讓兩者交錯計時 50 輪（批次大小 8），
# 在核心數不超過兩個的機器上只用一個執行緒，並印出中位數與離散程度、執行緒數量、平均負載，
# 以及 CPU 的 int8 判定——都是建置本頁當時量到的；計時只印出，從不 assert。真正的 int8
# kernel 要等把圖 lowering 之後才會用上，這是
# :ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>` 的主題。

timings = compare_speed({"浮點模型": model, "convert 後模型": converted}, test, rounds=50)
print(timings.table())
slower = timings.ratio("convert 後模型", "浮點模型")
print(f"convert 後模型花的時間是浮點模型的 {slower:.1f} 倍")

# %%
# 步驟 7 — fold_quantize
# ----------------------
# 預設的 ``fold_quantize=True`` 會在 convert 當下就把每個 weight 的 ``quantize_per_channel``
# 算一次，存下 int8 結果；``fold_quantize=False`` 則讓圖保留浮點 weight，每次執行都重新量化。
# 用同一組校準好的 observer 再 convert 一次，圖上標出和步驟 4 預設的圖不同之處：

unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)
stages["fold=False"] = census(unfolded)
draw_diff(converted, unfolded, title="步驟 7：convert_pt2e(..., fold_quantize=False)")

# %%
# 沒折疊的圖每個 weight 各有一個 ``quantize_per_channel``，讀的是浮點 weight；
# 折疊的圖改讀 int8 常數，只佔四分之一的位元組。折疊下來的常數正是那個 node 會算出的值，
# 所以兩張圖的輸出每個位元都相同。

conv_dq = node_named(converted, "conv2d").args[1]
folded_weight = getattr(converted, conv_dq.args[0].target)
print(f"fold_quantize=False：{unfolded.conv.weight.dtype}，{unfolded.conv.weight.nbytes} 位元組")
print(f"fold_quantize=True： {folded_weight.dtype}，{folded_weight.nbytes} 位元組")
assert stages["fold=False"]["quantize_per_channel"] == on_weights, "每個 weight 一個 quantize"
assert stages["fold=False"]["nodes"] == stages["convert"]["nodes"] + on_weights, (
    "每個 weight 多一個 node"
)
assert folded_weight.dtype == torch.int8, "折疊後的 weight 是 int8"
assert folded_weight.nbytes * 4 == unfolded.conv.weight.nbytes, "位元組只有四分之一"
with torch.no_grad():
    assert torch.equal(unfolded(*test), got), "折疊改變的是在哪裡算，不是算出什麼"

# %%
# 小結
# ----
# 每個階段的 node 數（由 ``census`` 清點）：

columns = {
    "nodes": "nodes",
    "observer": "obs",
    "quantize_per_tensor": "q",
    "dequantize_per_tensor": "dq",
    "quantize_per_channel": "q/ch",
    "dequantize_per_channel": "dq/ch",
}
print(f"{'階段':<8}" + "".join(f"{label:>7}" for label in columns.values()))
for stage, counts in stages.items():
    print(f"{stage:<10}" + "".join(f"{counts[key]:>7}" for key in columns))

# %%
# PT2E 就是 export → ``prepare_pt2e`` （折疊 BatchNorm，每條要量化的邊一個 observer）→
# 校準（observer 記下統計值）→ ``convert_pt2e`` （observer 變成 q/dq node，weight 變成
# int8 常數）。convert 後的模型是用 float32 模擬 int8：離浮點模型很近（這裡約 40 dB），
# 卻比它慢，要等 lowering（M03）之後才會變快。
#
# 練習
# ----
# 1. 改用 ``conv_bn_relu`` （conv → BatchNorm → relu，後面沒有別的）走一遍同樣的流程。
#    用步驟 2 和步驟 4 的規則預測：哪些邊會有 observer？``convert_pt2e`` 會多出幾個 node？
#
#    .. dropdown:: 解答
#
#       只有 ``conv2d`` 要求量化的輸入：它的輸入 ``x`` 和它的 weight。relu 的輸出就是模型輸出，
#       維持浮點。一個活化值 observer 多一個 node，一個 weight observer 多兩個。
#
#       .. code-block:: python
#
#          small = get_model("conv_bn_relu")
#          small_prepared = prepare_pt2e(export_module(small, x), x86_quantizer())
#          small_observers = [
#              n for n in small_prepared.graph.nodes if is_observer(small_prepared, n)
#          ]
#          edges = {(n.args[0].name, next(iter(n.users)).name) for n in small_observers}
#          print(sorted(edges))
#          assert edges == {("x", "conv2d"), ("conv_weight", "conv2d")}, "只有輸入和 weight"
#          calibrate(small_prepared)
#          nodes_before = len(small_prepared.graph.nodes)
#          small_converted = convert_pt2e(small_prepared)
#          assert len(small_converted.graph.nodes) == nodes_before + 1 + 2, "多一個加兩個 node"
#
# 2. 重新 prepare 一個 ``small_cnn``，校準時只餵一批而不是四批
#    （``calibrate(..., batches=1)``）。預測輸入上那個 observer 的 ``min_val`` 和 ``max_val``。
#
#    .. dropdown:: 解答
#
#       就是那一批 ``example_inputs(8, seed=0)`` 的最小值和最大值：observer 如實記下它看過的資料，
#       範圍不會比餵四批時更寬。
#
#       .. code-block:: python
#
#          once = prepare_pt2e(export_module(model, x), x86_quantizer())
#          calibrate(once, batches=1)
#          observer = next(
#              once.get_submodule(n.target)
#              for n in once.graph.nodes
#              if is_observer(once, n) and n.args[0].name == "x"
#          )
#          batch = example_inputs(8, seed=0)[0]
#          print(f"{observer.min_val:.6f}..{observer.max_val:.6f}")
#          assert torch.equal(observer.min_val, batch.min()), "那一批的最小值"
#          assert torch.equal(observer.max_val, batch.max()), "那一批的最大值"
#          assert observer.min_val >= input_observer.min_val, "不比餵四批時更寬"
#
# 延伸閱讀
# --------
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `PyTorch 2 Export 訓練後量化（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_ptq.html>`_
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_
# - :ref:`疑難排解：匯入與匯出
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# 下一課讀出這些 q/dq node 裡的數字，並親手算一遍：
# :ref:`M01-2 · q/dq node 和裡面的數字
# <sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`。
