"""
M04-4 在真實架構上做 QAT
========================

M04-3 在三層 conv 的 CNN 上跑了 QAT 排程。本頁改在 torchvision 的 MobileNetV2 上跑（depthwise
conv、每個 conv 後面都有 BatchNorm、ReLU6），並照 ExecuTorch 的 ``XNNPACKQuantizer`` 為手機量化
的方式來做：per-tensor 的 int8 PTQ 掉了準確度，QAT 把它拿回來；QAT 訓練跑到中途存成
checkpoint，在全新的 process 裡逐位元一致地接著跑；最後 QAT 模型以 ``.pte`` 在 ExecuTorch
runtime 上執行。

**你會學到**

- QAT 在 MobileNetV2 上需要的 BatchNorm 處理：統計值先更新、再凍結；``convert_pt2e`` 折疊了
  什麼
- QAT checkpoint 裡有什麼、如何在另一個 process 接著跑，以及什麼會讓它接不上
- 帶 ``is_qat=True`` 的 ``XNNPACKQuantizer``，下放成 ``.pte``

**先備知識**：:ref:`M04-3 · 量化感知訓練 <sphx_glr_lessons_m04_accuracy_m04_3_qat.py>`、
:ref:`M06-2 · 下放到 ExecuTorch
<sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``common.qat.digits_mobilenet_v2`` 是 ``common.vision_models.MobileNetV2`` （torchvision 的
# 程式碼），``width_mult=0.5``、只取前五個 stage、第一個 conv 改成單通道，前面接一個 4 倍的
# 最近鄰放大：8×8 的數字變成 32×32 的影像。它在單一執行緒上以確定性的方式訓練 8 個 epoch，
# 並依程式碼、套件版本與 CPU 的 kernel 路徑快取。

import contextlib
import copy
import io
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from common.charts import use_course_style
from common.cpu import ISA_PATHS, describe, run_under_isa
from common.data import accuracy, digits, export_digits_model
from common.expect import expect_error
from common.pt2e import quiet
from common.qat import (
    batch_norms,
    fingerprint,
    freeze_batch_norm,
    prepare,
    qat_quantizer,
    train_digits_mobilenet_v2,
    train_epoch,
)
from common.viz import draw

quiet()
use_course_style()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.runtime import Runtime
from torchao.quantization.pt2e import (
    FakeQuantizeBase,
    disable_observer,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common.edge import to_executorch

print(describe().verdict)
trained = train_digits_mobilenet_v2()
trained_accuracy = accuracy(trained)

# %%
# 只在 1,097 張數字上訓練，這個小 MobileNetV2 很好量化：折疊 BatchNorm 之後的 weight 與
# activation 都沒有遠大於其他通道的通道。在 ImageNet 上訓練的 MobileNetV2 就有（Nagel 等人，
# *Data-free quantization*，2019：MobileNetV2 的 per-tensor int8 PTQ 掉到跟亂猜一樣）。所以
# 比照 M04-2，在不改變模型計算結果的前提下植入一個這樣的通道：第一個 block 輸出的通道 0
# 乘以 100（它的 BatchNorm 的 γ 與 β），在下一個 conv 讀它的地方再除以 100。浮點數模型不變；
# 它的 int8 模型就變了。

FACTOR = 100
model = copy.deepcopy(trained)
with torch.no_grad():
    block_out = model.net.features[1].conv[2]  # the BatchNorm after block 1's projection
    block_out.weight[0] *= FACTOR
    block_out.bias[0] *= FACTOR
    model.net.features[2].conv[0][0].weight[:, 0] /= FACTOR  # block 2's expansion conv
fp32_accuracy = accuracy(model)
print(f"fp32：訓練後 {trained_accuracy:.1%}，植入離群通道後 {fp32_accuracy:.1%}")
assert abs(fp32_accuracy - trained_accuracy) <= 0.002, "浮點數下是同一個函式"

# %%
# 步驟 1 — 給手機用的 per-tensor PTQ
# -----------------------------------
# ExecuTorch 的 ``XNNPACKQuantizer``，weight 用 per-tensor（``is_per_channel=False``），以 200
# 張校正影像校正。每個 tensor 一個 scale，正是離群值代價最高的配方：那個 activation 的其他
# 通道都只分到幾個 int8 刻度。

started = time.perf_counter()
ptq_prepared = prepare_pt2e(
    export_digits_model(model),
    XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False)),
)
with torch.no_grad():
    ptq_prepared(digits("calibration")[0])
ptq_model = convert_pt2e(ptq_prepared)
ptq_accuracy = accuracy(ptq_model)
print(f"PTQ {ptq_accuracy:.1%}（{time.perf_counter() - started:.0f} 秒）")
assert ptq_accuracy < fp32_accuracy - 0.03, "per-tensor PTQ 掉了超過 3 個百分點"

# %%
# 步驟 2 — 用 QAT 設定做 prepare_qat_pt2e
# ---------------------------------------
# ``common.qat.prepare`` 以訓練模式、動態批次匯出一份副本，再用
# ``get_symmetric_quantization_config(is_per_channel=False, is_qat=True)`` 呼叫
# ``prepare_qat_pt2e``。為了訓練，每個 BatchNorm 都留在 graph 裡：MobileNetV2 每個 conv 後面
# 都有一個。

started = time.perf_counter()
qat_model = prepare(model)
print(f"prepare_qat_pt2e：{time.perf_counter() - started:.0f} 秒")
modules = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
named = qat_model.named_modules(remove_duplicate=False)  # a shared fake quantize: each name
fake_quantize = [n for n, m in named if isinstance(m, FakeQuantizeBase)]
print(f"graph 裡有 {len(batch_norms(qat_model))} 個 BatchNorm（模型裡有 {modules} 個）")
print(f"{len(fake_quantize)} 個 fake quantize 模組")
assert len(batch_norms(qat_model)) == modules

# %%
# 整個 graph 很長；看一個 block 就知道每個 conv 變成了什麼。下面是 stage 2 的第二個
# inverted residual block（1×1 擴張、3×3 depthwise、1×1 投影，再加上它的輸入），用同樣的
# 方式單獨 prepare。每個 conv 的 weight 在進入 fake quantize 之前先乘上
# ``γ / √(running_var + ε)``，所以它訓練時對齊的 int8 刻度，就是 ``convert_pt2e`` 之後折疊
# 出來的 weight 的刻度；conv 的輸出再除回去，交給 BatchNorm（標示出來的 node）正規化：統計值
# 更新期間用這個批次自己的統計值，凍結之後用 running 統計值。

block = model.net.features[3]
channels = block.conv[0][0].in_channels
one_block = prepare_qat_pt2e(
    torch.export.export(copy.deepcopy(block).train(), (torch.randn(2, channels, 8, 8),)).module(),
    qat_quantizer(),
)
norms = [n.name for n in batch_norms(one_block)]
draw(one_block, highlight=norms, title="步驟 2：為 QAT prepare 之後的一個 inverted residual block")
assert len(norms) == 3, "block 裡每個 conv 各有一個 BatchNorm"

# %%
# 步驟 3 — 第 1 個 epoch：全部都更新；存 checkpoint
# -------------------------------------------------
# QAT 共四個 epoch，每個 epoch 各有一個學習率。第一個 epoch 訓練時，observer 與 BatchNorm
# 統計值都在更新（學習率 3e-4，浮點數訓練的十分之一：模型已經訓練過）。統計值跟著 weight
# 移動；running variance 移動了多少會印出來。接著把這次訓練存成 checkpoint：prepare 後模型的
# ``state_dict``，以及 optimizer 的。

LEARNING_RATES = (3e-4, 3e-4, 1e-4, 3e-5)  # per epoch: one updating, three frozen
move_exported_model_to_train(qat_model)
optimizer = torch.optim.Adam(qat_model.parameters(), lr=LEARNING_RATES[0])
variances = [qat_model.get_buffer(n.args[4].target).clone() for n in batch_norms(qat_model)]
started = time.perf_counter()
losses = [train_epoch(qat_model, optimizer, epoch=0)]
print(f"第 1 個 epoch：loss {losses[0]:.4f}，花了 {time.perf_counter() - started:.0f} 秒")
moved = [
    ((qat_model.get_buffer(n.args[4].target) - before).abs() / before).max().item()
    for n, before in zip(batch_norms(qat_model), variances, strict=True)
]
median = sorted(moved)[len(moved) // 2]
print(f"running variance 最多移動了 {max(moved):.0%}（各層的中位數 {median:.0%}）")
assert max(moved) > 0.01, "更新期間，統計值跟著 weight 移動"

folder = Path(tempfile.mkdtemp())
checkpoint = {"model": qat_model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}
torch.save(checkpoint, folder / "qat.pt")
state = checkpoint["model"]
kinds = {
    "parameters": sum(k in dict(qat_model.named_parameters()) for k in state),
    "BatchNorm statistics": sum(k.endswith(("running_mean", "running_var")) for k in state),
    "fake quantize scales": sum(k.endswith(".scale") for k in state),
    "fake quantize zero points": sum(k.endswith(".zero_point") for k in state),
    "observer min/max": sum(k.endswith(("min_val", "max_val")) for k in state),
}
for kind, count in kinds.items():
    print(f"{kind:<28}{count:>5}")
assert kinds["fake quantize scales"] == len(fake_quantize) > 0
assert kinds["BatchNorm statistics"] == 2 * modules

# %%
# 步驟 4 — 第 2 到第 4 個 epoch：凍結 observer 與 BatchNorm 統計值
# -----------------------------------------------------------------
# 接下來的 epoch 兩者都凍結，和 M04-3 一樣：scale 不再移動，每個 BatchNorm 都用
# ``convert_pt2e`` 之後會折疊進 conv 的 running 統計值來正規化，所以 weight 是對著 int8 模型
# 將來的折疊結果訓練的。``disable_observer`` 改的是 buffer（在 checkpoint 裡）；凍結
# BatchNorm 改的是 graph 裡的參數（不在 checkpoint 裡）。學習率每個 epoch 大約降為三分之一，
# 和一般微調的排程一樣：最後幾個 epoch 只走小步。

qat_model.apply(disable_observer)
freeze_batch_norm(qat_model)
scales = {k: v.clone() for k, v in qat_model.state_dict().items() if k.endswith(".scale")}
means = [qat_model.get_buffer(n.args[3].target).clone() for n in batch_norms(qat_model)]
for epoch in range(1, len(LEARNING_RATES)):
    for group in optimizer.param_groups:
        group["lr"] = LEARNING_RATES[epoch]
    losses.append(train_epoch(qat_model, optimizer, epoch=epoch))
    print(f"第 {epoch + 1} 個 epoch：學習率 {LEARNING_RATES[epoch]:.0e}，loss {losses[-1]:.4f}")
    if epoch == 1:  # what the resumed run below must reproduce
        uninterrupted = fingerprint(qat_model.state_dict(), optimizer.state_dict())
after = qat_model.state_dict()
assert all(torch.equal(after[k], v) for k, v in scales.items()), "scale 已凍結"
now = [qat_model.get_buffer(n.args[3].target) for n in batch_norms(qat_model)]
assert all(torch.equal(a, b) for a, b in zip(means, now, strict=True)), "統計值已凍結"

# %%
# 步驟 5 — 在全新的 process 裡接著跑
# ----------------------------------
# prepare 過的 QAT 模型無法用 ``torch.export.save`` 儲存（它的 fake quantize 是模組，不是
# op），而從浮點數模型重新 prepare，scale 與統計值都會從頭開始。可行的做法：「用同樣的方式」
# 重建 prepare 後的模型（同樣的模型程式碼、同樣的範例輸入、同樣的 quantizer；未訓練的 weight
# 無所謂，checkpoint 會覆蓋），載入兩份 state dict，再套用一次排程對 graph 的修改，然後繼續。
# 下面的腳本在新的 Python 裡執行：從 checkpoint 跑第 2 個 epoch，再算出模型與 optimizer 每個
# tensor 的雜湊值，和上面那次訓練在第 2 個 epoch 之後算的雜湊值比較。

RESUME = f"""
import torch
from torchao.quantization.pt2e import disable_observer, move_exported_model_to_train
from common.qat import digits_mobilenet_v2, fingerprint, freeze_batch_norm, prepare, train_epoch

checkpoint = torch.load({str(folder / "qat.pt")!r}, weights_only=True)
model = prepare(digits_mobilenet_v2())
model.load_state_dict(checkpoint["model"])
move_exported_model_to_train(model)
optimizer = torch.optim.Adam(model.parameters())
optimizer.load_state_dict(checkpoint["optimizer"])
model.apply(disable_observer)
freeze_batch_norm(model)
epoch = checkpoint["epoch"]
for group in optimizer.param_groups:
    group["lr"] = {LEARNING_RATES}[epoch]
train_epoch(model, optimizer, epoch=epoch)
result = fingerprint(model.state_dict(), optimizer.state_dict())
"""
print(RESUME)
started = time.perf_counter()
# 全新的 process 要走和這個 process 相同的浮點數 kernel：ISA_PATHS 變數設的上限也一樣
capped = [isa for isa, cap in ISA_PATHS.items() if cap.items() <= os.environ.items()]
resumed = run_under_isa(capped[0] if capped else "native", RESUME)["result"]
print(f"不中斷 {uninterrupted[:16]}…\n接著跑 {resumed[:16]}…")
print(f"（全新的 process 花了 {time.perf_counter() - started:.0f} 秒）")
assert resumed == uninterrupted, "逐位元一致"

# %%
# 什麼會讓它接不上：任何改變 prepare 後 graph 的東西，都會改變它的 key。例如 x86 quantizer
# 把 fake quantize 放在別處，checkpoint 就載入不了（換一個範例輸入或動態形狀，也會同樣改變
# graph）。

other = prepare(
    model,
    X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True)),
)
with expect_error(RuntimeError, match="state_dict"):
    other.load_state_dict(checkpoint["model"])
extra = set(checkpoint["model"]) ^ set(other.state_dict())
print(f"有 {len(extra)} 個 key 不同")
assert extra

# %%
# 步驟 6 — convert_pt2e 折疊每一個 BatchNorm
# -------------------------------------------
# ``convert_pt2e`` 把 fake quantize 換成 q/dq，並用凍結的 running 統計值把每個 BatchNorm
# 折疊進它的 conv：第一個 conv 的 int8 weight 乘上 scale，與 ``w · γ / √(running_var + ε)``
# 先截到 int8 範圍之後，相差不到半個刻度（scale 在第 1 個 epoch 之後就凍結了；之後長到範圍
# 之外的 weight 會被截斷）。

move_exported_model_to_eval(qat_model)
qat_fq_accuracy = accuracy(qat_model)
before = {k: v.clone() for k, v in qat_model.state_dict().items()}
started = time.perf_counter()
converted = convert_pt2e(qat_model)
print(f"convert_pt2e：{time.perf_counter() - started:.0f} 秒")
print(f"BatchNorm：之前 {len(variances)} 個，之後 {len(batch_norms(converted))} 個")
assert not batch_norms(converted), "全部折疊了"
conv = next(n for n in converted.graph.nodes if n.target is torch.ops.aten.conv2d.default)
int8_weight = getattr(converted, conv.args[1].args[0].target)
step = conv.args[1].args[1]
gamma = before["net.features.0.1.weight"] / torch.sqrt(
    before["net.features.0.1.running_var"] + 1e-5
)
folded = before["net.features.0.0.weight"] * gamma.reshape(-1, 1, 1, 1)
low, high = conv.args[1].args[3] * step, conv.args[1].args[4] * step  # the int8 range
clamped = ((folded < low) | (folded > high)).sum().item()
error = (int8_weight.float() * step - folded.clamp(low, high)).abs().max().item()
print(f"第一個 conv：int8 × {step:.5f} 對折疊後的 weight，最大誤差 {error / step:.2f} 個刻度")
print(f"{clamped} 個 weight 在第 1 個 epoch 之後長到凍結的範圍之外，被截斷了")
assert error <= step / 2 + 1e-6

# %%
# 步驟 7 — QAT 模型在手機的 runtime 上
# ------------------------------------
# q/dq 模型照 M06 的方式下放（``XnnpackPartitioner``：連放大也一起 delegate），成為
# ``.pte``。ExecuTorch runtime 一次一張，分類 500 張測試影像。

qat_accuracy = accuracy(converted)
print(f"fake quantize、BatchNorm 分開：{qat_fq_accuracy:.1%}；q/dq、已折疊：{qat_accuracy:.1%}")
assert abs(qat_accuracy - qat_fq_accuracy) <= 0.02, "折疊保留了 QAT 訓練的結果"
images, labels = digits("test")
started = time.perf_counter()
pte = to_executorch(converted, (images[:1],), partitioner=XnnpackPartitioner()).buffer
print(f"下放成 {len(pte) / 1024:.0f} KiB 的 .pte，花了 {time.perf_counter() - started:.0f} 秒")
with contextlib.redirect_stderr(io.StringIO()):  # the runtime's CPU-probing log lines
    program = Runtime.get().load_program(pte)
    method = program.load_method("forward")  # a Method does not keep its Program alive
predicted = torch.cat([method.execute([image[None]])[0] for image in images]).argmax(dim=1)
with torch.no_grad():
    reference = converted(images).argmax(dim=1)
pte_accuracy = (predicted == labels).float().mean().item()
agree = (predicted == reference).sum().item()
print(f"q/dq {qat_accuracy:.1%}，.pte {pte_accuracy:.1%}；{agree} 張同類（共 {len(labels)} 張）")
assert abs(pte_accuracy - qat_accuracy) <= 0.01 and agree >= 0.98 * len(labels)

# %%
# 分類結果並非全部一致：XNNPACK 以整數累加器計算每個 int8 conv、最後只重新量化一次，而
# q/dq 模型在 dequantize 與 quantize 之間用浮點數計算，所以輸出可能差一個 int8 刻度。在被
# 離群值撐大的 per-tensor scale 後面，一個刻度就寬到足以翻轉幾個勢均力敵的判斷。

# %%
# 步驟 8 — fp32、PTQ 與 QAT
# -------------------------
# 同一個模型、同一份 per-tensor 配方、同樣 500 張測試影像；數字都是這次建置量到的。assert 的
# 是：PTQ 掉了超過 3 個百分點（步驟 1），QAT 至少拿回其中一半，且與 fp32 相差不到 1 個百分點。
# 換一條 kernel 路徑，就會訓練出另一個浮點數模型（weight 依路徑分別快取），所以這三個數字
# 會在 500 張測試影像中差個幾張。

table = {"fp32": fp32_accuracy, "PTQ (per-tensor)": ptq_accuracy, "QAT (per-tensor)": qat_accuracy}
for label, value in table.items():
    print(f"{label:<18}{value:>7.1%}")
lost, won = fp32_accuracy - ptq_accuracy, qat_accuracy - ptq_accuracy
print(f"PTQ 掉了 {lost * 100:.1f} 個百分點；QAT 拿回其中 {won * 100:.1f} 個")
assert won > lost / 2, "QAT 至少拿回 PTQ 損失的一半"
assert qat_accuracy >= fp32_accuracy - 0.01, "QAT 與 fp32 相差不到 1 個百分點"
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
ax.set_title("MobileNetV2：per-tensor int8 的準確度（XNNPACK）")
fig.tight_layout()

# %%
# 小結
# ----
# - 在 MobileNetV2 上，QAT 排程和 M04-3 一樣：先一個 epoch 讓 observer 與 BatchNorm 統計值
#   都更新，再兩者都凍結，學習率逐步降低；``convert_pt2e`` 用凍結的統計值折疊每一個
#   BatchNorm。
# - QAT checkpoint 就是 prepare 後模型的 ``state_dict`` （weight、BatchNorm 統計值、
#   fake quantize 的 scale 與 zero point、observer 狀態）加上 optimizer 的。接著跑的方法：
#   用同樣的方式 prepare、兩者都載入、再套用一次排程對 graph 的修改。
# - 帶 ``is_qat=True`` 的 ``XNNPACKQuantizer``，和 PTQ 的模型一樣下放成 ``.pte``。
#
# 練習
# ----
# 1. 存 checkpoint 的時候，其中有幾個 fake quantize 已經凍結？先預測。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          saved = torch.load(folder / "qat.pt", weights_only=True)["model"]
#          enabled = [v for k, v in saved.items() if k.endswith("observer_enabled")]
#          print(f"{sum(int(v) for v in enabled)} 個在觀察（共 {len(enabled)} 個）")
#          assert enabled and all(int(v) == 1 for v in enabled), "存檔時還沒凍結"
#
# 2. Adam 為每個參數保留兩個移動平均。checkpoint 的 optimizer 狀態裡有多少個 tensor？它們的
#    形狀和參數的比起來如何？先預測。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          saved = torch.load(folder / "qat.pt", weights_only=True)["optimizer"]["state"]
#          averages = [s[k] for s in saved.values() for k in ("exp_avg", "exp_avg_sq")]
#          print(f"{len(saved)} 個參數，{len(averages)} 個移動平均")
#          assert len(saved) == kinds["parameters"] and len(averages) == 2 * len(saved)
#          assert all(s["exp_avg"].shape == s["exp_avg_sq"].shape for s in saved.values())
#
# 下一課
# ------
# 網站首頁的課程地圖列出了所有單元。
