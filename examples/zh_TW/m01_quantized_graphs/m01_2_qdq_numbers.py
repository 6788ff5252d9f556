"""
M01-2 q/dq 節點和裡面的數字
============================

convert 後的圖把量化參數攤在明處：per-tensor 的 quantize／dequantize 節點把 scale、
zero point、數值範圍和 dtype 當成 Python 常數直接寫在 ``args`` 裡；per-channel 的節點則透過
``get_attr`` 節點從 buffer 讀出每個 channel 的 scale 和 zero point。這些 op 本身各只有一行算式。
本課把 ``convert_pt2e`` 為 ``small_cnn`` 產生的圖裡每個數字都讀出來，再親手把每個 quantize
和 dequantize 算一遍，一個位元都不差。

**你會學到**

- q/dq 節點把 scale、zero point、範圍和 dtype 存在哪裡（per-tensor 與 per-channel）
- ``quantize_per_tensor`` 、 ``dequantize_per_tensor`` 和 per-channel 版本的確切算式，
  以及運算順序為什麼重要
- ``fold_quantize=True`` 留下的 int8 weight 常數是什麼

**先備知識**：M01-1（PT2E 全流程）。
"""

# %%
# 準備
# ----
# 用五行重走 M01-1 的流程：export、prepare、校準，再 convert 兩次，一次開 ``fold_quantize``、
# 一次不開。``Q`` 是 q/dq op 所在的命名空間，匯入 torchao 的 PT2E 模組時才會註冊。

import copy

import torch

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
x = example_inputs(8)
prepared = prepare_pt2e(export_module(model, x), x86_quantizer())
calibrate(prepared)
converted = convert_pt2e(copy.deepcopy(prepared))
unfolded = convert_pt2e(copy.deepcopy(prepared), fold_quantize=False)


def nodes_calling(gm, op):
    """``gm`` 裡 target 是 ``op`` 的 call_function 節點，依圖中順序。"""
    return [node for node in gm.graph.nodes if node.op == "call_function" and node.target == op]


def node_named(gm, name):
    """``gm`` 裡名為 ``name`` 的節點。"""
    return next(node for node in gm.graph.nodes if node.name == name)


# %%
# 步驟 1 — 找出 q/dq 節點
# ------------------------
# q/dq 節點就是 target 為 ``quantized_decomposed`` 某個 op 的 ``call_function`` 。每個
# ``quantize_per_tensor`` 都只被一個 ``dequantize_per_tensor`` 讀取，而且這一對用的是同一組
# 數字： ``args[1:]`` 完全相同。

quantizes = nodes_calling(converted, Q.quantize_per_tensor.default)
dequantizes = nodes_calling(converted, Q.dequantize_per_tensor.default)
for q in quantizes:
    (dq,) = q.users
    print(f"{q.args[0].name:>10} → {q.name} → {dq.name}")
    assert dq.target == Q.dequantize_per_tensor.default and dq.args[1:] == q.args[1:]
assert len(dequantizes) == len(quantizes), "每個 quantize 都有對應的 dequantize"
draw(
    converted,
    highlight=[n.name for n in quantizes + dequantizes],
    title="步驟 1：per-tensor 的 q/dq",
)

# %%
# 步驟 2 — per-tensor 的數字是 Python 常數
# -----------------------------------------
# ``quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype)`` ：輸入節點
# 後面接的五個參數都是單純的 Python 值，不是節點。activation 用 ``uint8`` ，範圍是整個型別
# 的 0..255。

for q in quantizes:
    _, scale, zero_point, quant_min, quant_max, dtype = q.args
    print(f"{q.name:<30} {scale!r:<22} {zero_point:>4}  {quant_min}..{quant_max}  {dtype}")
    assert isinstance(scale, float) and isinstance(zero_point, int), "是 Python 數字"
    assert dtype == torch.uint8 and (quant_min, quant_max) == (0, torch.iinfo(dtype).max)

# %%
# 這些數字從哪裡來？來自 prepare 後的圖裡、掛在同一條邊上的 observer： ``convert_pt2e``
# 呼叫它的 ``calculate_qparams()`` （M01-3），再把 float32 的 scale 轉成 Python float。
# 所以圖裡每個 scale 其實都是 float32 的數值，只是 Python 用 double 存：轉成 float32 tensor
# 再轉回來，一點也沒變。

observer_on = {
    node.args[0].name: prepared.get_submodule(node.target)
    for node in prepared.graph.nodes
    if node.op == "call_module" and node.target.startswith("activation_post_process")
}
for q in quantizes:
    scale_t, zero_point_t = observer_on[q.args[0].name].calculate_qparams()
    assert q.args[1] == float(scale_t) and q.args[2] == int(zero_point_t), (
        "就是 observer 算出的 qparams"
    )
    assert scale_t.dtype == torch.float32 and torch.tensor(q.args[1]).item() == q.args[1]
scale_t, zero_point_t = observer_on["x"].calculate_qparams()
print(f"x 上的 observer：scale={scale_t}，zero_point={zero_point_t}")

# %%
# 步驟 3 — per-channel 的數字放在 buffer 裡
# -----------------------------------------
# weight 是依輸出 channel 量化的：每個 channel 各有一個 scale 和 zero point，多到不適合寫成
# Python 常數。 ``dequantize_per_channel(input, scales, zero_points, axis, quant_min,
# quant_max, dtype)`` 透過 ``get_attr`` 節點從 buffer 讀出它們（圖上寫在標籤裡，記作
# ‹名稱›）； ``axis`` 指出哪一維是 channel。

weight_dqs = nodes_calling(converted, Q.dequantize_per_channel.default)
draw(converted, highlight=[n.name for n in weight_dqs], title="步驟 3：per-channel 的 dequantize")

# %%
# x86 quantizer 把 weight 對稱量化成 ``int8`` ，範圍 -128..127，所以 zero point 全是 0。
# scale 是 ``float32`` 、zero point 是 ``int64`` ，每個輸出 channel 各一個。

for dq in weight_dqs:
    int8_weight, scales, zero_points, axis, quant_min, quant_max, dtype = dq.args
    assert {int8_weight.op, scales.op, zero_points.op} == {"get_attr"}, "三個都是 get_attr 節點"
    s, z = getattr(converted, scales.target), getattr(converted, zero_points.target)
    w = getattr(converted, int8_weight.target)
    print(f"{dq.name}  axis={axis}  {quant_min}..{quant_max}  {dtype}")
    print(f"    ‹{scales.target}› {s.dtype} {tuple(s.shape)}  ‹{zero_points.target}› {z.dtype}")
    assert s.dtype == torch.float32 and z.dtype == torch.int64 and not z.any()
    assert s.shape == z.shape == (w.shape[axis],) and axis == 0, "每個輸出 channel 一組"
    assert (quant_min, quant_max, dtype) == (-128, 127, torch.int8) and w.dtype == torch.int8

# %%
# 步驟 4 — 親手算 quantize_per_tensor
# -----------------------------------
# 這個 op 定義在 ``torch/ao/quantization/fx/_decomposed.py`` （torchao 會匯入它），依序做
# 五件事：乘上 ``1.0 / scale`` 、四捨五入（剛好一半時取偶數）、加上 zero point、截到
# ``quant_min..quant_max`` 、轉型；會丟失資訊的只有捨入與截斷這兩步。
# dequantize 則是轉成 float32、減去 zero point、乘上 scale。


def quantize_by_hand(x, scale, zero_point, quant_min, quant_max, dtype):
    """縮放、捨入、平移、截斷、轉型：照 quantize_per_tensor 的順序計算。"""
    return torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max).to(dtype)


def dequantize_by_hand(q, scale, zero_point):
    """轉型、平移回來、縮放：照 dequantize_per_tensor 的順序計算。"""
    return (q.to(torch.float32) - zero_point) * scale


halves = torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]))
print(f"torch.round([0.5, 1.5, 2.5, -0.5, -1.5]) = {halves.tolist()}")
assert halves.tolist() == [0, 2, 2, 0, -2], "剛好一半時取偶數"

# %%
# 要拿真實資料比對，用 ``torch.fx.Interpreter`` 執行 convert 後的圖，並保留每個節點的值
# （ ``garbage_collect_values=False`` ），每個 q/dq 節點的輸入和輸出就都拿得到。先看幾個
# 輸入值一步步的變化：

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
# 圖裡每一個 per-tensor 的 q/dq 節點，親手算的結果都和 op 的輸出每個位元相同（用的是
# ``torch.equal`` ，不是 ``allclose`` ）：

for q in quantizes:
    (dq,) = q.users
    _, scale, zero_point, *_ = q.args
    assert torch.equal(quantize_by_hand(value[q.args[0]], *q.args[1:]), value[q]), q.name
    assert torch.equal(dequantize_by_hand(value[q], scale, zero_point), value[dq]), dq.name
    assert value[q].dtype == torch.uint8 and value[dq].dtype == torch.float32
print(f"{len(quantizes)} 個 quantize 和 {len(quantizes)} 個 dequantize 節點都完全重現")

# %%
# 步驟 5 — 為什麼順序很重要
# --------------------------
# ``x / scale`` 看起來和 ``x * (1.0 / scale)`` 一樣，但 ``1.0 / scale`` 在相乘之前已經先捨入
# 過一次，兩者的結果可能在最後一位差一點。這只有在剛好決定捨入方向時才有影響，也就是兩個刻度
# 之間的中點。取輸入刻度每個中點上、以及緊鄰中點的 float32 數值來試：

_, scale, zero_point, quant_min, quant_max, dtype = quantizes[0].args
levels = torch.arange(quant_min, quant_max, dtype=torch.float64)
halfway = ((levels - zero_point + 0.5) * scale).float()
near = torch.cat([halfway, halfway.nextafter(halfway + 1), halfway.nextafter(halfway - 1)])
by_op = Q.quantize_per_tensor.default(near, scale, zero_point, quant_min, quant_max, dtype)
by_division = torch.clamp(torch.round(near / scale) + zero_point, quant_min, quant_max).to(dtype)
differ = int((by_division != by_op).sum())
print(f"中點附近的 {near.numel()} 個值裡，x / scale 和 op 不一致的有 {differ} 個")
assert torch.equal(quantize_by_hand(near, scale, zero_point, quant_min, quant_max, dtype), by_op)
assert differ > 0, "除法不是 op 的算法"

# %%
# 步驟 6 — 親手算 per-channel 的那一對
# ------------------------------------
# per-channel 的算式一樣，只是沿著 ``axis`` 每一片各用自己的 scale 和 zero point；op 會把它們
# reshape 成可以對其他維度 broadcast 的形狀。dtype 上有一點不同：這裡的 ``1.0 / scales`` 是
# float32 tensor，不是 Python 數字。用 ``fold_quantize=False`` 轉出來的圖還會對浮點 weight
# 執行 ``quantize_per_channel`` ，兩個 op 都能拿它的值來比對。


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
    assert torch.equal(hand_q, unfolded_value[q]), q.name
    assert torch.equal(hand_dq, unfolded_value[dq]), dq.name
print(f"{len(weight_qs)} 個 quantize_per_channel 和對應的 dequantize 都完全重現")

# %%
# 步驟 7 — fold_quantize=True 留下的 int8 常數
# --------------------------------------------
# 折疊後的圖裡沒有 ``quantize_per_channel`` 節點了。取而代之的是一個 ``get_attr`` 節點：名字
# 沿用舊節點，讀的卻是 convert 當下算好的 int8 buffer ``_frozen_param*`` 。它正好等於用同一組
# buffer 親手量化浮點 weight 的結果：

for layer in ("conv2d", "linear"):
    folded_dq = node_named(converted, layer).args[1]
    unfolded_q = node_named(unfolded, layer).args[1].args[0]
    constant = value[folded_dq.args[0]]
    float_weight = unfolded_value[unfolded_q.args[0]]
    scales, zero_points = (value[node] for node in folded_dq.args[1:3])
    hand = quantize_per_channel_by_hand(float_weight, scales, zero_points, *folded_dq.args[3:])
    print(f"{layer:<7} {folded_dq.args[0].name} → ‹{folded_dq.args[0].target}› {constant.dtype}")
    assert folded_dq.args[0].op == "get_attr" and constant.dtype == torch.int8
    assert torch.equal(constant, hand), "折疊下來的常數就是親手量化的 weight"
    dequantized = dequantize_per_channel_by_hand(constant, scales, zero_points, 0)
    assert torch.equal(dequantized, value[folded_dq]), "它的 dequantize 也和圖裡的一致"

# %%
# 被量化的浮點 weight 是 ``prepare_pt2e`` 折疊過 BatchNorm 的那個（M01-1），不是 eager 模型
# 的：拿 ``model.conv.weight`` 來量化，會得到不同的整數。

conv_dq = node_named(converted, "conv2d").args[1]
int8_weight, scales, zero_points = (value[node] for node in conv_dq.args[:3])
eager = quantize_per_channel_by_hand(model.conv.weight, scales, zero_points, *conv_dq.args[3:])
print(f"不同的整數：{int((eager != int8_weight).sum())} 個（共 {eager.numel()} 個）")
assert not torch.equal(eager, int8_weight), "被量化的不是 eager 模型的 weight"

# %%
# 步驟 8 — 走一趟 q/dq 會損失多少
# -------------------------------
# 落在刻度範圍 ``(quant_min - zero_point) * scale`` 到 ``(quant_max - zero_point) * scale``
# 之內的值，經過 quantize → dequantize 後最多差半格（ ``scale / 2`` ）；斷言的上限多留了
# 1e-6，給 float32 運算本身的捨入。範圍外的值則被截到最近的端點：observer 選的範圍刻意
# 把少數校準資料排除在外（原因見 M01-3）。

q = quantizes[0]
(dq,) = q.users
_, scale, zero_point, quant_min, quant_max, dtype = q.args
original, restored = value[q.args[0]], value[dq]
low, high = (quant_min - zero_point) * scale, (quant_max - zero_point) * scale
inside = (original >= low) & (original <= high)
error = (restored - original).abs()
print(
    f"範圍 {low:.4f}..{high:.4f}；{int((~inside).sum())} 個值在範圍外（共 {original.numel()} 個）"
)
print(f"範圍內：最大誤差 {error[inside].max():.6f}（scale / 2 = {scale / 2:.6f}）")
print(f"範圍外：最大誤差 {error[~inside].max():.6f}")
ends = dequantize_by_hand(torch.tensor([quant_min, quant_max], dtype=dtype), scale, zero_point)
assert error[inside].max() <= scale / 2 + 1e-6, "範圍內最多差半格"
assert (~inside).any() and torch.isin(restored[~inside], ends).all(), "範圍外被截到端點"

# %%
# 小結
# ----
# per-tensor 的 q/dq 把 ``scale`` （以 Python float 存放的 float32 值）、 ``zero_point`` 、
# ``quant_min`` 、 ``quant_max`` 和 ``dtype`` 寫在 ``args`` 裡；per-channel 的則讀
# ``_scale_*`` 和 ``_zero_point_*`` 這兩個 buffer，另外帶一個 ``axis`` 。quantize 是
# ``clamp(round(x * (1.0 / scale)) + zero_point).to(dtype)`` ，dequantize 是
# ``(q.to(float32) - zero_point) * scale`` ，照這個順序寫，就和 op 每個位元都相同。
# scale 和 zero point 是怎麼算出來的，留給下一課：
# :ref:`sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py` 。
