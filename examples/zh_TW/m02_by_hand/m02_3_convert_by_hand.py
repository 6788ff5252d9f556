"""
M02-3 親手做 convert
====================

``convert_pt2e`` 把每個校準過的 observer 換成一對 quantize／dequantize，帶上 observer 算出的
scale 和 zero point；讓每個被量化的運算都有自己的 dequantize；並把常數 weight 預先量化，
讓圖裡直接存 int8。本課用 M00-4 的動作（步驟 4～6）把這些改動逐一親手做完，
最後得到的模型輸出和 ``convert_pt2e`` 的結果 ``torch.equal``：不是很接近，而是完全相同。

**你會學到**

- observer 如何變成 ``quantize → dequantize``：per-tensor 與 per-channel
- 為什麼被兩個運算共用的 dequantize 要複製一份
- ``fold_quantize=True`` 對 weight 做了什麼

**先備知識**：
:ref:`M00-4 · 改圖 <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>` （步驟 4～6）、
:ref:`M01-2 · q/dq node 和裡面的數字
<sphx_glr_lessons_m01_quantized_graphs_m01_2_qdq_numbers.py>`、
:ref:`M02-2 · 親手做 prepare <sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# 準備
# ----
# 和 M02-2 一樣的 ``small_cnn`` 與課程 quantizer，prepare 兩份、用相同的資料校準：
# ``gm`` 給我們親手改，``reference`` 交給 ``convert_pt2e``。

import copy
from collections import Counter

import torch
from torch import nn

from common.expect import expect_error
from common.models import MODEL_NAMES, example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw_diff

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common import handmade
from common.quantizer import CourseQuantizer

qd = torch.ops.quantized_decomposed
x = example_inputs(8)
gm = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
reference = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(gm)
calibrate(reference)
reference = convert_pt2e(reference)
graph = gm.graph
nodes = {node.name: node for node in graph.nodes}
calibrated = copy.deepcopy(gm)

# %%
# 輔助函式：``call_functions`` 統計圖裡的運算；``TwoBranches`` 是輸入被兩個 conv
# 讀取的模型（步驟 4）。


def call_functions(gm):
    """圖裡 call_function 的 target，以及各出現幾次。"""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # 固定的 weight：頁面上的數字不受先前執行的課程影響
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x) + self.b(x)


# %%
# 步驟 1 — per-tensor 的 observer 變成 quantize → dequantize
# -----------------------------------------------------------
# ``calculate_qparams`` 把 observer 的統計值換算成 scale 和 zero point（M01-3）；
# 整數型別和範圍也從 observer 讀（``dtype``、``quant_min``、``quant_max``，來自 quantizer 的
# spec）。per-tensor 時它們就是寫在引數裡的 Python 數字。這一對 node 插在 observer「之前」
# （``inserting_before``），接手它的使用者；這之後才能刪掉 observer node。

observer_node = nodes["activation_post_process_0"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
qparams = (float(scale), int(zero_point), observer.quant_min, observer.quant_max, observer.dtype)
print(f"observer：{observer.dtype} [{observer.quant_min}, {observer.quant_max}]")
with graph.inserting_before(observer_node):
    q = graph.call_function(qd.quantize_per_tensor.default, (nodes["x"], *qparams))
    dq = graph.call_function(qd.dequantize_per_tensor.default, (q, *qparams))
with expect_error(RuntimeError, match="still had 1 users"):
    graph.erase_node(observer_node)
observer_node.replace_all_uses_with(dq)
graph.erase_node(observer_node)
print(dq.format_node())
assert nodes["conv2d"].args[0] is dq and q.args[0] is nodes["x"], "x → quantize → dequantize → conv"
assert observer_node not in graph.nodes, "observer node 已經刪掉了"

# %%
# 步驟 2 — per-channel 的 observer：qparams 變成 buffer
# ------------------------------------------------------
# weight 每個輸出通道有一個 scale：這是張量，所以存成 buffer，再由 ``get_attr`` 讀出
# （M00-4 步驟 5）。torchao 用被觀察 node 所屬的模組來命名 buffer；weight 的 ``get_attr``
# 不屬於任何模組，所以名字就是 ``_scale_0`` 和 ``_zero_point_0`` （步驟 6 連名字一起比對）。
# 軸和範圍都從 observer 讀：對稱的 per-channel 量化，所以每個 zero point 都是 0。

observer_node = nodes["activation_post_process_1"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
gm.register_buffer("_scale_0", scale)
gm.register_buffer("_zero_point_0", zero_point)
with graph.inserting_before(observer_node):
    qparams = (
        graph.get_attr("_scale_0"),
        graph.get_attr("_zero_point_0"),
        observer.ch_axis,
        observer.quant_min,
        observer.quant_max,
        observer.dtype,
    )
    q_w = graph.call_function(qd.quantize_per_channel.default, (nodes["conv_weight"], *qparams))
    dq_w = graph.call_function(qd.dequantize_per_channel.default, (q_w, *qparams))
observer_node.replace_all_uses_with(dq_w)
graph.erase_node(observer_node)
print(f"第 {observer.ch_axis} 軸，{scale.shape[0]} 個 scale，zero point {zero_point.unique()}")
assert scale.shape == (gm.conv.weight.shape[observer.ch_axis],), "每個輸出通道一個 scale"
assert not zero_point.any(), "對稱：每個 zero point 都是 0"

# %%
# 步驟 3 — 其餘的 observer，然後清理
# ----------------------------------
# ``handmade.replace_observer`` 對任何 observer 做步驟 1 和 2 的事。共用的 observer 會被好幾個
# node 呼叫：每一次呼叫各自變成一對 q/dq，數字相同。接著是例行的清理（M00-4 步驟 6）：
# 刪掉死碼、重新建一個只留下圖用得到的屬性的 ``GraphModule``、刪掉 observer submodule。

scopes = gm.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(graph.nodes):
    if handmade.is_observer_node(gm, node):
        handmade.replace_observer(gm, node, scopes)
graph.eliminate_dead_code()
gm = torch.fx.GraphModule(gm, graph)
gm.delete_all_unused_submodules()
graph.lint()
qdq = [n.name for n in gm.graph.nodes if "quantize_per" in str(n.target)]
draw_diff(calibrated, gm, title="步驟 1～3：每個 observer 都變成 quantize → dequantize")
quantizes = gm.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)
numbers = Counter(q.args[1:3] for q in quantizes)
print(f"per-tensor 的 (scale, zero point) → quantize node 個數：{dict(numbers)}")
assert not any(handmade.is_observer_node(gm, n) for n in gm.graph.nodes if n.op == "call_module"), (
    "沒有 observer 了"
)
assert len(qdq) == 14, "7 次 observer 呼叫，每次 2 個 node"
assert sorted(numbers.values()) == [1, 1, 3], "共用 observer 的 3 次呼叫：3 對 q/dq，1 組數字"

# %%
# 步驟 4 — 被兩個運算共用的 dequantize 要複製
# --------------------------------------------
# ``small_cnn`` 裡沒有這種情況，所以改用兩個 conv 讀同一個輸入的小模型。輸入的 observer
# 變成一個有兩個使用者的 dequantize。後端會把 ``dequantize → conv → quantize``
# 融合成一個整數 conv（M03），這需要 dequantize 專屬於那個 conv，
# 所以 convert 替每個有標註的使用者各複製一份（``node_copy``）。

side = handmade.prepare(export_module(TwoBranches().eval(), x), CourseQuantizer())
calibrate(side)
side_scopes = side.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(side.graph.nodes):
    if handmade.is_observer_node(side, node):
        handmade.replace_observer(side, node, side_scopes)
dq_op = qd.dequantize_per_tensor.default
shared = [n for n in side.graph.find_nodes(op="call_function", target=dq_op) if len(n.users) > 1]
print(f"共用的：{[(n.name, [u.name for u in n.users]) for n in shared]}")
q_x = shared[0].args[0]
side_before = copy.deepcopy(side)
handmade.duplicate_shared_dequantize(side)
copies = [
    n.name for n in side.graph.find_nodes(op="call_function", target=dq_op) if n.args[0] is q_x
]
print(f"之後：{copies}")
draw_diff(side_before, side, title="步驟 4：每個 conv 各有一個 dequantize")
assert len(shared) == 1 and len(copies) == 2, "一個有兩個使用者的 dequantize 變成兩個"
convs = side.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default)
assert sorted(conv.args[0].name for conv in convs) == sorted(copies), "每個 conv 讀自己的那一份"

# %%
# 在 ``small_cnn`` 上同一個步驟什麼都不會改；convert 照樣會執行它：

before = gm.code
handmade.duplicate_shared_dequantize(gm)
assert gm.code == before, "small_cnn 沒有任何 dequantize 有兩個 user"
print(f"沒有改變：{gm.code == before}")

# %%
# 步驟 5 — 預先量化 weight
# ------------------------
# ``get_attr(weight) → quantize`` 只依賴常數，所以結果可以現在就算好存起來：
# 一個 int8 的凍結參數 ``_frozen_param0``，由一個沿用 quantize node 名字的 ``get_attr`` 讀取。
# 圖從此不再讀取浮點 weight。它的值填滿 observer 的對稱範圍。

unfolded = copy.deepcopy(gm)
q_w = next(n for n in gm.graph.nodes if n.target == qd.quantize_per_channel.default)
weight = gm.conv.weight
int8_weight = q_w.target(weight, gm._scale_0, gm._zero_point_0, *q_w.args[3:])
gm.register_buffer("_frozen_param0", int8_weight)
with gm.graph.inserting_before(q_w):
    frozen = gm.graph.get_attr("_frozen_param0")
q_w.replace_all_uses_with(frozen)
gm.graph.erase_node(q_w)
frozen.name = q_w.name
*_, quant_min, quant_max, dtype = q_w.args[3:]
print(f"{int8_weight.dtype}，範圍 [{int8_weight.min()}, {int8_weight.max()}]")
assert int8_weight.dtype == dtype, "存成 observer 的 dtype"
assert int8_weight.abs().max() == quant_max == -quant_min, "對稱：最大的 |w| 對到 ±max"
weight_reads = [n for n in gm.graph.find_nodes(op="get_attr") if n.target == "conv.weight"]
assert weight_reads and not any(n.users for n in weight_reads), "浮點 weight：沒人讀了"

# %%
# ``handmade.fold_weight_quantize`` 對 linear 的 weight 做同樣的事，刪掉沒人讀的
# ``get_attr`` node，最後用 ``lint`` 檢查。

handmade.fold_weight_quantize(gm)
draw_diff(unfolded, gm, title="步驟 5：int8 weight 成為常數")
assert not gm.graph.find_nodes(op="call_function", target=qd.quantize_per_channel.default), (
    "圖裡沒有 weight 的 quantize 了"
)
assert torch.equal(gm._frozen_param1, reference._frozen_param1), "linear 的 int8 weight"

# %%
# 步驟 6 — 和 convert_pt2e 比對
# -----------------------------
# 程式碼相同、運算的種類和個數相同，而且（這正是整個單元的重點）
# 在校準時沒看過的輸入上，輸出一個位元都不差（``calibrate`` 用的是種子 0～3，這裡是 123）。

gm.graph.lint()
gm.recompile()
fresh = example_inputs(8, seed=123)
assert call_functions(gm) == call_functions(reference), "相同的運算，次數也相同"
assert gm.code == reference.code, "和 convert_pt2e 的圖相同"
assert torch.equal(gm(*fresh), reference(*fresh)), "和 convert_pt2e 逐位元相同"
print(call_functions(gm))
print(f"torch.equal(gm, convert_pt2e)：{torch.equal(gm(*fresh), reference(*fresh))}")

# %%
# 包裝好的 ``common.handmade.convert`` 也一樣：

packaged = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(packaged)
same = torch.equal(handmade.convert(packaged)(*fresh), reference(*fresh))
print(f"torch.equal(handmade.convert, convert_pt2e)：{same}")
assert same, "handmade.convert 和 convert_pt2e 逐位元相同"

# %%
# 步驟 7 — 模型庫的每個模型，兩個 quantizer
# -----------------------------------------
# 在課程模型庫的每個模型上做同樣的比對，分別用課程的 quantizer 和 torchao 的
# ``X86InductorQuantizer``：``handmade.prepare`` 與 ``handmade.convert`` 對上
# ``prepare_pt2e`` 與 ``convert_pt2e``，用相同的資料校準，再以 ``torch.equal`` 比較兩者在
# 新輸入上的輸出。每一組是一個案例；``tests/test_handmade.py`` 跑的是更大的矩陣。

cases = 0
for name in MODEL_NAMES:
    for quantizer in (CourseQuantizer, x86_quantizer):
        ours = handmade.prepare(export_module(get_model(name), x), quantizer())
        theirs = prepare_pt2e(export_module(get_model(name), x), quantizer())
        calibrate(ours)
        calibrate(theirs)
        same = torch.equal(handmade.convert(ours)(*fresh), convert_pt2e(theirs)(*fresh))
        assert same, f"{name} 用 {quantizer.__name__}：和 torchao 逐位元相同"
        cases += 1
print(f"在 {cases} 個案例上和 torchao 逐位元相同：{len(MODEL_NAMES)} 個模型 × 2 個 quantizer")
# sphinx_gallery_start_ignore
from common.results import publish  # 首頁引用的數字

publish("bit_exact_cases", cases)
# sphinx_gallery_end_ignore

# %%
# 小結
# ----
# convert = 每個 observer 呼叫 → ``quantize → dequantize`` （per-tensor 把數字寫在引數裡，
# per-channel 用 buffer，dtype 和範圍都來自 observer）、清理、每個被量化的使用者
# 各有一個 dequantize，以及預先算好的常數 weight 量化。``common.handmade`` 把 M02-2 和
# M02-3 包裝成 ``prepare`` 與 ``convert``；它的測試在課程的每一個模型，以及
# ``tests/test_handmade.py`` 裡其他的層組合上，分別搭配課程 quantizer 和
# ``X86InductorQuantizer``，逐一和 torchao 比對。

# %%
# 練習
# ----
# 1. 改成以 per-tensor 量化 weight（下面的 ``PER_TENSOR_WEIGHT``：對稱，整個 weight 只有一個
#    scale）。預測 weight 現在走的是步驟 1 還是步驟 2：convert 之後的模型還留著幾個 scale 或
#    zero point 的 buffer？每個 weight 的 dequantize 從哪裡拿到它的 scale？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from dataclasses import replace
#
#          from torchao.quantization.pt2e.observer import MinMaxObserver
#
#          from common.quantizer import WEIGHT_SPEC
#
#          PER_TENSOR_WEIGHT = replace(
#              WEIGHT_SPEC,
#              qscheme=torch.per_tensor_symmetric,
#              ch_axis=None,
#              observer_or_fake_quant_ctr=MinMaxObserver,
#          )
#          WEIGHTED = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
#
#
#          class PerTensorWeights(CourseQuantizer):
#              def annotate(self, model):
#                  super().annotate(model)
#                  for node in model.graph.nodes:
#                      if node.target in WEIGHTED:
#                          qspecs = node.meta["quantization_annotation"].input_qspec_map
#                          qspecs[node.args[1]] = PER_TENSOR_WEIGHT
#                  return model
#
#
#          small_cnn = export_module(get_model("small_cnn"), x)
#          per_tensor = handmade.prepare(small_cnn, PerTensorWeights())
#          calibrate(per_tensor)
#          per_tensor = handmade.convert(per_tensor)
#          buffers = sorted(name for name, _ in per_tensor.named_buffers())
#          print(buffers)
#          assert buffers == ["_frozen_param0", "_frozen_param1"], (
#              "只剩 int8 weight：沒有 scale 或 zero point 的 buffer"
#          )
#          weights = [n for n in per_tensor.graph.find_nodes(op="get_attr") if n.target in buffers]
#          dequantizes = [next(iter(n.users)) for n in weights]
#          print(dequantizes[0].format_node())
#          assert all(dq.target == qd.dequantize_per_tensor.default for dq in dequantizes)
#          assert all(isinstance(dq.args[1], float) for dq in dequantizes), (
#              "步驟 1：scale 是 args 裡的數字"
#          )
#          assert all(dq.args[2] == 0 for dq in dequantizes), "對稱量化：zero point 是 0"
#
# 2. 改用 ``fold_quantize=False`` 做 convert。哪些運算會改變？結果還和
#    ``convert_pt2e(..., fold_quantize=False)`` 逐位元相同嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          ours = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
#          theirs = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
#          calibrate(ours)
#          calibrate(theirs)
#          ours = handmade.convert(ours, fold_quantize=False)
#          theirs = convert_pt2e(theirs, fold_quantize=False)
#          print(call_functions(ours) - call_functions(gm))
#          assert call_functions(ours) - call_functions(gm) == Counter(
#              {"quantized_decomposed.quantize_per_channel.default": 2}
#          ), "兩個 weight 的 quantize 留在圖裡"
#          assert torch.equal(ours(*fresh), theirs(*fresh))
#
# 3. 親手 convert ``conv_relu``。你預測會有幾個 quantize／dequantize node？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          small = handmade.prepare(export_module(get_model("conv_relu"), x), CourseQuantizer())
#          calibrate(small)
#          small = handmade.convert(small)
#          ops = call_functions(small)
#          counts = {t.split(".")[1]: n for t, n in ops.items() if "quantize" in t}
#          print(counts)
#          assert counts == {
#              "quantize_per_tensor": 2,
#              "dequantize_per_tensor": 2,
#              "dequantize_per_channel": 1,
#          }, "輸入和 relu 的輸出以 per-tensor 量化；weight 的 quantize 已預先算掉"

# %%
# 延伸閱讀
# --------
# - `torch.fx：Graph 與 GraphModule（PyTorch） <https://docs.pytorch.org/docs/stable/fx.html>`__
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`__
# - :ref:`疑難排解：prepare 與 convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`：同樣的錯誤，依錯誤訊息查

# %%
# **下一課**：:ref:`M02-4 · 為新後端寫 quantizer
# <sphx_glr_lessons_m02_by_hand_m02_4_writing_a_quantizer.py>`，
# 把課程 quantizer 的程式碼擴充，用上這個單元還沒用到的 spec。
