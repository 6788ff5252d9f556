"""
M01-3 observer 如何把統計值變成 qparams
========================================

observer 做兩件事：資料流過時記下統計值；``convert_pt2e`` 來要的時候，再用
``calculate_qparams()`` 把統計值換算成 scale 和 zero point。MinMax observer
記的是最小值和最大值，公式只有五行；per-channel observer 對每個通道套同一個公式；
histogram observer 則先搜尋一個較窄的範圍，犧牲少數被截掉的極端值，換來更細的刻度。
本課把同一份活化值餵給這四種 observer，再親手算出它們的 qparams。

**你會學到**

- MinMax 的確切公式（affine 與 symmetric，包含 ``eps``）以及 per-channel 的版本
- x86 quantizer 在活化值和 weight 上各放哪一種 observer，以及活化值為什麼維持 per-tensor
- histogram observer 哪裡不一樣，付出什麼、換到什麼

**先備知識**：
:ref:`M01-2 · q/dq node 和裡面的數字
<sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# 準備
# ----
# observer 定義在 ``torchao.quantization.pt2e.observer``。資料是真的：``small_cnn`` 的 conv
# 接 BatchNorm、還沒經過 ReLU 的輸出，輸入是 M01-1 的四批校準資料，共 4 × 8 張影像，
# 每張 8 個通道 × 16 × 16，總計 65,536 個值。

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e.observer import (
    HistogramObserver,
    MinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

Q = torch.ops.quantized_decomposed
EPS = 2**-12
model = get_model("small_cnn")
with torch.no_grad():
    batches = [model.bn(model.conv(example_inputs(8, seed=seed)[0])) for seed in range(4)]
data = torch.cat(batches)
print(f"資料：{tuple(data.shape)}，{data.numel()} 個值，{data.min():.4f}..{data.max():.4f}")

# %%
# ``same`` 是嚴格的相等；``round_trip`` 用 observer 的 qparams 量化再 dequantize，
# per-tensor 與 per-channel 都適用。


def same(a, b):
    """值、dtype 和 shape 都相同：比不看 dtype 的 torch.equal 更嚴格。"""
    return torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape


def round_trip(obs, values):
    """用 ``obs`` 的 qparams 把 ``values`` 量化後再 dequantize 回來。"""
    scale, zero_point = obs.calculate_qparams()
    if obs.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine):
        args = (scale, zero_point, obs.ch_axis, obs.quant_min, obs.quant_max, obs.dtype)
        return Q.dequantize_per_channel.default(
            Q.quantize_per_channel.default(values, *args), *args
        )
    args = (float(scale), int(zero_point), obs.quant_min, obs.quant_max, obs.dtype)
    return Q.dequantize_per_tensor.default(Q.quantize_per_tensor.default(values, *args), *args)


# %%
# 步驟 1 — x86 quantizer 用的 observer
# -------------------------------------
# 用 ``X86InductorQuantizer`` 做 ``prepare_pt2e``，每條活化值的邊都會放一個
# ``HistogramObserver``，每個 weight 放一個 ``PerChannelMinMaxObserver`` （M01-1）。

prepared = prepare_pt2e(export_module(model, example_inputs(8)), x86_quantizer())
observer_nodes = [
    node
    for node in prepared.graph.nodes
    if node.op == "call_module" and isinstance(prepared.get_submodule(node.target), ObserverBase)
]
draw(prepared, highlight=[n.name for n in observer_nodes], title="步驟 1：x86 的 observer")

# %%
# 它們的設定：活化值用 ``uint8`` 0..255、affine，整個張量一個 scale；weight 用 ``int8``
# -128..127、symmetric、依輸出通道（``ch_axis=0``）。兩者都以 ``eps = 2**-12``
# 作為 scale 的下限。下面自己建的 observer 就用這些設定。

for node in observer_nodes:
    obs = prepared.get_submodule(node.target)
    print(f"{node.args[0].name:>12}: {type(obs).__name__:<24} {obs.dtype} {obs.qscheme}")
    print(f"{'':>14}quant_min={obs.quant_min}, quant_max={obs.quant_max}, eps={obs.eps.item()}")
    assert obs.eps.item() == EPS, "eps = 2**-12"
    if node.args[0].op == "get_attr":
        assert isinstance(obs, PerChannelMinMaxObserver) and obs.ch_axis == 0, "weight：per-channel"
        settings = (torch.int8, torch.per_channel_symmetric, -128, 127)
    else:
        assert isinstance(obs, HistogramObserver), "活化值：histogram observer"
        settings = (torch.uint8, torch.per_tensor_affine, 0, 255)
    assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == settings, "就是這些設定"

# %%
# 步驟 2 — 餵四個 observer 同一份資料
# ------------------------------------
# 兩個 per-tensor 的 MinMax observer：一個 affine（像活化值），一個 symmetric（像 weight，
# 但整個張量只用一個 scale）；第三個是 per-channel 的 MinMax observer，沿這批活化值的通道軸
# （axis 1）計算，和 weight 一樣用 symmetric；以及活化值用的 histogram observer。

observers = {
    "minmax affine": MinMaxObserver(
        dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255, eps=EPS
    ),
    "minmax symmetric": MinMaxObserver(
        dtype=torch.int8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127, eps=EPS
    ),
    "per-channel": PerChannelMinMaxObserver(
        ch_axis=1,
        dtype=torch.int8,
        qscheme=torch.per_channel_symmetric,
        quant_min=-128,
        quant_max=127,
        eps=EPS,
    ),
    "histogram": HistogramObserver(
        dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255, eps=EPS
    ),
}
for batch in batches:
    for obs in observers.values():
        obs(batch)

# %%
# MinMax observer 保存的統計值是累計的最小值和最大值，正好是它看過的所有資料的最小值和
# 最大值。per-channel 的版本逐通道保存；histogram observer 也保存這兩個值，
# 另外還有一個 2048 格的直方圖。

per_channel_min, per_channel_max = data.transpose(0, 1).flatten(1).aminmax(dim=1)
for name in ("minmax affine", "minmax symmetric", "histogram"):
    assert same(observers[name].min_val, data.min()), f"{name}：看過的所有資料的最小值"
    assert same(observers[name].max_val, data.max()), f"{name}：看過的所有資料的最大值"
assert same(observers["per-channel"].min_val, per_channel_min), "每個通道一個最小值"
assert same(observers["per-channel"].max_val, per_channel_max), "每個通道一個最大值"
assert observers["histogram"].histogram.numel() == 2048, "2048 格的直方圖"
print(f"per-channel max: {[round(v, 3) for v in per_channel_max.tolist()]}")
print(f"直方圖：{observers['histogram'].histogram.numel()} 格")

# %%
# 步驟 3 — 親手算 MinMax 的 affine 與 symmetric
# ---------------------------------------------
# ``observer.py`` 的 ``_calculate_qparams`` 先把範圍撐開到包含 0（0 必須能被精確表示）。
# affine（仿射量化）：把範圍切成 ``quant_max - quant_min`` 格，zero point 是剛好落在 0
# 的那個整數。symmetric（對稱量化）：把範圍撐成以 0 為中心對稱，zero point 是 0
# （int8 的情況）。兩者的 scale 都不小於 ``eps``。下面的函式照函式庫的運算、照同樣的順序寫。


def qparams_by_hand(min_val, max_val, quant_min, quant_max, symmetric):
    """MinMax 的 scale 和 zero point，和 _calculate_qparams 對 int8、uint8 的計算方式相同。"""
    min_neg = torch.min(min_val, torch.zeros_like(min_val))
    max_pos = torch.max(max_val, torch.zeros_like(max_val))
    eps = torch.tensor([EPS])
    if symmetric:
        max_pos = torch.max(-min_neg, max_pos)
        scale = torch.max(max_pos / (float(quant_max - quant_min) / 2), eps)
        zero_point = torch.zeros(min_neg.shape, dtype=torch.int64)
    else:
        scale = torch.max((max_pos - min_neg) / float(quant_max - quant_min), eps)
        zero_point = quant_min - torch.round(min_neg / scale).to(torch.int)
        zero_point = torch.clamp(zero_point, quant_min, quant_max)
    return scale.reshape(-1), zero_point.reshape(-1)


# %%
# 親手算的函式得到和函式庫一樣的數字，連 dtype 都相同：

for name, symmetric in (("minmax affine", False), ("minmax symmetric", True)):
    obs = observers[name]
    scale, zero_point = obs.calculate_qparams()
    hand = qparams_by_hand(obs.min_val, obs.max_val, obs.quant_min, obs.quant_max, symmetric)
    print(
        f"{name:<17} scale={scale.item():.6f} zero_point={zero_point.item():>3} {zero_point.dtype}"
    )
    assert same(hand[0], scale) and same(hand[1], zero_point), f"{name}：親手算的 == 函式庫"

# %%
# 同一份資料，symmetric 的 scale 不可能比 affine 小：它涵蓋
# ``-max(|min|, max)..max(|min|, max)``，這個範圍包含了 ``min..max``。如果資料全是正的
# （例如 ReLU 之後），symmetric 的刻度會浪費掉負的那一半：scale 是 affine 的兩倍。
# 這就是活化值用 affine 的原因。

affine_scale = observers["minmax affine"].calculate_qparams()[0]
symmetric_scale = observers["minmax symmetric"].calculate_qparams()[0]
relu_min, relu_max = data.relu().min(), data.relu().max()
relu_ratio = (
    qparams_by_hand(relu_min, relu_max, -128, 127, True)[0]
    / qparams_by_hand(relu_min, relu_max, 0, 255, False)[0]
)
print(f"symmetric / affine scale = {(symmetric_scale / affine_scale).item():.4f}")
print(f"ReLU 之後：               {relu_ratio.item():.4f}")
assert symmetric_scale >= affine_scale, "symmetric 的 scale 不會比較小"
torch.testing.assert_close(
    relu_ratio,
    torch.tensor([2.0]),
    rtol=1e-6,
    atol=0,
    msg="ReLU 之後 symmetric 的 scale 是 affine 的兩倍",
)

# %%
# 步驟 4 — 親手算 per-channel MinMax
# ----------------------------------
# per-channel observer 呼叫的是同一個 ``_calculate_qparams``，只是傳進每個通道
# 的最小值和最大值；裡面每個運算都是逐元素的，所以同一個親手算的函式不用改，
# 就能用在 per-channel 的向量上。

obs = observers["per-channel"]
scales, zero_points = obs.calculate_qparams()
hand_scales, hand_zero_points = qparams_by_hand(obs.min_val, obs.max_val, -128, 127, True)
print(f"scales: {[round(v, 5) for v in scales.tolist()]}")
assert same(hand_scales, scales) and same(hand_zero_points, zero_points), "親手算的 == 函式庫"

# %%
# 每個通道都有貼合自己範圍的刻度，所以沒有一個通道的 scale 超過 per-tensor 的
# symmetric scale，而絕對值最大的那個通道剛好等於它。範圍窄的通道刻度細得多。

widest = int(torch.max(-per_channel_min, per_channel_max).argmax())
print(f"per-tensor symmetric scale：{symmetric_scale.item():.5f}")
finest, widest_scale = scales.min().item(), scales[widest].item()
print(f"per-channel：最細 {finest:.5f}，最寬（通道 {widest}）{widest_scale:.5f}")
assert (scales <= symmetric_scale).all(), "沒有一個通道的 scale 超過 per-tensor 的"
assert scales[widest] == symmetric_scale, "最寬的通道的 scale 就是 per-tensor 的"

# %%
# 畫成圖：每個通道的範圍（長條）對照 per-tensor symmetric 的範圍（虛線），
# 以及每個通道的 scale 對照 per-tensor 的 scale。

channels = range(len(scales))
fig, (ranges, steps) = plt.subplots(1, 2, figsize=(10, 3.6))
ranges.bar(channels, (per_channel_max - per_channel_min).numpy(), bottom=per_channel_min.numpy())
limit = symmetric_scale.item() * 127.5
ranges.axhline(limit, color="gray", linestyle="--", label="per-tensor symmetric 範圍")
ranges.axhline(-limit, color="gray", linestyle="--")
ranges.set(title="每個通道的範圍", xlabel="通道", ylabel="數值", ylim=(-4, 5.5))
ranges.legend(loc="upper center")
steps.bar(channels, scales.numpy(), label="per-channel scale")
steps.axhline(symmetric_scale.item(), color="gray", linestyle="--", label="per-tensor scale")
steps.set(title="每個通道的 scale", xlabel="通道", ylabel="scale", ylim=(0, 0.04))
steps.legend(loc="upper center", ncols=2)
fig.tight_layout()

# %%
# ``eps`` 只在範圍（幾乎）是空的時候才有作用：全為 0 的通道算出來的 scale 會是 0，
# 拿來當除數就出問題了，所以改用 ``eps``：

dead = PerChannelMinMaxObserver(
    ch_axis=0,
    dtype=torch.int8,
    qscheme=torch.per_channel_symmetric,
    quant_min=-128,
    quant_max=127,
    eps=EPS,
)
dead(torch.stack([torch.zeros(5), torch.linspace(-1, 1, 5)]))
dead_scales, _ = dead.calculate_qparams()
print(f"通道 0 全為 0 時的 scale：{dead_scales.tolist()}")
assert dead_scales[0] == EPS, "全為 0 的通道得到 scale eps"
assert same(dead_scales, qparams_by_hand(dead.min_val, dead.max_val, -128, 127, True)[0]), (
    "親手算的公式也一樣"
)

# %%
# .. warning::
#    這裡為了比較而對「活化值」做 per-channel 量化，但 int8 kernel 並不是這樣執行的。
#    conv 或 linear 會對輸入通道加總，而那正是活化值的通道。活化值只有一個 scale 時，
#    kernel 在整數累加器裡加總 int8 × int8 的乘積，最後把總和乘上一次
#    ``x_scale × w_scale[out]`` （weight 依「輸出」通道量化，那一軸不參與加總）。
#    每個輸入通道各有一個 scale 的話，scale 落在加總的裡面，提不出來。
#    這就是步驟 1 裡 x86 quantizer 如此選擇的原因。
#
# 拿 32 個像素的 8 個通道和一個 4 × 8 的 weight 來試：活化值 per-tensor 時，
# 一次整數加總、每個輸出一次 rescale，就得到 q/dq 圖算出的結果；活化值 per-channel 時，
# 即使用最合適的單一係數，仍然留下誤差。

pixels = data[:, :, 0, 0]  # 32 個像素 × 8 個通道，linear 加總的就是這一軸
weight = torch.linspace(-1, 1, 32).reshape(8, 4).T
w_scales = weight.abs().amax(dim=1) / 127.5
w_int = torch.round(weight / w_scales[:, None])
for name in ("minmax symmetric", "per-channel"):
    x_scales, _ = observers[name].calculate_qparams()
    x_int = torch.round(pixels / x_scales).clamp(-128, 127)
    simulated = (x_int * x_scales) @ (w_int * w_scales[:, None]).T  # q/dq 算出的
    integer_sum = (x_int @ w_int.T) * w_scales  # int8 kernel 能算的
    best = (simulated * integer_sum).sum() / integer_sum.pow(2).sum()  # 最小平方的係數
    relative = ((best * integer_sum - simulated).norm() / simulated.norm()).item()
    print(f"{name:<17} 整數加總後 rescale 一次：相對誤差 {relative:.2e}")
    assert (relative < 1e-6) == (name == "minmax symmetric"), "只有單一 scale 時完全相符"

# %%
# 步驟 5 — histogram observer
# ---------------------------
# histogram observer 看到的最小值、最大值都一樣，給出的 scale 和 zero point 卻不同。
# 它的 ``calculate_qparams`` 先在直方圖上搜尋（內部方法 ``_non_linear_param_search``），
# 找一個能降低量化平方誤差估計值的較窄範圍，再對這個範圍套用完全相同的公式：

hist = observers["histogram"]
new_min, new_max = hist._non_linear_param_search()
scale, zero_point = hist.calculate_qparams()
hand = qparams_by_hand(new_min, new_max, 0, 255, False)
print(f"記錄的範圍 {hist.min_val:.4f}..{hist.max_val:.4f}")
print(f"搜尋的範圍 {new_min:.4f}..{new_max:.4f}")
assert same(hand[0], scale) and same(hand[1], zero_point), "同一個公式，較窄的範圍"
assert hist.min_val <= new_min and new_max < hist.max_val, "搜尋只會縮小範圍"

# %%
# 這個搜尋是貪婪地一步步從比較稀疏的那一端縮小範圍，用各格的計數估計誤差，
# 估計值一變差就停下來。這裡不逐行重現它，重要的是結果：用每個 observer 的 qparams
# 量化這份資料，比較均方誤差：

rows = {}
for name, obs in observers.items():
    scale, zero_point = obs.calculate_qparams()
    mse = (round_trip(obs, data) - data).pow(2).mean().item()
    rows[name] = (scale, zero_point, mse)
    scale_text = (
        f"{scale.min():.5f}..{scale.max():.5f}" if scale.numel() > 1 else f"{scale.item():.5f}"
    )
    kind = f"{obs.dtype}, {obs.qscheme}".replace("torch.", "")
    print(f"{name:<17} {kind:<32} scale {scale_text:<16} 均方誤差 {mse:.3e}")

# %%
# 比較要在同樣的條件下。histogram observer 對 MinMax affine（都是 ``uint8``、affine、
# per-tensor）：它的刻度涵蓋的範圍比資料窄，主要窄在數值最稀疏的上端；範圍外的少數值
# 被截掉，換來其他所有值都用更細的刻度。在這份資料上這筆交易划算。per-channel 對
# MinMax symmetric（都是 ``int8``、symmetric）：每個通道一套刻度，勝過整個張量共用一套。

hist_scale, hist_zero_point, hist_mse = rows["histogram"]
low = (0 - hist_zero_point.item()) * hist_scale.item()
high = (255 - hist_zero_point.item()) * hist_scale.item()
n_below, n_above = int((data < low).sum()), int((data > high).sum())
print(f"histogram 的刻度 {low:.4f}..{high:.4f}：{n_below} 個值在下方，{n_above} 個在上方")
assert 0 < n_below + n_above < data.numel() * 1e-3, "只截掉少數極端值"
assert hist.max_val - high > low - hist.min_val, "範圍主要從上端縮小"
assert hist_scale < rows["minmax affine"][0], "刻度更細"
assert hist_mse < rows["minmax affine"][2], "在這份資料上總誤差也更低"
assert rows["per-channel"][2] < rows["minmax symmetric"][2], "per-channel 勝過 per-tensor"

# %%
# observer 保存的直方圖，縱軸取對數，稀疏的兩端才看得見；圖上標出 MinMax 用的範圍，
# 以及搜尋選出的較窄範圍：

edges = torch.linspace(hist.min_val.item(), hist.max_val.item(), hist.bins + 1)
fig, ax = plt.subplots(figsize=(10, 3.6))
ax.stairs(hist.histogram.numpy(), edges.numpy(), fill=True, label="直方圖（2048 格）")
ax.axvspan(
    hist.min_val.item(), hist.max_val.item(), color="gray", alpha=0.15, label="MinMax 的範圍"
)
ax.axvline(low, color="tab:red", linestyle="--", label="histogram observer 的範圍")
ax.axvline(high, color="tab:red", linestyle="--")
ax.set(title="histogram observer 保存的資料", xlabel="數值", ylabel="個數", yscale="log")
ax.legend(loc="upper left")
fig.tight_layout()

# %%
# 它是靠估計值驅動的搜尋，不是保證：換一份資料，MinMax 可能更好（練習 2）。
#
# 小結
# ----
# ==================  =====================================================================
# observer            由統計值算出 qparams 的方式
# ==================  =====================================================================
# MinMax, affine      範圍先撐開到包含 0，``scale = max(range / (quant_max - quant_min), eps)``；
#                     ``zero_point = quant_min - round(min / scale)``
# MinMax, symmetric   ``scale = max(max(|min|, max) / ((quant_max - quant_min) / 2), eps)``；
#                     int8 的 ``zero_point = 0``
# per-channel         同一個公式，逐通道計算（用於 weight；int8 kernel
#                     的活化值整個張量只能有一個 scale）
# histogram           先搜尋較窄的範圍，再套 affine 公式
# ==================  =====================================================================
#
# M01 到此結束：你已經能讀懂 PT2E 放進圖裡的東西，並重算其中的每一個數字。
#
# 練習
# ----
# 1. 建一個範圍 0..127 而不是 0..255 的 MinMax affine observer（即 ``reduce_range``，
#    用在沒有 VNNI 的 CPU 上），餵它同樣的資料。預測它的 scale 是 0..255 那個的幾倍。
#
#    .. dropdown:: 解答
#
#       同樣的範圍切成 127 格而不是 255 格：scale 變成 255 / 127 倍。
#
#       .. code-block:: python
#
#          reduced = MinMaxObserver(
#              dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=127
#          )
#          for batch in batches:
#              reduced(batch)
#          full_scale = observers["minmax affine"].calculate_qparams()[0]
#          ratio = reduced.calculate_qparams()[0] / full_scale
#          print(f"{ratio.item():.6f} vs 255 / 127 = {255 / 127:.6f}")
#          torch.testing.assert_close(ratio, torch.tensor([255 / 127]), rtol=1e-6, atol=0)
#
# 2. 給一個 MinMax affine 和一個 histogram observer（都是 ``uint8`` 0..255，同上）
#    餵 2048 個 -1.0 和 2048 個 1.0。哪一個的均方誤差比較低？
#
#    .. dropdown:: 解答
#
#       MinMax。兩端各有一半的資料，什麼都不該截掉；但 histogram 的搜尋靠各格的估計值，
#       仍然移動了一端，誤差反而較高。
#
#       .. code-block:: python
#
#          spikes = torch.cat([torch.full((2048,), -1.0), torch.full((2048,), 1.0)])
#          pair = {
#              "minmax": MinMaxObserver(
#                  dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255
#              ),
#              "histogram": HistogramObserver(
#                  dtype=torch.uint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=255
#              ),
#          }
#          errors = {}
#          for name, obs in pair.items():
#              obs(spikes)
#              errors[name] = (round_trip(obs, spikes) - spikes).pow(2).mean().item()
#          print(errors)
#          assert errors["minmax"] < errors["histogram"], "搜尋不是保證"
#
# 3. 用 ``common.pt2e.calibrate`` 校準步驟 1 的 ``prepared``，讀出 conv 的 weight observer。
#    從它觀察到的 weight 預測它的 scale。
#
#    .. dropdown:: 解答
#
#       依輸出通道的 symmetric int8：折疊過 BatchNorm 的 weight 每個輸出通道的
#       ``max|w| / 127.5``，正是 ``qparams_by_hand`` 從它的紀錄算出的值。
#
#       .. code-block:: python
#
#          from common.pt2e import calibrate
#
#          calibrate(prepared)
#          (weight_node,) = [n for n in observer_nodes if n.args[0].name == "conv_weight"]
#          weight_observer = prepared.get_submodule(weight_node.target)
#          folded = prepared.conv.weight
#          w_scales, _ = weight_observer.calculate_qparams()
#          hand_scales, _ = qparams_by_hand(
#              folded.amin(dim=(1, 2, 3)), folded.amax(dim=(1, 2, 3)), -128, 127, True
#          )
#          print([round(v, 5) for v in w_scales.tolist()])
#          assert same(w_scales, hand_scales), "每個輸出通道的 max|w| / 127.5"
#
# 延伸閱讀
# --------
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `PyTorch 2 Export 量化搭配 X86 後端（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_x86_inductor.html>`_
# - :ref:`疑難排解：prepare 與 convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# M02 親手寫出 ``prepare`` 和 ``convert``，並證明它們和 torchao 的相同；
# 第一步是看 quantizer 在圖裡寫了什麼：
# :ref:`M02-1 · quantizer 在圖上寫了什麼
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`。
