"""
疑難排解：lowering 與速度
=========================

``convert_pt2e`` 之後：比浮點模型還慢的 int8 模型、編譯後卻默默執行浮點數的 int8 模型（開著
梯度，或重新編譯時沒有 freezing）、一執行就失敗的 lowering 後的圖，attention 仍是浮點數的
Transformer，以及被中止的編譯截短的快取檔案。每個條目的標題是錯誤訊息的第一行原文（或讀者口中的症狀），
在本站的環境（torch 2.13、torchao 0.18）上重現它，指出原因，以 assert 驗證修正方法，並連到
解釋它的那一課。

**先備知識**：無；每個條目都連到解釋它的那一課。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 快速入門的手寫數字 CNN（寬度是 M04 那個的八倍）與 ``small_cnn`` ，和 lowering 的幾課一樣用
# ``X86InductorQuantizer`` 量化。

import copy
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch.export import Dim

from common.aoti import compiled_package, kernels_ran
from common.data import digits, export_digits_model, train_digits_cnn
from common.expect import expect_error
from common.kernels import kernels_run
from common.lowering import reshape_views
from common.models import example_inputs, get_model
from common.numerics import sqnr
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import compare_speed, race, timing_threads
from common.viz import draw

quiet()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

x = example_inputs(8)
floating = get_model("small_cnn")


def quantize(model, args) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_module(model, args), x86_quantizer())
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


def quantize_digits(model) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_digits_model(model), x86_quantizer())  # 動態批次
    with torch.no_grad():
        prepared(digits("calibration")[0])
    return convert_pt2e(prepared)


simulated = quantize(floating, x)
wide = train_digits_cnn(width=8)
wide_int8, narrow = quantize_digits(wide), quantize_digits(train_digits_cnn())
images = digits("test")[0]

# %%
# int8 比浮點數還慢
# -----------------
# ``convert_pt2e`` 回傳的模型比原本的浮點模型還慢。計時結果（單一執行緒、交錯輪流量測；
# 只印出，從不 assert）：

print(compare_speed({"fp32": wide, "int8 q/dq": wide_int8}, (images,), rounds=10).table())

# %%
# **原因**，在圖上看：圖裡沒有任何運算用 int8 計算。每個 conv 與 linear 仍然用浮點數執行，
# 夾在只是「模擬」int8 的 dequantize 與 quantize 之間（標示處）——比浮點模型多做了工。

floats = [
    n.name
    for n in wide_int8.graph.nodes
    if n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
]
draw(wide_int8, highlight=floats, title="convert_pt2e 之後：夾在 q/dq 之間的浮點 conv 與 linear")
assert len(floats) == 5, "三個 conv 與兩個 linear 仍然用浮點數計算"
print(f"q/dq 模型執行的 kernel：{kernels_run(wide_int8, (images,)).summary}")

# %%
# **修正**：用 ``torch.compile`` 編譯兩個模型，並設定
# ``torch._inductor.config.freezing = True`` （預設是關閉的：這就是陷阱；沒有它，編譯後的 int8
# 模型仍然只是模擬），在 ``torch.no_grad()`` 之下、用計時時的執行緒數編譯，再檢查實際執行的
# kernel。``common.timing.race`` 全都做到了。在有 VNNI 的 CPU 上，int8 現在比 fp32 快好幾倍；
# 沒有 VNNI 時領先得少一些（:ref:`M03-3 · 量測速度與大小
# <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`）。不編譯時，
# ``lower_pt2e_quantized_to_x86`` 也能換成 int8 kernel（還需要後面一個條目的修正）。

assert inductor_config.freezing is False, "除非你打開，freezing 是關閉的"
raced = race({"fp32": wide, "int8": wide_int8}, (images,), rounds=10)
print(raced.table())
assert not raced.kernels["int8"].float, "沒有留下任何浮點數的 conv 或 linear"
print(f"int8 的速度是 fp32 的 {raced.ratio('fp32', 'int8'):.2f} 倍")

# %%
# 編譯後的 int8 模型執行浮點數 conv（freezing 開著，梯度也開著）
# --------------------------------------------------------------
# freezing 已經打開，模型編譯時也沒有任何錯誤，profiler 卻只看到浮點數的 conv 與矩陣乘法，
# 沒有任何 int8 kernel：模型是在開著 autograd 的情況下編譯與呼叫的。

threads = torch.get_num_threads()
torch.set_num_threads(timing_threads())  # 編譯與執行用同一個執行緒數（race 的規則）
inductor_config.freezing = True
graded = torch.compile(copy.deepcopy(narrow))
graded(images)  # 梯度開著：在 torch.no_grad() 之外的預設
ran = kernels_run(graded, (images,))
print(f"開著梯度：{ran.summary}")
assert ran.float and not ran.int8, "浮點數 conv，沒有 int8 kernel"

# %%
# **原因**：inductor 只在關閉梯度時才會做 freezing（ ``torch/_inductor/compile_fx.py`` ：
# ``if config.freezing and not torch.is_grad_enabled()`` ）；開著梯度時，它為訓練編譯模型，
# weight 是輸入，找不到 int8 的模式，也沒有任何警告。
#
# **修正**：在 ``torch.no_grad()`` （或 ``torch.inference_mode()`` ）之下編譯與呼叫。dynamo
# 的 guard 會檢查梯度模式，所以同一個編譯過的模型會重新編譯，這次有 freezing。公平比速度的方法見
# :ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。

with torch.no_grad():
    graded(images)
    ran = kernels_run(graded, (images,))
print(f"no_grad：{ran.summary}")
assert ran.int8 and not ran.float, "只有 int8 kernel"

# %%
# 計數器說是 int8，profiler 卻說是浮點數
# --------------------------------------
# inductor 的計數器回報它預先打包了 int8 conv，模型執行的卻是浮點數 conv。原因是 freezing 用
# ``config.patch`` 包在第一次呼叫外面，而之後用另一個輸入形狀的呼叫（或在
# ``torch._dynamo.reset()`` 之後）在區塊外重新編譯。

# 這樣的區塊包住第一次呼叫，等於下面這樣寫：第一次編譯時開啟 freezing，區塊結束時回到預設值
# （關閉），重新編譯在那之後。
counters.clear()
inductor_config.freezing = True
with torch.no_grad():
    patched = torch.compile(copy.deepcopy(narrow))
    patched(images)
inductor_config.freezing = False
packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
with torch.no_grad():
    patched(images[:100])  # 另一個批次大小：dynamo 重新編譯，這次沒有 freezing
    ran = kernels_run(patched, (images[:100],))
print(f"inductor 說預先打包的 conv：{packed} 個；批次 100 執行的是 {ran.summary}")
assert packed == 3 and ran.float and not ran.int8, "計數器描述的是第一次編譯"

# %%
# **原因**：``config.patch`` 只在區塊執行期間開啟 freezing；重新編譯發生在需要它的那次呼叫，
# 在區塊之外，用的是預設值（關閉）。計數器是編譯時的紀錄：它仍然顯示第一次編譯的預先打包。
#
# **修正**：把 ``torch._inductor.config.freezing = True`` 設在整個行程，用 ``dynamic=False``
# 編譯（原因見下一個條目），並在上線後實際會收到的形狀上用 profiler
# （ ``common.kernels.kernels_run`` ）檢查 kernel。``common.timing.race`` 三件事都做了。現在
# 每個新的批次大小會再編譯一次，同樣有 freezing。用 profiler 檢查的方法見
# :ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。

inductor_config.freezing = True
with torch.no_grad():
    steady = torch.compile(copy.deepcopy(narrow), dynamic=False)
    steady(images)
    steady(images[:100])
    ran = kernels_run(steady, (images[:100],))
print(f"freezing 設在整個行程，批次 100：{ran.summary}")
assert ran.int8 and not ran.float, "重新編譯也有 freezing"

# %%
# AssertionError: expected size 8==8, stride 1==64 at dim=1
# ---------------------------------------------------------
# 一個開了 freezing 的 int8 模型，以預設的 ``dynamic=None`` 編譯，在第一個批次大小上能執行，
# 換到第二個就失敗。訊息接著列出其他維度，然後是
# 「Error in op: ... _register_quantized_conv_lowering」。

with torch.no_grad():
    dynamic = torch.compile(copy.deepcopy(narrow))
    dynamic(images)
with expect_error(AssertionError, match="expected size 8==8, stride 1==64 at dim=1"):
    with torch.no_grad():
        dynamic(images[:100])

# %%
# **原因**：遇到第二個批次大小時，dynamo 以「動態」的批次維度重新編譯。對輸入只有
# **一個通道** 的 int8 conv（這裡是處理灰階影像的 ``conv1`` ），inductor 這時宣告它的輸出是
# 連續的（NCHW），8 個通道之間的 stride 是 64：這條規則是為浮點數 conv 寫的，批次為符號時
# 浮點數 conv 不預先打包，從一個通道確實寫出 NCHW（ ``torch/_inductor/mkldnn_ir.py`` 的
# ``_prepare_convolution_fusion_create`` ）。預先打包的 oneDNN int8 conv 回傳的卻是通道在後
# （NHWC），stride 是 1，編譯出的程式碼檢查 stride 時就停下（torch 2.13、torchao 0.18）。
# 再下一個條目用幾行程式重現這個觸發條件。
#
# **修正**：``torch.compile(model, dynamic=False)`` ：每個批次大小都有自己的程式碼，
# 同樣經過 freezing，如上一個條目所示。只服務少數幾個固定的批次大小，或把輸入補齊到這些
# 大小。``race`` 就是這樣編譯的
# （:ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`）。

with torch.no_grad():
    assert steady(images[:37]).shape == (37, 10), "再多一個批次大小，也有它自己的靜態程式碼"
inductor_config.freezing = False
torch.set_num_threads(threads)

# %%
# AOTInductor 套件執行的是浮點數 conv（編譯時沒有 freezing）
# ----------------------------------------------------------
# ``aoti_compile_and_package`` 編譯 convert 之後的模型時沒有任何錯誤，套件能載入、輸出也
# 正確，卻沒有執行任何 int8 kernel：它的 conv 以浮點數計算，而且不會有任何提示
# （pytorch/ao#4566，仍未關閉）。以 ``kernel_profile=True`` 編譯時，載入的套件在 profiler
# 下會列出它執行的 kernel（ ``common.aoti.kernels_ran`` ）：

program = torch.export.export(narrow, (images[:8],))
plain = compiled_package(program, "digits_int8_no_freezing", freezing=False, kernel_profile=True)
ran_plain = kernels_ran(torch._inductor.aoti_load_package(str(plain)), (images[:8],))
print(dict(ran_plain))
assert "convolution" in ran_plain and not any(k.startswith("q") for k in ran_plain), (
    "浮點數 conv，沒有 int8"
)

# %%
# **原因**：inductor 把 dq → conv → q 融合成 oneDNN int8 kernel 的 pass 屬於 freezing：它要先
# 把 weight 當成常數才能預先打包。沒有 freezing 時，weight 是編譯後程式碼的輸入，q/dq 模式被
# 寫成反量化的算術加上浮點數 conv，和沒有 freezing 的 ``torch.compile`` 一樣（M03-3）。
#
# **修正**：編譯時設定 ``inductor_configs={"freezing": True}`` （ ``compiled_package`` 的預設），
# 再以 profiler 確認載入的套件執行的是 ``qconv_pointwise`` 。說明見
# :ref:`M03-4 · 部署 int8 模型 <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`。

frozen = compiled_package(program, "digits_int8_frozen", kernel_profile=True)
ran_frozen = kernels_ran(torch._inductor.aoti_load_package(str(frozen)), (images[:8],))
print(dict(ran_frozen))
assert ran_frozen["qconv_pointwise"] and "convolution" not in ran_frozen, (
    "int8 conv，沒有浮點數 conv"
)

# %%
# 動態批次的 AOTInductor 套件輸出錯誤
# -----------------------------------
# convert 之後的模型以動態批次匯出、以 freezing 編譯：套件執行的是 int8 kernel（profiler
# 看得到），輸出卻是雜訊：和 q/dq 模型相比 SQNR 接近 0 dB，而且不報任何錯。
# （ ``check=False`` 向 ``compiled_package`` 要一個不經檢查的套件：原因見修正。）

up_to_8 = ({0: Dim("batch", min=1, max=8)},)
dynamic_program = torch.export.export(narrow, (images[:8],), dynamic_shapes=up_to_8)
dynamic_package = compiled_package(
    dynamic_program, "digits_int8_batch_1_8", kernel_profile=True, check=False
)
noisy = torch._inductor.aoti_load_package(str(dynamic_package))
noise = sqnr(narrow(images[:5]), noisy(images[:5])).item()
print(f"{dict(kernels_ran(noisy, (images[:5],)))}; SQNR {noise:.1f} dB")
assert noise < 10 and kernels_ran(noisy, (images[:5],))["qconv_pointwise"], "int8 kernel，數值錯誤"

# %%
# **原因**：就是 stride 那個條目的錯誤，只是沒有停下。套件宣告 ``conv1`` 的輸出是連續的
# （一個輸入通道、批次為符號），oneDNN 寫出的卻是通道在後，而 inductor 在這個 conv 之後產生的
# 程式碼照宣告的記憶體配置讀取它。stride 檢查也編譯進了套件，但只有在載入套件的行程的環境
# 變數裡設定 ``AOTI_RUNTIME_CHECK_INPUTS=1`` 時才會執行；設定之後，上限以內的批次 5 就停在
# stride 那個條目的訊息：

CHECKED = f"""
import torch
runner = torch._inductor.aoti_load_package({str(dynamic_package)!r})
runner(torch.zeros(5, 1, 8, 8))
"""
env = {**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"}
child = subprocess.run([sys.executable, "-c", CHECKED], env=env, capture_output=True, text=True)
refusal = next(line for line in child.stderr.splitlines() if line.startswith("RuntimeError"))
print(refusal[:80])
assert refusal.startswith("RuntimeError: expected size 8==8, stride 1==64 at dim=1"), "批次 5"

# %%
# 用幾行程式重現觸發條件，不用這門課的任何輔助函式，可以直接回報給上游：一個 int8 conv 接著
# ``flatten`` ，以 1 到 4 的批次打包成套件。一個輸入通道得到雜訊，接近 0 dB；三個通道得到
# q/dq 模型的數值，只差在 int8 kernel 的捨入，在兩種 kernel 路徑上都遠高於 10 dB。

import torch
from torch.export import Dim, export
from torchao.quantization.pt2e import quantize_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86


def package_sqnr(channels: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(channels, 8, 3), torch.nn.Flatten()).eval()
    x, batch = torch.randn(3, channels, 6, 5), ({0: Dim("batch", min=1, max=4)},)
    config = x86.get_default_x86_inductor_quantization_config()
    prepared = quantize_pt2e.prepare_pt2e(
        export(model, (x,), dynamic_shapes=batch).module(),
        x86.X86InductorQuantizer().set_global(config),
    )
    prepared(x)
    q = quantize_pt2e.convert_pt2e(prepared)
    with torch.no_grad():
        exported = export(q, (x,), dynamic_shapes=batch)
        path = torch._inductor.aoti_compile_and_package(
            exported, inductor_configs={"freezing": True}
        )
        out, ref = torch._inductor.aoti_load_package(path)(x), q(x)
    return (10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean())).item()


by_channels = {channels: package_sqnr(channels) for channels in (1, 3)}
print({channels: f"{db:.1f} dB" for channels, db in by_channels.items()})
assert by_channels[1] < 10 < by_channels[3], "一個輸入通道：雜訊；三個：只差在 int8 捨入"

# %%
# **修正**：檢查數值。 ``common.aoti.compiled_package`` 交出套件之前，會拿它的輸出和它的程式
# 比對，並拒絕這個套件：

with expect_error(RuntimeError, match="computes other numbers than the program"):
    compiled_package(dynamic_program, "digits_int8_batch_1_8", kernel_profile=True)

# %%
# 接著，每種批次大小各編譯一個靜態套件，或只為最大的批次編譯一個，較小的批次以 0 補齊
# （每個樣本各自計算）；或保留動態批次，讓只有一個通道的 conv 留在浮點數
# （ ``set_module_name_qconfig("conv1", None)`` ），或像上面的三個通道那樣，給它更多輸入
# 通道。說明見
# :ref:`M06-4 · 會變的形狀 <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`。

static_runner = torch._inductor.aoti_load_package(str(frozen))  # 上面批次 8 的套件
filler = images[:3].new_zeros(3, *images.shape[1:])
padded = static_runner(torch.cat([images[:5], filler]))[:5]
padded_sqnr = sqnr(narrow(images[:5]), padded).item()
print(f"批次 5 補齊到 8：SQNR {padded_sqnr:.1f} dB")
assert padded_sqnr > 30, "q/dq 模型的數值"

# %%
# RuntimeError: view size is not compatible with input tensor\'s size and stride
# ------------------------------------------------------------------------------
# 以 ``lower_pt2e_quantized_to_x86`` 下放的圖，若 int8 conv 之後接著 ``flatten`` ，
# 不編譯直接執行就會失敗（torchao 0.18）。訊息後半是：「(at least one dimension spans
# across two contiguous subspaces). Use .reshape(...) instead.」

failing = lower_pt2e_quantized_to_x86(simulated, x)
with expect_error(RuntimeError, match="view size is not compatible"):
    failing(*x)
lowered = lower_pt2e_quantized_to_x86(simulated, x)

# %%
# **原因**，在圖上看：oneDNN 的 int8 conv 回傳 **channels-last** 的張量（記憶體裡是
# NHWC）；``flatten`` 追蹤成的 ``view`` （標示處）不複製就無法重組 NHWC 張量。
# 用 ``torch.compile`` 編譯這張 lowering 後的圖也會以同樣方式失敗（它的 fake tensor 有同樣的
# stride，見 M03-1）；在 freezing 下編譯 q/dq 圖則可以，因為 inductor 會自己做 lowering，
# 並自己選擇記憶體排列。

views = failing.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default)
draw(failing, highlight=[n.name for n in views], title="int8 conv 之後的 view")
assert len(views) == 1

# %%
# **修正**：把每個 ``view`` 換成只在必要時才複製的 ``reshape``
# （ ``common.lowering.reshape_views`` ）；數值完全相同。說明見
# :ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`。

print(f"改了：{reshape_views(failing)}")
reshape_views(lowered)
assert torch.equal(failing(*x), lowered(*x)), "修正後的圖能執行，數值也相同"

# %%
# Transformer 的 attention 仍是浮點數
# -----------------------------------
# 以預設的 x86 config 量化 ``nn.TransformerEncoderLayer`` ，只有兩個前饋（feed-forward）
# linear 拿到 int8 weight；attention 的投影仍是浮點數。

tokens = (torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(0)),)
torch.manual_seed(0)
encoder = quantize(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval(), tokens)


def linears(gm) -> dict[str, bool]:
    """每個 linear node：它的 weight 是經過 dequantize（int8），還是維持浮點數？"""
    return {
        n.name: "dequantize" in str(n.args[1].target)
        for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    }


print(f"每個 linear 是否為 int8 weight：{linears(encoder)}")
assert list(linears(encoder).values()) == [False, False, True, True], "attention 的仍是浮點數"

# %%
# **原因**，在圖上看：``nn.MultiheadAttention`` 在自己的 ``forward`` 裡，用打包好的
# ``in_proj_weight`` 呼叫 ``F.linear`` ，``out_proj`` 也是這樣呼叫的：quantizer 找的是
# ``nn.Linear`` 模組，而這些 node 的 ``nn_module_stack`` 裡只有 ``MultiheadAttention`` 。

for node in encoder.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
    print(node.name, "來自", list(node.meta["nn_module_stack"].values())[-1][1])

# %%
# **修正**：每個投影用一個 ``nn.Linear`` ，再用 ``F.scaled_dot_product_attention`` 寫
# attention；四個投影就都拿到 int8 weight。說明見
# :ref:`M05-1 · quantizer 在 attention 裡看見什麼
# <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`。


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


attention = quantize(Attention().eval(), tokens)
print(f"每個 linear 是否為 int8 weight：{linears(attention)}")
assert all(linears(attention).values()) and len(linears(attention)) == 4

# %%
# BackendCompilerFailed: backend=\'inductor\' raised: ImportError: ….main.so: file too short
# ------------------------------------------------------------------------------------------
# 昨天還能用的 ``torch.compile``，今天同一個腳本在第一次呼叫前就停下，``ImportError`` 指名
# inductor 快取資料夾裡的一個 ``….main.so``。某次編譯正在寫這個檔案時被中止（按了 Ctrl-C、
# 超過時間限制、磁碟滿了），留下一個被截短的檔案；下一個編譯同一張圖的行程在快取裡找到它，
# 就直接載入。這裡在一個專用的快取資料夾裡，先讓一個行程編譯一個小函式，再像被中止的編譯
# 那樣截短函式庫，下一個行程就失敗了：

SMALL_COMPILE = """
import torch
print(torch.compile(lambda x: (x.sin() + 1).relu())(torch.ones(8)).sum().item())
"""


def compile_in_a_new_process(cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    return subprocess.run(
        [sys.executable, "-c", SMALL_COMPILE], env=env, capture_output=True, text=True
    )


cache = tempfile.mkdtemp(prefix="inductor-")
assert compile_in_a_new_process(cache).returncode == 0, "第一次編譯填好快取"
library = next(Path(cache).rglob("*.main.so"))
library.write_bytes(b"")  # 編譯剛開始寫檔就被中止時留下的樣子
failed = compile_in_a_new_process(cache)
message = next(line for line in failed.stderr.splitlines() if "file too short" in line)
print(message.replace(cache, "<cache>"))
assert failed.returncode != 0 and message.startswith("ImportError"), "載入了被截短的檔案"

# %%
# **原因**：inductor 以它產生的程式碼為編譯好的函式庫命名，只在沒有同名檔案時才編譯
# （``torch/_inductor/codecache.py``）：檔案只要存在就照樣載入，不論完整與否，而動態載入器
# 拒絕比 ELF 標頭還短的檔案。（如果檔案在標頭之後才被截斷，同一個原因會印出
# ``ImportError: ….main.so: cannot read file data``，修正方法相同。）快取資料夾在有設定時是
# ``TORCHINDUCTOR_CACHE_DIR``，否則是 ``/tmp/torchinductor_<使用者>``，同一個使用者的
# 所有行程共用。
#
# **修正**：刪掉訊息指名的檔案（或整個快取資料夾：它只是快取），再編譯一次。可能在編譯途中
# 被中止的工作，可以使用自己的快取資料夾（``TORCHINDUCTOR_CACHE_DIR``），本站的建置就是
# 這樣做。編譯的說明見 :ref:`M03-3 · 量測速度與大小
# <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。

library.unlink()
again = compile_in_a_new_process(cache)
print(again.stdout.strip())
assert again.returncode == 0 and float(again.stdout) > 0, "重新編譯後可以執行"
shutil.rmtree(cache)

# %%
# 下一頁
# ------
# :ref:`疑難排解：準確度、eval 與 QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`。
