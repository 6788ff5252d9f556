"""
M02-4 為新後端寫 quantizer
==========================

在 PT2E 裡，後端能決定的只有它的 quantizer：quantizer 走過整張圖、寫下 annotation，
其餘交給 prepare 與 convert。這一課從課程 quantizer 的程式碼出發，一次加一項功能，
把它長成一個假想整數加速器的 quantizer：int32 的 bias、``add``／``cat`` 共用 scale、
``sigmoid`` 的固定 scale、標註前的改圖，以及標註後的檢查。最後它同時通過
``common.handmade`` 與 torchao，結果逐位元相同。

**你會學到**

- ``DerivedQuantizationSpec`` 如何做出 scale = 輸入 scale × weight scale 的 int32 bias
- 何時用 ``SharedQuantizationSpec``、``FixedQParamsQuantizationSpec`` 與
  ``allow_implicit_sharing``
- ``transform_for_annotation`` 與 ``validate`` 的用途，
  以及 quantizer 在一般模型程式碼上失敗時該怎麼辦

**先備知識**：:ref:`M02-1 · quantizer 在圖上寫了什麼
<sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`、
:ref:`M02-3 · 親手做 convert <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 3

# %%
# 準備
# ----
# 一個具備真實 CNN 程式碼常見元素的區塊：conv + relu 的開頭、以 ``cat`` 接起的兩個分支、
# 就地寫成的殘差（``out += x``），以及最後的 ``sigmoid`` 閘門。

import inspect

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs
from common.pt2e import calibrate, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.observer import MinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    SharedQuantizationSpec,
)

from common import handmade
from common.quantizer import ACTIVATION_SPEC, CourseQuantizer

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.left = nn.Conv2d(8, 4, 3, padding=1)
        self.right = nn.Conv2d(8, 4, 1)
        self.mix = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        out = self.mix(torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x))], dim=1))
        out += x
        return torch.sigmoid(out)


def block():
    torch.manual_seed(0)
    return Block().eval()


x = example_inputs(4)


def prepared_by(prepare, quantizer, model=None, strict=False):
    """匯出區塊（或 ``model``），prepare 並用課程的批次校準。"""
    gm = torch.export.export(model or block(), x, strict=strict).module()
    gm = prepare(gm, quantizer)
    calibrate(gm, batches=2)
    return gm


def annotated(gm):
    return {
        n.name: n.meta["quantization_annotation"]
        for n in gm.graph.nodes
        if n.meta.get("quantization_annotation")
    }


# %%
# 步驟 1 — 讀課程的 quantizer
# ---------------------------
# 這就是 ``CourseQuantizer`` 的全部：對每個認得的 node，寫下一個
# ``QuantizationAnnotation`` （輸入的 spec、輸出的 spec），別的什麼也不做。

print(inspect.getsource(CourseQuantizer))

# %%
# 在這個區塊上，它量化 conv、relu 與 cat，而就地的 ``add_`` 與 ``sigmoid`` 留在浮點數：
# 圖在這兩處各回到 float32 一次。

course = prepared_by(handmade.prepare, CourseQuantizer())
draw(course, title="CourseQuantizer：add_ 與 sigmoid 留在浮點數")
float_ops = [
    n.name for n in course.graph.nodes if n.target in (aten.add_.Tensor, aten.sigmoid.default)
]
assert float_ops == ["add_", "sigmoid"], "殘差的 add 與 sigmoid 留在浮點數"
assert not {"add_", "sigmoid"} & set(annotated(course)), "課程的 quantizer 不碰它們"

# %%
# 步驟 2 — transform_for_annotation：一種模式取代兩種
# --------------------------------------------------------
# 真實的程式碼把殘差寫成就地運算（``out += x`` → ``aten.add_``）。prepare 會在 ``annotate``
# 之前呼叫 ``transform_for_annotation``，加速器的 quantizer 可以在那裡把 ``add_`` 改寫成
# ``add``，之後只需比對 ``aten.add``。只有在沒有別的 node 讀取 ``add_`` 會改動的張量時，
# 這個改寫才安全；程式碼會檢查這一點。


class Step2Quantizer(CourseQuantizer):
    def transform_for_annotation(self, model):
        for node in model.graph.find_nodes(op="call_function", target=aten.add_.Tensor):
            if len(node.args[0].users) == 1:  # 沒有別的 node 看得到被改動的張量
                node.target = aten.add.Tensor
        model.recompile()
        return model


step2 = prepared_by(handmade.prepare, Step2Quantizer())
assert step2.graph.find_nodes(op="call_function", target=aten.add.Tensor), "add_ 變成了 add"
assert not step2.graph.find_nodes(op="call_function", target=aten.add_.Tensor)

# %%
# 步驟 3 — 用 DerivedQuantizationSpec 做 int32 bias
# -------------------------------------------------
# 整數 conv 以 int32 累加 ``int8 × int8`` 的乘積，其 scale 為
# ``輸入 scale × weight scale``；bias 必須用同一個 scale 加上去。
# ``DerivedQuantizationSpec`` 正是表達這件事：它的 ``derive_qparams_fn`` 拿到
# ``derived_from`` 中各邊的 observer，回傳 bias 的 scale 與 zero point。


def bias_qparams(observers):
    activation, weight = observers
    activation_scale, _ = activation.calculate_qparams()
    weight_scale, weight_zero_point = weight.calculate_qparams()
    return activation_scale * weight_scale, torch.zeros_like(weight_zero_point, dtype=torch.int32)


def int32_bias(conv):
    x, weight = conv.args[:2]
    return DerivedQuantizationSpec(
        derived_from=[(x, conv), (weight, conv)],
        derive_qparams_fn=bias_qparams,
        dtype=torch.int32,
        quant_min=-(2**31),
        quant_max=2**31 - 1,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
    )


class Step3Quantizer(Step2Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for conv in model.graph.find_nodes(op="call_function", target=aten.conv2d.default):
            conv.meta["quantization_annotation"].input_qspec_map[conv.args[2]] = int32_bias(conv)
        return model


step3 = prepared_by(handmade.prepare, Step3Quantizer())

# %%
# 校準之後，每個 bias observer 的 scale 在每個通道上都正好是它所依據的兩個 observer 的乘積：

stem = next(iter(step3.graph.find_nodes(op="call_function", target=aten.conv2d.default)))
x_observer, w_observer, b_observer = (step3.get_submodule(arg.target) for arg in stem.args[:3])
bias_scale = b_observer.calculate_qparams()[0]
print("bias scale[:3] =", bias_scale[:3])
expected_scale = x_observer.calculate_qparams()[0] * w_observer.calculate_qparams()[0]
assert torch.equal(bias_scale, expected_scale), "bias 的 scale = 輸入的 scale × weight 的 scale"

# %%
# 步驟 4 — add（與 cat）共用 scale
# --------------------------------
# 只有當兩個 int8 張量的 scale 與 zero point 相同時，加速器才能不經重新縮放就相加。
# ``SharedQuantizationSpec(edge)`` 的意思是「用那條邊的 observer」：``add`` 的第二個輸入
# 與輸出共用第一個輸入的 observer。``CourseQuantizer`` 對 ``cat`` 已經這麼做了。


def annotate_add(node, **options):
    first, second = node.args[:2]
    shared = SharedQuantizationSpec((first, node))
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map={first: ACTIVATION_SPEC, second: shared},
        output_qspec=shared,
        _annotated=True,
        **options,
    )


class Step4Quantizer(Step3Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.add.Tensor):
            annotate_add(node)
        return model


step4 = prepared_by(handmade.prepare, Step4Quantizer())
add = next(iter(step4.graph.find_nodes(op="call_function", target=aten.add.Tensor)))
add_observers = {id(step4.get_submodule(n.target)) for n in [*add.args[:2], *add.users]}
print(f"add 周圍不同的 observer 數：{len(add_observers)}")
draw(step4, highlight=[add.name], title="步驟 4：add 共用一個 observer")
assert len(add_observers) == 1, "add 的兩個輸入和輸出共用一個 observer"

# %%
# 步驟 5 — allow_implicit_sharing
# -------------------------------
# 為什麼 add 的輸入也和「conv 的輸出」共用？輸入邊讀的就是產生者輸出的那個張量，
# 所以兩者的 spec 一致時，prepare 讓它們共用一個 observer（隱式共用）。
# 在 annotation 上設 ``allow_implicit_sharing=False``，就關掉它輸入邊的這種共用：
# 它們各有自己的 observer，圖中的 observer 也就變多。


class NoImplicitSharing(Step3Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.add.Tensor):
            annotate_add(node, allow_implicit_sharing=False)
        return model


def count_observers(gm):
    return len(
        {id(gm.get_submodule(n.target)) for n in gm.graph.nodes if handmade.is_observer_node(gm, n)}
    )


separate = prepared_by(handmade.prepare, NoImplicitSharing())
print("observer 數：共用", count_observers(step4), "個；不共用", count_observers(separate), "個")
assert count_observers(separate) > count_observers(step4), "沒有隱式共用，observer 就變多"

# %%
# 步驟 6 — sigmoid 的固定 qparams
# -------------------------------
# ``sigmoid`` 的輸出永遠落在 [0, 1]，沒有東西需要校準：
# ``FixedQParamsQuantizationSpec`` 直接定下 uint8、scale 1/256、zero point 0。

SIGMOID_OUTPUT = FixedQParamsQuantizationSpec(
    dtype=torch.uint8, scale=1 / 256, zero_point=0, quant_min=0, quant_max=255
)


class Step6Quantizer(Step4Quantizer):
    def annotate(self, model):
        super().annotate(model)
        for node in model.graph.find_nodes(op="call_function", target=aten.sigmoid.default):
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={node.args[0]: ACTIVATION_SPEC},
                output_qspec=SIGMOID_OUTPUT,
                _annotated=True,
            )
        return model


ours = prepared_by(handmade.prepare, Step6Quantizer())
converted = handmade.convert(ours)
sigmoid = next(iter(converted.graph.find_nodes(op="call_function", target=aten.sigmoid.default)))
q_out = next(iter(sigmoid.users))
print(q_out.target, q_out.args[1:])
assert q_out.args[1:3] == (1 / 256, 0), "sigmoid 的輸出：scale 1/256、zero point 0"
draw(converted, highlight=[q_out.name], title="步驟 6：sigmoid 用固定 qparams，convert 之後")

# %%
# 步驟 7 — validate：拒絕後端跑不了的東西
# ---------------------------------------
# prepare 在 ``annotate`` 之後立刻呼叫 ``validate``。加速器沒有 int16 的 kernel，
# 所以要求 16 位元活化值的使用者在 prepare 時就會知道，而不是到了裝置上才發現。

SUPPORTED_DTYPES = {torch.int8, torch.uint8, torch.int32}  # 加速器有的 kernel


class BackendQuantizer(Step6Quantizer):
    """加速器的 quantizer：課程的 quantizer，加上步驟 2～6 與一項檢查（步驟 7）。"""

    def validate(self, model):
        for node in model.graph.nodes:
            annotation = node.meta.get("quantization_annotation")
            specs = (
                [*annotation.input_qspec_map.values(), annotation.output_qspec]
                if annotation
                else []
            )
            for spec in specs:
                dtype = getattr(spec, "dtype", None)
                if dtype is not None and dtype not in SUPPORTED_DTYPES:
                    raise ValueError(f"node {node.name!r}: the accelerator has no {dtype} kernels")


INT16 = QuantizationSpec(
    dtype=torch.int16,
    quant_min=-(2**15),
    quant_max=2**15 - 1,
    qscheme=torch.per_tensor_affine,
    observer_or_fake_quant_ctr=MinMaxObserver,
)


class Int16Request(BackendQuantizer):
    def annotate(self, model):
        super().annotate(model)
        relu = next(iter(model.graph.find_nodes(op="call_function", target=aten.relu.default)))
        relu.meta["quantization_annotation"].output_qspec = INT16
        return model


with expect_error(ValueError, match="no torch.int16 kernels"):
    handmade.prepare(torch.export.export(block(), x).module(), Int16Request())

# %%
# 步驟 8 — 經過 torchao，逐位元相同
# ---------------------------------
# 我們寫的 quantizer 用上了每一種 spec，經過 torchao 的 ``prepare_pt2e`` 與
# ``convert_pt2e``：同樣的圖、同樣的 int8／int32 常數、同樣的輸出。

converted = handmade.convert(prepared_by(handmade.prepare, BackendQuantizer()))
theirs = convert_pt2e(prepared_by(prepare_pt2e, BackendQuantizer()))
fresh = example_inputs(4, seed=123)
assert converted.code == theirs.code, "convert 後的圖相同"
assert converted.state_dict().keys() == theirs.state_dict().keys()
assert all(torch.equal(v, converted.state_dict()[k]) for k, v in theirs.state_dict().items())
assert torch.equal(converted(*fresh), theirs(*fresh)), "和 torchao 逐位元相同"
int32 = [
    k
    for k, v in converted.state_dict().items()
    if v.dtype == torch.int32 and v.ndim == 1 and "zero_point" not in k
]
print(f"int32 常數（事先量化的 bias）：{int32}")
assert len(int32) == 4, "四個 conv 的 bias 都是 int32 常數"

# %%
# 步驟 9 — 當 torchao 自己的 quantizer 在一般程式碼上失敗
# -------------------------------------------------------
# quantizer 比對的是匯出留下的模式，所以它看到的是匯出記錄下來的東西。
# 把同一個 ``nn.ReLU`` 模組呼叫兩次是很普通的 PyTorch 寫法，但經過預設的 non-strict 匯出後，
# ``X86InductorQuantizer.annotate`` 本身就會引發錯誤。``handmade.prepare``
# 呼叫的是同一個 ``annotate``，所以也一樣。


class ReusedReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()  # 一個模組，下面呼叫兩次

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


for prepare in (prepare_pt2e, handmade.prepare):
    with expect_error(ValueError, match="Input partition has more than one output node"):
        prepare(torch.export.export(ReusedReLU().eval(), x).module(), x86_quantizer())

# %%
# 解法：每個用到的地方各用自己的 ``nn.ReLU`` （或呼叫 ``torch.relu``）；以
# ``strict=True`` 匯出也可以。不論哪種改法，torchao 與 handmade 的結果都再次逐位元相同。


class OwnReLUs(ReusedReLU):
    def __init__(self):
        super().__init__()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(self.conv2(self.relu(self.conv1(x))))


def seeded(cls):
    torch.manual_seed(0)
    return cls().eval()


passes = ((prepare_pt2e, convert_pt2e), (handmade.prepare, handmade.convert))
fixed = [convert(prepared_by(p, x86_quantizer(), seeded(OwnReLUs))) for p, convert in passes]
assert torch.equal(fixed[0](*fresh), fixed[1](*fresh)), "每處用一個 nn.ReLU：可行，而且逐位元相同"
strict = [
    convert(prepared_by(p, x86_quantizer(), seeded(ReusedReLU), strict=True))
    for p, convert in passes
]
assert torch.equal(strict[0](*fresh), strict[1](*fresh)), "strict 匯出：可行，而且逐位元相同"

# %%
# 小結
# ----
#
# =====================================  ===================================================
# 後端的需求                             quantizer 寫下的東西
# =====================================  ===================================================
# 累加器 scale 下的 int32 bias           ``DerivedQuantizationSpec`` （輸入 × weight scale）
# ``add``／``cat`` 共用一個 scale        ``SharedQuantizationSpec``，用於輸入與輸出
# 已知的輸出範圍（sigmoid）              ``FixedQParamsQuantizationSpec``
# 運算的輸入各有自己的 observer          ``allow_implicit_sharing=False``
# 要比對的模式更少                       ``transform_for_annotation`` (``add_`` → ``add``)
# 拒絕跑不了的東西                       ``validate``
# =====================================  ===================================================
#
# 練習
# ----
# 1. 在 ``out += x`` 之前先讀取 ``out`` 的一個切片（下面的 ``Peek``）。預測：
#    ``BackendQuantizer`` 的 ``transform_for_annotation`` 會把這個 ``add_`` 改成 ``add``
#    嗎？如果不管檢查、照樣改寫，模型算出來的結果會不會變？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          class Peek(Block):
#              def forward(self, x):
#                  x = torch.relu(self.stem(x))
#                  branches = [torch.relu(self.left(x)), torch.relu(self.right(x))]
#                  out = self.mix(torch.cat(branches, dim=1))
#                  first = out[:, :1]  # out 的 view：+= 寫入的值它都看得到
#                  out += x
#                  return torch.sigmoid(out) * first
#
#
#          torch.manual_seed(0)
#          peek = Peek().eval()
#          peeked = prepared_by(handmade.prepare, BackendQuantizer(), peek)
#          in_place = peeked.graph.find_nodes(op="call_function", target=aten.add_.Tensor)
#          assert in_place and "add_" not in annotated(peeked), "add_ 保留下來，留在浮點數"
#          forced = torch.export.export(peek, x).module()
#          (add_,) = forced.graph.find_nodes(op="call_function", target=aten.add_.Tensor)
#          add_.target = aten.add.Tensor  # 改寫，但不做檢查
#          forced.recompile()
#          with torch.no_grad():
#              assert not torch.equal(forced(*fresh), peek(*fresh)), (
#                  "切片再也看不到 += 寫入的值"
#              )
#
# 2. 把 sigmoid 的固定 scale 從 1/256 改成 1/128。預測量化後的 sigmoid 輸出最多有幾種不同的值。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          import dataclasses
#
#
#          class Coarser(BackendQuantizer):
#              def annotate(self, model):
#                  super().annotate(model)
#                  coarse = dataclasses.replace(SIGMOID_OUTPUT, scale=1 / 128)
#                  graph = model.graph
#                  for node in graph.find_nodes(op="call_function", target=aten.sigmoid.default):
#                      node.meta["quantization_annotation"].output_qspec = coarse
#                  return model
#
#
#          out = handmade.convert(prepared_by(handmade.prepare, Coarser()))(*fresh)
#          assert len(out.unique()) <= 129, "[0, 1] 以 1/128 為一格：最多 129 種值"
#
# 3. 把 ``BackendQuantizer`` 用在一個 ``bias=False`` 的 conv 上：步驟 3 的迴圈會引發
#    ``IndexError`` （``conv.args`` 裡沒有 bias）。修正這個迴圈，讓它跳過沒有 bias 的 conv，
#    再預測：convert 之後的模型有幾個 int32 常數？結果還和 torchao 逐位元相同嗎？這個修正會
#    改變 block convert 之後的圖嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          class NoBias(nn.Module):
#              def __init__(self):
#                  super().__init__()
#                  self.conv = nn.Conv2d(3, 8, 3, bias=False)
#
#              def forward(self, x):
#                  return self.conv(x)
#
#
#          with expect_error(IndexError):
#              prepared_by(handmade.prepare, BackendQuantizer(), NoBias().eval())
#
#
#          class BiasIfAny(Step3Quantizer):
#              def annotate(self, model):
#                  # 先做課程 quantizer 的 annotation，再做修正過的步驟 3
#                  CourseQuantizer.annotate(self, model)
#                  convs = model.graph.find_nodes(op="call_function", target=aten.conv2d.default)
#                  for conv in convs:
#                      if len(conv.args) > 2 and conv.args[2] is not None:
#                          qspecs = conv.meta["quantization_annotation"].input_qspec_map
#                          qspecs[conv.args[2]] = int32_bias(conv)
#                  return model
#
#
#          torch.manual_seed(0)
#          no_bias = NoBias().eval()
#          ours = handmade.convert(prepared_by(handmade.prepare, BiasIfAny(), no_bias))
#          theirs = convert_pt2e(prepared_by(prepare_pt2e, BiasIfAny(), no_bias))
#          dtypes = [value.dtype for value in ours.state_dict().values()]
#          print(dtypes)
#          assert torch.int32 not in dtypes and torch.int8 in dtypes, (
#              "沒有 bias 就沒有 int32 常數；weight 是 int8"
#          )
#          assert torch.equal(ours(*fresh), theirs(*fresh)), "和 torchao 逐位元相同"
#          before, after = (
#              handmade.convert(prepared_by(handmade.prepare, quantizer()))
#              for quantizer in (Step3Quantizer, BiasIfAny)
#          )
#          assert after.code == before.code, "每個 conv 都有 bias 時，修正不改變任何東西"
#
# 延伸閱讀
# --------
# - `為 PT2E 量化撰寫 quantizer（PyTorch 教學）
#   <https://docs.pytorch.org/tutorials/prototype/pt2e_quantizer.html>`_
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_ （strict 與 non-strict）
# - :ref:`M06-1 · XNNPACK quantizer
#   <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`：
#   另一個後端的 quantizer（ExecuTorch）
# - :ref:`疑難排解：prepare 與 convert
#   <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# :ref:`M03-1 · lowering 之後的圖 <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`：
# 把 convert 後的圖下放（lowering）到真正的 int8 kernel。
