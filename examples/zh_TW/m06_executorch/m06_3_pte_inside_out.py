"""
M06-3 由內而外看 .pte
=====================

``to_executorch()`` 的終點是一個 ``.pte`` 檔：手機 app 唯一要載入的東西。本課用 ExecuTorch
自己的讀取器打開它，在它的位元組裡找回產生它的那張圖：一個只有三道指令的執行計畫、一個
portable 運算子、兩份 XNNPACK 酬載，以及 int8 的 weight。接著在 ExecuTorch 執行環境上執行
這個檔案，量測它的輸出離 q/dq 模型多遠、差距從哪裡來（用 ExecuTorch 的 devtools），以及
和浮點數、x86 int8 模型相比它有多快、多小。

**你會學到**

- ``.pte`` 裡有什麼，每個部分如何對應回圖
- 如何用 ``executorch.runtime.Runtime`` 執行它，並和 q/dq 模型比較
- 如何用 ETDump 與 Inspector 找出數值在哪裡分岔

**先備知識**：
:ref:`M06-2 · 下放到 ExecuTorch
<sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`、
:ref:`M03-3 · 量測速度與大小
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# ``conv_net`` （四層 64～128 通道的 3×3 conv，輸入 28×28 影像，平均池化到 7×7，再接兩層
# linear），用 ``XNNPACKQuantizer`` 量化，並用四批資料校準。

import contextlib
import io
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from common.cache import cached_path
from common.charts import pad, use_course_style
from common.digest import digest
from common.models import example_inputs, get_model, input_shape
from common.numerics import sqnr
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import race, timing_threads
from common.viz import draw

quiet()
use_course_style()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告（M03-3）。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.devtools import Inspector
from executorch.exir import to_edge_transform_and_lower
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import _get_extended_header
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

qd = torch.ops.quantized_decomposed
# 印出的文字與圖表怎麼稱呼計時與存檔的對象（程式碼用的是鍵）。
LABELS = {
    "fp32 compiled": "fp32，編譯＋freezing",
    "x86 compiled": "x86 int8，編譯＋freezing",
    "fp32 eager": "fp32，eager 模式",
    "pte run": "ExecuTorch XNNPACK int8",
    "fp32 saved": "fp32，torch.export.save",
    "qdq saved": "int8 q/dq，torch.export.save",
    "pte file": "int8，.pte 檔",
}
BATCH, SHAPE = 2, input_shape("conv_net")
x = example_inputs(BATCH, shape=SHAPE)
float_model = export_module(get_model("conv_net"), x)


def quantized(quantizer):
    prepared = prepare_pt2e(export_module(get_model("conv_net"), x), quantizer)
    with torch.no_grad():
        for seed in range(4):
            prepared(*example_inputs(BATCH, seed=seed, shape=SHAPE))
    return convert_pt2e(prepared)


# XNNPACK 的執行緒池和 torch 一樣，設成計時用的執行緒數量（步驟 6）。載入方法之後再重設並不
# 安全（名稱裡的 unsafe 就是這個意思）：所以最先做。
with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
    warnings.filterwarnings("ignore", message="This API is experimental")
    portable_lib._unsafe_reset_threadpool(timing_threads())

xnnpack_config = get_symmetric_quantization_config(is_per_channel=True)
qdq_model = quantized(XNNPACKQuantizer().set_global(xnnpack_config))

# %%
# ``lowered`` 做的就是 M06-2 做過的事：以 ``XnnpackPartitioner`` 呼叫
# ``to_edge_transform_and_lower`` ，再呼叫 ``to_executorch()`` 。另外它還要求一份 **ETRecord**
# （ ``generate_etrecord=True`` ），也就是步驟 5 的 devtools 拿來比較的那些圖的紀錄。下放要花
# 好幾秒，所以 ``.pte`` 與 ETRecord 存放在 ``build/cache/`` ，檔名由產生它們的所有東西組成。


def lowered(model) -> tuple[bytes, Path]:
    def lower(folder: Path) -> None:
        exported = torch.export.export(model, x)
        xnnpack = [XnnpackPartitioner()]
        edge = to_edge_transform_and_lower(exported, partitioner=xnnpack, generate_etrecord=True)
        program = edge.to_executorch()
        record = program.get_etrecord()
        record.update_representative_inputs([x])
        folder.mkdir()
        record.save(str(folder / "etrecord.bin"))
        (folder / "model.pte").write_bytes(program.buffer)

    folder = cached_path("executorch", f"m06_3-conv_net-{digest(model)}", lower)
    return (folder / "model.pte").read_bytes(), folder / "etrecord.bin"


pte_bytes, etrecord_path = lowered(qdq_model)
print(f".pte：{len(pte_bytes):,} 位元組")

# %%
# 步驟 1 — 檔案的配置
# -------------------
# ``.pte`` 是一個 FlatBuffer（ ``executorch/schema/program.fbs`` 的 ``Program`` ），後面接著
# **區段** （segment）：程式所指向的、對齊過的原始位元組範圍。FlatBuffer 前 8 個位元組之後的
# 延伸標頭，記錄每個部分從哪裡開始。ExecuTorch 的序列化程式用 ``_get_extended_header`` 與
# ``_flatbuffer_to_program`` 讀它（私有名稱：檔案格式是公開的，它的 Python 讀取器不是）。

header = _get_extended_header(pte_bytes)
program = _flatbuffer_to_program(pte_bytes[: header.program_size])
plan = program.execution_plan[0]
print(f"magic {pte_bytes[4:8]!r} / header {header.magic!r}")
print(f"{pad('FlatBuffer 程式：', 20)}位元組 0–{header.program_size:,}")
print(f"{pad('區段：', 20)}位元組 {header.segment_base_offset:,}–{len(pte_bytes):,}")
assert header.segment_base_offset + header.segment_data_size == len(pte_bytes), "沒有其他東西"
assert [p.name for p in program.execution_plan] == ["forward"], "只有一個方法：forward"

# %%
# 步驟 2 — 執行計畫
# -----------------
# ``forward`` 是一份 **值** 的清單（這個方法用到的每個張量、整數與串列），加上一條依索引
# 讀寫這些值的 **指令鏈** （chain）。指令就是 M06-2 的圖所說的：一次 delegate 呼叫、唯一的
# portable kernel、再一次 delegate 呼叫。在 q/dq 圖裡，這個 portable kernel 就是平均池化
# （標示處）：它之前的 conv 進了一個 delegate，之後的 linear 進了另一個。

for instruction in plan.chains[0].instructions:
    call = instruction.instr_args
    if type(call).__name__ == "KernelCall":
        op = plan.operators[call.op_index]
        print(f"KernelCall   {op.name}.{op.overload}  值 {call.args}")
    else:
        print(f"DelegateCall {plan.delegates[call.delegate_index].id}  值 {call.args}")
kinds = [type(i.instr_args).__name__ for i in plan.chains[0].instructions]
assert kinds == ["DelegateCall", "KernelCall", "DelegateCall"], "conv | pool | linear"
assert [(o.name, o.overload) for o in plan.operators] == [("aten::_adaptive_avg_pool2d", "out")]
pools = qdq_model.graph.find_nodes(
    op="call_function", target=torch.ops.aten.adaptive_avg_pool2d.default
)
assert len(pools) == 1, "圖中唯一的平均池化就是唯一的 portable kernel"
draw(
    qdq_model,
    highlight=[n.name for n in pools],
    title="conv_net：由 portable kernel 執行的平均池化",
)

# %%
# 方法的輸入與輸出也是值，形狀和匯出的圖相同；而 ``non_const_buffer_sizes`` 是記憶體規劃
# （M06-2）為指令之間每個張量算出的記憶體區（arena）。從第一個 delegate 傳到平均池化的張量中最大
# 的，是最後一層 conv 的浮點數輸出：2 × 128 × 28 × 28 × 4 位元組。

inputs = [plan.values[i].val.sizes for i in plan.inputs]
outputs = [plan.values[i].val.sizes for i in plan.outputs]
arena = plan.non_const_buffer_sizes[1]
print(f"輸入 {inputs}，輸出 {outputs}，規劃的記憶體區 {arena:,} 位元組")
assert inputs == [list(x[0].shape)] and outputs == [[BATCH, 10]], "匯出時的形狀"
assert arena >= BATCH * 128 * 28 * 28 * 4, "平均池化讀取的 conv 輸出放得進記憶體區"

# %%
# 步驟 3 — delegate 酬載與 weight
# -------------------------------
# 每個 delegate 是一個 id（ ``XnnpackBackend`` ）加上一個指向區段的參照：那就是酬載
# （payload），一張以 XNNPACK 自己的 FlatBuffer 寫成的圖，後端在載入方法時編譯它。weight
# 不在酬載裡：XNNPACK 把它們存成 **named data** ，也就是帶有鍵的區段，讓兩個方法或 delegate
# 可以共用同一份。

segments = [pte_bytes[header.segment_base_offset + s.offset :][: s.size] for s in program.segments]
payloads = {d.processed.index: d.id for d in plan.delegates}
named = {entry.segment_index: entry.key for entry in program.named_data}
for index, segment in enumerate(segments):
    role = payloads.get(index) or ("named data" if index in named else "常數區段")
    print(f"區段 {index:2}  {len(segment):>9,} 位元組  {role}")
assert all(segments[i][4:8] == b"XH00" for i in payloads), "XNNPACK 酬載以 XH00 開頭"

# %%
# 最大的幾筆 named data 正好是 q/dq 圖的 int8 weight（每個 weight 一個位元組）；小的是
# per-channel 的 scale 與 bias。 **常數區段** 是 portable kernel 找常數的地方，這裡是空的：沒有任何
# portable 運算讀取 weight。

weights = sorted(t.numel() for n, t in qdq_model.named_buffers() if n.startswith("_frozen"))
named_sizes = sorted(len(segments[i]) for i in named)
print(f"int8 weight {weights}\n最大的 named data {named_sizes[-len(weights) :]}")
assert named_sizes[-len(weights) :] == weights, "就是 weight，每個一位元組"
assert len(segments[program.constant_segment.segment_index]) == 0, "沒有 portable 常數"

# %%
# 步驟 4 — 在 ExecuTorch 執行環境上執行
# -------------------------------------
# ``Runtime.get().load_program(...)`` 解析檔案； ``load_method`` 讓 XNNPACK 編譯它的酬載；
# ``execute`` 執行指令鏈。方法還在執行時，要把 ``Program`` 留在變數裡： ``Method`` 不會讓它
# 存活；從沒有變數保存的 ``Program`` 載入的方法，一執行就讓整個行程當掉。
# （執行環境第一次使用時，會把它讀到的 CPU 資訊記錄到 stderr； ``redirect_stderr`` 讓這些
# 訊息不出現在頁面上。）

with contextlib.redirect_stderr(io.StringIO()):
    program = Runtime.get().load_program(pte_bytes)
    forward = program.load_method("forward")  # Method 不會讓它的 Program 存活：兩者都要留著
out = forward.execute([x[0]])[0]
expected = qdq_model(*x)
last_q = [n for n in qdq_model.graph.nodes if n.target == qd.quantize_per_tensor.default][-1]
step = last_q.args[1]  # 模型 int8 輸出的 scale
steps_off = ((out - expected).abs() / step).round()
output_sqnr = sqnr(expected, out).item()
print(f"輸出最多相差 {steps_off.max():.0f} 格，{(steps_off > 0).float().mean():.1%} 的值不同")
print(f"相對於 q/dq 模型的 SQNR：{output_sqnr:.1f} dB")

# %%
# 輸出並不 ``torch.equal`` ，也不該期待它們相等。XNNPACK 把 int8 乘 int8 精確地累加成 int32
# 的和，再用 fp32 把它 **重新量化** 成 int8：在 x86 上，它的 qs8 GEMM 與 conv kernel
# （ ``REQUANTIZATION == "FP32"`` 的樣板）把和轉成浮點數，乘上每個輸出通道一個預先算好的
# scale（輸入 scale × weight scale ÷ 輸出 scale），再捨入。q/dq 圖則先反量化，把浮點數的乘積
# 加總（順序不同，每一步都捨入到 fp32），再除以輸出 scale。兩者每一層都只捨入一次，但捨入的
# 數不完全相同：落在捨入邊界附近的值會差一格，而一層差一格，會讓下一層的和稍微移動。以兩格
# 輸出與 40 dB 為界，足以涵蓋這些差異，還留有餘裕。

assert steps_off.max() <= 2, "和 q/dq 模型的輸出最多差兩格"
assert output_sqnr > 40, "比 int8 與浮點數的差距小得多"

# %%
# 步驟 5 — 數值在哪裡分岔：ETDump 與 Inspector
# --------------------------------------------
# PyPI 上的執行環境建置時就含有 event tracer，所以能記錄 **ETDump** ：以
# ``enable_etdump=True`` 加上一塊 debug buffer 載入程式，執行一次，寫出紀錄。 ``Inspector``
# 把紀錄和 ETRecord 接在一起，在 Python 裡以相同的輸入執行紀錄下來的圖，
# ``calculate_numeric_gap`` 再把執行環境記下的每個輸出和它在圖中的對應比較。

with contextlib.redirect_stderr(io.StringIO()):
    traced = Runtime.get().load_program(pte_bytes, enable_etdump=True, debug_buffer_size=1 << 21)
    traced.load_method("forward").execute([x[0]])
dump, buffer = [Path(tempfile.mkdtemp()) / name for name in ("run.etdp", "run.bin")]
traced.write_etdump_result_to_file(str(dump), str(buffer))
with warnings.catch_warnings():
    # Inspector 自己的提示：它不記錄的 kwargs、從位元組讀出的張量。
    warnings.filterwarnings("ignore", message="Unsupported kwarg encountered")
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    inspector = Inspector(
        etdump_path=str(dump), etrecord=str(etrecord_path), debug_buffer_path=str(buffer)
    )
    gaps = inspector.calculate_numeric_gap("SNR")
for _, row in gaps.iterrows():
    print(f"{' + '.join(row['runtime_ops']):52} SNR {row['gap'][0]:5.1f} dB")

# %%
# 執行環境每次 delegate 呼叫只記錄一個輸出，而不是每一層：在 delegate 裡面，XNNPACK 執行
# 它自己的圖，event tracer 只看得到出來的結果。所以 Inspector 告訴我們的是差距來自「哪一個
# delegate」。這裡差距產生在第一個，也就是四層 conv；接著平均池化把 128 × 28 × 28 特徵圖上
# 一格的差異平均掉，最後一列的 SNR 就是最終輸出的 SNR。

first, last = gaps["gap"].iloc[0][0], gaps["gap"].iloc[-1][0]
assert list(gaps["runtime_ops"].iloc[0]) == ["DELEGATE_CALL"], "第一列：conv 的 delegate"
assert abs(last - output_sqnr) < 0.5, "最後一列是輸出相對於 q/dq 模型的差距"

# %%
# 步驟 6 — 速度
# -------------
# 在這顆 CPU 上以四種方式執行浮點數或 int8，用單一執行緒、交錯輪流計時（XNNPACK 的執行緒池
# 也設成相同的數量）：浮點數與 x86 int8 模型，兩者都由 ``race`` 加上 freezing 編譯（M03-3）；eager
# 模式的浮點數；以及在 ExecuTorch 執行環境上的 ``.pte`` 。同類相比：編譯的兩個一組，eager 模式
# 的浮點數和直接執行 XNNPACK kernel 的執行環境一組。XNNPACK 最先是為 ARM 寫的；在 x86 上它依
# CPU 自己挑選 AVX2 或 AVX-512 的 kernel，不理會 ``ONEDNN_MAX_CPU_ISA`` 與
# ``ATEN_CPU_CAPABILITY`` ：表格下方的 CPU 那一行（oneDNN 的 int8 路徑）說明的是編譯的那兩列，
# 不是 XNNPACK。

x86_model = quantized(x86_quantizer())
timings = race(
    {LABELS["fp32 compiled"]: float_model, LABELS["x86 compiled"]: x86_model},
    x,
    also={
        LABELS["fp32 eager"]: float_model,
        LABELS["pte run"]: lambda image: forward.execute([image])[0],
    },
    also_key=digest(pte_bytes),
)
print(timings.table())
ran = timings.kernels[LABELS["x86 compiled"]]
assert ran.int8 and not ran.float, "編譯後的 x86 int8 模型只執行 oneDNN 的 int8 kernel"

# %%
# 步驟 7 — 大小
# -------------
# 浮點數程式與 q/dq 程式（int8 weight，和 M03-3 相同）的 ``torch.export.save`` ，以及
# ``.pte`` ：三者的大小都由 weight 決定。


def saved_bytes(model) -> int:
    buffer = io.BytesIO()
    lean = torch.fx.GraphModule(model, model.graph)  # 只留圖會讀的東西（M03-3）
    torch.export.save(torch.export.export(lean, x), buffer)
    return buffer.getbuffer().nbytes


sizes = {
    "fp32 saved": saved_bytes(float_model),
    "qdq saved": saved_bytes(qdq_model),
    "pte file": len(pte_bytes),
}
fig, ax = plt.subplots(figsize=(6.4, 2.4))
ax.barh(
    [LABELS[k] for k in sizes],
    [s / 1e3 for s in sizes.values()],
    color=["#94a3b8", "#2563eb", "#16a34a"],
)
ax.invert_yaxis()
ax.set_xlabel("kB")
ax.set_title("conv_net 存檔大小")
fig.tight_layout()
for key, size in sizes.items():
    print(f"{pad(LABELS[key], 30)} {size / 1e3:8.0f} kB")
assert sizes["pte file"] < 0.3 * sizes["fp32 saved"], "四分之一，再加上 scale"

# %%
# 小結
# ----
# - ``.pte`` 是一個 FlatBuffer 程式（執行計畫、運算子、delegate）加上區段：XNNPACK 酬載，
#   以及存成 named data 的 weight，每個 int8 weight 一個位元組。
# - ``Runtime`` 在 Python 裡執行它；它的輸出和 q/dq 模型相差不超過兩格：XNNPACK 以
#   int32 加總、以 fp32 重新量化，q/dq 圖則以 fp32 加總。
# - ETDump 與 Inspector 以每次 delegate 呼叫為單位找出數值差距，看不到 delegate 內部。
#
# 練習
# ----
# 1. 這個方法的記憶體區需要多少位元組（ ``plan.non_const_buffer_sizes[1]`` ：索引 0 保留不用，
#    規劃好的張量都在緩衝區 1），又是哪一個張量決定的？先從三道指令預測哪些浮點張量必須同時
#    存在；再到 ``plan.values`` 裡找出位移加大小最大的那個規劃好的張量。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          import math
#
#          from executorch.exir.scalar_type import ScalarType
#
#          planned = {
#              index: value.val
#              for index, value in enumerate(plan.values)
#              if getattr(value.val, "allocation_info", None) is not None
#          }
#          assert all(t.scalar_type == ScalarType.FLOAT for t in planned.values()), "只有 float32"
#          offset = {index: t.allocation_info.memory_offset_low for index, t in planned.items()}
#          end = {index: offset[index] + 4 * math.prod(t.sizes) for index, t in planned.items()}
#          for index, t in planned.items():
#              print(f"值 {index}：{t.sizes}，位移 {offset[index]:,}，結尾 {end[index]:,}")
#          last = max(end, key=end.get)
#          pool = plan.chains[0].instructions[1].instr_args  # 兩個 delegate 之間的 KernelCall
#          arena = plan.non_const_buffer_sizes[1]
#          print(f"最大的結尾 {end[last]:,} 位元組，記憶體區 {arena:,} 位元組")
#          assert last == pool.args[-1], "平均池化的輸出，放在它讀取的 conv 輸出後面"
#          assert end[last] == 4 * BATCH * 128 * (28 * 28 + 7 * 7), "兩張浮點特徵圖並排"
#          assert arena == end[last] + 64, "再加上記憶體規劃為 XNNPACK 多留的 64 位元組"
#          # 第一個 delegate 執行完，影像就用不到了：平均池化的輸出沿用它的位元組。
#          assert offset[pool.args[-1]] == offset[plan.inputs[0]], "就在影像原本的位置"
#
# 2. 預測 int8 weight 佔 ``.pte`` 的多少比例。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          share = sum(weights) / len(pte_bytes)
#          print(f"{share:.1%}")
#          assert share > 0.95, "其餘只是幾 kB 的程式、酬載、scale 與 bias"
#
# 3. 用一批三張影像執行 ``forward`` 。預測：執行環境會接受嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#
#          with expect_error(RuntimeError), contextlib.redirect_stderr(io.StringIO()):
#              forward.execute([example_inputs(3, shape=SHAPE)[0]])
#          # 形狀在匯出時就固定了，記憶體區也是照它們規劃的：要接受其他批次大小，
#          # 匯出時請加上 dynamic_shapes。
#
# 延伸閱讀
# --------
# - `ExecuTorch：執行環境的 Python API
#   <https://docs.pytorch.org/executorch/stable/runtime-python-api-reference.html>`_
# - `ExecuTorch：Inspector 的 API
#   <https://docs.pytorch.org/executorch/stable/model-inspector.html>`_
#
# 下一課
# ------
# :ref:`M06-4 · 會變的形狀 <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>` 讓批次
# 大小在一個上限內變動，並跟著這個上限走到 ``.pte`` 。至於浮點數與 int8 之間的準確度差距，請見
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>` 。
