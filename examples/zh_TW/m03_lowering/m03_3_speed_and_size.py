"""
M03-3 量測速度與大小
====================

量化多半是為了速度和大小。q/dq 圖已經帶來了大小（它的 weight 以 int8 儲存），卻沒有帶來
速度：它的 conv 仍以浮點數計算，前後還夾著 quantize 與 dequantize。本課在三種設定下計時
同一個模型——eager、編譯、開啟 **freezing** 的編譯——每種設定裡浮點數與 int8 並排，
而且涵蓋這顆 CPU 的兩條 kernel 路徑，並秤一秤存檔的大小。計時連同量測方式一起印出，從不
assert；assert 的是讓 int8 變快的東西：每個計時的模型實際執行的 oneDNN int8 kernel，在計時
前後都從 profiler 讀出。

**你會學到**

- 為什麼沒有 freezing 的 int8 編譯結果，不比同樣方式編譯的浮點數快，以及怎麼證明執行了
  哪些 kernel
- VNNI 與 AMX 改變了什麼，沒有它們的 CPU 又能得到什麼
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
# 模型庫裡的 ``conv_net`` ：四層 64～128 通道的 3×3 conv，輸入 28×28 影像，大到 int8 kernel
# 足以發揮作用（16×16 的小模型，時間都花在額外負擔上）。 ``compare_speed`` 讓模型交錯輪流
# 計時，在核心數不超過兩個的機器上只用一個執行緒，並印出中位數與離散程度、平均負載和 CPU。

import io
import math
import statistics
import warnings

import matplotlib.pyplot as plt
import torch
from torch._dynamo.utils import counters

from common.charts import use_course_style
from common.cpu import ISA_PATHS, describe, run_under_isa, weaker_paths
from common.data import digits, export_digits_model, train_digits_cnn
from common.kernels import kernels_run, time_by_kind
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import compare_speed, median_interval, race, ranked_apart
from common.viz import draw

quiet()
use_course_style()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.lowering import lower, reshape_views

BATCH = 2
ROUNDS = 100  # 首頁依這些中位數排名：它們的 95% 區間隨 1/√輪數 變窄
x = example_inputs(BATCH, shape=input_shape("conv_net"))
float_model = export_module(get_model("conv_net"), x)
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():  # 用四批這個模型尺寸的影像校準
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=input_shape("conv_net")))
int8_model = convert_pt2e(prepared)
cpu = describe()
print(cpu.verdict)
print(f"每批 {BATCH} 張 {input_shape('conv_net')} 影像")

# %%
# ``race`` （ ``common.timing`` ）用 ``torch.compile`` 編譯每個模型的一份副本並計時。它在
# ``torch.no_grad()`` 之下、用計時時的執行緒數編譯（inductor 會把這個數量寫進它產生的程式碼），
# 把 freezing 設在整個行程（重新編譯時不能丟掉它），並在計時前後用 profiler
# （ ``common.kernels.kernels_run`` ）讀出每個模型執行了哪些運算 kernel。每條規則的理由寫在它的
# docstring 裡。
#
# 在自己的模型上，該跑的證明就是 profiler：它列出一次呼叫實際派送的 kernel。以下是以 eager
# 方式執行的 q/dq 模型：浮點數的 conv 與矩陣乘法，沒有任何 int8 kernel。

print(f"q/dq 模型，eager：{kernels_run(int8_model, x).summary}")
assert not kernels_run(int8_model, x).int8, "q/dq 模型用浮點數計算"


# %%
# 步驟 1 — eager：浮點數、模擬的 int8、lowering 後的 int8
# -------------------------------------------------------
# q/dq 圖用浮點數執行每個 conv，「再加上」每個張量的 quantize 和 dequantize：工作比浮點數多。
# lowering 之後的圖（M03-1）則以 eager 方式執行 oneDNN 的 int8 conv。

lowered = lower(int8_model, x)
reshape_views(lowered)  # int8 conv 之後的 flatten（M03-1）
int8_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
draw(lowered, highlight=int8_ops, title="lowering 之後的 conv_net：它的 oneDNN int8 運算")
eager = compare_speed(
    {"fp32": float_model, "int8 q/dq（模擬）": int8_model, "int8 lowering 後（oneDNN）": lowered},
    x,
    rounds=ROUNDS,
)
print(eager.table())

# %%
# 步驟 2 — 不開 freezing 的 torch.compile：陷阱
# ---------------------------------------------
# ``torch.compile`` 把圖交給 inductor。沒有 **freezing** 時，weight 是編譯後程式碼的輸入，
# 每次呼叫都可能改變：inductor 無法預先打包它們，找不到 int8 conv 的模式，只能在 dequantize
# 周圍產生浮點數 conv。所以這樣編譯的 int8 仍然是模擬，只是被編譯了：它不比同樣方式編譯的
# fp32 快。這就是使用者最先掉進去的陷阱。

plain = race({"fp32": float_model, "int8": int8_model}, x, freezing=False)
print(plain.table())
print(f"沒有 freezing 時，int8 花的時間是 fp32 的 {plain.ratio('int8', 'fp32'):.2f} 倍")
assert not plain.kernels["int8"].int8, "沒有 freezing，int8 模型只執行浮點數 kernel"

# %%
# 步驟 3 — 開啟 freezing 的 torch.compile
# ---------------------------------------
# 設定 ``torch._inductor.config.freezing = True`` 後 weight 成為常數：和 M03-1 相同的預先打包
# 與融合模式就會生效，int8 執行 oneDNN 的 int8 conv 與 linear。兩個模型同樣在相同的設定下比較。

counters.clear()
frozen = race({"fp32": float_model, "int8": int8_model}, x, rounds=ROUNDS)
print(frozen.table())
print(f"開了 freezing，int8 的速度是 fp32 的 {frozen.ratio('fp32', 'int8'):.2f} 倍")
ran = frozen.kernels["int8"]
assert ran.int8["onednn::qconv_pointwise"] == 4 and not ran.float, "每個 conv 與 linear 都是 int8"

# %%
# inductor 的計數器說的是同一件事，但它們記錄的是「編譯」：重新編譯丟掉 freezing 之後，它們
# 仍然說「預先打包了 4 個 conv」（疑難排解 m99_3 重現了這個情況）。上面 profiler 列出的才是
# 實際執行的。

packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
print(f"inductor 的計數器：編譯時預先打包了 {packed} 個 int8 conv")
assert packed == 4, "編譯時預先打包了全部四個 int8 conv"
# sphinx_gallery_start_ignore
from common.results import publish  # 首頁引用的數字

publish("cpu", cpu.verdict)
publish("int8_path", cpu.onednn)
publish("timing_threads", frozen.threads)
publish("int8_speedup_compiled", frozen.ratio("fp32", "int8"))
publish("compiled_interval", frozen.ratio_interval("fp32", "int8"))
publish("compiled_load", frozen.load[0])
# sphinx_gallery_end_ignore

# %%
# 步驟 4 — 全貌
# -------------
# 三張表畫在一張圖裡：中位數，誤差線是第 10 到第 90 百分位數。

settings = {"eager": eager, "編譯": plain, "編譯 + freezing": frozen}
names, medians, whiskers, colors = [], [], [[], []], []
for setting, timings in settings.items():
    for label, t in timings.times.items():
        names.append(f"{setting}：{label}")
        medians.append(t.median)
        whiskers[0].append(t.median - t.low)
        whiskers[1].append(t.high - t.median)
        colors.append("#94a3b8" if label == "fp32" else "#2563eb")
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.barh(names, medians, xerr=whiskers, color=colors, capsize=3)
ax.invert_yaxis()
ax.set_xlabel(f"每批時間的中位數（毫秒），{eager.threads} 個執行緒")
ax.set_title(f"conv_net，每批 {BATCH} 張：int8 路徑 {cpu.onednn}")
fig.tight_layout()

# %%
# int8 贏多少，取決於 CPU。oneDNN 用 **VNNI** 做 uint8 × int8（ ``vpdpbusd`` ：一道指令把
# 四個乘積加總成 int32；AVX512-VNNI 或 AVX-VNNI），或在新款 Xeon 上用 **AMX** 的 tile
# （一道指令處理一整塊 16×64）。兩者都沒有的話（AVX2，或沒有 VNNI 的 AVX-512），就退回
# ``vpmaddubsw`` ：以 16 位元加總兩個乘積（即 M03-1 的飽和），還需要額外的指令把結果加寬：
# 每道指令做的 int8 乘加比較少，領先浮點數的幅度也就比較小。本頁的表是在這種 CPU 上量的：

kind = "AMX tile" if cpu.amx_int8 else "有 VNNI，沒有 AMX" if cpu.vnni else "沒有 VNNI：vpmaddubsw"
print(f"int8 路徑 {cpu.onednn}：{kind}")

# %%
# 步驟 5 — 兩條 kernel 路徑
# -------------------------
# oneDNN 與 ATen 每個行程只讀一次 ISA 上限（M03-1），所以步驟 1 的 eager 比較要在新的直譯器
# 裡再跑：一次走這顆 CPU 自己的路徑，一次限制在 AVX2——近十年每一顆 x86-64 CPU 都有的路徑
# （AVX2 的 CPU 只有自己那一條）。模擬是在「這顆」晶片上執行那條路徑的指令：它顯示的是那些
# 指令在這裡的代價，而不是真正 AVX2 晶片的速度（時脈、快取、核心都不同）。

EAGER_STEP = """
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from common.lowering import lower, reshape_views
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, x86_quantizer
from common.timing import compare_speed

x = example_inputs(2, shape=input_shape("conv_net"))
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():
    for seed in range(4):
        prepared(*example_inputs(2, seed=seed, shape=input_shape("conv_net")))
lowered = lower(convert_pt2e(prepared), x)
reshape_views(lowered)
timings = compare_speed(
    {"fp32": export_module(get_model("conv_net"), x), "int8": lowered}, x, rounds=ROUNDS
)
result = {label: vars(timings[label]) for label in ("fp32", "int8")}
result["load"] = timings.load[0]
"""

# %%
# 離散描述的是單次呼叫：中間 80 % 的呼叫落在這個範圍內，多跑幾輪也不會變窄。會變窄的是
# 「中位數」有多準：把 100 輪的時間排序，第 40 個和第 61 個之間有 95 % 的機率包住真正的
# 中位數（順序統計量，不假設任何分布；``common.timing.median_interval`` ，下面有
# ``assert``）——前提是各輪彼此獨立。實際上並不完全獨立：忙碌的一秒會連續拖慢好幾輪。而且
# 水準在行程之間移動的幅度比這個區間還大：同一個模型在這類機器上分三個行程量測，三個中位數
# 的區間互相排斥。所以一次執行的區間只說明「這次執行」的中位數有多準，對下一次執行什麼也
# 沒說。
#
# 要替兩條路徑排名，單位是「一次執行」：每條路徑在五個行程裡量測，各路徑輪流上場（慢下來的
# 那一分鐘會平均拖慢每一條），每次執行得到一個加速倍數。只有其中一條的每次執行都勝過另一條
# 的每次執行，兩條路徑才分高下。如果兩者其實是同一條路徑，這種情形碰巧發生的機率是
# 2 ／ C(10, 5) = 2 ／ 252（``common.timing.ranked_apart``）。這顆 CPU 自己的路徑量兩次，當成
# 兩條路徑：同一條路徑、兩組行程。

assert median_interval(list(range(1, ROUNDS + 1))) == (40, 61), "100 輪取第 40 與第 61 個"
assert 2 / math.comb(10, 5) < 0.01, "各五次執行：誤判高下的機率低於 1 %"

RUNS = 5
here = cpu.onednn if cpu.onednn in ISA_PATHS else "native"  # a capped run stays capped
paths = {cpu.onednn: (here, 0), f"{cpu.onednn}（再測一次）": (here, 1)}
if "AVX2" in weaker_paths():
    paths["AVX2"] = ("AVX2", 0)
speedups = {label: [] for label in paths}
loads = {label: [] for label in paths}
for run in range(RUNS):  # the paths take turns, so a slow minute slows each of them
    for label, (isa, copy) in paths.items():
        # RUN 讓每次執行都是各自的一步：建置網站時，run_under_isa 每一步只保留一個答案，
        # 兩種語言顯示同一份
        found = run_under_isa(isa, f"ROUNDS, RUN = {ROUNDS}, {(copy, run)}\n" + EAGER_STEP)
        result = found["result"]
        speedups[label].append(result["fp32"]["median"] / result["int8"]["median"])
        loads[label].append(result["load"])

print("int8 路徑                    每次執行的加速倍數（fp32 ÷ int8，eager）  中位數  負載")
for label, found in speedups.items():
    each = " ".join(f"{ratio:.2f}" for ratio in found)
    print(f"{label:28} {each}   {statistics.median(found):.2f}×   {max(loads[label]):.2f}")
labels = list(paths)
for i, one in enumerate(labels):
    for other in labels[i + 1 :]:
        apart = ranked_apart(speedups[one], speedups[other])
        verdict = (
            "分出高下：其中一條的每次執行都勝過另一條的每次執行"
            if apart
            else "不分高下：兩者的執行結果互相交疊"
        )
        print(f"{one} / {other}: {verdict}")
# sphinx_gallery_start_ignore
publish("int8_speedup_eager", {label: statistics.median(s) for label, s in speedups.items()})
publish("eager_intervals", {label: [min(s), max(s)] for label, s in speedups.items()})
publish("eager_loads", {label: max(found) for label, found in loads.items()})
publish("eager_runs", speedups)
# sphinx_gallery_end_ignore

# %%
# 步驟 6 — 存檔大小
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
# sphinx_gallery_start_ignore
publish("size_ratio", ratio)
# sphinx_gallery_end_ignore

# %%
# 步驟 7 — 離 4 倍還有多遠？
# --------------------------
# 有 VNNI 時，一個 ``vpdpbusd`` 把 64 對 uint8 × int8 相乘並累加進 int32，而一個浮點數 FMA
# 只做 16 個：以指令來算，int8 最多快 4 倍。在 **AMX** 上（ ``cpu.amx_int8`` ），4 倍就不是
# 上限了：oneDNN 在 tile 上執行 int8 的 conv 與 GEMM，一道指令做一整塊 16×16×64 的乘加（依
# Intel 的資料，每個核心每個時脈 1024 次），而 fp32 仍用 AVX-512 的 FMA（每個核心每個時脈
# 最多 32 次），所以倍數可能超過 4 倍。表格下面那一行說明這顆 CPU 屬於哪一種。下面用同一條
# PT2E 路徑量這顆 CPU 能達到多少：兩個
# 受計算量限制的例子——56×56、128 個通道的 3×3 conv，以及兩個 256×1024×4096 的 GEMM——再加上
# 一個不受計算量限制的：depthwise conv（ ``groups=128`` ），每載入一個值只做 9 次乘加，時間由
# 記憶體存取決定，而不是算術。


def int8_of(model, args):
    """``model`` 走一次 PT2E 流程：export、x86 quantizer、一次校準呼叫、convert。"""
    prepared = prepare_pt2e(export_module(model, args), x86_quantizer())
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


def convs(groups: int) -> torch.nn.Module:
    torch.manual_seed(0)
    conv = [torch.nn.Conv2d(128, 128, 3, padding=1, groups=groups) for _ in range(3)]
    return torch.nn.Sequential(*(m for c in conv for m in (c, torch.nn.ReLU()))).eval()


torch.manual_seed(0)
gemms = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
).eval()
cases = {
    "3×3 convs, 128 channels": (convs(groups=1), (torch.randn(4, 128, 56, 56),)),
    "GEMMs 256×1024×4096": (gemms, (torch.randn(256, 1024),)),
    "depthwise 3×3 convs": (convs(groups=128), (torch.randn(4, 128, 56, 56),)),
}
ceiling = {}
for name, (model, args) in cases.items():
    raced = race({"fp32": model, "int8": int8_of(model, args)}, args, rounds=10)
    assert not raced.kernels["int8"].float, "每個 conv 或 linear 都以 int8 執行"
    ceiling[name] = raced.ratio("fp32", "int8")
    fp32, int8 = raced["fp32"], raced["int8"]
    print(
        f"{name:24} fp32 {fp32.median:7.2f} ms ({fp32.spread:4.0%})  "
        f"int8 {int8.median:7.2f} ms ({int8.spread:4.0%})  {ceiling[name]:.2f}×"
    )
print(
    f"{cpu.onednn}：AMX tile，所以 int8 的上限遠高於 4 倍"
    if cpu.amx_int8
    else f"{cpu.onednn}：有 VNNI、沒有 AMX：以指令來算，上限是 4 倍"
    if cpu.vnni
    else f"{cpu.onednn}：沒有 VNNI（vpmaddubsw），低於 VNNI 的 4 倍"
)

# %%
# GEMM 的浮點數那一邊在 MKL 上執行（ ``mkl::_mkl_linear`` ，見步驟 3 的 kernel 清單），conv 的
# 則在 oneDNN 上：沒有 AMX 時，GEMM 的倍數超過 4 倍，說的是這顆 CPU 的浮點數 GEMM 慢，而不是
# int8 超越了指令數的上限。以兩邊都在 oneDNN 上執行、受計算量限制的 conv 為準，
# ``conv_net`` 的時間花在哪裡？profiler 把每個編譯後模型的一次呼叫分成 int8 kernel、浮點數
# kernel，以及其餘部分（quantize、記憶體排列轉換、pooling、inductor 融合的迴圈）：

with torch.no_grad():
    split = {
        label: time_by_kind(frozen.models[label], x, threads=frozen.threads)
        for label in ("fp32", "int8")
    }
for label, parts in split.items():
    print(f"{label}: " + ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in parts.items()))
compute = split["fp32"]["float"] / split["int8"]["int8"]
print(
    f"只看 conv 與 linear：int8 快 {compute:.2f} 倍；其餘部分："
    f"fp32 {split['fp32']['other']:.2f} ms，int8 {split['int8']['other']:.2f} ms"
)

# %%
# 寬到受計算量限制的模型，就能接近上限：快速入門的手寫數字 CNN（64 與 128 個通道，每批 500 張
# 影像）。它達到 conv 上限的幾成，只印出，從不 assert：這是兩個相隔幾分鐘量出的倍數之比，各有
# 各的離散程度，所以超過 100% 是雜訊，而不是模型超越了上限。

wide, images = train_digits_cnn(width=8), digits("test")[0]
prepared = prepare_pt2e(export_digits_model(wide), x86_quantizer())
with torch.no_grad():
    prepared(digits("calibration")[0])
showcase = race({"fp32": wide, "int8": convert_pt2e(prepared)}, (images,), rounds=10)
assert not showcase.kernels["int8"].float, "每個 conv 與 linear 都以 int8 執行"
share = showcase.ratio("fp32", "int8") / ceiling["3×3 convs, 128 channels"]
print(
    f"手寫數字 CNN，寬度 8：int8 是 fp32 的 {showcase.ratio('fp32', 'int8'):.2f} 倍，"
    f"達到 conv 上限的 {share:.0%}（離散度 {showcase['fp32'].spread:.0%}、"
    f"{showcase['int8'].spread:.0%}；{showcase.cpu}）"
)

# %%
# 小結
# ----
# - q/dq 圖是模擬：不論 eager 或沒有 freezing 的編譯，工作都比浮點數多。比較時要同類相比：
#   int8 與 fp32 都是 eager、都編譯、都開 freezing。
# - lowering（eager 的 oneDNN 運算，M03-1）或開了 ``freezing = True`` 的 ``torch.compile``
#   才會執行真正的 int8 kernel；profiler 顯示實際執行了哪些 kernel（inductor 的計數器只記錄
#   第一次編譯預先打包了什麼）。
# - 加速幅度取決於 VNNI／AMX（ ``run_under_isa`` 在同一顆 CPU 上顯示較弱的路徑，但不是真正
#   舊晶片的速度）；小了 4 倍的檔案則不受影響。
# - 以指令來算，VNNI 的上限是 4 倍；AMX 的 tile 把上限推得更高。受計算量限制的 conv 能達到
#   大部分，受記憶體限制的 depthwise conv 幾乎達不到；在小模型裡，quantize、記憶體排列轉換與
#   pooling 也佔一份時間。
#
# 練習
# ----
# 1. 每個 float32 的 weight 都變成一個 int8 位元組。只根據 ``conv_net`` 的各層，逐個 dtype
#    預測 int8 程式存下多少位元組的常數（``saved_bytes`` 除了圖之外寫出的東西）；再說明為什麼
#    檔案比 fp32 的四分之一大。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from collections import Counter
#
#          lean = torch.fx.GraphModule(int8_model, int8_model.graph)  # saved_bytes 存下的就是它
#          stored = Counter()
#          for tensor in lean.state_dict().values():
#              stored[tensor.dtype] += tensor.numel() * tensor.element_size()
#          print({str(dtype): size for dtype, size in stored.items()})
#          weights = [p for p in float_model.state_dict().values() if p.ndim > 1]
#          biases = [p for p in float_model.state_dict().values() if p.ndim == 1]
#          channels = sum(w.shape[0] for w in weights)  # 每個通道一個 scale 和一個 zero point
#          assert set(stored) == {torch.int8, torch.float32, torch.int64}, (
#              "int8 的 weight、float32 的 bias 與 scale、int64 的 zero point"
#          )
#          assert stored[torch.int8] == sum(w.numel() for w in weights), "每個 weight 1 個位元組"
#          assert stored[torch.float32] == 4 * (sum(b.numel() for b in biases) + channels), (
#              "每個 bias、每個通道的 scale 各 4 個位元組"
#          )
#          assert stored[torch.int64] == 8 * channels, "每個 zero point 8 個位元組"
#          fp32_constants = 4 * sum(p.numel() for p in float_model.state_dict().values())
#          assert int8_bytes - sum(stored.values()) > fp32_bytes - fp32_constants, (
#              "再加上更大的圖：q/dq node"
#          )
#
# 2. 改存「lowering 之後」的程式，而不是 q/dq 的。預測： ``torch.export`` 存得了預先打包的
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
#          # oneDNN 的不透明張量沒有可序列化的 storage：存 q/dq 程式，載入後再下放
#          # （或開 freezing 編譯）。
#
# 延伸閱讀
# --------
# - `透過 Inductor 使用 x86 後端的 PT2E 量化（torchao）
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
# - `torch.export.save <https://docs.pytorch.org/docs/stable/export.html#torch.export.save>`_
# - :ref:`M03-4 · 部署 int8 模型 <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`：
#   儲存並部署 int8 模型
# - :ref:`M06-3 · 由內而外看 .pte
#   <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`：邊緣裝置的路線：裝進 .pte 檔的 int8
# - :ref:`疑難排解：lowering 與速度
#   <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`：
# int8 模型還準確嗎？
