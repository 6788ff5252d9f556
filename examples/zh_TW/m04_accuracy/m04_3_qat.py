"""
M04-3 量化感知訓練
==================

M04-2 靠改配方、或親手改 weight，修好了有離群通道的模型。量化感知訓練（QAT）讓訓練去改
weight：在前向傳遞裡就放進 int8 的捨入，再微調模型。``prepare_qat_pt2e`` 在 ``prepare_pt2e``
放 observer 的位置放上 fake quantize 模組，並讓 BatchNorm 在訓練期間繼續存在；
``convert_pt2e`` 最後再把它折疊掉。QAT 需要一份排程，本頁照著跑：observer 與 BatchNorm
統計值先一起更新，最後一個 epoch 兩者都凍結，任何評估之前先關掉 observer，所以用來評分的
測試集從來不會決定任何 scale。QAT 拿回了多少 PTQ 損失的準確度，最後實測印出。

**你會學到**

- ``prepare_qat_pt2e`` 比 ``prepare_pt2e`` 多做了什麼：帶著截斷直通梯度的 fake quantize、
  為訓練保留的 conv + BatchNorm
- QAT 的排程：``move_exported_model_to_train/eval``、凍結 BatchNorm 統計值、評估前先
  ``disable_observer``
- 在從未碰過任何 scale 的測試集上，fp32／PTQ／QAT 的準確度

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
# ``FusedMovingAvgObsFakeQuantize`` （既觀察「也」捨入），裡面包著一個移動平均的 MinMax。

import copy
import time
from collections import Counter
from dataclasses import replace

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.cpu import describe
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
    disable_observer,
    enable_observer,
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
with torch.no_grad():  # M04-2 步驟 1：第 0 個通道輸入 × 100，輸出 × 1/100
    outlier.bn1.weight[0] *= 100
    outlier.bn1.bias[0] *= 100
    outlier.conv2.weight[:, 0] /= 100
print(describe().verdict)

# %%
# 輔助函式：``per_tensor_recipe`` 是配方；``census`` 依種類清點圖裡的 node；``scales`` 讀出
# 每個 fake quantize 的 scale；``batch_norms`` 找出 BatchNorm node，``running_means`` 讀出它們
# 的統計值，``freeze_batch_norm`` 把它們的 ``training`` 引數設成 False，讓它們用 running
# 統計值做正規化，也不再更新這些統計值（torchao 的 QAT 教學也這麼做）。


def per_tensor_recipe(*, is_qat):
    """x86 預設設定，weight 改為 per-tensor 對稱。"""
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


def scales(gm):
    """{fake quantize 名稱: 它的 scale 的副本}。"""
    return {
        name: module.scale.clone()
        for name, module in gm.named_modules()
        if isinstance(module, FakeQuantizeBase)
    }


def batch_norms(gm):
    """圖裡的 BatchNorm node；引數：input、weight、bias、mean、var、training……"""
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.batch_norm.default]


def running_means(gm):
    """每個 BatchNorm 的 running mean 的副本（它的統計值存成 buffer）。"""
    return [gm.get_buffer(node.args[3].target).clone() for node in batch_norms(gm)]


def freeze_batch_norm(gm):
    """讓 ``gm`` 的每個 BatchNorm 使用並保留它的 running 統計值。"""
    for node in batch_norms(gm):
        node.args = (*node.args[:5], False, *node.args[6:])
    gm.recompile()


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
assert ptq_accuracy < fp32_accuracy - 0.03, "per-tensor 的 PTQ 損失超過 3 個百分點"

# %%
# 步驟 2 — prepare_qat_pt2e
# -------------------------
# QAT 以「訓練」模式匯出模型，BatchNorm 也在內。``prepare_qat_pt2e`` 接受同一個 quantizer
# （換成 QAT 設定），回傳下面這張圖；fake quantize 模組畫得和 observer 一樣，這裡把它們
# 標示出來。它靠比對 torchao 當場匯出的模式圖來找出每組 conv + BatchNorm，所以要花一點
# 時間；花了多久與執行緒數一起印出，因為這取決於機器與它的負載。

started = time.perf_counter()
qat_model = prepare_qat_pt2e(
    export_digits_model(copy.deepcopy(outlier).train()),
    X86InductorQuantizer().set_global(per_tensor_recipe(is_qat=True)),
)
print(
    f"prepare_qat_pt2e：{time.perf_counter() - started:.1f} 秒，{torch.get_num_threads()} 個執行緒"
)
counts = census(qat_model)
print(dict(counts))
fake_quantize = [
    n.name
    for n in qat_model.graph.nodes
    if n.op == "call_module" and isinstance(qat_model.get_submodule(n.target), FakeQuantizeBase)
]
assert counts["observer"] == 0 and counts["fake quantize"] == len(fake_quantize)
assert counts["batch_norm"] == 3, "三個 BatchNorm 都留著，為了訓練"
draw(qat_model, highlight=fake_quantize, title="步驟 2：prepare_qat_pt2e 之後")

# %%
# ``prepare_qat_pt2e`` 比 ``prepare_pt2e`` 多做的事，第一件：**用 fake quantize 取代
# observer**。每個模組像 observer 一樣記錄統計值，同時以浮點把輸入捨入到 int8 的格點再還原，
# 讓訓練看得到捨入。輸入 ``x`` 上的 fake quantize 可以看出這點：它的輸出落在自己 scale 的
# 格點上，而不等於輸入。

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
# 反向傳播時，捨入沒有可用的梯度（幾乎處處為零），所以 fake quantize 用的是截斷的
# **直通估計器** （straight-through estimator）：數值落在 int8 範圍之內時，梯度原樣通過；
# 被夾到範圍兩端時，梯度為零。餵進從範圍下方到上方的數值，看看梯度。

input_fq.apply(disable_observer)  # 副本的範圍保持不變
probe = torch.linspace(-0.5, 1.5, 9, requires_grad=True)
input_fq(probe).sum().backward()
grid = torch.round(probe.detach() / input_fq.scale) + input_fq.zero_point
inside = (grid >= input_fq.quant_min) & (grid <= input_fq.quant_max)
print("輸入  " + " ".join(f"{v:5.2f}" for v in probe.tolist()))
print("梯度  " + " ".join(f"{v:5.0f}" for v in probe.grad.tolist()))
assert torch.equal(probe.grad, inside.float()), "範圍內為 1，被夾住處為 0"
assert 0 < inside.sum() < len(probe), "兩種情況都出現"

# %%
# .. note::
#
#    第二件：**保留 conv + BatchNorm，不折疊。** ``prepare_pt2e`` 會把 BatchNorm 折疊進 conv。
#    ``prepare_qat_pt2e`` 保留每一個 BatchNorm（處於訓練模式），並把每組 conv + BatchNorm
#    改寫成一個子圖：先把 conv 的 weight 乘上 γ/√(running_var + ε)，「再」交給 weight 的
#    fake quantize（所以被捨入的是折疊後的 weight），接著把 conv 的輸出除回來，再用這一批
#    資料的統計值套用 BatchNorm。之後 ``convert_pt2e`` 再把每個 BatchNorm 折疊進它的 conv。
#
# 第三件：**不能呼叫 train() 或 eval()**，見步驟 3。

# %%
# 步驟 3 — 照 QAT 的排程訓練
# ----------------------------------
# 匯出的模型不懂 ``train()`` 與 ``eval()``：圖裡的 BatchNorm 或 dropout 是一個運算，
# 訓練與否只是它的一個引數；``prepare_qat_pt2e`` 回傳的圖兩個呼叫都拒絕。
# ``move_exported_model_to_train`` 與 ``move_exported_model_to_eval`` 改為直接改寫圖裡的
# 這些引數。先訓練兩個 epoch，所有東西都在更新：weight、fake quantize 裡的 observer、
# BatchNorm 的統計值。

with expect_error(NotImplementedError, match="move_exported_model_to_train"):
    qat_model.train()
move_exported_model_to_train(qat_model)
started = time.perf_counter()
losses = fit(qat_model, epochs=2, lr=1e-3)
print(f"2 個 epoch 花了 {time.perf_counter() - started:.1f} 秒（fit 以單一執行緒訓練）")

# %%
# 最後一個 epoch 在凍結狀態下執行，這是常見的 QAT 排程（torchvision 的 QAT 範例在接近尾聲時
# 先凍結 BatchNorm 統計值，再凍結 observer）：``disable_observer`` 讓每個 fake quantize 不再
# 更新它的 scale 與 zero point（仍然會捨入），``freeze_batch_norm`` 讓 BatchNorm 使用它的
# running 統計值。weight 仍在學習；scale 以及算出它們的統計值則保持不動。

qat_model.apply(disable_observer)
freeze_batch_norm(qat_model)
trained_scales = scales(qat_model)
statistics = running_means(qat_model)
weights = copy.deepcopy(qat_model.state_dict())
started = time.perf_counter()
losses += fit(qat_model, epochs=1, lr=1e-3, seed=1)
seconds = time.perf_counter() - started
print(f"最後一個 epoch 花了 {seconds:.1f} 秒，loss {[round(v, 4) for v in losses]}")
assert all(torch.equal(trained_scales[n], s) for n, s in scales(qat_model).items()), "已凍結"
means = running_means(qat_model)
assert all(torch.equal(a, b) for a, b in zip(statistics, means, strict=True)), "BN 已凍結"
assert any(not torch.equal(weights[k], v) for k, v in qat_model.state_dict().items())

# %%
# 步驟 4 — 評估時不碰 scale
# ---------------------------------------------
# 評估不該讓模型學到任何東西。``move_exported_model_to_eval`` 把 BatchNorm 切換成推論模式，
# 卻不會關掉 observer。為了看出那會付出什麼代價，讓一個副本的 observer 重新開啟
# （``enable_observer``），就像步驟 3 沒有關掉它們一樣。兩者都在測試集上評分：訓練與
# scale 都沒看過的 500 張影像。

move_exported_model_to_eval(qat_model)
leaky = copy.deepcopy(qat_model)
leaky.apply(enable_observer)
qat_fq_accuracy = accuracy(qat_model)
accuracy(leaky)
after, leaked = scales(qat_model), scales(leaky)
print(f"{'fake quantize':<28}{'訓練後':>9}{'observer 關閉':>14}{'observer 開啟':>13}")
for name, value in trained_scales.items():
    print(f"{name:<28}{value.item():>10.5f}{after[name].item():>15.5f}{leaked[name].item():>14.5f}")
moved = sum(not torch.equal(trained_scales[n], leaked[n]) for n in trained_scales)
print(f"開著 observer 時，評估改動了 {moved} 個 scale（共 {len(trained_scales)} 個）；關閉時 0 個")
assert all(torch.equal(trained_scales[n], after[n]) for n in after), "沒有任何 scale 改變"
assert moved > 0, "開著 observer，測試集就會改寫 scale"

# %%
# 步驟 5 — convert_pt2e：fake quantize → q/dq
# --------------------------------------------
# ``convert_pt2e`` 把每個 fake quantize 換成 q/dq node，用的是訓練結束時的 scale 與
# zero point；把每個 BatchNorm 折疊進它的 conv，weight 變成 int8 常數。結果的形狀和步驟 1 的
# PTQ 模型一樣：quantize node 相同，不再有 fake quantize，也不再有 BatchNorm。

started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e：{time.perf_counter() - started:.1f} 秒，{torch.get_num_threads()} 個執行緒")
counts = census(converted)
print(dict(counts))
assert counts["fake quantize"] == 0 and counts["batch_norm"] == 0, "已捨入、已折疊"
assert counts["quantize_per_tensor"] == census(ptq_model)["quantize_per_tensor"], "和 PTQ 之後一樣"
draw(converted, title="步驟 5：convert_pt2e 之後的 QAT 模型")

# %%
# 步驟 6 — 測試集上的 fp32、PTQ 與 QAT
# ------------------------------------------
# 同一個模型、同一個 per-tensor 配方、同樣 500 張測試影像。下面的數字屬於這次建置。assert 的
# 那件事（QAT 至少拿回 PTQ 損失的一半）在寫進這裡之前檢查過的幾次訓練上都成立（原生的
# 種子 0 與 3、AVX2 kernel 下的種子 0）；QAT 離 fp32 多近則隨種子而變，所以只印出、不 assert。

qat_accuracy = accuracy(converted)
table = {"fp32": fp32_accuracy, "PTQ (per-tensor)": ptq_accuracy, "QAT (per-tensor)": qat_accuracy}
for label, value in table.items():
    print(f"{label:<18}{value:>7.1%}")
lost, won = fp32_accuracy - ptq_accuracy, qat_accuracy - ptq_accuracy
print(f"PTQ 損失 {lost * 100:.1f} 個百分點；QAT 拿回其中 {won * 100:.1f} 個")
assert won > lost / 2, "QAT 至少拿回 PTQ 損失的一半"
# sphinx_gallery_start_ignore
from common.results import publish  # 首頁引用的數字

publish("fp32_accuracy", fp32_accuracy)
publish("ptq_accuracy", ptq_accuracy)
publish("qat_accuracy", qat_accuracy)
# sphinx_gallery_end_ignore

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
# - ``prepare_qat_pt2e`` 在 ``prepare_pt2e`` 放 observer 的地方放 fake quantize（觀察 + 捨入；
#   範圍內梯度直通，範圍外為零），並把 conv + BatchNorm 保留成一個對折疊後 weight 做
#   fake quantize 的子圖；``convert_pt2e`` 最後折疊 BatchNorm。
# - 排程：先讓所有東西一起更新地訓練，最後一個 epoch 凍結 BatchNorm 統計值與 observer
#   （``disable_observer``）；用 ``move_exported_model_to_train``／
#   ``move_exported_model_to_eval`` 切換模式；絕不在 observer 開著時評估，否則評估資料
#   會決定 scale。
#
# 練習
# ----
# 1. QAT 之後，第一個 conv 的 per-tensor int8 weight 仍然由第 0 個通道主導嗎？其他通道現在
#    是否用到超過一格（int8 值超出 -1..1）？兩者都先預測。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          conv2d = torch.ops.aten.conv2d.default
#          conv = next(n for n in converted.graph.nodes if n.target is conv2d)
#          int8_weight = getattr(converted, conv.args[1].args[0].target)
#          peaks = int8_weight.abs().amax(dim=(1, 2, 3))
#          print(f"每個通道的 int8 最大值：{peaks.tolist()}")
#          assert peaks.argmax() == 0, "第 0 個通道的 weight 仍然最大"
#          assert peaks[1:].max() <= 2, "其他通道仍然只用到一兩格"
#          # QAT 沒有救回 conv1：是它後面的各層學會了與它的捨入共處。
#
# 2. 忘了 ``move_exported_model_to_eval``：在訓練模式下替模型的副本評分，它的 observer
#    仍然關著。先預測：scale 會動嗎？BatchNorm 的統計值呢？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          forgot = copy.deepcopy(leaky)  # 步驟 5 已把 qat_model 本身變成 int8 模型
#          forgot.apply(disable_observer)
#          move_exported_model_to_train(forgot)  # BatchNorm 回到使用這一批資料的統計值
#          held, before = scales(forgot), running_means(forgot)
#          accuracy(forgot)
#          assert all(torch.equal(held[n], s) for n, s in scales(forgot).items()), "scale 不動"
#          now = running_means(forgot)
#          assert not any(torch.equal(a, b) for a, b in zip(before, now)), "BN 學到了測試集"
#          print("scale 不動；BatchNorm 的統計值移向了測試集的統計值")
#
# 3. ``leaky`` 仍是 QAT 的圖（步驟 4 在 convert 之前複製了它）。預測它的每個 conv 用的是
#    哪個 bias：conv 自己的，還是別的？conv 自己的 bias 又跑到哪裡去了？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          aten = torch.ops.aten
#          for conv in leaky.graph.find_nodes(op="call_function", target=aten.conv2d.default):
#              zeros, own_bias = conv.args[2], conv.args[2].args[0]
#              (divide,) = conv.users  # 輸出除以 γ/√(running_var + ε)
#              (add,) = divide.users
#              (batch_norm,) = add.users
#              print(f"{conv.name}：bias 是 {zeros.name}；{own_bias.name} 由 {add.name} 加上")
#              assert zeros.target == aten.zeros_like.default, "conv 加的是全為 0 的 bias"
#              assert divide.target == aten.div.Tensor and add.target == aten.add.Tensor
#              assert add.args[1].args[0] is own_bias, "conv 自己的 bias 在除法之後才加上"
#              assert batch_norm.target == aten.batch_norm.default, "接著才是 BatchNorm"
#          # 把輸出除以 γ/√(var + ε) 是為了抵銷縮放過的 weight；bias 若留在 conv 裡，
#          # 也會一起被除掉，所以要等除完再加。
#
# 延伸閱讀
# --------
# - `PT2E 量化感知訓練（torchao）
#   <https://docs.pytorch.org/ao/stable/pt2e_quantization/pt2e_quant_qat.html>`_
# - `torchvision 的 QAT 參考腳本（凍結 observer 與 BatchNorm）
#   <https://github.com/pytorch/vision/blob/main/references/classification/train_quantization.py>`_
#
# 下一課
# ------
# :ref:`M04-4 · 在真實架構上做 QAT <sphx_glr_lessons_m04_accuracy_m04_4_qat_real_architecture.py>`
# 把同一套排程用在 torchvision 的 MobileNetV2 上，為手機量化，並在全新的行程裡從 checkpoint
# 接著訓練。
