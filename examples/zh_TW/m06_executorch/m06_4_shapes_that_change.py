"""
M06-4 會變的形狀：有上限的動態批次
==================================

手機上的關鍵字偵測一次聽一段語音，使用者說得快時一次四段；伺服器則把剛好到達的請求湊成
一批。這一課把一個 int8 模型以 **有上限** 的批次 ``Dim("batch", min=1, max=4)`` 匯出，跟著這個
上限走到三個目標：``torch.compile`` 、AOTInductor 封裝檔，以及在 ExecuTorch 執行環境上的
``.pte`` 。每個目標都以 int8 kernel 執行批次 1 與批次 4，並在它執行的地方證明；而對批次 5，
三者的反應各不相同。

**你將學到**

- ``Dim(min, max)`` 如何從 ``torch.export`` 經過量化，走到每個目標
- 如何證明真的跑了 int8：編譯後模型與載入的封裝檔用 profiler，``.pte`` 用 ETDump
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
# 係數），再由一個 linear 輸出 12 個關鍵字。它只匯出一次，範例批次為 2（批次 1 會被固定下來，
# M00-1），批次維度宣告為 1 到 4 之間的動態維度。

import contextlib
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
# 不過在這一頁，q/dq 模型一聲不響地執行了批次 5。只要呼叫堆疊上任何一個檔案的路徑含有
# ``executorch`` 或 ``torchao`` ，torch 就不在 ``.module()`` 裡放這項檢查
# （ ``torch/export/_unlift.py`` 的 ``_ok_to_generate_guards_fn`` ），而這一頁就放在
# ``m06_executorch/`` 裡。你的腳本若叫 ``executorch_demo.py`` ，也會同樣失去 guard；超過上限時
# 它照樣計算圖裡的運算。

guarded = bool(edge_model.graph.find_nodes(op="call_module", target="_guards_fn"))
print(f"這一頁的 q/dq 模型有 _guards_fn：{guarded}")
if guarded:  # 從不含 "executorch" 的路徑執行
    with expect_error(AssertionError, match="Guard failed: x.size()[0] <= 4"):
        edge_model(clips(MAX_BATCH + 1))
else:
    assert edge_model(clips(MAX_BATCH + 1)).shape == (5, KEYWORDS), "批次 5 照樣執行，沒有檢查"

# %%
# 步驟 2 — torch.compile：每種批次大小編譯一次
# --------------------------------------------
# ``torch.compile`` 不讀匯出的 ``Dim`` ：它重新追蹤模型，在 ``dynamic=False`` 下遇到每一種
# 批次大小就編譯一次，每次都有 freezing（M03-3），每次都是 int8。profiler 列出每種大小執行
# 的 kernel（ ``kernels_run`` ，M03-4）。

torch._dynamo.reset()
torch._inductor.config.freezing = True  # 設定給整個 process：重新編譯時仍保有它（m99_3）
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
# 若用 ``dynamic=True`` ，它會編譯一張批次為符號的圖；在這個 int8 模型上，那張圖第一次呼叫
# 就失敗，出現
# :ref:`疑難排解：lowering 與速度 <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`
# 的 stride 斷言（inductor 預期 int8 conv 的輸出是一種記憶體配置，得到的卻是另一種）。對
# ``torch.compile`` 來說，可行的做法是分別編譯幾種批次大小，或把輸入補齊到這些大小。

torch._dynamo.reset()
with torch.no_grad():
    symbolic = torch.compile(x86_model, dynamic=True)
    with expect_error(AssertionError, match="expected size"):
        symbolic(clips(2))

# %%
# 步驟 3 — AOTInductor：一個封裝檔涵蓋整個範圍
# --------------------------------------------
# ``aoti_compile_and_package`` 接收 ``ExportedProgram`` 連同它的範圍：一個封裝檔服務 1 到 4
# 的每種批次。``compiled_package`` （M03-4）以 freezing 編譯它；加上 ``kernel_profile=True``
# 時，inductor 會把每次 kernel 呼叫包在一筆 profiler 紀錄裡。產生的 C++ 呼叫兩個 int8 conv 與
# 一個 int8 linear；``kernels_ran`` 顯示載入的封裝檔在批次 1 與批次 4 都真的執行了它們。

x86_program = torch.export.export(x86_model, example, dynamic_shapes=dynamic_shapes)
package = compiled_package(x86_program, "spotter_int8_batch_1_4", kernel_profile=True)
calls = kernel_calls(package)
print(f"封裝檔的 C++ 裡：{dict(calls)}")
runner = torch._inductor.aoti_load_package(str(package))
at_run_time = {size: kernels_ran(runner, (clips(size),)) for size in (1, MAX_BATCH)}
for size, kernels in at_run_time.items():
    print(f"批次 {size}，執行時：{dict(kernels)}")
int8_kernels = {"qconv_pointwise": 2, "qlinear_pointwise": 1}
assert all(kernels == int8_kernels for kernels in at_run_time.values()), "批次 1 與 4 都是 int8"

# %%
# profiler 證明執行的是 int8，卻不能證明算得對。和 q/dq 模型相比，封裝檔在批次 3 的輸出 SQNR
# 接近 0 dB：只是雜訊，而且沒有任何錯誤。又是批次為符號時的 int8 conv：``torch.compile`` 在
# inductor 的 stride 檢查停下（步驟 2），封裝檔沒有這項檢查，就照樣算下去（torch 2.13、
# torchao 0.18）。

package_sqnr = sqnr(x86_model(clips(3)), runner(clips(3))).item()
print(f"SQNR，動態封裝檔對 q/dq 模型：{package_sqnr:.1f} dB")
assert package_sqnr < 10, "數值錯誤，而且不報錯"

# %%
# 仍只用一個封裝檔的解法：為最大的批次編譯靜態的封裝檔，較小的批次以 0 補齊到這個大小（每個
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
# 超過上限時，動態封裝檔預設 **不會** 拒絕：批次 5 照樣執行。只有在執行它的行程環境裡設定
# ``AOTI_RUNTIME_CHECK_INPUTS=1`` ，封裝檔才會以它的形狀檢查輸入，就像這個子行程：

assert runner(clips(MAX_BATCH + 1)).shape == (MAX_BATCH + 1, KEYWORDS), "批次 5 照樣執行，沒有檢查"
CHECKED = f"""
import torch
runner = torch._inductor.aoti_load_package({str(package)!r})
runner(torch.randn({MAX_BATCH + 1}, 1, {FRAMES}, {COEFFICIENTS}))
"""
env = {**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"}
child = subprocess.run([sys.executable, "-c", CHECKED], env=env, capture_output=True, text=True)
refusal = [line for line in child.stderr.splitlines() if "Error" in line][-1]
print(refusal)
assert child.returncode != 0 and "4" in refusal, "有檢查時，批次 5 被拒絕"

# %%
# 步驟 4 — .pte：執行環境上的批次 1 與 4
# --------------------------------------
# ``common.edge.to_executorch`` 接收同一份 ``dynamic_shapes`` ，交給 ``torch.export`` ；
# XNNPACK delegate 為 1 到 4 之間的批次編譯。``.pte`` 在範圍兩端執行，與 q/dq 模型相差都在
# 一個輸出量化間隔以內。

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
    print(f"批次 {size}：輸出 {tuple(out.shape)}，與 q/dq 模型相差 {steps:.0f} 個輸出間隔")
    assert out.shape == (size, KEYWORDS) and steps <= 1, "與 q/dq 模型相差不超過一個間隔"

# %%
# 執行了哪些運算子？``operators_run`` 以 **ETDump** （M06-3）執行 ``.pte`` 一次，讀取執行環境
# 為每個 XNNPACK 運算子記下的 profiling 事件；XNNPACK 的名稱帶著資料型別：``QC8`` 是 int8
# 搭配 per-channel int8 weight，``QS8`` 是 int8，``X8`` 是搬動 int8 位元組（conv 前後的記憶體
# 配置轉換）。沒有 float 運算子，也沒有 portable kernel：兩種大小下，整張圖都在 XNNPACK 裡以
# int8 執行。

for size in (1, MAX_BATCH):
    operators = operators_run(program.buffer, [clips(size)])
    print(f"批次 {size}：\n{operators.summary}")
    assert operators.int8 and not operators.float_only and not operators.portable, "全部是 int8"

# %%
# 步驟 5 — 依最大批次規劃的記憶體
# -------------------------------
# ExecuTorch 事先在一塊 arena 裡規劃指令之間每個張量的位置（M06-2），動態張量會分到它上限
# 所需的空間：規劃裡的輸入以最大的形狀儲存。批次 1 的靜態 ``.pte`` 只需要批次 4 的約四分之一。
#
# 動態的 ``.pte`` 需要的遠比兩者都多，原因另有所在：批次為符號時，``flatten`` 是一個變成
# ``[s0, 4000]`` 的 view，而 XNNPACK 只接收形狀固定的 view（M06-2 的 partitioner：
# ``_view`` ）。圖在它兩側切成兩個 delegate，第二個 conv 的 float 輸出經由 arena 在兩者之間
# 傳遞，依批次 4 規劃：4 × 32 × 25 × 5 × 4 位元組。手機要為上限付出記憶體：上限要設得剛好，
# 也要看看符號形狀把什麼留在 delegate 之外。


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
    print(f"{name:13} arena {size:9,} bytes, {delegates[name]} 個 delegate")
assert dynamic_plan.values[dynamic_plan.inputs[0]].val.sizes == [MAX_BATCH, 1, FRAMES, COEFFICIENTS]
assert arena["static 4"] > 3 * arena["static 1"], "靜態 arena 隨批次變大"
assert delegates == {"dynamic 1..4": 2, "static 1": 1, "static 4": 1}, "flatten 把它切開"
conv_output = MAX_BATCH * 32 * 25 * 5 * 4  # float32，依批次 4 規劃
assert conv_output < arena["dynamic 1..4"] < conv_output + arena["static 4"], "也付出這些記憶體"

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
# AOTInductor 封裝檔            int8 kernel，但是雜訊；   照樣執行，不檢查
#                               補齊到靜態的 4
# ExecuTorch 上的 ``.pte``      一個程式，依 4 規劃       ``set_inputs() ... 0x10``
# ============================  ========================  =================================
#
# - 用 ≥ 2 的範例批次搭配 ``Dim("batch", min=1, max=N)`` 匯出，用幾種大小校準；
#   ``to_executorch(..., dynamic_shapes=...)`` 把範圍帶到 ``.pte`` 。
# - 在執行的地方證明 int8：``kernels_run`` （編譯後的模型）、對以 ``kernel_profile=True``
#   編譯的封裝檔用 ``kernels_ran`` 、``operators_run`` （ ``.pte`` 的 ETDump）；數值也要檢查：
#   動態批次的 AOTInductor 封裝檔執行了 int8 kernel，算出來的卻是雜訊。封裝檔只在
#   ``AOTI_RUNTIME_CHECK_INPUTS=1`` 時檢查輸入的形狀。
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
#          # q/dq 模型保留它匯出時的上限（<= 4）：從 float 模型重新開始
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
#          print(f"{wider_arena:,} bytes")
#          assert wider_arena > 1.9 * arena["dynamic 1..4"], "約兩倍：依 8 規劃"
#
# 2. 對批次 3 執行 ``operators_run`` ，這是建置與檢查 ``.pte`` 時都沒用過的大小。預測 int8
#    運算子。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          three = operators_run(program.buffer, [clips(3)])
#          assert three.int8 == operators_run(program.buffer, [clips(1)]).int8, "一樣"
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
# 上限處的錯誤，以及 ExecuTorch 使用者最常回報的錯誤，都在
# :ref:`疑難排解：ExecuTorch 與 XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`。
