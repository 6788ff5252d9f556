"""
疑難排解：匯入與匯出
=======================

量化開始之前就會遇到的錯誤與不報錯的意外：從 ``torch.ao`` 搬到 torchao 的匯入、只為一種批次大小
匯出的圖，以及 non-strict 匯出（``torch.export`` 的預設）沒有記進圖裡的東西；還有流程的另一端：
存下的量化程式檔，在新的行程裡載入不了。每個條目的標題是錯誤訊息的第一行原文（或讀者口中的
症狀），在本站的環境（torch 2.13、torchao 0.18）上重現它，指出原因，以 assert 驗證修正方法，
並連到解釋它的那一課。

**先備知識**：無；每個條目都連到解釋它的那一課。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``expect_error`` 執行一段必定失敗的程式，印出錯誤的型別與第一行訊息；哪天錯誤不再發生，
# 這一頁就會建置失敗。

import builtins
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet, x86_quantizer
from common.viz import draw

quiet()

x = example_inputs(8)


def in_fresh_python(source: str) -> None:
    """在新的 Python 行程裡執行 ``source``；它的錯誤在這裡重新引發（附上它的 stderr）。"""
    child = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True)
    if child.returncode:
        name, _, message = child.stderr.strip().splitlines()[-1].partition(": ")
        error = getattr(builtins, name)(message)
        error.stderr = child.stderr
        raise error


# %%
# ModuleNotFoundError: No module named \'torch.ao.quantization.quantize_pt2e\'
# ----------------------------------------------------------------------------
# 舊的程式碼與教學從 ``torch.ao`` 匯入 PT2E 的函式。它們已經搬到 torchao，torch 2.13
# 不再有這個模組。

with expect_error(ModuleNotFoundError, match="torch.ao.quantization.quantize_pt2e"):
    importlib.import_module("torch.ao.quantization.quantize_pt2e")

# %%
# **修正**：從 torchao 匯入（``torchao.quantization.pt2e`` 沒有重新匯出它們，要從
# ``quantize_pt2e`` 模組匯入）。同樣的流程就能執行。說明見
# :ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`。

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
calibrate(prepared)
assert op_counts(convert_pt2e(prepared))["quantize_per_tensor.default"] > 0, (
    "torchao 的 prepare／convert 量化了 conv"
)

# %%
# ModuleNotFoundError: No module named \'torch.ao.quantization.quantizer\'
# ------------------------------------------------------------------------
# quantizer 也搬家了：``torch.ao.quantization.quantizer.x86_inductor_quantizer`` 已經不存在。
# 若舊程式碼還找得到 ``torch.ao`` 的 quantizer（另一個環境裡較舊的 torch），就會混用兩套 PT2E
# 類別；torchao 的 ``prepare_pt2e`` 只認得自己的。

with expect_error(ModuleNotFoundError, match="torch.ao.quantization.quantizer"):
    importlib.import_module("torch.ao.quantization.quantizer.x86_inductor_quantizer")

# %%
# **修正**：quantizer、它的 config、每個 spec 與 observer 全部從 torchao 取得（torchao 的
# spec 裡放 ``torch.ao`` 的 observer，什麼都不會量化，見
# :ref:`疑難排解：prepare 與 convert
# <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`）。
# 說明見 :ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`。

from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
assert type(quantizer).__module__.startswith("torchao."), "quantizer 來自 torchao"

# %%
# AssertionError: Guard failed: x.size()[0] == 8
# ----------------------------------------------
# 圖以批次大小 8 匯出（或校準），之後卻用 4 呼叫。``torch.export`` 會把沒有宣告為動態的
# 每個維度固定下來，``.module()`` 最前面的 ``_guards_fn`` node 在任何運算之前先檢查輸入：
# 匯出的圖如此，這裡 ``calibrate`` 餵資料的 prepare 後的圖也一樣。訊息裡的數字就是範例的
# 批次大小，不論是多少：``== 1`` 、``== 32`` ……

fixed = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
calibrate(fixed)
with expect_error(AssertionError, match="Guard failed: x.size()[0] == 8"):
    fixed(*example_inputs(4))
single = export_module(get_model("small_cnn"), example_inputs(1))
with expect_error(AssertionError, match="Guard failed: x.size()[0] == 1"):
    single(*x)

# %%
# **修正**：匯出時把批次維度宣告為動態；之後校準與每次呼叫都可以用任何批次大小。說明見
# :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。

batch = torch.export.Dim("batch")
program = torch.export.export(get_model("small_cnn"), x, dynamic_shapes=({0: batch},))
dynamic = prepare_pt2e(program.module(), x86_quantizer())
calibrate(dynamic)
converted = convert_pt2e(dynamic)
assert converted(*example_inputs(4)).shape == (4, 10), "以 8 校準後，批次 4 也能執行"

# %%
# torch._dynamo.exc.UserError: Constraints violated (batch)!
# ----------------------------------------------------------
# 批次維度照上一個條目的建議宣告為動態，交給 ``torch.export`` 的範例批次卻是 1。訊息接著說：
# 「You marked batch as dynamic but your code specialized it to be a constant (1).」

with expect_error(torch._dynamo.exc.UserError, match="Constraints violated (batch)!"):
    torch.export.export(get_model("small_cnn"), example_inputs(1), dynamic_shapes=({0: batch},))

# %%
# **原因**：export 會把大小為 0 或 1 的維度固定下來（大小為 1 的維度會被廣播，為它追蹤出的圖
# 不一定適用於其他大小）；宣告為動態、卻被固定下來的維度，就違反了限制。
#
# **修正**：用至少 2 的範例批次匯出；匯出的程式可以接受任何批次大小，包括 1
# （ ``common.data.export_digits_model`` 就是因此用 2 張影像匯出）。動態維度的說明見
# :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。

program = torch.export.export(
    get_model("small_cnn"), example_inputs(2), dynamic_shapes=({0: batch},)
)
assert program.module()(*example_inputs(1)).shape == (1, 10), "以 2 匯出後，批次 1 也能執行"

# %%
# AssertionError: Guard failed: x.size()[0] <= 4
# ----------------------------------------------
# 批次以動態維度匯出，並設了上限 ``Dim("batch", max=4)`` ，之後卻用批次 8 呼叫模型。同一個
# ``_guards_fn`` 會檢查範圍：超過上限時是 ``<= 4`` ，低於下限 2 時是 ``>= 2`` 。訊息裡的數字
# 是上下限，不是範例的大小。

bounded = torch.export.export(
    get_model("small_cnn"), example_inputs(2), dynamic_shapes=({0: Dim("batch", max=4)},)
)
bounded_model = prepare_pt2e(bounded.module(), x86_quantizer())
bounded_model(*example_inputs(2))  # 用一個批次（2 張影像）校準
bounded_model = convert_pt2e(bounded_model)
with expect_error(AssertionError, match="Guard failed: x.size()[0] <= 4"):
    bounded_model(*x)

# %%
# **原因**：上下限是程式的一部分（它的 ``range_constraints`` ），由它產生的每個目標都保留它：
# q/dq 模型丟出這個錯誤，``.pte`` 以 ``method->set_inputs() ... failed with error 0x10`` 拒收
# 輸入（m99_5），邊緣裝置上的記憶體也依上限規劃。
#
# **修正**：依部署需要的上限匯出（在 ``.pte`` 上它要付出記憶體），或把較大的批次切成不超過
# 上限的幾份。有上限的批次走過每個目標的過程見
# :ref:`M06-4 · 會變的形狀 <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`。

wider = torch.export.export(
    get_model("small_cnn"), example_inputs(2), dynamic_shapes=({0: Dim("batch", max=8)},)
)
wider_model = prepare_pt2e(wider.module(), x86_quantizer())
wider_model(*example_inputs(2))  # 用一個批次（2 張影像）校準
wider_model = convert_pt2e(wider_model)
assert wider_model(*x).shape == (8, 10), "上限為 8 時，批次 8 可以執行"

# %%
# KeyError: \'source_fn_stack\'
# -----------------------------
# 讀取 ``node.meta["source_fn_stack"]`` 的程式碼（較舊的 quantizer、模式比對、
# ``get_source_partitions`` ）什麼都找不到：``torch.export.export`` 預設以 **non-strict**
# 方式追蹤（``strict=False`` ），而它不記錄 ``source_fn_stack`` 。

nonstrict = torch.export.export(get_model("conv_relu"), x).module()
(conv,) = nonstrict.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default)
with expect_error(KeyError, match="source_fn_stack"):
    conv.meta["source_fn_stack"]

# %%
# **修正**：改讀兩種模式都會記錄的 ``nn_module_stack`` （每個 node 的模組路徑與類別），
# 或在程式碼需要 ``source_fn_stack`` 時以 ``strict=True`` 匯出。說明見
# :ref:`M00-2 · 拆解一個 node <sphx_glr_lessons_m00_graphs_m00_2_node_anatomy.py>`。

print("nn_module_stack:", list(conv.meta["nn_module_stack"].values())[-1])
strict = torch.export.export(get_model("conv_relu"), x, strict=True).module()
(strict_conv,) = strict.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default)
print("strict source_fn_stack:", strict_conv.meta["source_fn_stack"][-1])
assert strict_conv.meta["source_fn_stack"][-1][1] is nn.Conv2d


# %%
# 什麼都沒有被量化（模型呼叫 ``F.conv2d`` ）
# ----------------------------------------------
# 模型用自己的 weight 呼叫 ``F.conv2d`` ，而不是用 ``nn.Conv2d`` ：``convert_pt2e`` 之後
# 一個 quantize node 都沒有，也沒有任何錯誤。``X86InductorQuantizer`` 靠產生 conv 的模組或
# ``source_fn_stack`` 找到 conv；在 non-strict 匯出下，函式呼叫兩者都沒有。


class FunctionalConv(nn.Module):
    def __init__(self):
        super().__init__()
        seeded = torch.Generator().manual_seed(0)  # 不論之前執行過什麼，weight 都一樣
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3, generator=seeded) / 10)
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        return F.relu(F.conv2d(x, self.weight, self.bias, padding=1))


def quantized(program) -> torch.fx.GraphModule:
    model = prepare_pt2e(program.module(), x86_quantizer())
    calibrate(model)
    return convert_pt2e(model)


silent = quantized(torch.export.export(FunctionalConv(), x))
quantize_count = op_counts(silent)["quantize_per_tensor.default"]
print(f"non-strict 匯出之後的 quantize node 數：{quantize_count}")
assert quantize_count == 0, "什麼都沒量化，也沒有引發任何錯誤"

# %%
# **修正**：以 ``strict=True`` 匯出（它會記錄 ``source_fn_stack`` ），或改用 ``nn.Conv2d`` 。
# 下圖是 convert 後的圖：conv 現在讀的是 dequantize 後的輸入與 weight。說明見
# :ref:`M02-1 · quantizer 在圖上寫了什麼
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`。

fixed_conv = quantized(torch.export.export(FunctionalConv(), x, strict=True))
qdq = [n.name for n in fixed_conv.graph.nodes if "quantize_per" in str(n.target)]
draw(fixed_conv, highlight=qdq, title="strict=True：F.conv2d 有了 quantize／dequantize node")
assert op_counts(fixed_conv)["quantize_per_tensor.default"] > 0, (
    "strict export：函式形式的 conv 被量化了"
)

# %%
# RuntimeError: We ran into an error when deserializing the saved file.
# ---------------------------------------------------------------------
# 一個 convert 後的模型匯出、用 ``torch.export.save`` 存成程式檔，再到另一個行程裡用
# ``torch.export.load`` 載入——例如伺服器，或重新啟動的筆記本——而這個行程匯入了 torch，
# 卻沒有匯入 torchao（這行訊息接著說「Please check the warnings above for possible
# errors.」）。這個問題在 torch 2.3 上回報時是 ``TypeError: import_nn_module_stack() takes 3
# positional arguments but 4 were given``
# （`pytorch/pytorch#126063 <https://github.com/pytorch/pytorch/issues/126063>`_ ）；那個錯誤
# 已經修好，在 torch 2.13 上剩下的就是這個錯誤。

folder = Path(tempfile.mkdtemp())
saved = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
calibrate(saved)
saved = convert_pt2e(saved)
torch.export.save(torch.export.export(saved, x), folder / "int8.pt2")
torch.save(x, folder / "x.pt")
LOAD = f"""
import torch
program = torch.export.load({str(folder / "int8.pt2")!r})
torch.save(program.module()(*torch.load({str(folder / "x.pt")!r})), {str(folder / "y.pt")!r})
"""
with expect_error(RuntimeError, match="error when deserializing the saved file") as caught:
    in_fresh_python(LOAD)

# %%
# **原因**：錯誤之前的警告（torch 把它們記錄在子行程的 stderr）指出第一個無法解析的運算子。
# 程式檔裡的 quantize 與 dequantize node 呼叫的是 ``quantized_decomposed`` 命名空間的運算子，
# 它們在匯入 torchao 時才會註冊；只有 ``import torch`` 不會註冊它們。

(cause,) = {
    line.split("SerializeError: ")[1].split(". ")[0]
    for line in caught.error.stderr.splitlines()
    if "SerializeError: We failed to resolve" in line
}
print(cause)
assert "torch.ops.quantized_decomposed." in cause, "quantize 運算子沒有註冊"

# %%
# **修正**：在 ``torch.export.load`` 之前匯入 torchao（ ``import torchao.quantization.pt2e``
# 會註冊這些運算子）。載入的程式檔於是算出與 convert 後的模型完全相同的輸出。程式檔的儲存與
# 載入，說明見
# :ref:`M03-4 · 部署 int8 模型 <sphx_glr_lessons_m03_lowering_m03_4_shipping.py>`。

in_fresh_python("import torchao.quantization.pt2e\n" + LOAD)
loaded_output = torch.load(folder / "y.pt")
assert torch.equal(loaded_output, saved(*x)), "載入的程式檔算出的正是存檔時的結果"

# %%
# 下一頁
# ------
# :ref:`疑難排解：prepare 與 convert
# <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`。
