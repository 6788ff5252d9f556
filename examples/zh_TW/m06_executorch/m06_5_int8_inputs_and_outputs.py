"""
M06-5 int8 進，int8 出
======================

量化過的 ``.pte`` 仍然吃浮點數、吐浮點數：它的第一個運算把輸入 quantize，最後一個運算把輸出
dequantize。感測器給的是整數的微控制器，或手上已經是 int8 的攝影機影像處理流程，兩個都不需要。
ExecuTorch 的 ``quantize_input`` 與 ``quantize_output`` 移除這兩個運算，並傳回呼叫端從此要自己
套用的 scale 與 zero point。本課做出這樣的 ``.pte`` （ **int8 I/O** ），執行它，並重現使用者
回報的錯誤：把 int8 輸出當成數值來讀、餵它浮點數、餵它沒有套用輸入 scale 的 int8。

**你會學到**

- ``quantize_input`` ／ ``quantize_output`` 如何讓程式的輸入與輸出成為 int8，以及為什麼它們
  要在 partitioner 之前執行
- 如何餵入與讀取 int8 的 ``.pte`` ：用輸入的 scale 與 zero point 做 quantize，用輸出的做
  dequantize
- 錯誤的讀法在執行環境上是什麼樣子，以及修正每一種錯誤的那一行程式碼

**先備知識**：
:ref:`M01-2 · q/dq node 和裡面的數字
<sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`、
:ref:`M06-3 · 由內而外看 .pte <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# ``small_cnn`` （conv、BatchNorm、ReLU、max-pool，再接一層輸出 10 個類別的 linear，輸入
# 3 × 16 × 16 的影像），用 ``XNNPACKQuantizer`` 量化（靜態 int8 活化值），並用四批資料校準。

import contextlib
import io

import torch

from common.expect import expect_error
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.passes.quantize_io_pass import QuantizeInputs, quantize_input, quantize_output
from executorch.exir.scalar_type import ScalarType
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import xnnpack_quantizer
from common.runtime import operators_run

qd = torch.ops.quantized_decomposed
BATCH, SHAPE = 2, input_shape("small_cnn")
x = example_inputs(BATCH, shape=SHAPE)
prepared = prepare_pt2e(export_module(get_model("small_cnn"), x), xnnpack_quantizer())
with torch.no_grad():
    for seed in range(4):
        prepared(*example_inputs(BATCH, seed=seed, shape=SHAPE))
qdq_model = convert_pt2e(prepared)

# %%
# 兩個輔助函式： ``loaded`` 在 ExecuTorch 執行環境上載入 ``.pte`` ，傳回 ``Program`` 與它的
# ``forward`` （兩個都要留著：方法不會讓它的程式保持存活，M06-3）； ``io_types`` 從方法的
# ``MethodMeta`` 讀出輸入與輸出的資料型別，用的是執行環境的名稱（ ``Float`` 是 float32，
# ``Char`` 是 int8）。


def loaded(pte: bytes):
    with contextlib.redirect_stderr(io.StringIO()):  # 執行環境的 CPU 資訊紀錄（M06-3）
        program = Runtime.get().load_program(pte)
        return program, program.load_method("forward")


def io_types(program) -> tuple[str, str]:
    meta = program.metadata("forward")
    types = (meta.input_tensor_meta(0).dtype(), meta.output_tensor_meta(0).dtype())
    return tuple(ScalarType(t).name.capitalize() for t in types)


# %%
# 步驟 1 — 量化程式的浮點數邊緣
# -----------------------------
# 像每次下放的開頭一樣，把 convert 後的模型再匯出一次。影像 ``x`` 只有一個使用者：帶著輸入的
# scale 與 zero point 的 ``quantize_per_tensor`` ；程式傳回的是帶著輸出的 scale 與 zero point 的
# ``dequantize_per_tensor`` （圖中標示的兩個 node）。兩者之間全部以 int8 執行；這兩個運算就是
# 浮點數的邊緣。

program = torch.export.export(qdq_model, x)
graph = program.graph_module.graph
image = next(n for n in graph.nodes if n.op == "placeholder" and n.name == "x")
q_in, dq_out = next(iter(image.users)), graph.output_node().args[0][0]
print(f"輸入：{q_in.name}{tuple(q_in.args[1:])}")
print(f"輸出：{dq_out.name}{tuple(dq_out.args[1:])}")
assert q_in.target == qd.quantize_per_tensor.default, "影像最先被 quantize"
assert dq_out.target == qd.dequantize_per_tensor.default, "輸出最後被 dequantize"
draw(program.graph_module, highlight=[q_in.name, dq_out.name], title="small_cnn：浮點數邊緣")

# %%
# 照原樣下放（M06-2、M06-3），這個程式會產生 **浮點數 I/O** 的 ``.pte`` ：本課其餘部分的參考
# 答案。 ``XnnpackPartitioner`` 接手整張圖，連兩個浮點數邊緣也在內：剩下的頂層圖把 ``x`` 直接
# 送進一次 delegate 呼叫。ExecuTorch 的 ``QuantizeInputs`` pass 在這張頂層圖裡找輸入的
# quantize，找到的卻是 delegate：下放之後才做，已經太遲了。

edge = to_edge_transform_and_lower(
    torch.export.export(qdq_model, x), partitioner=[XnnpackPartitioner()]
)
with expect_error(Exception, match="'QuantizeInputs' pass") as caught:
    edge.transform([QuantizeInputs(edge, [0])])
print(f"  起因是 {type(caught.error.__cause__).__name__}: {caught.error.__cause__}")
assert "executorch_call_delegate" in str(caught.error.__cause__), "q 在 delegate 裡面"
float_pte = edge.to_executorch().buffer

# %%
# 步驟 2 — 在下放之前移除它們
# ---------------------------
# ``quantize_input(program, 0)`` 與 ``quantize_output(program, 0)`` 是 ``QuantizeInputs`` 與
# ``QuantizeOutputs`` 這兩個 pass 呼叫的函式，它們也接受匯出的程式，在任何 partitioner 之前
# 就能用。兩者都直接修改圖，並傳回被移除的運算的引數：
# ``(scale, zero_point, quant_min, quant_max, dtype)`` ，也就是呼叫端自己接手那個運算所需要
# 的東西。兩者執行之後，quantize 與 dequantize 都不見了：現在是 int8 輸入的 ``x`` 直接送進
# 第一個 dequantize，程式傳回的是最後一個 quantize 的 int8（圖中標示的兩個 node）。

input_qparams = quantize_input(program, 0)
output_qparams = quantize_output(program, 0)
print(f"quantize_input  -> {input_qparams}\nquantize_output -> {output_qparams}")
assert input_qparams == tuple(q_in.args[1:]), "就是被移除的 quantize 自己的引數"
assert output_qparams == tuple(dq_out.args[1:]), "就是被移除的 dequantize 自己的引數"
dq_in, q_out = next(iter(image.users)), graph.output_node().args[0][0]
assert dq_in.target == qd.dequantize_per_tensor.default, "x 直接送進 dequantize"
assert q_out.target == qd.quantize_per_tensor.default, "程式傳回的是 quantize"
assert image.meta["val"].dtype == torch.int8, "x 現在是 int8 輸入"
draw(program.graph_module, highlight=[dq_in.name, q_out.name], title="small_cnn：int8 的輸入與輸出")

# %%
# 步驟 3 — 下放：int8 I/O
# -----------------------
# 修改過的程式和其他程式一樣下放。 ``.pte`` 自己的 metadata 說出它吃什麼、吐什麼：浮點數 I/O
# 的 ``.pte`` 寫 ``Float`` 的地方，這裡寫 ``Char`` （int8）。輸入現在只需要四分之一的位元組，
# 當呼叫端的緩衝區就是微控制器的 RAM 時，這很重要。

int8_pte = (
    to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
)
float_program, float_forward = loaded(float_pte)
int8_program, int8_forward = loaded(int8_pte)
input_bytes = []
for name, loaded_program in (("浮點數 I/O", float_program), ("int8 I/O", int8_program)):
    kinds = io_types(loaded_program)
    input_bytes.append(loaded_program.metadata("forward").input_tensor_meta(0).nbytes())
    print(f"{name}：輸入 {kinds[0]}（{input_bytes[-1]:,} 位元組），輸出 {kinds[1]}")
assert io_types(float_program) == ("Float", "Float"), "浮點數進，浮點數出"
assert io_types(int8_program) == ("Char", "Char"), "int8 進，int8 出"
assert input_bytes[1] * 4 == input_bytes[0], "int8 輸入：四分之一的位元組"

# %%
# 兩者執行的 int8 運算子相同；int8 I/O 的 ``.pte`` 少掉的是兩個 ``Convert (NC)`` 運算子
# （ ``operators_run`` ，M06-4）：XNNPACK 對浮點數輸入做的 quantize，與對浮點數輸出做的
# dequantize。

x_int8 = qd.quantize_per_tensor.default(x[0], *input_qparams)
ran_float, ran_int8 = operators_run(float_pte, [x[0]]), operators_run(int8_pte, [x_int8])
print(f"浮點數 I/O：\n{ran_float.summary}\n\nint8 I/O：\n{ran_int8.summary}")
assert ran_float.conversions == {"Convert (NC)": 2}, "浮點數 I/O：輸入的 q 與輸出的 dq"
assert not ran_int8.conversions, "int8 I/O：不再有任何轉換"
assert ran_int8.int8 == ran_float.int8, "兩者的 int8 運算子相同"

# %%
# 步驟 4 — 執行：quantize 進，dequantize 出
# -----------------------------------------
# 被移除的兩個運算由呼叫端來做。 ``input_qparams`` 正是 quantize 運算的引數，所以
# ``quantize_per_tensor(x, *input_qparams)`` 就是輸入（在微控制器上：
# ``q = clamp(round(x / scale) + zero_point, -128, 127)`` ），而輸出以
# ``(q − zero_point) × scale`` 變回浮點數。結果和浮點數 I/O 的 ``.pte`` 相差不超過輸出 scale
# 的 1 格。

out_int8 = int8_forward.execute([x_int8])[0]
value = qd.dequantize_per_tensor.default(out_int8, *output_qparams)
expected = float_forward.execute([x[0]])[0]
out_scale, out_zero_point = output_qparams[:2]
steps = ((value - expected).abs() / out_scale).round()
print(f"輸出 {out_int8.dtype}，和浮點數 I/O 的 .pte 最多差 {steps.max():.0f} 格")
print(f"完全相同：{torch.equal(value, expected)}")
torch.testing.assert_close(value, expected, atol=out_scale, rtol=0)  # 輸出的 1 格

# %%
# 步驟 5 — 錯誤的讀法：int8 不是數值
# ----------------------------------
# pytorch/executorch#16244 的回報：一個原本印出 2.0 的模型，輸出改成 int8 之後印出 1。int8 I/O
# 的程式傳回的是編碼，不是數值：直接當成數字讀沒有意義，要用輸出的 zero point 與 scale 才能
# 變回數值。

print(f"原始 int8：   {out_int8[0].tolist()}")
print(f"dequantize：  {[round(v, 3) for v in value[0].tolist()]}")
print(f"({out_int8[0, 0]} - {out_zero_point}) × {out_scale:.5f} = {value[0, 0]:.4f}")
assert not torch.allclose(out_int8.float(), expected, atol=1), "原始的 int8 不是數值"
assert torch.equal((out_int8.float() - out_zero_point) * out_scale, value), "(q − zp) × scale"

# %%
# 只修一半，只乘上 scale，每個數值都偏掉相同的格數：正好是 zero point。

no_zero_point = out_int8.float() * out_scale
offsets = ((no_zero_point - value) / out_scale).round().int().unique()
print(f"q × scale 偏了 {offsets.tolist()} 格（zero point 是 {out_zero_point}）")
assert offsets.tolist() == [out_zero_point], "每個位置都偏了 zero point 那麼多格"

# %%
# 步驟 6 — 餵錯輸入
# -----------------
# 把浮點數餵給 int8 的 ``.pte`` ：執行環境在執行任何東西之前就拒絕這個輸入。Python 的錯誤只說
# ``error 0x12`` （ ``InvalidArgument`` ）；原因寫在執行環境的紀錄裡。

with contextlib.redirect_stderr(io.StringIO()) as log, expect_error(RuntimeError, match="0x12"):
    int8_forward.execute([x[0]])
reason = next(line for line in log.getvalue().splitlines() if "Input 0" in line)
print(f"  執行環境的紀錄：{reason}")
assert "expected Char but was Float" in reason, "執行環境會檢查輸入的資料型別"

# %%
# 沒有套用輸入的 scale 與 zero point 的 int8 可以執行，但結果是錯的。 ``x.to(torch.int8)`` 把
# 影像截斷成 -3 到 3 的整數，模型期待的卻是 ``x / scale + zp`` ：範圍只有幾格，而不是大約
# 250 格。沒有任何東西失敗；輸出卻離正確數值很遠。

cast = x[0].to(torch.int8)
wrong = qd.dequantize_per_tensor.default(int8_forward.execute([cast])[0], *output_qparams)
wrong_steps = ((wrong - expected).abs() / out_scale).round()
print(f"轉型的輸入 {cast.min()}..{cast.max()}，quantize 的輸入 {x_int8.min()}..{x_int8.max()}")
print(f"輸出和浮點數 I/O 的 .pte 最多差 {wrong_steps.max():.0f} 格")
assert wrong_steps.max() > 10, "轉型不是 quantize：離正確數值很遠"

# %%
# 小結
# ----
# - 量化過的 ``.pte`` 在邊緣是浮點數：輸入之後一個 quantize，輸出之前一個 dequantize。
#   ``quantize_input`` ／ ``quantize_output`` 在下放「之前」把它們從匯出的程式中移除（下放之後，
#   ``QuantizeInputs`` pass 找到的是 delegate 呼叫），並傳回
#   ``(scale, zero_point, quant_min, quant_max, dtype)`` 。
# - int8 I/O 的 ``.pte`` 在 metadata 裡寫著 ``Char`` ，不執行任何 ``Convert`` ；只要呼叫端用輸入
#   的參數 quantize 輸入、用輸出的參數 dequantize 輸出，結果和浮點數 I/O 的 ``.pte`` 相差不超過
#   輸出的 1 格。
# - 它的輸出是 int8 編碼： ``(q − zero_point) × scale`` 才是數值。浮點數輸入會被拒絕
#   （ ``expected Char but was Float`` ）；用轉型取代 quantize 可以執行，但結果是錯的。
#
# 練習
# ----
# 1. 只移除輸出的 dequantize。預測程式的輸入與輸出型別，以及 XNNPACK 會執行幾個
#    ``Convert (NC)`` 。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          half = torch.export.export(qdq_model, x)
#          quantize_output(half, 0)
#          half_pte = to_edge_transform_and_lower(
#              half, partitioner=[XnnpackPartitioner()]
#          ).to_executorch().buffer
#          half_program, _ = loaded(half_pte)
#          print(io_types(half_program))
#          assert io_types(half_program) == ("Float", "Char"), "浮點數進，int8 出"
#          ran = operators_run(half_pte, [x[0]])
#          assert ran.conversions == {"Convert (NC)": 1}, "只剩輸入的 quantize"
#
# 2. C++ 的呼叫端沒辦法從 Python 拿到 scale。把這四個數字以常數方法存進 ``.pte``
#    （ ``constant_methods=`` ，名稱照 ``QuantizeInputs`` 用 ``get_config_method_name`` 取的
#    名稱）。預測 ``.pte`` 之後有哪些方法，以及 ``forward_output0_zp`` 傳回什麼。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from executorch.exir.passes.quantize_io_pass import get_config_method_name
#
#          again = torch.export.export(qdq_model, x)
#          found = {"input": quantize_input(again, 0), "output": quantize_output(again, 0)}
#          constants = {
#              get_config_method_name("forward", side, 0, key): found[side][i]
#              for side in found
#              for i, key in enumerate(["scale", "zp"])
#          }
#          kept_pte = to_edge_transform_and_lower(
#              again, partitioner=[XnnpackPartitioner()], constant_methods=constants
#          ).to_executorch().buffer
#          kept_program, _ = loaded(kept_pte)
#          print(sorted(kept_program.method_names))
#          assert kept_program.method_names == {"forward", *constants}, "forward 加上四個數字"
#          zp = kept_program.load_method("forward_output0_zp").execute([])[0]
#          assert zp == out_zero_point, "從 .pte 讀出的輸出 zero point"
#
# 3. 分類器只讀輸出最大的那個類別。預測：原始的 int8 輸出給出的類別，和 dequantize 後的相同
#    嗎？它的 softmax 給出的機率也相同嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          assert torch.equal(out_int8.argmax(1), value.argmax(1)), "scale > 0，順序不變"
#          raw_p, p = out_int8.float().softmax(1), value.softmax(1)
#          print(f"最大的機率：原始 {raw_p.max():.3f}，dequantize 後 {p.max():.3f}")
#          assert not torch.allclose(raw_p, p, atol=0.01), "softmax 需要真正的數值"
#
# 延伸閱讀
# --------
# - `ExecuTorch：執行環境的 Python API
#   <https://docs.pytorch.org/executorch/stable/runtime-python-api-reference.html>`_
# - `pytorch/executorch#4729：Add support for int8 input/output
#   <https://github.com/pytorch/executorch/issues/4729>`_ ，微控制器使用者提出、促成這兩個函式
#   的需求
#
# 下一課
# ------
# ExecuTorch 使用者最常回報的錯誤，都在
# :ref:`疑難排解：ExecuTorch 與 XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`。
