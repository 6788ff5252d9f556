"""
M05-2 靜態與動態 int8
============================

靜態量化（靜態 int8）在校準時就固定每個活化值的 scale；**動態** int8 則對每個批次，從批次本身重新
計算。設定 ``is_dynamic=True`` 時，x86 quantizer 把這個計算寫進圖裡：每個被量化的輸入前面
都有一個 ``choose_qparams`` node。本課讀懂這些 node，看 scale 隨批次改變，檢查動態模型
的校準還在做什麼（torchao 的文件說仍需校準；確實如此，是為了 weight），並在訓練好的 ViT
上量測兩種配方：準確度、數值除錯器逐個 node 的 SQNR，以及比任何校準影像都亮的輸入。課程的
``handmade.prepare`` ／ ``convert`` 在動態設定下也與 torchao 的逐位元相同。

**你會學到**

- ``is_dynamic=True`` 在圖裡放了什麼，以及校準還量測什麼
- 動態 int8 在哪裡和靜態 int8 一樣，又在哪裡撐得住而靜態 int8 失效
- 如何在批次大小是動態的圖上執行數值除錯器

**先備知識**： :ref:`M05-1 · quantizer 在 attention 裡看見什麼
<sphx_glr_lessons_m05_transformers_m05_1_attention.py>`、 :ref:`M04-1 · 量測誤差
<sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``train_digits_vit`` 在手寫數字的訓練集上，以可重現的方式訓練 M05-1 的 ViT（q／k／v
# linear 加 SDPA），並把 weight 存在 ``build/cache/`` 。模型以動態批次大小匯出一次，並為
# 數值除錯器做好標記（M04-1）；下面每個量化模型都從這次匯出的副本開始。

import copy
import warnings
from collections import Counter

import torch

from common.charts import pad
from common.data import accuracy, digits, train_digits_vit
from common.expect import expect_error
from common.numerics import sqnr
from common.pt2e import quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)
from torchao.quantization.pt2e.observer import PerChannelMinMaxObserver, PlaceholderObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade

model = train_digits_vit()
calibration_images, _ = digits("calibration")
test_images, test_labels = digits("test")
batch = torch.export.Dim("batch")
program = torch.export.export(model, (test_images[:2],), dynamic_shapes=({0: batch},))
generate_numeric_debug_handle(program)
marked = program.module()
qd = torch.ops.quantized_decomposed
# 印出的文字怎麼稱呼這三個模型（程式碼以鍵稱呼它們）。
LABELS = {"fp32": "fp32", "static": "int8 靜態", "dynamic": "int8 動態"}

# %%
# 輔助函式： ``dynamic_x86`` 是設定 ``is_dynamic=True`` 的 x86 quantizer； ``quantize``
# 對匯出結果的新副本執行 prepare，送進一批校準影像（除非另外指定），再 convert；
# ``qdq_ops`` 計算圖裡量化相關 node 的數量。 ``sqnr`` （來自 ``common.numerics`` ）是 M04-1
# 的公式。


def dynamic_x86():
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return X86InductorQuantizer().set_global(config)


def quantize(quantizer, images=calibration_images, *, by_hand=False):
    prepare, convert = (
        (handmade.prepare, handmade.convert) if by_hand else (prepare_pt2e, convert_pt2e)
    )
    prepared = prepare(copy.deepcopy(marked), quantizer)
    if images is not None:
        with torch.no_grad():
            prepared(images)
    return convert(prepared)


def qdq_ops(gm) -> dict:
    names = (str(n.target).removeprefix("quantized_decomposed.") for n in gm.graph.nodes)
    return dict(Counter(name for name in names if "quantize" in name or "choose" in name))


# %%
# 步驟 1 — is_dynamic=True 在圖裡放了什麼
# ----------------------------------------
# 靜態模型用 ``quantize_per_tensor.default`` 量化每個 linear 的輸入，它的 scale 是 convert
# 時就固定的 Python 數字。動態模型則在每個輸入前面放一個 ``choose_qparams.tensor``
# node：它讀取活化值，以張量形式回傳 scale 與 zero point，交給 ``quantize_per_tensor.tensor``
# 與 ``dequantize_per_tensor.tensor`` 使用。兩者的 weight 都是 per-channel int8。

static = quantize(x86_quantizer())
dynamic = quantize(dynamic_x86())
print(f"靜態：{qdq_ops(static)}")
print(f"動態：{qdq_ops(dynamic)}")
chooses = dynamic.graph.find_nodes(op="call_function", target=qd.choose_qparams.tensor)
assert len(chooses) == 10, "每個被量化的活化值一個（q、k、v 共用同一個）"
assert "quantize_per_tensor.default" not in qdq_ops(dynamic), "沒有固定的活化值 scale"
assert qdq_ops(static)["quantize_per_tensor.default"] == 10

# %%
# 下圖是用動態設定單獨量化的第一個 encoder block， ``choose_qparams`` node 以醒目標示：
# 每一個都讀取它要量化的張量。

tokens = (torch.randn(8, 17, 32, generator=torch.Generator().manual_seed(0)),)
block = prepare_pt2e(torch.export.export(model.blocks[0], tokens).module(), dynamic_x86())
block(*tokens)
block = convert_pt2e(block)
chosen = [
    n.name for n in block.graph.find_nodes(op="call_function", target=qd.choose_qparams.tensor)
]
draw(block, highlight=chosen, title="動態 int8：每個被量化的輸入前都有 choose_qparams")
assert len(chosen) == 4, "q／k／v 的輸入、attention 的輸出、fc1 與 fc2 的輸入"

# %%
# 步驟 2 — 每個批次一個 scale
# ----------------------------
# 記下第一個 block 裡、q／k／v 輸入前那個 ``choose_qparams`` 回傳的 scale（和 M03-1 一樣用
# ``torch.fx.Interpreter`` ）：送進一張影像和整個測試集，得到兩個不同的 scale。靜態模型對同一個
# 張量的 scale 則是圖裡的一個數字，不論批次為何。


def first_scale(gm, images) -> float:
    seen = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if node is chooses[1]:
                seen.append(result[0].item())
            return result

    with torch.no_grad():
        Recorder(gm).run(images)
    return seen[0]


one, many = first_scale(dynamic, test_images[:1]), first_scale(dynamic, test_images)
fixed = static.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)[1]
print(f"動態：一張影像的 scale {one:.5f}，500 張 {many:.5f}；靜態：{fixed.args[1]:.5f}")
assert one != many, "由每個批次算出"
assert isinstance(fixed.args[1], float), "靜態圖裡的常數"

# %%
# 步驟 3 — 校準還在做什麼
# ------------------------
# torchao 的文件說動態模型也要校準（pytorch/ao#4307：「Calibration is a must for both
# static and dynamic quantization」）。prepare 後的模型說明了原因：活化值上掛的是什麼都不記錄
# 的 ``PlaceholderObserver`` ，但每個 weight 仍然有 ``PerChannelMinMaxObserver`` ，而 PT2E
# 的 weight observer 只有在模型執行時才看得到它的 weight。不執行就 convert，每個 weight 都
# 拿到預設的 scale：torchao 發出警告，模型辨識數字的能力不比亂猜好。

prepared = prepare_pt2e(copy.deepcopy(marked), dynamic_x86())
kinds = Counter(type(m).__name__ for n, m in prepared.named_children() if "activation_post" in n)
print(dict(kinds))
assert set(kinds) == {PlaceholderObserver.__name__, PerChannelMinMaxObserver.__name__}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    never_run = convert_pt2e(prepared)
print(f"{len(caught)} 個警告，例如 {str(caught[0].message)!r}")
print(f"未校準的動態模型：準確度 {accuracy(never_run):.1%}")
assert "must run observer before calling calculate_qparams" in str(caught[0].message)
assert accuracy(never_run) < 0.3

# %%
# 不過用什麼資料都可以：不論送進什麼，weight 都一樣。用七張雜訊影像校準的動態模型，
# 與用手寫數字校準的逐位元相同。

noise = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(0))
on_noise = quantize(dynamic_x86(), noise)
with torch.no_grad():
    assert torch.equal(on_noise(test_images), dynamic(test_images)), "校準資料無關緊要"
print("用雜訊校準 == 用手寫數字校準")

# %%
# 步驟 4 — 準確度
# ----------------
# 在 500 張測試影像上，三個模型辨識得一樣好：500 張影像組成的批次，涵蓋的範圍和 200 張校準
# 影像差不多，所以動態 int8 算出的 scale 和靜態的很接近。

scores = {
    "fp32": accuracy(model),
    "static": accuracy(static),
    "dynamic": accuracy(dynamic),
}
for key, score in scores.items():
    print(f"{pad(LABELS[key], 13)} {score:.1%}")
assert min(scores.values()) > scores["fp32"] - 0.03, "int8 最多只多錯幾張測試影像"

# %%
# 步驟 5 — 用數值除錯器逐個 node 比較
# ------------------------------------
# M04-1 的除錯器比較浮點圖與 int8 圖的每一個 node。在批次大小是動態的圖上，它會遇到一個輸出
# 不是張量的 node（ ``sym_size`` ，也就是批次大小），而 ``compare_results`` 以 ``ValueError``
# 拒絕它；只保留張量即可。

float_logged = prepare_for_propagation_comparison(marked)
logged = {
    label: prepare_for_propagation_comparison(m)
    for label, m in (("static", static), ("dynamic", dynamic))
}
with torch.no_grad():
    for m in (float_logged, *logged.values()):
        m(test_images)
reference = extract_results_from_loggers(float_logged)
with expect_error(ValueError, match="sym_size"):
    compare_results(reference, extract_results_from_loggers(logged["static"]))


def tensors_only(results):
    return {k: v for k, v in results.items() if isinstance(v[2][0], torch.Tensor)}


per_node = {}
for label, m in logged.items():
    compared = compare_results(
        tensors_only(reference), tensors_only(extract_results_from_loggers(m))
    )
    per_node[label] = {
        info.name: summary.results[0].sqnr.item() for info, summary in compared.items()
    }

# %%
# 每個 linear 輸出的 SQNR，以及 logits 的（ ``linear_12`` ，輸出層）。靜態與動態
# 從頭到尾都相差不到一分貝，兩者的 SQNR 都隨著捨入誤差累積，一個 block 接一個 block 下降。

linear_names = [name for name in per_node["static"] if name.startswith("linear")]
for name in linear_names:
    print(
        f"{name:10} 靜態 {per_node['static'][name]:6.2f} dB",
        f"  動態 {per_node['dynamic'][name]:6.2f} dB",
    )
gaps = [abs(per_node["static"][n] - per_node["dynamic"][n]) for n in linear_names]
assert max(gaps) < 2, "在這份資料上，兩種配方一樣準確"

# %%
# 動態 int8 划算的地方：和校準集不一樣的輸入。把測試影像調亮成兩倍。靜態模型把每個
# 活化值截在校準時的範圍；動態模型則量測新的範圍。和浮點模型在同樣影像上的輸出相比，
# 靜態模型 logits 的 SQNR 崩落，動態模型的幾乎不動。

bright = 2 * test_images[:200]
with torch.no_grad():
    reference_logits = model(bright)
    shifted = {
        key: sqnr(reference_logits, m(bright)).item()
        for key, m in (("static", static), ("dynamic", dynamic))
    }
print({LABELS[key]: f"{value:.1f} dB" for key, value in shifted.items()}, "（影像 ×2）")
assert shifted["dynamic"] > 30 and shifted["static"] < 20, "靜態截斷，動態自行調整"

# %%
# 步驟 6 — 親手做 prepare 與 convert，動態量化也一樣
# ----------------------------------------------------
# ``common.handmade`` （M02）寫出同樣的 ``choose_qparams`` node：convert 後的程式碼就是
# torchao 的，輸出也逐位元相同。

by_hand = quantize(dynamic_x86(), by_hand=True)
assert by_hand.code == dynamic.code, "相同的圖"
with torch.no_grad():
    assert torch.equal(by_hand(test_images), dynamic(test_images)), "相同的輸出"
print("handmade 的動態模型 == torchao 的動態模型")

# %%
# 小結
# ----
# ===================================  ==========================  ================================
# \                                    靜態 int8                   動態 int8
# ===================================  ==========================  ================================
# 活化值的 scale                       convert 時固定              每個批次由 ``choose_qparams`` 算
# 校準                                 活化值與 weight             只有 weight，資料不拘
# 測試集上                             和 fp32 一樣準確            相同
# 輸入 ×2                              截斷：SQNR 崩落             自行調整
# ===================================  ==========================  ================================
#
# 練習
# ----
# 1. 一次只送一張測試影像給動態模型。預測：logits 和這張影像在 500 張的批次裡得到的相等嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          with torch.no_grad():
#              alone = torch.cat([dynamic(test_images[i : i + 1]) for i in range(20)])
#              in_batch = dynamic(test_images)[:20]
#          assert not torch.equal(alone, in_batch), "每個批次有自己的 scale"
#
# 2. 用 ``lower_pt2e_quantized_to_x86`` （M03-1）把動態模型下放到 oneDNN，範例輸入是 8 張
#    影像的批次。預測下放後的圖有幾個 oneDNN int8 運算。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
#
#          lowered = lower_pt2e_quantized_to_x86(dynamic, (test_images[:8],))
#          onednn = [str(n.target) for n in lowered.graph.nodes if "onednn" in str(n.target)]
#          assert onednn == ["onednn.qlinear_pointwise.tensor"], "輸出層：2-D，和 M05-1 一樣"
#
# 延伸閱讀
# --------
# - `透過 Inductor 使用 x86 後端的 PT2E 量化（torchao）
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
#   （動態量化是其中一種配方）
# - `pytorch/ao#4307：靜態與動態量化都必須校準
#   <https://github.com/pytorch/ao/pull/4307>`_
#
# 下一課
# ------
# M05-3 逐層決定要量化什麼。
