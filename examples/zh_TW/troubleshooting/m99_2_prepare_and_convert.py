"""
疑難排解：prepare 與 convert
============================

``prepare_pt2e`` 與 ``convert_pt2e`` 的錯誤與不報錯的失敗：重複使用的活化函式模組、兩個模組
共用的 weight、依名稱留在浮點數的模組、彼此不相容的 observer 與 spec、加了
``@torch.no_grad()`` 的 ``forward``、沒有校準就 convert 的模型、 ``constant_fold`` 處理不了的
改圖結果，以及 M08 的語言模型上：只輸出 0 的動態 int8 解碼器、convert 之後看似不見的 KV 快取，
以及寬度不能被 32 個一組的 int4 整除的 linear。每個條目的標題是錯誤訊息的第一行原文（或讀者
口中的症狀），在本站的環境（torch 2.13、torchao 0.18、executorch 1.5.1）上重現它，指出原因，
以 assert 驗證修正方法，並連到解釋它的那一課。

**先備知識**：無；每個條目都連到解釋它的那一課。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``OneSpecQuantizer`` 用同一個 spec 標註每個 conv 的輸入與輸出。這是最小的 quantizer，方便
# 各條目替換 spec 或 spec 裡的 observer。

import operator
import warnings

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, op_counts, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e import MinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

x = example_inputs(8)
CONV, RELU = torch.ops.aten.conv2d.default, torch.ops.aten.relu.default


def uint8_spec(observer) -> QuantizationSpec:
    return QuantizationSpec(
        dtype=torch.uint8,
        quant_min=0,
        quant_max=255,
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=observer,
    )


class OneSpecQuantizer(Quantizer):
    """用 ``spec`` 量化每個 conv 的輸入與輸出（weight 維持浮點數）。"""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def annotate(self, model):
        for conv in model.graph.find_nodes(op="call_function", target=CONV):
            conv.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={conv.args[0]: self.spec}, output_qspec=self.spec, _annotated=True
            )
        return model

    def validate(self, model):
        pass


# %%
# ValueError: Input partition has more than one output node
# ---------------------------------------------------------
# 真實的模型常常只建立一個 ``nn.ReLU`` ，卻呼叫它兩次。以 non-strict（預設）匯出時，
# ``X86InductorQuantizer.annotate`` 本身就會在這種模型上失敗。


class ReusedReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()  # 一個模組，下面呼叫兩次

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


reused = export_module(ReusedReLU(), x)
with expect_error(ValueError, match="Input partition has more than one output node"):
    prepare_pt2e(reused, x86_quantizer())

# %%
# **原因**，在圖上看：兩個 ``relu`` node 的 ``nn_module_stack`` 裡是同一個模組 ``relu`` 。
# quantizer 依照產生 node 的模組把它們分組（partition），於是看到一個有兩個輸出的「ReLU」，
# 並拒絕它。

relus = reused.graph.find_nodes(op="call_function", target=RELU)
for node in relus:
    print(node.name, "來自模組", list(node.meta["nn_module_stack"].values())[-1])
draw(reused, highlight=[n.name for n in relus], title="兩個 relu node，同一個 nn.ReLU 模組")
modules = {list(n.meta["nn_module_stack"].values())[-1][0] for n in relus}
assert len(relus) == 2 and modules == {"relu"}, "兩個 relu node，一個模組"

# %%
# **修正**：每次呼叫用一個自己的活化函式模組。說明見
# :ref:`M00-3 · 找出模式 <sphx_glr_lessons_m00_graphs_m00_3_finding_patterns.py>`。


class OneReLUPerCall(ReusedReLU):
    def __init__(self):
        super().__init__()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(self.conv2(self.relu(self.conv1(x))))


prepared = prepare_pt2e(export_module(OneReLUPerCall(), x), x86_quantizer())
calibrate(prepared)
assert op_counts(convert_pt2e(prepared))["quantize_per_tensor.default"] >= 2, "兩個 conv 都被量化了"

# %%
# 重複使用的 ``nn.Linear`` 也有人用這個標題回報（pytorch/ao#4478），但在 torchao 0.18 上它能
# prepare 也能 convert，同一個 ``fc`` 的兩次呼叫都讀 int8 的輸入（下面以 ``assert`` 確認）。
# 編譯之後，被兩個 linear 讀取的 weight 另有一個陷阱：見 M07-4 的「linear · weight shared」
# 那一列。 :ref:`M07-5 · 換來更多 int8 的改寫
# <sphx_glr_lessons_m07_your_model_m07_5_rewrites_for_int8.py>` 的步驟 6 讓 GRU 的 cell 每個
# 步驟各有一份副本，使每個 linear 都以 int8 執行，並量測這在遞迴模型上換來多少。


class ReusedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)  # one module, called twice below

    def forward(self, t):
        return self.fc(torch.relu(self.fc(t)))


tokens = (torch.randn(2, 16),)
prepared = prepare_pt2e(export_module(ReusedLinear(), tokens), x86_quantizer())
prepared(*tokens)
linears = convert_pt2e(prepared).graph.find_nodes(
    op="call_function", target=torch.ops.aten.linear.default
)
DQ_TENSOR = torch.ops.quantized_decomposed.dequantize_per_tensor.default
assert len(linears) == 2 and all(n.args[0].target == DQ_TENSOR for n in linears), (
    "同一個 linear 的兩次呼叫都讀反量化的 int8 輸入"
)

# %%
# 綁在一起的 weight 被量化兩次（兩個模組共用一個 weight）
# -------------------------------------------------------
# 模型常把 weight 綁在一起：``b.weight = a.weight``，或把 embedding 和輸出的 linear 綁在一起。
# 這在 torch 2.6 上回報時是 ``ValueError: Linear partition cannot have more than one output
# node``
# （`pytorch/pytorch#142035 <https://github.com/pytorch/pytorch/issues/142035>`_ ）；在
# torch 2.13 上 ``prepare_pt2e`` 可以執行。匯出後，兩個模組透過同一個 ``get_attr`` node 讀取
# 這個 weight。剩下的陷阱：每個模組用不同的 config（這裡 ``set_module_name`` 讓 ``b`` 用
# per-tensor，其餘用 per-channel），會在這一個 node 上放兩個 observer，convert 於是把這個
# weight 存兩次，兩份 int8 的 scale 不同：綁定就這樣無聲無息地消失了。

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    get_symmetric_quantization_config,
)

from common.edge import xnnpack_quantizer


class TiedLinears(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.b.weight = self.a.weight  # 一個 Parameter，兩個模組

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def tied_weight_observers(prepared) -> list[str]:
    """讀取綁定 weight 的那一個 get_attr node，其輸出上的 observer。"""
    (weight,) = [n for n in prepared.graph.find_nodes(op="get_attr") if n.target.endswith("weight")]
    return [
        type(prepared.get_submodule(u.target)).__name__
        for u in weight.users
        if u.op == "call_module"
    ]


def int8_constants(converted) -> list[str]:
    """convert 後的圖讀取的 int8 張量（量化後的 weight）。"""
    return [
        n.target
        for n in converted.graph.find_nodes(op="get_attr")
        if operator.attrgetter(n.target)(converted).dtype == torch.int8
    ]


features = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
per_tensor = get_symmetric_quantization_config(is_per_channel=False)
mixed = prepare_pt2e(
    export_module(TiedLinears(), (features,)), xnnpack_quantizer().set_module_name("b", per_tensor)
)
observers = tied_weight_observers(mixed)
mixed(features)  # 校準
twice = convert_pt2e(mixed)
print(f"綁定 weight 的 observer：{observers}；int8 常數：{int8_constants(twice)}")
assert len(observers) == 2 and len(int8_constants(twice)) == 2, "同一個 weight，以 int8 存了兩次"

# %%
# **修正**：共用 weight 的模組給同一個 config（這裡用全域的那一個）：於是只有一個 observer
# 觀察這個 weight，convert 也只存一個 int8 張量，兩個 linear 都 dequantize 它。（用
# ``X86InductorQuantizer`` 時，綁在 linear 上的 embedding 維持浮點數：embedding 讀浮點數的
# weight，linear 讀它的 int8 副本。）prepare 把 observer 放在哪裡、哪些邊共用一個 observer，
# 說明見 :ref:`M02-2 · 親手做 prepare <sphx_glr_lessons_m02_by_hand_m02_2_prepare_by_hand.py>`。

same = prepare_pt2e(export_module(TiedLinears(), (features,)), xnnpack_quantizer())
observers = tied_weight_observers(same)
same(features)
once = convert_pt2e(same)
print(f"綁定 weight 的 observer：{observers}；int8 常數：{int8_constants(once)}")
assert len(observers) == 1 and len(int8_constants(once)) == 1, "一個 weight，一個 int8 張量"

# %%
# AssertionError: quantization_config == None is not supported yet
# ----------------------------------------------------------------
# 把一個模組的 config 設成 ``None``，這個模組就維持浮點數：``X86InductorQuantizer`` 接受
# ``set_module_name_qconfig("b", None)``。換成 ExecuTorch 裡對應的
# ``XNNPACKQuantizer().set_module_name("b", None)``，還沒看到任何圖就立刻拒絕。

with expect_error(AssertionError, match="quantization_config == None is not supported yet"):
    xnnpack_quantizer().set_module_name("b", None)

# %%
# **原因**：``set_module_name`` 斷言它的 config 不是 ``None`` （ExecuTorch 1.5.1 的
# ``xnnpack_quantizer.py`` ）；``set_module_type`` 沒有這個斷言，在那裡 ``None`` 可以用：
# ``annotate`` 跳過 ``None`` 的 config，全域的 config 也跳過兩張表裡列出的每個模組。但一個
# 類別涵蓋這個類別的每個模組：``set_module_type(nn.Linear, None)`` 讓兩個 linear 都維持
# 浮點數，這裡不只 ``b``，連 ``a`` 也是。


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def float_weights(quantizer) -> list[str]:
    """convert 後的 ``TwoLinears`` 仍以浮點數讀取（不經過 dequantize）的 weight。"""
    prepared = prepare_pt2e(export_module(TwoLinears(), (features,)), quantizer)
    prepared(features)  # 校準
    converted = convert_pt2e(prepared)
    linears = converted.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    return [n.args[1].target for n in linears if n.args[1].op == "get_attr"]


by_type = float_weights(xnnpack_quantizer().set_module_type(nn.Linear, None))
print(f"用 set_module_type(nn.Linear, None) 時的浮點數 weight：{by_type}")
assert by_type == ["a.weight", "b.weight"], "每個 nn.Linear 都是浮點數，不只 b"

# %%
# **修正**：保留全域的 config，把這一個模組過濾掉。``set_filter_function`` 接受一個以 node
# 為引數的函式（每個 annotation 都要通過它），而 torchao 的 ``get_module_name_filter("b")``
# 判斷一個 node 是否記錄在模組 ``b`` 裡：取它的反面，就讓 ``b`` 維持浮點數、其餘照常量化，
# 和 ``X86InductorQuantizer`` 的 ``set_module_name_qconfig("b", None)`` 一樣。依名稱和依類別
# 讓模組維持浮點數，說明見 :ref:`M05-3 · 選擇要量化什麼
# <sphx_glr_lessons_m05_transformers_m05_3_choosing_what_to_quantize.py>`。

from torchao.quantization.pt2e.quantizer import get_module_name_filter

in_b = get_module_name_filter("b")
by_filter = float_weights(xnnpack_quantizer().set_filter_function(lambda node: not in_b(node)))
print(f"用 set_filter_function 時的浮點數 weight：{by_filter}")
assert by_filter == ["b.weight"], "b 是浮點數，a 有量化"
x86_by_name = float_weights(x86_quantizer().set_module_name_qconfig("b", None))
assert x86_by_name == by_filter, "和 X86InductorQuantizer 遇到 None 時的做法一樣"

# %%
# 什麼都沒有被量化（ ``convert_pt2e`` 之後 observer 還留在圖裡）
# ------------------------------------------------------------------
# 如果 quantizer 的 spec 用的是 ``torch.ao.quantization`` （PT2E 的舊家）的 observer，執行時不會
# 出現任何錯誤。``prepare_pt2e`` 插入這些 observer；``convert_pt2e`` 卻不認得它們是 observer，把它們
# 留在圖裡，一個 quantize node 也沒有插入。

from torch.ao.quantization.observer import MinMaxObserver as OldMinMaxObserver

old = prepare_pt2e(
    export_module(get_model("conv_relu"), x), OneSpecQuantizer(uint8_spec(OldMinMaxObserver))
)
calibrate(old)
old_converted = convert_pt2e(old)
left = [
    n.name for n in old_converted.graph.nodes if n.op == "call_module" and "post_process" in n.name
]
draw(old_converted, highlight=left, title="convert_pt2e 之後：torch.ao 的 observer 還在，沒有 q/dq")
assert op_counts(old_converted)["quantize_per_tensor.default"] == 0 and len(left) == 2, (
    "什麼都沒量化，observer 還在"
)

# %%
# **修正**：observer（以及 spec、quantizer）只從 torchao 取得。torchao 的 ``MinMaxObserver``
# 和 ``torch.ao`` 的是不同的類別：convert 只找自己的。說明見
# :ref:`M02-3 · 親手做 convert <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`。

print(OldMinMaxObserver.__module__, "不是", MinMaxObserver.__module__)
new = prepare_pt2e(
    export_module(get_model("conv_relu"), x), OneSpecQuantizer(uint8_spec(MinMaxObserver))
)
calibrate(new)
assert op_counts(convert_pt2e(new))["quantize_per_tensor.default"] == 2, (
    "conv 的輸入與輸出都被量化了"
)

# %%
# ``convert_pt2e`` 之後沒有 quantize node：``forward`` 加了 ``@torch.no_grad()``
# ------------------------------------------------------------------------------
# 推論用的程式碼常在 ``forward`` 加上 ``@torch.no_grad()``。這樣的模型走完匯出、
# ``prepare_pt2e``、校準與 ``convert_pt2e``，沒有錯誤也沒有警告，``X86InductorQuantizer`` 和
# ``XNNPACKQuantizer`` 都一樣；出來的模型卻一個 quantize node 也沒有：它仍以浮點數計算。


class NoGradConvReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    @torch.no_grad()
    def forward(self, x):
        return torch.relu(self.conv(x))


def quantize_nodes(model) -> dict[str, int]:
    """匯出、prepare、校準與 convert 之後的 quantize node 數，依 quantizer 列出。"""
    counts = {}
    for quantizer in (x86_quantizer(), xnnpack_quantizer()):
        prepared = prepare_pt2e(export_module(model, x), quantizer)
        calibrate(prepared)
        converted = convert_pt2e(prepared)
        counts[type(quantizer).__name__] = op_counts(converted)["quantize_per_tensor.default"]
    return counts


decorated = quantize_nodes(NoGradConvReLU().eval())
print(f"convert_pt2e 之後的 quantize node：{decorated}")
assert decorated == {"X86InductorQuantizer": 0, "XNNPACKQuantizer": 0}, "什麼都沒有被量化"

# %%
# **原因**，在圖上看：匯出把梯度模式（grad mode）的切換記成一個 node，
# ``wrap_with_set_grad_enabled`` （一個高階運算，標示出來的那個），它呼叫一個子圖
# ``submod_1``，conv 和 ReLU 都在裡面
# （ ``torch/_export/passes/replace_set_grad_with_hop_pass.py`` ）。quantizer 只標註最上層
# 那張圖的 node，而 ``prepare_pt2e`` 只會進入 ``scan`` 與 ``while_loop`` 的子圖：它看不到
# conv，也就不插入任何 observer。``common.coverage`` 一開頭就這麼說，並說明原因：

from common.coverage import coverage

graph = export_module(NoGradConvReLU().eval(), x)
(wrapped,) = graph.graph.find_nodes(
    op="call_function", target=torch.ops.higher_order.wrap_with_set_grad_enabled
)
body = graph.get_submodule(wrapped.args[1].target)
print(f"{wrapped.args[1].target}: {[n.name for n in body.graph.nodes if n.op == 'call_function']}")
draw(graph, highlight=[wrapped.name], title="整個 forward 在一個 node 裡")
print(coverage(graph, x86_quantizer()).summary())
assert body.graph.find_nodes(op="call_function", target=CONV), "conv 在子圖裡"
assert not graph.graph.find_nodes(op="call_function", target=CONV), "不在最上層的圖裡"

# %%
# **修正**：拿掉 ``forward`` 上的裝飾器，改在 ``with torch.no_grad():`` 裡匯出（之後也在
# 那裡執行模型）。匯出只在梯度模式的切換改變了匯出當下的模式時才保留它，所以 conv 和 ReLU
# 都在最上層的圖裡，兩個 quantizer 都會量化它們。在 ``with torch.no_grad():`` 裡，加了裝飾器
# 的模型也一樣整個匯出。匯出記下了什麼，說明見
# :ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`。


class ConvReLU(NoGradConvReLU):
    def forward(self, x):
        return torch.relu(self.conv(x))


with torch.no_grad():
    undecorated = quantize_nodes(ConvReLU().eval())
    assert quantize_nodes(NoGradConvReLU().eval()) == undecorated, "加了裝飾器：結果一樣"
print(f"convert_pt2e 之後的 quantize node：{undecorated}")
assert all(undecorated.values()), "兩個 quantizer 都有量化"

# %%
# KeyError: conv2d
# ----------------
# ``prepare_pt2e`` 內部引發一個只寫著 node 名稱（這裡是 ``conv2d`` ）的 ``KeyError`` 。
# 某個 annotation 說「共用 ``conv2d`` 的量化參數」（ ``SharedQuantizationSpec(conv)`` ），
# 但沒有任何 annotation 標註 ``conv2d`` 的輸出，所以沒有 observer 可以共用。


class SharesWithConv(Quantizer):
    """relu 與 conv 的輸出共用 qparams；``annotate_conv`` 決定 conv 的輸出是否有標註。"""

    def __init__(self, *, annotate_conv: bool):
        super().__init__()
        self.annotate_conv = annotate_conv

    def annotate(self, model):
        (conv,) = model.graph.find_nodes(op="call_function", target=CONV)
        (relu,) = model.graph.find_nodes(op="call_function", target=RELU)
        spec = uint8_spec(MinMaxObserver)
        if self.annotate_conv:
            conv.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={conv.args[0]: spec}, output_qspec=spec, _annotated=True
            )
        relu.meta["quantization_annotation"] = QuantizationAnnotation(
            input_qspec_map={conv: SharedQuantizationSpec(conv)},
            output_qspec=SharedQuantizationSpec(conv),
            _annotated=True,
        )
        return model

    def validate(self, model):
        pass


with expect_error(KeyError, match="conv2d"):
    prepare_pt2e(export_module(get_model("conv_relu"), x), SharesWithConv(annotate_conv=False))

# %%
# **修正**：``SharedQuantizationSpec`` 指向的 node（它的輸出）或邊 ``(producer, consumer)``
# 必須另有 annotation 給它真正的 spec。conv 有了標註之後，relu 的輸入與輸出就共用 conv 的
# observer。說明見 :ref:`M02-4 · 為新後端寫 quantizer
# <sphx_glr_lessons_m02_by_hand_m02_4_writing_a_quantizer.py>`。

shared = prepare_pt2e(export_module(get_model("conv_relu"), x), SharesWithConv(annotate_conv=True))
observers = dict(shared.named_modules(remove_duplicate=False))
print(f"observer 名稱：{[n for n in observers if n.startswith('activation_post_process')]}")
assert len({id(m) for n, m in observers.items() if n.startswith("activation_post_process")}) == 2

# %%
# UserWarning: must run observer before calling calculate_qparams. Returning default values.
# ------------------------------------------------------------------------------------------
# 對從未校準的模型執行 ``convert_pt2e`` 不會引發錯誤：它只發出警告（在 Jupyter 筆記本裡很容易
# 漏看），並使用 scale 1.0 與 zero point 0——每個活化值都被捨入成整數，輸出毫無意義。

uncalibrated = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    garbage = convert_pt2e(uncalibrated)
print(f"警告：{str(caught[0].message).split('.')[0]}")
scales = {
    n.args[1]
    for n in garbage.graph.nodes
    if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default
}
print(f"活化值的 scale：{scales}")
assert "must run observer before calling calculate_qparams" in str(caught[0].message)
assert scales == {1.0}, "預設的 scale，不是從資料量測的"

# %%
# **修正**：在 prepare 與 convert 之間校準——把具代表性的輸入送進 prepare 後的模型。scale
# 就會符合資料，輸出也接近浮點數的結果。說明見 :ref:`M01-3 · observer 如何把統計值變成 qparams
# <sphx_glr_lessons_m01_quantized_graphs_m01_3_observers.py>`。

reference = get_model("small_cnn")(*x)
calibrated = prepare_pt2e(export_module(get_model("small_cnn"), x), x86_quantizer())
calibrate(calibrated)
good = convert_pt2e(calibrated)
errors = {
    name: (m(*x) - reference).abs().max().item()
    for name, m in [("未校準", garbage), ("校準後", good)]
}
print({name: f"{error:.4f}" for name, error in errors.items()})
assert errors["校準後"] < errors["未校準"] / 10, "校準讓 scale 符合資料"

# %%
# RuntimeError: Node shared_1 target shared references nonexistent attribute shared
# ---------------------------------------------------------------------------------
# torchao 的 ``constant_fold`` （ ``convert_pt2e`` 用它把 weight 折疊成 int8 常數）在這種圖上
# 會失敗：兩個 ``get_attr`` node 讀同一個屬性，而只有其中一個沒人使用： ``constant_fold``
# 刪掉了屬性，另一個 node 卻還在讀
# （ `pytorch/ao#4420 <https://github.com/pytorch/ao/issues/4420>`_ ）。這種圖來自改圖，以及
# 其他編譯器的 pass。

from torchao.quantization.pt2e.constant_fold import constant_fold


def two_reads_of_one_buffer() -> torch.fx.GraphModule:
    root = nn.Module()
    root.register_buffer("shared", torch.arange(4.0))
    graph = torch.fx.Graph()
    inp = graph.placeholder("x")
    folded = graph.call_function(torch.ops.aten.mul.Tensor, (graph.get_attr("shared"), 2.0))
    live = graph.call_function(torch.ops.aten.add.Tensor, (inp, graph.get_attr("shared")))
    graph.output((folded, live))
    return torch.fx.GraphModule(root, graph)


with expect_error(RuntimeError, match="references nonexistent attribute shared"):
    constant_fold(two_reads_of_one_buffer())

# %%
# **修正** （在 torchao 修好之前）：折疊之前讓圖對每個屬性只讀一次（把每個重複的 ``get_attr``
# 的使用者改接到第一個）。說明見
# :ref:`M00-4 · 改圖 <sphx_glr_lessons_m00_graphs_m00_4_graph_surgery.py>`。

gm = two_reads_of_one_buffer()
first = {}
for node in list(gm.graph.find_nodes(op="get_attr")):
    if node.target in first:
        node.replace_all_uses_with(first[node.target])
        gm.graph.erase_node(node)
    else:
        first[node.target] = node
gm.recompile()
constant_fold(gm)
doubled, added = gm(torch.ones(4))
assert torch.equal(doubled, torch.arange(4.0) * 2) and torch.equal(added, torch.arange(4.0) + 1)

# %%
# convert_pt2e 之後，動態 int8 語言模型只輸出 0
# ---------------------------------------------
# 把 M08 的解碼器用動態 int8 活化值（ ``is_dynamic=True`` ：每個活化值的 scale 在執行時才量測）
# 為 XNNPACK 量化，並在 ``prepare_pt2e`` 之後直接 convert，因為「動態量化不需要校準」。沒有任何
# 錯誤； ``convert_pt2e`` 對每個 weight 各發出一次警告（就是上一個條目的警告，共 29 次，一捲就
# 過去了）。每個 logit 都剛好是 0.0：下一個字元是哪一個都一樣可能，困惑度等於詞彙表的大小，
# 貪婪解碼則一再寫出 ``VOCAB[0]`` ，也就是換行字元。

from common.language_model import (
    MAX_LEN,
    VOCAB,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    train_decoder,
)

decoder, _ = train_decoder()  # 每個環境只訓練一次，之後從課程的快取載入
dynamic = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
prompt = (encode("The import")[None], torch.arange(10))
LENGTH = torch.export.Dim("length", min=1, max=MAX_LEN)  # 和 export_decoder 宣告的一樣
DQ_CHANNEL = torch.ops.quantized_decomposed.dequantize_per_channel.default


def dynamic_prepared() -> torch.fx.GraphModule:
    """為 prefill 與 decode 匯出、為 XNNPACK 動態 int8 prepare 好的解碼器。"""
    return prepare_pt2e(export_decoder(decoder).module(), xnnpack_quantizer().set_global(dynamic))


never_run = dynamic_prepared()
observers = [m for name, m in never_run.named_modules() if "activation_post_process" in name]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    zeros = convert_pt2e(never_run)
with torch.no_grad():
    logits = zeros(*prompt)
text = generate(zeros, "The import statement", 20)
uniform = perplexity(zeros, windows=1)
print(f"{len(caught)} 個警告；最大的 |logit| 是 {logits.abs().max().item()}")
print(f"困惑度 {uniform:.2f}（詞彙表：{len(VOCAB)} 個字元）；生成的文字 {text!r}")
assert torch.equal(logits, torch.zeros_like(logits)), "每個 logit 都是 0.0"
assert abs(uniform - len(VOCAB)) < 1e-3 and text == VOCAB[0] * 20, "均勻分布：什麼也沒預測"

# %%
# **原因**：動態量化在執行時量測的是「活化值」；「weight」的 scale 仍然來自 observer（每個
# linear 一個 ``PerChannelMinMaxObserver`` ），而 observer 只有在 prepare 後的模型執行時才看得到
# 它的 weight。從沒執行過的 observer 沒有最小值（ ``tensor([])`` ），於是回傳預設的 scale 1.0：
# 每個 weight 都被捨入成整數，而這個模型的 weight 全都小於 0.5，全部捨入成 0。輸出的 linear
# 也一樣，又沒有 bias，logit 就全是 0。同一個陷阱在單層模型上、連同印出的 scale，見
# :ref:`疑難排解：ExecuTorch 與 XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>`。

weights = [m for m in observers if type(m).__name__ == "PerChannelMinMaxObserver"]
int8_weights = [
    getattr(zeros, n.args[0].target)
    for n in zeros.graph.find_nodes(op="call_function", target=DQ_CHANNEL)
]
largest = max(m.weight.abs().max().item() for m in decoder.modules() if isinstance(m, nn.Linear))
print(
    f"{len(weights)} 個 weight 的 observer，min_val {weights[0].min_val}；最大的 |w| {largest:.3f}"
)
assert all(m.min_val.numel() == 0 for m in weights), "沒有任何 weight 的 observer 執行過"
assert len(caught) == len(weights), "每個 weight 一個警告"
assert largest < 0.5 and not any(w.count_nonzero() for w in int8_weights), "每個 weight 都是 0"

# %%
# **修正**：在 ``prepare_pt2e`` 與 ``convert_pt2e`` 之間，用任何一段提示詞校準一次：它讓每個
# weight 的 observer 都執行到（活化值的 scale 仍然在執行時量測）。困惑度於是回到浮點數模型的
# 1 % 以內（同樣的保留文字視窗）。這個解碼器的三種量化方式，包括校準，見
# :ref:`M08-2 · 三種量化方式
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`。

calibrated = dynamic_prepared()
with torch.no_grad():
    calibrated(*prompt)  # 呼叫一次：哪段提示詞都可以
int8_decoder = convert_pt2e(calibrated)
scores = {"float": perplexity(decoder, windows=5), "int8": perplexity(int8_decoder, windows=5)}
print({name: f"{score:.3f}" for name, score in scores.items()})
with torch.no_grad():
    assert int8_decoder(*prompt).abs().max() > 1, "又是真正的 logit 了"
assert scores["int8"] < scores["float"] * 1.01, "在浮點數困惑度的 1 % 以內"

# %%
# convert_pt2e 之後 KV 快取沒有更新（buffers_to_mutate 是空的）
# -------------------------------------------------------------
# 回報於 `pytorch/ao#4138 <https://github.com/pytorch/ao/issues/4138>`_ ：一個就地寫入 buffer
# 的模型（KV 快取）經過 ``prepare_pt2e`` 與 ``convert_pt2e`` 之後，重新匯出的程式的
# ``graph_signature.buffers_to_mutate`` 是空的：快取看起來不見了。在上一個條目 convert 好的
# 解碼器上檢查：匯出的圖簽名沒有列出任何被修改的 buffer，浮點數的程式（ ``export_decoder`` ）
# 和 int8 的程式都一樣。

reset_cache(int8_decoder)
with torch.no_grad():
    reexported = torch.export.export(
        int8_decoder, prompt, dynamic_shapes=({1: LENGTH}, {0: LENGTH})
    )
signatures = {
    "float": dict(export_decoder(decoder).graph_signature.buffers_to_mutate),
    "int8": dict(reexported.graph_signature.buffers_to_mutate),
}
print(f"buffers_to_mutate：{signatures}")
assert signatures == {"float": {}, "int8": {}}, "兩個圖簽名裡都是空的"

# %%
# **原因**：在 torch 2.13／torchao 0.18 上什麼也沒有遺失。 ``torch.export`` 回傳的是
# 「training IR」，它保留就地運算的原樣：圖仍然對每份快取呼叫 ``aten.index_copy_`` ，而只有
# functional 的圖才會列出它寫入哪些 buffer。convert 後模型的 ``index_copy_`` 寫入的是快取
# buffer 本身，不是它 dequantize 後的副本；呼叫一次 convert 後的模型，快取就被填入。

writes = reexported.graph.find_nodes(op="call_function", target=torch.ops.aten.index_copy_.default)
targets = reexported.graph_signature.inputs_to_buffers
assert all(n.args[0].name in targets for n in writes), "每個都寫入 buffer，不是副本"
written = sorted(targets[n.args[0].name] for n in writes)
print(f"{len(writes)} 個 index_copy_ node 寫入 {written[:2]} ……")
reset_cache(int8_decoder)
with torch.no_grad():
    int8_decoder(*prompt)
caches = {n: b for n, b in int8_decoder.named_buffers() if n.endswith(("k_cache", "v_cache"))}
assert len(caches) == 8 and sorted(caches) == written, "8 份快取都是就地寫入"
assert all(
    b[:, :, :10].count_nonzero() and not b[:, :, 10:].count_nonzero() for b in caches.values()
)

# %%
# **修正**：看 functional 的圖： ``run_decompositions()`` （ ``to_edge`` 也會執行它）把每個
# ``index_copy_`` 換成 ``index_put`` ，再由圖簽名把結果寫回它的 buffer， ``buffers_to_mutate``
# 就列出全部 8 份快取。上游的兩個修正都已在 torchao 0.18 裡：constant folding 不再折疊
# ``copy_`` 或 ``put_`` 運算的輸入
# （ `pytorch/ao#4181 <https://github.com/pytorch/ao/pull/4181>`_ ），
# ``prepare_pt2e`` 也不再在這種運算寫入的 buffer 上插入 observer
# （ `pytorch/ao#4466 <https://github.com/pytorch/ao/pull/4466>`_ ）。在較舊的 torchao 上，若
# quantizer 標註了快取的寫入（回報中是 ExecuTorch 的 ``TOSAQuantizer`` ），buffer 會被折疊成
# 常數（ ``_frozen_param0`` ），或是這個運算寫入 dequantize 出來的暫存張量而不是 buffer，重新
# 匯出的程式也就沒有 buffer 修改：快取真的一直是空的。
# 請升級到 torchao 0.18。快取如何通過匯出，見 :ref:`M08-1 · 解碼器與它的 KV 快取
# <sphx_glr_lessons_m08_language_model_m08_1_a_decoder_and_its_cache.py>`。

functional = reexported.run_decompositions().graph_signature.buffers_to_mutate
first = next(iter(functional.items()))
print(f"run_decompositions() 之後：{len(functional)} 個要修改的 buffer，第一個是 {first}")
assert sorted(functional.values()) == sorted(caches), "8 份快取都會寫回"

# %%
# AssertionError: Expecting input size at 1 dimension: 344 to be divisible by block_size
# --------------------------------------------------------------------------------------
# 用 torchao 的 ``quantize_`` 搭配 ExecuTorch 的 8da4w 配方
# （ ``Int8DynamicActivationIntxWeightConfig`` ：int8 活化值，int4 weight 沿著每一列每 32 個一組）
# 量化一個 SwiGLU 寬 344 而不是 M08 的 352 的解碼器： ``feed_forward.w2`` 讀 344 個特徵，
# 32 個一組分不完（344 = 10 × 32 + 24）。未訓練的解碼器就夠了：出錯的是形狀，不是數值。

from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
from torchao.quantization.granularity import PerAxis, PerGroup

from common.language_model import Decoder

INT4_GROUPS = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int4, weight_granularity=PerGroup(32)
)


def float_linears(model: nn.Module) -> list[str]:
    """``quantize_`` 留下一般浮點數 ``Parameter`` 當 weight 的那些 linear。"""
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and type(m.weight) is nn.Parameter
    ]


with expect_error(AssertionError, match="344 to be divisible by block_size"):
    quantize_(Decoder(hidden=344), INT4_GROUPS)

# %%
# **原因**：一組取同一個輸出列上連續 ``group_size`` 個輸入特徵，共用一個 scale，所以每個
# linear 的 ``in_features`` 都必須是它的倍數。能整除這裡每個寬度的組大小，也就是它們全部的
# ``math.gcd`` ，是 8；但 XNNPACK 只委派 32 的倍數的 int4 組（ ``node_visitor.py`` ：
# 「Delegation to XNNPACK requires group_size to be a multiple of 32」），而 int4 per-channel
# 就是一組 344 個，它一樣拒絕；下面這一個 linear 就示範了。

import math

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

widths = {m.in_features for m in Decoder(hidden=344).modules() if isinstance(m, nn.Linear)}
print(f"in_features：{sorted(widths)}；gcd {math.gcd(*widths)}")
one = nn.Sequential(nn.Linear(344, 128, bias=False)).eval()
quantize_(
    one,
    Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerAxis(0)),
)
with expect_error(AssertionError, match="requires group_size to be a multiple of 32"):
    program = torch.export.export(one, (torch.randn(1, 344),))
    to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
assert math.gcd(*widths) == 8, "沒有一個組大小既能整除 344 又是 32 的倍數"

# %%
# **修正**：寬度允許的地方用每 32 個一組的 int4，其他的 linear 用 int8 weight、每個輸出通道
# 一個 scale（ ``PerAxis(0)`` ，8da8w）；XNNPACK 兩種都能執行（ ``QB4W`` 與 ``QC8W`` 的
# GEMM）。或者讓模型的寬度都是 32 的倍數，像 M08 的 352。兩種配方的並排比較見
# :ref:`M08-2 · 三種量化方式
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`。

INT8_PER_CHANNEL = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int8, weight_granularity=PerAxis(0)
)
mixed = Decoder(hidden=344).eval()
quantize_(mixed, INT4_GROUPS, filter_fn=lambda m, fqn: getattr(m, "in_features", 1) % 32 == 0)
still_float = float_linears(mixed)
quantize_(mixed, INT8_PER_CHANNEL, filter_fn=lambda m, fqn: fqn in still_float)
print(f"留在浮點數的 linear：{float_linears(mixed)}")
assert not float_linears(mixed), "每個 linear 都量化了"

# %%
# 8da4w 模型比預期大：有些 linear 留在浮點數
# ------------------------------------------
# ExecuTorch 的 LLM 配方（ ``examples/models/llama/source_transformation/quantize.py`` ，
# qmode ``"8da4w"`` ）在同一個解碼器上什麼錯誤也不報：它的 ``filter_fn`` 只在
# ``m.weight.shape[1] % group_size == 0`` 時量化一個 linear，其他的一聲不響地跳過
# （ `pytorch/executorch#22044 <https://github.com/pytorch/executorch/issues/22044>`_ ）。
# 每個 block 的 ``w2`` 都留在浮點數，一個 weight 4 個位元組，而不是半個位元組。（較新的
# ``executorch/extension/llm/export/quantize.py`` 則會引發錯誤，除非設了
# ``skip_incompatible_shapes=True`` ，這時它印出「Skipping ...」。）

from common.kernels import native_stderr_silenced

with native_stderr_silenced():  # 一起匯入的 pytorch_tokenizers 會在 stderr 印出一行 C++ 日誌
    from executorch.examples.models.llama.source_transformation.quantize import quantize

recipe = quantize(Decoder(hidden=344).eval(), "8da4w", group_size=32)
left = float_linears(recipe)
linears = [m for m in recipe.modules() if isinstance(m, nn.Linear)]
float_count = sum(m.weight.numel() for name, m in recipe.named_modules() if name in left)
int4_count = sum(m.weight.numel() for m in linears) - float_count
print(f"留在浮點數：{left}")
print(
    f"{float_count:,} 個浮點數 weight：{float_count * 4 / 1e3:.0f} kB；"
    f"{int4_count:,} 個 int4 weight：{int4_count / 2 / 1e3:.0f} kB"
)
assert left == [f"layers.{i}.feed_forward.w2" for i in range(4)], "每個 block 的 w2，不聲不響"
assert float_count * 4 > int4_count / 2, "留在浮點數的四分之一比所有 int4 weight 加起來還大"

# %%
# **修正**：跑完配方之後，列出它留在浮點數的 linear（上面的 ``float_linears`` ），用 int8
# per-channel 的 weight 量化它們，和上一個條目一樣；再確認一個也沒剩。ExecuTorch 的配方量化
# 哪些 linear、又必須跳過哪些，見 :ref:`M08-2 · 三種量化方式
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>` ； ``.pte`` 與它的大小，
# 見 :ref:`M08-3 · 放上手機：會生成文字的 .pte
# <sphx_glr_lessons_m08_language_model_m08_3_to_a_phone.py>`。

quantize_(recipe, INT8_PER_CHANNEL, filter_fn=lambda m, fqn: fqn in left)
print(f"留在浮點數的 linear：{float_linears(recipe)}")
assert not float_linears(recipe), "沒有任何 nn.Linear 留在浮點數"

# %%
# 下一頁
# ------
# :ref:`疑難排解：lowering 與速度
# <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`。
