"""
M02-2 親手做 prepare
====================

``prepare_pt2e`` 把 BatchNorm 併進前面的 conv、讓 quantizer 轉換並標註圖，再在每個標註
要求的地方插入 observer；必須用同一組 scale 和 zero point 的地方，共用同一個 observer。
本課在 ``small_cnn`` 上搭配課程的 quantizer，用 M00-4 的插入動作把這些事全部親手做一遍，
最後得到和 ``prepare_pt2e`` 一字不差的圖；經過相同的校準（calibration）之後，
每個 observer 的 scale 和 zero point 也完全相同。

**你會學到**

- BatchNorm 如何消失在 conv 的 weight 和 bias 裡
- 哪些邊和輸出會有 observer，什麼時候兩處共用一個
- 怎麼在一條邊上插入 observer，又怎麼沿用已經插好的

**先備知識**：
:ref:`M00-4 · 改圖 <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>` （步驟 1～3）、
:ref:`M02-1 · quantizer 在圖上寫了什麼
<sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 4

# %%
# 準備
# ----
# ``reference`` 是 torchao 對同一個模型的結果，我們做出來的每一樣東西都拿它來比對。

import copy

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw_diff

quiet()

from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

from common import handmade
from common.quantizer import CourseQuantizer

x = example_inputs(8)
model = get_model("small_cnn")
reference = prepare_pt2e(export_module(model, x), CourseQuantizer())
gm = export_module(model, x)

# %%
# 輔助函式：``place`` 寫出一個被觀察的地方，``observer_calls`` 列出 prepare 後的圖裡的
# observer node。


def place(key):
    """邊 (a, b) 寫成 'a → b'，輸出 node 寫它的名字。"""
    return f"{key[0].name} → {key[1].name}" if isinstance(key, tuple) else key.name


def observer_calls(prepared):
    return [n.name for n in prepared.graph.nodes if handmade.is_observer_node(prepared, n)]


# %%
# 步驟 1 — 把 BatchNorm 併進 conv
# --------------------------------
# eval 模式下，BatchNorm 對每個通道算 ``(y - mean) / sqrt(var + eps) * gamma + beta``：
# 這是仿射變換，可以直接併進 conv 的 weight 和 bias。
# ``torch.nn.utils.fusion.fuse_conv_bn_weights`` 算出新的 weight 和 bias；
# 接著把 batch norm 的使用者改接到 conv（M00-4 步驟 2），再把它刪掉（步驟 6）。
# 輸出只差浮點捨入誤差。

bn = model.bn
expected_w, expected_b = fuse_conv_bn_weights(
    model.conv.weight, model.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
)
before = copy.deepcopy(gm)
handmade.fold_batch_norm(gm)
print(f"現在的 node：{[n.name for n in gm.graph.nodes if n.op == 'call_function']}")
assert torch.equal(gm.conv.weight, expected_w) and torch.equal(gm.conv.bias, expected_b), (
    "conv 存的就是 fuse_conv_bn_weights 算出的 weight 和 bias"
)
assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.batch_norm.default), (
    "沒有 batch_norm node 了"
)
with torch.no_grad():
    difference = (gm(*x) - model(*x)).abs().max().item()
print(f"併入後與原模型的最大差距 = {difference:.1e}")
assert difference < 1e-5, "只差浮點捨入誤差"
draw_diff(before, gm, title="步驟 1：batch_norm 併進 conv2d")

# %%
# 步驟 2 — 列出要觀察的地方
# --------------------------
# ``annotate`` 之後，``input_qspec_map`` 裡的每條輸入邊（被觀察的邊）、每個不是 ``None`` 的
# ``output_qspec``，都是需要 observer 的地方。``handmade.collect_qspecs`` 依圖的順序列出它們。

quantizer = CourseQuantizer()
gm = quantizer.transform_for_annotation(gm)
quantizer.annotate(gm)
qspecs = handmade.collect_qspecs(gm)
for key, qspec in qspecs.items():
    print(f"{place(key):22} {type(qspec).__name__}")
assert len(qspecs) == 10, "conv 2 條邊、relu 1 個輸出、pool 和 flatten 各 2 處、linear 2 + 1"

# %%
# 步驟 3 — 決定哪些地方共用 observer
# ----------------------------------
# 同一個「共用群組」裡的地方只有一個 observer，也就只有一組 scale 和 zero point。
# 群組由兩條規則組成（用 union-find 實作，即 ``handmade.sharing_groups``）。明確共用：
# ``SharedQuantizationSpec`` 把自己所在的地方併到它指向的地方。隱式共用：
# ``relu → max_pool2d`` 這條邊上流的就是 ``relu`` 的輸出，spec 相同、
# 而且 ``allow_implicit_sharing`` 允許時（M02-1 步驟 5），兩處就併在一起。
# 這裡有六個地方併成一組：從 relu 的輸出一路到 linear 的輸入。

groups = handmade.sharing_groups(qspecs)
members = {}
for key, root in groups.items():
    members.setdefault(place(root), []).append(place(key))
for root, keys in members.items():
    print(f"{root} 的群組：{keys}")
assert members["relu"] == [
    "relu",
    "relu → max_pool2d",
    "max_pool2d",
    "max_pool2d → flatten",
    "flatten",
    "flatten → linear",
], "從 relu 的輸出到 linear 的輸入，六個地方同一組"
assert len(members) == 5, "10 個地方、5 個群組"

# %%
# 步驟 4 — 每個群組建立一個 observer
# ----------------------------------
# 每個群組的 observer 依群組第一個成員的 spec 建立：活化值用 ``MinMaxObserver``，
# 兩個 weight 用 ``PerChannelMinMaxObserver``。同一群組的成員都對應到同一個 Python 物件。

observers = handmade.create_observers(qspecs, groups)
nodes = {node.name: node for node in gm.graph.nodes}
relu, pool = nodes["relu"], nodes["max_pool2d"]
print({place(k): type(v).__name__ for k, v in observers.items()})
per_channel = [k for k, v in observers.items() if isinstance(v, PerChannelMinMaxObserver)]
assert [place(k) for k in per_channel] == ["conv_weight → conv2d", "fc_weight → linear"], (
    "兩個 weight 用 PerChannelMinMaxObserver"
)
assert all(type(v) is MinMaxObserver for k, v in observers.items() if k not in per_channel), (
    "活化值用 MinMaxObserver"
)
assert observers[relu] is observers[(relu, pool)] is observers[pool], "同一群組、同一個物件"
assert len({id(o) for o in observers.values()}) == 5, "五個群組、五個 observer"

# %%
# 步驟 5 — 親手插入輸入 observer
# ------------------------------
# conv 的兩條輸入邊各插一個新的 observer：先掛上模組（``add_submodule``），在上游 node
# 後面呼叫它（``inserting_after`` + ``call_module``），再讓 conv 改讀它。
# torchao 依插入的先後把 observer 命名為 ``activation_post_process_N`` （步驟 8 連名字一起比對）。

annotated = copy.deepcopy(gm)
graph, conv, conv_weight = gm.graph, nodes["conv2d"], nodes["conv_weight"]
for number, source in enumerate([nodes["x"], conv_weight]):
    name = f"activation_post_process_{number}"
    gm.add_submodule(name, observers[(source, conv)])
    with graph.inserting_after(source):
        observer_node = graph.call_module(name, (source,))
    conv.replace_input_with(source, observer_node)
print(conv.format_node())
assert [a.name for a in conv.args[:2]] == [
    "activation_post_process_0",
    "activation_post_process_1",
], "conv 透過新的 observer 讀輸入和 weight"

# %%
# 步驟 6 — 親手插入輸出 observer
# ------------------------------
# 輸出 observer 緊接在 node 後面，而且這個 node 的「每一個」使用者都改讀它：就是 M00-4 的
# ``replace_all_uses_with`` 加上 ``delete_user_cb``，免得 observer 讀到自己。

gm.add_submodule("activation_post_process_2", observers[relu])
with graph.inserting_after(relu):
    relu_observer = graph.call_module("activation_post_process_2", (relu,))
relu.replace_all_uses_with(relu_observer, delete_user_cb=lambda user: user is not relu_observer)
gm.recompile()
assert pool.args[0] is relu_observer and relu_observer.args == (relu,), (
    "pool 讀 observer，observer 讀 relu"
)
draw_diff(annotated, gm, title="步驟 5～6：親手插入三個 observer")

# %%
# 步驟 7 — 沿用，以及交給 handmade 做完其餘部分
# ----------------------------------------------
# pooling 的輸入邊屬於 relu 的群組，而 relu 的 observer 已經在這條邊上了：不插新 node。
# pooling 的輸出也在同一群組，所以它得到同一個 observer 物件（共用 observer）的
# 「第二次呼叫」，換一個名字。``handmade.observe_node`` 就是針對單一 node
# 處理這些情況；我們用它處理 pooling、flatten 和 linear。

before = copy.deepcopy(gm)
for name in ["max_pool2d", "flatten", "linear"]:
    handmade.observe_node(gm, nodes[name], observers)
gm.recompile()
for line in gm.code.splitlines():
    if "= self.activation_post_process" in line:
        print(line.split(";")[0].strip())
assert pool.args[0] is relu_observer, "沿用了現有的 observer，沒有插入新的"
assert gm.activation_post_process_3 is gm.activation_post_process_2, "共用的 observer"
draw_diff(before, gm, title="步驟 7：其餘的部分，沿用 relu 的 observer")

# %%
# 步驟 8 — 和 prepare_pt2e 比對
# -----------------------------
# 我們的圖和 torchao 的程式碼逐行相同。經過相同的校準之後，每個 observer 的 scale 和
# zero point 也一個位元都不差。

inserted = observer_calls(gm)
draw_diff(annotated, gm, title="之後：親手做的 prepare")
assert gm.code == reference.code, "和 prepare_pt2e 的圖相同"
calibrate(gm)
calibrate(reference)
for name in inserted:
    ours, theirs = gm.get_submodule(name), reference.get_submodule(name)
    for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True):
        assert torch.equal(a, b), f"{name}：qparams 和 prepare_pt2e 的相同"
print(f"{len(inserted)} 個 observer 呼叫，圖和 qparams 都完全相同")

# %%
# ``common.handmade.prepare`` 把這些步驟包裝起來（另外記下 torchao 的 ``convert_pt2e``
# 需要的資訊，讓它也能接手）。它得到的也是 torchao 的圖：

packaged = handmade.prepare(export_module(model, x), CourseQuantizer())
assert packaged.code == reference.code, "handmade.prepare == prepare_pt2e"
print("handmade.prepare(...).code == prepare_pt2e(...).code:", packaged.code == reference.code)

# %%
# 小結
# ----
# prepare = 併掉 BatchNorm、轉換與標註、把標註的地方分組（明確共用與隱式共用）、
# 每組一個 observer、插入：在上游後面新增 ``call_module``，或沿用已經在那裡的 observer。

# %%
# 練習
# ----
# 1. 用 ``handmade.prepare`` 處理 ``conv_bn_relu``。會有幾次 observer 呼叫？
#    圖還是和 ``prepare_pt2e`` 的相同嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          ours = handmade.prepare(export_module(get_model("conv_bn_relu"), x), CourseQuantizer())
#          theirs = prepare_pt2e(export_module(get_model("conv_bn_relu"), x), CourseQuantizer())
#          print(observer_calls(ours))
#          assert len(observer_calls(ours)) == 3, "conv 的輸入和 weight，以及 relu 的輸出"
#          assert ours.code == theirs.code
#
# 2. 一個張量被兩個 conv 讀取：兩條輸入邊要的是同一個 spec。
#    共用的輸入 ``x`` 會有幾個 observer？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from torch import nn
#
#          class TwoReaders(nn.Module):
#              def __init__(self):
#                  super().__init__()
#                  self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
#
#              def forward(self, x):
#                  return self.a(x) + self.b(x)
#
#          two = handmade.prepare(export_module(TwoReaders().eval(), x), CourseQuantizer())
#          placeholder = two.graph.find_nodes(op="placeholder")[0]
#          on_x = [u.name for u in placeholder.users if handmade.is_observer_node(two, u)]
#          print(on_x)
#          assert len(on_x) == 1, "隱式共用：兩條邊流的都是 x，只要一個 observer"
#
# 3. 標註 ``small_cnn``，分組之前把每張標註的 ``allow_implicit_sharing`` 設成 ``False``。
#    ``handmade.sharing_groups`` 會分出幾組？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          fresh = export_module(get_model("small_cnn"), x)
#          handmade.fold_batch_norm(fresh)
#          CourseQuantizer().annotate(fresh)
#          for node in fresh.graph.nodes:
#              if "quantization_annotation" in node.meta:
#                  node.meta["quantization_annotation"].allow_implicit_sharing = False
#          roots = set(handmade.sharing_groups(handmade.collect_qspecs(fresh)).values())
#          print(len(roots), "組")
#          assert len(roots) == 8, "只剩明確的 SharedQuantizationSpec 還併在一起"

# %%
# 延伸閱讀
# --------
# - `torch.fx：插入與替換 node（PyTorch） <https://docs.pytorch.org/docs/stable/fx.html>`__
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`__

# %%
# **下一課**：:ref:`M02-3 · 親手做 convert <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`
# 把校準過的 observer 換成 quantize／dequantize node。
