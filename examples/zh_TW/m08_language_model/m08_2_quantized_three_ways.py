"""
M08-2 三種量化方式
==================

本課用使用者會遇到的三種方式量化 M08-1 的解碼器：torchao 的 ``quantize_`` 搭配 ExecuTorch 的
LLM 配方（ **8da4w** ：int8 動態活化值、每 32 個一組的 int4 weight，再加上 int8 的
embedding）、PT2E 搭配 ``XNNPACKQuantizer`` （動態 int8，通往手機的路），以及 PT2E 搭配
``X86InductorQuantizer`` （動態 int8）並在 ``torch.compile`` 下執行，以每秒 token 數和
編譯後的 fp32 比較速度。評量方式和評量語言模型一樣：保留文字上的困惑度、它寫出的文字、weight
的位元組數，以及它留下哪些浮點數運算。本課最後是分組 weight 的一個陷阱：group size 除不盡某
一層的寬度時，torchao 大聲拒絕，ExecuTorch 的配方卻一聲不響地跳過。

**你會學到**

- 每種配方把 weight 與計算圖變成什麼，又留下哪些浮點數運算
- 每種配方的困惑度與貪婪解碼的文字離 fp32 多近，以及它的 weight 有多大；x86 上編譯後的 int8
  對 prefill 與 decode 的每秒 token 數有什麼影響
- 為什麼 group size 必須整除每個 linear 的輸入寬度，以及如何確認配方量化了每一個 linear

**先備知識**：
:ref:`M05-2 · 靜態與動態 int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`、
:ref:`M05-4 · PT2E 還是 quantize_()？
<sphx_glr_lessons_m05_transformers_m05_4_pt2e_or_quantize.py>`、
:ref:`M08-1 · 解碼器與它的 KV 快取
<sphx_glr_lessons_m08_language_model_m08_1_a_decoder_and_its_cache.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# M08-1 訓練好的解碼器（ ``train_decoder`` ，從課程的快取載入），以及它對一個提示詞的貪婪
# 解碼文字：每個量化版本都拿來和它比較。

import copy
import io
import math
import operator
import os
import time
import warnings
from collections import Counter
from contextlib import redirect_stdout

import matplotlib.pyplot as plt
import torch
from torch import nn

from common.charts import display_width, pad, use_course_style
from common.coverage import MOVING_KINDS, coverage
from common.cpu import describe
from common.expect import expect_error
from common.kernels import kernels_run, native_stderr_silenced
from common.language_model import (
    WINDOW,
    Decoder,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    train_decoder,
    unigram_perplexity,
)
from common.pt2e import quiet
from common.results import publish
from common.timing import as_compiled, race, timing_threads
from common.viz import draw

quiet()
# inductor 的 int8 lowering 複製 zero point 張量的方式，會觸發 torch 自己的警告（M03-3）。
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

qd = torch.ops.quantized_decomposed
model, _ = train_decoder()
PROMPT, LENGTH = "The import statement", 60
fp32_text = generate(model, PROMPT, LENGTH)
LINEARS = 4 * 7 + 1  # 每個 block 7 個（wq、wk、wv、wo、w1、w3、w2），加上輸出層

# %%
# 三個輔助函式： ``weight_bytes`` 計算模型讀取的 weight 的位元組數（量化後的編碼連同它們的
# scale 與 zero point；不含 KV 快取與旋轉位置表，它們是 buffer 而不是 weight）；
# ``same_start`` 計算一段文字開頭有幾個字元和 fp32 的相同； ``float_linears`` 列出 weight
# 仍是浮點數張量的 ``nn.Linear`` 模組。


def weight_bytes(m) -> int:
    """``m`` 讀取的 weight 的位元組數，量化的 weight 連同它們的 scale 與 zero point。"""
    if isinstance(m, torch.fx.GraphModule):  # 轉換後的圖仍留著沒人讀的浮點數 weight
        names = {node.target for node in m.graph.find_nodes(op="get_attr")}
        tensors = {name: operator.attrgetter(name)(m) for name in names}
    else:
        tensors = m.state_dict()
    total = 0
    for name, t in tensors.items():
        if name.endswith(("k_cache", "v_cache", "cos", "sin")):
            continue
        if hasattr(t, "__tensor_flatten__"):  # torchao 的子類別：讀它裡面的張量
            parts = [getattr(t, inner) for inner in t.__tensor_flatten__()[0]]
        else:
            parts = [t]
        total += sum(part.nbytes for part in parts)
    return total


def same_start(text: str) -> int:
    """``text`` 開頭有幾個字元和 fp32 的文字相同。"""
    pairs = zip(text, fp32_text, strict=True)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), len(fp32_text))


def float_linears(m: nn.Module) -> list[str]:
    """``m`` 中 weight 仍是一般浮點數參數的 ``nn.Linear`` 模組。"""
    return [
        name
        for name, module in m.named_modules()
        if isinstance(module, nn.Linear) and type(module.weight) is nn.Parameter
    ]


fp32_perplexity = perplexity(model)
print(f"fp32：困惑度 {fp32_perplexity:.3f}，weight 共 {weight_bytes(model) / 1e3:.0f} kB")
print(f"{PROMPT!r} -> {fp32_text!r}")
assert len(float_linears(model)) == LINEARS, "29 個 linear，全是浮點數"

# %%
# 步驟 1 — ``quantize_`` ：分組的 int4 weight，int8 的 embedding
# --------------------------------------------------------------
# 用兩次 ``quantize_`` 呼叫做出 ExecuTorch 的 LLM 配方（scale 用 torchao 預設的 min/max 求法；
# ``export_llama`` 用 HQQ 挑選，見步驟 6）。 ``Int8DynamicActivationIntxWeightConfig``
# 搭配 ``weight_dtype=torch.int4`` 與 ``PerGroup(32)`` （ **8da4w** ）套用到每個
# ``nn.Linear`` （ ``quantize_`` 預設的篩選）； ``IntxWeightOnlyConfig`` 搭配 int8 與
# ``PerAxis(0)`` （每列一個 scale，每個 token 一列）透過 ``filter_fn`` 套用到 embedding。
# 模型保留原本的類別與模組；改變的是每個 weight：變成 torchao 的張量子類別。

INT4 = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int4, weight_granularity=PerGroup(32)
)
EMBEDDING = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))


def is_embedding(module: nn.Module, name: str) -> bool:
    return isinstance(module, nn.Embedding)


int4 = copy.deepcopy(model)
quantize_(int4, INT4)
quantize_(int4, EMBEDDING, filter_fn=is_embedding)
kinds = Counter(type(t).__name__ for t in int4.state_dict().values() if t.dim() == 2)
print(f"{type(int4).__name__}，現在的二維 weight：{dict(kinds)}")
assert kinds == {"IntxUnpackedToInt8Tensor": LINEARS + 1}, "29 個 linear 加上 embedding"
assert not float_linears(int4), "沒有留下浮點數 linear"

# %%
# ``wq`` 的 weight 裡面有： ``qdata`` ，也就是編碼，介於 −8 與 7 之間（int4 的範圍），但每個
# 編碼占一個位元組，存在 int8 張量裡（類別名稱就這麼說：「unpacked to int8」）；沿著一列每 32 個
# weight 一組，每組一個 scale（與一個 zero point），所以每列 128 / 32 = 4 個；還有活化值的
# 量化方式：int8、每個 token 一個 scale，每次呼叫時計算。embedding 存的是 int8 編碼，每列一個
# scale。

w = int4.layers[0].attention.wq.weight
e = int4.tok_embeddings.weight
print(f"wq：qdata {w.qdata.dtype} {tuple(w.qdata.shape)}，{w.qdata.min()}..{w.qdata.max()}")
print(f"    scale {tuple(w.scale.shape)}，block_size {w.block_size}")
print(f"    活化值：{w.activation_quantization}")
print(f"embedding：qdata {e.qdata.dtype} {tuple(e.qdata.shape)}，scale {tuple(e.scale.shape)}")
assert w.qdata.dtype == torch.int8 and -8 <= w.qdata.min() and w.qdata.max() <= 7, "int4 的編碼"
assert tuple(w.scale.shape) == (128, 128 // 32), "每列 4 組"
assert tuple(e.scale.shape) == (103, 1), "embedding 每列一個 scale"

# %%
# 每個 weight 是它的編碼乘上所屬組的 scale，和浮點數 weight 相差不超過半個 scale：也就是捨入到
# 16 個等級中最近的一個。

step = w.scale.repeat_interleave(32, dim=1)
error = (w.dequantize() - model.layers[0].attention.wq.weight).abs()
print(f"最大誤差：所屬組 scale 的 {(error / step).max():.3f} 倍")
assert (error <= step / 2 * (1 + 1e-5)).all(), "不超過半個 scale"
int4_perplexity = perplexity(int4)
int4_text = generate(int4, PROMPT, LENGTH)

# %%
# 步驟 2 — PT2E 搭配 ``XNNPACKQuantizer`` ，動態
# ----------------------------------------------
# 通往手機的路：在 ``export_decoder`` 匯出的計算圖（同一個程式負責 prefill 與 decode，M08-1）
# 上使用 ``get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)`` 。
# ``prepare_pt2e`` 插入的是：每個 linear 的輸入上一個標記為動態的 ``PlaceholderObserver``
# （它什麼都不記錄；執行時由 convert 後的圖從每次呼叫的數值算出 scale），以及每個 weight 上
# 一個 ``PerChannelMinMaxObserver`` 。讀取同一個張量的 linear 共用一個輸入 observer：
# ``wq`` ／ ``wk`` ／ ``wv`` 、 ``w1`` ／ ``w3`` 、 ``wo`` 、 ``w2`` ，每個 block 四個，再加上
# 輸出層的：17 個。

xnnpack = XNNPACKQuantizer().set_global(
    get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
)
prepared = prepare_pt2e(export_decoder(model).module(), xnnpack)
observers = [m for name, m in prepared.named_children() if name.startswith("activation_post")]
inserted = Counter(f"{type(o).__name__}{'（動態）' * o.is_dynamic}" for o in observers)
print(dict(inserted))
assert inserted == {"PlaceholderObserver（動態）": 4 * 4 + 1, "PerChannelMinMaxObserver": 29}

# %%
# 「動態量化不需要校準」對活化值成立，對 weight 不成立：weight 的 observer 還什麼都沒看過
# （ ``min_val`` 是空的）。呼叫一次（這裡用提示詞）就讓每個 weight observer 各執行一次；省略
# 這次呼叫， ``convert_pt2e`` 就用預設值量化（練習 2）。

weight_observers = [o for o in observers if not o.is_dynamic]
print(f"呼叫之前：min_val 的形狀 {tuple(weight_observers[0].min_val.shape)}")
prompt = encode(PROMPT)
with torch.no_grad():
    prepared(prompt[None], torch.arange(len(prompt)))
print(f"呼叫一次後：min_val 的形狀 {tuple(weight_observers[0].min_val.shape)}")
assert all(o.min_val.numel() for o in weight_observers), "每個 weight observer 都執行過了"

# %%
# ``convert_pt2e`` 。linear 的 weight 來自 ``dequantize_per_channel`` （int8 編碼，每個輸出
# 通道一個 scale）時，它就是 int8：29 個都是。


def int8_linears(gm: torch.fx.GraphModule) -> int:
    """``gm`` 中 weight 是經由 dequantize 讀取的 int8 常數的 linear 數目。"""
    linears = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    return sum(node.args[1].target == qd.dequantize_per_channel.default for node in linears)


xnnpack_model = convert_pt2e(prepared)
reset_cache(xnnpack_model)
print(f"{int8_linears(xnnpack_model)} 個 linear 讀取 int8 weight（共 {LINEARS} 個）")
assert int8_linears(xnnpack_model) == LINEARS, "每個 linear 都是 int8 weight"

# %%
# 把第 0 個 block 的 SwiGLU 前饋層單獨拿出來，交給同一個 quantizer，就看得到每個 linear
# 變成了什麼（圖中標出 q/dq node）：它的輸入每次呼叫都量化一次（ ``choose_qparams`` →
# ``quantize`` → ``dequantize`` ，scale 由這次呼叫自己的數值算出），它的 weight 則以 int8
# 編碼經由 ``dequantize_per_channel`` 讀入。 ``w1`` 與 ``w3`` 讀同一個輸入：共用一次量化。

ffn = copy.deepcopy(model.layers[0].feed_forward)
ffn_input = torch.randn(1, 8, 128)
ffn_prepared = prepare_pt2e(torch.export.export(ffn, (ffn_input,)).module(), xnnpack)
ffn_prepared(ffn_input)
ffn_int8 = convert_pt2e(ffn_prepared)
qdq = [n.name for n in ffn_int8.graph.nodes if "quantized_decomposed" in str(n.target)]
draw(ffn_int8, highlight=qdq, title="第 0 個 block 的前饋層，XNNPACK 動態 int8")
per_channel = [name for name in qdq if name.startswith("dequantize_per_channel")]
assert len(per_channel) == 3 and len(qdq) == 3 + 2 * 3, "3 個 weight；2 個輸入：w1、w3 共用 x"

# %%
# 留在浮點數的運算，由 ``coverage`` （ ``common.coverage`` ）列出，不含只搬移數值的運算：
# embedding；RMSNorm（ ``pow`` 、 ``mean`` 、 ``rsqrt`` ，以及乘上它的 weight 的 ``mul`` ）；
# 旋轉位置編碼（ ``mul`` 、 ``sub`` 、 ``stack`` ）；SwiGLU 的 ``silu`` 與它的乘積；殘差
# ``add`` ；attention；還有快取的寫入 ``index_copy_`` ：快取保存的是浮點數的 key 與 value。
# 動態設定只標註 linear。

report = coverage(export_decoder(model).module(), xnnpack, every_op=True)
print(report.summary().splitlines()[0])
print(report.grouped(only="float", with_layout=False))
float_ops = {op.op for op in report.ops if not op.int8 and op.kind not in MOVING_KINDS}
expected = {"embedding", "pow", "mean", "rsqrt", "mul", "sub", "stack", "silu", "add"}
expected |= {"scaled_dot_product_attention", "index_copy_"}
assert {op.op for op in report.ops if op.int8} == {"linear"}, "int8 的只有 linear"
assert report.counts()["linear"] == (LINEARS, LINEARS), "coverage：29 個 linear 全是 int8"
assert expected <= float_ops, "embedding、RMSNorm、旋轉位置編碼、SiLU、attention：浮點數"
assert report.statuses("index_copy_") == {"float": 8}, "8 個快取寫入（k、v × 4），浮點數"
xnnpack_perplexity = perplexity(xnnpack_model)
xnnpack_text = generate(xnnpack_model, PROMPT, LENGTH)

# %%
# 步驟 3 — PT2E 搭配 ``X86InductorQuantizer`` ，編譯後執行
# --------------------------------------------------------
# 同樣的流程，改用 x86 quantizer 的動態設定（uint8 活化值，每次呼叫一個 scale；int8 weight，
# per-channel）。 ``pt2e`` 做的就是步驟 2 做的事：匯出、prepare、呼叫一次、convert。x86
# quantizer 還在 SwiGLU 乘積的兩個輸入上加了動態 q/dq，並把 ``wo`` 與 ``w2`` 之後的殘差
# ``add`` 融合進它們的 linear。


def pt2e(quantizer) -> torch.fx.GraphModule:
    """匯出解碼器、prepare、呼叫一次（給 weight 的 observer）、convert。"""
    prepared = prepare_pt2e(export_decoder(model).module(), quantizer)
    with torch.no_grad():
        prepared(prompt[None], torch.arange(len(prompt)))
    converted = convert_pt2e(prepared)
    reset_cache(converted)
    return converted


x86 = X86InductorQuantizer().set_global(
    get_default_x86_inductor_quantization_config(is_dynamic=True)
)
x86_report = coverage(export_decoder(model).module(), x86)
print(x86_report.summary().splitlines()[0])
x86_model = pt2e(x86)
assert int8_linears(x86_model) == LINEARS, "x86：每個 linear 都是 int8 weight"
assert x86_report.counts()["mul"][0] == 4, "x86：每個 block 的 SwiGLU 乘積"
assert x86_report.counts()["add"][0] == 8, "x86：wo 與 w2 之後的殘差 add，已融合"

# %%
# ``torch.compile`` 加上 freezing 把 q/dq 節點對變成 oneDNN 的 int8 kernel。課程的規則
# （M03-3、M05-4）：freezing 設定在整個行程上、關閉 grad、在課程計時所用的執行緒數下編譯。
# 困惑度只需要一個靜態形狀：在位置 0 … 127 上 prefill ``WINDOW`` 個 token，這就是
# ``perplexity`` 唯一的呼叫方式，所以只編譯一次。（貪婪解碼會用另外兩個形狀呼叫它，提示詞與
# 單一 token，還要再編譯兩次：表格裡 x86 的文字取自未編譯的 q/dq 計算圖。）inductor 會把它產生
# 的 C++ 存進快取（課程建置時位於 ``build/inductor_cache`` ），下一次執行就不必再呼叫 C++
# 編譯器；但它仍要重新追蹤計算圖、再下放一次，因為 inductor 不快取含有 freezing 常數的整張圖。
# ``kernels_run`` （ ``common.kernels`` ）用 profiler 讀出一次 prefill 執行了哪些 kernel。

held_out = split("held_out")
window = (held_out[None, :WINDOW], torch.arange(WINDOW))
torch._inductor.config.freezing = True  # 設定在整個行程上（M05-4）
threads = timing_threads()
with as_compiled(threads):
    compiled = torch.compile(x86_model, dynamic=False)
    start = time.perf_counter()
    compiled(*window)  # 第一次呼叫時編譯
    seconds = time.perf_counter() - start
    ran = kernels_run(compiled, window)
    x86_perplexity = perplexity(compiled)
print(f"第一次呼叫（編譯）：{seconds:.1f} 秒，{threads} 個執行緒，負載 {os.getloadavg()[0]:.1f}")
print(ran.summary)
assert ran.int8 == Counter({"onednn::qlinear_pointwise": LINEARS}), "執行了 29 個 int8 linear"
assert not ran.float, "沒有浮點數 linear kernel"

# %%
# 實際執行的 kernel 是 29 個 int8 linear，殘差 add 在它們裡面。SwiGLU 的乘積雖然被
# quantizer 標註成 int8，卻沒有自己的 int8 kernel：inductor 怎麼處理它的 q/dq 配對，都在它
# 產生的程式碼裡執行，而 ``kernels_run`` 不會列出這些程式碼。 ``coverage`` 的狀態說的是
# quantizer 要求什麼；kernel 說的才是實際執行了什麼。

x86_text = generate(x86_model, PROMPT, LENGTH)

# %%
# 步驟 4 — x86 上編譯後的每秒 token 數
# ------------------------------------
# M08-3 在 64 個 token 的 prefill 與一個 decode 步驟（位置 64 的一個 token）上，計時 eager
# fp32、eager 8da4w 與 ``.pte`` 。這裡用同樣兩個形狀，計時 x86 編譯後執行的兩者：
# ``export_decoder`` 給的 fp32 計算圖，以及步驟 3 的 ``x86_model`` 。 ``race``
# （ ``common.timing`` ）照步驟 3 的方式編譯兩者各自的一份副本（freezing 設定在整個行程上、
# 關閉 grad、在 ``timing_threads()`` 下、靜態形狀），像 ``compare_speed`` 一樣以交錯的輪次
# 計時，並在計時前後讀出各自執行的 kernel。每個形狀各編譯一次：兩個形狀、兩個模型，共四次編譯
# （和步驟 3 一樣由 inductor 快取）。

LABELS = {"fp32": "fp32 編譯後", "int8": "int8 x86 編譯後"}
pair = {LABELS["fp32"]: export_decoder(model).module(), LABELS["int8"]: x86_model}
prompt_64 = held_out[:64][None]
shapes = {
    "prefill": (prompt_64, torch.arange(64)),
    # 用副本：切片保留那一列的 stride（64），而下面檢查時 stride 不同的單一 token 輸入
    # 會通不過 dynamo 的靜態 guard，又得重新編譯
    "decode": (prompt_64[:, :1].clone(), torch.tensor([64])),
}
races = {name: race(pair, args) for name, args in shapes.items()}

# %%
# 每個速度後面的括號是它的中位數的 95 % 信賴區間；最後一欄是一次 prefill 呼叫比一次 decode
# 呼叫多花幾倍時間，換來 64 倍的 token。結果取決於機器：和 CPU、執行緒數量與負載一起印出，從不
# assert。每次呼叫都在自己的位置寫入 KV 快取，prefill 寫第 0–63 格，decode 寫第 64 格：每一輪
# 都用同樣的值重寫同樣的格子，而 decode 在遮罩下讀取全部 128 格，不論裡面是什麼，所以不必重設
# 快取，每一輪做的都是同樣的工作。


prefills, decodes = races["prefill"], races["decode"]
width = max(display_width(label) for label in pair)
columns = pad("prefill token/秒", 24, align=">"), pad("decode token/秒", 18, align=">")
print(f"{pad('', width)}  {columns[0]}  {columns[1]}  prefill / decode 時間")
for label in pair:
    ratio = prefills[label].median / decodes[label].median
    print(
        f"{pad(label, width)}  {prefills[label].rate(64):>24}  {decodes[label].rate(1):>18}"
        f"  {ratio:20.1f}×"
    )
print(decodes.header())

# %%
# 在這麼小的解碼器上，一次呼叫大多是固定成本：29 個輸入寬度為 128 或 352 的 linear，每個都是
# 一次 kernel 呼叫，再加上它們之間 inductor 產生的程式碼；所以一次 prefill 呼叫只花一次 decode
# 呼叫的幾倍時間（最後一欄），卻處理 64 倍的 token。int8 模型還在每次呼叫時量化每個 linear 的
# 輸入（動態活化值：求最小值與最大值、算出 scale、再做一遍捨入），這是 fp32 不必做的工作；只有
# 一個 token 時，int8 沒有多少乘法可以省，所以編譯後的 int8 在這裡不一定比編譯後的 fp32 快，
# 它在每個形狀上排第幾取決於 CPU（上表是這次建置的結果）。
#
# 兩個形狀上實際執行的 kernel：int8 模型是步驟 3 的 29 個 int8 linear，沒有浮點數 linear；
# fp32 模型只有浮點數 linear。

for name, raced in races.items():
    for label, ran in raced.kernels.items():
        print(f"{pad(name, 8)} {pad(label, width)}  {ran.summary}")
    int8_ran, fp32_ran = raced.kernels[LABELS["int8"]], raced.kernels[LABELS["fp32"]]
    assert int8_ran.int8 == Counter({"onednn::qlinear_pointwise": LINEARS}), f"{name}：29 個 int8"
    assert not int8_ran.float, f"{name}：int8 模型裡沒有浮點數 linear"
    assert not fp32_ran.int8 and sum(fp32_ran.float.values()) == LINEARS, f"{name}：fp32 全是浮點數"

# %%
# 再看它算出了什麼。編譯後的 int8 模型（decode 形狀）和它所來自的、未編譯的 q/dq 計算圖，各自
# 像 decode 迴圈那樣，每次呼叫讀入提示詞的一個 token，位置依序是 0、1、…；每次呼叫的 logits 都
# 取決於之前的呼叫寫進快取的 key 與 value。最後一步在歸零的快取上再算一次，顯示快取有多重要。


def decode_steps(m, tokens: torch.Tensor) -> torch.Tensor:
    """把 ``m`` 的快取歸零，再每次呼叫餵入 ``tokens`` 的一個；傳回每一步的 logits。"""
    reset_cache(m)
    return torch.cat([m(t.view(1, 1), torch.tensor([i])) for i, t in enumerate(tokens)], dim=1)


fast = decodes.models[LABELS["int8"]]
with as_compiled(decodes.threads):  # 和編譯時相同：換一個執行緒數會重新編譯
    got, want, fp32_logits = (decode_steps(m, prompt) for m in (fast, x86_model, model))
    reset_cache(fast)
    fresh = fast(prompt[-1].view(1, 1), torch.tensor([len(prompt) - 1]))

# %%
# 有 VNNI 時，oneDNN 的 int8 加總是精確的，兩者只在編譯後的程式碼把某個活化值捨入到相鄰的編碼時
# 才不同（它用自己的程式碼算出每次呼叫的 scale）：logits 差幾百分之一，assert 的上限是四分之一
# （旁邊印出 int8 本身與 fp32 的差距，供比較），遠小於漏寫一次快取所造成的差距。沒有 VNNI 時，
# oneDNN 以 16 位元把兩個 uint8 × int8 乘積相加，這個設定用滿整個範圍的活化值可能讓它飽和
# （M04-2）：logits 差得更多。計時表格下方的 CPU 那一行說明這次建置屬於哪一種情況。

differ, same = (got - want).abs().max(), (got.argmax(-1) == want.argmax(-1)).sum()
print(f"編譯後的 int8 與 q/dq，{len(prompt)} 步：logits 最大差距 {differ:.3f}")
print(f"    貪婪解碼的選擇有 {same} 步相同（共 {len(prompt)} 步）")
print(f"q/dq 與 fp32：最大差距 {(want - fp32_logits).abs().max():.3f}")
print(f"最後一步改在歸零的快取上算：差距 {(fresh - got[:, -1:]).abs().max():.2f}")
assert (fresh - got[:, -1:]).abs().max() > 1, "最後一步讀到了前面各步寫入的內容"
assert torch.equal(got[0, -1].argmax(), want[0, -1].argmax()), "下一個字元相同"
if describe().vnni:
    assert differ < 0.25, "有 VNNI 時：int8 的加總是精確的，最多只差一次捨入"

# %%
# 步驟 5 — 並排比較
# -----------------
# 同樣 20 個保留文字視窗上的困惑度、同一個提示詞的貪婪解碼文字、weight 的位元組數，以及留在
# 浮點數的 linear。unigram 困惑度只依每個字元的出現頻率預測，是一個完全沒學到上下文的模型的
# 水準。

rows = {
    "fp32": (fp32_perplexity, fp32_text, weight_bytes(model), len(float_linears(model))),
    "int4（quantize_ 8da4w）": (
        int4_perplexity,
        int4_text,
        weight_bytes(int4),
        len(float_linears(int4)),
    ),
    "int8 XNNPACK（PT2E）": (
        xnnpack_perplexity,
        xnnpack_text,
        weight_bytes(xnnpack_model),
        LINEARS - int8_linears(xnnpack_model),
    ),
    "int8 x86（PT2E，已編譯）": (
        x86_perplexity,
        x86_text,
        weight_bytes(x86_model),
        LINEARS - int8_linears(x86_model),
    ),
}
unigram = unigram_perplexity()
print(f"{pad('', 26)}     困惑度  相對 fp32  開頭相同    weight  浮點數 linear")
for label, (value, text, size, floats) in rows.items():
    change = value / fp32_perplexity - 1
    print(
        f"{pad(label, 26)} {value:10.3f}  {change:+6.2%}  {same_start(text):4d} / {LENGTH}"
        f"  {size / 1e3:4.0f} kB  {floats:13d}"
    )
print(f"{pad('unigram（不看上下文）', 26)} {unigram:10.3f}")

# %%
# 斷言的範圍留有充分餘裕：int8 的困惑度不超過 fp32 的 2 %，int4 不超過 5 %。兩個 int8 模型
# 寫出的貪婪解碼文字，至少前一半（60 個字元中的 30 個）和 fp32 的相同；int4 模型的文字可能較早
# 分岔：在兩個字元幾乎同分的第一個地方選了另一個，之後就走上不同的路（貪婪解碼的文字會自我重複；
# 真正衡量品質的是困惑度）。

for label, (_, text, _, _) in rows.items():
    print(f"{pad(label, 26)} {text!r}")
assert xnnpack_perplexity < 1.02 * fp32_perplexity, "int8 XNNPACK：不超過 fp32 的 2 %"
assert x86_perplexity < 1.02 * fp32_perplexity, "int8 x86：不超過 fp32 的 2 %"
assert int4_perplexity < 1.05 * fp32_perplexity, "int4：不超過 fp32 的 5 %"
assert min(same_start(xnnpack_text), same_start(x86_text)) >= LENGTH // 2, (
    "int8：前 30 個字元和 fp32 的相同"
)
assert max(value for value, *_ in rows.values()) < unigram / 4, "全都遠勝 unigram"

# %%
# 大小說明了什麼存在哪裡。int4 的編碼在這裡每個占一個位元組，和 PT2E 的 int8 weight 位元組數
# 完全相同；再加上每 32 個 weight 一個 scale 與一個 zero point，int4 模型在記憶體中並不比 int8
# 模型小。每個位元組裝兩個編碼的打包，要到為 XNNPACK 下放時才發生（M08-3 量測 ``.pte`` ）。
# PT2E 的計算圖保留浮點數的 embedding，而 torchao 的 zero point 以 int64 儲存。

codes = sum(m.weight.qdata.nbytes for m in int4.modules() if isinstance(m, nn.Linear))
linears = xnnpack_model.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
dequantized = [node.args[1] for node in linears]  # 每個 weight 的 dequantize_per_channel
int8_weights = sum(
    operator.attrgetter(dq.args[0].target)(xnnpack_model).nbytes for dq in dequantized
)
zero_point = operator.attrgetter(dequantized[0].args[2].target)(xnnpack_model)
embedding = xnnpack_model.tok_embeddings.weight
print(f"linear 的 weight：int4 編碼 {codes / 1e3:.0f} kB，int8 weight {int8_weights / 1e3:.0f} kB")
assert codes == int8_weights, "未打包的 int4 編碼：和 int8 一樣每個一個位元組"
print(f"PT2E：zero point {zero_point.dtype}，embedding {embedding.dtype}")
assert weight_bytes(int4) >= weight_bytes(xnnpack_model), "int4 在記憶體中不比 int8 小"
assert (zero_point.dtype, embedding.dtype) == (torch.int64, torch.float32)

# %%
# 給課程首頁的數字，以及畫成圖的表格。

publish("perplexity_fp32", fp32_perplexity)
publish("perplexity_int4", int4_perplexity)
publish("perplexity_int8_xnnpack", xnnpack_perplexity)
publish("perplexity_int8_x86", x86_perplexity)
publish("unigram_perplexity", unigram)

use_course_style()
fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
labels = ["fp32", "int4", "int8 XNNPACK", "int8 x86"]
colours = ["#94a3b8", "#f59e0b", "#2563eb", "#16a34a"]
left.bar(labels, [100 * (row[0] / fp32_perplexity - 1) for row in rows.values()], color=colours)
left.set_title("困惑度比 fp32 高出（%）")
right.bar(labels, [row[2] / 1e3 for row in rows.values()], color=colours)
right.set_title("記憶體中的 weight（kB）")
fig.tight_layout()
plt.show()

# %%
# 步驟 6 — group size 的陷阱
# --------------------------
# 一組 32 個 weight 沿著一列排列，所以 32 必須整除每個 linear 的輸入寬度（ ``in_features`` ）。
# 這個模型可以：128 與 352。SwiGLU 寬度為 344 的解碼器就不同了： ``w2`` 讀入的寬度是
# 344 = 32 × 10 + 24。配方量化哪些 linear 取決於它們的形狀，而不是數值，所以未訓練的
# ``Decoder(hidden=344)`` 就足以示範。torchao 拒絕。

wide = Decoder(hidden=344).eval()
widths = sorted({m.in_features for m in wide.modules() if isinstance(m, nn.Linear)})
print(f"in_features: {widths}")
with expect_error(AssertionError, match="divisible by block_size"):
    quantize_(copy.deepcopy(wide), INT4)

# %%
# ExecuTorch 較新的入口 ``quantize_model_`` （ ``executorch.extension.llm.export`` ）也拒絕，
# 並指出出路： ``skip_incompatible_shapes=True`` 。

with native_stderr_silenced():  # 這裡匯入的 pytorch_tokenizers 會在 stderr 寫一行 C++ 記錄
    from executorch.examples.models.llama.source_transformation.quantize import quantize
    from executorch.extension.llm.export.quantize import quantize_model_
warnings.filterwarnings("ignore", message="quantize_model_ is experimental")

with expect_error(RuntimeError, match="skip_incompatible_shapes"):
    quantize_model_(copy.deepcopy(wide), qlinear_config="8da4w", qlinear_group_size=32)

# %%
# ``export_llama`` 執行的配方（ ``executorch/examples/models/llama/`` 中的 ``quantize`` ，
# 經由 ``get_quant_weight_transform`` ，搭配 ``qmode="8da4w"`` ；它還用 HQQ 挑選 scale）傳給
# ``quantize_`` 一個 ``filter_fn`` ，只保留 group size 能整除 ``in_features`` 的 linear
# （pytorch/executorch#22044）。沒有錯誤、沒有警告、什麼都沒印出：四個 ``w2`` 仍是 fp32。

with warnings.catch_warnings(record=True) as said, redirect_stdout(io.StringIO()) as printed:
    warnings.simplefilter("always")
    recipe = quantize(copy.deepcopy(wide), "8da4w", group_size=32)
left_float = float_linears(recipe)
print(f"{len(left_float)} 個浮點數 linear，{len(said)} 個警告：{left_float}")
assert len(left_float) == 4, "留下 4 個浮點數 linear"
assert all(name.endswith("feed_forward.w2") for name in left_float), "就是 4 個 w2"
assert not said and not printed.getvalue(), "沒有警告，什麼都沒印出"

# %%
# 兩種修正，各自再數一次浮點數 linear 來確認：改用能整除每個輸入寬度的 group size
# （ ``math.gcd`` ：這裡是 8，要存的 scale 更多），或是對留在浮點數的 linear 再做一次
# ``quantize_`` ，每列一個 scale（ ``PerAxis(0)`` ）。

group = math.gcd(32, *widths)
by_gcd = copy.deepcopy(wide)
quantize_(
    by_gcd,
    Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(group)
    ),
)
per_row = copy.deepcopy(recipe)
quantize_(
    per_row,
    Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerAxis(0)),
    filter_fn=lambda module, name: name in left_float,
)
for label, m in (
    ("配方", recipe),
    (f"PerGroup({group})", by_gcd),
    ("配方 + PerAxis(0)", per_row),
):
    print(
        f"{pad(label, 20)} {len(float_linears(m))} 個浮點數 linear，{weight_bytes(m) / 1e3:4.0f} kB"
    )
w2_bytes = sum(recipe.get_submodule(name).weight.nbytes for name in left_float)
print(
    f"配方留下的 4 個浮點數 w2：{w2_bytes / 1e3:.0f} kB，占 {w2_bytes / weight_bytes(recipe):.0%}"
)
assert group == 8 and not float_linears(by_gcd) and not float_linears(per_row), "沒有浮點數 linear"
assert w2_bytes > 0.4 * weight_bytes(recipe), "4 個浮點數 w2 幾乎占了一半的位元組"

# %%
# 小結
# ----
# =====================  ==============================  ==========================
# 配方                   weight                          浮點數
# =====================  ==============================  ==========================
# ``quantize_`` 8da4w    int4 編碼，下放前每個占一個     RMSNorm、旋轉位置編碼、
#                        位元組；每 32 個一個 scale；    SiLU·mul、殘差 add、
#                        int8 的 embedding               attention、快取寫入
# PT2E，XNNPACK 動態     int8，每個通道一個 scale        同上，再加上 embedding
# PT2E，x86 動態         int8，每個通道一個 scale；      同上，再加上 embedding；
#                        編譯後由 oneDNN 的 int8         但殘差 add 不在內（融合
#                        linear 執行                     進 int8 linear）
# =====================  ==============================  ==========================
#
# - ``quantize_`` 把 eager 模型的 weight 換成 torchao 的子類別；PT2E 改寫匯出的計算圖。兩者都
#   量化了這個解碼器的每一個 linear，活化值都是動態 int8，困惑度都只比 fp32 高幾個百分點以內。
# - 動態的 PT2E 在 ``convert_pt2e`` 之前仍需要呼叫一次：為了 weight 的 observer。
# - 在 x86 上編譯後，int8 模型在 prefill 與 decode 兩種形狀上都執行 oneDNN 的 int8 linear；在
#   這麼小的解碼器上，它和編譯後的 fp32 比起來每秒 token 數如何，取決於每次呼叫的固定成本，以及
#   每次呼叫都要量化活化值（步驟 4 的表格）。
# - group size 必須整除每個 linear 的 ``in_features`` 。不整除時，torchao 與 ExecuTorch 的
#   ``quantize_model_`` 會引發錯誤； ``export_llama`` 的 8da4w 配方則一聲不響地跳過這些
#   linear。不論用哪個配方，之後都要數一數還有幾個浮點數 linear。
#
# 練習
# ----
# 1. 在這個解碼器上改用每組 64 個，而不是 32 個。預測： ``quantize_`` 接受嗎？能配合每個
#    linear 的最大 group size 是多少？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          config = Int8DynamicActivationIntxWeightConfig(
#              weight_dtype=torch.int4, weight_granularity=PerGroup(64)
#          )
#          with expect_error(AssertionError, match="352"):
#              quantize_(copy.deepcopy(model), config)
#          widths = {m.in_features for m in model.modules() if isinstance(m, nn.Linear)}
#          largest = math.gcd(*widths)
#          print(f"最大的 group size：{largest}")
#          assert largest == 32, "352 = 11 × 32：w2 不接受 64"
#
# 2. 拿掉步驟 2 的那次校準呼叫。預測 ``convert_pt2e`` 會說什麼、logits 是多少，以及貪婪解碼
#    的文字。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          with warnings.catch_warnings(record=True) as said:
#              warnings.simplefilter("always")
#              unready = convert_pt2e(prepare_pt2e(export_decoder(model).module(), xnnpack))
#          print({str(w.message) for w in said})
#          with torch.no_grad():
#              logits = unready(prompt[None], torch.arange(len(prompt)))
#          text = generate(unready, PROMPT, 10)
#          print(f"最大的 logit {logits.abs().max()}，文字 {text!r}")
#          assert any("must run observer" in str(w.message) for w in said), "只有一個警告"
#          assert logits.abs().max() == 0, "每個 weight 都用預設值量化：全是 0"
#          assert set(text) == {"\n"}, "一再重複 token 0"
#
# 3. int4 weight 改成每列一個 scale（ ``PerAxis(0)`` ），而不是每 32 個 weight 一個。預測 scale
#    的形狀，以及在這個小模型上困惑度會不會明顯改變。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          rows_only = copy.deepcopy(model)
#          quantize_(
#              rows_only,
#              Int8DynamicActivationIntxWeightConfig(
#                  weight_dtype=torch.int4, weight_granularity=PerAxis(0)
#              ),
#          )
#          scale = rows_only.layers[0].attention.wq.weight.scale
#          value = perplexity(rows_only)
#          print(f"scale {tuple(scale.shape)}，困惑度 {value:.3f}")
#          print(f"（每 32 個一組：{int4_perplexity:.3f}）")
#          assert tuple(scale.shape) == (128, 1), "每列一個 scale"
#          assert abs(value / int4_perplexity - 1) < 0.02, "在這裡和每 32 個一組相差不到 2 %"
#
# 延伸閱讀
# --------
# - `torchao：quantize_
#   <https://docs.pytorch.org/ao/stable/api_reference/generated/torchao.quantization.quantize_.html>`_
#   與 `Int8DynamicActivationIntxWeightConfig
#   <https://docs.pytorch.org/ao/main/api_reference/generated/torchao.quantization.Int8DynamicActivationIntxWeightConfig.html>`_
# - `ExecuTorch：Exporting LLMs
#   <https://docs.pytorch.org/executorch/stable/llm/export-llm.html>`_ ，它的量化選項
#   （ ``8da4w`` 、group size、embedding）
# - `pytorch/executorch#22044 <https://github.com/pytorch/executorch/issues/22044>`_ ：8da4w
#   配方跳過 group size 無法整除其寬度的 linear
#
# 下一課
# ------
# :ref:`M08-3 · 放上手機 <sphx_glr_lessons_m08_language_model_m08_3_to_a_phone.py>` 把量化後的
# 解碼器連同快取下放成 ``.pte`` ，並在 ExecuTorch 執行環境上生成文字。
