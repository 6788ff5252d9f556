"""
疑難排解：prepare 與 convert
============================

``prepare_pt2e`` 與 ``convert_pt2e`` 的錯誤與不報錯的失敗：重複使用的活化函式模組、兩個模組
共用的 weight、依名稱留在浮點數的模組、彼此不相容的 observer 與 spec、加了
``@torch.no_grad()`` 的 ``forward``、沒有校準就 convert 的模型，以及
``constant_fold`` 處理不了的改圖結果。每個條目的標題是錯誤訊息的第一行原文（或讀者口中的
症狀），在本站的環境（torch 2.13、torchao 0.18）上重現它，指出原因，以 assert 驗證修正方法，
並連到解釋它的那一課。

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
# 那一列。


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
# 下一頁
# ------
# :ref:`疑難排解：lowering 與速度
# <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`。
