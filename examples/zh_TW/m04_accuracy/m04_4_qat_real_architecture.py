"""
M04-4 在真實架構上做 QAT
========================

M04-3 在三層 conv 的 CNN 上跑了 QAT 排程。本頁改在 torchvision 的 MobileNetV2 上跑（depthwise
conv、每個 conv 後面都有 BatchNorm、ReLU6），並照 ExecuTorch 的 ``XNNPACKQuantizer`` 為手機量化
的方式來做：per-tensor 的 int8 PTQ 掉了準確度，QAT 拿回其中大部分（對照的是以同樣排程微調的
浮點數模型）；QAT 訓練跑到中途存成
checkpoint，在全新的行程裡接著跑，結果逐位元相同；最後 QAT 模型以 ``.pte`` 在 ExecuTorch
執行環境上執行。

**你會學到**

- QAT 在 MobileNetV2 上需要的 BatchNorm 處理：統計值先更新、再凍結；``convert_pt2e`` 折疊了
  什麼
- QAT checkpoint 裡有什麼、如何在另一個行程裡接著跑（步驟的順序）、什麼會讓它接不上；以及
  QAT 到底換到什麼：和在驗證集上挑選排程的浮點數對照組相比
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

from common.charts import pad, use_course_style
from common.cpu import ISA_PATHS, describe, run_under_isa
from common.data import accuracy, digits, export_digits_model
from common.expect import expect_error
from common.pt2e import quiet
from common.qat import (
    batch_norms,
    fine_tune_float,
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
# 活化值都沒有遠大於其他通道的通道。在 ImageNet 上訓練的 MobileNetV2 就有（Nagel 等人，
# 〈Data-Free Quantization〉，2019：MobileNetV2 的 per-tensor int8 PTQ 掉到跟亂猜一樣）。所以
# 比照 M04-2，在不改變模型計算結果的前提下植入一個這樣的通道：第一個 block 輸出的通道 0
# 乘以 100（它的 BatchNorm 的 γ 與 β），在下一個 conv 讀它的地方再除以 100。浮點數模型不變；
# 它的 int8 模型就變了。

FACTOR = 100
model = copy.deepcopy(trained)
with torch.no_grad():
    block_out = model.net.features[1].conv[2]  # block 1 投影之後的 BatchNorm
    block_out.weight[0] *= FACTOR
    block_out.bias[0] *= FACTOR
    model.net.features[2].conv[0][0].weight[:, 0] /= FACTOR  # block 2 的擴張 conv
fp32_accuracy = accuracy(model)
print(f"fp32：訓練後 {trained_accuracy:.1%}，植入離群通道後 {fp32_accuracy:.1%}")
assert abs(fp32_accuracy - trained_accuracy) <= 0.002, "浮點數下是同一個函式"

# %%
# 下面 QAT 訓練的排程（四個 epoch 與各自的學習率）是在驗證集上挑的，從來不看測試集：驗證集
# 就是那 200 張校準影像，沒有任何一步訓練讀過它們的標籤。``validation_accuracy`` 在每個
# epoch 之後量測 prepare 後的模型在驗證集上的準確度，量的是一份移到 eval、關掉 observer 的
# 副本：訓練用的圖（BatchNorm 用每個批次自己的統計值）不是要部署的模型。


def validation_accuracy(gm: torch.fx.GraphModule) -> float:
    """prepare 後的模型在驗證集上的準確度，量的是 eval 模式的副本。"""
    evaluated = copy.deepcopy(gm)
    evaluated.apply(disable_observer)  # 評估時不能讓 scale 移動
    move_exported_model_to_eval(evaluated)
    return accuracy(evaluated, "calibration")


# %%
# 步驟 1 — 給手機用的 per-tensor PTQ
# -----------------------------------
# ExecuTorch 的 ``XNNPACKQuantizer``，weight 用 per-tensor（``is_per_channel=False``），以 200
# 張校準影像校準。每個張量只有一個 scale，正是離群值代價最高的配方：那個活化值的其他通道
# 都只分到幾格。

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
# ``prepare_qat_pt2e``。為了訓練，每個 BatchNorm 都留在圖裡：MobileNetV2 每個 conv 後面
# 都有一個。

started = time.perf_counter()
qat_model = prepare(model)
print(f"prepare_qat_pt2e：{time.perf_counter() - started:.0f} 秒")
modules = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
named = qat_model.named_modules(remove_duplicate=False)  # 共用的 fake quantize：每個名稱都算
fake_quantize = [n for n, m in named if isinstance(m, FakeQuantizeBase)]
print(f"圖裡有 {len(batch_norms(qat_model))} 個 BatchNorm（模型裡有 {modules} 個）")
print(f"{len(fake_quantize)} 個 fake quantize 模組")
assert len(batch_norms(qat_model)) == modules

# %%
# 整張圖很長；看一個 block 就知道每個 conv 變成了什麼。下面是 stage 2 的第二個
# inverted residual block（1×1 擴張、3×3 depthwise、1×1 投影，再加上它的輸入），用同樣的
# 方式單獨 prepare。每個 conv 的 weight 在進入 fake quantize 之前先乘上
# ``γ / √(running_var + ε)``，所以它訓練時對齊的 int8 格點，就是 ``convert_pt2e`` 之後折疊
# 出來的 weight 的格點；conv 的輸出再除回去，交給 BatchNorm（標示出來的 node）正規化：統計值
# 更新期間用這個批次自己的統計值，凍結之後用 running 統計值。

block = model.net.features[3]
channels = block.conv[0][0].in_channels
one_block = prepare_qat_pt2e(
    torch.export.export(copy.deepcopy(block).train(), (torch.randn(2, channels, 8, 8),)).module(),
    qat_quantizer(),
)
norms = [n.name for n in batch_norms(one_block)]
draw(one_block, highlight=norms, title="步驟 2：為 QAT 做過 prepare 的一個 inverted residual block")
assert len(norms) == 3, "block 裡每個 conv 各有一個 BatchNorm"

# %%
# 步驟 3 — 第 1 個 epoch：全部都更新；存 checkpoint
# -------------------------------------------------
# QAT 共四個 epoch，每個 epoch 各有一個學習率。第一個 epoch 訓練時，observer 與 BatchNorm
# 統計值都在更新（學習率 3e-4，浮點數訓練的十分之一：模型已經訓練過）。統計值跟著 weight
# 移動；running variance 移動了多少會印出來，驗證集上的準確度也是。接著把這次訓練存成
# checkpoint：prepare 後模型的 ``state_dict``，以及 optimizer 的。

LEARNING_RATES = (3e-4, 3e-4, 1e-4, 3e-5)  # 每個 epoch 一個：更新期間一個，凍結後三個
move_exported_model_to_train(qat_model)
optimizer = torch.optim.Adam(qat_model.parameters(), lr=LEARNING_RATES[0])
variances = [qat_model.get_buffer(n.args[4].target).clone() for n in batch_norms(qat_model)]
started = time.perf_counter()
losses = [train_epoch(qat_model, optimizer, epoch=0)]
seconds = time.perf_counter() - started
validation = [validation_accuracy(qat_model)]
print(f"第 1 個 epoch：loss {losses[0]:.4f}，驗證集 {validation[0]:.1%}（{seconds:.0f} 秒）")
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
    "參數": sum(k in dict(qat_model.named_parameters()) for k in state),
    "BatchNorm 統計值": sum(k.endswith(("running_mean", "running_var")) for k in state),
    "fake quantize 的 scale": sum(k.endswith(".scale") for k in state),
    "fake quantize 的 zero point": sum(k.endswith(".zero_point") for k in state),
    "observer 的 min／max": sum(k.endswith(("min_val", "max_val")) for k in state),
}
for kind, count in kinds.items():
    print(f"{pad(kind, 28)}{count:>5}")
assert kinds["fake quantize 的 scale"] == len(fake_quantize) > 0
assert kinds["BatchNorm 統計值"] == 2 * modules

# %%
# 步驟 4 — 第 2 到第 4 個 epoch：凍結 observer 與 BatchNorm 統計值
# -----------------------------------------------------------------
# 接下來的 epoch 兩者都凍結，和 M04-3 一樣：scale 不再移動，每個 BatchNorm 都用
# ``convert_pt2e`` 之後會折疊進 conv 的 running 統計值來正規化，所以 weight 是對著 int8 模型
# 將來的折疊結果訓練的。``disable_observer`` 改的是 buffer（在 checkpoint 裡）；凍結
# BatchNorm 改的是圖裡每個 ``batch_norm`` node 的 ``training`` 引數（不在 checkpoint 裡）。
# 學習率每個 epoch 大約降為三分之一，和一般微調的排程一樣：最後幾個 epoch 只走小步。每個
# epoch 都印出驗證集上的準確度：挑選這個排程時看的，就是這些數字。

qat_model.apply(disable_observer)
freeze_batch_norm(qat_model)
scales = {k: v.clone() for k, v in qat_model.state_dict().items() if k.endswith(".scale")}
means = [qat_model.get_buffer(n.args[3].target).clone() for n in batch_norms(qat_model)]
for epoch in range(1, len(LEARNING_RATES)):
    for group in optimizer.param_groups:
        group["lr"] = LEARNING_RATES[epoch]
    losses.append(train_epoch(qat_model, optimizer, epoch=epoch))
    validation.append(validation_accuracy(qat_model))
    rate, loss, acc = LEARNING_RATES[epoch], losses[-1], validation[-1]
    print(f"第 {epoch + 1} 個 epoch：學習率 {rate:.0e}，loss {loss:.4f}，驗證集 {acc:.1%}")
    if epoch == 1:  # 下面接著跑的那次必須重現這個值
        uninterrupted = fingerprint(qat_model.state_dict(), optimizer.state_dict())
after = qat_model.state_dict()
assert all(torch.equal(after[k], v) for k, v in scales.items()), "scale 已凍結"
now = [qat_model.get_buffer(n.args[3].target) for n in batch_norms(qat_model)]
assert all(torch.equal(a, b) for a, b in zip(means, now, strict=True)), "統計值已凍結"

# %%
# 步驟 5 — 在全新的行程裡接著跑
# -----------------------------
# prepare 過的 QAT 模型無法用 ``torch.export.save`` 儲存（它的 fake quantize 是模組，不是
# 運算），而從浮點數模型重新 prepare，scale 與統計值都會從頭開始。可行的做法：「用同樣的方式」
# 重建 prepare 後的模型（同樣的模型程式碼、同樣的範例輸入、同樣的 quantizer；未訓練的 weight
# 無所謂，checkpoint 會覆蓋），載入兩份 state dict，再套用一次排程對圖的修改，然後繼續。
# 下面的腳本在新的 Python 裡執行：從 checkpoint 跑第 2 個 epoch，再算出模型與 optimizer 每個
# 張量的雜湊值，和上面那次訓練在第 2 個 epoch 之後算的雜湊值比較。

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
# 全新的行程要走和這個行程相同的浮點數 kernel：ISA_PATHS 變數設的上限也一樣
capped = [isa for isa, cap in ISA_PATHS.items() if cap.items() <= os.environ.items()]
resumed = run_under_isa(capped[0] if capped else "native", RESUME)["result"]
print(f"不中斷 {uninterrupted[:16]}…\n接著跑 {resumed[:16]}…")
print(f"（全新的行程花了 {time.perf_counter() - started:.0f} 秒）")
assert resumed == uninterrupted, "逐位元相同"

# %%
# 腳本裡的順序很重要：先 ``move_exported_model_to_train``，再 ``freeze_batch_norm``。在剛
# prepare 好的圖上，``move_exported_model_to_train`` 會把每個 BatchNorm 改回訓練模式
# （``training=True``）：在它之前做的凍結會被悄悄還原，接著跑的訓練就改用批次統計值。圖已經
# 在訓練模式時，這個呼叫什麼也不做；上面那次訓練在第一個 epoch 之前就移過了。下面把步驟 2
# 那個剛 prepare 好的 block 用兩種順序各做一次，印出它每個 BatchNorm 的 ``training`` 旗標：

wrong, right = copy.deepcopy(one_block), copy.deepcopy(one_block)
freeze_batch_norm(wrong)
move_exported_model_to_train(wrong)  # 凍結被還原
move_exported_model_to_train(right)
freeze_batch_norm(right)
for order, gm in (("先凍結，再移到訓練模式", wrong), ("先移到訓練模式，再凍結", right)):
    print(f"{pad(order, 24)}training = {[n.args[5] for n in batch_norms(gm)]}")
assert all(n.args[5] for n in batch_norms(wrong)), "凍結被還原了：用批次統計值"
assert not any(n.args[5] for n in batch_norms(right)), "已凍結：用 running 統計值"

# %%
# 什麼會讓它接不上：任何改變 prepare 後那張圖的東西，都會改變 ``state_dict`` 的 key。例如
# x86 quantizer 產生的 fake quantize 比較少，checkpoint 裡有 x86 的圖沒有的 key，就載入不了
# （換一個範例輸入或動態形狀，也會同樣改變這張圖）。錯誤訊息只列出這些 key。兩邊都有的 key
# 裡，有 52 個形狀不同：x86 的 weight observer 是 per-channel
# （``MovingAveragePerChannelMinMaxObserver``，每個輸出通道各有一組最小值與最大值），這個
# checkpoint 的是 per-tensor，而載入時它們會直接換成 checkpoint 的形狀與數值，不會報錯：就連
# 這裡被拒絕的那次載入，也已經改了它們的形狀。所以 key 對得上還不夠：也要比對 fake quantize
# 的 ``qscheme``。

other = prepare(
    model,
    X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True)),
)
saved, theirs = checkpoint["model"], other.state_dict()
shared = set(saved) & set(theirs)
reshaped = [k for k in shared if saved[k].shape != theirs[k].shape]
with expect_error(RuntimeError, match="state_dict") as caught:
    other.load_state_dict(saved)
extra = set(saved) ^ set(theirs)
print(f"有 {len(extra)} 個 key 只有一邊有；{len(reshaped)} 個共有的 key 形狀不同")
assert extra and len(reshaped) == 52 and "size mismatch" not in str(caught.error)
loaded = other.state_dict()
assert all(torch.equal(loaded[k], saved[k]) for k in reshaped), "被拒絕了，形狀卻已經改了"

# %%
# 步驟 6 — convert_pt2e 折疊每一個 BatchNorm
# -------------------------------------------
# ``convert_pt2e`` 把 fake quantize 換成 q/dq，並用凍結的 running 統計值把每個 BatchNorm
# 折疊進它的 conv：第一個 conv 的 int8 weight 乘上 scale，和 ``w · γ / √(running_var + ε)``
# 截到 int8 範圍內的值相比，相差不到半格（scale 在第 1 個 epoch 之後就凍結了；之後長到範圍
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
low, high = conv.args[1].args[3] * step, conv.args[1].args[4] * step  # int8 範圍
clamped = ((folded < low) | (folded > high)).sum().item()
error = (int8_weight.float() * step - folded.clamp(low, high)).abs().max().item()
print(f"第一個 conv：int8 × {step:.5f} 與折疊後的 weight 相比，最大誤差 {error / step:.2f} 格")
print(f"{clamped} 個 weight 在第 1 個 epoch 之後長到凍結的範圍之外，被截斷了")
assert error <= step / 2 + 1e-6

# %%
# 步驟 7 — QAT 模型在手機的執行環境上
# ------------------------------------
# q/dq 模型照 M06 的方式下放（``XnnpackPartitioner``：連放大也一併委派），成為
# ``.pte``。ExecuTorch 執行環境一次一張，分類 500 張測試影像。

qat_accuracy = accuracy(converted)
print(f"fake quantize、BatchNorm 分開：{qat_fq_accuracy:.1%}；q/dq、已折疊：{qat_accuracy:.1%}")
assert abs(qat_accuracy - qat_fq_accuracy) <= 0.02, "折疊保留了 QAT 訓練的結果"
images, labels = digits("test")
started = time.perf_counter()
pte = to_executorch(converted, (images[:1],), partitioner=XnnpackPartitioner()).buffer
print(f"下放成 {len(pte) / 1024:.0f} KiB 的 .pte，花了 {time.perf_counter() - started:.0f} 秒")
with contextlib.redirect_stderr(io.StringIO()):  # 執行環境偵測 CPU 時寫的紀錄
    program = Runtime.get().load_program(pte)
    method = program.load_method("forward")  # Method 不會讓它的 Program 繼續存活
predicted = torch.cat([method.execute([image[None]])[0] for image in images]).argmax(dim=1)
with torch.no_grad():
    reference = converted(images).argmax(dim=1)
pte_accuracy = (predicted == labels).float().mean().item()
agree = (predicted == reference).sum().item()
print(
    f"q/dq {qat_accuracy:.1%}，.pte {pte_accuracy:.1%}；{agree} 張分類相同（共 {len(labels)} 張）"
)
assert abs(pte_accuracy - qat_accuracy) <= 0.01 and agree >= 0.98 * len(labels)

# %%
# 分類結果並非全部一致：XNNPACK 以整數累加器計算每個 int8 conv、最後只重新量化一次，而
# q/dq 模型在 dequantize 與 quantize 之間用浮點數計算，所以輸出可能差一格。per-tensor
# scale 被離群值撐大之後，一格就寬到足以讓幾張難分高下的影像換了類別。

# %%
# 步驟 8 — 浮點數對照組：同樣的 epoch，用浮點數訓練
# -------------------------------------------------
# QAT 比 fp32 模型多訓練了四個 epoch，它的進步可能有一部分來自這些訓練，而不是 fake
# quantize。對照組是以同樣排程用浮點數微調的 fp32 模型：同樣的四個 epoch、同樣的批次與
# 學習率，第一個 epoch 之後凍結 BatchNorm（``common.qat.fine_tune_float``；它的 weight 和
# 浮點數模型的一樣會快取，以產生它的一切為 key）。下面是它每個 epoch 之後在驗證集上的準確度，
# 和 QAT 的並列：

tuned, tuned_validation = fine_tune_float(model, LEARNING_RATES)
for epoch, (ours, control) in enumerate(zip(validation, tuned_validation, strict=True)):
    print(f"第 {epoch + 1} 個 epoch：驗證集準確度，QAT {ours:.1%}，浮點數微調 {control:.1%}")
tuned_accuracy = accuracy(tuned)

# %%
# 步驟 9 — fp32、浮點數微調、PTQ 與 QAT
# -------------------------------------
# 四個數字用的是同樣 500 張測試影像；數字都是這次建置量到的。PTQ 的比較對象是 fp32，也就是
# 它量化的模型；QAT 的比較對象是訓練一樣久的浮點數微調。assert 的是（邊際在好幾個 seed 與兩條
# kernel 路徑上都驗證過）：QAT 比 PTQ 高超過 3 個百分點，而且從 PTQ 到浮點數微調的這段差距，
# QAT 至少拿回三分之二。剩下的，就是 QAT 做完之後 per-tensor int8 仍要付出的代價。它有多少
# 取決於浮點數模型，而換一條 kernel 路徑就會訓練出另一個浮點數模型（weight 依路徑分別
# 快取）：這四個數字會在 500 張測試影像中差個幾張。

table = {
    "fp32": fp32_accuracy,
    "fp32（同樣的 epoch）": tuned_accuracy,
    "PTQ（per-tensor）": ptq_accuracy,
    "QAT（per-tensor）": qat_accuracy,
}
for label, value in table.items():
    print(f"{pad(label, 20)}{value:>7.1%}")
assert qat_accuracy > ptq_accuracy + 0.03, "QAT 比 PTQ 高超過 3 個百分點"
won, way = qat_accuracy - ptq_accuracy, tuned_accuracy - ptq_accuracy
print(f"從 PTQ 到浮點數微調的差距，QAT 拿回了 {won / way:.0%}")
assert won >= 2 / 3 * way, "從 PTQ 到浮點數微調的差距，QAT 至少拿回三分之二"
# sphinx_gallery_start_ignore
from common.results import publish  # 首頁引用的數字

publish("fp32_accuracy", fp32_accuracy)
publish("fp32_tuned_accuracy", tuned_accuracy)
publish("ptq_accuracy", ptq_accuracy)
publish("qat_accuracy", qat_accuracy)
# sphinx_gallery_end_ignore

fig, ax = plt.subplots(figsize=(6, 3))
colors = ["#999999", "#555555", "#c44e52", "#4c72b0"]
ax.bar(list(table), [v * 100 for v in table.values()], color=colors)
ax.set_ylabel("測試準確度（%）")
ax.set_ylim(0, 100)
ax.set_title("MobileNetV2：per-tensor int8 的準確度（XNNPACK）")
fig.tight_layout()

# %%
# 一張影像就是 0.2 個百分點，而兩個準確度之差，本身也是兩個數相減：QAT 答對、另一個模型
# 答錯的影像數，減去反過來的影像數。下面在同樣的測試影像上，把這兩個數都列出來：

with torch.no_grad():
    right = {
        "PTQ": ptq_model(images).argmax(dim=1) == labels,
        "浮點數微調": tuned(images).argmax(dim=1) == labels,
    }
for rival, correct in right.items():
    gained = (reference.eq(labels) & ~correct).sum().item()
    lost = (~reference.eq(labels) & correct).sum().item()
    print(f"QAT 對「{rival}」：{gained} 張 QAT 答對而「{rival}」答錯，反過來的有 {lost} 張")

# %%
# 小結
# ----
# - 在 MobileNetV2 上，QAT 排程和 M04-3 一樣：先一個 epoch 讓 observer 與 BatchNorm 統計值
#   都更新，再兩者都凍結，學習率逐步降低；``convert_pt2e`` 用凍結的統計值折疊每一個
#   BatchNorm。
# - QAT checkpoint 就是 prepare 後模型的 ``state_dict`` （weight、BatchNorm 統計值、
#   fake quantize 的 scale 與 zero point、observer 狀態）加上 optimizer 的。接著跑的方法：
#   用同樣的方式 prepare、兩者都載入、把圖移到訓練模式，然後才再套用一次排程對圖的修改：
#   這一移會還原在它之前做的 BatchNorm 凍結。key 對得上還不夠：也要比對 fake quantize 的
#   ``qscheme``。
# - 拿 QAT 和以同樣排程微調的浮點數模型比較，並在驗證集上挑選排程：這裡從 PTQ 到這個對照組
#   的差距，QAT 拿回了大部分；剩下的，是 per-tensor int8 仍要付出的代價。
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
# 2. Adam 為每個參數保留兩個移動平均。checkpoint 的 optimizer 狀態裡有多少個張量？它們的
#    形狀和參數的比起來如何？先預測。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          saved = torch.load(folder / "qat.pt", weights_only=True)["optimizer"]["state"]
#          averages = [s[k] for s in saved.values() for k in ("exp_avg", "exp_avg_sq")]
#          print(f"{len(saved)} 個參數，{len(averages)} 個移動平均")
#          assert len(saved) == kinds["參數"] and len(averages) == 2 * len(saved)
#          assert all(s["exp_avg"].shape == s["exp_avg_sq"].shape for s in saved.values())
#
# 下一課
# ------
# 網站首頁的課程地圖列出了所有單元。
