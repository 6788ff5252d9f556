"""
M05-4 PT2E 還是 quantize_()？
=============================

torchao 有兩種量化方式。 ``quantize_(model, config)`` 作用在 eager 模組上：它把每個 linear 的
weight 換成張量子類別，裡面帶著 int8 數值與它們的 scale，每次呼叫時由這個子類別決定執行哪個
kernel——這是 torchao 自己的指南優先介紹的 API，為 LLM 而設計。PT2E 是本課程的做法：在匯出的圖上
加入 quantize 與 dequantize node，再由後端（inductor、ExecuTorch）下放。本課在同一個 encoder 上
比較三種 int8 配方——``quantize_`` 的 int8 動態活化值加 int8 weight、 ``quantize_`` 的只量化
int8 weight，以及 PT2E 動態量化（ ``X86InductorQuantizer`` 搭配 ``is_dynamic=True`` ）——量測每個
模型變成什麼、它的誤差、編譯後執行的 kernel，以及速度。最後用一張表整理：什麼情況選哪一個。

**你會學到**

- ``quantize_`` 改變的是什麼（模組的 weight），PT2E 改變的是什麼（計算圖）
- 每種配方編譯後執行哪些 kernel，換來什麼
- 何時選 ``quantize_`` ，何時選 PT2E

**先備知識**： :ref:`M05-2 · 靜態與動態 int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`、 :ref:`M03-3 · 量測速度與大小
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 使用 M05-3 計時用的 encoder（四個 pre-norm block，d_model 256，MLP 1024，隨機 weight），輸入是
# 4 × 64 個 token 的批次。 ``with_quantize_`` 用 torchao 的 config 量化模組的副本；
# ``with_pt2e`` 匯出模組，用 x86 quantizer 的動態設定 prepare，執行一次（為了 weight 的
# observer，見 M05-2）再 convert。 ``ops`` 計算圖裡量化運算與矩陣乘法運算的數量。

import copy
import dataclasses
import warnings
from collections import Counter

import torch

from common.charts import pad
from common.kernels import kernels_run
from common.models import example_inputs, get_model, input_shape
from common.numerics import sqnr
from common.pt2e import export_module, quiet
from common.timing import as_compiled, race, timing_threads
from common.viz import draw

quiet()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告（M03-3）。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from torchao.quantization import (
    Int8DynamicActivationInt8WeightConfig,
    Int8StaticActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

encoder = get_model("encoder")
tokens = example_inputs(4, shape=input_shape("encoder"))
with torch.no_grad():
    reference = encoder(*tokens)
# 印出的文字怎麼稱呼這些配方（程式碼用鍵來指稱它們）。
LABELS = {
    "fp32": "fp32",
    "dynamic": "quantize_ int8 動態",
    "weight_only": "quantize_ int8 只量化 weight",
    "pt2e": "PT2E int8 動態",
}


def with_quantize_(module, config):
    quantized = copy.deepcopy(module)
    quantize_(quantized, config)
    return quantized


def with_pt2e(module, args):
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    prepared = prepare_pt2e(export_module(module, args), X86InductorQuantizer().set_global(config))
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


def ops(gm) -> dict:
    kinds = ("quantize", "choose_qparams", "_int_mm", "linear", "mm")
    names = (str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return dict(Counter(n for n in names if any(k in n for k in kinds)))


# %%
# 步驟 1 — 每種配方改變了什麼
# ----------------------------
# ``quantize_`` 讓模組保持原樣——同樣的類別、同樣的 submodule——只把每個 linear 的 weight 換成
# torchao 的 ``Int8Tensor`` ：int8 數值（ ``qdata`` ）加上每個輸出列一個 scale。PT2E 回傳的是
# 新的物件，一個匯出的 ``GraphModule`` ，它的 int8 weight 是常數，由 ``dequantize_per_channel``
# node 讀取。

CONFIGS = {
    "dynamic": Int8DynamicActivationInt8WeightConfig(),
    "weight_only": Int8WeightOnlyConfig(),
}
models = {key: with_quantize_(encoder, config) for key, config in CONFIGS.items()}
models["pt2e"] = with_pt2e(encoder, tokens)
weight = models["dynamic"].blocks[0].fc1.weight
print(f"quantize_：{type(models['dynamic']).__name__}，fc1.weight 是 {type(weight).__name__}")
print(
    f"  qdata {weight.qdata.dtype} {tuple(weight.qdata.shape)}, scale {tuple(weight.scale.shape)}"
)
print(f"PT2E：{type(models['pt2e']).__name__}，{ops(models['pt2e'])}")
assert type(models["dynamic"]) is type(encoder), "同樣的模組類別"
assert weight.qdata.dtype == torch.int8 and weight.scale.numel() == weight.shape[0]
assert isinstance(models["pt2e"], torch.fx.GraphModule), "一張新的圖"

# %%
# 步驟 2 — 實際執行的圖
# ---------------------
# 匯出 ``quantize_`` 的模型，子類別就展開成運算：每個 linear 的輸入先經過 torchao 自己的
# ``choose_qparams_affine`` 與 ``quantize_affine`` （一次一列），再進入 ``aten._int_mm``——真正的
# int8 × int8 → int32 矩陣乘法，已經在圖裡。PT2E 的圖仍然是模擬：每個浮點數 ``linear`` 夾在
# q/dq node 之間，要等 inductor 編譯時才變成 int8 kernel（M03）。下面兩張圖是各配方量化後的
# 第一個 block，並醒目標示其中的量化運算。

block = get_model("encoder").blocks[0]
block_tokens = (tokens[0][:2],)
block_quantize_ = torch.export.export(
    with_quantize_(block, Int8DynamicActivationInt8WeightConfig()), block_tokens
).module()
print(f"quantize_，匯出後：{ops(block_quantize_)}")
highlight = [n.name for n in block_quantize_.graph.nodes if "torchao" in str(n.target)]
draw(block_quantize_, highlight=highlight, title="quantize_：torchao 的運算與 aten._int_mm")
assert ops(block_quantize_)["aten._int_mm.default"] == 6, "q、k、v、out、fc1、fc2：每個 block 六個"

# %%

block_pt2e = with_pt2e(block, block_tokens)
print(f"PT2E：{ops(block_pt2e)}")
highlight = [n.name for n in block_pt2e.graph.nodes if "quantized_decomposed" in str(n.target)]
draw(block_pt2e, highlight=highlight, title="PT2E：浮點數 linear 前後的 q/dq")
assert "aten._int_mm.default" not in ops(block_pt2e), "編譯前沒有 int8 運算"

# %%
# 兩張圖用的是不同的運算，這決定了它們各自能走到哪裡。x86 的 lowering（M03）讀的是 PT2E 的
# ``quantized_decomposed`` q/dq 運算，不讀 ``quantize_`` 的 ``torchao`` 運算（那些由 torchao
# 自己的 inductor pass 處理，見步驟 5）。ExecuTorch 的 XNNPACK partitioner（M06）兩種都讀：
# PT2E 的 q/dq 運算，以及 torchao 的 ``choose_qparams_affine`` 、 ``quantize_affine`` 與
# ``dequantize_affine`` ；活化值也在執行時量化時，它才能正確下放這些運算，就像
# ``Int8DynamicActivationIntxWeightConfig`` 那樣。這種 ``quantize_`` 程式在
# :ref:`疑難排解：ExecuTorch 與 XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>` 裡實際在 ExecuTorch 的
# 執行環境上執行；只量化 weight 的 config 則不行，也在同一頁（沒有 partitioner 就沒有 kernel；
# 有 partitioner，weight 的 scale 又被丟掉）。

namespaces = {
    label: {n.target.namespace for n in gm.graph.nodes if hasattr(n.target, "namespace")}
    for label, gm in (("quantize_", block_quantize_), ("PT2E", block_pt2e))
}
print({label: sorted(found - {"aten"}) for label, found in namespaces.items()})
assert "quantized_decomposed" not in namespaces["quantize_"], "沒有 PT2E 的 q/dq 運算"
assert "torchao" not in namespaces["PT2E"], "沒有 torchao 的運算"

# %%
# 步驟 3 — 誤差
# -------------
# 每個模型的輸出對浮點數 encoder 的 SQNR（ ``common.numerics.sqnr`` ，M04-1）。只量化 weight 的
# 配方讓活化值保持浮點數，所以最接近。兩種 int8 動態配方量化的是同樣的張量，結果也很接近。

errors = {}
with torch.no_grad():
    for key, model in models.items():
        errors[key] = sqnr(reference, model(*tokens)).item()
        print(f"{pad(LABELS[key], 28)} {errors[key]:5.1f} dB")
assert errors["weight_only"] > max(errors["dynamic"], errors["pt2e"]), "只量化 weight：最接近"
assert abs(errors["dynamic"] - errors["pt2e"]) < 3, "int8 動態：誤差大致相同"

# %%
# 兩者的差別在於活化值的 scale 從多大的範圍量測： ``quantize_`` 每個 token（輸入的一列）一個，
# PT2E 每個張量一個（整個批次，M05-2）。把批次中其他三個序列乘以 10、第一個保持不變：在 PT2E
# 下，第一個序列的輸出改變了，因為 scale 隨著批次變大；在 ``quantize_`` 下完全不變。

loud = torch.cat([tokens[0][:1], 10 * tokens[0][1:]])
with torch.no_grad():
    moved = {
        key: not torch.equal(models[key](loud)[:1], models[key](*tokens)[:1])
        for key in ("dynamic", "pt2e")
    }
print({LABELS[key]: "改變" if changed else "不變" for key, changed in moved.items()})
assert moved == {"dynamic": False, "pt2e": True}, "每個 token 一個 scale，每個張量一個 scale"

# %%
# 步驟 4 — 更少的位元
# -------------------
# ``quantize_`` 可以低於 8 位元： ``IntxWeightOnlyConfig`` 以 4 位元儲存 weight（這裡用它的預設：
# 每個輸出列一個 scale），這類配方是 LLM 為了放進記憶體而用的；誤差變大，因為只剩 16 個量化值，
# 而不是 256 個。x86 quantizer 的設定是 int8 weight 與 uint8 活化值，沒有更小的。

int4 = with_quantize_(encoder, IntxWeightOnlyConfig(weight_dtype=torch.int4))
weight4 = int4.blocks[0].fc1.weight
with torch.no_grad():
    errors["int4"] = sqnr(reference, int4(*tokens)).item()
x86 = get_default_x86_inductor_quantization_config()
print(
    f"quantize_ int4 只量化 weight：{errors['int4']:.1f} dB，block_size {tuple(weight4.block_size)}"
)
print(f"x86 quantizer：weight {x86.weight.dtype}，活化值 {x86.input_activation.dtype}")
assert tuple(weight4.block_size) == (1, 256), "每列一個 scale"
assert 20 < errors["int4"] < errors["weight_only"], "4 位元：誤差比 8 位元大"
assert (x86.weight.dtype, x86.input_activation.dtype) == (torch.int8, torch.uint8)

# %%
# 步驟 5 — 編譯後執行的 kernel
# ----------------------------
# 每個模型都以 ``torch.compile`` 加 freezing 編譯，而且在計時所用的執行緒數下編譯（M03-3 的
# 規則）。 ``race`` （ ``common.timing`` ）編譯 fp32 與 PT2E 這兩張圖，並讀出各自執行的 kernel
# （ ``kernels_run`` ，來自 profiler）； ``quantize_`` 的模型在這裡用同樣的方式編譯，並在同樣的
# 輪次中計時（ ``also=`` ）： ``race`` 以模型的 weight 作為量測結果的鍵，而它讀不到 torchao
# 子類別裡的 weight，所以改用 ``also_key`` 寫出做出它們的 config（它的 ``repr`` 列出每個欄位）。
#
# PT2E 編譯後的圖，每個 linear 都執行 oneDNN 的 int8 linear。 ``quantize_`` 的 int8 動態模型
# 的每個 linear 也都在 int8 kernel 上執行，分成兩種：ATen 的 ``aten::_int_mm`` ，以及
# torchao 的 inductor pass 改寫過的地方所用的 oneDNN int8 linear（ ``kernels_run`` 把兩種
# 都算成 int8； ``matmuls`` 依名稱列出每個矩陣乘法）。只量化 weight 的模型經過 freezing
# 之後只執行浮點數 kernel：freezing 把常數
# weight 的 dequantize 折疊掉了，剩下的是一個 weight 經過捨入的浮點數模型，記憶體裡的 weight
# 又是 fp32：在 CPU 上經過 freezing 之後，只量化 weight 在執行時並不省記憶體。


def matmuls(model) -> dict:
    """一次呼叫執行的矩陣乘法 kernel，以 profiler 的名稱列出。"""
    with torch.no_grad():
        run = kernels_run(model, tokens)
    return dict(run.int8 + run.float)


torch._inductor.config.freezing = True  # 和 race 一樣，設定在整個行程上
with as_compiled(timing_threads()):
    compiled = {
        key: torch.compile(models[key], dynamic=False) for key in ("dynamic", "weight_only")
    }
    for model in compiled.values():
        model(*tokens)  # 第一次呼叫時編譯
timings = race(
    {LABELS["fp32"]: export_module(encoder, tokens), LABELS["pt2e"]: models["pt2e"]},
    tokens,
    also={LABELS[key]: model for key, model in compiled.items()},
    also_key=repr(CONFIGS),  # every field of the configs that made them
)
ran = {LABELS[key]: timings.kernels[LABELS[key]] for key in ("fp32", "pt2e")}
with as_compiled(timings.threads):  # 用編譯時的執行緒數與 grad 模式
    ran |= {LABELS[key]: kernels_run(model, tokens) for key, model in compiled.items()}
    products = matmuls(compiled["dynamic"])
for label, kernels in ran.items():
    print(f"{pad(label, 28)} {kernels.summary}")
print(f"{pad(LABELS['dynamic'], 28)} {products}")
assert ran[LABELS["pt2e"]].int8, "PT2E：oneDNN 的 int8 linear"
assert (
    set(products) <= {"aten::_int_mm", "onednn::qlinear_pointwise"} and sum(products.values()) == 24
), "quantize_ int8 動態：24 個 linear 都是 int8 kernel"
assert ran[LABELS["weight_only"]].float and not ran[LABELS["weight_only"]].int8, (
    "只量化 weight、freezing 之後：只有浮點數 kernel"
)

# %%
# 步驟 6 — 速度
# -------------
# 交錯輪次的中位數，旁邊印出離散程度、執行緒數與這顆 CPU 的 int8 路徑（M03-3）。這些數字
# 不做 assert：它們取決於機器。

print(timings.table())

# %%
# 靜態活化值
# ----------
# ``quantize_`` 也有靜態 int8 的 config： ``Int8StaticActivationInt8WeightConfig`` 。但活化值的
# scale 是你傳給它的引數（ ``act_quant_scale`` ，預設為 None），而 PT2E 是由 observer 在校準
# 資料上量出來（M01–M04）。它不附帶 observer：scale 要你自己量，所以本課沒有把它放進速度比較。

static = {f.name: f.default for f in dataclasses.fields(Int8StaticActivationInt8WeightConfig)}
print({name: static[name] for name in ("act_quant_scale", "act_quant_zero_point")})
assert static["act_quant_scale"] is None, "活化值的 scale：由呼叫者提供"

# %%
# 小結
# ----
# =================================  =================================  ==========================
# 你要的是                           ``quantize_``                      PT2E
# =================================  =================================  ==========================
# LLM 的 weight 用 8 或 4 位元       儲存時小，在 x86 上以浮點數執行    只有 8 位元（x86）
# int8 動態活化值                    每個 token 一個 scale              每個張量一個 scale
# 保留 eager 模組，不匯出            可以                               不行：得到新的圖
# x86 lowering 讀得懂的 q/dq         沒有：torchao 自己的運算           有（M03）
# 靜態 int8 活化值                   scale 由你提供，沒有 observer      observer（M01–M04）
# 給 ExecuTorch 的 ``.pte``          只有動態活化值的配方（m99_5）      可以（M06）
# =================================  =================================  ==========================
#
# - 只量化 weight 讓 weight 在儲存時變小，在 x86 CPU 上執行時則不然：搭配 freezing 編譯，它們會
#   折疊回 fp32 常數（步驟 5）；在 eager 模式下，每次呼叫都要先 dequantize（練習 1）。
# - 要給 ExecuTorch：用 ``quantize_`` 搭配 ``Int8DynamicActivationIntxWeightConfig`` （int8
#   動態活化值，4 或 8 位元的 weight）與 ``XnnpackPartitioner`` ，這是 ExecuTorch 自己的 LLM
#   配方，能整個下放並執行；只量化 weight 的 config 則不行（m99_5）。
#
# 簡單說：LLM 的低位元 weight、保留 eager 模組 → ``quantize_`` （要給 ExecuTorch，就用它的動態
# 活化值配方）；用 observer 校準的靜態 int8 計算圖、x86 lowering → PT2E。
#
# 練習
# ----
# 1. 「不」編譯，直接執行只量化 weight 的 ``quantize_`` 模型。預測：eager 模式下它會執行 int8 矩陣
#    乘法嗎？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          eager = matmuls(models["weight_only"])
#          assert "aten::mm" in eager and "aten::_int_mm" not in eager, "浮點數 mm：先 dequantize"
#
# 2. 在 PT2E 之前，以動態批次匯出 encoder（ ``dynamic_shapes`` ，和
#    ``common.data.export_digits_model`` 的做法一樣），再用 ``torch.compile`` 的預設值
#    ``dynamic=None`` 編譯它和 ``quantize_`` 的 int8 動態模型：換成第二種批次大小時，會以動態
#    批次重新編譯，也就是 m99_3 裡 int8 conv 失敗的情況。預測：先用批次 4、再用批次 1，兩者之中
#    哪一個的每個 linear 都在 int8 kernel 上執行？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          batch = torch.export.Dim("batch")
#          program = torch.export.export(encoder, tokens, dynamic_shapes=({0: batch},))
#          config = get_default_x86_inductor_quantization_config(is_dynamic=True)
#          prepared = prepare_pt2e(program.module(), X86InductorQuantizer().set_global(config))
#          with torch.no_grad():
#              prepared(*tokens)
#          both = {"pt2e": convert_pt2e(prepared), "quantize_": models["dynamic"]}
#          with torch.no_grad():
#              for key, model in both.items():
#                  default = torch.compile(model)  # dynamic=None
#                  for n in (4, 1):
#                      default(tokens[0][:n])  # 批次 1 會以動態批次重新編譯
#                      ran = kernels_run(default, (tokens[0][:n],))
#                      assert ran.int8 and not ran.float, f"{key}, 批次 {n}：每個 linear 都是 int8"
#          # 兩者都是，兩種批次大小都是：int8 linear 在動態批次下也能下放；
#          # m99_3 裡失敗的是 int8 conv 的記憶體排列檢查
#
# 延伸閱讀
# --------
# - `torchao 量化總覽
#   <https://docs.pytorch.org/ao/stable/quantization_overview.html>`_ （ ``quantize_`` 與它的
#   張量子類別）
# - `透過 Inductor 使用 x86 後端的 PT2E 量化（torchao）
#   <https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html>`_
#
# 下一課
# ------
# M06 用 ExecuTorch 把 PT2E 的圖帶到邊緣裝置。
