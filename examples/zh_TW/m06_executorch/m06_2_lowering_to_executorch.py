"""
M06-2 下放到 ExecuTorch
=============================

convert 之後的圖仍然在浮點數裡模擬 int8。ExecuTorch 分兩步讓它成真：
``to_edge_transform_and_lower`` 把圖改寫成 **edge dialect** ，並把後端能執行的部分交給該後端的
**partitioner** ，由它切出來成為 delegate；接著 ``.to_executorch()`` 為剩下的一切規劃記憶體。
本課用 ExecuTorch 的 ``XnnpackPartitioner`` 下放一個小分類器，讀出哪些 node 成了 XNNPACK
delegate、哪些留在 ExecuTorch 的 portable kernel 上（以及原因，出自 partitioner 自己的限制），
再親手寫一個 partitioner： ``common.edge.CoursePartitioner`` ，它委派的 node 完全相同，兩個程式
在執行環境上的輸出也相等。

**你會學到**

- edge dialect 是什麼，以及哪些 node 會變成呼叫 ``lowered_module_N`` 的
  ``executorch_call_delegate``
- 從 partitioner 的限制讀出 node 為何留在 portable kernel 上，以及記憶體規劃加了什麼
  （ ``alloc`` 、 ``.out`` 運算）
- partitioner 做什麼：標記 node，並說明哪些運算不要拆解

**先備知識**：
:ref:`M06-1 · XNNPACK quantizer <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`、
:ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 一個縮小版的分類器：conv + relu、在高與寬上取全域平均（寫成 ``mean((2, 3))`` ），以及一層
# linear；用 ``XNNPACKQuantizer`` 量化（int8 活化值、per-channel int8 weight：
# ``common.edge.xnnpack_quantizer()`` ），再匯出一次，因為 ExecuTorch 從 ``ExportedProgram``
# 開始。

import contextlib
import io
from collections import Counter

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.config.generic_node_configs import MeanDimConfig
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import (
    SUPPORTED,
    CoursePartitioner,
    delegated,
    left_outside,
    xnnpack_quantizer,
)


class Classifier(nn.Module):
    def __init__(self, keepdim=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)
        self.keepdim = keepdim

    def forward(self, x):
        features = torch.relu(self.conv(x)).mean((2, 3), keepdim=self.keepdim)
        return self.fc(features.flatten(1))


x = example_inputs(2)


def quantized_program(model, quantizer=None):
    """用 XNNPACKQuantizer 做 prepare -> 校準 -> convert，再 torch.export 一次。"""
    prepared = prepare_pt2e(export_module(model, x), quantizer or xnnpack_quantizer())
    calibrate(prepared)
    return torch.export.export(convert_pt2e(prepared), x)


torch.manual_seed(0)
program = quantized_program(Classifier().eval())

# %%
# 兩個輔助函式： ``ops`` 依簡短名稱計算圖中的運算子， ``run`` 在 ExecuTorch 執行環境上執行
# 程式（執行環境第一次載入時會印出幾行 ``cpuinfo`` 訊息，這裡不讓它們出現在頁面上）。


def ops(gm) -> Counter:
    """運算子名稱（不含命名空間與 overload） -> 呼叫它的 call_function node 數。"""
    names = (
        str(getattr(n.target, "__name__", n.target))
        for n in gm.graph.nodes
        if n.op == "call_function"
    )
    return Counter(name.split(".")[-2] if "." in name else name for name in names)


def run(executorch_program, inputs):
    with contextlib.redirect_stderr(io.StringIO()):
        program = Runtime.get().load_program(executorch_program.buffer)
        method = program.load_method("forward")  # Method 不會讓它的 Program 存活：兩者都要留著
    return method.execute([*inputs])[0]


# %%
# 步驟 1 — 用 XnnpackPartitioner 下放
# ------------------------------------------
# ``to_edge_transform_and_lower`` 做三件事：把 ATen 圖轉成 edge dialect、詢問每個
# partitioner 它的後端執行哪些 node，再把每一組這樣的 node 換成一次
# ``executorch_call_delegate`` 呼叫。這裡切出了兩組：conv（連同它的 relu）與 linear。兩者之間
# 留下一個運算： ``mean`` （每個 delegate 的輸出由一個 ``getitem`` 讀取）。

edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
lowered = edge.exported_program()
calls = [n.name for n in lowered.graph.nodes if n.name.startswith("executorch_call_delegate")]
draw(lowered.graph_module, highlight=calls, title="之後：兩個 XNNPACK delegate")
print(dict(ops(lowered.graph_module)))
assert ops(lowered.graph_module)["executorch_call_delegate"] == 2, "兩個 delegate"
assert not ops(lowered.graph_module)["convolution"], "delegate 之外沒有留下 conv"

# %%
# 步驟 2 — 每個 delegate 裡的 edge dialect
# ----------------------------------------
# 每個 ``executorch_call_delegate`` 讀取一個 ``lowered_module_N`` 的 ``get_attr`` ：由它取代的
# 那些 node 編譯成的 XNNPACK 程式。那些 node 的 edge dialect 圖保存在 ``original_module`` 裡。
# edge 運算是附帶 dtype 約定的 ATen 運算（ ``EdgeOpOverload`` ）； ``conv2d`` 現在是 core ATen
# 運算 ``convolution`` （edge dialect 也沒有 view： ``flatten`` 會變成 ``view_copy`` ，見練習 1）。
# ``linear`` 保持完整：XnnpackPartitioner 要求 ExecuTorch 不要拆解它（步驟 5）。

for module, names in delegated(lowered).items():
    print(f"{module}: {names}")
inner = lowered.graph_module.lowered_module_0.original_module.graph_module
conv = next(n for n in inner.graph.nodes if "convolution" in n.name)
draw(inner, highlight=[conv.name], title="lowered_module_0 內部：edge dialect 的 node")
print(type(conv.target).__name__, conv.target)
assert type(conv.target).__name__ == "EdgeOpOverload"
assert {"aten_convolution_default", "aten_relu_default"} <= set(
    delegated(lowered)["lowered_module_0"]
)
assert "aten_linear_default" in delegated(lowered)["lowered_module_1"], "linear 保持完整"

# %%
# 步驟 3 — 什麼留在 portable kernel 上，以及原因
# -----------------------------------------------
# mean 在 ExecuTorch 的 **portable kernels** （ExecuTorch 內建、寫成單純 C++ 迴圈的
# kernel）上以浮點數執行：第一個 delegate 的結尾是原本包在 mean 前後的 quantize 與
# dequantize（XNNPACK 也會接下單獨的 q 或 dq），第二個 delegate 從下一個 quantize 開始。
# XNNPACK 的 partitioner 每個運算有一個 config；它的 ``MeanDimConfig`` 把 mean 下放成
# XNNPACK 的全域平均池化，其輸出保留 1×1 的 H 與 W：
# 它只接受對 4 維張量的第 2、3 維取平均，而且 **必須** ``keepdim=True`` 。我們的 mean 去掉了
# 這兩維（ ``keepdim`` 預設為 False）。

portable = ops(lowered.graph_module) - Counter(executorch_call_delegate=2, getitem=2)
(mean,) = [n for n in lowered.graph.nodes if n.name.startswith("aten_mean")]
print(f"portable 運算：{dict(portable)}；引數：{mean.args[1:]}，{mean.kwargs}")
print("原因（common.edge 的訊息）：" + SUPPORTED["mean.dim"].why_not(mean))
assert portable == Counter(mean=1), "delegate 之外只留下 mean"
assert not MeanDimConfig().check_constraints(mean, lowered), "XNNPACK 自己的檢查拒絕它"
assert mean.meta["val"].dtype == torch.float32, "它在兩個 delegate 之間以浮點數執行"

# %%
# 在你自己的模型上， ``common.edge.left_outside`` 會列出下放後的程式在 delegate 之外執行的
# 每一個運算，並附上課程整理的 XNNPACK partitioner 表所給的原因：它不符合的限制，或 XNNPACK
# 根本沒有它的 config。

outside = left_outside(lowered)
print(outside)
why = "mean.dim: " + SUPPORTED["mean.dim"].why_not(mean)
assert outside == {mean.name: why}, "只有一個運算在外面，原因就是這一條"

# %%
# 步驟 4 — ``.to_executorch()`` ：記憶體規劃
# ------------------------------------------
# ``.to_executorch()`` 把 delegate 之外的每個運算換成它的 **out 變體** （ ``mean.out`` 寫進
# 交給它的張量，自己從不配置記憶體），為那個張量加上一個 ``memory.alloc`` node，並規劃每個
# 中間張量位於同一塊預先配置的緩衝區中的哪裡： ``meta["spec"]`` 存有它的 ``mem_id`` 與
# ``mem_offset`` 。生命期不重疊的張量共用位元組：conv 的輸出在 mean 讀完之後就不再需要，
# 所以 linear 的輸出沿用它的位移。結果可序列化成 ``.pte`` 檔（M06-3），在 ExecuTorch 執行
# 環境上執行。

executorch_program = edge.to_executorch()
planned = executorch_program.exported_program().graph_module
print(dict(ops(planned)))
(mean_out,) = [n for n in planned.graph.nodes if str(n.target).endswith("mean.out")]
print(f"{mean_out.name}：out={mean_out.kwargs['out'].name}")
offsets = {}
for node in planned.graph.nodes:
    spec = node.meta.get("spec")
    if node.op == "call_function" and getattr(spec, "mem_offset", None) is not None:
        offsets[node.name] = spec.mem_offset
        print(f"  {node.name:14} 形狀 {tuple(spec.shape)!s:15} mem_id {spec.mem_id}", end="")
        print(f"  位移 {spec.mem_offset}")
assert mean_out.kwargs["out"].target.__name__ == "alloc", "mean 寫進規劃好的緩衝區"
assert ops(planned)["alloc"] == 1, "一個 alloc：delegate 之外唯一的運算"
assert offsets["getitem_1"] == offsets["getitem"], "不再需要的張量，其位元組被重複使用"
y = run(executorch_program, x)
print("執行環境的輸出", tuple(y.shape), y.dtype)

# %%
# 步驟 5 — 親手寫的 partitioner
# -----------------------------
# partitioner 是有兩個方法的類別。 ``ops_to_not_decompose(program)`` 回傳後端要求保持完整的
# ATen 運算，以及挑選 node 的篩選函式（其餘的由 ExecuTorch 拆解）。 ``partition(program)`` 在
# 要委派的 node 上設定 ``node.meta["delegation_tag"]`` 。 ``common.edge.CoursePartitioner``
# 把它知道的一切放在一張表 ``SUPPORTED`` 裡：XNNPACK 執行的每個運算、它有沒有 int8 kernel，
# 以及從 XNNPACK 對應的 config 讀出的限制。int8 運算會連同它的 dequantize 輸入與輸出的
# quantize 一起帶走。

for name in ("convolution.default", "mean.dim", "max_pool2d.default", "sigmoid.default"):
    op = SUPPORTED[name]
    print(f"{name:20} int8={op.int8!s:5} 保持完整={op.keep_whole}  融合 {op.fused}")
mine = to_edge_transform_and_lower(program, partitioner=[CoursePartitioner()])
print({module: len(names) for module, names in delegated(mine.exported_program()).items()})
assert delegated(mine.exported_program()) == delegated(lowered), "相同的 delegate"

# %%
# 相同的 delegate，相同的程式：在執行環境上兩者給出逐位元相同的數字。

y_mine = run(mine.to_executorch(), x)
assert torch.equal(y_mine, y), "CoursePartitioner 的程式給出 XnnpackPartitioner 的輸出"
print(f"相等：{torch.equal(y_mine, y)}")

# %%
# 步驟 6 — 不認得的，就拒絕
# -------------------------
# 默默跳過不認得的運算的 partitioner，會一聲不響地給出不同的程式。 ``CoursePartitioner``
# 則會引發錯誤，並指出是哪個 node。XNNPACK 能執行 ``prelu`` （並要求保持完整），表中卻沒有它。


class PReLUHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.PReLU()

    def forward(self, x):
        return self.act(self.conv(x))


with expect_error(NotImplementedError, match="does not know prelu"):
    to_edge_transform_and_lower(
        quantized_program(PReLUHead().eval()), partitioner=[CoursePartitioner()]
    )

# %%
# 它也會檢查拿到的是什麼： ``GraphModule`` （ ``convert_pt2e`` 的回傳值）還不是程式。

with expect_error(TypeError, match="expects an ExportedProgram, got a GraphModule"):
    CoursePartitioner().partition(program.module())

# %%
# 小結
# ----
# ===============================  ==========================================================
# 階段                             內容
# ===============================  ==========================================================
# ``to_edge_transform_and_lower``  edge dialect 運算；每個分割是一次呼叫
#                                  ``lowered_module_N`` 的 ``executorch_call_delegate``
# delegate 之外                    partitioner 拒絕的運算（沒有 ``keepdim`` 的 ``mean`` ），
#                                  以浮點數在 portable kernel 上執行
# ``.to_executorch()``             ``.out`` 變體、為它們每個輸出配置的 ``memory.alloc`` 、
#                                  同一塊規劃好的緩衝區中的位移
# partitioner                      ``ops_to_not_decompose`` + ``partition`` （標記）
# ===============================  ==========================================================
#
# 練習
# ----
# 1. 改用 ``Classifier(keepdim=True)`` 。預測下放後的程式有幾個 delegate，
#    delegate 之外還有沒有 ``mean`` 。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          kept = quantized_program(Classifier(keepdim=True).eval())
#          kept_lowered = to_edge_transform_and_lower(
#              kept, partitioner=[CoursePartitioner()]
#          ).exported_program()
#          print(dict(ops(kept_lowered.graph_module)))
#          assert ops(kept_lowered.graph_module)["executorch_call_delegate"] == 1
#          assert not ops(kept_lowered.graph_module)["mean"], "mean 收進了 delegate"
#          (names,) = delegated(kept_lowered).values()
#          assert "aten_view_copy_default" in names, "在 edge dialect 裡 flatten 是 view_copy"
#
# 2. 讓 linear 留在浮點數： ``set_filter_function`` 告訴 ``XNNPACKQuantizer`` 要標註哪些
#    node。預測兩個 partitioner 各自怎麼處理浮點數的 linear。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          all_but_linear = xnnpack_quantizer().set_filter_function(
#              lambda node: node.target != torch.ops.aten.linear.default
#          )
#          float_fc = quantized_program(Classifier().eval(), all_but_linear)
#          theirs = to_edge_transform_and_lower(float_fc, partitioner=[XnnpackPartitioner()])
#          assert any(
#              "aten_linear_default" in names
#              for names in delegated(theirs.exported_program()).values()
#          ), "XNNPACK 把它當成浮點數 GEMM 委派"
#          mine = to_edge_transform_and_lower(float_fc, partitioner=[CoursePartitioner()])
#          assert delegated(mine.exported_program()) == delegated(
#              theirs.exported_program()
#          ), "CoursePartitioner 也一樣委派它"
#
# 延伸閱讀
# --------
# - `ExecuTorch：把模型下放到 XNNPACK
#   <https://docs.pytorch.org/executorch/stable/tutorial-xnnpack-delegate-lowering.html>`_
# - `ExecuTorch：後端 delegate 與 partitioner
#   <https://docs.pytorch.org/executorch/stable/compiler-delegate-and-partitioner.html>`_
# - `ExecuTorch：記憶體規劃
#   <https://docs.pytorch.org/executorch/stable/compiler-memory-planning.html>`_
#
# 下一課
# ------
# :ref:`M06-3 · 由內而外看 .pte
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>` 打開這個程式序列化成的檔案，
# 執行並量測它。
