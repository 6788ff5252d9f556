"""
M01-3 observer 如何把統計值變成 qparams
========================================

observer 做兩件事：資料流過時記下統計值；``convert_pt2e`` 來要的時候，再用
``calculate_qparams()`` 把統計值換算成 scale 和 zero point。MinMax observer 記的是最小值和
最大值，公式只有五行；per-channel observer 對每個 channel 套同一個公式；histogram observer
則先搜尋一個較窄的範圍，犧牲少數被截掉的極端值，換來更細的刻度。本課把同一份 activation
餵給這四種 observer，再親手算出它們的 qparams。

**你會學到**

- MinMax 的確切公式（affine 與 symmetric，包含 ``eps`` ）以及 per-channel 的版本
- x86 quantizer 在 activation 和 weight 上各放哪一種 observer、用什麼設定
- histogram observer 哪裡不一樣，付出什麼、換到什麼

**先備知識**：M01-2（q/dq 節點和裡面的數字）。
"""

# %%
# 準備
# ----
# observer 定義在 ``torchao.quantization.pt2e.observer`` 。資料是真的：``small_cnn`` 的 conv
# 接 BatchNorm、還沒經過 ReLU 的輸出，輸入是 M01-1 的四批校準資料，共 4 × 8 張圖片，每張
# 8 個 channel × 16 × 16，總計 65,536 個值。

import torch

from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.observer import (  # noqa: E402
    HistogramObserver,
    MinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e  # noqa: E402

Q = torch.ops.quantized_decomposed
model = get_model("small_cnn")
with torch.no_grad():
    batches = [model.bn(model.conv(example_inputs(8, seed=seed)[0])) for seed in range(4)]
data = torch.cat(batches)
print(f"資料：{tuple(data.shape)}，{data.numel()} 個值，{data.min():.4f}..{data.max():.4f}")


def same(a, b):
    """值、dtype 和 shape 都相同：比 torch.equal 嚴格（torch.equal 不看 dtype）。"""
    return torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape


# %%
# 步驟 1 — x86 quantizer 用的 observer
# ------------------------------------
# 用 ``X86InductorQuantizer`` 做 ``prepare_pt2e`` ，每條 activation 的邊都會放一個
# ``HistogramObserver`` ，每個 weight 放一個 ``PerChannelMinMaxObserver`` （M01-1）。

prepared = prepare_pt2e(export_module(model, example_inputs(8)), x86_quantizer())
observer_nodes = [
    node
    for node in prepared.graph.nodes
    if node.op == "call_module" and isinstance(prepared.get_submodule(node.target), ObserverBase)
]
draw(
    prepared, highlight=[n.name for n in observer_nodes], title="步驟 1：x86 quantizer 的 observer"
)

# %%
# 它們的設定：activation 用 ``uint8`` 0..255，zero point 是 affine 的；weight 用 ``int8``
# -128..127，symmetric，依輸出 channel 量化（ ``ch_axis=0`` ）。兩者都以 ``eps = 2**-12``
# 作為 scale 的下限。下面自己建立的 observer 用的就是這些設定。

EPS = 2**-12
for node in observer_nodes:
    obs = prepared.get_submodule(node.target)
    print(f"{node.args[0].name:>12}: {type(obs).__name__:<24} {obs.dtype} {obs.qscheme}")
    print(f"{'':>14}quant_min={obs.quant_min}, quant_max={obs.quant_max}, eps={obs.eps.item()}")
    assert obs.eps.item() == EPS
    if isinstance(obs, HistogramObserver):
        assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == (
            torch.uint8,
            torch.per_tensor_affine,
            0,
            255,
        )
    else:
        assert isinstance(obs, PerChannelMinMaxObserver) and obs.ch_axis == 0
        assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == (
            torch.int8,
            torch.per_channel_symmetric,
            -128,
            127,
        )

# %%
# 步驟 2 — 四個 observer 餵同一份資料
# -----------------------------------
# 兩個 per-tensor 的 MinMax observer：一個 affine（像 activation），一個 symmetric（像 weight，
# 但整個 tensor 只用一個 scale）；一個沿這些 activation 的 channel 軸（axis 1）的 per-channel
# MinMax observer；以及 activation 用的 histogram observer。

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
# MinMax observer 記的是累計的最小值和最大值，也就是它看過的所有資料的最小值和最大值，
# 一點不差。per-channel 的每個 channel 各記一組；histogram observer 除了 2048 格的直方圖，
# 也記著這兩個值。

per_channel_min, per_channel_max = data.transpose(0, 1).flatten(1).aminmax(dim=1)
for name in ("minmax affine", "minmax symmetric", "histogram"):
    assert same(observers[name].min_val, data.min()) and same(observers[name].max_val, data.max())
assert same(observers["per-channel"].min_val, per_channel_min), "每個 channel 一個最小值"
assert same(observers["per-channel"].max_val, per_channel_max), "每個 channel 一個最大值"
print(f"各 channel 的最大值：{[round(v, 3) for v in per_channel_max.tolist()]}")
print(f"直方圖：{observers['histogram'].histogram.numel()} 格")

# %%
# 步驟 3 — 親手算 MinMax 的 affine 與 symmetric
# ---------------------------------------------
# ``observer.py`` 的 ``_calculate_qparams`` 先把範圍撐開到包含 0（0 必須能被精確表示）。
# affine（仿射量化）：把範圍切成 ``quant_max - quant_min`` 格，zero point 是剛好落在 0 的那個整數。
# symmetric（對稱量化）：把範圍撐成以 0 為中心對稱，zero point 是 0（int8 的情況）。
# 兩者的 scale 都不小於 ``eps`` 。下面的函式照函式庫的運算、照同樣的順序寫。


def qparams_by_hand(min_val, max_val, quant_min, quant_max, symmetric):
    """MinMax 的 scale 和 zero point，照 _calculate_qparams 對 int8／uint8 的算法。"""
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


for name, symmetric in (("minmax affine", False), ("minmax symmetric", True)):
    obs = observers[name]
    scale, zero_point = obs.calculate_qparams()
    hand = qparams_by_hand(obs.min_val, obs.max_val, obs.quant_min, obs.quant_max, symmetric)
    print(
        f"{name:<17} scale={scale.item():.6f} zero_point={zero_point.item():>3} {zero_point.dtype}"
    )
    assert same(hand[0], scale) and same(hand[1], zero_point), f"{name}：親手算 == 函式庫"

# %%
# 同一份資料，symmetric 的 scale 不可能比 affine 小：它涵蓋
# ``-max(|min|, max)..max(|min|, max)`` ，這個範圍包含了 ``min..max`` 。如果資料幾乎都是正的
# （例如 ReLU 之後），symmetric 會浪費將近一半的刻度，這就是 activation 用 affine 的原因。

affine_scale = observers["minmax affine"].calculate_qparams()[0]
symmetric_scale = observers["minmax symmetric"].calculate_qparams()[0]
print(f"symmetric / affine scale = {(symmetric_scale / affine_scale).item():.4f}")
assert symmetric_scale >= affine_scale

# %%
# 步驟 4 — 親手算 per-channel MinMax
# ----------------------------------
# per-channel observer 呼叫的是同一個 ``_calculate_qparams`` ，只是傳進每個 channel 的最小值
# 和最大值；裡面每個運算都是逐元素的，所以同一個親手算的函式不用改就能用在 per-channel 的向量上。

obs = observers["per-channel"]
scales, zero_points = obs.calculate_qparams()
hand_scales, hand_zero_points = qparams_by_hand(obs.min_val, obs.max_val, -128, 127, True)
print(f"各 channel 的 scale：{[round(v, 5) for v in scales.tolist()]}")
assert same(hand_scales, scales) and same(hand_zero_points, zero_points), "親手算 == 函式庫"

# %%
# 每個 channel 都有貼合自己範圍的刻度，所以沒有一個 channel 的 scale 超過 per-tensor 的
# symmetric scale，而絕對值最大的那個 channel 剛好等於它。範圍窄的 channel 刻度細得多。

widest = int(torch.max(-per_channel_min, per_channel_max).argmax())
print(f"per-tensor symmetric 的 scale：{symmetric_scale.item():.5f}")
finest, widest_scale = scales.min().item(), scales[widest].item()
print(f"per-channel：最細 {finest:.5f}，最寬（channel {widest}）{widest_scale:.5f}")
assert (scales <= symmetric_scale).all() and scales[widest] == symmetric_scale

# %%
# ``eps`` 只在範圍（幾乎）是空的時候才有作用：全為 0 的 channel 算出來的 scale 會是 0，
# 拿來當除數就出問題了，所以改用 ``eps`` ：

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
print(f"channel 0 全為 0 時的 scale：{dead_scales.tolist()}")
assert dead_scales[0] == EPS and same(
    dead_scales, qparams_by_hand(dead.min_val, dead.max_val, -128, 127, True)[0]
)

# %%
# 步驟 5 — histogram observer
# ---------------------------
# histogram observer 看到的最小值、最大值都一樣，給出的 scale 和 zero point 卻不同。它的
# ``calculate_qparams`` 先在直方圖上搜尋（內部方法 ``_non_linear_param_search`` ），找出估計
# 的量化平方誤差最小的範圍，再對這個範圍套用完全相同的公式：

hist = observers["histogram"]
new_min, new_max = hist._non_linear_param_search()
scale, zero_point = hist.calculate_qparams()
hand = qparams_by_hand(new_min, new_max, 0, 255, False)
print(f"記下的範圍 {hist.min_val:.4f}..{hist.max_val:.4f}")
print(f"搜尋到的範圍 {new_min:.4f}..{new_max:.4f}")
assert same(hand[0], scale) and same(hand[1], zero_point), "同一個公式，較窄的範圍"
assert hist.min_val <= new_min and new_max < hist.max_val, "搜尋只會把範圍縮小"

# %%
# 這個搜尋是貪婪地一步步從比較稀疏的那一端縮小範圍，用各格的計數估計誤差，估計值一變差就
# 停下來。這裡不逐行重現它，重要的是結果：用每個 observer 的 qparams 量化這份資料來比較：

rows = {}
for name, obs in observers.items():
    scale, zero_point = obs.calculate_qparams()
    if name == "per-channel":
        q = Q.quantize_per_channel.default(data, scale, zero_point, 1, -128, 127, torch.int8)
        restored = Q.dequantize_per_channel.default(q, scale, zero_point, 1, -128, 127, torch.int8)
    else:
        qmin, qmax, dtype = obs.quant_min, obs.quant_max, obs.dtype
        args = (float(scale), int(zero_point), qmin, qmax, dtype)
        restored = Q.dequantize_per_tensor.default(
            Q.quantize_per_tensor.default(data, *args), *args
        )
    rows[name] = (scale, zero_point, (restored - data).pow(2).mean().item())

# %%
print("observer                     scale  zero point        均方誤差")
for name, (scale, zero_point, mse) in rows.items():
    scale_text = (
        f"{scale.min():.5f}..{scale.max():.5f}" if scale.numel() > 1 else f"{scale.item():.5f}"
    )
    zp_text = f"0 ×{zero_point.numel()}" if zero_point.numel() > 1 else str(zero_point.item())
    print(f"{name:<17} {scale_text:>16} {zp_text:>11} {mse:>15.3e}")

# %%
# histogram observer 付出與換到的：它的刻度涵蓋的範圍比資料窄（主要在最稀疏的上端），範圍外
# 的少數值會被截掉；換來的是其他所有值都用更細的刻度。在這份資料上這筆交易划算：均方誤差比
# MinMax 的範圍低。但它是靠估計值驅動的搜尋，不是保證，而且只會修掉兩端少見的極端值。
# per-channel 讓每個 channel 用自己的刻度，效果又更好。

hist_scale, hist_zero_point, hist_mse = rows["histogram"]
low = (0 - hist_zero_point.item()) * hist_scale.item()
high = (255 - hist_zero_point.item()) * hist_scale.item()
n_clipped = int(((data < low) | (data > high)).sum())
print(
    f"histogram 的刻度涵蓋 {low:.4f}..{high:.4f}：{n_clipped} 個值在範圍外（共 {data.numel()} 個）"
)
assert 0 < n_clipped < data.numel() * 1e-3, "只截掉少數極端值"
assert hist_scale < rows["minmax affine"][0], "刻度更細"
assert hist_mse < rows["minmax affine"][2], "在這份資料上總誤差也更低"
assert rows["per-channel"][2] < hist_mse, "per-channel 對每個 channel 貼合得更好"

# %%
# 小結
# ----
# ==================  =====================================================================
# observer            由統計值算出 qparams 的方式
# ==================  =====================================================================
# MinMax, affine      範圍先撐開到包含 0，``scale = max(range / (quant_max - quant_min), eps)``；
#                     ``zero_point = quant_min - round(min / scale)``
# MinMax, symmetric   ``scale = max(max(|min|, max) / ((quant_max - quant_min) / 2), eps)``；
#                     int8 的 ``zero_point = 0``
# per-channel         同一個公式，逐 channel 計算
# histogram           先搜尋較窄的範圍，再套 affine 公式
# ==================  =====================================================================
#
# M01 到此結束：你已經能讀懂 PT2E 放進圖裡的東西，並親手算出其中每個數字。M02 會親手寫
# ``prepare`` 和 ``convert`` ，並證明它們和 torchao 的結果相同。
