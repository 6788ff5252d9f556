"""
M02-3 親手做 convert
====================

``convert_pt2e`` 把每個校正過的 observer 換成一對 quantize／dequantize，帶上 observer 算出的
scale 和 zero point；讓每個被量化的運算都有自己的 dequantize；並把常數 weight 預先量化，
讓圖裡直接存 int8。本課用 M00-4 的動作（步驟 4～6）把這些改動逐一親手做完，最後得到的模型
輸出和 ``convert_pt2e`` 的結果 ``torch.equal`` ：不是很接近，而是完全相同。

**你會學到**

- observer 如何變成 ``quantize → dequantize`` ：per-tensor 與 per-channel
- 為什麼被兩個運算共用的 dequantize 要複製一份
- ``fold_quantize=True`` 對 weight 做了什麼

**先備知識**：M00-4（步驟 4～6）、M01-2、M02-2。
"""

# %%
# 準備
# ----
# 和 M02-2 一樣的 ``small_cnn`` 與課程 quantizer，prepare 兩份、用相同的資料校正：
# ``gm`` 給我們親手改， ``reference`` 交給 ``convert_pt2e`` 。

from collections import Counter

import torch
from torch import nn

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

from common import handmade  # noqa: E402
from common.quantizer import CourseQuantizer  # noqa: E402

qd = torch.ops.quantized_decomposed


def call_functions(gm):
    """圖裡 call_function 的 target 及其個數。"""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


x = example_inputs(8)
gm = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
reference = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(gm)
calibrate(reference)
reference = convert_pt2e(reference)
graph = gm.graph
nodes = {node.name: node for node in graph.nodes}
draw(gm, title="之前：校正過的 observer")

# %%
# 步驟 1 — per-tensor observer 變成 quantize → dequantize
# -------------------------------------------------------
# ``calculate_qparams`` 把 observer 的統計值換算成 scale 和 zero point（M01-3）。
# per-tensor 時它們就是寫在參數裡的 Python 數字。這一對 node 插在 observer「之前」
# （ ``inserting_before`` ），接手它的下游，再把 observer node 刪掉。

observer_node = nodes["activation_post_process_0"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
qparams = (float(scale), int(zero_point), observer.quant_min, observer.quant_max, torch.int8)
with graph.inserting_before(observer_node):
    q = graph.call_function(qd.quantize_per_tensor.default, (nodes["x"], *qparams))
    dq = graph.call_function(qd.dequantize_per_tensor.default, (q, *qparams))
observer_node.replace_all_uses_with(dq)
graph.erase_node(observer_node)
print(dq.format_node())
assert nodes["conv2d"].args[0] is dq and q.args[0] is nodes["x"]

# %%
# 步驟 2 — per-channel observer：qparams 變成 buffer
# --------------------------------------------------
# weight 每個輸出 channel 有一個 scale：這是 tensor，所以存成 buffer，再由 ``get_attr`` 讀出
# （M00-4 步驟 5）。torchao 用被觀察 node 所屬的模組來命名 buffer；weight 的 ``get_attr``
# 不屬於任何模組，所以名字就是 ``_scale_0`` 和 ``_zero_point_0`` 。

observer_node = nodes["activation_post_process_1"]
observer = gm.get_submodule(observer_node.target)
scale, zero_point = observer.calculate_qparams()
gm.register_buffer("_scale_0", scale)
gm.register_buffer("_zero_point_0", zero_point)
with graph.inserting_before(observer_node):
    qparams = (
        graph.get_attr("_scale_0"),
        graph.get_attr("_zero_point_0"),
        0,
        -127,
        127,
        torch.int8,
    )
    q_w = graph.call_function(qd.quantize_per_channel.default, (nodes["conv_weight"], *qparams))
    dq_w = graph.call_function(qd.dequantize_per_channel.default, (q_w, *qparams))
observer_node.replace_all_uses_with(dq_w)
graph.erase_node(observer_node)
print(f"{scale.shape[0]} 個 scale，zero point 只有 {zero_point.unique().tolist()}")
assert scale.shape == (8,) and torch.equal(zero_point, torch.zeros(8, dtype=zero_point.dtype))

# %%
# 步驟 3 — 其餘的 observer，然後清理
# ----------------------------------
# ``handmade.replace_observer`` 對任何 observer 做步驟 1 和 2 的事。共用的 observer 會被好幾個
# node 呼叫：每一次呼叫各自變成一對 q／dq，數字相同。接著是例行的清理（M00-4 步驟 6）：
# 刪掉死碼、建立只保留圖裡用得到的東西的新 ``GraphModule`` 、刪掉 observer 子模組。

scopes = gm.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(graph.nodes):
    if handmade.is_observer_node(gm, node):
        handmade.replace_observer(gm, node, scopes)
graph.eliminate_dead_code()
gm = torch.fx.GraphModule(gm, graph)
gm.delete_all_unused_submodules()
graph.lint()
qdq = [n.name for n in gm.graph.nodes if "quantize_per" in str(n.target)]
draw(gm, highlight=qdq, title="步驟 3：每個 observer 都成了 quantize → dequantize")
assert not any(handmade.is_observer_node(gm, n) for n in gm.graph.nodes if n.op == "call_module")
assert len(qdq) == 14, "7 個 observer 呼叫，各變成 2 個 node"

# %%
# 步驟 4 — 被兩個運算共用的 dequantize 要複製
# --------------------------------------------
# ``small_cnn`` 裡沒有這種情況，所以改用兩個 conv 讀同一個輸入的小模型。輸入的 observer
# 變成一個有兩個下游的 dequantize。後端會把 ``dequantize → conv → quantize`` 融合成一個整數
# conv，這需要 dequantize 專屬於那個 conv，所以 convert 替每個有標註的下游各複製一份
# （ ``node_copy`` ）。


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x) + self.b(x)


side = handmade.prepare(export_module(TwoBranches().eval(), x), CourseQuantizer())
calibrate(side)
side_scopes = side.meta["_observed_graph_module_attrs"].node_name_to_scope
for node in list(side.graph.nodes):
    if handmade.is_observer_node(side, node):
        handmade.replace_observer(side, node, side_scopes)
dq_op = qd.dequantize_per_tensor.default
shared = [n for n in side.graph.find_nodes(op="call_function", target=dq_op) if len(n.users) > 1]
print("共用的：", [(n.name, [u.name for u in n.users]) for n in shared])
q_x = shared[0].args[0]
handmade.duplicate_shared_dequantize(side)
copies = [
    n.name for n in side.graph.find_nodes(op="call_function", target=dq_op) if n.args[0] is q_x
]
print("之後：", copies)
draw(side, highlight=copies, title="步驟 4：每個 conv 一個 dequantize")
assert len(shared) == 1 and len(copies) == 2, "一個有兩個下游的 dequantize 變成兩個"
assert all(len(n.users) == 1 for n in side.graph.nodes if n.name in copies)

# %%
# 在 ``small_cnn`` 上同一個步驟什麼都不會改；convert 照樣會執行它：

before = gm.code
handmade.duplicate_shared_dequantize(gm)
assert gm.code == before, "small_cnn 沒有任何 dequantize 有兩個下游"

# %%
# 步驟 5 — 預先量化 weight
# ------------------------
# ``get_attr(weight) → quantize`` 只依賴常數，所以結果可以現在就算好存起來：一個 int8 的凍結參數
# ``_frozen_param0`` ，由一個沿用 quantize node 名字的 ``get_attr`` 讀取。
# 浮點 weight 從此不再被圖讀取。

q_w = next(n for n in gm.graph.nodes if n.target == qd.quantize_per_channel.default)
weight = gm.conv.weight
int8_weight = q_w.target(weight, gm._scale_0, gm._zero_point_0, *q_w.args[3:])
gm.register_buffer("_frozen_param0", int8_weight)
with gm.graph.inserting_before(q_w):
    frozen = gm.graph.get_attr("_frozen_param0")
q_w.replace_all_uses_with(frozen)
gm.graph.erase_node(q_w)
frozen.name = q_w.name
print(f"{int8_weight.dtype}，範圍 [{int8_weight.min()}, {int8_weight.max()}]")
assert int8_weight.dtype == torch.int8 and int8_weight.abs().max() == 127, "對稱量化：±127"

# %%
# ``handmade.fold_weight_quantize`` 對 linear 的 weight 做同樣的事，刪掉沒人讀的
# ``get_attr`` node，最後用 ``lint`` 檢查。

handmade.fold_weight_quantize(gm)
frozen_nodes = [n.name for n in gm.graph.nodes if n.op == "get_attr" and "quantize" in n.name]
draw(gm, highlight=frozen_nodes, title="步驟 5：int8 weight 成為常數")
assert not gm.graph.find_nodes(op="call_function", target=qd.quantize_per_channel.default)
assert torch.equal(gm._frozen_param1, reference._frozen_param1), "linear 的 int8 weight"

# %%
# 步驟 6 — 和 convert_pt2e 比對
# -----------------------------
# 程式碼相同、運算的種類和個數相同，而且（這正是整個模組的重點）在校正時沒看過的輸入上，
# 輸出一個位元都不差。

gm.graph.lint()
gm.recompile()
fresh = example_inputs(8, seed=123)
assert call_functions(gm) == call_functions(reference)
assert gm.code == reference.code, "和 convert_pt2e 的圖相同"
assert torch.equal(gm(*fresh), reference(*fresh)), "和 convert_pt2e 逐位元相同"
print(call_functions(gm))
print("torch.equal(我們的, convert_pt2e)：", torch.equal(gm(*fresh), reference(*fresh)))

# %%
# 包裝好的 ``common.handmade.convert`` 也一樣：

packaged = handmade.prepare(export_module(get_model("small_cnn"), x), CourseQuantizer())
calibrate(packaged)
assert torch.equal(handmade.convert(packaged)(*fresh), reference(*fresh))

# %%
# 小結
# ----
# convert ＝ 每個 observer 呼叫 → ``quantize → dequantize`` （per-tensor 把數字寫在參數裡，
# per-channel 用 buffer）、清理、每個被量化的下游各有一個 dequantize，以及預先算好的常數
# weight 量化。 ``common.handmade`` 把 M02-2 和 M02-3 包裝成 ``prepare`` 與 ``convert`` ；
# 它的測試在課程的每一個模型，以及另外十一種常見的層組合上，分別搭配課程 quantizer 和
# ``X86InductorQuantizer`` ，逐一和 torchao 比對。
