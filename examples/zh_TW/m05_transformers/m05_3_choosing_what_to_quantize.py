"""
M05-3 選擇要量化什麼
====================

``X86InductorQuantizer`` 可以依模組名稱、模組型別和函式分別給設定，給 ``None`` 就把那些
node 留在浮點數。這是處理「int8 會傷到的那一層」的工具——但要先找到那一層。本課在訓練好的
手寫數字 ViT 裡埋一個離群通道（浮點模型算的仍是同一個函式），用兩種方法找出被它傷到的那一層：
輪流把每一層留在浮點數，以及 torchao 的數值除錯器；把 SQNR 畫在圖上；接著不靠任何浮點退回就
修好它：親手做 SmoothQuant，把離群值的 scale 從活化值搬進下一個 linear 的 weight。最後看
時間的代價：四個 block 的 encoder 的 fp32、int8 靜態與 int8 動態版本，開啟 freezing 編譯後，在這顆
CPU 的 int8 路徑與 AVX2 上計時。

**你會學到**

- ``set_module_name_qconfig``、 ``set_module_type_qconfig`` 與
  ``set_function_type_qconfig`` 搭配 ``None`` 怎麼把模型的一部分留在浮點數
- 敏感度迴圈與數值除錯器怎麼指向同一層
- SmoothQuant 怎麼保持浮點函式不變，又讓活化值容易量化

**先備知識**： :ref:`M04-1 · 量測誤差
<sphx_glr_lessons_m04_accuracy_m04_1_measuring_the_error.py>`、 :ref:`M00-4 · 改圖
<sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`、 :ref:`M05-1 · quantizer 在 attention
裡看見什麼 <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# M05-1 的手寫數字 ViT，已訓練（ ``common.data.train_digits_vit`` ，快取在 ``build/`` ），
# q／k／v 是分開的 linear。校準用 64 張校準影像；誤差在 500 張測試影像上量，以浮點模型的
# logits 為基準。

import copy
import math
import tempfile

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from common.aoti import compiled_package, kernel_calls
from common.charts import pad, use_course_style
from common.cpu import describe, run_under_isa, weaker_paths
from common.data import accuracy, digits, export_digits_model, train_digits_vit
from common.models import example_inputs, get_model, input_shape
from common.pt2e import export_module, quiet
from common.timing import Timing, compare_speed
from common.viz import draw

quiet()

from torchao.quantization.pt2e import (
    compare_results,
    extract_results_from_loggers,
    generate_numeric_debug_handle,
    prepare_for_propagation_comparison,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer
from torchao.quantization.utils import compute_error

model = train_digits_vit()
calibration, _ = digits("calibration")
calibration = calibration[:64]
test_images, test_labels = digits("test")
with torch.no_grad():
    fp32_logits = model(test_images)
aten, qd = torch.ops.aten, torch.ops.quantized_decomposed

# %%
# 輔助函式： ``quantizer()`` 是以 ``set_global`` 設定的預設靜態設定； ``quantize`` 在浮點圖
# 的副本上做 prepare、校準與 convert； ``int8_layers`` 列出 conv 或 linear 讀 int8 weight
# 的模組； ``errors`` 回傳準確度，以及 logits 相對浮點基準的 SQNR； ``tensor_results``
# 只留下除錯器記錄的張量（圖裡也記錄了批次大小，一個 ``sym_size`` node）； ``Amax`` 逐個
# node 執行圖（ ``torch.fx.Interpreter`` ），記下被指定的 node 每個通道的最大絕對值。


def quantizer():
    config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config()
    return x86_inductor_quantizer.X86InductorQuantizer().set_global(config)


def quantize(float_gm, q):
    prepared = prepare_pt2e(copy.deepcopy(float_gm), q)
    with torch.no_grad():
        prepared(calibration)
    return convert_pt2e(prepared)


def int8_layers(gm) -> list[str]:
    layers = []
    for node in gm.graph.nodes:
        if node.target in (aten.linear.default, aten.conv2d.default):
            if node.args[1].target == qd.dequantize_per_channel.default:
                layers.append(list(node.meta["nn_module_stack"].values())[-1][0])
    return layers


def errors(gm) -> tuple[float, float]:
    """測試影像上的（準確度，logits 相對 fp32 logits 的 SQNR，單位 dB）。"""
    with torch.no_grad():
        logits = gm(test_images)
    correct = (logits.argmax(dim=1) == test_labels).float().mean().item()
    return correct, compute_error(fp32_logits, logits).item()


def tensor_results(logged):
    results = extract_results_from_loggers(logged)
    return {key: row for key, row in results.items() if isinstance(row[2][0], torch.Tensor)}


class Amax(torch.fx.Interpreter):
    def __init__(self, gm, watched):
        super().__init__(gm)
        self.watched, self.amax = set(watched), {}

    def run_node(self, node):
        value = super().run_node(node)
        if node.name in self.watched:
            channels = value.detach().abs().flatten(0, -2).amax(dim=0)
            seen = self.amax.get(node.name, torch.zeros_like(channels))
            self.amax[node.name] = torch.maximum(seen, channels)
        return value


# %%
# 步驟 1 — 把模型的一部分留在浮點數
# ----------------------------------
# 預設設定讓全部 14 層拿到 int8 weight：patch embedding 的 conv 和 13 個 linear。下面每個
# setter 都接受 ``None`` ，意思是「留在浮點數」；quantizer 依固定順序套用它們：先模組名稱，
# 再型別與函式，最後是全域設定，而且不會重複標註同一個 node。

float_gm = export_digits_model(model)
everything = quantize(float_gm, quantizer())
print(len(int8_layers(everything)), "層拿到 int8 weight")
assert len(int8_layers(everything)) == 14

head_float = quantize(float_gm, quantizer().set_module_name_qconfig("head", None))
conv_float = quantize(float_gm, quantizer().set_module_type_qconfig(nn.Conv2d, None))
linears_float = quantize(float_gm, quantizer().set_function_type_qconfig(F.linear, None))
for label, gm in (
    ('set_module_name_qconfig("head", None)', head_float),
    ("set_module_type_qconfig(nn.Conv2d, None)", conv_float),
    ("set_function_type_qconfig(F.linear, None)", linears_float),
):
    print(f"{label:42} {len(int8_layers(gm)):2} 層 int8")
assert "head" not in int8_layers(head_float) and len(int8_layers(head_float)) == 13
assert "patch_embed" not in int8_layers(conv_float) and len(int8_layers(conv_float)) == 13
assert int8_layers(linears_float) == ["patch_embed"], "linear 全是浮點數，conv 是 int8"

# %%
# 在訓練好的模型上，int8 沒有造成分類器看得出的損失：全部量化後的測試準確度與 logits 的
# SQNR。

fp32_accuracy = accuracy(model)
static_accuracy, static_sqnr = errors(everything)
print(f"fp32 {fp32_accuracy:.3f}｜int8 靜態 {static_accuracy:.3f}，{static_sqnr:.1f} dB")
assert static_accuracy >= fp32_accuracy - 0.01 and static_sqnr > 30

# %%
# 步驟 2 — 埋一個離群通道
# ------------------------
# 大型語言模型有少數幾個活化值通道比其他大上百倍（見 LLM.int8 與 SmoothQuant 的論文）。這裡
# 埋一個：把 block 0 的 ``norm2`` 第 5 個通道（weight 與 bias）乘以 100，再把 ``fc1`` 的
# weight 第 5 欄除以 100。浮點模型算的是同一個函式，只差浮點捨入；但 ``fc1`` 的輸入現在有一個
# 通道比 per-tensor int8 scale 能容納的大了一百倍。

CHANNEL, FACTOR = 5, 100.0
planted = copy.deepcopy(model)
with torch.no_grad():
    planted.blocks[0].norm2.weight[CHANNEL] *= FACTOR
    planted.blocks[0].norm2.bias[CHANNEL] *= FACTOR
    planted.blocks[0].fc1.weight[:, CHANNEL] /= FACTOR
    torch.testing.assert_close(planted(test_images), model(test_images), atol=1e-4, rtol=0)

# 除錯器（步驟 4）需要在量化之前就做好標記的匯出結果。
program = torch.export.export(
    planted, (calibration[:2],), dynamic_shapes=({0: torch.export.Dim("batch")},)
)
generate_numeric_debug_handle(program)
planted_gm = program.module()
planted_int8 = quantize(planted_gm, quantizer())
planted_accuracy, planted_sqnr = errors(planted_int8)
print(f"埋了離群值，int8 靜態：{planted_accuracy:.3f}，{planted_sqnr:.1f} dB")
assert planted_sqnr < static_sqnr - 10, "同一個函式，卻難量化得多"

# %%
# 步驟 3 — 輪流把每一層留在浮點數
# --------------------------------
# 敏感度迴圈：量化 14 次，每次用 ``set_module_name_qconfig(name, None)`` 把一層留在浮點數，
# 依找回的 SQNR 排名。有一層特別突出： ``blocks.0.fc1`` ，讀離群值的那個 linear。

layers = [name for name, m in planted.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
gains = {}
for name in layers:
    fallback = quantize(planted_gm, quantizer().set_module_name_qconfig(name, None))
    gains[name] = errors(fallback)
ranking = sorted(gains, key=lambda name: gains[name][1], reverse=True)
for name in ranking[:4]:
    acc, sqnr = gains[name]
    print(f"{name:22} 浮點：準確度 {acc:.3f}，SQNR {sqnr:5.1f} dB（{sqnr - planted_sqnr:+.1f}）")
fallback_accuracy, fallback_sqnr = gains["blocks.0.fc1"]
assert ranking[0] == "blocks.0.fc1", "離群值後面的那一層"
assert fallback_sqnr > planted_sqnr + 10 > gains[ranking[1]][1]

# %%
# 步驟 4 — 數值除錯器指向同一個 node
# ----------------------------------
# M04-1 的四個呼叫給出埋了離群值的 int8 模型每個 node 之後的 SQNR。和 node 的輸入相比，
# SQNR 掉得最多的 node 是 ``fc1`` 的 linear。

float_logged = prepare_for_propagation_comparison(planted_gm)
int8_logged = prepare_for_propagation_comparison(planted_int8)
with torch.no_grad():
    float_logged(test_images)
    int8_logged(test_images)
comparison = compare_results(tensor_results(float_logged), tensor_results(int8_logged))
node_sqnr = {info.name: summary.results[0].sqnr.item() for info, summary in comparison.items()}
nodes = {node.name: node for node in planted_gm.graph.nodes}


def fall(name):
    """SQNR 經過一個 node 掉了多少 dB（第一個輸入的 SQNR 減去它自己的）。"""
    source = nodes[name].args[0].name
    return node_sqnr.get(source, float("inf")) - node_sqnr[name]


linear_nodes = [name for name in node_sqnr if nodes[name].target == aten.linear.default]
steepest = max(linear_nodes, key=fall)
module = list(nodes[steepest].meta["nn_module_stack"].values())[-1][0]
print(f"掉得最多：{steepest}（{module}），{fall(steepest):.1f} dB")
assert module == ranking[0], "除錯器與敏感度迴圈的結論一致"

# %%
# 依除錯器的 SQNR 上色的浮點圖（滑鼠移到 node 上可看數字）：紅色從 block 0 的 ``fc1`` 開始，
# 之後一路沒有恢復。

finite = {name: sqnr for name, sqnr in node_sqnr.items() if math.isfinite(sqnr)}  # inf：完全相同
draw(planted_gm, values=finite, value_name="SQNR dB", title="埋了離群值：每個 node 的 SQNR")

# %%
# 步驟 5 — 親手做 SmoothQuant
# ---------------------------
# 退回浮點數等於放棄那一層的 int8。SmoothQuant 保住它：對 linear ``y = x·Wᵀ`` ，任何
# 每個通道各一個值的 ``s`` 都有 ``y = (x / s)·(W·s)ᵀ`` 。取
# ``s_j = max|x_j|^α / max|W_j|^(1−α)`` （α = 0.5），通道 ``j`` 的兩邊就在中間相遇：
# ``max|x_j| / s_j = max|W_j|·s_j = √(max|x_j|·max|W_j|)`` （下面以 assert 驗證）。離群通道
# 縮小；weight 的第 ``j`` 欄變大，但只大到這個幾何平均。per-channel 的 weight 量化並不會
# 吸收這個變大（x86 的 weight scale 是每個「輸出」通道一個，也就是 ``W`` 的一列，而第 ``j``
# 欄橫跨每一列）：真正有用的是平衡，兩邊都不再留下離群值。 ``/ s`` 不花任何成本：活化值
# 來自 LayerNorm，所以可以併入 LayerNorm 的 weight 與 bias。在匯出的圖上用 M00 的
# 手法：找出使用者全是 linear 的 ``layer_norm`` （q、k、v 共用一個），在校準影像上讀出
# 活化值的最大值，直接修改常數。

smoothed = copy.deepcopy(planted_gm)
pairs = {
    norm: list(norm.users)
    for norm in smoothed.graph.find_nodes(op="call_function", target=aten.layer_norm.default)
    if all(user.target == aten.linear.default for user in norm.users)
}
print({norm.name: [user.name for user in users] for norm, users in pairs.items()})
assert len(pairs) == 4, "兩個 block 各有 norm1 → q、k、v 與 norm2 → fc1"
watch = Amax(smoothed, [norm.name for norm in pairs])
with torch.no_grad():
    watch.run(calibration)
    for norm, users in pairs.items():
        weights = [smoothed.get_parameter(user.args[1].target) for user in users]
        weight_max = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0)
        s = (watch.amax[norm.name].sqrt() / weight_max.sqrt()).clamp(min=1e-5)
        torch.testing.assert_close(watch.amax[norm.name] / s, weight_max * s)  # 平衡
        smoothed.get_parameter(norm.args[2].target).div_(s)  # LayerNorm weight
        smoothed.get_parameter(norm.args[3].target).div_(s)  # LayerNorm bias
        for w in weights:
            w.mul_(s)

# %%
# 浮點函式不變，只差浮點捨入（在大小約 10 的 logits 上容許 1e-4）；它的 int8 版本找回了
# 沒有離群值的模型的 SQNR 與準確度，而且每一層都是 int8。

with torch.no_grad():
    torch.testing.assert_close(smoothed(test_images), model(test_images), atol=1e-4, rtol=0)
smooth_accuracy, smooth_sqnr = errors(quantize(smoothed, quantizer()))
print(f"SmoothQuant，int8 靜態：{smooth_accuracy:.3f}，{smooth_sqnr:.1f} dB")
assert smooth_sqnr > planted_sqnr + 15 and smooth_sqnr > static_sqnr - 3
assert smooth_accuracy >= planted_accuracy

# %%
# 步驟 6 — int8 之間夾 bfloat16
# -----------------------------
# int8 模型裡留在浮點數的部分（SDPA、LayerNorm、GELU、softmax）也可以改用 bfloat16 跑：
# torchao 的 x86 教學稱之為「int8-mixed-bf16」。只有在原生支援 bf16 的 CPU（ ``avx512_bf16``
# 或 ``amx_bf16`` ）上才可能有好處；其他 CPU 上 bf16 是模擬的，比 float32 還慢。本頁不量它的
# 速度，只說明這顆 CPU 屬於哪一種：

cpu = describe()
if cpu.bf16:
    print(f"原生 bf16（{cpu.verdict}）：int8-mixed-bf16 在這裡可能有好處")
else:
    print(f"沒有原生 bf16（{cpu.verdict}）：浮點部分留在 float32")

# %%
# 步驟 7 — 速度：fp32、int8 靜態、int8 動態
# -----------------------------------------
# 準確度只是選擇的一半，另一半是時間。取 ``common.models.Encoder`` （四個 block、
# d_model 256、64 個 token、MLP 1024；隨機 weight，輸入是四段 token），做成三個版本，每個都
# 加上 freezing、預先編譯成 AOTInductor 套件（M03-4）。 ``common.aoti.compiled_package`` 把每個
# 套件存在 ``build/cache/`` ，鍵是程式本身、torch 的版本、kernel 路徑與計時用的執行緒數
# （inductor 產生的 CPU kernel 針對執行緒數特化），所以重建網站時直接載入，不必再編譯一次。
# assert 檢查的是編譯器的產物：直接讀每個套件產生的 C++。浮點 encoder 呼叫 oneDNN 的浮點
# linear，兩個 int8 encoder 的 24 個 linear 全都呼叫它的 int8 linear，殘差的加法與
# out 投影、 ``fc2`` 融合。

encoder = get_model("encoder")
tokens = example_inputs(4, shape=input_shape("encoder"))
# 印出的文字與圖表怎麼稱呼三個版本（鍵也是套件的名稱，兩種語言相同）。
LABELS = {"fp32": "fp32", "int8 static": "int8 靜態", "int8 dynamic": "int8 動態"}


def encoder_int8(is_dynamic):
    config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config(
        is_dynamic=is_dynamic
    )
    q = x86_inductor_quantizer.X86InductorQuantizer().set_global(config)
    prepared = prepare_pt2e(export_module(encoder, tokens), q)
    with torch.no_grad():
        for seed in range(1, 4):
            prepared(*example_inputs(4, seed=seed, shape=input_shape("encoder")))
    return convert_pt2e(prepared)


programs = {
    label: torch.export.export(gm, tokens)
    for label, gm in (
        ("fp32", export_module(encoder, tokens)),
        ("int8 static", encoder_int8(False)),
        ("int8 dynamic", encoder_int8(True)),
    )
}
packages = {
    label: compiled_package(program, "encoder_" + label.replace(" ", "_"))
    for label, program in programs.items()
}


def linear_kernels(package) -> dict:
    return {name: k for name, k in kernel_calls(package).items() if "linear" in name}


for label, package in packages.items():
    print(pad(LABELS[label], 12), linear_kernels(package))
assert not any(name.startswith("q") for name in linear_kernels(packages["fp32"]))
for label in ("int8 static", "int8 dynamic"):
    kernels = linear_kernels(packages[label])
    assert set(kernels) == {"qlinear_pointwise", "qlinear_pointwise_binary"}
    assert sum(kernels.values()) == 24, "4 個 block 各有 q、k、v、out、fc1、fc2"

# %%
# 接著計時：三個套件以交錯的回合計時，先在這顆 CPU 的 int8 路徑上，再到一個限制在 AVX2 的
# 新行程裡（ ``run_under_isa`` ，這顆 CPU 有比 AVX2 更強的指令集時才跑）——在那裡重新編譯，
# 因為這個上限會改變 inductor 的向量程式碼，以及 oneDNN 預先打包的 weight 排列。有 VNNI
# 時，int8 乘積用一道指令累加進 int32，這個大小的 int8 linear 通常比 float32 快；沒有 VNNI
# （AVX2）時，乘積要成對經過 int16，加速變小甚至消失。動態 int8 還要在執行時計算每個活化值
# 的 scale。圖下面的幾行說明，在這裡量到的每條路徑上哪一個最快。

runners = {LABELS[k]: torch._inductor.aoti_load_package(str(p)) for k, p in packages.items()}
key = " ".join(
    path.name for path in packages.values()
)  # 套件的檔名含有它們的鍵：建置網站時只計時一次
timings = compare_speed(runners, tokens, rounds=20, key=key)
print(timings.table())
paths = {cpu.onednn: timings.times}

# 子行程的程式碼；匯入 quantize_pt2e 是為了註冊這些程式呼叫的 int8 運算。
AVX2_STEP = """
import torch
import torchao.quantization.pt2e.quantize_pt2e
from common.aoti import compiled_package
from common.timing import compare_speed

programs = {label: torch.export.load(path) for label, path in SAVED.items()}
runners = {
    label: torch._inductor.aoti_load_package(
        str(compiled_package(program, "encoder_" + label.replace(" ", "_")))
    )
    for label, program in programs.items()
}
timings = compare_speed(runners, programs["fp32"].example_inputs[0], rounds=20)
result = {"times": {label: vars(timings[label]) for label in runners}, "load": timings.load[0]}
"""

if "AVX2" in weaker_paths():
    with tempfile.TemporaryDirectory() as folder:
        saved = {label: f"{folder}/{label.replace(' ', '_')}.pt2" for label in programs}
        for label, program in programs.items():
            torch.export.save(program, saved[label])
        # 暫存路徑每次不同：以它計時的東西（套件）作為這一步的鍵
        other = run_under_isa("AVX2", f"SAVED = {saved!r}\n{AVX2_STEP}", key=AVX2_STEP + key)
    found = other["result"]
    paths[other["cpu"]["onednn"]] = {LABELS[k]: Timing(**v) for k, v in found["times"].items()}
    print(f"AVX2 子行程：{other['cpu']['onednn']}，平均負載 {found['load']:.2f}")

labels = [LABELS[k] for k in programs]
print(pad("int8 路徑", 18) + "".join(pad(label, 22, align=">") for label in labels))
for path, times in paths.items():
    cells = [f"{times[label].median:9.2f} ms ({times[label].spread:4.0%})" for label in labels]
    print(f"{path:18}" + "".join(f"{cell:>22}" for cell in cells))

use_course_style()
fig, ax = plt.subplots(figsize=(6.5, 3))
width = 0.8 / len(paths)
for i, (path, times) in enumerate(paths.items()):
    medians = [times[label].median for label in labels]
    spread = [
        [m - times[label].low for label, m in zip(labels, medians, strict=True)],
        [times[label].high - m for label, m in zip(labels, medians, strict=True)],
    ]
    ax.bar(
        [j + i * width for j in range(len(labels))],
        medians,
        width,
        yerr=spread,
        capsize=3,
        label=path,
        color=["#2563eb", "#94a3b8"][i % 2],
    )
ax.set_xticks([j + width * (len(paths) - 1) / 2 for j in range(len(labels))], labels)
ax.set_ylabel("每次呼叫的毫秒數（中位數，p10–p90）")
ax.set_title("四個 encoder block，AOTInductor 加上 freezing")
ax.legend(title="int8 路徑")
fig.tight_layout()
plt.show()
for path, times in paths.items():
    fastest = min(labels, key=lambda label: times[label].median)
    speedup = times[LABELS["fp32"]].median / times[fastest].median
    print(f"{path}：最快的是 {fastest}，速度是 fp32 的 {speedup:.2f} 倍")

# %%
# 小結
# ----
# ===================================  ========================================================
# 模型                                 準確度與 logits 的 SQNR（印在上面）
# ===================================  ========================================================
# fp32                                 基準
# int8 靜態                            看不出損失
# 埋了離群值，int8 靜態                同一個浮點函式，SQNR 低得多
# 敏感度迴圈：單層退回浮點             把 ``blocks.0.fc1`` 留在浮點數，找回大部分
# SmoothQuant，int8 靜態               每一層都是 int8，SQNR 回到沒有離群值的模型
# ===================================  ========================================================
#
# - 在 ``set_module_name_qconfig`` ／ ``set_module_type_qconfig`` ／
#   ``set_function_type_qconfig`` 給 ``None`` ，那些 node 就留在浮點數；名稱優先於型別。
# - 敏感度迴圈與除錯器的逐 node SQNR 找到同一層。
# - SmoothQuant 把活化值除以 ``s`` （併入它前面的 LayerNorm），再把後面 linear 的 weight
#   乘以 ``s`` ：同一個浮點函式，卻是容易量化的 int8 函式。
# - 加上 freezing 編譯後，int8 encoder 的每個 linear 都以 oneDNN 的 int8 linear 執行，靜態與動態
#   皆然；是否比 float32 快取決於 CPU 的 int8 路徑（VNNI 或 AVX2），每條量到的路徑都印在
#   上面。
#
# 練習
# ----
# 1. 用 ``set_module_name_qconfig`` 把埋了離群值的模型的整個 ``blocks.0`` 留在浮點數（名稱
#    也涵蓋它底下的每個 submodule）。預測還有幾層拿到 int8 weight；再預測多留在浮點數的五層，在
#    步驟 3 只退回 ``blocks.0.fc1`` 的結果之上還能多找回多少 dB：比 ``fc1`` 單獨找回的多，
#    還是少？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          block_float = quantize(planted_gm, quantizer().set_module_name_qconfig("blocks.0", None))
#          block_accuracy, block_sqnr = errors(block_float)
#          count = len(int8_layers(block_float))
#          print(f"{count} 層 int8：{block_accuracy:.3f}，{block_sqnr:.1f} dB")
#          assert count == 8, "14 減去 q、k、v、out、fc1、fc2"
#          fc1_gain, rest_gain = fallback_sqnr - planted_sqnr, block_sqnr - fallback_sqnr
#          print(f"只退回 fc1：{fc1_gain:+.1f} dB；blocks.0 其他五層：再 {rest_gain:+.1f} dB")
#          assert 0 < rest_gain < fc1_gain / 3, "敏感的那一層找回大部分，其餘幾層只多幾 dB"
#
# 2. 步驟 5 用的是 α = 0.5。改成只在 block 0 的 ``norm2`` 上用 α = 1（ ``s = max|x|`` ：活化值
#    的範圍全部搬進 ``fc1`` 的 weight，每個活化值通道的最大值都變成 1）。預測 ``fc1`` 的 int8
#    SQNR（步驟 4 的除錯器量到的）和它的 weight 一個通道一個通道看的範圍會怎麼變：變好、
#    變差，還是不變？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          def migrated(alpha):
#              """把 block 0 的 norm2 → fc1 這一對以 α 做 SmoothQuant（步驟 5 的 s）。"""
#              gm = copy.deepcopy(planted_gm)
#              norm = [n for n in gm.graph.nodes if n.target == aten.layer_norm.default][1]
#              (fc1,) = norm.users
#              w = gm.get_parameter(fc1.args[1].target)
#              with torch.no_grad():
#                  s = watch.amax[norm.name] ** alpha / w.abs().amax(dim=0) ** (1 - alpha)
#                  s = s.clamp(min=1e-5)
#                  gm.get_parameter(norm.args[2].target).div_(s)
#                  gm.get_parameter(norm.args[3].target).div_(s)
#                  w.mul_(s)
#              return gm, fc1.name, w.detach()
#
#
#          def fc1_sqnr(gm, name):
#              """除錯器在 fc1 輸出量到的 SQNR（步驟 4）。"""
#              float_log = prepare_for_propagation_comparison(gm)
#              int8_log = prepare_for_propagation_comparison(quantize(gm, quantizer()))
#              with torch.no_grad():
#                  float_log(test_images)
#                  int8_log(test_images)
#              rows = compare_results(tensor_results(float_log), tensor_results(int8_log))
#              return next(s.results[0].sqnr.item() for i, s in rows.items() if i.name == name)
#
#
#          def weight_sqnr(w):
#              """w 與它的 int8 版本相比：對稱、每個輸出通道（一列）一個 scale，和 x86 一樣。"""
#              scale = w.abs().amax(dim=1, keepdim=True) / 127.5
#              return compute_error(w, (w / scale).round().clamp(-128, 127) * scale).item()
#
#
#          found = {}
#          for alpha in (0.5, 1.0):
#              gm, name, w = migrated(alpha)
#              rows, columns = w.abs().amax(dim=1), w.abs().amax(dim=0)
#              found[alpha] = f = {
#                  "fc1": fc1_sqnr(gm, name),
#                  "weights": weight_sqnr(w),
#                  "rows": rows.median().item(),
#                  "spread": (columns.max() / columns.min()).item(),
#              }
#              print(f"α = {alpha}：fc1 {f['fc1']:.1f} dB，int8 weight {f['weights']:.1f} dB；")
#              print(f"    各列最大值的中位數 {f['rows']:.2f}，各欄最大值相差 {f['spread']:.1f} 倍")
#          low, high = found[0.5], found[1.0]
#          assert high["rows"] > low["rows"], "每個輸出通道的範圍變大"
#          assert high["spread"] > 1.5 * low["spread"], "活化值的差異搬進了 weight 的各欄"
#          assert high["weights"] < low["weights"], "所以每一列的 int8 格點較難容納小的 weight"
#          assert abs(high["fc1"] - low["fc1"]) < 1 < high["fc1"] - node_sqnr[name] - 15, (
#              "fc1 的輸出幾乎不變：weight 還有多餘的 dB，瓶頸在活化值"
#          )
#
# 延伸閱讀
# --------
# - Xiao et al., `SmoothQuant <https://arxiv.org/abs/2211.10438>`_
# - `X86InductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `PT2E 數值除錯器（torchao）
#   <https://docs.pytorch.org/ao/main/tutorials_source/pt2e_quant_numeric_debugger.html>`_
#
# 下一課
# ------
# 回到 :ref:`M05-1 · quantizer 在 attention 裡看見什麼
# <sphx_glr_lessons_m05_transformers_m05_1_attention.py>` ，或前往課程地圖。
