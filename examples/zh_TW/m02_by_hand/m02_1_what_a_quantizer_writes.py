"""
M02-1 quantizer 在圖上寫了什麼
==============================

PT2E quantizer 的 ``annotate`` 不改圖，它只在某些 node 上留下一張便條
``node.meta["quantization_annotation"]``，寫明哪些輸入、哪個輸出要量化，以及怎麼量化。
``prepare_pt2e`` 之後做的每一件事，都是照這些便條來的。本課讀出課程自己的 quantizer
（``common.quantizer.CourseQuantizer``）在 ``small_cnn`` 上寫的便條，
和 ``X86InductorQuantizer`` 的便條比一比，最後證明 torchao 真正的
``prepare_pt2e``／``convert_pt2e`` 不用改一行就能接受課程的 quantizer。

**你會學到**

- annotation 的四個欄位：``input_qspec_map``、``output_qspec``、
  ``allow_implicit_sharing``、``_annotated``
- ``QuantizationSpec`` 寫了什麼，``SharedQuantizationSpec`` 又指向哪裡
- ``prepare_pt2e`` 依什麼順序呼叫 quantizer，哪一個呼叫可能改圖

**先備知識**：
:ref:`M01-1 · PT2E 全流程 <sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`、
:ref:`M00-3 · 找出模式 <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``prepare_pt2e`` 會在呼叫 quantizer 之前先把 BatchNorm 併進 conv（步驟 2 會看到），
# 所以這裡也先用 ``handmade.fold_batch_norm`` 做一樣的事（M02-2 會說明）。

import dataclasses

import torch

from common.charts import pad
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    SharedQuantizationSpec,
)

from common import handmade
from common.quantizer import ACTIVATION_SPEC, WEIGHT_SPEC, CourseQuantizer

aten = torch.ops.aten
x = example_inputs(8)
gm = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm)
code_before = gm.code

# %%
# 輔助函式：``notes`` 列出圖裡有標註的 node，``summary`` 把一張標註縮成一行，
# ``observer_calls`` 列出 prepare 後的圖裡的 observer node；另外兩個以課程 quantizer
# 為基礎的小 quantizer，一個記下 ``prepare_pt2e`` 呼叫了什麼，一個在 max pool 上關掉隱式共用。


def notes(gm):
    """node 名稱 → 它的量化標註，只列出有標註的 node。"""
    return {
        node.name: node.meta["quantization_annotation"]
        for node in gm.graph.nodes
        if "quantization_annotation" in node.meta
    }


def summary(annotation):
    inputs = {n.name: getattr(s, "dtype", None) for n, s in annotation.input_qspec_map.items()}
    output = annotation.output_qspec
    kind = type(output).__name__.replace("QuantizationSpec", "") if output else "-"
    return f"inputs={inputs}  output={kind or 'Spec'}"


def observer_calls(prepared):
    return [n for n in prepared.graph.nodes if handmade.is_observer_node(prepared, n)]


class RecordingQuantizer(CourseQuantizer):
    """課程的 quantizer，另外記下 prepare_pt2e 的每一次呼叫，以及當時圖裡還有沒有 BatchNorm。"""

    def __init__(self):
        super().__init__()
        self.calls = []

    def _note(self, name, model):
        batch_norm = model.graph.find_nodes(op="call_function", target=aten.batch_norm.default)
        self.calls.append((name, "還有 batch_norm" if batch_norm else "沒有 batch_norm"))

    def transform_for_annotation(self, model):
        self._note("transform_for_annotation", model)
        return super().transform_for_annotation(model)

    def annotate(self, model):
        self._note("annotate", model)
        return super().annotate(model)

    def validate(self, model):
        self._note("validate", model)
        return super().validate(model)


class NoImplicitSharingAtPool(CourseQuantizer):
    """課程的 quantizer，但 max pool 的標註設 allow_implicit_sharing=False。"""

    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.max_pool2d.default):
            node.meta["quantization_annotation"].allow_implicit_sharing = False
        return model


# %%
# 步驟 1 — 讓 quantizer 標註
# --------------------------
# ``annotate`` 走過整張圖、寫下便條。圖的程式碼完全沒變：沒有新增 node，也沒有改接任何邊。

quantizer = CourseQuantizer()
quantizer.annotate(gm)
ours = notes(gm)
print(f"有標註的 node：{list(ours)}")
assert gm.code == code_before, "annotate 只寫 node.meta，程式碼不變"
assert list(ours) == ["conv2d", "relu", "max_pool2d", "flatten", "linear"], "五個 node 有便條"
draw(gm, highlight=list(ours), title="步驟 1：CourseQuantizer 標註的 node")

# %%
# 步驟 2 — prepare_pt2e 依序呼叫什麼
# ----------------------------------
# ``prepare_pt2e`` 先併掉 BatchNorm，再依序呼叫 quantizer 的三個方法：
# ``transform_for_annotation``、``annotate``、``validate``。第一個「可能」改寫圖
# （例如把後端無法量化的運算拆開），並回傳要標註的模型；
# 只有 ``annotate`` 照約定不改圖（它只寫 ``node.meta``）。
# 課程的 quantizer 和 ``X86InductorQuantizer`` 都沿用預設實作，原封不動回傳圖
# （M02-4 會寫一個真的改圖的版本）。

recorder = RecordingQuantizer()
prepare_pt2e(export_module(get_model("small_cnn"), x), recorder)
for call in recorder.calls:
    print(call)
assert [name for name, _ in recorder.calls] == [
    "transform_for_annotation",
    "annotate",
    "validate",
], "依序：transform、annotate、validate"
assert recorder.calls[0][1] == "沒有 batch_norm", "quantizer 開始之前，BatchNorm 已經併掉了"
plain = export_module(get_model("small_cnn"), x)
code = plain.code
for default in [CourseQuantizer(), x86_quantizer()]:
    assert default.transform_for_annotation(plain).code == code, "預設實作：不改圖"

# %%
# 步驟 3 — 讀一張標註
# --------------------
# ``QuantizationAnnotation`` 有四個欄位。``input_qspec_map`` 把「輸入 node」對應到一個
# spec：從那個 node 連進來的這條邊要量化。conv 要量化輸入 ``x`` 和 weight，bias 不量化。
# 它的 ``output_qspec`` 是 ``None``：conv 唯一的使用者是 relu，所以課程的 quantizer
# 改在 relu 之後量化（後端會把 conv+relu 融合成一個運算來跑）。
# ``allow_implicit_sharing`` （步驟 5）和 ``_annotated`` 接著看。

print([field.name for field in dataclasses.fields(QuantizationAnnotation)])
conv = ours["conv2d"]
names = {id(ACTIVATION_SPEC): "ACTIVATION_SPEC", id(WEIGHT_SPEC): "WEIGHT_SPEC"}
print({source.name: names[id(spec)] for source, spec in conv.input_qspec_map.items()})
print("output_qspec:", conv.output_qspec, "   _annotated:", conv._annotated)
assert [f.name for f in dataclasses.fields(QuantizationAnnotation)] == [
    "input_qspec_map",
    "output_qspec",
    "allow_implicit_sharing",
    "_annotated",
], "annotation 有四個欄位"
assert [n.name for n in conv.input_qspec_map] == ["x", "conv_weight"], "bias 保持浮點數"
assert conv.input_qspec_map[next(iter(conv.input_qspec_map))] is ACTIVATION_SPEC, (
    "輸入 x 用 ACTIVATION_SPEC"
)
assert conv.output_qspec is None and ours["relu"].output_qspec is ACTIVATION_SPEC, (
    "conv 的輸出在它的 relu 之後才量化"
)
assert conv._annotated, "_annotated 告訴其他 quantizer：這個 node 已經有人處理了"

# %%
# 步驟 4 — QuantizationSpec 寫了什麼
# ----------------------------------
# spec 寫明整數型別和範圍、量化方式（qscheme），以及要用哪一種 observer 來量測這個張量。
# weight 沿著第 0 軸做 per-channel 量化（每個輸出通道一個 scale），而且是對稱的：
# zero point 會是 0，範圍取 [-127, 127] 讓正負兩邊一樣寬。

for name, spec in [("activation", ACTIVATION_SPEC), ("weight", WEIGHT_SPEC)]:
    print(
        f"{name:10}  dtype={spec.dtype}  range=[{spec.quant_min}, {spec.quant_max}]  "
        f"qscheme={spec.qscheme}  ch_axis={spec.ch_axis}  "
        f"observer={spec.observer_or_fake_quant_ctr.__name__}"
    )
assert WEIGHT_SPEC.qscheme == torch.per_channel_symmetric and WEIGHT_SPEC.ch_axis == 0, (
    "weight：沿第 0 軸 per-channel、對稱量化"
)
assert -WEIGHT_SPEC.quant_min == WEIGHT_SPEC.quant_max == 127, "對稱的範圍 [-127, 127]"
assert ACTIVATION_SPEC.qscheme == torch.per_tensor_affine, "活化值：per-tensor、仿射"
assert isinstance(ACTIVATION_SPEC, QuantizationSpec) and isinstance(
    WEIGHT_SPEC, QuantizationSpec
), "兩者都是 QuantizationSpec"

# %%
# 步驟 5 — SharedQuantizationSpec 與 allow_implicit_sharing
# ---------------------------------------------------------
# max pooling 只是從輸入裡挑值，所以輸出可以沿用輸入的 scale 和 zero point。
# 它的 ``output_qspec`` 不是自己的 spec，而是指向 ``relu → max_pool2d`` 這條邊。
# flatten 也一樣，指向 ``max_pool2d → flatten``。

for name in ["max_pool2d", "flatten"]:
    shared = ours[name].output_qspec
    source, user = shared.edge_or_node
    print(f"{name}.output_qspec = SharedQuantizationSpec(({source.name}, {user.name}))")
    assert isinstance(shared, SharedQuantizationSpec) and user.name == name, (
        f"{name} 的輸出沿用自己輸入邊的數字"
    )
assert ours["max_pool2d"].output_qspec.edge_or_node[0].name == "relu", "pool 指向 relu → max_pool2d"

# %%
# 這種指向是「明確共用」。``relu → max_pool2d`` 這條邊上流的就是 relu 的輸出，兩處要的也都是
# ``ACTIVATION_SPEC``：``allow_implicit_sharing`` 為 ``True`` （預設值）時，prepare
# 讓它們共用一個 observer，這就是「隱式共用」（M02-2 步驟 3）。在 max pool 上關掉它，
# pool 的輸入邊就有自己的 observer：多一次 observer 呼叫，也多一個 observer。

sharing = {name: a.allow_implicit_sharing for name, a in ours.items()}
print(f"allow_implicit_sharing：{sharing}")
shared_run = prepare_pt2e(export_module(get_model("small_cnn"), x), CourseQuantizer())
separate_run = prepare_pt2e(export_module(get_model("small_cnn"), x), NoImplicitSharingAtPool())
for label, prepared in [("預設", shared_run), ("在 pool 上關掉", separate_run)]:
    calls = observer_calls(prepared)
    distinct = {id(prepared.get_submodule(n.target)) for n in calls}
    print(f"{pad(label, 16)} {len(calls)} 次 observer 呼叫，{len(distinct)} 個不同的 observer")
assert all(a.allow_implicit_sharing for a in ours.values()), "除非 quantizer 關掉，否則都是 True"
assert len(observer_calls(separate_run)) == len(observer_calls(shared_run)) + 1, (
    "沒有隱式共用時，relu → max_pool2d 有自己的 observer"
)
pool = separate_run.graph.find_nodes(op="call_function", target=aten.max_pool2d.default)[0]
own = pool.args[0]
assert handmade.is_observer_node(separate_run, own.args[0]), (
    "連續兩個 observer：先是 relu 的輸出，再是 pool 的輸入邊"
)
draw(separate_run, highlight=[own.name], title="步驟 5：pool 的輸入邊有自己的 observer")

# %%
# 步驟 6 — 換一個 quantizer，便條就不同
# --------------------------------------
# ``X86InductorQuantizer`` 在另一份相同的圖上標註了同樣的 node，但做了不同的選擇：
# 活化值用無號的 [0, 255]、bias 明寫 ``None``、relu 沒有輸出 spec
# （relu 的輸出會被量化，只是因為 pooling 的輸入邊要求），最後一個 linear 的輸出保持浮點數。

gm_x86 = export_module(get_model("small_cnn"), x)
handmade.fold_batch_norm(gm_x86)
theirs = notes(x86_quantizer().annotate(gm_x86))
for name in ours:
    print(f"{name:10}  課程：{summary(ours[name])}\n{'':10}  x86： {summary(theirs[name])}")
assert list(theirs) == list(ours), "標註的是同一批 node"
x86_input = theirs["conv2d"].input_qspec_map[gm_x86.graph.find_nodes(op="placeholder")[0]]
assert (x86_input.dtype, x86_input.quant_min, x86_input.quant_max) == (torch.uint8, 0, 255), (
    "x86：無號的活化值，範圍 [0, 255]"
)
bias = {n.name: spec for n, spec in theirs["conv2d"].input_qspec_map.items()}["conv_bias"]
assert bias is None, "x86 明寫 bias，值是 None：保持浮點數"
assert theirs["relu"].output_qspec is None and theirs["linear"].output_qspec is None, (
    "x86：relu 沒有輸出 spec，linear 的輸出保持浮點數"
)
assert isinstance(theirs["max_pool2d"].output_qspec, SharedQuantizationSpec), (
    "x86 也讓 pool 共用數字"
)

# %%
# 步驟 7 — torchao 的 prepare 和 convert 接受課程的 quantizer
# ------------------------------------------------------------
# quantizer 說穿了就是標註，所以 torchao 的兩個步驟不用改就能用我們的 quantizer。
# 量化後的模型和浮點模型很接近：輸出大約是 1 的量級，下面印出的最大差距只有百分之幾。

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
draw(quantized, highlight=qdq, title="步驟 7：torchao 的 convert_pt2e 搭配 CourseQuantizer")

# %%
# 小結
# ----
# quantizer 只在它在乎的 node 上各寫一張 ``QuantizationAnnotation``：輸入邊的 spec、
# 輸出的 spec，或是借用另一條邊數字的 ``SharedQuantizationSpec``；
# ``allow_implicit_sharing`` 讓 prepare 合併流著同一個張量的地方。
# ``annotate`` 除此之外什麼都不改；``prepare_pt2e`` 先呼叫的
# ``transform_for_annotation`` 才是 quantizer 可以改寫圖的地方。

# %%
# 練習
# ----
# 1. 標註 ``linear_relu`` （先 export，再呼叫 ``CourseQuantizer().annotate``）。
#    哪些 node 有便條？輸出 spec 在哪一個 node 上？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          other = CourseQuantizer().annotate(export_module(get_model("linear_relu"), x))
#          print({name: summary(a) for name, a in notes(other).items()})
#          assert list(notes(other)) == ["linear", "relu"], "flatten 的輸入沒有量化"
#          assert notes(other)["linear"].output_qspec is None
#          assert notes(other)["relu"].output_qspec is ACTIVATION_SPEC
#
# 2. 把「每一張」標註的 ``allow_implicit_sharing`` 都關掉，不只 pool 的。
#    ``prepare_pt2e`` 在 ``small_cnn`` 上會插入幾次 observer 呼叫？有幾個不同的 observer？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          class NoImplicitSharing(CourseQuantizer):
#              def annotate(self, model):
#                  super().annotate(model)
#                  for annotation in notes(model).values():
#                      annotation.allow_implicit_sharing = False
#                  return model
#
#          none_shared = prepare_pt2e(export_module(get_model("small_cnn"), x), NoImplicitSharing())
#          calls = observer_calls(none_shared)
#          distinct = {id(none_shared.get_submodule(n.target)) for n in calls}
#          print(len(calls), "次呼叫，分屬", len(distinct), "個 observer")
#          assert (len(calls), len(distinct)) == (10, 8), "pool、flatten、linear 的輸入各有自己的"
#
# 3. 把 ``X86InductorQuantizer`` 的便條交給 torchao 的 ``prepare_pt2e``
#    （用 ``x86_quantizer()``）。linear 的輸出會有 observer 嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          x86_prepared = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
#          linear = x86_prepared.graph.find_nodes(op="call_function", target=aten.linear.default)[0]
#          print([user.name for user in linear.users])
#          assert not any(handmade.is_observer_node(x86_prepared, u) for u in linear.users), (
#              "output_qspec 是 None：linear 的輸出保持浮點數"
#          )

# %%
# 延伸閱讀
# --------
# - `PT2E 量化總覽（torchao） <https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html>`__
# - `為 PT2E 量化撰寫 quantizer（PyTorch 教學）
#   <https://docs.pytorch.org/tutorials/prototype/pt2e_quantizer.html>`__
# - :ref:`M05-1 · quantizer 在 attention 裡看見什麼
#   <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`：同一個問題放到 Transformer 上
# - :ref:`疑難排解：匯入與匯出
#   <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`：同樣的錯誤，依錯誤訊息查

# %%
# **下一課**：:ref:`M02-2 · 親手做 prepare <sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py>`
# 親手把這些便條變成 observer，並確認得到的圖和 ``prepare_pt2e`` 的完全相同。
