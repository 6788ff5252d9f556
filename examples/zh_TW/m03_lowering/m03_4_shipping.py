"""
M03-4 部署 int8 模型
====================

留在記憶體裡的量化模型還不是產品。本課用兩種方式部署 int8 的手寫數字 CNN：一是程式檔
（ ``torch.export.save`` ），載入後的輸出逐位元相同，在執行的地方再編譯；二是 **AOTInductor**
套件（ ``aoti_compile_and_package`` ），一個 ``.pt2`` 封存檔，裡面是已經連同 int8 kernel 編譯好的
機器碼，載入就能執行，不需要 torchao，也不需要編譯器。本課會秤一秤兩者的大小、量測載入時間，
並決定伺服器該用多少執行緒。

**你會學到**

- 儲存與載入 convert 後的程式，以及載入後怎麼編譯
- 用 AOTInductor 預先編譯：套件裡有什麼、要付出什麼代價
- 提供服務時該用多少執行緒與行程

**先備知識**：
:ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`
（freezing）、:ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`
（手寫數字 CNN）。``torch.compile`` 與 AOTInductor 需要 C++ 編譯器（ ``g++`` ）。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# M04 的手寫數字 CNN，用 ``X86InductorQuantizer`` 的預設設定量化，並以 200 張校準影像校準，
# 和快速入門那一頁完全一樣。

import os
import tempfile
import time
import warnings
from pathlib import Path

import torch

from common.aoti import compiled_package, kernel_calls
from common.data import accuracy, digits, export_digits_model, train_digits_cnn
from common.kernels import kernels_run
from common.pt2e import quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw

quiet()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

images, labels = digits("test")
prepared = prepare_pt2e(export_digits_model(train_digits_cnn()), x86_quantizer())
with torch.no_grad():
    prepared(digits("calibration")[0])
int8_model = convert_pt2e(prepared)
folder = Path(tempfile.mkdtemp())  # 本課寫出檔案的地方

# %%
# 步驟 1 — 儲存與載入程式
# ------------------------
# ``torch.export.save`` 把一個 ``ExportedProgram``——圖、它的 weight 和一個範例輸入——寫進
# 一個 zip 檔。先把 convert 後的模型以動態的批次維度重新匯出，存下的程式就能接受任意張數的
# 影像。``torch.export.load`` 載回的程式，輸出和原模型 **逐位元相同** ：同一張圖、同樣的 int8
# weight、同樣的浮點 kernel。（和 M03-3 一樣，新建的 ``GraphModule`` 會丟下 convert 留在
# submodule 上、沒有用到的浮點數 weight。）

lean, batch = torch.fx.GraphModule(int8_model, int8_model.graph), torch.export.Dim("batch")
program = torch.export.export(lean, (images[:2].clone(),), dynamic_shapes=({0: batch},))
saved = folder / "digits_int8.pt2"
torch.export.save(program, saved)
started = time.perf_counter()
loaded = torch.export.load(saved)
load_seconds = time.perf_counter() - started
print(f"{saved.name}：{saved.stat().st_size / 1e3:.0f} kB，載入花了 {load_seconds:.2f} 秒")
with torch.no_grad():
    reference = int8_model(images)
    assert torch.equal(loaded.module()(images), reference), "載入不改變任何一個位元"
qdq = [n.name for n in loaded.module().graph.nodes if "quantize_per" in str(n.target)]
draw(loaded.module(), highlight=qdq, title="從 digits_int8.pt2 載入：同一張 q/dq 圖")

# %%
# 步驟 2 — 開啟 freezing 編譯載入的程式
# -------------------------------------
# 載入的程式仍然是 q/dq 的模擬（M03-1）。在提供服務的機器上，它和任何模型一樣要編譯：把
# **freezing** 設在整個行程、在 ``torch.no_grad()`` 之下、每個輸入形狀編譯一次
# （ ``dynamic=False`` ），否則依然很慢（M03-3 與快速入門的檢查清單）。profiler 顯示，載入的圖
# 和原本的圖一樣執行 int8 kernel。

torch._inductor.config.freezing = True  # 設在整個行程：重新編譯也要保有它（m99_3）
started = time.perf_counter()
with torch.no_grad():
    compiled = torch.compile(loaded.module(), dynamic=False)
    compiled_out = compiled(images)
    compile_seconds = time.perf_counter() - started
    ran = kernels_run(compiled, (images,))
print(f"編譯花了 {compile_seconds:.1f} 秒；執行了 {ran.summary}")
assert ran.int8["onednn::qconv_pointwise"] == 3 and not ran.float, "三個 conv 都以 int8 執行"
int8_accuracy = accuracy(compiled)
print(f"編譯後 int8 的準確度：{int8_accuracy:.1%}；q/dq 模型：{accuracy(loaded.module()):.1%}")
assert abs(int8_accuracy - accuracy(loaded.module())) <= 0.01, "真正的 int8 kernel，同樣的答案"

# %%
# 伺服器每次啟動都要重新編譯一次，而且提供服務的機器上得有 C++ 編譯器。**AOTInductor**
# 則是事先編譯一次就好。
#
# 步驟 3 — 用 AOTInductor 預先編譯
# --------------------------------
# ``torch._inductor.aoti_compile_and_package`` 接受一個 ``ExportedProgram`` ，對它執行
# inductor——開著 freezing，所以同樣的 int8 模式會觸發——把產生的 C++ 編譯成共用函式庫，
# 再連同預先打包的 weight 一起包進一個 ``.pt2`` 檔。``torch._inductor.aoti_load_package``
# 把它載回成一個可以呼叫的物件。
#
# 「機器碼」帶來兩個後果。套件是針對所給程式的輸入形狀編譯的：這裡是一批 500 張影像（練習 2
# 示範換成別的批次會怎樣）。而且它只適用於一個 PyTorch 版本、一種 CPU 指令集。所以套件要用
# 產生它的一切當作鍵來保存：圖的程式碼與它的 weight（算什麼、用什麼算）、輸入形狀、PyTorch
# 版本、CPU 的 kernel 路徑，以及執行緒數（inductor 會把它寫進自己產生的迴圈）。存下的檔案不能當鍵：
# 每次編譯，它的位元組都不一樣。``common.aoti.compiled_package`` 只在鍵是新的時候才編譯，並用鍵
# 替檔案命名，所以重新建置這一頁不會重新編譯。

fixed = torch.export.export(loaded.module(), (images,))  # 套件的程式：500 張影像
package = compiled_package(fixed, "digits_int8_aoti")
started = time.perf_counter()
runner = torch._inductor.aoti_load_package(str(package))
aoti_load_seconds = time.perf_counter() - started
with torch.no_grad():
    served = runner(images)
print(f"{package.name}：{package.stat().st_size / 1e3:.0f} kB，載入花了 {aoti_load_seconds:.2f} 秒")
assert torch.equal(served, compiled_out), "和 torch.compile 同樣的 kernel，同樣的數字"

# %%
# 套件之所以是 int8，是因為它產生的 C++（封存檔裡的 ``wrapper.cpp`` ，就在編譯好的函式庫
# 旁邊）為三個 conv 各呼叫一次 oneDNN 的 int8 conv kernel、為兩個 linear 各呼叫一次它的 int8
# linear kernel，沒有呼叫 ATen 的其他 kernel。``kernel_calls`` 會數出這些呼叫。

calls = kernel_calls(package)
for kernel, count in calls.items():
    print(f"{kernel:18} × {count}")
assert calls == {"qconv_pointwise": 3, "qlinear_pointwise": 2}, "只有 int8 kernel"

# %%
# 大小與載入時間並列比較。程式檔大多是 weight 和圖的描述；套件多了編譯好的函式庫和包在外面的
# 執行環境，所以比較大——這是不需要編譯器就能啟動的代價。

program_kb, package_kb = saved.stat().st_size / 1e3, package.stat().st_size / 1e3
print(f"{'':24} {'大小':>6} {'就緒時間':>5}")
print(f"{'程式（export.save）':20} {program_kb:5.0f} kB {load_seconds:8.2f} 秒")
print(f"{'  再 torch.compile':23} {'':8} {load_seconds + compile_seconds:8.2f} 秒")
print(f"{'AOTInductor 套件':22} {package_kb:5.0f} kB {aoti_load_seconds:8.2f} 秒")

# %%
# 步驟 4 — 提供服務時的執行緒
# ----------------------------
# 套件的 int8 kernel 在 PyTorch 的運算內執行緒（intra-op threads）上執行：在伺服器啟動時呼叫
# ``torch.set_num_threads(n)`` （或在它的環境裡設定 ``OMP_NUM_THREADS=n`` ）決定有幾個。
# 這樣一個請求最多用到 ``n`` 個核心。
# 要追求吞吐量，就 **每個核心一個行程、每個行程一個執行緒** ：行程之間從不互相等待，而同一個
# 小請求的多個執行緒，很多時間都花在彼此同步上。所有行程加起來的執行緒數，絕不要超過核心數：
# 否則它們只能輪流使用核心。下面的計時（只印出來，從不 assert）比較這一小批資料用一個執行緒和
# 用所有核心的差別；在兩個核心的共用機器上，第二個數字受同一台機器上其他工作的影響，不亞於
# 模型本身。

for threads in sorted({1, os.cpu_count() or 1}):
    timing = compare_speed({"package": runner}, (images,), threads=threads, key=package.name)
    print(f"{threads} 個執行緒：每批 500 張的中位數 {timing['package'].median:.2f} 毫秒")
print(timing.header())

# %%
# .. note::
#
#    手機與微控制器走的是 ExecuTorch 的 ``.pte`` 檔，有它自己的 int8 quantizer 與 kernel
#    （XNNPACK）：見 M06 單元，PT2E 的邊緣裝置這一半，例如
#    :ref:`M06-3 · 由內而外看 .pte <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`。
#
# 小結
# ----
#
# =========================  ====================================  ========================
# 部署的形式                 提供服務的機器需要                    第一次呼叫之前
# =========================  ====================================  ========================
# ``torch.export.save``      PyTorch（先匯入它自己的 q/dq 運算，   載入，開 freezing 編譯
#                            不需要 torchao）與 C++ 編譯器
# AOTInductor ``.pt2``       同一版 PyTorch，和建置時同類的 CPU    載入
# =========================  ====================================  ========================
#
# - ``torch.export.save`` ／ ``load`` 讓 convert 後的程式來回一趟仍逐位元相同；載入後開
#   freezing 編譯。
# - ``aoti_compile_and_package`` 事先編譯一次，產生一個機器碼套件，只適用於一種輸入形狀、
#   一個 PyTorch 版本與一種 CPU；int8 kernel 就在它的 C++ 裡。
# - 提供服務時每個核心一個行程、每個行程一個執行緒，除非單一請求必須用上所有核心（見下方
#   PyTorch 關於 CPU 執行緒的說明；本頁量的是單一請求，不是吞吐量）。
#
# 練習
# ----
# 1. 在一個只匯入 torch 的全新 Python 行程裡——就像伺服器的一個 worker——先載入存下的程式，
#    再載入套件。預測：哪一個需要 ``import torch`` 以外的東西？那會是 torchao 嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          import subprocess
#          import sys
#
#
#          def in_fresh_process(code, **env):
#              """在只匯入 torch 的新 Python 裡執行 ``code``；回傳該行程。"""
#              command = [sys.executable, "-c", "import sys, torch\n" + code]
#              environment = {**os.environ, **env}
#              return subprocess.run(command, env=environment, capture_output=True, text=True)
#
#
#          as_program = in_fresh_process(f"torch.export.load({str(saved)!r})")
#          print(as_program.stderr.strip().splitlines()[-1])
#          assert "error when deserializing" in as_program.stderr, "q/dq 運算還沒註冊"
#          # 它的運算屬於 aten 與 quantized_decomposed，後者由 torch 自己在
#          # torch.ao.quantization.fx._decomposed 裡註冊：匯入它就夠了，不需要 torchao。
#          torch.save(images, folder / "images.pt")
#          with_ops = in_fresh_process(
#              "import torch.ao.quantization.fx._decomposed\n"
#              f"program = torch.export.load({str(saved)!r})\n"
#              f"out = program.module()(torch.load({str(folder / 'images.pt')!r}))\n"
#              f"torch.save(out, {str(folder / 'program_out.pt')!r})\n"
#              "assert 'torchao' not in sys.modules\n"
#          )
#          assert with_ops.returncode == 0, with_ops.stderr
#          assert torch.equal(torch.load(folder / "program_out.pt"), loaded.module()(images))
#          as_package = in_fresh_process(
#              "torch.set_num_threads(1)\n"  # 每個核心一個行程、一個執行緒
#              f"runner = torch._inductor.aoti_load_package({str(package)!r})\n"
#              f"out = runner(torch.load({str(folder / 'images.pt')!r}))\n"
#              f"torch.save(out, {str(folder / 'out.pt')!r})\n"
#              "assert 'torchao' not in sys.modules\n"
#          )
#          assert as_package.returncode == 0, as_package.stderr
#          assert torch.equal(torch.load(folder / "out.pt"), served), "只靠 torch，同樣的位元"
#
# 2. 用 7 張影像、而不是 500 張，呼叫存下的程式和套件。預測：哪一個會抱怨？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          print(loaded.module()(images[:7]).shape)  # 動態批次：任何大小都行
#          # 只有在 AOTI_RUNTIME_CHECK_INPUTS=1 時，套件才檢查輸入；否則它照樣讀 500 張
#          # 影像份量的記憶體。（這裡 images[:7] 和 500 張影像共用同一塊 storage；若是
#          # 自己獨立的張量，就會讀到結尾之外。）
#          assert runner(images[:7]).shape[0] == 500, "沒有錯誤，答案卻是錯的"
#          torch.save(images[:7].clone(), folder / "seven.pt")
#          checked = in_fresh_process(  # 來自練習 1
#              f"runner = torch._inductor.aoti_load_package({str(package)!r})\n"
#              f"runner(torch.load({str(folder / 'seven.pt')!r}))\n",
#              AOTI_RUNTIME_CHECK_INPUTS="1",
#          )
#          print(checked.stderr.strip().splitlines()[-1])
#          assert "expected: 500, but got: 7" in checked.stderr, "有檢查時，它拒絕執行"
#
# 延伸閱讀
# --------
# - `AOTInductor：預先編譯 torch.export 匯出的模型（PyTorch）
#   <https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html>`_
# - `torch.export 的儲存與載入（PyTorch）
#   <https://docs.pytorch.org/docs/stable/export.html#serialization>`_
# - `CPU 執行緒與 TorchScript 推論（PyTorch）
#   <https://docs.pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html>`_：
#   intra-op 執行緒，以及用多個行程提高吞吐量
#
# 下一課
# ------
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`：
# int8 模型還準確嗎？
