"""
M02-1 quantizer 在圖上寫了什麼
==============================

PT2E 的 quantizer 不改圖，它只在某些 node 上留下一張便條
``node.meta["quantization_annotation"]`` ，寫明哪些輸入、哪個輸出要量化，以及怎麼量化。
``prepare_pt2e`` 之後做的每一件事，都是照這些便條來的。本課讀出課程自己的 quantizer
（ ``common.quantizer.CourseQuantizer`` ，大約 100 行）在 ``small_cnn`` 上寫的便條，
和 ``X86InductorQuantizer`` 的便條比一比，最後證明 torchao 真正的
``prepare_pt2e`` ／ ``convert_pt2e`` 不用改一行就能接受課程的 quantizer。

**你會學到**

- annotation 的三個欄位： ``input_qspec_map`` 、 ``output_qspec`` 、 ``_annotated``
- ``QuantizationSpec`` 寫了什麼， ``SharedQuantizationSpec`` 又指向哪裡
- 兩個 quantizer 為什麼會在同一張圖上做出不同的標註

**先備知識**：M01-1（PT2E 全流程）、M00-3（找出 pattern）。
"""

# %%
# 準備
# ----
# ``prepare_pt2e`` 會在呼叫 quantizer 之前先把 BatchNorm 併進 conv，所以這裡也先用
# ``handmade.fold_batch_norm`` 做一樣的事（M02-2 會說明）。 ``notes`` 列出圖裡有標註的 node。

import torch

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    QuantizationSpec,
    SharedQuantizationSpec,
)

from common import handmade  # noqa: E402
from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer  # noqa: E402


def notes(gm):
    """node 名稱 → 它的量化標註，只列出有標註的 node。"""
    return {
        node.name: node.meta["quantization_annotation"]
        for node in gm.graph.nodes
        if "quantization_annotation" in node.meta
    }


x = example_inputs(8)
gm = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm)
code_before = gm.code

# %%
# 步驟 1 — 讓 quantizer 標註
# --------------------------
# ``annotate`` 走過整張圖、寫下便條。圖的程式碼完全沒變：沒有新增 node，也沒有改接任何邊。

quantizer = CourseQuantizer()
quantizer.annotate(gm)
ours = notes(gm)
print("有標註的 node：", list(ours))
assert gm.code == code_before, "annotate 只寫 node.meta"
assert list(ours) == ["conv2d", "relu", "max_pool2d", "flatten", "linear"]
draw(gm, highlight=list(ours), title="步驟 1：CourseQuantizer 標註的 node")

# %%
# 步驟 2 — 讀一張標註
# --------------------
# ``input_qspec_map`` 把「輸入 node」對應到一個 spec：從那個 node 連進來的這條邊要量化。
# conv 要量化輸入 ``x`` 和 weight，bias 不量化。它的 ``output_qspec`` 是 ``None`` ：
# conv 唯一的使用者是 relu，所以課程的 quantizer 改在 relu 之後量化
# （後端會把 conv+relu 融合成一個運算來跑）。

conv = ours["conv2d"]
names = {id(ACTIVATION_SPEC): "ACTIVATION_SPEC", id(WEIGHT_SPEC): "WEIGHT_SPEC"}
print({source.name: names[id(spec)] for source, spec in conv.input_qspec_map.items()})
print("output_qspec:", conv.output_qspec, "   _annotated:", conv._annotated)
assert [n.name for n in conv.input_qspec_map] == ["x", "conv_weight"], "bias 保持浮點數"
assert conv.input_qspec_map[next(iter(conv.input_qspec_map))] is ACTIVATION_SPEC
assert conv.output_qspec is None and ours["relu"].output_qspec is ACTIVATION_SPEC
assert conv._annotated, "_annotated 告訴其他 quantizer：這個 node 已經有人處理了"

# %%
# 步驟 3 — QuantizationSpec 寫了什麼
# ----------------------------------
# spec 寫明整數型別和範圍、量化方式（qscheme），以及要用哪一種 observer 來量測這個 tensor。
# weight 沿著第 0 軸逐 channel 量化（每個輸出 channel 一個 scale），而且是對稱的：
# zero point 會是 0，範圍取 [-127, 127] 讓正負兩邊一樣寬。

for name, spec in [("activation", ACTIVATION_SPEC), ("weight", WEIGHT_SPEC)]:
    print(
        f"{name:10}  dtype={spec.dtype}  range=[{spec.quant_min}, {spec.quant_max}]  "
        f"qscheme={spec.qscheme}  ch_axis={spec.ch_axis}  "
        f"observer={spec.observer_or_fake_quant_ctr.__name__}"
    )
assert WEIGHT_SPEC.qscheme == torch.per_channel_symmetric and WEIGHT_SPEC.ch_axis == 0
assert -WEIGHT_SPEC.quant_min == WEIGHT_SPEC.quant_max == 127
assert ACTIVATION_SPEC.qscheme == torch.per_tensor_affine
assert isinstance(ACTIVATION_SPEC, QuantizationSpec) and isinstance(WEIGHT_SPEC, QuantizationSpec)

# %%
# 步驟 4 — SharedQuantizationSpec：「跟那裡用同一組數字」
# -------------------------------------------------------
# max pooling 只是從輸入裡挑值，所以輸出可以沿用輸入的 scale 和 zero point。
# 它的 ``output_qspec`` 不是自己的 spec，而是指向 ``relu → max_pool2d`` 這條邊。
# flatten 也一樣，指向 ``max_pool2d → flatten`` 。

for name in ["max_pool2d", "flatten"]:
    shared = ours[name].output_qspec
    source, user = shared.edge_or_node
    print(f"{name}.output_qspec = SharedQuantizationSpec(({source.name}, {user.name}))")
    assert isinstance(shared, SharedQuantizationSpec) and user.name == name
assert ours["max_pool2d"].output_qspec.edge_or_node[0].name == "relu"

# %%
# 步驟 5 — 換一個 quantizer，便條就不同
# --------------------------------------
# ``X86InductorQuantizer`` 在另一份相同的圖上標註了同樣的 node，但做了不同的選擇：
# activation 用無號的 [0, 255]、bias 明寫 ``None`` 、relu 沒有輸出 spec
# （relu 的輸出會被量化，只是因為 pooling 的輸入邊要求），最後一個 linear 的輸出保持浮點數。


def summary(annotation):
    inputs = {n.name: getattr(s, "dtype", None) for n, s in annotation.input_qspec_map.items()}
    output = annotation.output_qspec
    kind = type(output).__name__.replace("QuantizationSpec", "") if output else "-"
    return f"inputs={inputs}  output={kind or 'Spec'}"


gm_x86 = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm_x86)
theirs = notes(x86_quantizer().annotate(gm_x86))
for name in ours:
    print(f"{name:10}  課程：{summary(ours[name])}\n{'':10}  x86： {summary(theirs[name])}")
assert list(theirs) == list(ours), "標註的是同一批 node"
assert theirs["conv2d"].input_qspec_map[gm_x86.graph.find_nodes(op="placeholder")[0]].dtype == (
    torch.uint8
)
assert theirs["relu"].output_qspec is None and theirs["linear"].output_qspec is None
assert isinstance(theirs["max_pool2d"].output_qspec, SharedQuantizationSpec)

# %%
# 步驟 6 — torchao 的 prepare 和 convert 接受課程的 quantizer
# ------------------------------------------------------------
# quantizer 說穿了就是標註，所以 torchao 的兩個步驟不用改就能用我們的 quantizer。
# 量化後的模型和浮點模型很接近：輸出大約是 1 的量級，最大差距只有百分之幾。

model = get_model("small_cnn")
prepared = prepare_pt2e(export_module(model, x), CourseQuantizer())
calibrate(prepared)
quantized = convert_pt2e(prepared)
with torch.no_grad():
    error = (quantized(*x) - model(*x)).abs().max().item()
    size = model(*x).abs().max().item()
print(f"量化後與浮點的最大差距 = {error:.4f}   （浮點輸出最大絕對值 = {size:.2f}）")
assert error < 0.05 * size, "int8 讓輸出誤差保持在輸出範圍的 5% 以內"
qdq = [n.name for n in quantized.graph.nodes if "quantize_per" in str(n.target)]
draw(quantized, highlight=qdq, title="步驟 6：torchao 的 convert_pt2e 搭配 CourseQuantizer")

# %%
# 小結
# ----
# quantizer 只在它在乎的 node 上各寫一張 ``QuantizationAnnotation`` ：輸入邊的 spec、
# 輸出的 spec，或是借用另一條邊數字的 ``SharedQuantizationSpec`` ，除此之外什麼都不做。
# 下一課 :ref:`sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py` 我們親手把這些便條
# 變成 observer，並確認得到的圖和 ``prepare_pt2e`` 的完全相同。
