"""
快速入門：一頁把訓練好的模型變成 int8
=====================================

一個以真實手寫數字訓練的小型 CNN，走過 PT2E 量化的每一步——匯出、``X86InductorQuantizer``、
校準、``convert_pt2e``——再由開啟凍結（freezing）的 ``torch.compile`` 換成真正的 int8 運算。
接著和浮點模型比一比：在 500 張沒看過的影像上的準確度、在這顆 CPU 上的速度，以及存檔的大小。
這一頁的每一行程式都是課程的一個單元：每個步驟都連到講解它的那一課。

**你會學到**

- 六個步驟走完 PT2E 全流程，以及每一步由哪一課講解
- int8 在這顆 CPU 上為一個小模型帶來什麼：實際量到的準確度、速度與大小

**先備知識**：不需要；會用 PyTorch 即可。``torch.compile`` 需要 C++ 編譯器（ ``g++`` ）。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 步驟 1 — 訓練浮點模型
# ---------------------
# ``common.data`` 提供 scikit-learn 內附的手寫數字（8×8 像素，不必下載），以及用它們以固定方式
# 訓練的 CNN；weight 快取在 ``build/`` 底下。
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# 介紹了它們。

import io
import warnings
import zipfile

import torch
from torch._dynamo.utils import counters

from common.data import accuracy, digits, export_digits_model, train_digits_cnn
from common.pt2e import quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw

quiet()  # 這套工具已知的匯入雜訊（torchao 只給 CUDA 用的運算、棄用警告）
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

model = train_digits_cnn()
images, labels = digits("test")

# %%
# 步驟 2 — 匯出、prepare、校準、convert
# -------------------------------------
# ``torch.export`` 把模型變成一張圖
# （:ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`）。
# ``prepare_pt2e`` 詢問 quantizer 要量化什麼，並插入 observer
# （:ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`、
# :ref:`M02-1 · quantizer 在圖上寫了什麼
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`）；200 張校準影像讓它們
# 記下數值範圍
# （:ref:`M01-3 · observer 如何把統計值變成 qparams
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`）；
# ``convert_pt2e`` 把 observer 換成 quantize／dequantize node，並存下 int8 weight
# （:ref:`M01-2 · q/dq node 和裡面的數字
# <sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`、
# :ref:`M02-3 · 親手做 convert <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`）。

prepared = prepare_pt2e(export_digits_model(model), x86_quantizer())
with torch.no_grad():
    prepared(digits("calibration")[0])
int8_model = convert_pt2e(prepared)
qdq = [n.name for n in int8_model.graph.nodes if "quantize_per" in str(n.target)]
draw(int8_model, highlight=qdq, title="int8 模型：每一層前後都有 quantize／dequantize")

# %%
# 步驟 3 — 開啟凍結編譯
# ---------------------
# convert 之後的圖只是在「模擬」int8：conv 仍然在 q/dq node 之間用浮點數計算。開啟 **凍結
# （freezing）** 的 ``torch.compile`` 把 weight 當成常數，inductor 才能把每一組 dq → conv → q
# 換成 oneDNN 的 int8 運算
# （:ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`）；
# 不開 freezing 就不會換，int8 也不比浮點數快
# （:ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`）。
# 浮點模型也用同樣的方式編譯，比賽才公平。第一次呼叫時才會編譯。

torch._inductor.config.freezing = True
fast_fp32, fast_int8 = torch.compile(model), torch.compile(int8_model)
counters.clear()
int8_accuracy = accuracy(fast_int8)
packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
print(f"inductor 為 oneDNN 預先打包的 int8 conv：{packed} 個")
assert packed == 3, "開了 freezing，三個 conv 都以 oneDNN 的 int8 運算執行"

# %%
# 步驟 4 — 準確度
# ---------------
# 兩個模型都來分類 500 張測試影像。
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# 找出 int8 在哪裡損失精度，
# :ref:`M04-2 · 修好它 <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>` 說明損失太多時
# 該怎麼辦。

fp32_accuracy = accuracy(fast_fp32)
print(f"測試準確度：fp32 {fp32_accuracy:.1%}，int8 {int8_accuracy:.1%}")
assert abs(int8_accuracy - fp32_accuracy) <= 0.01, "在這裡 int8 最多損失一個百分點"

# %%
# 步驟 5 — 速度
# -------------
# 兩個編譯好的模型都把 500 張影像當成一批執行，輪流交錯計時，在兩個核心的機器上只用一個
# 執行緒（原因見 M03-3）。這些數字屬於執行這一頁的 CPU，表格下方印出它的說明：有 **VNNI**
# （或 AMX）時，oneDNN 做 int8 乘法比浮點數快好幾倍；沒有的話，領先的幅度有限。而且這個模型
# 非常小（8×8 影像），額外開銷和計算本身一樣重要：M03-3 計時的是一個大一些的模型。

timings = compare_speed({"fp32": fast_fp32, "int8": fast_int8}, (images,))
print(timings.table())
print(f"int8 花的時間是 fp32 的 {1 / timings.ratio('fp32', 'int8'):.2f} 倍")

# %%
# 步驟 6 — 大小
# -------------
# ``torch.export.save`` 把程式連同 weight 寫進一個 zip 檔。int8 weight 每個只佔 1 位元組，
# 而不是 4 位元組（再加上每個輸出通道一個 scale）；旁邊還存著圖的描述，而 int8 的圖 node
# 比較多。``saved`` 以一張影像匯出一個新建的 ``GraphModule``，讓檔案只保留圖會讀到的 weight
# （M03-3）和一個很小的範例輸入。


def saved(model) -> tuple[int, int]:
    """用 ``torch.export.save`` 存下 ``model`` 的（檔案位元組數, weight 位元組數）。"""
    lean, buffer = torch.fx.GraphModule(model, model.graph), io.BytesIO()
    torch.export.save(torch.export.export(lean, (images[:1].clone(),)), buffer)
    entries = zipfile.ZipFile(buffer).infolist()
    weights = sum(e.file_size for e in entries if "/data/weights/weight_" in e.filename)
    return buffer.getbuffer().nbytes, weights


fp32_file, fp32_weights = saved(export_digits_model(model))
int8_file, int8_weights = saved(int8_model)
print(f"fp32：檔案 {fp32_file / 1e3:.0f} kB，weight {fp32_weights / 1e3:.1f} kB")
print(f"int8：檔案 {int8_file / 1e3:.0f} kB，weight {int8_weights / 1e3:.1f} kB")
assert int8_weights <= 0.35 * fp32_weights, "int8 weight 大約只佔四分之一的位元組"

# %%
# 小結
# ----
# 六個步驟把訓練好的模型變成 int8：匯出、用 quantizer 做 prepare、校準、convert，再開啟
# freezing 編譯，換成真正的 int8 運算。課程的其餘部分逐一打開每個步驟：之後的圖長什麼樣子
# （M00、M01）、怎麼親手做（M02）、編譯器把它變成什麼（M03）、怎麼守住準確度（M04）。
#
# - 存檔並用 AOTInductor 部署 int8 模型：
#   :ref:`M03-4 · 部署 int8 模型 <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`。
# - 從圖開始上這門課：
#   :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。

# sphinx_gallery_start_ignore
# 建置時下一頁在同一個行程裡執行：把 inductor 的設定恢復原狀。
torch._inductor.config.freezing = False
# sphinx_gallery_end_ignore
