"""
M03-1 lowering 之後的圖
=======================

``convert_pt2e`` 之後的圖只是在「模擬」int8：每個 conv 和 linear 仍然夾在 dequantize 與
quantize 之間用浮點數計算。**lowering（下放）** 把每一組這樣的 node 換成一個真正的 int8 運算，
來自 oneDNN——PyTorch 在 x86 上所用的 CPU 函式庫。本課在 ``small_cnn`` 上執行 torchao 的
``lower_pt2e_quantized_to_x86`` ，逐一讀懂 lowering 之後的 node，遇到 torchao 0.18 留在圖裡的
一個錯誤並修好它，最後量測真正的 int8 結果和模擬的差多少，以及為什麼。

**你會學到**

- 哪些 dequantize → conv／linear → quantize 的 node 組變成了哪個 ``torch.ops.onednn`` 運算
- 預先打包的 int8 weight 存在哪裡，哪些 quantize／dequantize 留了下來
- 為什麼在沒有 VNNI 的 CPU 上，int8 結果和模擬的不同，以及如何在同一顆 CPU 上看到兩條
  kernel 路徑

**先備知識**：
:ref:`M02-3 · 親手做 convert <sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 用 ``X86InductorQuantizer`` 量化 ``small_cnn`` ：x86 lowering 就是為這個 quantizer 寫的
# （uint8 活化值、int8 per-channel weight）。

import torch

from common.cpu import describe, run_under_isa, weaker_paths
from common.expect import expect_error
from common.models import example_inputs, get_model
from common.numerics import sqnr
from common.pt2e import calibrate, export_module, quiet, x86_quantizer
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common.lowering import reshape_views

x = example_inputs(8)


def quantize(quantizer):
    prepared = prepare_pt2e(export_module(get_model("small_cnn"), x), quantizer)
    calibrate(prepared)
    return convert_pt2e(prepared)


simulated = quantize(x86_quantizer())
qdq = [n.name for n in simulated.graph.nodes if "quantize_per_tensor" in str(n.target)]
draw(simulated, highlight=qdq, title="之前：q/dq 圖（用浮點數模擬 int8）")

# %%
# 兩個輔助函式： ``ops`` 依簡短名稱計算圖裡每種運算的數量； ``Recorder`` 用
# ``torch.fx.Interpreter`` 一個 node 一個 node 地執行圖，並保留每個 node 的輸出，
# 讓我們能看進一張會失敗的圖裡面。

from common.pt2e import op_counts as ops


class Recorder(torch.fx.Interpreter):
    """執行一張圖，把每個 node 的輸出存在 ``self.values`` （即使後面的 node 失敗也保留）。"""

    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, node):
        self.values[node.name] = super().run_node(node)
        return self.values[node.name]


# %%
# 步驟 1 — 用 torchao 做 lowering
# -------------------------------
# ``lower_pt2e_quantized_to_x86(model, example_inputs)`` 回傳一張新的圖。conv 和 linear
# 不見了，取而代之的是 ``onednn.qconv_pointwise`` 與 ``onednn.qlinear_pointwise`` 。

lowered = lower_pt2e_quantized_to_x86(simulated, x)
onednn_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
draw(lowered, highlight=onednn_ops, title="之後：下放到 oneDNN 的 int8 運算")
before, after = ops(simulated), ops(lowered)
print(f"之前：{dict(before)}")
print(f"之後：{dict(after)}")
assert (
    after["onednn.qconv_pointwise.default"] == 1 and after["onednn.qlinear_pointwise.default"] == 1
)
assert not after["aten.conv2d.default"] and not after["aten.linear.default"], (
    "沒有浮點數的 conv／linear"
)

# %%
# 步驟 2 — 哪一組變成了哪個運算
# ------------------------------
# 在 q/dq 圖裡，conv 這一組是 ``dequantize → conv2d → relu → quantize`` 。這四個 node
# 變成了一個 ``qconv_pointwise`` ：它直接讀 uint8 張量（不經過 dequantize），把 ``relu``
# 當成融合進來的「後置運算」（post-op），再用被它取代的那個 quantize 的 scale，把結果重新
# 量化成 uint8。linear 這一組後面沒有 quantize，所以 ``qlinear_pointwise`` 輸出 float32。

conv, linear = (n for n in lowered.graph.nodes if n.name in onednn_ops)
old_q = next(n for n in simulated.graph.nodes if n.name == "quantize_per_tensor_default_1")
print(f"conv：  輸入 {conv.args[0].name}，輸出 {conv.args[13]} × {conv.args[11]:.6f}", end="")
print(f"，後置運算 {conv.args[14]!r}")
print(f"linear：輸入 {linear.args[0].name}，輸出 {linear.args[9]}，後置運算 {linear.args[10]!r}")
print(f"被取代的、relu 之後的 quantize：scale {old_q.args[1]:.6f}")
assert conv.args[0].target == torch.ops.quantized_decomposed.quantize_per_tensor.default
assert (conv.args[13], conv.args[14], conv.args[11]) == (torch.uint8, "relu", old_q.args[1])
assert (linear.args[9], linear.args[10]) == (torch.float32, "none")

# %%
# 步驟 3 — int8 weight 存在哪裡
# -----------------------------
# weight 引數（ ``args[3]`` ）是一個 ``get_attr`` ，讀的是 lowering 時由
# ``onednn.qconv_prepack`` ／ ``qlinear_prepack`` 做好一次的常數：和 q/dq 圖的
# ``_frozen_param`` weight 是同樣的 int8 數字，但經過 **預先打包（prepack）**——重新排列成
# oneDNN 的分塊記憶體配置（ ``torch._mkldnn`` ），linear 的則轉置存放。 ``to_dense()``
# 可以把數字讀回來。

for node in (conv, linear):
    packed = getattr(lowered, node.args[3].target)
    print(f"{node.args[3].target}：{packed.layout}、{packed.dtype}、形狀 {tuple(packed.shape)}")
conv_w, linear_w = (getattr(lowered, n.args[3].target).to_dense() for n in (conv, linear))
assert getattr(lowered, conv.args[3].target).layout == torch._mkldnn
assert torch.equal(conv_w, simulated._frozen_param0), "conv 的 int8 weight，原封不動"
assert torch.equal(linear_w, simulated._frozen_param1.t()), "linear 的，轉置了"

# %%
# 步驟 4 — 留下來的 quantize／dequantize
# --------------------------------------
# 每個餵給 conv 或 linear 的 dequantize 都被吸收了。留下來的，都圍繞著在這次 lowering 裡
# 沒有 int8 運算的地方：輸入的 quantize（模型的輸入仍然是浮點數影像），以及
# ``max_pool2d`` 和 ``flatten`` 變成的 ``view`` 前後的那幾對。

remaining = [n for n in lowered.graph.nodes if "quantize_per_tensor" in str(n.target)]
for node in remaining:
    print(f"{node.name:26} 讀取 {node.args[0].name:26} ，讀它的是 {[u.name for u in node.users]}")
assert after["quantize_per_tensor.default"] == 3 and after["dequantize_per_tensor.default"] == 2
dq_users = {u.target for n in remaining if "dequantize" in n.name for u in n.users}
assert dq_users == {torch.ops.aten.max_pool2d_with_indices.default, torch.ops.aten.view.default}

# %%
# 步驟 5 — 執行它：一個錯誤，以及原因
# ------------------------------------
# lowering 之後的圖在 ``aten.view`` 失敗。 ``Recorder`` 讓我們看到原因：oneDNN 的 conv
# 輸出是 **通道在後（channels-last）** 的（記憶體裡是 NHWC），max pool 保持這個配置，
# 而 ``view`` 無法在不複製的情況下，把 NHWC 張量的 C×H×W 重新組合。q/dq 圖的浮點數 conv
# 輸出的是連續的（NCHW）張量，torchao 重新匯出時就是用它追蹤 ``flatten`` 的——所以寫成了
# ``view`` 。

recorder = Recorder(lowered)
with expect_error(RuntimeError, match="view size is not compatible"):
    recorder.run(*x)
conv_out = recorder.values[conv.name]
recorded = Recorder(simulated)
recorded.run(*x)
print(f"conv 輸出 {tuple(conv_out.shape)}，stride：")
print(f"  lowering 之後（記憶體裡 NHWC）{conv_out.stride()}")
print(f"  q/dq 圖      （記憶體裡 NCHW）{recorded.values['conv2d'].stride()}")
assert conv_out.is_contiguous(memory_format=torch.channels_last) and not conv_out.is_contiguous()
assert recorded.values["conv2d"].is_contiguous(), "浮點數 conv 的輸出是 NCHW"

# %%
# 編譯也救不了這張圖： ``torch.compile(lowered)`` 用 stride 相同的 fake tensor 追蹤同一個
# ``view`` ，同樣被拒絕。能編譯的是開啟 freezing 的「q/dq」圖：這時由 inductor 自己做
# lowering 並決定配置（
# :ref:`M03-3 · 量測速度與大小 <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`）。

with expect_error(RuntimeError, match="Cannot view a tensor"):
    torch.compile(lowered)(*x)
torch._dynamo.reset()

# %%
# 修正方法：把每個 ``view`` 換成 ``reshape`` ，它回傳相同的數值，只在無法用 view 時才複製
# （ ``common.lowering.reshape_views`` ，五行程式碼）。現在可以執行了。

print(f"改了：{reshape_views(lowered)}")
y_int8, y_simulated = lowered(*x), simulated(*x)
print("輸出", tuple(y_int8.shape), y_int8.dtype)
assert y_int8.shape == y_simulated.shape

# %%
# 步驟 6 — 真正的 int8 對上模擬的 int8
# ------------------------------------
# 在沒看過的影像上，以量化格（step）為單位比較 conv 的 uint8 輸出。只要 oneDNN 在 int32 裡
# 精確地加總整數乘積，再重新量化（乘上輸入與 weight 的 scale、加上 bias、套用 relu、捨入），
# 兩者最多差 1 格：模擬用浮點數做同樣的事，剛好落在半格上的捨入可能偏向另一邊。加總是否
# 精確取決於 CPU，下面幾段會說明。輸出的 SQNR（ ``common.numerics.sqnr`` ，M04-1 會推導它）
# 則以分貝表示整體的差距。

fresh = example_inputs(8, seed=123)


def conv_steps(model, quantized_model):
    """兩個 conv 的 uint8 輸出最多差幾格，以及不相同的比例。"""
    real, sim = Recorder(model), Recorder(quantized_model)
    real.run(*fresh)
    sim.run(*fresh)
    a = real.values[conv.name].int()
    b = sim.values["quantize_per_tensor_default_1"].int()
    return (a - b).abs().max().item(), (a != b).float().mean().item()


steps, share = conv_steps(lowered, simulated)
output_sqnr = sqnr(simulated(*fresh), lowered(*fresh)).item()
cpu = describe()
print(cpu.verdict)
print(f"int8 路徑 {cpu.onednn}：conv 輸出最多差 {steps} 格，")
print(f"發生在 {share:.1%} 的數值上；輸出的 SQNR 為 {output_sqnr:.1f} dB")

# %%
# 兩者差多少，取決於 CPU 的 int8 指令。 **有 VNNI** （或 AMX）時，oneDNN 把四個 uint8 × int8
# 乘積直接加進 int32：加總是精確的，只有剛好落在半格上的捨入可能不同——最多差 1 格。
# **沒有 VNNI** 時（AVX2，以及沒有 VNNI 的 AVX-512，例如 Skylake-SP），它用 ``vpmaddubsw`` ，
# 把「兩個」乘積相加成 **16 位元** 整數，只要一對乘積超過 32767 就會飽和（255 × 127 × 2 =
# 64770 就會）：這時整個輸出會錯上幾十格。兩種 AVX-512 的 ``get_cpu_capability()`` 都說
# ``"AVX512"`` ；上面那一行讀的是 ``torch.cpu.get_capabilities()`` ，寫出 oneDNN 實際走的
# 路徑。建置這一頁的 CPU 屬於這一種：

print(
    f"{cpu.onednn}，有 VNNI：int32 精確加總，只差在捨入"
    if cpu.vnni
    else f"{cpu.onednn}，沒有 VNNI：16 位元的成對加總，會飽和"
)

# %%
# 對策和這道指令一樣老： ``reduce_range=True`` （縮小範圍）把活化值量化成 0…127（7 位元），
# 任何一對都不會溢位。這樣一來，兩者在任何 CPU 上都最多差 1 格，輸出也只差在捨入。

reduced = quantize(
    X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(reduce_range=True)
    )
)
reduced_lowered = lower_pt2e_quantized_to_x86(reduced, x)
reshape_views(reduced_lowered)
steps_7bit, share_7bit = conv_steps(reduced_lowered, reduced)
sqnr_7bit = sqnr(reduced(*fresh), reduced_lowered(*fresh)).item()
print(
    f"reduce_range=True：最多差 {steps_7bit} 格，發生在 {share_7bit:.1%}；SQNR {sqnr_7bit:.1f} dB"
)
assert steps_7bit <= 1, "int32 精確累加：只有半格上的捨入可能不同"
assert sqnr_7bit > 40, "輸出只差在捨入"

# %%
# 步驟 7 — 兩條 kernel 路徑並排
# -----------------------------
# oneDNN 只在第一次使用時讀一次 ``ONEDNN_MAX_CPU_ISA`` （ ``AVX2`` 、 ``AVX512_CORE`` = 沒有
# VNNI 的 AVX-512……），ATen 讀 ``ATEN_CPU_CAPABILITY`` ：要看另一條 kernel 路徑，得開一個
# 新的直譯器。 ``run_under_isa(isa, source)`` 在新的直譯器裡、以 ``isa`` 為上限執行
# ``source`` ，回傳它設定的 ``result`` 。這段程式把步驟 1、5、6 對兩種做法各做一次。

STEP_6 = """
import torch
from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)
from common.lowering import reshape_views
from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module

x, fresh = example_inputs(8), example_inputs(8, seed=123)


def output_of(gm, name):
    run = torch.fx.Interpreter(gm, garbage_collect_values=False)  # 保留每個 node 的值
    run.run(*fresh)
    return next(value for node, value in run.env.items() if node.name == name).int()


result = {}
for reduce_range in (False, True):
    config = get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
    prepared = prepare_pt2e(
        export_module(get_model("small_cnn"), x), X86InductorQuantizer().set_global(config)
    )
    calibrate(prepared)
    simulated = convert_pt2e(prepared)
    lowered = lower_pt2e_quantized_to_x86(simulated, x)
    reshape_views(lowered)
    (conv,) = [n.name for n in lowered.graph.nodes if "qconv" in str(n.target)]
    a, b = output_of(lowered, conv), output_of(simulated, "quantize_per_tensor_default_1")
    steps = (a - b).abs().max().item()
    result["7-bit" if reduce_range else "8-bit"] = [steps, (a != b).float().mean().item()]
"""

# %%
# 每條 kernel 路徑一列：先是這個行程的，再來是這顆 CPU 能被限制到的每一條較弱路徑（上限
# 不會把路徑調高，所以沒有 VNNI 的 CPU 只有一列）。模擬改變的是指令，因此也改變算出的數字；
# 它給不了真正 AVX2 晶片的速度。（在環境變數裡設 ``ONEDNN_VERBOSE=1`` ，oneDNN 會印出它選的
# kernel，例如 ``jit_uni_int8:avx2`` 或 ``brg_conv_fwd:avx512_core_vnni`` 。）

rows = {cpu.onednn: (cpu.vnni, [steps, share], [steps_7bit, share_7bit])}
for isa in weaker_paths():
    other = run_under_isa(isa, STEP_6)
    result = other["result"]
    rows[other["cpu"]["onednn"]] = (other["cpu"]["vnni"], result["8-bit"], result["7-bit"])
print(f"{'int8 路徑':16} {'VNNI':5} {'8 位元：格數、比例':>18} {'reduce_range：格數、比例':>25}")
for path, (vnni, full, seven) in rows.items():
    print(
        f"{path:18} {'有' if vnni else '沒有':4} {full[0]:>10}, {full[1]:7.1%}"
        f" {seven[0]:>17}, {seven[1]:7.1%}"
    )

# %%
# 有 VNNI 時兩者最多差 1 格；沒有 VNNI 時 8 位元的做法會飽和，而 ``reduce_range=True``
# 讓每條路徑都回到最多差 1 格。

for path, (vnni, full, seven) in rows.items():
    if vnni:
        assert full[0] <= 1, f"{path}：有 VNNI，int32 精確加總：只差在捨入"
    else:
        assert full[0] > 1, f"{path}：沒有 VNNI，16 位元的成對加總會飽和"
    assert seven[0] <= 1, f"{path}：7 位元的活化值，任何一對都不會溢位"

# %%
# 小結
# ----
# ===========================================  =================================================
# q/dq 圖（ ``convert_pt2e`` ）                lowering 之後的圖
# ===========================================  =================================================
# ``dequantize → conv2d → relu → quantize``    ``onednn.qconv_pointwise`` ，後置運算 relu，uint8
# ``dequantize → linear``                      ``onednn.qlinear_pointwise`` ，輸出 float32
# int8 weight ``_frozen_param0/1``             預先打包的 ``torch._mkldnn`` 常數
# max pool 與 view 旁的 quantize／dequantize   不變（這裡沒有它們的 int8 運算）
# ===========================================  =================================================
#
# 如果 int8 conv 後面接著 ``flatten`` ，torchao 0.18 lowering 出來的圖在 eager 執行時會失敗：
# ``reshape_views`` 可以修正（ ``torch.compile`` 不行）。沒有 16 位元溢位時，int8 結果和
# 模擬最多差 1 格——有 VNNI 時一定如此；沒有時（AVX2、沒有 VNNI 的 AVX-512）則要
# ``reduce_range=True`` 。在有 VNNI 的 CPU 上， ``run_under_isa`` 把兩條路徑都顯示出來。
#
# 練習
# ----
# 1. 改成對 ``conv_bn_relu`` 做 lowering。預測運算數量：有幾個 onednn 運算、幾個 quantize
#    和 dequantize node，conv 的輸出 dtype 是什麼？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          other_q = prepare_pt2e(export_module(get_model("conv_bn_relu"), x), x86_quantizer())
#          calibrate(other_q)
#          other = lower_pt2e_quantized_to_x86(convert_pt2e(other_q), x)
#          print(ops(other))
#          assert ops(other) == {
#              "onednn.qconv_pointwise.default": 1,
#              "quantize_per_tensor.default": 1,
#          }, "bn 被折疊、relu 被融合，之後沒有要量化的東西"
#          (qconv,) = [n for n in other.graph.nodes if "onednn" in str(n.target)]
#          assert qconv.args[13] == torch.float32
#
# 2. 對 ``conv_relu`` 做 lowering：它的 conv 後面沒有 ``flatten``。預測：下放後的圖不用
#    ``reshape_views`` 就能執行嗎？呼叫端拿到的輸出是哪一種記憶體配置？呼叫端用 ``.view``
#    把它攤平時會發生什麼事？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          no_flatten_q = prepare_pt2e(export_module(get_model("conv_relu"), x), x86_quantizer())
#          calibrate(no_flatten_q)
#          no_flatten_sim = convert_pt2e(no_flatten_q)
#          no_flatten = lower_pt2e_quantized_to_x86(no_flatten_sim, x)
#          assert not ops(no_flatten)["aten.view.default"], "圖裡沒有 view：原封不動就能執行"
#          out, out_sim = no_flatten(*fresh), no_flatten_sim(*fresh)
#          print(f"stride：下放後 {out.stride()}，q/dq 圖 {out_sim.stride()}")
#          assert out.is_contiguous(memory_format=torch.channels_last), (
#              "int8 conv 通道在後的輸出直接交給了呼叫端"
#          )
#          assert not out.is_contiguous() and out_sim.is_contiguous(), "q/dq 模型的是 NCHW"
#          with expect_error(RuntimeError, match="view size is not compatible"):
#              out.view(len(out), -1)  # 同樣的失敗，這次發生在呼叫端的程式碼
#
# 延伸閱讀
# --------
# - `透過 Inductor 使用 x86 後端的 PT2E 量化（torchao）
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
# - `torch.fx 的 Interpreter 模式（PyTorch）
#   <https://docs.pytorch.org/docs/stable/fx.html#the-interpreter-pattern>`_
# - :ref:`疑難排解：lowering 與速度
#   <sphx_glr_lessons_troubleshooting_m99_3_lowering_and_speed.py>`：同樣的錯誤，依錯誤訊息查
# - :ref:`疑難排解：準確度、eval 與 QAT
#   <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`：同樣的錯誤，依錯誤訊息查
#
# 下一課
# ------
# :ref:`M03-2 · 親手做 lowering <sphx_glr_lessons_m03_lowering_m03_2_lowering_by_hand.py>`
# 用 M00-4 的改圖動作重建這張圖，逐位元相同。
