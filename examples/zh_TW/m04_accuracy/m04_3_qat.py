"""
M04-3 量化感知訓練
==================

M04-2 靠改配方修好了有離群通道的模型。配方改不了的時候，例如後端只支援 per-tensor weight，
就改 weight：量化感知訓練（QAT）在前向傳遞裡就放進 int8 的捨入，再微調模型，讓訓練學到經得起
捨入的 weight。``prepare_qat_pt2e`` 在 ``prepare_pt2e`` 放 observer 的位置放上 fake quantize
模組，並讓 BatchNorm 在訓練期間繼續存在；``convert_pt2e`` 最後再把它折疊掉。兩個 epoch
就把訓練後量化損失的準確度拿回來。

**你會學到**

- ``prepare_qat_pt2e`` 比 ``prepare_pt2e`` 多做了什麼：fake quantize、conv + BatchNorm
- 為什麼 ``model.train()`` 在匯出的模型上會失敗，以及該改呼叫什麼
- 同一個模型、同一個測試集上的 fp32／PTQ／QAT 準確度

**先備知識**：:ref:`M04-2 · 修好它 <sphx_glr_lessons_m04_accuracy_m04_2_fixing_it.py>`、
:ref:`M01-1 · PT2E 全流程
<sphx_glr_lessons_m01_quantized_graphs_m01_1_pt2e_flow.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 帶著 M04-2 種下的離群通道的數字 CNN，以及 PTQ 與 QAT 共用的一個配方：x86 預設設定，
# 只把 weight 改成 per-tensor。QAT 時 weight 的 observer 是
# ``FusedMovingAvgObsFakeQuantize`` （既觀察 *也* 捨入），裡面包著一個移動平均的 MinMax。

import copy
import time
from collections import Counter
from dataclasses import replace

import matplotlib.pyplot as plt
import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval

from common.charts import use_course_style
from common.data import accuracy, digits, export_digits_model, fit, train_digits_cnn
from common.expect import expect_error
from common.pt2e import quiet
from common.viz import draw

quiet()
use_course_style()

from torchao.quantization.pt2e import (
    FakeQuantizeBase,
    FusedMovingAvgObsFakeQuantize,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    ObserverBase,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

calibration_images, _ = digits("calibration")
model = train_digits_cnn()
outlier = copy.deepcopy(model)
with torch.no_grad():  # M04-2 步驟 1：第 0 個通道進來 × 100，出去 × 1/100
    outlier.bn1.weight[0] *= 100
    outlier.bn1.bias[0] *= 100
    outlier.conv2.weight[:, 0] /= 100


def fold_batch_norm(model):
    """``model`` 的副本，BatchNorm 折疊進各自的 conv（BN 換成 Identity）。"""
    folded = copy.deepcopy(model)
    for conv, bn in (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")):
        setattr(folded, conv, fuse_conv_bn_eval(getattr(folded, conv), getattr(folded, bn)))
        setattr(folded, bn, torch.nn.Identity())
    return folded


def per_tensor_recipe(*, is_qat):
    """x86 預設設定，weight 改成 per-tensor 對稱量化。"""
    base = get_default_x86_inductor_quantization_config(is_qat=is_qat)
    observer = MinMaxObserver.with_args(eps=2**-12)
    if is_qat:
        observer = FusedMovingAvgObsFakeQuantize.with_args(
            observer=MovingAverageMinMaxObserver, eps=2**-12
        )
    weight = replace(
        base.weight, qscheme=torch.per_tensor_symmetric, observer_or_fake_quant_ctr=observer
    )
    return replace(base, weight=weight)


def census(gm):
    """依模組種類清點 call_module node，依運算清點 call_function node。"""
    counts = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            if isinstance(module, FakeQuantizeBase):
                counts["fake quantize"] += 1
            elif isinstance(module, ObserverBase):
                counts["observer"] += 1
        elif node.op == "call_function":
            counts[node.target.__name__.split(".")[0]] += 1
    return counts


# %%
# 步驟 1 — 基準：per-tensor weight 的 PTQ
# --------------------------------------------------
# 訓練後量化（PTQ），用全部 200 張校準影像校準。

prepared = prepare_pt2e(
    export_digits_model(outlier), X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=False))
)
with torch.no_grad():
    prepared(calibration_images)
ptq_model = convert_pt2e(prepared)
fp32_accuracy, ptq_accuracy = accuracy(outlier), accuracy(ptq_model)
print(f"fp32 {fp32_accuracy:.1%}   PTQ {ptq_accuracy:.1%}")
assert ptq_accuracy < fp32_accuracy - 0.10, "per-tensor 的 PTQ 損失超過 10 個百分點"

# %%
# 步驟 2 — prepare_qat_pt2e
# -------------------------
# QAT 以 *訓練* 模式匯出模型。在意這件事的是 BatchNorm，torchao 也會處理它（見下面的附註）；
# 這裡先用 BatchNorm 現有的統計值把它折疊進 conv，讓圖裡只有 conv。``prepare_qat_pt2e``
# 接受同一個 quantizer（換成 QAT 設定），回傳下面這張圖；fake quantize 模組畫得和 observer
# 一樣，這裡把它們標示出來。

started = time.perf_counter()
qat_model = prepare_qat_pt2e(
    export_digits_model(fold_batch_norm(outlier).train()),
    X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
)
print(f"prepare_qat_pt2e：{time.perf_counter() - started:.1f} 秒")
counts = census(qat_model)
print(dict(counts))
fake_quantize = [
    n.name
    for n in qat_model.graph.nodes
    if n.op == "call_module" and isinstance(qat_model.get_submodule(n.target), FakeQuantizeBase)
]
assert counts["observer"] == 0 and counts["fake quantize"] == len(fake_quantize) == 12
draw(qat_model, highlight=fake_quantize, title="步驟 2：prepare_qat_pt2e 之後")

# %%
# ``prepare_qat_pt2e`` 比 ``prepare_pt2e`` 多做的事，第一件：**用 fake quantize 取代
# observer**。每個模組像 observer 一樣記錄統計值，同時以浮點把輸入捨入到 int8 的格點再還原，
# 讓訓練看得到捨入。反向傳播時，梯度穿過捨入，就像它不存在一樣（直通估計器，
# straight-through estimator）。輸入 ``x`` 上的 fake quantize 可以看出這點：
# 它的輸出落在自己 scale 的格點上，而不等於輸入。

input_node = next(
    n for n in qat_model.graph.nodes if n.name in fake_quantize and n.args[0].op == "placeholder"
)
# 用副本：直接呼叫模型自己的模組，會把 x 加進它訓練時用的統計值。
input_fq = copy.deepcopy(qat_model.get_submodule(input_node.target))
x = calibration_images[:4]
with torch.no_grad():
    rounded = input_fq(x)
steps = rounded / input_fq.scale + input_fq.zero_point
print(
    f"{input_node.name}: scale {input_fq.scale.item():.6f}, "
    f"{(rounded != x).float().mean():.0%} 的像素被移動了"
)
assert not torch.equal(rounded, x), "fake quantize 會改變數值"
torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3)

# %%
# .. note::
#
#    第二件：**保留 conv + BatchNorm，不折疊。** ``prepare_pt2e`` 會把 BatchNorm 折疊進 conv。
#    對一個帶著 BatchNorm 匯出的模型，``prepare_qat_pt2e`` 保留每一個 BatchNorm（處於訓練
#    模式），並把每組 conv + BatchNorm 改寫成一個子圖：先把 conv 的 weight 乘上
#    γ/√(running_var + ε)，*再* 交給 weight 的 fake quantize（所以被捨入的是折疊後的
#    weight），接著把 conv 的輸出除回來，再用這一批資料的統計值套用 BatchNorm。之後
#    ``convert_pt2e`` 再把每個 BatchNorm 折疊進它的 conv。torchao 靠匯出許多小的 pattern
#    圖來找出這些子圖，prepare 時一次，convert 時再一次；在這台共用的雙核心機器上，這花了
#    超過一分鐘，所以本頁先折疊 BatchNorm。練習 2 會走一遍 BatchNorm 的路徑並計時。
#
# 第三件：**不能呼叫 train() 或 eval()**，見步驟 3。

# %%
# 步驟 3 — 帶著 fake quantize 訓練
# -------------------------------------
# 匯出的模型不懂 ``train()`` 與 ``eval()``：圖裡的 BatchNorm 或 dropout 是一個運算，
# 訓練與否只是它的一個參數；``prepare_qat_pt2e`` 回傳的圖兩個呼叫都拒絕。
# ``move_exported_model_to_train`` 與 ``move_exported_model_to_eval`` 改為直接改寫圖裡的
# 這些參數。

with expect_error(NotImplementedError, match="move_exported_model_to_train"):
    qat_model.train()
move_exported_model_to_train(qat_model)
started = time.perf_counter()
losses = fit(qat_model, epochs=2, lr=1e-3)
seconds = time.perf_counter() - started
print(f"QAT 訓練 2 個 epoch 花了 {seconds:.1f} 秒，loss {[round(v, 4) for v in losses]}")
move_exported_model_to_eval(qat_model)
print(f"評估模式下的 fake quantize 模型：{accuracy(qat_model):.1%}")

# %%
# 步驟 4 — convert_pt2e：fake quantize → q/dq
# --------------------------------------------
# ``convert_pt2e`` 把每個 fake quantize 換成 q/dq node，用的是訓練結束時的 scale 與
# zero point；weight 變成 int8 常數。結果的形狀和步驟 1 的 PTQ 模型一樣：
# quantize node 相同，不再有 fake quantize。

started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e：{time.perf_counter() - started:.1f} 秒")
after = census(converted)
print(dict(after))
assert after["fake quantize"] == 0, "不再有 fake quantize"
assert after["quantize_per_tensor"] == census(ptq_model)["quantize_per_tensor"], "和 PTQ 之後一樣"
draw(converted, title="步驟 4：convert_pt2e 之後的 QAT 模型")

# %%
# 步驟 5 — 測試集上的 fp32、PTQ 與 QAT
# ------------------------------------------
# 同一個模型、同一個 per-tensor 配方、同樣 500 張測試影像。

qat_accuracy = accuracy(converted)
table = {"fp32": fp32_accuracy, "PTQ (per-tensor)": ptq_accuracy, "QAT (per-tensor)": qat_accuracy}
for label, value in table.items():
    print(f"{label:<18}{value:>7.1%}")
assert qat_accuracy > ptq_accuracy + 0.10, "QAT 拿回超過 10 個百分點"
assert qat_accuracy > fp32_accuracy - 0.05, "最後與 fp32 相差不到 5 個百分點"

fig, ax = plt.subplots(figsize=(6, 3))
ax.bar(list(table), [v * 100 for v in table.values()], color=["#999999", "#c44e52", "#4c72b0"])
ax.set_ylabel("測試準確度（%）")
ax.set_ylim(0, 100)
ax.set_title("per-tensor int8：PTQ 對 QAT")
fig.tight_layout()

# %%
# 小結
# ----
# - QAT = ``prepare_qat_pt2e`` → 帶著 fake quantize 訓練 → ``convert_pt2e``。
# - ``prepare_qat_pt2e`` 在 ``prepare_pt2e`` 放 observer 的地方放 fake quantize（觀察 + 捨入，
#   梯度直通），並把 conv + BatchNorm 保留成一個對折疊後 weight 做 fake quantize 的子圖；
#   ``convert_pt2e`` 最後折疊 BatchNorm（在這裡很花時間，所以本頁先折疊了）。
# - 用 ``move_exported_model_to_train``／``move_exported_model_to_eval`` 切換模式。
#
# 練習
# ----
# 1. QAT 之後，第一個 conv 的 per-tensor int8 weight 仍然由第 0 個通道主導嗎？其他通道現在
#    是否用到超過一個間隔（int8 值超出 -1..1）？兩者都先預測。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          conv = next(n for n in converted.graph.nodes if n.name == "conv2d")
#          int8_weight = getattr(converted, conv.args[1].args[0].target)
#          peaks = int8_weight.abs().amax(dim=(1, 2, 3))
#          print(f"每個通道的 int8 最大值：{peaks.tolist()}")
#          assert peaks.argmax() == 0, "第 0 個通道的 weight 仍然最大"
#          assert peaks[1:].max() <= 1, "其他通道仍然捨入成 -1、0 或 1"
#          # QAT 沒有救回 conv1：是它後面的各層學會了與它的捨入共處。
#
# 2. 走一遍 BatchNorm 的路徑：以訓練模式匯出（未折疊的）``outlier``，呼叫
#    ``prepare_qat_pt2e``，訓練一個 epoch，再 convert。先預測 prepare 後的圖有幾個
#    ``batch_norm`` node，convert 後又有幾個。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          started = time.perf_counter()
#          with_bn = prepare_qat_pt2e(
#              export_digits_model(copy.deepcopy(outlier).train()),
#              X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
#          )
#          print(f"prepare：{time.perf_counter() - started:.1f} 秒，{dict(census(with_bn))}")
#          assert census(with_bn)["batch_norm"] == 3, "保留著，處於訓練模式"
#          move_exported_model_to_train(with_bn)
#          fit(with_bn, epochs=1, lr=1e-3)
#          move_exported_model_to_eval(with_bn)
#          started = time.perf_counter()
#          folded_at_convert = convert_pt2e(with_bn)
#          print(f"convert：{time.perf_counter() - started:.1f} 秒")
#          assert census(folded_at_convert)["batch_norm"] == 0, "被 convert_pt2e 折疊"
#          print(f"準確度：{accuracy(folded_at_convert):.1%}")
#
# 延伸閱讀
# --------
# - `torchao: PT2E quantization-aware training
#   <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_qat.html>`_
# - `torch.export <https://docs.pytorch.org/docs/stable/export.html>`_
#
# 下一課
# ------
# M04 到此結束。網站首頁的課程地圖列出所有單元。
