"""
M04-1 量測誤差
==============

到目前為止，課程裡的模型都是隨機 weight，校準用的也是雜訊。這一課在真正的手寫數字上訓練一個小型
CNN，用 ``X86InductorQuantizer`` 的預設設定量化成 int8，再拿 500 張它沒看過的測試影像評分。
準確度告訴你 int8「有沒有」代價；每個 node 的訊號量化雜訊比（SQNR）告訴你代價「在哪裡」。
你會親手逐個 node 算出 SQNR，而 torchao 的數值除錯器（numeric debugger）算出的數字與你的
逐位元相同。

**你會學到**

- 怎麼在真實資料上量測 int8 的準確度，以及為什麼只看一個數字不夠
- 逐層 SQNR：公式，以及怎麼把浮點圖與量化圖的 node 配對
- torchao 的數值除錯器，以及它會掉進去的 BatchNorm 陷阱

**先備知識**：:ref:`M01-1 · PT2E 全流程
<sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`、:ref:`M02-3 · 親手做 convert
<sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`；
:ref:`M03-3 · 量測速度與大小
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>` （為什麼要用 int8）。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``common.data`` 放的是真實資料：scikit-learn 的手寫數字（1,797 張 8×8 像素的影像，隨套件
# 附帶，不必下載），固定切成訓練資料、校準集（calibration set）與測試集（test set）。
# ``train_digits_cnn`` 在訓練資料上訓練一個小型 CNN，只用一個執行緒、固定亂數種子，
# 所以在同一種 CPU 上，每次建置得到的 weight 都逐位元相同。「同一種」指的是相同的浮點數
# kernel：AVX2 與 AVX-512 的 kernel 加總時捨入不同，訓練出的 weight 也略有不同，所以 weight
# 依 kernel 路徑（ ``describe().kernel_path`` ）分別快取，而下面每個 assert 在兩條路徑上都成立。

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.cpu import describe
from common.data import SPLITS, accuracy, digits, export_digits_model, train_digits_cnn
from common.numerics import DIGITS_CONV_BN, fold_batch_norm_modules, record, sqnr
from common.pt2e import quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

test_images, test_labels = digits("test")
calibration_images, _ = digits("calibration")
print(f"資料切分：{SPLITS}")
print(describe().verdict)


# %%
# 輔助函式：``hand_sqnr`` 是步驟 3 的公式，因為它是這一課的主題，所以在這裡親手寫出來。
# ``record`` （用 ``torch.fx.Interpreter`` 執行一張圖，把每個 node 的輸出依名稱留下）、
# ``fold_batch_norm_modules`` （在 eager 模型裡把每個 BatchNorm 模組折疊進它前面的 conv；
# ``DIGITS_CONV_BN`` 列出這個模型的配對）與 ``sqnr`` 來自 ``common.numerics``，M04-2 也從
# 那裡取用。


def hand_sqnr(signal, noisy):
    """20·log10(‖signal‖ / ‖signal − noisy‖)，單位 dB。"""
    return 20 * torch.log10(
        torch.linalg.vector_norm(signal) / torch.linalg.vector_norm(signal - noisy)
    )


def quantize(gm):
    """用 x86 預設設定跑 PT2E，以 200 張校準影像校準。"""
    prepared = prepare_pt2e(gm, x86_quantizer())
    with torch.no_grad():
        prepared(calibration_images)
    return convert_pt2e(prepared)


# %%
# 步驟 1 — 訓練浮點模型
# ------------------------------
# 在 1,097 張訓練影像上訓練六個 epoch。第一次呼叫會訓練，並把 weight 存在 ``build/cache/``
# （每條 kernel 路徑一個檔案）；之後的呼叫（其他課、另一個語言的建置）直接載入。

model = train_digits_cnn()
print(f"weight 以 {describe().kernel_path} 的 kernel 訓練")
fp32_accuracy = accuracy(model)
print(f"fp32 測試準確度：{fp32_accuracy:.1%}（共 {len(test_labels)} 張影像）")
assert fp32_accuracy > 0.95, "小型 CNN 讀得懂 8×8 的數字"

# %%
# 步驟 2 — 用預設設定量化並評分
# ------------------------------------------------
# ``export_digits_model`` 匯出時把批次維度設為動態，同一張圖就能吃 200 張校準影像，
# 也能吃 500 張測試影像。接著是 M01-1 的 PT2E 流程。

int8_model = quantize(export_digits_model(model))
int8_accuracy = accuracy(int8_model)
with torch.no_grad():
    changed = (model(test_images).argmax(1) != int8_model(test_images).argmax(1)).sum().item()
print(f"fp32 {fp32_accuracy:.1%}   int8 {int8_accuracy:.1%}   預測改變的影像：{changed}")
assert abs(int8_accuracy - fp32_accuracy) <= 0.01, "在這裡，預設設定最多損失 1 個百分點"
# sphinx_gallery_start_ignore
from common.results import publish  # 首頁引用的數字

publish("test_images", len(test_labels))
publish("fp32_accuracy", fp32_accuracy)
publish("int8_accuracy", int8_accuracy)
# sphinx_gallery_end_ignore
draw(int8_model, title="步驟 2：int8 的數字模型（X86InductorQuantizer 預設設定）")

# %%
# 步驟 3 — 親手逐個 node 算 SQNR
# -----------------------------------
# 準確度只計算預測結果改變的影像。SQNR 量的是每個中間張量偏移了多少：設 ``x`` 是某個 node
# 在一張圖裡的輸出、``x̂`` 是在另一張圖裡的輸出，
# ``SQNR = 20·log10(‖x‖ / ‖x − x̂‖)`` dB。
# 每多 6 dB，誤差減半；40 dB 表示誤差是訊號的 1%。
#
# ``convert_pt2e`` 保留原本 node 的名稱，所以配對只要依名稱查表。不過 ``prepare_pt2e``
# 已經把 BatchNorm 折疊進 conv：浮點圖的 ``conv2d`` （在 BatchNorm 之前）和 int8 圖的
# ``conv2d`` （包含 BatchNorm）算的不是同一件事。先在 eager 模型裡折疊 BatchNorm，
# 浮點圖才能拿來比較。

folded = fold_batch_norm_modules(model, pairs=DIGITS_CONV_BN)
with torch.no_grad():
    torch.testing.assert_close(folded(test_images), model(test_images), rtol=0, atol=1e-4)
float_graph = export_digits_model(folded)
float_outputs = record(float_graph, test_images)
int8_outputs = record(int8_model, test_images)
layers = [n.name for n in float_graph.graph.nodes if n.op == "call_function"]
by_hand = {name: hand_sqnr(int8_outputs[name], float_outputs[name]).item() for name in layers}
for name, value in by_hand.items():
    print(f"{name:>12}  {value:6.2f} dB")

# %%
# 引數的順序有一點影響：步驟 4 的數值除錯器把「量化後」的張量當作訊號，所以 ``by_hand``
# 也這麼做。改用課本的寫法、以浮點張量為訊號，沒有一個 node 的差距超過 0.05 dB。
# 其他幾課用的 ``common.numerics.sqnr`` 就是 torchao 的 ``compute_error``：數字逐位元相同。

textbook = {name: hand_sqnr(float_outputs[name], int8_outputs[name]).item() for name in layers}
gap = max(abs(textbook[name] - by_hand[name]) for name in layers)
print(f"兩種寫法的最大差距：{gap:.4f} dB")
assert gap < 0.05, "在這樣的 SQNR 下，選哪個當訊號幾乎沒有差別"
assert all(
    by_hand[name] == sqnr(int8_outputs[name], float_outputs[name]).item() for name in layers
), "共用的 sqnr 就是這一個"

# %%
# 步驟 4 — torchao 的數值除錯器
# -----------------------------------
# 除錯器用四個呼叫做同一件事：``generate_numeric_debug_handle`` 標記匯出的程式，
# ``prepare_for_propagation_comparison`` 在副本的每個 node 後面放一個 logger，
# ``extract_results_from_loggers`` 收集它們看到的值，``compare_results`` 把 node 配對。
# 浮點模型與 int8 模型必須來自同一次標記過的匯出。``debugger_sqnr`` 對一個浮點模型與它的
# int8 版本做這四個呼叫；這個步驟會呼叫它兩次。


def debugger_sqnr(float_model):
    """數值除錯器算出的每個 node 的 SQNR：``float_model`` 對上它的 int8 版本。"""
    batch = torch.export.Dim("batch")
    program = torch.export.export(float_model, (test_images[:2],), dynamic_shapes=({0: batch},))
    generate_numeric_debug_handle(program)
    marked = program.module()
    float_logged = prepare_for_propagation_comparison(marked)  # 副本：``marked`` 保持原樣
    int8_logged = prepare_for_propagation_comparison(quantize(marked))
    with torch.no_grad():
        float_logged(test_images)
        int8_logged(test_images)
    comparison = compare_results(
        extract_results_from_loggers(float_logged), extract_results_from_loggers(int8_logged)
    )
    return {info.name: summary.results[0].sqnr.item() for info, summary in comparison.items()}


# %%
# 折疊後的模型對上它的 int8 版本，和步驟 3 親手比較的一樣：

debugger = debugger_sqnr(folded)
print(f"比較了 {len(debugger)} 個 node：{list(debugger)}")

# %%
# 除錯器把 int8 圖的 node 與它源自的浮點 node 配對（沿著 ``node.meta["from_node"]``
# 回溯到匯出時，並以原本的 node 為這一對命名）。它比較的 node 正是我們親手比較的那些，
# 得到的 SQNR 也完全相同。

assert set(debugger) == set(by_hand), "相同的 node"
assert all(debugger[name] == by_hand[name] for name in by_hand), "相同的數字，逐位元相同"
print("每個 node：除錯器 == 親手計算")

# %%
# BatchNorm 陷阱。一開始很容易直接把帶著 BatchNorm 的模型交給除錯器：它照樣把
# ``conv2d`` 與 ``conv2d`` 配對，回報一個任何 quantizer 都造不出來的 SQNR。
# 這麼低的數字來自 BatchNorm，不是 int8。

trap = debugger_sqnr(model)
print(
    f"conv2d：浮點模型帶著 BatchNorm 時 {trap['conv2d']:.2f} dB，"
    f"折疊之後 {by_hand['conv2d']:.2f} dB"
)
assert trap["conv2d"] < 10 < by_hand["conv2d"], "沒折疊的參考模型讓 conv2d 看起來壞掉了"

# %%
# 步驟 5 — 畫出每個 node 的 SQNR
# --------------------------------
# SQNR 不是一路往下掉的累計值：它在第三個 conv（``conv2d_2``）之後最低，過了兩個 linear 層
# 反而又變高。準確度下降時，先看最低的那一根；M04-2 會說明為什麼每個張量只看一個數字
# 仍可能誤導你。

worst = min(by_hand, key=by_hand.get)
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.bar(layers, [by_hand[name] for name in layers], color="#4c72b0")
ax.bar([worst], [by_hand[worst]], color="#c44e52")
ax.set_ylabel("SQNR (dB)")
ax.set_title("每個 node 的 SQNR，int8 對浮點，500 張測試影像")
ax.tick_params(axis="x", rotation=45)
fig.tight_layout()
print(f"最差的 node：{worst}，{by_hand[worst]:.2f} dB")
assert worst == "conv2d_2" and by_hand["linear"] > by_hand[worst], "在第三個 conv 最低"


# %%
# 小結
# ----
# - 用 x86 預設設定量化成 int8，這個模型的準確度沒有損失：準確度是判決，不是診斷。
# - SQNR，20·log10(‖x‖/‖x − x̂‖)，量測每一個 node；先在浮點模型裡折疊 BatchNorm，
#   再依名稱配對 node。
# - torchao 的數值除錯器（``generate_numeric_debug_handle``、
#   ``prepare_for_propagation_comparison``、``extract_results_from_loggers``、
#   ``compare_results``）給出相同的數字，也有相同的 BatchNorm 陷阱。
#
# 練習
# ----
# 1. 只用前 8 張校準影像校準，而不是 200 張。先預測：準確度的變化會超過一個百分點嗎？
#    最差的 SQNR 會升高還是降低？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          prepared = prepare_pt2e(export_digits_model(model), x86_quantizer())
#          with torch.no_grad():
#              prepared(calibration_images[:8])
#          small = convert_pt2e(prepared)
#          small_outputs = record(small, test_images)
#          small_sqnr = {n: sqnr(small_outputs[n], float_outputs[n]).item() for n in layers}
#          print(f"準確度 {accuracy(small):.1%}，最差 {min(small_sqnr.values()):.2f} dB")
#          assert abs(accuracy(small) - int8_accuracy) <= 0.01, "在這裡 8 張就夠了"
#          assert min(small_sqnr.values()) < min(by_hand.values()), "但雜訊變大了"
#
# 2. ``conv2d`` （第一個 conv）的誤差裡，有多少來自 weight 本身的捨入？計算
#    ``folded.conv1.weight`` 與它 per-channel int8 版本之間的 SQNR。先預測：會高於還是低於
#    這個 node 的 SQNR？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          weight = folded.conv1.weight.detach()
#          scale = weight.abs().amax(dim=(1, 2, 3), keepdim=True) / 127.5
#          rounded = torch.clamp(torch.round(weight / scale), -128, 127) * scale
#          weight_sqnr = sqnr(weight, rounded).item()
#          print(f"只看 weight：{weight_sqnr:.2f} dB，node：{by_hand['conv2d']:.2f} dB")
#          assert weight_sqnr > by_hand["conv2d"], "輸入的捨入誤差疊加在 weight 的誤差上"
#
# 延伸閱讀
# --------
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`_
# - `torch.export：動態形狀（PyTorch） <https://docs.pytorch.org/docs/stable/export.html>`_
#
# 下一課
# ------
# 在這裡，預設設定沒有損失。:ref:`M04-2 · 修好它
# <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>` 從一個真的會掉準確度的配方出發，
# 用這些工具找出元凶，並量測每一種修法。
