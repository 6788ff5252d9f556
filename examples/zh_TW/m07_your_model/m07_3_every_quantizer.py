"""
M07-3 同一張圖，跑遍這台機器上的每個 quantizer
==============================================

PT2E quantizer 只負責寫 annotation；annotation 寫了什麼、結果能在哪裡執行，取決於它是為哪個
後端寫的。一個小 CNN 依序交給這台機器上匯入得了的每個 quantizer：torchao 的
``X86InductorQuantizer`` 與 ``ArmInductorQuantizer`` ，ExecuTorch 的 ``XNNPACKQuantizer`` 與
``OpenVINOQuantizer`` （NNCF）。它們對哪些運算變成 int8 意見一致，其他都不同：活化值用
uint8 還是 int8、仿射還是對稱、weight 是 per-channel 還是 per-tensor、殘差 add 融合進 conv
還是自成一個運算。
課程手寫的 ``prepare`` ／ ``convert`` 在四者之下都得到和 torchao 完全相同的數值；其中三個
接著在這裡執行 int8 kernel，而 ``use_reference_representation=True`` 把 int8 的 q/dq 運算改寫成
任何後端都讀得懂的整數算術。

**你會學到**

- 怎麼讀出 quantizer 標註了什麼：運算、dtype、對稱或仿射、per-channel
- 哪些 quantizer 在這台機器上執行 int8、哪些只能標註、哪些根本無法匯入
- ``convert_pt2e(..., use_reference_representation=True)`` 改寫什麼、留下什麼

**先備知識**： :ref:`M07-1 · 我的 quantizer 會把什麼留在浮點數？
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`、 :ref:`M02-3 · 親手做 convert
<sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`、 :ref:`M06-1 · XNNPACK quantizer
<sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 模型：conv + BatchNorm + ReLU 的 stem、一個殘差 block（兩個 conv、 ``out + x`` 、ReLU）、
# 平均池化與兩個 linear。隨機 weight，16×16 的影像，四個校準批次。

import contextlib
import copy
import importlib
import inspect
import io
import os
import platform
import sys
import warnings
from collections import Counter
from importlib.metadata import version

import torch
from torch import nn

from common.coverage import coverage, side_by_side, spec_table
from common.expect import expect_error
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.arm_inductor_quantizer import (
    ArmInductorQuantizer,
    get_default_arm_inductor_quantization_config,
)

from common import handmade
from common.edge import xnnpack_quantizer

# sphinx_gallery_start_ignore
# 兩種雜訊，不讓它們出現在頁面與 stderr：pytorch_tokenizers 的 C++ 擴充（ExecuTorch 的
# OpenVINO 套件會匯入它）載入時在行程的 stderr 寫一行紀錄；reference 改寫會對一個已棄用的
# pytree API 發出警告。
sys.stderr.flush()
saved_stderr = os.dup(2)
with open(os.devnull, "w") as devnull:
    os.dup2(devnull.fileno(), 2)
    importlib.import_module("pytorch_tokenizers")
os.dup2(saved_stderr, 2)
os.close(saved_stderr)
warnings.filterwarnings("ignore", r"`treespec\.children_specs` is deprecated", FutureWarning)
# sphinx_gallery_end_ignore


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.conv1, self.bn1 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.relu3, self.fc2 = nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        x = torch.flatten(self.pool(self.relu2(out + x)), 1)
        return self.fc2(self.relu3(self.fc1(x)))


torch.manual_seed(0)
model = Net().eval()
images = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
calibration = [
    (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(s)),) for s in range(2, 6)
]
graph = export_module(model, images)

# %%
# ``quantize`` 執行 prepare、校準與 convert，用 torchao 的或課程的版本；
# ``quantized_outputs`` 列出在 prepare 後的圖裡、輸出接著 observer 的 node（也就是 convert
# 會變成 q/dq 的那些邊）。


def quantize(quantizer, *, passes=(prepare_pt2e, convert_pt2e), **convert_options):
    prepare, convert = passes
    prepared = prepare(copy.deepcopy(graph), quantizer)
    for batch in calibration:
        prepared(*batch)
    return convert(prepared, **convert_options)


def quantized_outputs(quantizer) -> set[str]:
    prepared = prepare_pt2e(copy.deepcopy(graph), quantizer)
    return {
        node.name
        for node in prepared.graph.nodes
        if node.op != "call_module"
        and any(handmade.is_observer_node(prepared, user) for user in node.users)
    }


# %%
# 步驟 1 — 匯入每個 quantizer
# ---------------------------
# ExecuTorch 1.5.1 附帶的 quantizer 所支援的後端，比這裡能執行的還多。它的 Arm TOSA／Ethos-U
# quantizer 與 Cortex-M quantizer 都會匯入 ``tosa_serializer`` ，這個套件要從 TOSA 工具的
# 原始碼建置，PyPI 上沒有：它們無法匯入。

with expect_error(ModuleNotFoundError, match="tosa_serializer"):
    importlib.import_module("executorch.backends.arm.quantizer")
with expect_error(ModuleNotFoundError, match="tosa_serializer"):
    importlib.import_module("executorch.backends.cortex_m.quantizer.quantizer")

# %%
# ``OpenVINOQuantizer`` 向 Intel 的 NNCF 詢問該量化哪裡。NNCF 與 OpenVINO 執行環境都在
# PyPI 上，安裝時不會動到這裡的 torch（課程在 ``docs`` extra 裡固定了它們的版本），所以
# 這一個匯入得了：

from executorch.backends.openvino.quantizer import OpenVINOQuantizer

print(f"torch {torch.__version__}, nncf {version('nncf')}, openvino {version('openvino')}")
assert torch.__version__.startswith("2.13.0"), "NNCF 沒有更動 torch"

# %%
# 這四個，各是一個回傳新的、已設定好的 quantizer 的函式：


def arm_quantizer():
    return ArmInductorQuantizer().set_global(get_default_arm_inductor_quantization_config())


quantizers = {
    "x86": x86_quantizer,
    "xnnpack": xnnpack_quantizer,
    "arm": arm_quantizer,
    "openvino": OpenVINOQuantizer,
}

# %%
# 步驟 2 — 變成 int8 的運算相同
# -----------------------------
# 在同一張匯出的圖上執行 ``coverage`` （M07-1），每個 quantizer 一欄。在這個模型上，四者都把
# 每個 conv、殘差 add 與兩個 linear 變成 int8；x86 與 Arm 把 add 融合進它前面的 conv
# （ ``conv + add`` 是一個 int8 kernel），XNNPACK 與 OpenVINO 則把它當成獨立的運算來量化。

reports = {name: coverage(graph, make()) for name, make in quantizers.items()}
print(side_by_side(*reports.values()))
for report in reports.values():
    assert report.counts() == {"conv": (3, 3), "add": (1, 1), "linear": (2, 2)}
status = {name: report["add"].status for name, report in reports.items()}
assert status == {
    "x86": "int8 fused",
    "xnnpack": "int8 static",
    "arm": "int8 fused",
    "openvino": "int8 static",
}

# %%
# 步驟 3 — 不一樣的 int8
# ----------------------
# ``spec_table`` 為每個 quantizer 列出它給活化值與 weight 的 spec。x86 執行的 oneDNN kernel
# 吃 uint8 活化值；XNNPACK 與 Arm 吃 int8；OpenVINO 的預設模式（ ``INT8_SYM`` ）連活化值也是
# 對稱量化。只有 Arm 的 weight 是 per-tensor。

print(spec_table(*reports.values()))
schemes = {name: (r.schemes("activation"), r.schemes("weight")) for name, r in reports.items()}
assert schemes == {
    "x86": (["u8 per-tensor affine"], ["s8 per-channel symmetric"]),
    "xnnpack": (["s8 per-tensor affine"], ["s8 per-channel symmetric"]),
    "arm": (["s8 per-tensor affine"], ["s8 per-tensor symmetric"]),
    "openvino": (["u8 per-tensor symmetric"], ["s8 per-channel symmetric"]),
}

# %%
# 在 uint8 上做對稱量化，zero point 落在 0…255 的中間：OpenVINO 的每個活化值的 zero point
# 都是 127，ReLU 之後也一樣，即使那裡沒有負值、127 以下的整數都用不到。仿射量化的 x86 讓
# ReLU 輸出的 zero point 為 0。各圖中 ``quantize_per_tensor`` node 的 zero point：

converted = {name: quantize(make()) for name, make in quantizers.items()}
quantize_op = torch.ops.quantized_decomposed.quantize_per_tensor.default
zero_points = {
    name: sorted({n.args[2] for n in gm.graph.find_nodes(op="call_function", target=quantize_op)})
    for name, gm in converted.items()
}
print(zero_points)
assert zero_points["openvino"] == [127] and 0 in zero_points["x86"]

# %%
# 步驟 4 — observer 放在哪裡
# --------------------------
# 各 quantizer 量化哪些輸出也不同。OpenVINO（NNCF）量化的是要變成 int8 的運算「前面」那些
# 運算的輸出，x86 量化的是自己模式的輸入。下圖是 OpenVINO convert 後的圖；醒目標示的
# node，輸出有被 OpenVINO 量化、卻沒有被 x86 量化。 ``conv2d_2`` 就在其中：在 x86 之下，
# 它的輸出直接流進與它融合的 add。

only_openvino = sorted(quantized_outputs(OpenVINOQuantizer()) - quantized_outputs(x86_quantizer()))
print(f"只有 OpenVINO 量化：{only_openvino}")
assert "conv2d_2" in only_openvino
draw(converted["openvino"], highlight=only_openvino, title="OpenVINO：x86 留在浮點數的輸出")

# %%
# x86 的圖，醒目標示融合的 add： ``conv2d_2`` 不經過 q/dq 就把輸出交給它。

draw(converted["x86"], highlight=["conv2d_2", "add"], title="x86：conv + add，一個 int8 kernel")
(add,) = converted["x86"].graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor)
assert add.args[0].name == "conv2d_2", "x86：conv 的浮點數輸出直接進入 add"

# %%
# 步驟 5 — 在每個 quantizer 之下執行手寫的 pass
# ---------------------------------------------
# ``common.handmade`` （M02）不認識這些 quantizer 中的任何一個：它只讀 annotation。在每個
# quantizer 之下，它的 prepare 與 convert 都得到和 torchao 逐位元相同的 int8 模型。旁邊
# 印出每個 int8 模型和浮點數模型相差多少（一個批次的 10 個輸出中最大的差距）：

for name, make in quantizers.items():
    by_hand = quantize(make(), passes=(handmade.prepare, handmade.convert))
    assert torch.equal(by_hand(*images), converted[name](*images)), f"{name}：逐位元相同"
    error = (converted[name](*images) - model(*images)).abs().max().item()
    print(f"{name:9} handmade == torchao   最大 |int8 - fp32| = {error:.4f}")

# %%
# 步驟 6 — 哪些在這裡執行 int8
# ----------------------------
# q/dq 圖在哪裡都能執行，但它用浮點數計算。要執行 int8 kernel，得有後端接手這張圖。
# **x86**：torchao 的 lowering（M03）把 x86 的圖變成 oneDNN 的 int8 運算。在 Arm 的圖
# （int8 活化值）裡，它找不到任何自己的模式：Arm 的配方是為 Arm CPU 上的 Inductor
# 設計的，而這台機器是：

print(platform.machine())


def onednn_ops(gm) -> Counter:
    targets = (str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return Counter(t for t in targets if t.startswith("onednn."))


with torch.no_grad():
    lowered = {
        name: lower_pt2e_quantized_to_x86(copy.deepcopy(converted[name]), images)
        for name in ("x86", "arm")
    }
print({name: dict(onednn_ops(gm)) for name, gm in lowered.items()})
assert sum(onednn_ops(lowered["x86"]).values()) == 5, "3 個 conv（其中一個帶著 add）、2 個 linear"
assert not onednn_ops(lowered["arm"]), "Arm 的圖裡沒有 oneDNN 運算"
gap = (lowered["x86"](*images) - converted["x86"](*images)).abs().max()
print(f"x86 lowering 後 vs q/dq：{gap:.2e}")

# %%
# **XNNPACK**：ExecuTorch 的執行環境在 XNNPACK 的 int8 kernel 上執行它的圖（M06），由
# ``XnnpackPartitioner`` 委派：

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.runtime import Runtime

from common.edge import delegated, to_executorch

with contextlib.redirect_stderr(io.StringIO()):
    manager = to_executorch(converted["xnnpack"], images, partitioner=XnnpackPartitioner())
    program = Runtime.get().load_program(manager.buffer)  # Method 執行時 Program 必須還在
    (on_xnnpack,) = program.load_method("forward").execute([images[0]])
print(f"XNNPACK vs q/dq：{(on_xnnpack - converted['xnnpack'](*images)).abs().max():.2e}")
delegates = delegated(manager.exported_program())
kernels = ("aten_convolution", "aten_linear", "aten_add")
computed = [n for names in delegates.values() for n in names if n.startswith(kernels)]
print(f"{len(delegates)} 個 XNNPACK delegate，執行 {len(computed)} 個 conv、linear 與 add")
assert len(computed) == 6, "每個 conv、linear 與 add 都在 XNNPACK 裡執行"

# %%
# **OpenVINO**：OpenVINO 執行環境轉換匯出的 q/dq 程式（weight 不預先量化，和 ExecuTorch 的
# OpenVINO 流程交給它的一樣， ``fold_quantize=False`` ），並為 CPU 編譯。它的執行期模型說明
# 每一層以什麼精度執行：conv 與 linear 層都是 ``u8`` 。

import openvino as ov

unfolded = quantize(OpenVINOQuantizer(), fold_quantize=False)
compiled = ov.Core().compile_model(ov.convert_model(torch.export.export(unfolded, images)), "CPU")
layers = [op.get_rt_info() for op in compiled.get_runtime_model().get_ordered_ops()]
precision = {
    (info["layerType"].astype(str), info["runtimePrecision"].astype(str)) for info in layers
}
print(sorted(p for p in precision if p[0] in ("Convolution", "FullyConnected")))
assert {p for p in precision if p[0] in ("Convolution", "FullyConnected")} == {
    ("Convolution", "u8"),
    ("FullyConnected", "u8"),
}, "OpenVINO 以 u8 執行 conv 與 linear"
on_openvino = torch.from_numpy(compiled(images[0].numpy())[0])
print(f"OpenVINO vs q/dq：{(on_openvino - unfolded(*images)).abs().max():.2e}")

# %%
# 步驟 7 — reference representation
# ---------------------------------
# ``convert_pt2e(..., use_reference_representation=True)`` 把它認得的模式改寫成以一般
# ``aten`` 運算表示的整數算術，給讀整數運算而不讀 q/dq 的後端使用。在 XNNPACK 的圖上，每個
# int8 的 ``quantize`` ／ ``dequantize`` 都展開成它實際做的算術（ ``div`` 、 ``round`` 、
# ``clamp`` 、 ``to`` ），add + ReLU 變成 int32 算術（ ``out_dtype`` node）。conv 與 linear
# 仍然以浮點數在 dequantize 後的值上計算，原因各不相同。conv 永遠比對不到：torchao 用
# ``aten.convolution`` 寫它的 conv 模式，而 torch 2.13 匯出的是 ``aten.conv2d`` 。linear 只有在
# weight 是 per-tensor、範圍是模式裡寫的 −127…127，而且輸出緊接著就 quantize 時才比對得到；
# 這裡 XNNPACK 的 weight 是 per-channel。


def op_name(node) -> str:
    if "quantized_decomposed" in str(node.target):
        return "q/dq"
    return getattr(node.target, "_overloadpacket", node.target).__name__


def op_counts(gm) -> Counter:
    return Counter(op_name(n) for n in gm.graph.nodes if n.op == "call_function")


reference = quantize(xnnpack_quantizer(), use_reference_representation=True)
counts = op_counts(reference)
print(dict(counts.most_common()))
assert counts["q/dq"] == 0 and counts["out_dtype"] == 2, "int8 的 q/dq 與 add 都被改寫"
assert (counts["conv2d"], counts["linear"]) == (3, 2), "conv 與 linear 仍是浮點數運算"
pattern = importlib.import_module("torchao.quantization.pt2e.reference_representation_rewrite")
conv_pattern = inspect.getsource(pattern._qdq_quantized_conv2d)
assert "aten.convolution.default" in conv_pattern and "convolution" not in counts, "比對不到"
print(f"reference vs q/dq：{(reference(*images) - converted['xnnpack'](*images)).abs().max():.2e}")

# %%
# 改用 per-tensor 的 weight（ ``xnnpack_quantizer(per_channel=False)`` ）， ``fc2`` 的輸出緊接著
# 就 quantize，於是它也變成 int32 算術；而 ``fc1`` 與它的 quantize 之間夾著 ReLU，它和三個 conv
# 一樣維持浮點數。

per_tensor = quantize(xnnpack_quantizer(per_channel=False), use_reference_representation=True)
tensor_counts = op_counts(per_tensor)
(float_linear,) = per_tensor.graph.find_nodes(
    op="call_function", target=torch.ops.aten.linear.default
)
print({op: tensor_counts[op] for op in ("out_dtype", "conv2d", "linear")})
assert tensor_counts["out_dtype"] > counts["out_dtype"] and tensor_counts["conv2d"] == 3
assert [u.target for u in float_linear.users] == [torch.ops.aten.relu.default], "fc1"

# %%
# 小結
# ----
# =====================  ==================  ==================  ==========================
# quantizer              活化值              weight              在這台機器上的 int8
# =====================  ==================  ==================  ==========================
# X86InductorQuantizer   u8 仿射             s8 per-channel      oneDNN，lowering 之後
# XNNPACKQuantizer       s8 仿射             s8 per-channel      ExecuTorch + XNNPACK
# ArmInductorQuantizer   s8 仿射             s8 per-tensor       沒有：只有 q/dq 模擬
# OpenVINOQuantizer      u8 對稱             s8 per-channel      OpenVINO 執行環境，CPU
# Arm TOSA、Cortex-M     —                   —                   無法匯入
# =====================  ==================  ==================  ==========================
#
# 手寫的 pass 在四者之下都和 torchao 逐位元相同：quantizer 就只是它的 annotation。
#
# 練習
# ----
# 1. 用 ``use_reference_representation=True`` 轉換 Arm 的圖。Arm 的活化值也是 int8，weight
#    是 per-tensor：預測是否還留有 q/dq 運算，以及是否有運算以 int32 計算。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          arm = quantize(arm_quantizer(), use_reference_representation=True)
#          arm_reference = op_counts(arm)
#          print(dict(arm_reference.most_common()))
#          assert arm_reference["q/dq"] == 0, "每個 int8 的 q/dq 都被改寫"
#          assert arm_reference["out_dtype"] == 0, "沒有 int32 運算"
#          # linear：Arm 的 weight 範圍是 -128...127，不是模式裡的 -127...127
#          weight = get_default_arm_inductor_quantization_config().weight
#          assert (weight.quant_min, weight.quant_max) == (-128, 127)
#          assert (arm_reference["conv2d"], arm_reference["linear"]) == (3, 2), "全是浮點數"
#          # conv 比對不到任何模式（aten.conv2d），add 則融合進它前面的 conv
#          # （Arm 的 quantizer 沿用 x86 的 conv + add）：也沒有 add 的模式
#
# 2. 要求 OpenVINO 使用 ``QuantizationMode.INT8_MIXED`` （ ``OpenVINOQuantizer(mode=...)`` ）。
#    預測活化值的 spec。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from executorch.backends.openvino.quantizer import QuantizationMode
#
#          mixed = coverage(graph, OpenVINOQuantizer(mode=QuantizationMode.INT8_MIXED))
#          print(spec_table(mixed))
#          assert mixed.schemes("activation") == ["u8 per-tensor affine"], "活化值改為仿射量化"
#          assert mixed.schemes("weight") == ["s8 per-channel symmetric"]
#
# 3. 讓 XNNPACK 以 per-tensor 量化 weight（ ``xnnpack_quantizer(per_channel=False)`` ）。預測
#    weight 的 spec，以及手寫的 pass 是否仍和 torchao 相同。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          per_tensor = coverage(graph, xnnpack_quantizer(per_channel=False))
#          assert per_tensor.schemes("weight") == ["s8 per-tensor symmetric"]
#          by_hand = (handmade.prepare, handmade.convert)
#          mine = quantize(xnnpack_quantizer(per_channel=False), passes=by_hand)
#          theirs = quantize(xnnpack_quantizer(per_channel=False))
#          assert torch.equal(mine(*images), theirs(*images)), "仍然逐位元相同"
#
# 延伸閱讀
# --------
# - `ArmInductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/arm_inductor_quantizer.py>`_
# - `ExecuTorch 的 OpenVINO 後端
#   <https://github.com/pytorch/executorch/tree/main/backends/openvino>`_
# - `reference representation 改寫
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/reference_representation_rewrite.py>`_
#
# 下一課
# ------
# :ref:`M07-4 · 運算圖鑑 <sphx_glr_lessons_m07_your_model_m07_4_op_atlas.py>` 把同樣這四個
# quantizer 用在超過 40 個運算上，一次一個運算，並追到實際執行它的地方。
