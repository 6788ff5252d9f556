"""
疑難排解：遷移對照表，torch.ao → torchao → ExecuTorch
=====================================================

PT2E 量化起初放在 ``torch.ao.quantization`` ，後來搬到 torchao，邊緣裝置用的 quantizer 又再搬到
ExecuTorch。教學、問答與舊程式碼仍然從舊位置匯入。這一頁就是對照表：讀者會遇到的每個 API，列出
舊的匯入、它在本站環境（torch 2.13、torchao 0.18、executorch 1.5.1）上的行為，以及新的匯入。兩者
都實際執行：下面的對照表逐列執行，每個條目重現舊匯入的錯誤（或不報錯的陷阱），以 assert 驗證新的
匯入確實可用，並連到使用它的那一課。大多數舊匯入會直接失敗；有三個仍然匯入得了，做的卻是別的事，
這更糟。最後一個條目是用舊的 eager API 量化的模型，匯出時會被拒絕。

**先備知識**：無；每個條目都連到解釋它的那一課。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``common.migration`` 保存對照表的每一列（ ``MOVES`` ）：API、舊的匯入、舊匯入在這裡的行為
# （ ``""`` 表示仍然匯入得了）、新的匯入，以及對應的課。課程的測試也執行同樣的這些列。
# ``old_import`` 執行某一列的舊匯入，印出它和結果（ ``ImportError`` 訊息結尾的檔案路徑會拿掉，
# 因為每個安裝環境都不同）。

import copy
import dataclasses
import logging
import warnings
from importlib import metadata

import torch
from torch import nn

from common.migration import MOVES, attempt, move
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet
from common.viz import draw

quiet()

x = example_inputs(8)
qd = torch.ops.quantized_decomposed


def old_import(api: str) -> str:
    """執行 ``api`` 那一列的舊匯入，印出它與結果；回傳錯誤。"""
    statement = move(api).old
    _, error = attempt(statement)
    print(f"{statement}\n  → {error or '可以匯入'}")
    return error


# %%
# 對照表
# ------
# 每一列都在這裡執行：先是舊的匯入，再是新的匯入，各自接著結果（「可以匯入」或錯誤的第一行）。
# 下面的條目逐一說明。

for row in MOVES:
    _, old = attempt(row.old)
    _, new = attempt(row.new)
    print(f"{row.api}\n  舊：{row.old}\n    → {old or '可以匯入'}")
    print(f"  新：{row.new}\n    → {new or '可以匯入'}\n")
    assert old == row.old_result and new == "", f"{row.api}：和對照表寫的不同"

# %%
# export_for_training 與 capture_pre_autograd_graph
# -------------------------------------------------
# 2023–2025 年的 PT2E 教學先用 ``torch._export.capture_pre_autograd_graph`` 取得計算圖，後來改用
# ``torch.export.export_for_training`` 。torch 2.13 兩個都沒有。

error = old_import("export_for_training")
assert error == "ImportError: cannot import name 'export_for_training' from 'torch.export'"
error = old_import("capture_pre_autograd_graph")
assert error == "ImportError: cannot import name 'capture_pre_autograd_graph' from 'torch._export'"

# %%
# **修正**：用 ``torch.export.export`` ；它的 ``.module()`` 就是 ``prepare_pt2e`` 接受的圖，
# 算出的結果和模型相同。說明見
# :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。

from torch.export import export

model = get_model("small_cnn")
graph = export(model, x).module()
assert torch.equal(graph(*x), model(*x)), "匯出的圖算出模型的輸出"

# %%
# X86InductorQuantizer
# --------------------
# ``torch.ao.quantization.quantizer`` 底下的每個 quantizer 都隨著套件一起搬走了：

error = old_import("X86InductorQuantizer")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"

# %%
# **修正**：torchao 裡有同樣的名稱，位置多了一層 ``pt2e`` 。說明見
# :ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`。

from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

config = get_default_x86_inductor_quantization_config()
quantizer = X86InductorQuantizer().set_global(config)
assert type(quantizer).__module__.startswith("torchao."), "torchao 的 quantizer"

# %%
# prepare_pt2e、convert_pt2e 與 prepare_qat_pt2e
# ----------------------------------------------
# 這三個入口函式原本在 ``torch.ao.quantization.quantize_pt2e`` ，torch 2.13 已經沒有這個模組。

error = old_import("prepare_pt2e, convert_pt2e, prepare_qat_pt2e")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantize_pt2e'"

# %%
# **修正**：從 ``torchao.quantization.pt2e.quantize_pt2e`` 模組匯入；上一層的套件
# ``torchao.quantization.pt2e`` 沒有重新匯出它們（較短的路徑會得到 ``ImportError`` ）。搭配上一個
# 條目的 quantizer，整個流程就會量化。說明見 :ref:`M01-1 · PT2E 全流程
# <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`。

import torchao.quantization.pt2e
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

assert not hasattr(torchao.quantization.pt2e, "prepare_pt2e"), "套件本身沒有它"
prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), quantizer)
calibrate(prepared)
converted = convert_pt2e(prepared)
quantize_count = op_counts(converted)["quantize_per_tensor.default"]
print(f"convert_pt2e 之後的 quantize node 數：{quantize_count}")
assert quantize_count > 0, "torchao 的 prepare 與 convert 確實量化"

# %%
# QuantizationSpec、QuantizationAnnotation 與 Quantizer
# -----------------------------------------------------
# 為 ``torch.ao`` 寫的 quantizer（M02-4 那一類）從 ``torch.ao.quantization.quantizer`` 匯入
# 這些基本元件，而這個模組已經不在了：

error = old_import("QuantizationSpec, QuantizationAnnotation, Quantizer")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"

# %%
# **修正**： ``torchao.quantization.pt2e.quantizer`` 全部都有；x86 quantizer 自己的 spec 就是
# 這些類別的實例。說明見
# :ref:`M02-1 · quantizer 在圖上寫了什麼
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`。

from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
)

assert isinstance(config.input_activation, QuantizationSpec), "x86 config 的 spec"
assert isinstance(quantizer, Quantizer), "x86 quantizer 的基礎類別"
annotations = [n.meta.get("quantization_annotation") for n in prepared.graph.nodes]
assert any(isinstance(a, QuantizationAnnotation) for a in annotations), "它寫下的標註"

# %%
# MinMaxObserver、HistogramObserver 與 PerChannelMinMaxObserver
# -------------------------------------------------------------
# 對照表裡的陷阱： ``torch.ao.quantization.observer`` 仍然匯入得了，也沒有警告，但它的類別不是
# torchao 的，而 torchao 的 ``convert_pt2e`` 只認得自己的類別。把 x86 config 裡活化值 spec 所用的
# observer 換成 torch.ao 的 ``HistogramObserver`` ：整個過程沒有任何錯誤，活化值的 observer
# （標示處）留在 convert 後的圖裡，只有 weight（用的是 torchao 的 observer）被量化。

names, _ = attempt(move("MinMaxObserver, HistogramObserver, PerChannelMinMaxObserver").old)
OldHistogram = names["HistogramObserver"]
old_spec = dataclasses.replace(config.input_activation, observer_or_fake_quant_ctr=OldHistogram)
mixed = dataclasses.replace(config, input_activation=old_spec, output_activation=old_spec)
old_prepared = prepare_pt2e(
    export_module(get_model("conv_relu"), x), X86InductorQuantizer().set_global(mixed)
)
calibrate(old_prepared)
old_converted = convert_pt2e(old_prepared)
left = [n.name for n in old_converted.graph.nodes if "activation_post_process" in n.name]
draw(old_converted, highlight=left, title="torch.ao 的 observer：convert 之後還在")
weights = old_converted.graph.find_nodes(
    op="call_function", target=qd.dequantize_per_channel.default
)
quantize_count = op_counts(old_converted)["quantize_per_tensor.default"]
print(f"留下的 observer：{left}；quantize node 數：{quantize_count}")
assert left and quantize_count == 0, "活化值沒有量化，也沒有錯誤"
assert len(weights) == 1, "weight 由 torchao 的 observer 觀察，成為 int8"

# %%
# **修正**：用 torchao 的 observer，從 ``torchao.quantization.pt2e.observer`` 匯入
# （ ``torchao.quantization.pt2e`` 也匯出它們）；同樣的替換就會量化。說明見
# :ref:`M01-3 · observer 如何把統計值變成 qparams
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`。

from torchao.quantization.pt2e.observer import (
    HistogramObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
)

new_classes = (HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver)
assert all(names[c.__name__] is not c for c in new_classes), "三個不同的類別"
assert not issubclass(OldHistogram, HistogramObserver), "連子類別都不是"
new_spec = dataclasses.replace(old_spec, observer_or_fake_quant_ctr=MinMaxObserver)
fixed = dataclasses.replace(config, input_activation=new_spec, output_activation=new_spec)
new_prepared = prepare_pt2e(
    export_module(get_model("conv_relu"), x), X86InductorQuantizer().set_global(fixed)
)
calibrate(new_prepared)
assert op_counts(convert_pt2e(new_prepared))["quantize_per_tensor.default"] > 0, (
    "torchao 的 observer：有量化"
)

# %%
# lower_pt2e_quantized_to_x86
# ---------------------------
# x86 的 lowering（q/dq 組合 → oneDNN int8 運算）當初加在 ``torch.ao.quantization.pt2e`` ，
# 也跟著一起搬走了：

error = old_import("lower_pt2e_quantized_to_x86")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.pt2e'"

# %%
# **修正**：改從 ``torchao.quantization.pt2e.lowering`` 匯入。說明見
# :ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`。

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86

lowered = lower_pt2e_quantized_to_x86(converted, x)
onednn = [str(n.target) for n in lowered.graph.nodes if "onednn" in str(n.target)]
print(onednn)
assert onednn, "lowering 後的圖裡有 oneDNN 的 int8 運算"

# %%
# 數值除錯器
# ----------
# ``generate_numeric_debug_handle`` 和另外三個函式原本由 ``torch.ao.quantization`` 匯出；
# 這些名稱已經不在裡面了（套件本身還在，留給 eager 與 FX 量化使用）：

error = old_import("numeric debugger")
assert error == (
    "ImportError: cannot import name 'generate_numeric_debug_handle' from 'torch.ao.quantization'"
)

# %%
# **修正**：這四個函式都在 ``torchao.quantization.pt2e`` 。下面是 conv_relu 模型每個 node 的
# SQNR，int8 對浮點數。說明見
# :ref:`M04-1 · 量測誤差
# <sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`。

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)

program = export(get_model("conv_relu"), x)
generate_numeric_debug_handle(program)
marked = program.module()
int8 = prepare_pt2e(copy.deepcopy(marked), quantizer)
calibrate(int8)
logged = {
    "fp32": prepare_for_propagation_comparison(marked),
    "int8": prepare_for_propagation_comparison(convert_pt2e(int8)),
}
for m in logged.values():
    m(*x)
results = compare_results(*(extract_results_from_loggers(m) for m in logged.values()))
sqnrs = {info.name: round(s.results[0].sqnr.item(), 1) for info, s in results.items()}
print(f"SQNR（dB）：{sqnrs}")
assert sqnrs and min(sqnrs.values()) > 20, "比較的每個 node 都高於 20 dB"

# %%
# move_exported_model_to_eval 與 move_exported_model_to_train
# -----------------------------------------------------------
# 匯出的圖不接受 ``.eval()`` （見 :ref:`疑難排解：準確度、eval 與 QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`）；切換模式的函式原本由
# ``torch.ao.quantization`` 匯出：

error = old_import("move_exported_model_to_eval, move_exported_model_to_train")
assert error == (
    "ImportError: cannot import name 'move_exported_model_to_eval' from 'torch.ao.quantization'"
)

# %%
# **修正**：兩個都在 ``torchao.quantization.pt2e`` 。以訓練模式匯出的 dropout 會隨機丟掉一半的
# 輸入；經過 ``move_exported_model_to_eval`` 之後全部保留，和 eval 模式的模型一樣。說明見
# :ref:`M04-3 · 量化感知訓練 <sphx_glr_lessons_m04_accuracy_m04_3_qat.py>`。

from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train

torch.manual_seed(0)
dropout = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5))
rows = (torch.randn(4, 16),)
in_training = export(dropout, rows).module()
assert not torch.equal(in_training(*rows), dropout.eval()(*rows)), "訓練模式：會丟掉輸入"
move_exported_model_to_eval(in_training)
assert torch.equal(in_training(*rows), dropout(*rows)), "eval 模式：和 eval 模式的模型算出相同結果"
move_exported_model_to_train(in_training)
assert not torch.equal(in_training(*rows), dropout(*rows)), "也能切回訓練模式"

# %%
# disable_observer
# ----------------
# QAT 之後，用 ``model.apply(disable_observer)`` 凍結 scale（M04-3）。若用的是仍然匯入得了的
# ``torch.ao.quantization.disable_observer`` ，什麼都不會凍結：它檢查的是
# ``isinstance(module, torch.ao.quantization.FakeQuantizeBase)`` ，而 torchao 的 fake quantize
# 是另一個類別。沒有任何錯誤，每個 observer 都還開著。

names, _ = attempt(move("disable_observer").old)
qat_config = get_default_x86_inductor_quantization_config(is_qat=True)
qat = prepare_qat_pt2e(
    export(get_model("small_cnn"), x).module(), X86InductorQuantizer().set_global(qat_config)
)
qat(*x)
fake_quants = [m for m in qat.modules() if hasattr(m, "observer_enabled")]
qat.apply(names["disable_observer"])
print(f"torch.ao 的 disable_observer 之後：{[int(m.observer_enabled) for m in fake_quants]}")
assert all(m.observer_enabled for m in fake_quants), "什麼都沒關掉，也沒有任何提示"

# %%
# **修正**：用 torchao 的 ``disable_observer`` （在 ``torchao.quantization.pt2e`` ，也在它的
# ``fake_quantize`` 模組裡）。說明見
# :ref:`M04-3 · 量化感知訓練 <sphx_glr_lessons_m04_accuracy_m04_3_qat.py>`。

from torchao.quantization.pt2e import disable_observer

qat.apply(disable_observer)
print(f"torchao 的 disable_observer 之後： {[int(m.observer_enabled) for m in fake_quants]}")
assert not any(m.observer_enabled for m in fake_quants), "每個 observer 都關掉了"

# %%
# XNNPACKQuantizer
# ----------------
# 邊緣裝置的 quantizer 搬了兩次。 ``torch.ao.quantization.quantizer.xnnpack_quantizer`` 已經
# 不在；torchao 只為自己的測試留了一份副本，放在私有的
# ``torchao.testing.pt2e._xnnpack_quantizer`` ，匯入得了，但建立物件時會發出警告。

error = old_import("XNNPACKQuantizer (torch.ao)")
assert error == "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"
names, _ = attempt(move("XNNPACKQuantizer (torchao)").old)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    names["XNNPACKQuantizer"]()
print(f"torchao 的副本：{caught[0].category.__name__}: {caught[0].message}")
assert str(caught[0].message) == "XNNPACKQuantizer is deprecated!"

# %%
# **修正**：用 ExecuTorch 的版本，它的 XNNPACK partitioner 就是為它而寫；和 torchao 的副本是
# 不同的類別。說明見
# :ref:`M06-1 · XNNPACK quantizer
# <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`。

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

assert XNNPACKQuantizer is not names["XNNPACKQuantizer"], "不是 torchao 的副本"
xnnpack = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
edge_prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), xnnpack)
calibrate(edge_prepared)
assert op_counts(convert_pt2e(edge_prepared))["quantize_per_tensor.default"] > 0, (
    "ExecuTorch 的 quantizer 確實量化"
)

# %%
# DEPRECATION WARNING: You are using the deprecated \'to_edge() + to_backend()\' workflow.
# ----------------------------------------------------------------------------------------
# torch 2.3 時代的 ExecuTorch 腳本分兩次呼叫來下放：先 ``to_edge(program)`` ，再
# ``.to_backend(partitioner)`` 。兩者都還匯入得了、也能執行；接著 XNNPACK 的 partitioner 會
# 記下這一行（透過 ``logging`` ，寫到 stderr），後面接著：「Please consider migrating to
# 'to_edge_transform_and_lower()' for better error handling and optimization.」

assert old_import("to_edge, to_backend") == "", "仍然匯入得了"
names, _ = attempt(move("to_edge, to_backend").old)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner


def partitioner_log(lower) -> list[str]:
    """Run ``lower()``; return what XNNPACK's partitioner logged meanwhile (kept off the page)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        lower()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return [record.getMessage().strip() for record in records]


two_calls = partitioner_log(
    lambda: names["to_edge"](export(get_model("conv_relu"), x)).to_backend(XnnpackPartitioner())
)
print(two_calls[0])
assert two_calls[0].startswith(
    "DEPRECATION WARNING: You are using the deprecated 'to_edge() + to_backend()' workflow."
)

# %%
# **修正**：改成一次呼叫 ``to_edge_transform_and_lower(program, partitioner=[...])`` ：它在
# ExecuTorch 拆解計算圖之前，先執行 partitioner 自己的轉換，再交給 delegate。沒有警告，整個程式
# 成為一個 delegate。說明見 :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>` 。

from executorch.exir import to_edge_transform_and_lower

lowered_once = []
one_call = partitioner_log(
    lambda: lowered_once.append(
        to_edge_transform_and_lower(
            export(get_model("conv_relu"), x), partitioner=[XnnpackPartitioner()]
        )
    )
)
graph_nodes = lowered_once[0].exported_program().graph.nodes
outside = {str(n.target) for n in graph_nodes if n.op == "call_function"}
print(f"記錄下的訊息：{one_call or '無'}；delegate 之外：{sorted(outside)}")
assert not one_call and outside == {"executorch_call_delegate", "<built-in function getitem>"}

# %%
# OpenVINOQuantizer
# -----------------
# PyTorch 的 OpenVINO 教學從 NNCF 匯入 ``OpenVINOQuantizer`` 。NNCF 3.4 的那個位置已經沒有它：
# 這個 quantizer 搬進了 ExecuTorch 的 OpenVINO 後端，NNCF 只留下它呼叫的演算法。新舊兩個位置都
# 需要 ``nncf`` 與 ``openvino`` 套件，而 torch、torchao、ExecuTorch 都不會安裝它們；本站建置時
# 裝了這兩個套件：

print({name: metadata.version(name) for name in move("OpenVINOQuantizer").needs})
error = old_import("OpenVINOQuantizer")
assert error == (
    "ImportError: cannot import name 'OpenVINOQuantizer' from 'nncf.experimental.torch.fx'"
)

# %%
# **修正**：用 ExecuTorch 的版本，從 ``executorch.backends.openvino.quantizer`` 匯入。它和 x86 的
# 一樣是 PT2E 的 ``Quantizer`` （torchao 的基礎類別、torchao 的 ``prepare_pt2e`` ），只是標註方式
# 不同；它和 x86、XNNPACK、Arm 的並排比較見
# :ref:`M07-3 · 同一張圖，跑遍這台機器上的每個 quantizer
# <sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py>`。

from executorch.backends.openvino.quantizer import OpenVINOQuantizer

assert issubclass(OpenVINOQuantizer, Quantizer), "torchao 的 Quantizer"
openvino_prepared = prepare_pt2e(export_module(get_model("conv_relu"), x), OpenVINOQuantizer())
calibrate(openvino_prepared)
assert op_counts(convert_pt2e(openvino_prepared))["quantize_per_tensor.default"] > 0, "它確實量化"

# %%
# DeprecationWarning: torch.ao.quantization is deprecated and will be removed in 2.10.
# -------------------------------------------------------------------------------------
# eager 模式（ ``quantize_dynamic`` ）與 FX graph 模式（ ``prepare_fx`` 、 ``convert_fx`` ）
# 在 torch 2.13 裡都還在，也匯入得了；呼叫時會發出警告，而警告裡的版本號已經過去了（FX 的函式
# 帶著同樣的警告，寫在它們的 ``__deprecated__`` ）。警告接著說：eager 的使用者應改用 torchao 的
# ``quantize_`` ，FX 的使用者應改用 PT2E。

names, _ = attempt(move("quantize_dynamic (eager mode)").old)
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    names["quantize_dynamic"](mlp, {nn.Linear}, dtype=torch.qint8)
deprecations = {str(w.message).splitlines()[0].strip() for w in caught}
print(deprecations & {"torch.ao.quantization is deprecated and will be removed in 2.10."})
assert "torch.ao.quantization is deprecated and will be removed in 2.10." in deprecations
assert torch.__version__ >= "2.10", "torch 2.13：已經過了警告說要移除的版本"
fx, _ = attempt(move("prepare_fx, convert_fx (FX graph mode)").old)
assert all(
    fx[name].__deprecated__.startswith("torch.ao.quantization is deprecated")
    for name in ("prepare_fx", "convert_fx")
), "FX graph 模式：同樣的警告"

# %%
# **修正**：eager 模式用 ``quantize_`` 搭配 torchao 的 config，把每個 linear 的 weight 換成 int8
# 張量；若要量化的是計算圖，就用本課程的 PT2E 流程。該選哪一個，實際量測見
# :ref:`M05-4 · PT2E 還是 quantize_()？
# <sphx_glr_lessons_m05_transformers_m05_4_pt2e_or_quantize.py>`。

from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

eager = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
eager.load_state_dict(mlp.state_dict())
quantize_(eager, Int8DynamicActivationInt8WeightConfig())
tokens = torch.randn(16, 64)
print(f"weight 的型別：{type(eager[0].weight).__name__}")
torch.testing.assert_close(eager(tokens), mlp(tokens), atol=0.05, rtol=0)  # int8 的捨入誤差

# %%
# 兩者並不對等： ``quantize_dynamic`` 執行 torch.ao 的 ``quantized::linear_dynamic`` ，活化值
# 每個張量一個 scale，而且連 ``nn.LSTM`` 與 ``nn.GRU`` 也會量化；
# ``Int8DynamicActivationInt8WeightConfig`` 則是每個 token 一個 scale（M05-4），而且只量化
# linear。在 ``quantize_`` 之下，LSTM 維持浮點數：


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(16, 32, batch_first=True), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # 這個條目的棄用警告
    old_tagger = names["quantize_dynamic"](Tagger().eval(), {nn.LSTM, nn.Linear}, torch.qint8)
new_tagger = Tagger().eval()
quantize_(new_tagger, Int8DynamicActivationInt8WeightConfig())
print(f"quantize_dynamic: {type(old_tagger.rnn).__module__}.{type(old_tagger.rnn).__name__}")
print(f"quantize_: {type(new_tagger.rnn).__name__}, {type(new_tagger.head.weight).__name__}")
assert type(old_tagger.rnn).__module__.startswith("torch.ao.nn.quantized.dynamic"), "int8 LSTM"
assert type(new_tagger.rnn) is nn.LSTM and not hasattr(new_tagger.rnn.weight_ih_l0, "qdata")
assert hasattr(new_tagger.head.weight, "qdata"), "只有 linear"

# %%
# AttributeError: __torch__.torch.classes.quantized.LinearPackedParamsBase (of Python compilation unit at: 0) does not have a field with name \'__obj_flatten__\'
# ---------------------------------------------------------------------------------------------------------------------------------------------------------------
# 用 torch.ao 的 eager API 量化的模型可以執行，``torch.export`` 卻拒絕它：以 non-strict（預設）
# 匯出時是這個錯誤，以 strict 匯出時是 ``torch._dynamo`` 的 ``Unsupported: Failed to convert
# args/kwargs to proxy`` （pytorch/pytorch#137111、#140943）。這裡用上一個條目的 MLP，經過
# ``quantize_dynamic``：

from common.expect import expect_error

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # 上一個條目的棄用警告
    eager_int8 = names["quantize_dynamic"](mlp, {nn.Linear}, dtype=torch.qint8)
with expect_error(AttributeError, match="does not have a field with name '__obj_flatten__'"):
    export(eager_int8, (tokens,))
with expect_error(torch._dynamo.exc.Unsupported, match="Failed to convert args/kwargs to proxy"):
    export(eager_int8, (tokens,), strict=True)

# %%
# **原因**：``quantize_dynamic`` 把每個 ``nn.Linear`` 換成 torch.ao 的動態 ``Linear``，它把
# int8 weight 預先打包，存在一個 TorchScript 物件 ``LinearPackedParamsBase`` 裡，再交給
# ``torch.ops.quantized.linear_dynamic``。匯出時用 fake tensor 追蹤，所以 non-strict 匯出也得
# 替這個物件做一個 fake 版本：``maybe_to_fake_obj``
# （ ``torch/_library/fake_class_registry.py`` ）會呼叫它的 ``__obj_flatten__``，而這個類別
# 沒有這個方法。strict 匯出的 Dynamo 也無法把這個物件放進圖裡。

packed = eager_int8[0]._packed_params._packed_params
print(f"{type(eager_int8[0]).__module__}.Linear 存著一個 {packed._type().qualified_name()}")
assert isinstance(packed, torch.ScriptObject) and not hasattr(packed, "__obj_flatten__")

# %%
# **修正**：改用 PT2E 量化浮點數模型：先匯出，再 ``prepare_pt2e`` 與 ``convert_pt2e`` （這裡用
# x86 quantizer 的動態 config，活化值在執行時才量化成 int8，和 ``quantize_dynamic`` 一樣）。
# convert 後的圖只有一般的張量與 q/dq 運算，可以再次匯出，交給 ``torch.compile``、AOTInductor
# 或 ExecuTorch。用 PT2E 做動態量化，說明見
# :ref:`M05-2 · 靜態與動態 int8 <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`。

dynamic = X86InductorQuantizer().set_global(
    get_default_x86_inductor_quantization_config(is_dynamic=True)
)
pt2e_prepared = prepare_pt2e(export(mlp, (tokens,)).module(), dynamic)
pt2e_prepared(tokens)
pt2e_int8 = convert_pt2e(pt2e_prepared)
reexported = export(pt2e_int8, (tokens,))
print(f"再次匯出：{op_counts(reexported.module())['choose_qparams.tensor']} 個 choose_qparams")
assert torch.equal(reexported.module()(tokens), pt2e_int8(tokens)), "同一個 int8 模型"
torch.testing.assert_close(pt2e_int8(tokens), mlp(tokens), atol=0.05, rtol=0)  # int8 的捨入誤差

# %%
# 下一頁
# ------
# 回到 :ref:`疑難排解：匯入與匯出
# <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`，或繼續看
# :ref:`M05-4 · PT2E 還是 quantize_()？
# <sphx_glr_lessons_m05_transformers_m05_4_pt2e_or_quantize.py>`。
