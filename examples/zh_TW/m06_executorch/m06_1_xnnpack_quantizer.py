"""
M06-1 XNNPACK quantizer
=======================

PT2E 最早是為 ExecuTorch 打造的，大多數 PT2E 範例用的 quantizer 也是 ExecuTorch 的
``XNNPACKQuantizer`` ，而不是本課程到目前為止用的 x86 quantizer。兩者在同一張匯出的圖上寫
annotation，但對應的是不同後端的 kernel：XNNPACK 在手機上以 int8 執行整個運算，所以除了輸入也
量化輸出、活化值用有號的 int8，並讓 pool 與 reshape 沿用同一組 scale；x86 Inductor 在 CPU
上做融合，留在浮點數的部分比較多。本課用兩者標註同一個模型，從圖上讀出差異，再確認課程自己的
``handmade.prepare/convert`` 在 ``XNNPACKQuantizer`` 之下得到的結果與 torchao 逐位元相同。

**你會學到**

- 兩個 quantizer 各自標註哪些 node，用的是哪種 dtype、範圍與量化方式
- XNNPACK 在哪裡讓運算的輸入與輸出共用一組 scale，以及它的動態設定量化了什麼
- prepare／convert 沒有任何後端專屬的部分：handmade 的 pass 得到相同的位元

**先備知識**：
:ref:`M02-1 · quantizer 在圖上寫了什麼
<sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`、
:ref:`M02-4 · 為新後端寫 quantizer
<sphx_glr_lessons_m02_by_hand_m02_4_writing_a_quantizer.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 一個小區塊，具備行動裝置 CNN 常見的結構：conv + relu、max pool、後面接 relu 的殘差
# ``add`` 、全域平均池化、flatten 與 linear 分類器。 ``XNNPACKQuantizer`` 與
# ``get_symmetric_quantization_config`` 來自 ``executorch`` 套件（ ``pip install executorch`` ），
# 不是 torchao。

import warnings

import torch
from torch import nn

from common.models import example_inputs
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()
# X86InductorQuantizer 跳過輸入留在浮點數的 max pool 時會發出警告（步驟 1）。
warnings.filterwarnings("ignore", message="The input of maxpool2d is not quantized")

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.stem(x)))
        x = torch.relu(self.conv(x) + x)
        return self.fc(torch.flatten(self.gap(x), 1))


torch.manual_seed(0)
model = Block().eval()
x = example_inputs(4)
qd = torch.ops.quantized_decomposed


def xnnpack_quantizer(**options):
    """weight 以 per-channel 量化的 XNNPACKQuantizer，和 ExecuTorch 的範例用法一樣。"""
    config = get_symmetric_quantization_config(is_per_channel=True, **options)
    return XNNPACKQuantizer().set_global(config)


# %%
# ``annotated`` 匯出這個區塊，讓 quantizer 標註它（先執行 ``transform_for_annotation`` ，
# 和 ``prepare_pt2e`` 的做法一樣），再回傳這張圖； ``describe_spec`` 把一個規格寫成
# ``int8[-128,127] affine`` 這樣的形式。


def annotated(quantizer):
    gm = quantizer.transform_for_annotation(export_module(model, x))
    quantizer.annotate(gm)
    return gm


def describe_spec(spec) -> str:
    if spec is None:
        return "float"
    if not hasattr(spec, "dtype"):  # SharedQuantizationSpec：本身沒有數值
        return "shared"
    scheme = {"per_tensor_affine": "affine", "per_tensor_symmetric": "symmetric"}.get(
        str(spec.qscheme).removeprefix("torch."), "symmetric/channel"
    )
    return f"{str(spec.dtype).removeprefix('torch.')}[{spec.quant_min},{spec.quant_max}] {scheme}"


def annotations(gm) -> dict:
    """有 annotation 的運算：名稱 -> （依輸入名稱排列的輸入規格；輸出規格）。"""
    found = {}
    for node in gm.graph.nodes:
        note = node.meta.get("quantization_annotation")
        if node.op == "call_function" and note is not None:
            inputs = {source.name: spec for source, spec in note.input_qspec_map.items()}
            found[node.name] = (inputs, note.output_qspec)
    return found


# %%
# 步驟 1 — 標註同一張圖兩次
# -------------------------
# 圖中每個運算一列：每個 quantizer 在它的輸入（先是活化值輸入，再來是 weight）與輸出上寫了
# 什麼。

x86 = annotations(annotated(x86_quantizer()))
xnn = annotations(annotated(xnnpack_quantizer()))
ops = [n.name for n in export_module(model, x).graph.nodes if n.name in x86.keys() | xnn.keys()]


def row(notes, name) -> str:
    if name not in notes:
        return "（沒有 annotation）"
    inputs, output = notes[name]
    ins = " + ".join(describe_spec(spec) for spec in inputs.values() if spec is not None)
    ins = ins or "float"  # 只有輸出有 annotation 的運算，例如接在 conv 後面的 relu
    return f"輸入 {ins} -> 輸出 {describe_spec(output)}"


for name in ops:
    print(f"{name:20} x86      {row(x86, name)}\n{'':20} XNNPACK  {row(xnn, name)}")

# %%
# 有三個明顯的差異。XNNPACK 會標註 **輸出** ：conv + relu 這一對的結果是 int8 張量，因為
# XNNPACK 從頭到尾以整數執行融合後的運算；x86 quantizer 只量化下一個 int8 kernel 要讀的
# 東西。XNNPACK 的 **活化值是有號的** ，int8，範圍 [-128, 127]；x86 用的是 uint8，範圍
# [0, 255]（它的 oneDNN kernel 做 uint8 乘 int8）；兩者都是仿射量化，有 zero point。
# 還有 XNNPACK 的 **weight** 用 [-127, 127]：0 的兩側範圍相同，-128 永遠不會出現，把 weight
# 取負號也不會超出 int8。

_, relu_out = xnn["relu"]
assert describe_spec(relu_out) == "int8[-128,127] affine", "XNNPACK：輸出是 int8"
assert x86["conv2d"][1] is None and "relu" not in x86, "x86：conv + relu 的輸出是浮點數"
stem_input, stem_weight = list(x86["conv2d"][0].values())[:2]
assert describe_spec(stem_input) == "uint8[0,255] affine", "x86：活化值是 uint8"
assert describe_spec(stem_weight) == "int8[-128,127] symmetric/channel", "x86 的 weight"
assert describe_spec(list(xnn["conv2d"][0].values())[1]) == "int8[-127,127] symmetric/channel"

# %%
# 步驟 2 — 共用規格：一組 scale 穿過 pool 與 reshape
# --------------------------------------------------
# max pool、平均 pool 或 flatten 不會改變輸入的範圍。XNNPACK 給它們
# ``SharedQuantizationSpec`` ：輸入與輸出共用前一個 node 的 observer，中間就不必重新量化
# （ ``xnnpack_quantizer_utils.py`` 的 ``propagate_annotation`` 對清單上的這類運算逐一這麼做）。

shared = [name for name, (_, output) in xnn.items() if describe_spec(output) == "shared"]
print(f"XNNPACK 沿用輸入 scale 的 node：{shared}")
assert shared == ["max_pool2d", "adaptive_avg_pool2d", "flatten"], "pool 與 flatten"

# %%
# 步驟 3 — 兩者都 convert，比較兩張圖
# -----------------------------------
# 用相同的批次校準之後，convert 把每一條有 annotation 的邊變成 q/dq。XNNPACK 的圖幾乎在
# 每個運算之後都有一對 q/dq，連輸出也是 int8；x86 的圖只量化 conv、add 與 linear 的輸入。


def converted(quantizer):
    prepared = prepare_pt2e(export_module(model, x), quantizer)
    calibrate(prepared)
    return convert_pt2e(prepared)


def quantize_nodes(gm) -> list:
    return [
        n.name
        for n in gm.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)
    ]


x86_model, xnn_model = converted(x86_quantizer()), converted(xnnpack_quantizer())
draw(x86_model, highlight=quantize_nodes(x86_model), title="X86InductorQuantizer，convert 之後")
draw(xnn_model, highlight=quantize_nodes(xnn_model), title="XNNPACKQuantizer，convert 之後")
counts = {"x86": len(quantize_nodes(x86_model)), "XNNPACK": len(quantize_nodes(xnn_model))}
print(f"quantize node 數：{counts}")
assert counts["XNNPACK"] > counts["x86"], "XNNPACK 量化的邊比較多"

# %%
# 在 XNNPACK 的圖裡，zero point 說明了 dtype 的選擇：relu 的輸出不會是負數，所以它的
# int8 範圍從 -128 開始，zero point 是 -128；per-channel weight 的 zero point 全都是 0（對稱量化）。

relu = xnn_model.graph.find_nodes(op="call_function", target=torch.ops.aten.relu.default)[0]
relu_q = next(iter(relu.users))
print("relu 的輸出：scale", relu_q.args[1], "zero point", relu_q.args[2])
assert relu_q.args[2] == -128, "全為非負的張量用上整個 int8 範圍"
zero_points = [b for name, b in xnn_model.named_buffers() if name.startswith("_zero_point")]
assert all(torch.count_nonzero(z) == 0 for z in zero_points), "對稱的 weight：zero point 為 0"

# %%
# 步驟 4 — 動態設定
# -----------------
# ``is_dynamic=True`` 在執行時量化活化值：由 ``choose_qparams`` node 量測每一批輸入，
# 所以活化值不需要校準。XNNPACK 把它用在 linear，以及沒有和 relu 融合的 conv 上
# （conv + relu 這個模式沒有動態版本）；其餘的都留在浮點數。

dynamic = converted(xnnpack_quantizer(is_dynamic=True))
quantized_ops = sorted(
    user.name
    for n in dynamic.graph.find_nodes(op="call_function", target=qd.dequantize_per_tensor.tensor)
    for user in n.users
)
print(f"輸入被動態量化的運算：{quantized_ops}")
assert quantized_ops == ["conv2d_1", "linear"], "linear 與沒有 relu 的 conv"
assert not dynamic.graph.find_nodes(op="call_function", target=qd.quantize_per_tensor.default)

# %%
# weight 卻仍然需要 prepare 後的模型執行過。每個 weight 都留著一個 observer，它只有在模型
# 執行時才看得到 weight（ ``converted`` 用四批資料執行它）。一次都沒執行就 convert，每個
# weight 的 scale 都是 observer 的預設值 1.0（ ``convert_pt2e`` 會警告「must run observer
# before calling calculate_qparams」），輸出離浮點模型很遠。M05-2 的步驟 3 量測了這在準確度上
# 的代價。

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="must run observer before calling calculate_qparams")
    never_run = convert_pt2e(
        prepare_pt2e(export_module(model, x), xnnpack_quantizer(is_dynamic=True))
    )
weight_scales = [
    getattr(never_run, n.args[1].target)
    for n in never_run.graph.find_nodes(
        op="call_function", target=qd.dequantize_per_channel.default
    )
]
errors = {
    name: (gm(*x) - model(*x)).abs().max().item()
    for name, gm in [("never run", never_run), ("calibrated", dynamic)]
}
print(f"從未執行時的 weight scale：{[s.tolist() for s in weight_scales]}")
print(f"最大輸出誤差：從未執行 {errors['never run']:.4f}，校準後 {errors['calibrated']:.4f}")
assert all(torch.equal(s, torch.ones(1)) for s in weight_scales), "每個 weight 的 scale 都是 1.0"
assert errors["never run"] > 50 * errors["calibrated"], "誤差超過五十倍"

# %%
# 相較之下，x86 的動態設定量化得更多：兩個 conv、add 與 linear 的輸入都量化。不過它的
# lowering 只處理 linear（M05-2）。

x86_config = get_default_x86_inductor_quantization_config(is_dynamic=True)
x86_dynamic = converted(X86InductorQuantizer().set_global(x86_config))
x86_ops = sorted(
    user.name
    for n in x86_dynamic.graph.find_nodes(
        op="call_function", target=qd.dequantize_per_tensor.tensor
    )
    for user in n.users
)
print(f"x86 輸入被動態量化的運算：{x86_ops}")
assert x86_ops == ["add", "conv2d", "conv2d_1", "linear"], "兩個 conv、add 與 linear"

# %%
# 步驟 5 — handmade，逐位元相同
# -----------------------------
# 課程的 ``handmade.prepare`` 與 ``handmade.convert`` （M02）對 XNNPACK 一無所知：它們只讀
# annotation。給它們 ``XNNPACKQuantizer`` ，產生的程式碼與輸出和 torchao 完全相同
# （ ``tests/test_handmade.py`` 在課程的每個模型上，以 strict 與 non-strict 匯出都檢查過）。

ours = handmade.prepare(export_module(model, x), xnnpack_quantizer())
calibrate(ours)
ours = handmade.convert(ours)
assert ours.code == xnn_model.code, "convert 之後的圖相同"
assert torch.equal(ours(*x), xnn_model(*x)), "輸出逐位元相同"
print(f"XNNPACKQuantizer 之下 handmade 與 torchao 相同：{torch.equal(ours(*x), xnn_model(*x))}")

# %%
# 小結
# ----
#
# ===================  ====================  =========================
# \                    X86InductorQuantizer  XNNPACKQuantizer
# ===================  ====================  =========================
# 活化值               uint8 [0, 255] 仿射   int8 [-128, 127] 仿射
# weight               int8 [-128, 127]      int8 [-127, 127]
# weight 的 scale      per-channel           指定時 per-channel
# conv／linear 的輸出  浮點數                int8
# pool、flatten        這裡是浮點數          沿用輸入的 scale
# 動態                 conv、linear、add     linear、沒有 relu 的 conv
#                      （lowering：linear）
# ===================  ====================  =========================
#
# - quantizer 描述的是自家後端的 kernel；annotation 不同，pass 都一樣。
# - 同一套 ``handmade`` pass 在兩者之下都重現了 torchao 的結果。
#
# 練習
# ----
# 1. 呼叫 ``get_symmetric_quantization_config()`` 時不加 ``is_per_channel=True`` 。預測
#    weight 的量化方式，以及 convert 之後的圖裡是否還有 ``dequantize_per_channel`` 。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          per_tensor = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
#          weight = list(annotations(annotated(per_tensor))["conv2d"][0].values())[1]
#          assert describe_spec(weight) == "int8[-127,127] symmetric"
#          gm = converted(per_tensor)
#          assert not gm.graph.find_nodes(
#              op="call_function", target=qd.dequantize_per_channel.default
#          ), "每個 weight 張量一組 scale"
#
# 2. 模型保留靜態設定，只用 ``set_operator_type(torch.ops.aten.linear.default, ...)``
#    把 linear 設成動態。會有幾個 ``choose_qparams`` node？conv + relu 還是靜態的嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from collections import Counter
#
#          mixed = xnnpack_quantizer().set_operator_type(
#              torch.ops.aten.linear.default,
#              get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True),
#          )
#          gm = converted(mixed)
#          kinds = Counter(str(n.target) for n in gm.graph.nodes)
#          assert kinds["quantized_decomposed.choose_qparams.tensor"] == 1, "linear 的那一個"
#          assert kinds["quantized_decomposed.quantize_per_tensor.default"] > 0, "其餘仍是靜態"
#
# 延伸閱讀
# --------
# - `ExecuTorch：量化總覽
#   <https://docs.pytorch.org/executorch/stable/quantization-overview.html>`_
# - `XNNPACK quantizer 原始碼
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/quantizer>`_
#
# 下一課
# ------
# :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`：convert 之後的圖變成
# XNNPACK delegate。
