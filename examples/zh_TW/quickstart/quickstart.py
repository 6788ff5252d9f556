"""
快速入門：一頁把訓練好的模型變成 int8
=====================================

一個以真實手寫數字訓練的 CNN，走過 PT2E 量化的每一步——匯出、``X86InductorQuantizer``、
校準、``convert_pt2e``——再由開啟 freezing 的 ``torch.compile`` 換成真正的 int8 kernel。
接著和浮點模型比一比：在 500 張沒看過的影像上的準確度、在這顆 CPU 上的速度（附上每個模型
實際執行的 kernel），以及存檔的大小。這一頁的每個步驟都對應課程的一個單元，並連到講解它的
那一課；最後的檢查清單列出讓 int8 不比浮點數快的陷阱。

**你會學到**

- 六個步驟走完 PT2E 全流程，以及每一步由哪一課講解
- int8 在這顆 CPU 上為模型帶來什麼：實際量到的準確度、速度與大小
- 怎麼證明執行的是 int8 kernel，以及公平比速度的五條規則

**先備知識**：不需要；會用 PyTorch 即可。``torch.compile`` 需要 C++ 編譯器（ ``g++`` ）。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 步驟 1 — 訓練浮點模型
# ---------------------
# ``common.data`` 提供 scikit-learn 內附的手寫數字（8×8 像素，不必下載），以及用它們訓練、結果可
# 重現的 CNN；weight 快取在 ``build/`` 底下。
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# 用的是窄版（8 到 16 個通道）；這一頁把它加寬八倍（64 與 128 個通道），因為 int8 kernel
# 一次處理 64 個位元組，太窄的層會讓每個向量大半空著。

import io
import warnings
import zipfile

import torch

from common.cpu import describe
from common.data import accuracy, digits, export_digits_model, train_digits_cnn
from common.pt2e import quiet, x86_quantizer
from common.timing import race
from common.viz import draw

quiet()  # 這套環境已知的匯入雜訊（torchao 只給 CUDA 用的 kernel、棄用警告）
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

model = train_digits_cnn(width=8)
images, labels = digits("test")
print(f"conv2：{model.conv2}")

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
# 步驟 3 — 編譯兩個模型，比一比速度
# ---------------------------------
# convert 之後的圖只是在「模擬」int8：conv 仍然在 q/dq node 之間用浮點數計算。開啟 **freezing**
# 的 ``torch.compile`` 把 weight 當成常數，inductor 才能把每一組 dq → conv → q
# 換成 oneDNN 的 int8 kernel
# （:ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`）。
# ``race`` 以公平計時需要的方式編譯兩個模型（freezing 設在整個行程、在
# ``torch.no_grad()`` 之下、用計時時的執行緒數；原因見文末的檢查清單），在 500 張測試影像上
# 輪流交錯計時，並在計時前後都從 profiler 讀出每個模型實際執行的運算 kernel。

raced = race({"fp32": model, "int8": int8_model}, (images,))
print(raced.table())

# %%
# 最後兩行才是真正的證據：int8 模型執行的是 oneDNN 的 int8 conv 與 linear，完全沒有浮點數的
# conv 或矩陣乘法；浮點模型則只執行浮點數 kernel。

ran = raced.kernels["int8"]
assert sum(ran.int8.values()) == 5 and not ran.float, "3 個 conv ＋ 2 個 linear，全是 int8"
assert not raced.kernels["fp32"].int8, "浮點模型沒有執行任何 int8 kernel"

# %%
# 步驟 4 — 速度
# -------------
# 這些數字屬於執行這一頁的 CPU；表格中各模型那幾列的下方，印著這顆 CPU 的說明。有
# **VNNI** 時，oneDNN 做 int8 乘法比浮點數快好幾倍，這麼寬的模型用 int8 大約快 2～3 倍（以指令
# 來算，VNNI 的上限是 4 倍：M03-3 說明其餘的差距到哪裡去了）。有 **AMX** 時，int8 在 tile 上
# 執行，完全是另一個等級：上限遠高於 4 倍（M03-3）。沒有 VNNI 的話，領先的幅度有限。倍數下面
# 那一行說明這顆 CPU 屬於哪一種。「離散度」一欄說的是單次呼叫的變動（中間 80% 的輪次）；兩個
# 中位數的比值有多準，看的是它在這次執行之內的 95% 區間（ ``ratio_interval`` ，M03-3：兩個
# 模型在同樣的交錯輪次裡量測）。

speedup, (low, high) = raced.ratio("fp32", "int8"), raced.ratio_interval("fp32", "int8")
print(f"int8 的速度是 fp32 的 {speedup:.2f} 倍（這次執行的 95% 區間 {low:.2f}–{high:.2f} 倍）")
cpu = describe()
print(
    f"{cpu.onednn}：AMX tile，上限遠高於 VNNI 的 4 倍"
    if cpu.amx_int8
    else f"{cpu.onednn}：VNNI，以指令來算上限是 4 倍"
    if cpu.vnni
    else f"{cpu.onednn}：沒有 VNNI（vpmaddubsw），領先幅度有限"
)

# %%
# 步驟 5 — 準確度
# ---------------
# 兩個編譯好的模型都來分類 500 張測試影像。
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
# 找出 int8 在哪裡損失精度，
# :ref:`M04-2 · 修好它 <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>` 說明損失太多時
# 該怎麼辦。

fp32_accuracy = accuracy(raced.models["fp32"])
int8_accuracy = accuracy(raced.models["int8"])
print(f"測試準確度：fp32 {fp32_accuracy:.1%}，int8 {int8_accuracy:.1%}")
assert abs(int8_accuracy - fp32_accuracy) <= 0.01, "在這裡 int8 最多損失一個百分點"

# %%
# 步驟 6 — 大小
# -------------
# ``torch.export.save`` 把程式連同 weight 寫進一個 zip 檔。int8 weight 每個只佔 1 位元組，
# 而不是 4 位元組（再加上每個輸出通道一個 scale）；旁邊還存著圖的描述，而 int8 的圖 node
# 比較多。``saved`` 以一張影像匯出一個新建的 ``GraphModule``，讓檔案只保留圖會讀到的 weight
# （M03-3）和一個很小的範例輸入。


def saved(model) -> tuple[int, int]:
    """用 ``torch.export.save`` 存下 ``model`` 的（檔案位元組數，weight 位元組數）。"""
    lean, buffer = torch.fx.GraphModule(model, model.graph), io.BytesIO()
    torch.export.save(torch.export.export(lean, (images[:1].clone(),)), buffer)
    entries = zipfile.ZipFile(buffer).infolist()
    weights = sum(e.file_size for e in entries if "/data/weights/weight_" in e.filename)
    return buffer.getbuffer().nbytes, weights


fp32_file, fp32_weights = saved(export_digits_model(model))
int8_file, int8_weights = saved(int8_model)
print(f"fp32：檔案 {fp32_file / 1e3:.0f} kB，weight {fp32_weights / 1e3:.1f} kB")
print(f"int8：檔案 {int8_file / 1e3:.0f} kB，weight {int8_weights / 1e3:.1f} kB")
assert int8_weights <= 0.3 * fp32_weights, "int8 weight 大約只佔四分之一的位元組"

# %%
# 小結
# ----
# 六個步驟把訓練好的模型變成 int8：匯出、用 quantizer 做 prepare、校準、convert，再開啟
# freezing 編譯，換成真正的 int8 kernel，並確認它們真的執行了。課程其餘的部分逐一拆解每個步驟：
# 之後的圖長什麼樣子（M00、M01）、怎麼親手做（M02）、編譯器把它變成什麼（M03）、怎麼守住
# 準確度（M04）。
#
# 檢查清單：在 x86 上跑 int8，避開陷阱
# ------------------------------------
# 下面每一項都曾讓 int8 不比浮點數快，甚至更慢，而且沒有任何訊息提醒：
#
# 1. **以至少 2 的範例批次匯出動態批次。** 為某個批次大小匯出的圖，遇到別的大小會重新編譯
#    （或失敗）；在批次 1 的範例上宣告動態批次會失敗，因為大小為 1 的維度會被特化
#    （``export_digits_model`` 用 2 張影像匯出）。
# 2. **把 freezing 設在整個行程**：``torch._inductor.config.freezing = True``，而不是在第一次
#    呼叫外面包一層 ``config.patch``：區塊外的重新編譯（新的輸入形狀、
#    ``torch._dynamo.reset()``）不會開 freezing，執行的是浮點數 conv。
# 3. **在** ``torch.no_grad()`` **之下編譯與執行**：inductor 只在關閉梯度時才會做 freezing。
# 4. **編譯與計時用同樣的執行緒數**：inductor 會把執行緒數寫進它產生的程式碼。
# 5. **檢查實際執行的 kernel**：在上線後實際會收到的輸入上用 ``common.kernels.kernels_run``
#    （profiler），而不是 inductor 的計數器，那只描述第一次編譯。
#
# ``common.timing.race`` 五條都做到了。疑難排解頁
# :ref:`疑難排解：lowering 與速度 <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`
# 逐一重現每個陷阱，並附上修正。
#
# - 存檔並用 AOTInductor 部署 int8 模型：
#   :ref:`M03-4 · 部署 int8 模型 <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`。
# - 從圖開始上這門課：
#   :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。
