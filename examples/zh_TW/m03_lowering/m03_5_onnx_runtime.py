"""
M03-5 從 PT2E 到 ONNX Runtime
=============================

PT2E 的 int8 模型並不綁死在 PyTorch 的 kernel 上。``torch.onnx.export(..., dynamo=True)``
把 convert 後的模型寫成 **QDQ 格式** 的 ONNX 圖：每個 quantize node 變成一個
``QuantizeLinear`` ，每個 dequantize node 變成一個 ``DequantizeLinear`` ，兩者之間的浮點運算
維持原樣。接著 ONNX Runtime 做的事，就是 PyTorch 裡 lowering 做的事：載入圖的時候，把每一組
``DequantizeLinear → Conv → QuantizeLinear`` 融合成一個 int8 kernel。本課匯出 ``conv_net`` ，
在 ONNX Runtime 的 CPU provider 上執行，從它的剖析記錄（profile）讀出實際執行的 int8 kernel，
替匯出器拒絕的運算寫一份轉譯，最後拿 ONNX Runtime 和 PyTorch 編譯後的 int8 比速度。

**你會學到**

- 把 convert 後的模型匯出成 QDQ 格式的 ONNX 圖，以及 ONNX Runtime 把它融合成什麼
- 從 ONNX Runtime 的剖析記錄讀出 session 執行了哪些 kernel
- 替匯出器沒有轉譯的 q/dq 運算寫一份轉譯

**先備知識**：
:ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`
（q/dq 的每一組變成 int8 運算）、:ref:`M03-3 · 量測速度與大小
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>` （ ``race`` ）、
:ref:`M05-2 · 靜態與動態 int8 <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`
（ ``choose_qparams`` ）。本課需要 ``onnx`` 、 ``onnxscript`` 與 ``onnxruntime`` 。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 模型庫裡的 ``conv_net`` ，用 ``X86InductorQuantizer`` 的預設設定量化，以四個批次校準，和 M03-3
# 一樣。為什麼用 x86 的 quantizer 而不是 XNNPACK 的：它的量化方式正是 ONNX Runtime 的 x86 int8
# kernel 所針對的——帶 zero point 的 uint8 活化值、每個輸出通道一個 scale 的 int8 weight
# （「U8S8」）——而且本課因此用不到 ExecuTorch。XNNPACK 的對稱 int8 活化值也能用同樣的方式匯出。

import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from common.cpu import describe
from common.digest import digest
from common.expect import expect_error
from common.models import example_inputs, get_model, input_shape
from common.onnx_runtime import kernels_ran, onnx_export, runner, session
from common.pt2e import export_module, op_counts, quiet, x86_quantizer
from common.timing import race
from common.viz import draw

quiet()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

BATCH = 8
shape = input_shape("conv_net")
x = example_inputs(BATCH, shape=shape)
prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
with torch.no_grad():
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=shape))
int8_model = convert_pt2e(prepared)
folder = Path(tempfile.mkdtemp())  # 本課寫出檔案的地方
qdq = [n.name for n in int8_model.graph.nodes if "quantize_per" in str(n.target)]
draw(int8_model, highlight=qdq, title="convert 之後的 conv_net：要匯出的 q/dq 圖")

# %%
# 步驟 1 — 把 q/dq 模型匯出成 ONNX
# ---------------------------------
# ``onnx_export`` 呼叫 ``torch.onnx.export(model, args, dynamo=True)`` （從 ``torch.export``
# 出發的匯出器），並讓它的進度訊息不出現在頁面上。匯出器透過一張 ONNX 函式表（onnxscript 的
# ``torch_lib`` ）轉譯每個 ATen 運算。這張表對 PT2E 的 q/dq 運算曾經長期不完整：weight 的
# dequantize，也就是 ``dequantize_per_channel`` ，沒有對應的項目，匯出就停在那裡
# （pytorch/pytorch#143954）。microsoft/onnxscript#2389 提出補上它，這裡固定的 onnxscript
# （0.7.2）已經有了：靜態模型整個匯出成功。圖裡的每個 q/dq node 都變成一個 ONNX node，
# per-channel 的那些帶著 ``axis=0`` （每個輸出通道一個 scale）。

program = onnx_export(int8_model, x)
onnx_path = folder / "conv_net_int8.onnx"
program.save(onnx_path)
model = onnx.load(onnx_path)
ops = [node.op_type for node in model.graph.node]
print({op: ops.count(op) for op in dict.fromkeys(ops)})
counts = op_counts(int8_model)
assert ops.count("QuantizeLinear") == counts["quantize_per_tensor.default"], "每個 quantize 一個 Q"
dequantize = counts["dequantize_per_tensor.default"] + counts["dequantize_per_channel.default"]
assert ops.count("DequantizeLinear") == dequantize, "每個 dequantize 一個 DQ"

# %%
# weight 是 ONNX 檔裡的 int8 initializer，由每個輸出通道一個 scale 的 ``DequantizeLinear``
# 讀取；活化值的 scale 則是純量。

per_channel = [
    n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.attribute[0].i == 0
]
weights = {i.name: i for i in model.graph.initializer}
for node in per_channel[:2]:
    weight, scale = weights[node.input[0]], weights[node.input[1]]
    dtype = onnx.TensorProto.DataType.Name(weight.data_type)
    print(f"{node.name}：{dtype} {list(weight.dims)}，{scale.dims[0]} 個 scale，axis=0")
assert len(per_channel) == counts["dequantize_per_channel.default"] == 6, "4 個 conv、2 個 linear"

# %%
# 步驟 2 — 在 ONNX Runtime 上執行
# --------------------------------
# ``session`` 以課程的執行緒數，在 CPU provider 上開啟這個檔案。它的輸出在新的影像上和 q/dq
# 模型的輸出比較。兩者的算法不同：ONNX Runtime 把 int8 × int8 的乘積加總成 int32 再重新量化，
# q/dq 模型則對 dequantize 後的值執行浮點 conv，所以靠近捨入邊界的值可能差一格。logits 和
# q/dq 模型的差距，在有 VNNI 的 CPU 上不超過它們範圍的 int8 一格（範圍除以 255）。沒有 VNNI
# 時，ONNX Runtime 的 u8 × s8 kernel 以 16 位元加總兩兩的乘積，可能飽和（ONNX Runtime 的量化
# 指南這麼說，並建議用 ``reduce_range`` ；oneDNN 也有同樣的限制，M03-1）：那時只印出差距，
# 不做 ``assert`` 。

images = example_inputs(BATCH, seed=7, shape=shape)
onnx_int8 = runner(session(onnx_path))
with torch.no_grad():
    reference = int8_model(*images)
difference = (onnx_int8(*images) - reference).abs().max().item()
step = ((reference.max() - reference.min()) / 255).item()
print(f"最大差距 {difference:.2e}，logits 的一格 {step:.2e}")
if describe().vnni:
    assert difference <= step, "ONNX Runtime 和 q/dq 模型的差距不超過 int8 一格"
else:
    print(f"沒有 VNNI：差距 {difference / step:.2f} 格，不做 assert（16 位元的兩兩加總）")

# %%
# 執行了哪些 kernel？session 要求時（ ``SessionOptions.enable_profiling`` ），ONNX Runtime 會寫出
# 剖析記錄：一份 JSON 事件清單，每次呼叫的每個 node 一筆，記下它的 kernel（ ``op_name`` ）與
# provider。``kernels_ran`` 讀的就是它。關閉圖最佳化時，檔案照寫的樣子執行：Q 與 DQ node
# 之間是浮點的 ``Conv`` 與 ``Gemm`` ，和 q/dq 模型一樣是模擬。

as_written = kernels_ran(onnx_path, images, optimization="none")
print(dict(as_written))
assert as_written["Conv"] == 4 and "QLinearConv" not in as_written, "照寫的樣子執行浮點 conv"

# %%
# 在 ONNX Runtime 的預設層級下，建立 session 時它的 QDQ 融合會改寫圖：每一組
# ``DQ → Conv → (Relu) → Q`` 變成一個 ``QLinearConv`` （ReLU 不見了：輸出的 zero point 與截斷
# 已經做了它的事），平均池化變成 ``QLinearAveragePool`` ，第一個 linear 變成 ``QGemm`` 。它的
# 記憶體配置處理也把 int8 conv 改成通道在後（那兩個 ``Transpose`` ）。最後一個 linear 的輸出
# 維持浮點數（quantizer 沒有在它後面放 quantize），它照寫的樣子留下：對 dequantize 後的值
# 執行浮點的 ``Gemm`` 。

optimized = kernels_ran(onnx_path, images)
print(dict(optimized))
assert optimized["QLinearConv"] == 4 and "Conv" not in optimized, "四個 conv 都以 int8 執行"
assert optimized["QGemm"] == 1 and optimized["Gemm"] == 1, "一個 linear 是 int8，一個是浮點"

# %%
# 步驟 3 — 匯出器拒絕的 q/dq 運算
# --------------------------------
# 動態 int8 模型（M05-2）在執行時才計算活化值的 scale 與 zero point：它的圖裡有
# ``choose_qparams.tensor`` ，而 ``quantize_per_tensor.tensor`` 以張量接收 scale。onnxscript
# 沒有前者的轉譯，匯出就停在它上面，錯誤和 pytorch/pytorch#143954 的一樣，只是換了一個運算。
# （ ``onnx_export`` 丟出匯出器錯誤鏈最底層的那個錯誤： ``torch.onnx.export`` 把它包了起來。）

from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

dynamic_config = get_default_x86_inductor_quantization_config(is_dynamic=True)
prepared = prepare_pt2e(
    export_module(get_model("conv_net"), x), X86InductorQuantizer().set_global(dynamic_config)
)
with torch.no_grad():
    prepared(*x)  # weight 的 observer
dynamic_int8 = convert_pt2e(prepared)
print({op: n for op, n in op_counts(dynamic_int8).items() if "quantize" in op or "qparams" in op})
refused = "No ONNX function found for <OpOverload(op='quantized_decomposed.choose_qparams'"
with expect_error(torch.onnx.errors.OnnxExporterError, match=refused):
    onnx_export(dynamic_int8, x)

# %%
# ``custom_translation_table`` （自訂轉譯表）把一個 torch 運算對應到一個 Python 函式，由它用
# onnxscript 的 ``opset20`` 寫出 ONNX node。ONNX 有現成的運算：``DynamicQuantizeLinear`` 從
# 張量的最小值與最大值（範圍擴大到包含 0）算出 uint8 的 qparams，和 ``choose_qparams.tensor``
# 在 x86 quantizer 的 0…255 範圍下的算法相同。它的 scale 與 zero point 轉成 PyTorch 的圖宣告的
# 型別（float64、int64）。quantize 與 dequantize 的 tensor 版本也需要轉譯：onnxscript 的轉譯把
# zero point 當成 Python 數字讀取，而不是張量。

from onnxscript import opset20 as op
from onnxscript.ir import DataType

qd = torch.ops.quantized_decomposed


def choose_qparams(x, quant_min: int, quant_max: int, eps: float, dtype: int):
    """choose_qparams.tensor → DynamicQuantizeLinear 算出的 scale 與 zero point（uint8）。"""
    _, scale, zero_point = op.DynamicQuantizeLinear(x)
    return op.Cast(scale, to=DataType.DOUBLE), op.Cast(zero_point, to=DataType.INT64)


def quantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
    """quantize_per_tensor.tensor → QuantizeLinear，qparams 轉成 ONNX 要的型別。"""
    return op.QuantizeLinear(x, op.Cast(scale, to=DataType.FLOAT), op.Cast(zero_point, to=dtype))


def dequantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype=-1):
    """dequantize_per_tensor.tensor → DequantizeLinear."""
    scale = op.Cast(scale, to=DataType.FLOAT)
    return op.DequantizeLinear(x, scale, op.Cast(zero_point, to=dtype))


translations = {
    qd.choose_qparams.tensor: choose_qparams,
    qd.quantize_per_tensor.tensor: quantize,
    qd.dequantize_per_tensor.tensor: dequantize,
}
dynamic_path = folder / "conv_net_dynamic.onnx"
onnx_export(dynamic_int8, x, translations=translations).save(dynamic_path)
dynamic_ops = [node.op_type for node in onnx.load(dynamic_path).graph.node]
print({op: dynamic_ops.count(op) for op in dict.fromkeys(dynamic_ops)})
choose = op_counts(dynamic_int8)["choose_qparams.tensor"]
assert dynamic_ops.count("DynamicQuantizeLinear") == choose, "每個 choose_qparams 一個"

# %%
# 它能執行，算出的也和 q/dq 模型相同。但剖析記錄顯示 ONNX Runtime 把它變成了什麼：浮點
# conv。它的 QDQ 融合找的是圖裡的常數 scale 與 zero point；這裡兩者在執行時才算出來，所以
# 沒有一組被融合，動態模型以模擬的方式執行，還多了計算最小值與最大值的成本。動態 int8 在 ONNX
# Runtime 裡是另一些運算（ ``ConvInteger`` 、 ``MatMulInteger`` ，由它自己的
# ``quantize_dynamic`` 寫出），QDQ 格式的圖裡沒有它們。

with torch.no_grad():
    dynamic_reference = dynamic_int8(*images)
dynamic_out = runner(session(dynamic_path))(*images)
dynamic_difference = (dynamic_out - dynamic_reference).abs().max().item()
print(f"最大差距 {dynamic_difference:.2e}")
assert dynamic_difference <= step, "轉譯後算出的和 q/dq 模型相同"
dynamic_ran = kernels_ran(dynamic_path, images)
print(dict(dynamic_ran))
assert "QLinearConv" not in dynamic_ran and "ConvInteger" not in dynamic_ran, "沒有 int8 conv"

# %%
# 步驟 4 — ONNX Runtime 與 PyTorch 編譯後的 int8 比速度
# -------------------------------------------------------
# 同一個靜態 int8 模型，同一顆 CPU 上的兩個執行環境：``race`` 開啟 freezing 編譯 q/dq 模型
# （M03-3），再和 ONNX Runtime 的 session 在同樣交錯的回合裡、以同樣的執行緒數計時。ONNX
# Runtime 的 int8 kernel（它的 MLAS 函式庫）和 oneDNN 的，在 CPU 有 VNNI 時都會用它；沒有時，
# 兩者都用 ``vpmaddubsw`` 相乘 u8 × s8：它把兩個乘積加成 16 位元，可能飽和（ ``reduce_range`` ，
# M04-2）。這些數字屬於這顆 CPU、這時的負載：只印出來，從不 assert。

print(describe().verdict)
raced = race(
    {"PyTorch int8（編譯後）": int8_model},
    images,
    also={"ONNX Runtime int8": onnx_int8},
    also_key=digest(onnx_path, "onnxruntime"),
)
print(raced.table())

# %%
# 小結
# ----
#
# ============================  ==============================  ==========================
# q/dq 運算                     ONNX 圖裡                       ONNX Runtime 執行的
# ============================  ==============================  ==========================
# ``quantize_per_tensor``       ``QuantizeLinear``              融合成 ``QLinearConv`` 、
# ``dequantize_per_tensor``     ``DequantizeLinear``            ``QGemm`` 、
# ``dequantize_per_channel``    ``DequantizeLinear`` axis=0     ``QLinearAveragePool``
# ``choose_qparams.tensor``     被拒絕；轉譯成                  執行時算出的 Q／DQ 之間
#                               ``DynamicQuantizeLinear``       的浮點 ``Conv``
# ============================  ==============================  ==========================
#
# - ``torch.onnx.export(..., dynamo=True)`` 把靜態的 PT2E 模型寫成 QDQ 格式的圖；建立 session 時，
#   ONNX Runtime 把其中的每一組融合成 int8 kernel。
# - 剖析記錄（ ``enable_profiling`` ）說的是實際執行了什麼；檔案只說要求了什麼。
# - ``custom_translation_table`` 用幾行 onnxscript 補上匯出器缺少的運算；結果是否以 int8
#   執行，由 ONNX Runtime 決定，要從它的剖析記錄讀出來。
#
# 練習
# ----
# 1. 以 ONNX Runtime 的 ``"basic"`` 層級開啟靜態模型的 session。預測會執行哪些 kernel：QDQ
#    融合算是基本的最佳化嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          basic = kernels_ran(onnx_path, images, optimization="basic")
#          print(dict(basic))
#          # 基本最佳化只摺疊常數、移除多餘的 node；QDQ 融合屬於「extended」層級：
#          # conv 仍以浮點執行。
#          assert basic["Conv"] == 4 and "QLinearConv" not in basic
#          extended = kernels_ran(onnx_path, images, optimization="extended")
#          assert extended["QLinearConv"] == 4
#
# 2. convert 時設定 ``fold_quantize=False`` （M01-2）：weight 在圖裡維持浮點數，各自接在一個
#    ``quantize_per_channel`` 後面。預測 ONNX 檔的大小，以及 ONNX Runtime 是否仍執行 int8 conv。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          prepared = prepare_pt2e(export_module(get_model("conv_net"), x), x86_quantizer())
#          with torch.no_grad():
#              for seed in range(4):
#                  prepared(*example_inputs(BATCH, seed=seed, shape=shape))
#          unfolded_path = folder / "conv_net_unfolded.onnx"
#          onnx_export(convert_pt2e(prepared, fold_quantize=False), x).save(unfolded_path)
#          print(f"大小是原本的 {unfolded_path.stat().st_size / onnx_path.stat().st_size:.1f} 倍")
#          assert unfolded_path.stat().st_size > 3 * onnx_path.stat().st_size, "浮點 weight"
#          # session 把每個 weight 的常數 Q（加上 Clip）摺疊成 int8 常數：
#          # 執行的是同樣融合後的 kernel。
#          assert kernels_ran(unfolded_path, images) == optimized
#
# 延伸閱讀
# --------
# - `torch.onnx：以 dynamo 為基礎的匯出器與 custom_translation_table（PyTorch）
#   <https://docs.pytorch.org/docs/stable/onnx_export.html>`_
# - `ONNX Runtime：量化模型（QDQ 格式、U8S8 與 S8S8）
#   <https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html>`_
# - `ONNX Runtime：剖析工具
#   <https://onnxruntime.ai/docs/performance/tune-performance/profiling-tools.html>`_
#
# 下一課
# ------
# :ref:`M04-1 · 量測誤差 <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`：
# int8 模型還準確嗎？
