"""
M01-2 q/dq node 和裡面的數字
============================

convert 後的圖把量化參數攤在明處：per-tensor 的 quantize／dequantize node 把 scale、
zero point、數值範圍和 dtype 當成 Python 常數直接寫在 ``args`` 裡；per-channel 的 node
則透過 ``get_attr`` node 從 buffer 讀出每個通道的 scale 和 zero point。
這些 op 本身各只有一行算式。本課把 ``convert_pt2e`` 為 ``small_cnn`` 產生的圖裡每個數字
都讀出來，再親手把每個 quantize 和 dequantize 算一遍，一個位元都不差。

**你會學到**

- q/dq node 把 scale、zero point、範圍和 dtype 存在哪裡（per-tensor 與 per-channel）
- ``quantize_per_tensor``、``dequantize_per_tensor`` 和 per-channel 版本的確切算式，
  以及運算順序為什麼重要
- ``fold_quantize=True`` 留下的 int8 weight 常數是什麼，以及走一趟 q/dq 會損失什麼

**先備知識**：
:ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# 準備
# ----
# 用五行重走 M01-1 的流程：export、prepare、校準，再 convert 兩次，一次開 ``fold_quantize``、
# 一次不開。``Q`` 是 q/dq op 所在的命名空間，匯入 torchao 的 PT2E 模組時才會註冊。

import copy

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
x = example_inputs(8)
prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
calibrate(prepared)
converted = convert_pt2e(copy.deepcopy(prepared))
unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)

# %%
# 兩個找 node 的小工具。

from common.pt2e import node_named


def nodes_calling(gm, op):
    """``gm`` 裡 target 是 ``op`` 的 call_function node，依圖中順序。"""
    return [node for node in gm.graph.nodes if node.op == "call_function" and node.target == op]


# %%
# 步驟 1 — 找出 q/dq node
# ------------------------
# q/dq node 就是 target 為 ``quantized_decomposed`` 某個 op 的 ``call_function``。
# 每個 ``quantize_per_tensor`` 都只被一個 ``dequantize_per_tensor`` 讀取，
# 而且這一對用的是同一組數字：``args[1:]`` 完全相同。

quantizes = nodes_calling(converted, Q.quantize_per_tensor.default)
dequantizes = nodes_calling(converted, Q.dequantize_per_tensor.default)
for q in quantizes:
    (dq,) = q.users
    print(f"{q.args[0].name:>10} → {q.name} → {dq.name}")
    assert dq.target == Q.dequantize_per_tensor.default, "quantize 由一個 dequantize 讀取"
    assert dq.args[1:] == q.args[1:], "兩者用同一組數字"
assert len(dequantizes) == len(quantizes), "每個 quantize 都有對應的 dequantize"
draw(
    converted,
    highlight=[n.name for n in quantizes + dequantizes],
    title="步驟 1：per-tensor 的 q/dq",
)

# %%
# 步驟 2 — per-tensor 的數字是 Python 常數
# -----------------------------------------
# ``quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype)``：
# 輸入 node 後面接的五個引數都是單純的 Python 值，不是 node。活化值用 ``uint8``，
# 範圍是整個型別的 0..255。

for q in quantizes:
    _, scale, zero_point, quant_min, quant_max, dtype = q.args
    print(f"{q.name:<30} {scale!r:<22} {zero_point:>4}  {quant_min}..{quant_max}  {dtype}")
    assert isinstance(scale, float) and isinstance(zero_point, int), "Python 數字"
    assert dtype == torch.uint8, "活化值是 uint8"
    assert (quant_min, quant_max) == (0, torch.iinfo(dtype).max), "用滿整個範圍 0..255"

# %%
# 這些數字從哪裡來？來自 prepare 後的圖裡、掛在同一條邊上的 observer：``convert_pt2e``
# 呼叫它的 ``calculate_qparams()`` （M01-3），再把 float32 的 scale 轉成 Python float。
# 所以圖裡每個 scale 其實都是 float32 的數值，只是 Python 用 double 存：
# 轉成 float32 張量再轉回來，一點也沒變。

observer_on = {
    node.args[0].name: prepared.get_submodule(node.target)
    for node in prepared.graph.nodes
    if node.op == "call_module" and node.target.startswith("activation_post_process")
}
for q in quantizes:
    scale_t, zero_point_t = observer_on[q.args[0].name].calculate_qparams()
    assert q.args[1] == float(scale_t) and q.args[2] == int(zero_point_t), "observer 的 qparams"
    assert scale_t.dtype == torch.float32, "以 float32 計算"
    assert torch.tensor(q.args[1]).item() == q.args[1], "而且正好是一個 float32 值"
scale_t, zero_point_t = observer_on["x"].calculate_qparams()
print(f"x 上的 observer：scale={scale_t}，zero_point={zero_point_t}")

# %%
# 步驟 3 — per-channel 的數字放在 buffer 裡
# -----------------------------------------
# weight 是依輸出通道量化的：每個通道各有一個 scale 和 zero point，
# 多到不適合寫成 Python 常數。``dequantize_per_channel(input, scales, zero_points, axis,
# quant_min, quant_max, dtype)`` 透過 ``get_attr`` node 從 buffer 讀出它們
# （圖上寫在標籤裡，記作 ‹名稱›）；``axis`` 指出哪一維是通道。

weight_dqs = nodes_calling(converted, Q.dequantize_per_channel.default)
draw(converted, highlight=[n.name for n in weight_dqs], title="步驟 3：per-channel 的 dequantize")

# %%
# x86 quantizer 把 weight 對稱量化成 ``int8``，範圍 -128..127，所以 zero point 全是 0。
# scale 是 ``float32``、zero point 是 ``int64``，每個輸出通道各一個。

for dq in weight_dqs:
    int8_weight, scales, zero_points, axis, quant_min, quant_max, dtype = dq.args
    assert {int8_weight.op, scales.op, zero_points.op} == {"get_attr"}, "三個 get_attr node"
    s, z = getattr(converted, scales.target), getattr(converted, zero_points.target)
    w = getattr(converted, int8_weight.target)
    print(f"{dq.name}  axis={axis}  {quant_min}..{quant_max}  {dtype}")
    print(f"    ‹{scales.target}› {s.dtype} {tuple(s.shape)}  ‹{zero_points.target}› {z.dtype}")
    assert s.dtype == torch.float32 and z.dtype == torch.int64, (
        "scale 是 float32，zero point 是 int64"
    )
    assert not z.any(), "zero point 全是 0"
    assert s.shape == z.shape == (w.shape[axis],) and axis == 0, "每個輸出通道一組"
    assert (quant_min, quant_max, dtype) == (-128, 127, torch.int8), "int8，範圍 -128..127"
    assert w.dtype == torch.int8, "weight 以 int8 存放"

# %%
# 步驟 4 — 親手算 quantize_per_tensor
# -----------------------------------
# 這個 op 定義在 ``torch/ao/quantization/fx/_decomposed.py`` （torchao 會匯入它），
# 依序做五件事：乘上 ``1.0 / scale``、捨入到最近的整數（剛好一半時取偶數）、
# 加上 zero point、截到 ``quant_min..quant_max``、轉型。捨入與截斷這兩步，
# 就是資訊被丟掉的地方。dequantize 則是轉成 float32、減去 zero point、乘上 scale。


def quantize_by_hand(x, scale, zero_point, quant_min, quant_max, dtype):
    """縮放、捨入、平移、截斷、轉型：照 quantize_per_tensor 的順序計算。"""
    return torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max).to(dtype)


def dequantize_by_hand(q, scale, zero_point):
    """轉型、平移回來、縮放：照 dequantize_per_tensor 的順序計算。"""
    return (q.to(torch.float32) - zero_point) * scale


# %%
# ``torch.round`` 把剛好落在兩個整數正中間的值送到偶數那一邊：

halves = torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]))
print(f"torch.round([0.5, 1.5, 2.5, -0.5, -1.5]) = {halves.tolist()}")
assert halves.tolist() == [0, 2, 2, 0, -2], "剛好一半時取偶數"

# %%
# 要拿真實資料比對，用 ``torch.fx.Interpreter`` 執行 convert 後的圖，並保留每個 node 的值
# （``garbage_collect_values=False``），每個 q/dq node 的輸入和輸出就都拿得到。
# 先看幾個輸入值一步步的變化：

interpreter = torch.fx.Interpreter(converted, garbage_collect_values=False)
with torch.no_grad():
    interpreter.run(*x)
value = interpreter.env
q = quantizes[0]
_, scale, zero_point, quant_min, quant_max, dtype = q.args
sample = value[q.args[0]].flatten()[:6]
print(f"x               {[round(v, 4) for v in sample.tolist()]}")
print(f"x * (1/scale)   {[round(v, 3) for v in (sample * (1.0 / scale)).tolist()]}")
shifted = torch.round(sample * (1.0 / scale)) + zero_point
print(f"round + zp      {shifted.tolist()}  (zero_point={zero_point})")
print(f"q               {value[q].flatten()[:6].tolist()}")
(dq,) = q.users
print(f"dequantize(q)   {[round(v, 4) for v in value[dq].flatten()[:6].tolist()]}")

# %%
# 圖裡每一個 per-tensor 的 q/dq node，親手算的結果都和 op 的輸出每個位元相同
# （用的是 ``torch.equal``，不是 ``allclose``）：

for q in quantizes:
    (dq,) = q.users
    _, scale, zero_point, *_ = q.args
    hand_q = quantize_by_hand(value[q.args[0]], *q.args[1:])
    assert torch.equal(hand_q, value[q]), f"{q.name}：親手算的 quantize == op"
    hand_dq = dequantize_by_hand(value[q], scale, zero_point)
    assert torch.equal(hand_dq, value[dq]), f"{dq.name}：親手算的 dequantize == op"
    assert value[q].dtype == torch.uint8 and value[dq].dtype == torch.float32, "uint8、float32"
print(f"{len(quantizes)} 個 quantize 和 {len(quantizes)} 個 dequantize node 都完全重現")

# %%
# 步驟 5 — 為什麼順序很重要
# --------------------------
# ``x / scale`` 看起來和 ``x * (1.0 / scale)`` 一樣，但 ``1.0 / scale`` 在相乘之前已經
# 先捨入過一次，兩者的結果可能在最後一位差一點。這只有在剛好決定捨入方向時才有影響，
# 也就是兩個刻度之間的中點。取輸入刻度每個中點上、以及緊鄰中點的 float32 數值來試：

_, scale, zero_point, quant_min, quant_max, dtype = quantizes[0].args
levels = torch.arange(quant_min, quant_max, dtype=torch.float64)
halfway = ((levels - zero_point + 0.5) * scale).float()
near = torch.cat([halfway, halfway.nextafter(halfway + 1), halfway.nextafter(halfway - 1)])
by_op = Q.quantize_per_tensor.default(near, scale, zero_point, quant_min, quant_max, dtype)
by_division = torch.clamp(torch.round(near / scale) + zero_point, quant_min, quant_max).to(dtype)
differ = int((by_division != by_op).sum())
print(f"中點附近的 {near.numel()} 個值裡，x / scale 和 op 不一致的有 {differ} 個")
hand = quantize_by_hand(near, scale, zero_point, quant_min, quant_max, dtype)
assert torch.equal(hand, by_op), "乘上 1.0 / scale 才是 op 的計算方式"
assert differ > 0, "除以 scale 不是"

# %%
# 步驟 6 — 親手算 per-channel 的那一對
# ------------------------------------
# per-channel 的算式一樣，只是沿著 ``axis`` 每一片各用自己的 scale 和 zero point；
# op 會把它們 reshape 成可以對其他維度 broadcast 的形狀。dtype 上有一點不同：
# 這裡的 ``1.0 / scales`` 是 float32 張量，不是 Python 數字。


def quantize_per_channel_by_hand(w, scales, zero_points, axis, quant_min, quant_max, dtype):
    """quantize_per_channel 的算式：scale 和 zero point 沿 ``axis`` broadcast。"""
    shape = [1] * w.dim()
    shape[axis] = -1
    scaled = torch.round(w * (1.0 / scales.view(shape))) + zero_points.view(shape)
    return torch.clamp(scaled, quant_min, quant_max).to(dtype)


def dequantize_per_channel_by_hand(q, scales, zero_points, axis):
    """dequantize_per_channel 的算式：int8 - int64 得 int64，再乘 float32 得 float32。"""
    shape = [1] * q.dim()
    shape[axis] = -1
    return ((q - zero_points.view(shape)) * scales.view(shape)).to(torch.float32)


# %%
# 用 ``fold_quantize=False`` 轉出來的圖還會對浮點 weight 執行 ``quantize_per_channel``，
# 兩個 op 都能拿它的值來比對。

interpreter = torch.fx.Interpreter(unfolded, garbage_collect_values=False)
with torch.no_grad():
    interpreter.run(*x)
unfolded_value = interpreter.env
weight_qs = nodes_calling(unfolded, Q.quantize_per_channel.default)
for q in weight_qs:
    (dq,) = q.users
    w, scales, zero_points = (unfolded_value[node] for node in q.args[:3])
    axis, quant_min, quant_max, dtype = q.args[3:]
    hand_q = quantize_per_channel_by_hand(w, scales, zero_points, axis, quant_min, quant_max, dtype)
    hand_dq = dequantize_per_channel_by_hand(hand_q, scales, zero_points, axis)
    assert torch.equal(hand_q, unfolded_value[q]), f"{q.name}：親手算的 == op"
    assert torch.equal(hand_dq, unfolded_value[dq]), f"{dq.name}：親手算的 == op"
print(f"{len(weight_qs)} 個 quantize_per_channel 和對應的 dequantize 都完全重現")

# %%
# 步驟 7 — fold_quantize=True 留下的 int8 常數
# --------------------------------------------
# 折疊後的圖裡沒有 ``quantize_per_channel`` node 了。取而代之的是一個 ``get_attr`` node：
# 名字沿用舊 node，讀的卻是 convert 當下算好的 int8 buffer ``_frozen_param*``。
# 它正好等於用同一組 buffer 親手量化浮點 weight 的結果：

for layer in ("conv2d", "linear"):
    folded_dq = node_named(converted, layer).args[1]
    unfolded_q = node_named(unfolded, layer).args[1].args[0]
    constant = value[folded_dq.args[0]]
    float_weight = unfolded_value[unfolded_q.args[0]]
    scales, zero_points = (value[node] for node in folded_dq.args[1:3])
    hand = quantize_per_channel_by_hand(float_weight, scales, zero_points, *folded_dq.args[3:])
    print(f"{layer:<7} {folded_dq.args[0].name} → ‹{folded_dq.args[0].target}› {constant.dtype}")
    assert folded_dq.args[0].op == "get_attr", "一個 get_attr node 取代了 quantize"
    assert folded_dq.args[0].name == unfolded_q.name, "沿用 quantize node 的名字"
    assert constant.dtype == torch.int8, "讀的是 int8 常數"
    assert torch.equal(constant, hand), "折疊下來的常數就是親手量化的 weight"
    dequantized = dequantize_per_channel_by_hand(constant, scales, zero_points, 0)
    assert torch.equal(dequantized, value[folded_dq]), "它的 dequantize 也和圖裡的一致"

# %%
# 被量化的浮點 weight 是 ``prepare_pt2e`` 折疊過 BatchNorm 的那個（M01-1），
# 不是 eager 模型的：拿 ``model.conv.weight`` 來量化，會得到不同的整數。

conv_dq = node_named(converted, "conv2d").args[1]
int8_weight, scales, zero_points = (value[node] for node in conv_dq.args[:3])
eager = quantize_per_channel_by_hand(model.conv.weight, scales, zero_points, *conv_dq.args[3:])
print(f"不同的整數：{int((eager != int8_weight).sum())} 個（共 {eager.numel()} 個）")
assert not torch.equal(eager, int8_weight), "被量化的不是 eager 模型的 weight"

# %%
# 步驟 8 — 走一趟 q/dq 會損失多少
# -------------------------------
# 落在刻度範圍 ``(quant_min - zero_point) * scale`` 到 ``(quant_max - zero_point) * scale``
# 之內的值，經過 quantize → dequantize 後最多差半格（``scale / 2``）；
# 斷言的上限多留了 1e-6，給 float32 運算本身的捨入。範圍外的值則被截到最近的端點：
# observer 選的範圍把少數校準資料排除在外（原因見 M01-3）。

q = quantizes[0]
(dq,) = q.users
_, scale, zero_point, quant_min, quant_max, dtype = q.args
original, restored = value[q.args[0]], value[dq]
low, high = (quant_min - zero_point) * scale, (quant_max - zero_point) * scale
inside = (original >= low) & (original <= high)
error = restored - original
print(
    f"範圍 {low:.4f}..{high:.4f}；{int((~inside).sum())} 個值在範圍外（共 {original.numel()} 個）"
)
print(f"範圍內：最大誤差 {error[inside].abs().max():.6f}（scale / 2 = {scale / 2:.6f}）")
print(f"範圍外：最大誤差 {error[~inside].abs().max():.6f}")
ends = dequantize_by_hand(torch.tensor([quant_min, quant_max], dtype=dtype), scale, zero_point)
assert error[inside].abs().max() <= scale / 2 + 1e-6, "範圍內最多差半格"
assert (~inside).any(), "有些校準資料落在範圍外"
assert torch.isin(restored[~inside], ends).all(), "它們回來時被截到端點"

# %%
# 畫成圖來看。左邊是這批資料每個值的誤差，以刻度的格數為單位：在刻度範圍內是一條
# ±0.5 格的帶子；超出兩端的值（紅色）被截到端點，誤差超過一格的畫在圖的邊緣。
# 右邊是 0 附近的六格：走一趟 q/dq 是一道階梯，每個值都被移到最近的刻度上。

steps = (error / scale).flatten()
xs = torch.linspace(-3 * scale, 3 * scale, 601)
stairs = dequantize_by_hand(quantize_by_hand(xs, *q.args[1:]), scale, zero_point)
fig, (every, around_zero) = plt.subplots(1, 2, figsize=(10, 3.6))
kept = inside.flatten()
every.scatter(original.flatten()[kept].numpy(), steps[kept].numpy(), s=2, label="範圍內")
every.scatter(
    original.flatten()[~kept].numpy(),
    steps[~kept].clamp(-1, 1).numpy(),
    s=12,
    color="tab:red",
    label="被截斷",
)
every.axhline(0.5, color="gray", linestyle="--", label="±0.5 格")
every.axhline(-0.5, color="gray", linestyle="--")
every.set(title="x 每個值來回一趟的誤差", xlabel="x", ylabel="誤差（格）", ylim=(-1.05, 1.4))
every.legend(loc="upper center", ncols=3)
around_zero.plot(xs.numpy(), xs.numpy(), color="gray", linestyle="--", label="x")
around_zero.plot(xs.numpy(), stairs.numpy(), label="dequantize(quantize(x))")
around_zero.set(title="0 附近的六格", xlabel="x", ylabel="來回一趟之後")
around_zero.legend(loc="upper left")
fig.tight_layout()

# %%
# 小結
# ----
# per-tensor 的 q/dq 把 ``scale`` （以 Python float 存放的 float32 值）、``zero_point``、
# ``quant_min``、``quant_max`` 和 ``dtype`` 寫在 ``args`` 裡；per-channel 的則讀
# ``_scale_*`` 和 ``_zero_point_*`` 這兩個 buffer，另外帶一個 ``axis``。quantize 是
# ``clamp(round(x * (1.0 / scale)) + zero_point).to(dtype)``，dequantize 是
# ``(q.to(float32) - zero_point) * scale``，照這個順序寫，就和 op 每個位元都相同。
# 走一趟 q/dq，範圍內的值最多移動半格，範圍外的值被截到最近的端點。
#
# 練習
# ----
# 1. 用 ``Q.quantize_per_tensor.default`` 量化 ``[0.5, 1.5, 2.5, -0.5, -1.5]``，
#    scale 1.0、zero point 0、int8 範圍 -128..127。預測得到的整數。
#
#    .. dropdown:: 解答
#
#       scale 是 1.0 時這個 op 只做捨入，而每個值都剛好在一半：全都往偶數那一邊去。
#
#       .. code-block:: python
#
#          halves_q = Q.quantize_per_tensor.default(
#              torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]), 1.0, 0, -128, 127, torch.int8
#          )
#          print(halves_q.tolist())
#          assert halves_q.tolist() == [0, 2, 2, 0, -2], "剛好一半時取偶數，和 torch.round 一樣"
#
# 2. 把輸入 ``x`` 量化成範圍 -128..127 的 ``int8``，而不是 0..255 的 ``uint8``：
#    scale 不變，zero point 減 128。預測得到的整數和 dequantize 回來的值。
#
#    .. dropdown:: 解答
#
#       整數是 uint8 的結果減 128，dequantize 回來的值完全相同：刻度和 zero point
#       一起平移，改變的只有存放的型別。
#
#       .. code-block:: python
#
#          q = quantizes[0]
#          _, scale, zero_point, *_ = q.args
#          data = value[q.args[0]]
#          as_uint8 = Q.quantize_per_tensor.default(data, scale, zero_point, 0, 255, torch.uint8)
#          as_int8 = Q.quantize_per_tensor.default(
#              data, scale, zero_point - 128, -128, 127, torch.int8
#          )
#          assert torch.equal(as_int8.int() + 128, as_uint8.int()), "整數減了 128"
#          back_uint8 = dequantize_by_hand(as_uint8, scale, zero_point)
#          back_int8 = dequantize_by_hand(as_int8, scale, zero_point - 128)
#          assert torch.equal(back_int8, back_uint8), "浮點值完全相同"
#
# 3. 讓 ``fold_quantize=False`` 那張圖的浮點 weight 走一趟它的 per-channel q/dq。
#    預測每個通道的最大誤差，以它自己的 scale 為一格。
#
#    .. dropdown:: 解答
#
#       每個通道都是半格（差在 float32 的捨入）。對稱 int8 的 scale 是
#       ``max|w| / 127.5``，所以通道裡絕對值最大的那個值剛好落在 ±127.5 的中點上：
#       它被捨入或截斷到 -128 或 127，差半格。沒有哪個值差得更多。
#
#       .. code-block:: python
#
#          for q in weight_qs:
#              (dq,) = q.users
#              w, scales = unfolded_value[q.args[0]], unfolded_value[q.args[1]]
#              worst = (unfolded_value[dq] - w).abs().flatten(1).amax(dim=1) / scales
#              print(f"{q.name}: {[round(v, 5) for v in worst.tolist()]}")
#              assert torch.allclose(worst, torch.full_like(worst, 0.5), atol=1e-4), "半格"
#
# 延伸閱讀
# --------
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `PyTorch 2 Export 訓練後量化（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_ptq.html>`_
#
# 下一課
# ------
# scale 和 zero point 是怎麼算出來的：
# :ref:`M01-3 · observer 如何把統計值變成 qparams
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`。
