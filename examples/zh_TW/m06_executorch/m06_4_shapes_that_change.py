"""
M06-4 會變的形狀：有上限的動態批次
==================================

手機上的關鍵字偵測模型一次聽一段語音，使用者說得快時一次四段；伺服器則把剛好到達的請求湊成
一批。這一課把一個 int8 模型以 **有上限** 的批次 ``Dim("batch", min=1, max=4)`` 匯出，跟著這個
上限走到三個目標：``torch.compile`` 、AOTInductor 套件，以及在 ExecuTorch 執行環境上的
``.pte`` 。每個目標都以 int8 kernel 執行批次 1 與批次 4，而且是在實際執行的地方證明這一點；
而對批次 5，三者的反應各不相同。

**你會學到**

- ``Dim(min, max)`` 如何從 ``torch.export`` 經過量化，走到每個目標
- 如何證明真的跑了 int8：編譯後模型與載入的套件用 profiler，``.pte`` 用 ETDump
- 上限在邊緣裝置上的代價（依最大批次規劃的記憶體），以及超過上限時會發生什麼事

**先備知識**：
:ref:`M03-4 · 部署 int8 模型 <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`、
:ref:`M06-3 · 由內而外看 .pte <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 一個關鍵字偵測模型：兩個 2-D conv 處理一段語音的 49 × 10 MFCC 特徵（49 個音框，各 10 個
# 係數），再由一個 linear 輸出 12 個關鍵字。它只匯出一次，範例批次為 2（範例批次若是 1，匯出會把
# 批次維度特化成常數，見 M00-1），批次維度宣告為 1 到 4 之間的動態維度。

import contextlib
import inspect
import io
import os
import subprocess
import sys
import warnings

import torch
from torch import nn
from torch.export import Dim

from common.aoti import compiled_package, kernel_calls, kernels_ran
from common.expect import expect_error
from common.kernels import kernels_run
from common.numerics import sqnr
from common.pt2e import quiet, x86_quantizer
from common.viz import draw

quiet()
# inductor 的 int8 lowering 複製 zero point 張量的方式會讓 torch 自己發出警告（M03-3）。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import _get_extended_header
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import delegated, to_executorch, xnnpack_quantizer
from common.runtime import operators_run

qd = torch.ops.quantized_decomposed
FRAMES, COEFFICIENTS, KEYWORDS, MAX_BATCH = 49, 10, 12, 4


class Spotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, (5, 3), padding=(2, 1))
        self.conv2 = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32 * 25 * 5, KEYWORDS)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def clips(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(
        batch, 1, FRAMES, COEFFICIENTS, generator=torch.Generator().manual_seed(seed)
    )


torch.manual_seed(0)
model = Spotter().eval()
example = (clips(2),)
dynamic_shapes = {"x": {0: Dim("batch", min=1, max=MAX_BATCH)}}
exported = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)


def quantized(quantizer) -> torch.fx.GraphModule:
    """匯出的圖經過 prepare、以 1 到 4 每種大小的批次校準，再 convert。"""
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for size in range(1, MAX_BATCH + 1):
            prepared(clips(size, seed=size))
    return convert_pt2e(prepared)


x86_model = quantized(x86_quantizer())  # 給 torch.compile 與 AOTInductor（M03）
edge_model = quantized(xnnpack_quantizer())  # 給 .pte（M06）

# %%
# 步驟 1 — 上限就在圖裡
# ---------------------
# 匯出把批次變成一個符號（例如 ``s0`` ），並附上範圍：程式的 ``range_constraints`` 。每個
# node 的形狀都用它表示，以四種批次大小校準的量化圖也一樣：一張圖服務所有大小。

(batch_symbol, batch_range), *_ = exported.range_constraints.items()
print(f"{batch_symbol}: {batch_range}")
placeholder = next(n for n in edge_model.graph.nodes if n.op == "placeholder")
print(f"量化圖的輸入：{tuple(placeholder.meta['val'].shape)}")
assert (batch_range.lower, batch_range.upper) == (1, MAX_BATCH), "Dim 的下限與上限"
assert not isinstance(placeholder.meta["val"].shape[0], int), "批次是一個符號"

# %%
# 匯出的模型被呼叫時會以這個範圍檢查輸入：批次 1 與 4 可以執行，批次 5 被上限的 guard 拒絕；
# 下面在子行程裡匯出的小程式就是如此：

for size in (1, MAX_BATCH):
    assert edge_model(clips(size)).shape == (size, KEYWORDS), "範圍內的每種大小都能執行"
GUARDED = f"""
import torch
from torch.export import Dim
class Net(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x)
model = Net({COEFFICIENTS}, 2)
bound = {{"x": {{0: Dim("batch", min=1, max={MAX_BATCH})}}}}
program = torch.export.export(model, (torch.randn(2, {COEFFICIENTS}),), dynamic_shapes=bound)
program.module()(torch.randn({MAX_BATCH + 1}, {COEFFICIENTS}))
"""
child = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True)
guard_error = child.stderr.strip().splitlines()[-1]
print(guard_error)
assert guard_error == "AssertionError: Guard failed: x.size()[0] <= 4", "上限"
draw(edge_model, title="關鍵字偵測模型，int8（XNNPACK），批次 1..4")

# %%
# 不過，q/dq 模型可能失去這個 guard。只要呼叫堆疊上有一個檔案的路徑含有 ``executorch`` 或
# ``torchao`` （ ``torch/export/_unlift.py`` 的 ``_ok_to_generate_guards_fn`` ），
# ``.module()`` 就改用模組上的一個 hook 檢查範圍，不在圖裡放 ``_guards_fn`` node；而
# ``prepare_pt2e`` 與 ``convert_pt2e`` 回傳的是新的圖模組，沒有這個 hook。這一頁從名為
# ``m06_executorch/`` 的資料夾執行（網站建置、測試、課程的 clone 都是）：它的 q/dq 模型
# 一聲不響地執行批次 5。從別的資料夾以 notebook 執行的副本則保有這個 node，會拒絕批次 5。
# 這次執行屬於哪一種：

on_such_path = any(
    word in frame.filename for frame in inspect.stack(0) for word in ("executorch", "torchao")
)
guarded = bool(edge_model.graph.find_nodes(op="call_module", target="_guards_fn"))
try:
    batch_5 = f"照樣執行，輸出 {tuple(edge_model(clips(MAX_BATCH + 1)).shape)}"
except AssertionError as error:
    batch_5 = f"{type(error).__name__}: {error}"
print(f"堆疊上有 executorch／torchao：{on_such_path}；_guards_fn：{guarded}；{batch_5}")
assert guarded != on_such_path, "只有在沒有這種路徑呼叫 .module() 時，才有 _guards_fn node"
expected = (
    "照樣執行，輸出 (5, 12)" if on_such_path else "AssertionError: Guard failed: x.size()[0] <= 4"
)
assert batch_5 == expected, "從這種路徑執行時不檢查，從其他路徑執行時拒絕"

# %%
# 步驟 2 — torch.compile：每種批次大小編譯一次
# --------------------------------------------
# ``torch.compile`` 不讀匯出的 ``Dim`` ：它重新追蹤模型，在 ``dynamic=False`` 下遇到每一種
# 批次大小就編譯一次，每次都有 freezing（M03-3），每次都是 int8。profiler 列出每種大小執行
# 的 kernel（ ``kernels_run`` ，M03-4）。

torch._dynamo.reset()
torch._inductor.config.freezing = True  # 設定給整個行程：重新編譯時仍保有它（m99_3）
compiles = torch._dynamo.utils.counters["stats"]
before = compiles["unique_graphs"]
with torch.no_grad():
    compiled = torch.compile(x86_model, dynamic=False)
    ran = {}
    for size in (1, MAX_BATCH):
        compiled(clips(size))  # 這個大小的編譯
        ran[size] = kernels_run(compiled, (clips(size, seed=1),))
        print(f"批次 {size}：{ran[size].summary}")
new_graphs = compiles["unique_graphs"] - before
print(f"編譯的圖：{new_graphs}")
assert new_graphs == 2, "批次 1 編譯一次，批次 4 再編譯一次"
assert all(r.int8 and not r.float for r in ran.values()), "兩種大小都以 int8 執行 conv 與 linear"

# %%
# 若用 ``dynamic=True`` ，它會編譯一張批次為符號的圖；在這個模型上，那張圖第一次呼叫就失敗，
# 出現
# :ref:`疑難排解：lowering 與速度 <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`
# 的 stride 斷言。觸發它的是 ``conv1`` ：輸入只有 **一個通道** 的 int8 conv（一段語音的
# MFCC、一張灰階影像）。批次為符號時，inductor 宣告它的輸出是連續的（NCHW，32 個通道之間的
# stride 是 490），oneDNN 的 int8 conv 寫出的卻是通道在後（NHWC，stride 1），編譯出的程式碼
# 檢查 stride 時就停下（ ``torch/_inductor/mkldnn_ir.py`` 的
# ``_prepare_convolution_fusion_create`` ；torch 2.13、torchao 0.18）。對這個模型，
# ``torch.compile`` 可行的做法是分別編譯幾種批次大小，或把輸入補齊到這些大小。

torch._dynamo.reset()
with torch.no_grad():
    symbolic = torch.compile(x86_model, dynamic=True)
    with expect_error(AssertionError, match="expected size 32==32, stride 1==490 at dim=1"):
        symbolic(clips(2))

# %%
# 步驟 3 — AOTInductor：一個套件涵蓋整個範圍
# ------------------------------------------
# ``aoti_compile_and_package`` 接收 ``ExportedProgram`` 連同它的範圍：一個套件服務 1 到 4
# 的每種批次。``compiled_package`` （M03-4）以 freezing 編譯它；加上 ``kernel_profile=True``
# 時，inductor 會把每次 kernel 呼叫包在一筆 profiler 紀錄裡。產生的 C++ 呼叫兩個 int8 conv 與
# 一個 int8 linear；``kernels_ran`` 顯示載入的套件在批次 1 與批次 4 都真的執行了它們。
# （ ``check=False`` ： ``compiled_package`` 交出套件之前，會拿它的輸出和它的程式比對，
# 這個套件會被拒絕。）

x86_program = torch.export.export(x86_model, example, dynamic_shapes=dynamic_shapes)
package = compiled_package(x86_program, "spotter_int8_batch_1_4", kernel_profile=True, check=False)
calls = kernel_calls(package)
print(f"套件的 C++ 裡：{dict(calls)}")
runner = torch._inductor.aoti_load_package(str(package))
at_run_time = {size: kernels_ran(runner, (clips(size),)) for size in (1, MAX_BATCH)}
for size, kernels in at_run_time.items():
    print(f"批次 {size}，執行時：{dict(kernels)}")
int8_kernels = {"qconv_pointwise": 2, "qlinear_pointwise": 1}
assert all(kernels == int8_kernels for kernels in at_run_time.values()), "批次 1 與 4 都是 int8"

# %%
# profiler 證明執行的是 int8，卻不能證明算得對。和 q/dq 模型相比，套件在批次 3 的輸出 SQNR
# 接近 0 dB：只是雜訊，而且不報任何錯。這是步驟 2 的錯誤：套件宣告 ``conv1`` 的輸出是連續的，
# oneDNN 寫出的卻是通道在後，而 inductor 在它之後產生的 ReLU 迴圈，照宣告的記憶體配置讀取它。

package_sqnr = sqnr(x86_model(clips(3)), runner(clips(3))).item()
print(f"動態套件與 q/dq 模型相比的 SQNR：{package_sqnr:.1f} dB")
assert package_sqnr < 10, "數值錯誤，而且不報錯"

# %%
# 讓 ``torch.compile`` 停下的 stride 檢查也編譯進了套件，只是預設關閉：只有在載入套件的行程的
# 環境變數裡設定 ``AOTI_RUNTIME_CHECK_INPUTS=1`` ，它才會執行。 ``checked`` 在設定了這個變數
# 的子行程裡執行一個套件。


def checked(path, sizes) -> dict[int, str]:
    """在設定 AOTI_RUNTIME_CHECK_INPUTS=1 的子行程裡，讓套件執行每種批次大小：
    回傳 "ran"，或錯誤訊息的第一行。"""
    code = f"""
import torch
runner = torch._inductor.aoti_load_package({str(path)!r})
for size in {tuple(sizes)!r}:
    try:
        runner(torch.randn(size, 1, {FRAMES}, {COEFFICIENTS}))
        print("ran")
    except RuntimeError as error:
        print(str(error).splitlines()[0])
"""
    env = {**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"}
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return dict(zip(sizes, child.stdout.splitlines(), strict=True))


# %%
# 檢查開啟時，套件拒絕上限以內的批次 3，錯誤就是步驟 2 的 stride 錯誤；批次 5 則因為超過上限
# 被拒絕。沒有這個變數時，批次 5 照樣執行。

refusals = checked(package, (3, MAX_BATCH + 1))
for size, line in refusals.items():
    print(f"批次 {size}：{line}")
assert refusals[3].startswith("expected size 32==32, stride 1==490 at dim=1"), "記憶體配置"
assert refusals[5].endswith("expected to be <= 4, but got: 5"), "有檢查時，批次 5 被拒絕"
assert runner(clips(MAX_BATCH + 1)).shape == (MAX_BATCH + 1, KEYWORDS), "沒有檢查時照樣執行"

# %%
# 仍只用一個套件的解法：為最大的批次編譯靜態的套件，較小的批次以 0 補齊到這個大小（每個
# 樣本各自計算，補上的部分不影響其他輸出）。這樣它的輸出和 q/dq 模型只差在 int8 捨入，執行的
# 也是同樣的 int8 kernel。

static_program = torch.export.export(x86_model, (clips(MAX_BATCH),))
static_package = compiled_package(static_program, "spotter_int8_batch_4", kernel_profile=True)
static_runner = torch._inductor.aoti_load_package(str(static_package))


def padded(batch: torch.Tensor) -> torch.Tensor:
    filler = batch.new_zeros(MAX_BATCH - batch.shape[0], *batch.shape[1:])
    return static_runner(torch.cat([batch, filler]))[: batch.shape[0]]


for size in (1, 3):
    padded_sqnr = sqnr(x86_model(clips(size)), padded(clips(size))).item()
    print(f"批次 {size}，補齊到 {MAX_BATCH}：SQNR {padded_sqnr:.1f} dB")
    assert padded_sqnr > 30, "q/dq 模型的數值"
assert kernels_ran(static_runner, (clips(MAX_BATCH),)) == int8_kernels, "同樣的 int8 kernel"

# %%
# 保留動態批次的解法：讓只有一個輸入通道的 conv 留在浮點數
# （ ``set_module_name_qconfig("conv1", None)`` ）。批次為符號時，浮點數 conv 不預先打包，
# 寫出的正是 inductor 宣告的記憶體配置；``conv2`` 與 linear 仍是 int8。這個套件的輸出與它的
# q/dq 模型一致，通過 ``compiled_package`` 的檢查，在 ``AOTI_RUNTIME_CHECK_INPUTS=1`` 下也能
# 執行批次 3。

stem_float = quantized(x86_quantizer().set_module_name_qconfig("conv1", None))
stem_program = torch.export.export(stem_float, example, dynamic_shapes=dynamic_shapes)
stem_package = compiled_package(stem_program, "spotter_conv1_float_1_4", kernel_profile=True)
stem_runner = torch._inductor.aoti_load_package(str(stem_package))
stem_sqnr = sqnr(stem_float(clips(3)), stem_runner(clips(3))).item()
print(f"批次 3：SQNR {stem_sqnr:.1f} dB；{dict(kernels_ran(stem_runner, (clips(3),)))}")
assert stem_sqnr > 30, "動態批次下，仍是 q/dq 模型的數值"
assert kernels_ran(stem_runner, (clips(3),))["qconv_pointwise"] == 1, "conv2 int8，conv1 浮點數"
assert checked(stem_package, (3,)) == {3: "ran"}, "通過 stride 檢查"

# %%
# 步驟 4 — .pte：執行環境上的批次 1 與 4
# --------------------------------------
# ``common.edge.to_executorch`` 接收同一份 ``dynamic_shapes`` ，交給 ``torch.export`` ；
# XNNPACK delegate 為 1 到 4 之間的批次編譯。``.pte`` 在範圍兩端執行，與 q/dq 模型相差都在
# 一格（輸出的 scale）以內。

program = to_executorch(
    edge_model, example, partitioner=XnnpackPartitioner(), dynamic_shapes=dynamic_shapes
)
with contextlib.redirect_stderr(io.StringIO()):  # 執行環境的 CPU 資訊紀錄（M06-3）
    loaded = Runtime.get().load_program(program.buffer)
    forward = loaded.load_method("forward")  # ``forward`` 執行期間 ``loaded`` 必須存活
step = [n for n in edge_model.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
for size in (1, MAX_BATCH):
    out = forward.execute([clips(size)])[0]
    steps = ((out - edge_model(clips(size))).abs() / step).round().max().item()
    print(f"批次 {size}：輸出 {tuple(out.shape)}，與 q/dq 模型相差 {steps:.0f} 格")
    assert out.shape == (size, KEYWORDS) and steps <= 1, "與 q/dq 模型相差不超過一格"

# %%
# 執行了哪些運算子？``operators_run`` 以 **ETDump** （M06-3）執行 ``.pte`` 一次，讀取執行環境
# 為每個 XNNPACK 運算子記下的 profiling 事件；XNNPACK 的名稱帶著資料型別：``QC8`` 是 int8
# 搭配 per-channel int8 weight，``QS8`` 是 int8，``X8`` 是搬動 int8 位元組（conv 前後的記憶體
# 配置轉換）。沒有浮點數運算子，也沒有 portable kernel：兩種大小下，整張圖都在 XNNPACK 裡以
# int8 執行。

for size in (1, MAX_BATCH):
    operators = operators_run(program.buffer, [clips(size)])
    print(f"批次 {size}：\n{operators.summary}")
    assert operators.int8 and not operators.float_only and not operators.portable, "全部是 int8"

# %%
# 步驟 5 — 依最大批次規劃的記憶體
# -------------------------------
# ExecuTorch 事先在一塊 arena 裡（M06-2）規劃它在指令之間保存的張量：程式的輸入與輸出，
# 以及在 delegate 之間傳遞的張量。delegate 內部的 conv 活化值，XNNPACK 放在自己的工作區，
# 不在這份規劃裡。動態張量會分到它上限所需的空間：規劃裡的輸入以最大的形狀儲存。靜態
# ``.pte`` 的 arena 裝的是它的輸入與輸出，所以批次 4 的大約是批次 1 的四倍，而且比 ``conv1``
# 單單一份 int8 輸出（4 × 32 × 49 × 10 位元組）還小。
#
# 動態 ``.pte`` 的 arena 大得多，原因另有所在：批次為符號時，``flatten`` 是一個變成
# ``[s0, 4000]`` 的 view，而 XNNPACK 只接收形狀固定的 view（M06-2 的 partitioner：
# ``_view`` ）。圖在它兩側切成兩個 delegate，第二個 conv 的浮點數輸出經由 arena 在兩者之間
# 傳遞，依批次 4 規劃：4 × 32 × 25 × 5 × 4 位元組。上限決定規劃要保留多少記憶體：上限要設得
# 剛好，也要看看符號形狀把什麼留在 delegate 之外。


def plan_of(pte: bytes):
    header = _get_extended_header(pte)
    return _flatbuffer_to_program(pte[: header.program_size]).execution_plan[0]


dynamic_plan = plan_of(program.buffer)
static = {
    size: to_executorch(edge_model, (clips(size),), partitioner=XnnpackPartitioner())
    for size in (1, MAX_BATCH)
}
arena = {
    "dynamic 1..4": dynamic_plan.non_const_buffer_sizes[1],
    **{f"static {n}": plan_of(p.buffer).non_const_buffer_sizes[1] for n, p in static.items()},
}
delegates = {
    "dynamic 1..4": len(delegated(program.exported_program())),
    **{f"static {n}": len(delegated(p.exported_program())) for n, p in static.items()},
}
print(f"規劃的輸入：{dynamic_plan.values[dynamic_plan.inputs[0]].val.sizes}")
for name, size in arena.items():
    print(f"{name:13} arena {size:9,} 位元組，{delegates[name]} 個 delegate")
assert dynamic_plan.values[dynamic_plan.inputs[0]].val.sizes == [MAX_BATCH, 1, FRAMES, COEFFICIENTS]
assert arena["static 4"] > 3 * arena["static 1"], "靜態 arena 隨批次變大"
input_output = MAX_BATCH * (FRAMES * COEFFICIENTS + KEYWORDS) * 4  # float32 的輸入與輸出
conv1_int8 = MAX_BATCH * 32 * FRAMES * COEFFICIENTS  # 每個元素一個位元組
assert input_output <= arena["static 4"] < conv1_int8, "輸入與輸出；沒有 conv 的活化值"
assert delegates == {"dynamic 1..4": 2, "static 1": 1, "static 4": 1}, "flatten 把它切開"
conv_output = MAX_BATCH * 32 * 25 * 5 * 4  # float32，依批次 4 規劃
assert conv_output < arena["dynamic 1..4"] < conv_output + arena["static 4"], (
    "動態 arena 也為這塊 conv 輸出付出記憶體"
)

# %%
# 步驟 6 — 執行環境上的批次 5
# ---------------------------
# 超過上限時，執行環境在任何運算之前就拒收輸入：``set_inputs`` 無法調整規劃好的輸入張量的
# 大小，它的容量是 4 × 1 × 49 × 10 = 1,960 個元素。Python 的錯誤只帶一個錯誤碼（ ``0x10`` ，
# ``InvalidArgument`` ）；原因寫在執行環境的紀錄裡。

log = io.StringIO()
with expect_error(RuntimeError, match="method->set_inputs() for method 'forward' failed"):
    with contextlib.redirect_stderr(log):
        forward.execute([clips(MAX_BATCH + 1)])
resize = [line for line in log.getvalue().splitlines() if "Attempted to resize" in line]
print(resize[0])
assert f"{MAX_BATCH * FRAMES * COEFFICIENTS} elements" in resize[0], "批次 4 的容量"
assert forward.execute([clips(2)])[0].shape == (2, KEYWORDS), "之後 method 仍然可以執行"

# %%
# 小結
# ----
# ============================  ========================  =================================
# 目標                          批次 1 到 4               批次 5
# ============================  ========================  =================================
# q/dq 模型（匯出的 Dim）       一張圖                    ``Guard failed: x.size()[0] <= 4``
# ``torch.compile``             每種大小編譯一次          再編譯第五張圖
# AOTInductor 套件              int8 kernel，但是雜訊     照樣執行，不檢查
#                               （ ``conv1`` 單通道）；
#                               補齊到靜態的 4，或讓
#                               ``conv1`` 留在浮點數
# ExecuTorch 上的 ``.pte``      一個程式，依 4 規劃       ``set_inputs() ... 0x10``
# ============================  ========================  =================================
#
# - 用 ≥ 2 的範例批次搭配 ``Dim("batch", min=1, max=N)`` 匯出，用幾種大小校準；
#   ``to_executorch(..., dynamic_shapes=...)`` 把範圍帶到 ``.pte`` 。
# - 在執行的地方證明 int8：``kernels_run`` （編譯後的模型）、對以 ``kernel_profile=True``
#   編譯的套件用 ``kernels_ran`` 、``operators_run`` （ ``.pte`` 的 ETDump）；數值也要檢查：
#   動態批次的 AOTInductor 套件執行了 int8 kernel，算出來的卻是雜訊，因為它的第一個 int8
#   conv 只讀一個通道（torch 2.13）。 ``compiled_package`` 交出套件之前，會拿它和它的程式
#   比對。
# - 套件只在 ``AOTI_RUNTIME_CHECK_INPUTS=1`` 時檢查輸入的形狀與 kernel 輸出的 stride：這會
#   拒絕批次 5，也會在批次 3 就拒絕這個套件。
#
# 練習
# ----
# 1. 把上限提高到 8（重新匯出、量化、下放：q/dq 模型保留它匯出時的上限）。預測新的 ``.pte``
#    的 arena 和 ``dynamic 1..4`` 的相比如何。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          eight = {"x": {0: Dim("batch", min=1, max=8)}}
#          # q/dq 模型保留它匯出時的上限（<= 4）：從浮點數模型重新開始
#          prepared = prepare_pt2e(
#              torch.export.export(model, example, dynamic_shapes=eight).module(),
#              xnnpack_quantizer(),
#          )
#          for size in (1, 8):
#              prepared(clips(size))
#          wider = to_executorch(
#              convert_pt2e(prepared),
#              example,
#              partitioner=XnnpackPartitioner(),
#              dynamic_shapes=eight,
#          )
#          wider_arena = plan_of(wider.buffer).non_const_buffer_sizes[1]
#          print(f"{wider_arena:,} 位元組")
#          assert wider_arena > 1.9 * arena["dynamic 1..4"], "約兩倍：依 8 規劃"
#
# 2. 改成加寬輸入：給關鍵字偵測模型三個輸入通道（MFCC 加上它的一階與二階差分，
#    ``nn.Conv2d(3, 32, (5, 3), padding=(2, 1))`` ），每個 conv 都是 int8。預測
#    ``compiled_package`` 是否接受它的動態套件，以及這個套件在批次 3 的輸出，和為批次 3
#    編譯的靜態套件相比如何。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          wide = Spotter().eval()
#          wide.conv1 = nn.Conv2d(3, 32, (5, 3), padding=(2, 1))
#          wide_clips = [torch.randn(size, 3, FRAMES, COEFFICIENTS) for size in (2, 3)]
#          wide_export = torch.export.export(
#              wide, (wide_clips[0],), dynamic_shapes=dynamic_shapes
#          )
#          prepared = prepare_pt2e(wide_export.module(), x86_quantizer())
#          for batch in wide_clips:
#              prepared(batch)
#          wide_int8 = convert_pt2e(prepared)
#          wide_program = torch.export.export(
#              wide_int8, (wide_clips[0],), dynamic_shapes=dynamic_shapes
#          )
#          wide_runner = torch._inductor.aoti_load_package(
#              str(compiled_package(wide_program, "spotter_3_channels_1_4"))  # 有檢查
#          )
#          three = torch.export.export(wide_int8, (wide_clips[1],))  # 靜態，批次 3
#          three_runner = torch._inductor.aoti_load_package(
#              str(compiled_package(three, "spotter_3_channels_3"))
#          )
#          dynamic_out = wide_runner(wide_clips[1])
#          print(f"{sqnr(wide_int8(wide_clips[1]), dynamic_out).item():.1f} dB")
#          assert torch.equal(dynamic_out, three_runner(wide_clips[1])), (
#              "三個通道：和靜態套件的數值一個位元都不差"
#          )
#
# 延伸閱讀
# --------
# - `torch.export：動態形狀
#   <https://docs.pytorch.org/docs/stable/export.html#expressing-dynamism>`_
# - `ExecuTorch：記憶體規劃
#   <https://docs.pytorch.org/executorch/stable/compiler-memory-planning.html>`_
# - `AOTInductor <https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html>`_
#
# 下一課
# ------
# :ref:`M06-5 · int8 進，int8 出
# <sphx_glr_lessons_m06_executorch_m06_5_int8_inputs_and_outputs.py>` 拿掉程式兩端最後的
# 浮點數：輸入與輸出都是 int8 的 ``.pte`` 。
#
# 上限處的錯誤，以及 ExecuTorch 使用者最常回報的錯誤，都在
# :ref:`疑難排解：ExecuTorch 與 XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`。
