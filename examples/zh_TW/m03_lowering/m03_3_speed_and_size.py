"""
M03-3 量測速度與大小
====================

量化多半是為了速度和大小，而 q/dq 圖兩者都沒有給：它比浮點數還慢。本課在建置這一頁的機器上，
用多種方式計時同一個模型——浮點數與 int8、eager 與 lowering，以及 ``torch.compile``
開或不開 **凍結（freezing）** ——並秤一秤存檔的大小。計時只印出來，從不 assert（那是機器的
事）；assert 的是讓 int8 變快的東西：編譯後的圖裡 oneDNN 的 int8 運算。

**你會學到**

- 為什麼沒有 freezing 的 int8 編譯結果不比浮點數快
- VNNI 與 AMX 改變了什麼，只有 AVX2 的 CPU 又能得到什麼
- int8 程式存檔後小了多少

**先備知識**：
:ref:`M03-2 · 親手做 lowering <sphx_glr_lessons_m03_lowering_m03_2_lowering_by_hand.py>`。
``torch.compile`` 需要 C++ 編譯器（ ``g++`` ）。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 模型庫裡的 ``conv_net`` ：四層 64～128 通道的 3×3 conv，輸入 28×28 影像，大到 int8 運算
# 足以發揮作用（16×16 的小模型，時間都花在額外開銷上）。每次計時都一併印出執行緒數量與
# CPU 的指令集。

import io
import statistics
import time
import warnings

import matplotlib.pyplot as plt
import torch
from torch._dynamo.utils import counters

from common.charts import use_course_style
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
use_course_style()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.lowering import lower, reshape_views

BATCH = 2
x = example_inputs(BATCH, shape=input_shape("conv_net"))
float_model = export_module(get_model("conv_net"), x)
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():  # 用四批這個模型尺寸的影像校準
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=input_shape("conv_net")))
int8_model = convert_pt2e(prepared)
cpu = f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
print(f"CPU：{cpu}；每批 {BATCH} 張 {input_shape('conv_net')} 影像")

# %%
# ``median_ms`` 先執行模型一次暖身，再執行 ``repeat`` 次，傳回以毫秒計的中位數；
# ``compiled`` 用 ``torch.compile`` 編譯模型（freezing 開或關），並執行一次
# （編譯就發生在這時）。


def median_ms(model, repeat=5) -> float:
    with torch.no_grad():
        model(*x)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            model(*x)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compiled(model, *, freezing: bool):
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(freezing=freezing), torch.no_grad():
        fast = torch.compile(model)
        fast(*x)
    return fast, dict(counters["inductor"])


# %%
# 步驟 1 — eager：浮點數、模擬的 int8、lowering 後的 int8
# -------------------------------------------------------
# q/dq 圖用浮點數執行每個 conv， *再加上* 每個張量的 quantize 和 dequantize：工作比浮點數多，
# 應該會比較慢（機器忙碌時，單次計時的雜訊很大）。lowering 之後的圖（M03-1）則以 eager
# 方式執行 oneDNN 的 int8 conv。

timings = {}
timings["fp32 eager"] = median_ms(float_model)
timings["int8 q/dq (simulated)"] = median_ms(int8_model)
lowered = lower(int8_model, x)
reshape_views(lowered)  # int8 conv 之後的 flatten（M03-1）
timings["int8 lowered (oneDNN, eager)"] = median_ms(lowered)
int8_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
draw(lowered, highlight=int8_ops, title="lowering 之後的 conv_net：它的 oneDNN int8 運算")
for name, ms in timings.items():
    print(f"{name:32} {ms:8.1f} ms")

# %%
# 步驟 2 — torch.compile，不開與開 freezing
# -----------------------------------------
# ``torch.compile`` 把圖交給 inductor。沒有 **freezing** 時，weight 是編譯後程式碼的輸入，
# 每次呼叫都可能改變：inductor 無法預先打包它們，找不到 int8 conv 的模式，只能在 dequantize
# 周圍產生浮點數 conv。設定 ``torch._inductor.config.freezing = True`` 後 weight 成為常數：
# 和 M03-1 相同的預先打包與融合模式就會生效，計數器也這麼說。

for label, model in (("fp32", float_model), ("int8", int8_model)):
    for freezing in (False, True):
        fast, seen = compiled(model, freezing=freezing)
        timings[f"{label} compile{' + freezing' if freezing else ''}"] = median_ms(fast)
        if label == "int8":
            packed = seen.get("qconv_weight_prepack_matcher_count", 0)
            print(f"int8，freezing={freezing}：{packed} 個 conv 為 oneDNN 預先打包")
            assert packed == (4 if freezing else 0), "只有 freezing 讓 inductor 能預先打包"
for name, ms in list(timings.items())[3:]:
    print(f"{name:32} {ms:8.1f} ms")

# %%
# 這就是使用者最先掉進去的陷阱：**沒有 freezing 的 int8 編譯結果並不比浮點數快**——它仍然是
# 模擬，只是被編譯了——開了 freezing 的浮點數還比它快。讓 int8 圖真正成為 int8 的，是 freezing：

trap = timings["int8 compile"] / timings["fp32 compile + freezing"]
print(f"沒有 freezing 的 int8 編譯結果，花的時間是開了 freezing 的 fp32 的 {trap:.1f} 倍")

# %%
# 步驟 3 — 全貌
# -------------

fig, ax = plt.subplots(figsize=(7, 3.6))
names = list(timings)
ax.barh(
    names,
    [timings[n] for n in names],
    color=["#94a3b8" if "fp32" in n else "#2563eb" for n in names],
)
ax.invert_yaxis()
ax.set_xlabel("每批時間的中位數（毫秒）")
ax.set_title(f"conv_net，每批 {BATCH} 張 — {cpu}")
fig.tight_layout()

# %%
# 同樣的數字做成表：每批的毫秒數，以及相對於 fp32 eager 的速度。

print(f"{'方式':30} {'毫秒/批':>7} {'速度':>5}")
for name, ms in timings.items():
    print(f"{name:32} {ms:9.1f} {timings['fp32 eager'] / ms:6.2f}×")

# %%
# int8 贏多少，取決於 CPU。oneDNN 用 **VNNI** 做 uint8 × int8（ ``vpdpbusd`` ：一道指令把
# 四個乘積加總成 int32；AVX512-VNNI 或 AVX-VNNI），或在新款 Xeon 上用 **AMX** 的 tile
# （一道指令處理一整塊 16×64）。兩者都沒有的話——像建置這門課程的、只有 AVX2 的 CPU——
# 就退回 ``vpmaddubsw`` ：以 16 位元加總兩個乘積（即 M03-1 的飽和），還需要額外的指令把
# 結果加寬，所以 int8 領先浮點數的幅度有限。VNNI 與 AMX 每道指令做的 int8 乘加是浮點數的
# 好幾倍：大幅的 int8 加速就是在這樣的 CPU 上量到的。
#
# 步驟 4 — 存檔大小
# -----------------
# ``torch.export.save`` 連同 weight 寫出整個程式。int8 程式存的是 int8 weight（每個 1 位元組，
# 而不是 4 位元組），再加上每個輸出通道一個浮點數 scale。


def saved_bytes(model) -> int:
    buffer = io.BytesIO()
    # 新建的 GraphModule 只保留圖會讀到的屬性（M02-3）：convert 把浮點數 weight 留在
    # submodule 上，沒有用到，但不這麼做就會被存進去。
    lean = torch.fx.GraphModule(model, model.graph)
    torch.export.save(torch.export.export(lean, x), buffer)
    return buffer.getbuffer().nbytes


fp32_bytes, int8_bytes = saved_bytes(float_model), saved_bytes(int8_model)
ratio = int8_bytes / fp32_bytes
print(f"fp32 {fp32_bytes / 1e3:.0f} kB, int8 {int8_bytes / 1e3:.0f} kB: {ratio:.2f}×")
assert int8_bytes <= 0.3 * fp32_bytes, "int8 weight 只佔四分之一的位元組，再加上 scale"

# %%
# 小結
# ----
# - q/dq 圖是模擬：不論 eager 或沒有 freezing 的編譯，工作都比浮點數多。
# - lowering（eager 的 oneDNN 運算，M03-1）或開了 ``freezing = True`` 的 ``torch.compile``
#   才會執行真正的 int8 運算；inductor 的計數器顯示它預先打包了哪些 conv。
# - 加速幅度取決於 VNNI／AMX；小了 4 倍的檔案則不受影響。
#
# 練習
# ----
# 1. 不編譯任何東西： ``lower`` 在 ``conv_net`` 的圖裡放了幾個 ``onednn`` 運算、各是哪一種？
#    先從模型的層數預測，再數數看。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          lowered = lower(int8_model, x)
#          kinds = [str(n.target) for n in lowered.graph.nodes if "onednn" in str(n.target)]
#          print(kinds)
#          assert kinds.count("onednn.qconv_pointwise.default") == 4, "四個 conv + relu"
#          assert kinds.count("onednn.qlinear_pointwise.default") == 2, "分類器"
#
# 2. 改存 *lowering 之後* 的程式，而不是 q/dq 的。預測： ``torch.export`` 存得了預先打包的
#    oneDNN weight 嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#
#          unsaveable = lower(int8_model, x)
#          reshape_views(unsaveable)
#          with expect_error(NotImplementedError, match="OpaqueTensorImpl"):
#              saved_bytes(unsaveable)
#          # oneDNN 的不透明張量沒有可序列化的 storage：存 q/dq 程式，載入後再 lowering
#          # （或開 freezing 編譯）。
#
# 延伸閱讀
# --------
# - `PyTorch 2 Export Quantization with X86 Backend through Inductor
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
# - `torch.export.save <https://docs.pytorch.org/docs/stable/export.html#torch.export.save>`_
#
# 下一課
# ------
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`：
# int8 模型還準確嗎？
