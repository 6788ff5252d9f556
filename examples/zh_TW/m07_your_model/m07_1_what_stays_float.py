"""
M07-1 我的 quantizer 會把什麼留在浮點數？
=========================================

帶一個不是課程寫的模型來，逐個運算問清楚：quantizer 把哪些變成 int8、把哪些留在浮點數，
又是為什麼。 ``common.coverage`` 依據 quantizer 寫下的 annotation 與它自己的規則回答。在一個
MobileNet 式 CNN 上， ``X86InductorQuantizer`` 一開始就拒絕整張圖，因為有一個活化模組在好幾個
地方被呼叫；strict 匯出修好這一點之後，它把 squeeze-excitation 裡需要廣播的 ``mul`` 留在
浮點數，而 ExecuTorch 的 ``XNNPACKQuantizer`` 把每個 conv、linear、add 與 mul 都量化了
（本課的計算運算指 conv、linear、matmul、attention，以及兩個張量之間的 add 與 mul；不含
view、reshape 這類搬移資料的運算）。
到了 ``nn.TransformerEncoderLayer`` ，角色對調：x86 把 attention 的兩個 linear、SDPA 與兩個
殘差 add 都留在浮點數，XNNPACK 只留下 SDPA。在 torchvision 的架構上（本頁四個：ResNet18、
MobileNetV2 與 V3、一個 ViT；ResNet50 與 EfficientNet-B0 在練習 3）也是同樣的規則在決定：
x86 拒絕 ResNet 重複使用的 ``self.relu`` ，並把每個 squeeze-excitation 的 ``mul`` 留在
浮點數。要報告列出每一個運算、不只計算運算時，它也說出計算運算之間發生了什麼：哪些活化函式
融合在 int8 conv 或 linear 裡執行、哪些 pooling 讓 int8 直接穿過、哪些 norm 與活化函式留在
浮點數。

**你會學到**

- 對任何匯出的模型，怎麼讀出 quantizer 把哪些計算運算留在浮點數、原因是什麼
- 為什麼重複使用的活化模組會讓 ``X86InductorQuantizer`` 失敗，以及怎麼修
- x86 與 XNNPACK 兩個 quantizer 在 CNN 與 Transformer 上有哪些不同
- 兩者各把 ResNet、MobileNet、EfficientNet 與 ViT 的哪些運算留在浮點數
- 怎麼讀出每一個運算的下場，包括活化函式、pooling 與 norm（ ``every_op=True`` ）

**先備知識**： :ref:`M00-3 · 找出模式
<sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`、 :ref:`M05-1 · quantizer 在
attention 裡看見什麼 <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`、 :ref:`M06-1 ·
XNNPACK quantizer <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 這個 CNN 照真實模型程式碼的寫法，仿照 MobileNetV3 與 ResNet：inverted residual block
# （1×1 擴張、3×3 depthwise conv、squeeze-excitation、1×1 投影）搭配 hardswish、就地的殘差
# add ``out += x`` 、adaptive pooling，還有一個 ``nn.ReLU`` （ ``self.relu`` ）與每個 block 一個
# ``nn.Hardswish`` （ ``self.act`` ），各在兩個地方被呼叫，就像 torchvision 的 ``BasicBlock``
# 把它唯一的 ``self.relu`` 呼叫兩次。 ``one_module_per_call=True`` 建出同一個模型，但每次
# 呼叫各用一個模組。隨機 weight，32×32 的影像。

import importlib
import inspect
import logging
import re

import torch
from torch import nn

from common.charts import display_width, pad
from common.coverage import COMPUTE_OPS, MOVING_KINDS, coverage, side_by_side
from common.expect import expect_error
from common.pt2e import export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer

from common.edge import xnnpack_quantizer

images = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
tokens = (torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1)),)

# %%
# 模型，由 torchvision 的 MobileNetV3 也有的零件組成： ``SqueezeExcite`` 、
# ``InvertedResidual`` 與 ``MobileNetish`` ； ``build`` 用固定的隨機 weight 建出一個。
# ``quantized_block`` 單獨量化一個 block（strict 匯出、用隨機活化值校準），供畫圖使用。


class SqueezeExcite(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce, self.relu = nn.Conv2d(channels, channels // 4, 1), nn.ReLU()
        self.expand, self.gate = nn.Conv2d(channels // 4, channels, 1), nn.Hardsigmoid()

    def forward(self, x):
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))


def conv_bn(cin, cout, kernel=1, *, stride=1, groups=1):
    conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout))


class InvertedResidual(nn.Module):
    def __init__(self, channels, expand, *, one_module_per_call=False):
        super().__init__()
        hidden = channels * expand
        self.expand = conv_bn(channels, hidden)
        self.depthwise = conv_bn(hidden, hidden, 3, groups=hidden)
        self.se = SqueezeExcite(hidden)
        self.project = conv_bn(hidden, channels)
        self.act = nn.Hardswish()
        self.act2 = nn.Hardswish() if one_module_per_call else None

    def forward(self, x):
        out = self.act(self.expand(x))
        out = self.se((self.act2 or self.act)(self.depthwise(out)))
        out = self.project(out)
        out += x
        return out


class MobileNetish(nn.Module):
    def __init__(self, *, one_module_per_call=False):
        super().__init__()
        self.stem, self.relu = conv_bn(3, 16, 3, stride=2), nn.ReLU()
        blocks = [InvertedResidual(16, 4, one_module_per_call=one_module_per_call) for _ in "ab"]
        self.blocks = nn.Sequential(*blocks)
        self.relu2 = nn.ReLU() if one_module_per_call else None
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Linear(16, 64), nn.Hardswish(), nn.Linear(64, 10))

    def forward(self, x):
        x = (self.relu2 or self.relu)(self.blocks(self.relu(self.stem(x))))
        return self.head(torch.flatten(self.pool(x), 1))


def build(**options) -> MobileNetish:
    torch.manual_seed(0)
    return MobileNetish(**options).eval()


def quantized_block(quantizer):
    block = build(one_module_per_call=True).blocks[0]
    activations = (torch.randn(2, 16, 16, 16, generator=torch.Generator().manual_seed(2)),)
    prepared = prepare_pt2e(
        torch.export.export(block, activations, strict=True).module(), quantizer
    )
    prepared(*activations)
    return convert_pt2e(prepared)


# %%
# 步驟 1 — 問 x86 quantizer
# --------------------------
# ``coverage(model, quantizer)`` 對匯出的圖的副本執行 prepare，讀取每個計算運算的
# annotation。這個 CNN 照 ``export_module`` 的方式（non-strict）匯出後，x86 quantizer 自己就
# 失敗了：它比對 conv + 一元運算的模式時，每個模組只取一個來源分割；被呼叫兩次的模組，
# 就成了一個有兩個輸出的分割。報告的錯誤訊息指出哪些模組在好幾個地方被呼叫，以及兩種解法。

model = build()
graph = export_module(model, images)
modules = "'relu' (ReLU, 2 calls), 'blocks.0.act' (Hardswish, 2 calls)"
with expect_error(ValueError, match=modules):
    coverage(graph, x86_quantizer())

# %%
# 步驟 2 — strict 匯出，再比較兩個 quantizer
# -------------------------------------------
# strict 匯出（ ``strict=True`` ，TorchDynamo 的追蹤器）在每個 node 上記錄
# ``source_fn_stack`` ，每次呼叫一個名字，而 ``get_source_partitions`` 先讀它、再讀
# ``nn_module_stack`` ：每次呼叫各成一個分割，模式就比對得上。同一張圖在 x86 與 XNNPACK
# 之下的每個計算運算：

strict = torch.export.export(model, images, strict=True).module()
x86 = coverage(strict, x86_quantizer())
xnnpack = coverage(strict, xnnpack_quantizer())
print(side_by_side(x86, xnnpack))

# %%
# 依運算種類的數量（int8、全部）：

print(x86.summary())
print(xnnpack.summary())
assert x86.counts() == {"conv": (11, 11), "mul": (0, 2), "add": (2, 2), "linear": (2, 2)}
assert xnnpack.counts() == {"conv": (11, 11), "mul": (2, 2), "add": (2, 2), "linear": (2, 2)}

# %%
# 兩個 add 在 x86 下也是 int8，但方式不同：x86 只在 add 與它前面的 conv 融合時標註它
# （ ``conv + add`` ），conv 的輸出從不離開 int8 kernel；XNNPACK 則把 add 當成獨立的運算，
# 量化它的兩個輸入與輸出。

print(x86["add_"].why, "|", xnnpack["add_"].why)
assert x86["add_"].status == "int8 fused" and xnnpack["add_"].status == "int8 static"

# %%
# 步驟 3 — 看見浮點的 mul
# -----------------------
# 同一個 block，分別由兩者量化。在 x86 下，squeeze-excitation 的 ``mul`` （醒目標示）以浮點數
# 讀取兩個輸入——hardswish 的輸出與 gate——只有它的輸出被量化，交給後面的投影 conv；在 XNNPACK
# 下，兩個輸入都經過 dequantize node。

dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor.default
x86_block = quantized_block(x86_quantizer())
draw(x86_block, highlight=["mul"], title="x86：squeeze-excitation 的 mul 留在浮點數")
(mul,) = x86_block.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)
assert not any(arg.target == dequantize for arg in mul.args), "x86：浮點輸入"

# %%

xnnpack_block = quantized_block(xnnpack_quantizer())
draw(xnnpack_block, highlight=["mul"], title="XNNPACK：int8 的 mul")
(mul,) = xnnpack_block.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)
assert all(arg.target == dequantize for arg in mul.args), "XNNPACK：兩個輸入都經過 dequantize"

# %%
# 原因： ``mul.Tensor`` 在 x86 的 ``default_quantizable_ops`` 裡，但 ``_annotate_mul_tensor``
# 會跳過兩個輸入形狀不同的 mul，而 squeeze-excitation 是把 ``(2, 64, 16, 16)`` 的活化值乘上
# ``(2, 64, 1, 1)`` 的 gate。

print(x86["mul"].why)
source = inspect.getsource(x86_inductor_quantizer.X86InductorQuantizer._annotate_mul_tensor)
assert "_same_shape(node.args[0], node.args[1])" in source
assert torch.ops.aten.mul.Tensor in x86_inductor_quantizer.default_quantizable_ops

# %%
# 步驟 4 — 一層 Transformer：角色對調
# -----------------------------------
# ``nn.TransformerEncoderLayer`` （寬度 64、4 個 head、 ``batch_first=True`` ）。x86 把
# attention 的兩個 linear 留在浮點數——它們是 ``nn.MultiheadAttention`` 裡的 ``F.linear``
# 呼叫（M05-1）——兩個殘差 add 也一樣：x86 只在 add 緊接在 linear 後面時，把它融合進去一起
# 量化，而這裡兩者之間夾著一個 eval 模式的 dropout node（這一層的原始碼寫的是
# ``dropout2(linear2(...))`` ； ``nn.Dropout`` 在 eval 模式下什麼也不做，但 non-strict 匯出
# 仍留下它的 node）。報告在 ``linear2`` 之後的 add 上點名這個 dropout；attention 之後的 add
# 前面則有一個 dropout 與 MHA 的 reshape。XNNPACK 依運算而不是依模組找 linear，並且把 add
# 當成獨立的運算量化：只有 SDPA 留在浮點數，它不在任何一個 quantizer 的集合裡。

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
layer_graph = export_module(layer, tokens)
x86_layer = coverage(layer_graph, x86_quantizer())
xnnpack_layer = coverage(layer_graph, xnnpack_quantizer())
print(side_by_side(x86_layer, xnnpack_layer))
print(x86_layer.table(only="float"))
assert x86_layer.counts() == {"linear": (2, 4), "attention": (0, 1), "add": (0, 2)}
assert xnnpack_layer.counts() == {"linear": (4, 4), "attention": (0, 1), "add": (2, 2)}
assert "eval-mode dropout" in x86_layer["add_1"].reason, "linear2 與 add 之間的 dropout2"

# %%
# 步驟 5 — torchvision 的架構
# ---------------------------
# ``get_model`` 能建出六個架構，寫法照 torchvision 0.28，深度與寬度都是原尺寸：ResNet18
# 與 ResNet50、MobileNetV2、MobileNetV3-small、EfficientNet-B0 與一個小型 ViT
# （ ``common.vision_models`` ；torchvision 本身無法與這個 CPU 版的 torch 一起匯入，見該模組的
# 說明）。這裡取其中四個，各有自己的寫法習慣，照 ``export_module`` 的方式匯出（non-strict），
# 再交給兩個 quantizer 報告，每一個運算都報告（ ``every_op=True`` ，步驟 6）；表格數的是
# 計算運算。ResNet50 與 EfficientNet-B0 留給練習 3。隨機 weight，64×64 的影像。

from common.models import VISION_NAMES, example_inputs, get_model, input_shape

HEADER = ("架構", "x86", "x86 下的浮點運算", "XNNPACK", "XNNPACK 下的浮點運算")
REFUSED = "拒絕"


COMPUTE_KINDS = set(COMPUTE_OPS.values())


def compute_counts(report):
    return {k: counts for k, counts in report.counts().items() if k in COMPUTE_KINDS}


def int8_of_all(report):
    counts = compute_counts(report).values()
    return f"{sum(int8 for int8, _ in counts)}/{sum(total for _, total in counts)}"


def float_kinds(report):
    return "、".join(f"{k} {i}/{n}" for k, (i, n) in compute_counts(report).items() if i < n)


ON_THE_PAGE = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "vit_tiny")
assert set(ON_THE_PAGE) < set(VISION_NAMES)
models, zoo, refusals = {}, {}, {}
for name in ON_THE_PAGE:
    models[name] = get_model(name)
    graph = export_module(models[name], example_inputs(2, shape=input_shape(name)))
    zoo[name] = {"XNNPACK": coverage(graph, xnnpack_quantizer(), every_op=True)}
    try:
        zoo[name]["x86"] = coverage(graph, x86_quantizer(), every_op=True)
    except ValueError as error:
        refusals[name] = str(error)

rows = [HEADER]
for name, reports in zoo.items():
    on_x86, on_xnnpack = reports.get("x86"), reports["XNNPACK"]
    x86_cells = (int8_of_all(on_x86), float_kinds(on_x86)) if on_x86 else (REFUSED, "")
    rows.append((name, *x86_cells, int8_of_all(on_xnnpack), float_kinds(on_xnnpack)))
widths = [max(display_width(row[i]) for row in rows) for i in range(len(HEADER))]
for row in rows:
    print("  ".join(pad(cell, width) for cell, width in zip(row, widths, strict=True)).rstrip())

# %%
# XNNPACK 在四個架構裡把每個 conv、linear、add 與 mul 都變成 int8，只有 ViT 的 attention
# （SDPA）留在浮點數。x86 留在浮點數的正好是 squeeze-excitation 的 ``mul`` （每個
# ``SqueezeExcitation`` 模組一個，就是步驟 3 的廣播），以及 ViT 裡 attention 的 ``F.linear``
# 呼叫、SDPA 與 add（步驟 4）。兩者都把每個 conv 變成 int8：數量等於模型裡 ``nn.Conv2d``
# 模組的個數。

for name, reports in zoo.items():
    model = models[name]
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    squeeze_excitations = sum(type(m).__name__ == "SqueezeExcitation" for m in model.modules())
    for label, report in reports.items():
        counts = report.counts()
        assert counts["conv"] == (convs, convs), (name, label)
        if squeeze_excitations:
            expected_mul = squeeze_excitations if label == "XNNPACK" else 0
            assert counts["mul"] == (expected_mul, squeeze_excitations), (name, label)
    on_xnnpack = compute_counts(reports["XNNPACK"])
    assert all(i == n for k, (i, n) in on_xnnpack.items() if k != "attention")

# %%
# x86 拒絕 ResNet18，原因與步驟 1 相同：torchvision 的 ``BasicBlock`` 把它的 ``self.relu``
# 呼叫兩次。拒絕的訊息列出每一個這樣的模組：

for name, message in refusals.items():
    reused = re.findall(r"'([\w.]+)' \(ReLU, (\d) calls\)", message)
    print(f"{name}：{len(reused)} 個 ReLU，各被呼叫 {reused[0][1]} 次（{reused[0][0]} 等）")
assert set(refusals) == {"resnet18"}

# %%
# 步驟 2 的修法在真正的 ResNet 上也成立：strict 匯出之後，ResNet18 在 x86 下也全部是 int8。

resnet_args = example_inputs(2, shape=input_shape("resnet18"))
resnet = torch.export.export(models["resnet18"], resnet_args, strict=True).module()
resnet_x86 = coverage(resnet, x86_quantizer())
print(resnet_x86.summary())
assert resnet_x86.counts() == compute_counts(zoo["resnet18"]["XNNPACK"])
assert all(i == n for i, n in resnet_x86.counts().values())

# %%
# 步驟 6 — 每一個運算，不只計算運算
# ---------------------------------
# 步驟 5 的報告涵蓋每一個對張量數值做運算的 op（ ``every_op=True`` ）：活化函式、pooling、
# norm、reduction，以及只搬移數值的 layout 運算也在內。這樣的運算若在它前面的 int8 conv 或
# linear 裡執行（例如 conv 後面的 ReLU），就是 ``int8 融合`` ；若以輸入的 scale 讀寫 int8
# （例如 max-pool），就是 ``int8 共用`` ；此外還有 ``int8 靜態`` ，或是 ``浮點數`` 並附上
# quantizer 的規則。 ``grouped`` 讓大模型的報告保持簡短：每個運算、狀態與原因一列。以下是每份
# 報告裡的浮點運算，不列 layout 運算（ ``with_layout=False`` ）：

for name, reports in zoo.items():
    for label, report in reports.items():
        floats = [op for op in report.ops if not op.int8 and op.kind not in MOVING_KINDS]
        print(f"{name}，{label}：{len(floats)} 個浮點數")
        if floats:
            print(report.grouped(only="float", with_layout=False))

# %%
# XNNPACK 把 MobileNetV3 的 hardswish 與 hardsigmoid，以及 ViT 的 GELU 與 LayerNorm 留在
# 浮點數：它沒有任何模式涵蓋這些運算。x86 把 hardswish 融合進它前面的 conv、把 GELU 融合進
# 它前面的 linear，而把 hardsigmoid gate、LayerNorm，以及分類器 linear 之後的那一個 hardswish
# 留在浮點數（x86 只把 hardswish 融合進 conv）。在兩者之下，每個 ReLU 都融合執行或讓 int8
# 直接穿過，每個 max-pool 都沿用輸入的 scale。

v3, vit = zoo["mobilenet_v3_small"], zoo["vit_tiny"]


def modules(name, kind):
    return sum(isinstance(m, kind) for m in models[name].modules())


hardswishes, gelus = modules("mobilenet_v3_small", nn.Hardswish), modules("vit_tiny", nn.GELU)
for label in ("x86", "XNNPACK"):
    gates = modules("mobilenet_v3_small", nn.Hardsigmoid)
    assert v3[label].statuses("hardsigmoid") == {"float": gates}
    assert vit[label].statuses("layer_norm") == {"float": modules("vit_tiny", nn.LayerNorm)}
assert v3["XNNPACK"].statuses("hardswish_") == {"float": hardswishes}
assert v3["x86"].statuses("hardswish_") == {"int8 fused": hardswishes - 1, "float": 1}
assert vit["x86"].statuses("gelu") == {"int8 fused": gelus}
assert vit["XNNPACK"].statuses("gelu") == {"float": gelus}
for reports in zoo.values():
    for report in reports.values():
        for op in ("relu", "relu_", "max_pool2d"):
            assert set(report.statuses(op)) <= {"int8 fused", "int8 shared"}, (report.label, op)

# %%
# 步驟 7 — ExecuTorch 的 QuantizerReporter
# ----------------------------------------
# ExecuTorch 1.5.1 附有自己的報告工具 ``QuantizerReporter``
# （ ``executorch.backends.cortex_m.quantizer_reporter`` ）。它回報的，是 quantizer 在標註時
# 透過 ``QuantizerReporterUser`` 介面（ ``get_quantizer_info`` 、 ``register_reporter`` ）
# 告訴它的事；實作這個介面的是 ExecuTorch 的 Cortex-M 與 Arm quantizer，而它們
# 需要 PyPI 上沒有的 ``tosa_serializer`` ，在這裡無法匯入：

with expect_error(ModuleNotFoundError, match="tosa_serializer"):
    importlib.import_module("executorch.backends.cortex_m.quantizer.quantizer")

# %%
# ``XNNPACKQuantizer`` 與 ``X86InductorQuantizer`` 都沒有實作這兩個方法，所以這份報告對它們
# 不適用：

from executorch.backends.cortex_m.quantizer_reporter import QuantizerReporter

logging.getLogger("executorch.backends.cortex_m.quantizer_reporter").setLevel(logging.ERROR)
with expect_error(AttributeError, match="get_quantizer_info"):
    QuantizerReporter([xnnpack_quantizer()])
assert not any(hasattr(q, "get_quantizer_info") for q in (x86_quantizer(), xnnpack_quantizer()))

# %%
# 小結
# ----
# ==================================  ========================  ===========================
# 運算                                x86                       XNNPACK
# ==================================  ========================  ===========================
# conv、depthwise conv、1×1 conv      int8                      int8
# 就地的殘差 ``add_``                 int8，與 conv 融合        int8，獨立的運算
# squeeze-excitation 的 ``mul``       浮點數：形狀不同          int8
# MHA 的 linear                       浮點數：不是 nn.Linear    int8（依運算比對）
# encoder 的殘差 add                  浮點數：中間夾著 dropout  int8
# ``scaled_dot_product_attention``    浮點數                    浮點數
# conv 之後的 ReLU                    int8，與 conv 融合        int8，與 conv 融合
# max-pool                            int8，沿用 scale          int8，沿用 scale
# conv 之後的 hardswish               int8，與 conv 融合        浮點數：沒有模式
# linear 之後的 GELU                  int8，與 linear 融合      浮點數：沒有模式
# hardsigmoid、LayerNorm              浮點數                    浮點數
# ==================================  ========================  ===========================
#
# ``coverage(..., every_op=True)`` 報告每一個運算， ``grouped`` 把同一個運算、同一個原因
# 收成一列。每個運算在本課程的每個 quantizer 下變成什麼、接著由哪個 kernel 執行，見運算圖鑑：
# :ref:`M07-4 · 運算圖鑑 <sphx_glr_lessons_m07_your_model_m07_4_op_atlas.py>`。
#
# 在 non-strict 匯出的圖上，一個在好幾個地方被呼叫的模組，會讓 x86 在這一切之前就停下來：
# 用 ``strict=True`` 匯出，或讓每次呼叫各用一個模組。torchvision 的 ResNet 正是這樣的模型
# （每個 block 把 ``self.relu`` 呼叫兩次或三次）；在 x86 下，MobileNetV3 與 EfficientNet-B0
# 的每個 squeeze-excitation 都留下一個浮點的 ``mul`` 。
#
# 練習
# ----
# 1. 要求 XNNPACK 做動態量化（ ``get_symmetric_quantization_config(
#    is_per_channel=True, is_dynamic=True)`` ）。預測 CNN 的哪些計算運算仍是 int8。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
#              XNNPACKQuantizer,
#              get_symmetric_quantization_config,
#          )
#
#          config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
#          dynamic = coverage(strict, XNNPACKQuantizer().set_global(config))
#          print(dynamic.summary())
#          assert dynamic.counts() == {
#              "conv": (6, 11), "mul": (0, 2), "add": (0, 2), "linear": (2, 2)
#          }, "ReLU 前的 conv、depthwise conv、add 與 mul 都不會被動態標註"
#
# 2. 依模組名稱要求 x86 在 attention 裡用 int8：
#    ``set_module_name_qconfig("self_attn", config)`` 。預測 int8 的 linear 數量。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          config = x86_inductor_quantizer.get_default_x86_inductor_quantization_config()
#          by_name = x86_quantizer().set_module_name_qconfig("self_attn", config)
#          assert coverage(layer_graph, by_name).counts()["linear"] == (2, 4), (
#              "仍然是 2：linear 的模式從來找不到 MHA 裡的 F.linear"
#          )
#
# 3. ResNet50 的 ``Bottleneck`` 把 ``self.relu`` 呼叫三次；EfficientNet-B0 的 16 個 block 各有
#    一個 squeeze-excitation（SiLU，再接 sigmoid gate）。照步驟 5 的方式匯出，預測兩個
#    quantizer 對它們的報告。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          name = "resnet50"
#          resnet50 = export_module(get_model(name), example_inputs(2, shape=input_shape(name)))
#          with expect_error(ValueError, match="'layer1.0.relu' (ReLU, 3 calls)"):
#              coverage(resnet50, x86_quantizer())
#          assert all(i == n for i, n in coverage(resnet50, xnnpack_quantizer()).counts().values())
#
#          name = "efficientnet_b0"
#          effnet = export_module(get_model(name), example_inputs(2, shape=input_shape(name)))
#          assert coverage(effnet, x86_quantizer()).counts()["mul"] == (0, 16), "每個 block 一個"
#          assert all(i == n for i, n in coverage(effnet, xnnpack_quantizer()).counts().values())
#
# 延伸閱讀
# --------
# - `X86InductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `XNNPACKQuantizer 原始碼
#   <https://github.com/pytorch/executorch/blob/main/backends/xnnpack/quantizer/xnnpack_quantizer.py>`_
# - `torch.export：strict 與 non-strict
#   <https://docs.pytorch.org/docs/stable/export.html>`_
#
# 下一課
# ------
# :ref:`M07-2 · 不是你寫的 Transformer
# <sphx_glr_lessons_m07_your_model_m07_2_transformer_you_did_not_write.py>` 不修改
# ``nn.TransformerEncoder`` 的程式碼，讓它的每個 linear 都成為 int8。
