"""
M01-1 PT2E 全流程：export → prepare → 校準 → convert
=====================================================

用 PT2E 量化一個模型只要四個動作：``torch.export`` 取得圖；``prepare_pt2e`` 把 BatchNorm
折疊掉，並在 quantizer 要量化的每一條邊上插入 observer（觀察器）；餵幾批校準資料，讓 observer
記下統計值；最後 ``convert_pt2e`` 把每個 observer 換成一對 quantize／dequantize 節點，
scale 和 zero point 就由那些統計值算出來。本課用 torchao 的 ``X86InductorQuantizer`` 在
``small_cnn`` 上走完這四步，每一步都畫圖、數節點。

**你會學到**

- 哪些邊會被插上 observer，以及為什麼一個 observer 可以同時掛在三條邊上
- ``convert_pt2e`` 怎麼把 observer 變成 q/dq 節點，量化後的輸出離浮點結果有多近
- ``fold_quantize`` 會讓 convert 後的圖有什麼不同

**先備知識**：M00-4（插入與替換 node）。
"""

# %%
# 準備
# ----
# PT2E 現在住在 torchao 裡：``prepare_pt2e`` 和 ``convert_pt2e`` 要從
# ``torchao.quantization.pt2e.quantize_pt2e`` 匯入。``x86_quantizer()`` 是公開的
# ``X86InductorQuantizer`` 加上預設的靜態量化設定；``calibrate`` 會餵進四批、每批八張的固定
# 圖片。``census`` 依角色清點圖裡的節點。

import copy
from collections import Counter

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.observer import ObserverBase  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402


def is_observer(gm, node):
    """call_module 節點、而且呼叫的模組是 observer 時為 True。"""
    return node.op == "call_module" and isinstance(gm.get_submodule(node.target), ObserverBase)


def census(gm):
    """清點節點總數、observer 數，以及每一種 quantize／dequantize op 的數量。"""
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
# 匯出時用一批八張圖片，和之後 ``calibrate`` 餵的批次大小一樣：``torch.export`` 會把
# batch 大小記成 guard。匯出的圖算出來的結果和 eager 模型一模一樣。

model = get_model("small_cnn")
x = example_inputs(8)
exported = export_module(model, x)
with torch.no_grad():
    reference = model(*x)
    assert torch.equal(exported(*x), reference), "同樣的 aten op，同樣的數字"
stages = {"exported": census(exported)}
draw(exported, highlight=["batch_norm"], title="步驟 1：匯出的浮點圖")

# %%
# 步驟 2 — prepare_pt2e：折疊 BatchNorm、插入 observer
# -----------------------------------------------------
# ``prepare_pt2e`` 會直接修改傳進去的圖，所以另外匯出一份給它，``exported`` 保持原樣。
# 圖中虛線框、琥珀色的就是 observer。

prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
observers = [node for node in prepared.graph.nodes if is_observer(prepared, node)]
stages["prepared"] = census(prepared)
draw(prepared, highlight=[node.name for node in observers], title="步驟 2：prepare_pt2e 之後")

# %%
# 圖有兩處改變。BatchNorm 不見了：``batch_norm`` 節點，以及讀它參數和 buffer 的
# ``get_attr`` 節點都被刪掉；而新加進來的節點，全部都是 observer。

before = {node.name for node in exported.graph.nodes}
after = {node.name for node in prepared.graph.nodes}
batch_norm_nodes = {
    node.name
    for node in exported.graph.nodes
    if node.name == "batch_norm" or str(node.target).startswith("bn.")
}
print(f"刪掉的：{sorted(before - after)}")
print(f"新增的：{sorted(after - before)}")
assert before - after == batch_norm_nodes, "prepare 刪掉的正好是 BatchNorm 的節點"
assert after - before == {node.name for node in observers}, "新增的只有 observer"

# %%
# BatchNorm 被併進 conv 裡了：``prepare_pt2e`` 把 conv 的 weight 和 bias 換成折疊後的值。
# 它用的是 ``torch.nn.utils.fusion.fuse_conv_bn_weights``，所以我們拿 eager 模型的參數
# 自己呼叫一次，得到的 tensor 每個位元都相同。

bn = model.bn
weight, bias = fuse_conv_bn_weights(
    model.conv.weight, model.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
)
assert torch.equal(prepared.conv.weight, weight), "conv 的 weight 是折疊後的 weight"
assert torch.equal(prepared.conv.bias, bias), "conv 的 bias 是折疊後的 bias"
assert not torch.equal(prepared.conv.weight, model.conv.weight), "已經不是原本的 weight"

# %%
# 每個 observer 都掛在一條邊上：讀一個上游節點，也只被一個下游節點讀。是哪些邊？
# ``conv2d`` 和 ``linear`` 要求輸入和 weight 都量化（bias 維持浮點）；``max_pool2d`` 和
# ``flatten`` 只是搬動數值，x86 quantizer 也把它們的輸入和輸出量化。除此之外都不量化：
# ``linear`` 的輸出就是模型輸出，維持浮點；``conv2d → relu`` 被當成一個融合的 pattern，
# 中間不插 observer。把這條規則套在匯出的圖上，預測出來的邊和實際插了 observer 的邊完全一致。

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
# observer 節點有六個，observer 模組卻沒那麼多。``max_pool2d`` 和 ``flatten`` 不會產生輸入裡
# 沒有的數值，所以輸出沿用輸入的 scale 和 zero point：從 ``relu`` 到 ``linear`` 的三條邊由
# 同一個模組負責，只是掛在三個名字下。

modules = {obs.name: prepared.get_submodule(obs.target) for obs in observers}
chain = [
    modules[obs.name] for obs in observers if obs.args[0].name in ("relu", "max_pool2d", "flatten")
]
distinct = {id(module) for module in modules.values()}
print(f"observer 節點：{len(observers)} 個，不同的 observer 模組：{len(distinct)} 個")
assert len(chain) == 3 and chain[0] is chain[1] is chain[2], "三條邊共用一個模組"
assert len(distinct) == len(observers) - 2, "差的兩個就是共用造成的"

# %%
# 步驟 3 — 校準
# -------------
# observer 原封不動地把輸入傳下去，所以 prepare 後的模型算的仍是浮點結果。但不是每個位元
# 都相同：折疊後的 conv 和「conv 再接 BatchNorm」的捨入順序不同，所以容許 1e-5 的誤差。
# 執行 prepare 後的模型「本身就是」校準，因此這項檢查在副本上跑：``prepared`` 的 observer
# 只能看到校準資料。

with torch.no_grad():
    torch.testing.assert_close(copy.deepcopy(prepared)(*x), reference, rtol=0, atol=1e-5)
input_observer = modules[next(obs.name for obs in observers if obs.args[0].name == "x")]
print(f"校準前：min_val={input_observer.min_val}, max_val={input_observer.max_val}")
assert input_observer.min_val == float("inf"), "還沒看過資料的 observer，min 是 +inf"

# %%
# ``calibrate`` 依序餵進 ``example_inputs(8, seed=i)``，i = 0..3。輸入 ``x`` 上的
# observer 現在記著這 32 張圖片的最小值和最大值，一點不差。

calibrate(prepared)
seen = torch.cat([example_inputs(8, seed=seed)[0] for seed in range(4)])
low, high = input_observer.min_val, input_observer.max_val
print(f"校準後：min_val={low:.6f}, max_val={high:.6f}")
assert torch.equal(input_observer.min_val, seen.min()), "所有校準圖片的最小值"
assert torch.equal(input_observer.max_val, seen.max()), "所有校準圖片的最大值"

# %%
# 步驟 4 — convert_pt2e：observer 變成 q/dq 節點對
# -------------------------------------------------
# ``convert_pt2e`` 同樣會原地修改輸入；對副本做 convert，``prepared`` 才能留到步驟 6。
# 紅色是 quantize 節點、綠色是 dequantize 節點；per-tensor 的節點會標出 scale 和 zero point。

converted = convert_pt2e(copy.deepcopy(prepared))
qdq = [
    node.name for node in converted.graph.nodes if node.name.startswith(("quantize", "dequantize"))
]
stages["converted"] = census(converted)
draw(converted, highlight=qdq, title="步驟 4：convert_pt2e 之後")

# %%
# 掛在 activation 上的 observer，各自變成一對 ``quantize_per_tensor`` →
# ``dequantize_per_tensor``。掛在 weight 上的 observer 變成一個 ``dequantize_per_channel``，
# 它讀的是事先量化好的 int8 weight，另外多兩個 ``get_attr`` 節點讀 per-channel 的 scale 和
# zero point。所以每個 activation observer 讓圖多一個節點，每個 weight observer 多兩個。

on_weights = sum(obs.args[0].op == "get_attr" for obs in observers)
on_activations = len(observers) - on_weights
counts = stages["converted"]
print(dict(counts))
assert counts["observer"] == 0, "observer 一個都不剩"
assert counts["quantize_per_tensor"] == counts["dequantize_per_tensor"] == on_activations
assert counts["dequantize_per_channel"] == on_weights and counts["quantize_per_channel"] == 0
assert counts["nodes"] == stages["prepared"]["nodes"] + on_activations + 2 * on_weights

# %%
# 步驟 5 — 量化後的模型離浮點有多近？
# -----------------------------------
# 換一批 observer 沒看過的資料，量化模型的輸出和浮點模型不同，差別只來自 q/dq 帶進來的捨入。
# 用輸出自己的 8 位元刻度來量：輸出範圍除以 255 算一格。每個 activation 和 weight 都被捨入到
# 各自的刻度上（超出範圍的還會被截斷），這些小誤差經過 conv 和 linear 累加起來，差個幾格是
# 預期中的事。這裡斷言的上限是 3 格。

test = example_inputs(8, seed=100)
with torch.no_grad():
    expected, got = model(*test), converted(*test)
step = (expected.max() - expected.min()) / 255
error = (got - expected).abs().max()
print(f"輸出範圍 {expected.min():.4f}..{expected.max():.4f}，一格 = {step:.5f}")
print(f"最大差距 = {error:.5f} = {error / step:.2f} 格")
assert not torch.equal(got, expected), "量化確實改變了數值"
assert error <= 3 * step, "但不超過輸出 8 位元刻度的 3 格"

# %%
# 步驟 6 — fold_quantize
# ----------------------
# 預設的 ``fold_quantize=True`` 會在 convert 當下就把每個 weight 的 ``quantize_per_channel``
# 算一次，存下 int8 結果；``fold_quantize=False`` 則讓圖保留浮點 weight，每次執行都重新量化。
# 用同一組校準好的 observer 再 convert 一次：

unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)
stages["unfolded"] = census(unfolded)
weight_q = [n.name for n in unfolded.graph.nodes if n.name.startswith("quantize_per_channel")]
draw(unfolded, highlight=weight_q, title="步驟 6：convert_pt2e(..., fold_quantize=False)")

# %%
# 沒折疊的圖每個 weight 各有一個 ``quantize_per_channel``，讀的是浮點 weight；折疊的圖改讀
# int8 常數，只占四分之一的位元組。折疊下來的常數正是那個節點會算出的值，所以兩張圖的輸出
# 每個位元都相同。

conv_dq = next(node for node in converted.graph.nodes if node.name == "conv2d").args[1]
folded_weight = getattr(converted, conv_dq.args[0].target)
print(f"fold_quantize=False：{unfolded.conv.weight.dtype}，{unfolded.conv.weight.nbytes} 位元組")
print(f"fold_quantize=True： {folded_weight.dtype}，{folded_weight.nbytes} 位元組")
assert stages["unfolded"]["quantize_per_channel"] == on_weights
assert stages["unfolded"]["nodes"] == stages["converted"]["nodes"] + on_weights
assert folded_weight.dtype == torch.int8 and folded_weight.nbytes * 4 == unfolded.conv.weight.nbytes
with torch.no_grad():
    assert torch.equal(unfolded(*test), got), "折疊改變的是在哪裡算，不是算出什麼"

# %%
# 小結
# ----
# 每個階段的節點數（由 ``census`` 清點）：

columns = {
    "nodes": "nodes",
    "observer": "obs",
    "quantize_per_tensor": "q",
    "dequantize_per_tensor": "dq",
    "quantize_per_channel": "q/ch",
    "dequantize_per_channel": "dq/ch",
}
print(f"{'stage':<10}" + "".join(f"{label:>7}" for label in columns.values()))
for stage, counts in stages.items():
    print(f"{stage:<10}" + "".join(f"{counts[key]:>7}" for key in columns))

# %%
# PT2E 就是 export → ``prepare_pt2e`` （折疊 BatchNorm，每條要量化的邊一個 observer）→
# 校準（observer 記下統計值）→ ``convert_pt2e`` （observer 變成 q/dq 節點，weight 變成 int8
# 常數）。下一課讀出這些 q/dq 節點裡的數字，並親手算一遍：
# :ref:`sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py` 。
