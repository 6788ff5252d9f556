"""
M07-4 運算圖鑑
==============

conv 與 linear 之間的那些運算，量化後會怎樣？每個運算一個小模型（conv1d、conv2d、
conv_transpose2d、linear、matmul、bmm、scaled_dot_product_attention、embedding、add、sub、
mul、div、cat、max_pool2d、avg_pool2d、adaptive_avg_pool2d、mean、sum、relu、hardtanh、
leaky_relu、gelu、silu、mish、hardswish、hardsigmoid、sigmoid、tanh、softmax、clamp、
layer_norm、group_norm、照 Llama 寫法展開的 RMSNorm、batch_norm、upsample_nearest2d、
upsample_bilinear2d、pixel_shuffle、pad、flatten、reshape、permute、transpose、slice、split、
dropout、lstm、gru、KV 快取的 ``index_copy_`` ），各自放在真實模型擺放它的位置，交給這台機器
上跑得動的每個 quantizer，再追到實際執行它的地方：x86 上的 oneDNN kernel 或 inductor 的迴圈、
XNNPACK delegate 或 ExecuTorch 的 portable kernel、OpenVINO CPU 外掛實際執行的精度。表中
每一項都讀自實際的執行，並對照本頁寫明的規則檢查；新版本改變了某個運算的命運，這一頁就會
建置失敗。

**你會學到**

- 每個 quantizer 把哪些運算變成 int8、融合進前面的 conv 或 linear、以共用的 qparams 讓 int8
  直接通過，或留在浮點數，以及背後的規則
- 每個運算接著在哪裡執行：oneDNN kernel 與它的 post-op、XNNPACK delegate 與拒絕某個運算的
  限制、OpenVINO 實際執行的精度
- 怎麼把你自己的運算交給同一套流程（ ``common.atlas`` ）

**先備知識**： :ref:`M07-1 · 我的 quantizer 會把什麼留在浮點數？
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`、
:ref:`M07-3 · 同一張圖，跑遍這台機器上的每個 quantizer
<sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# ``common.atlas`` 放著模型（ ``ENTRIES`` ）與整套流程。 ``run_cached`` 用每個 quantizer
# 量化一個條目，再追到執行它的地方；結果是單純的資料，存在課程的快取裡；快取的鍵包含
# 模型、負責讀取結果的程式碼、安裝的套件版本與 CPU 的 kernel 路徑（其中沒有任何計時）。

import copy
import importlib
import re
from collections import Counter
from itertools import chain

import torch
from torch import nn

from common.pt2e import quiet

quiet()

from common import atlas, edge
from common.cpu import describe
from common.kernels import native_stderr_silenced
from common.viz import draw

# sphinx_gallery_start_ignore
# ExecuTorch 的 OpenVINO 套件會匯入 pytorch_tokenizers，它的 C++ 擴充在載入時往行程的 stderr
# 寫一行紀錄：不讓它進入建置紀錄。
with native_stderr_silenced():
    importlib.import_module("pytorch_tokenizers")
# sphinx_gallery_end_ignore

print(describe().verdict)
results = {item.name: atlas.run_cached(item) for item in atlas.ENTRIES}
print(f"{len(results)} 個模型，{len({item.op for item in atlas.ENTRIES})} 個運算")
assert len({item.op for item in atlas.ENTRIES}) >= 40, "至少 40 個運算"

# %%
# 步驟 1 — 每個運算一個模型
# -------------------------
# 每個運算都放在真實模型遇到它的位置：活化函式夾在兩個 conv 之間（Transformer 用的那些則夾在
# 兩個 linear 之間）、池化層接在 conv 後面、歸約放在分類器的頭部。運算放在哪裡決定了它的命運：
# x86 會把 linear 後面的 GELU 融合進去，conv 後面的卻不會。

for item in atlas.ENTRIES:
    print(f"{item.name:30} {atlas.placement(item)}")
after = {n: results[n]["x86"]["coverage"]["status"] for n in ("gelu", "gelu · after conv")}
print(after)
assert after == {"gelu": "int8 fused", "gelu · after conv": "float"}, "GELU 只在 linear 後面融合"


# %%
# 步驟 2 — 圖鑑
# -------------
# 每個運算一列，各欄的意思如下：
#
# - **x86** 、 **XNNPACK** 、 **OpenVINO** 、 **Arm** ：quantizer 怎麼處理這個運算，依
#   ``coverage`` （M07-1）的報告： ``int8`` （以 int8 輸入計算）、 ``fused`` （在前面的 int8
#   conv 或 linear 裡以 post-op 執行）、 ``shared`` （int8 直接通過，輸出的 scale 與
#   zero point 和輸入相同）或 ``float`` 。
# - **x86 kernel** ：它在哪裡執行，以 ``kernels_run`` 讀出：oneDNN kernel 與 oneDNN 實際執行的
#   post-op、 ``loop u8→u8`` （夾在 dequantize 與 quantize 之間的運算：inductor 的迴圈直接
#   讀寫 uint8）、浮點數 kernel，或 ``loop fp32`` （inductor 的浮點數迴圈）。lowering 會分解
#   的運算（attention、遞迴層）則列出它的模型執行的浮點數 kernel，其中包括它周圍的 3-D linear
#   （lowering 把它們留給 ``aten::addmm`` ）。
# - **XNNPACK node** ：在 XNNPACK delegate 裡，或在 ExecuTorch 的 portable kernel 上。
# - **OpenVINO ran** ：OpenVINO 的 CPU 外掛以什麼精度執行這個運算的層（浮點數層在有 bf16 的
#   CPU 上用 bf16，否則用 f32）。
# - **Arm** 欄只有標註，因為 x86 機器上沒有東西能執行 Arm 的 int8 圖（M07-3）。
#
# x86 的圖以 ``lower_pt2e_quantized_to_x86`` （inductor 的 freezing pass，每個模型大約一秒）
# 下放後直接以 eager 模式執行，不編譯：每個模型都 ``torch.compile`` 會讓這一頁的建置時間成倍
# 增加。這些 pass 預先打包 int8 conv 與 linear，並融合 ReLU 與 add。編譯時執行的也是這些
# pass，它們本來也會融合 GELU、SiLU、Hardswish 或 ReLU6，但它們的模式比對的是 inductor 分解
# 之後的寫法（SiLU 寫成 ``x / (exp(-x) + 1)`` 、ReLU6 寫成先 ``clamp_min`` 再
# ``clamp_max`` 、GELU 用 ``erf`` ），而 lowering 從不產生這些寫法：它讓 ``aten.gelu`` 保持
# 完整。只有編譯會先分解。linear 後面的 Tanh 與 LeakyReLU 則根本沒有 int8 post-op（步驟 3）。
# quantizer 融合了、lowering 卻沒有融合的運算，lowering 後的圖無法直接執行的地方（conv +
# add：oneDNN 要求殘差輸入是 channels-last；flatten：它的 ``view`` 不接受 int8 conv 的
# channels-last 輸出），以及編譯後執行方式不同的地方（好幾個 linear 讀同一個 weight，步驟 3），
# 那一列會註明 ``compiled`` ：只有那個模型另外以 freezing 編譯（ ``atlas.x86_compiled`` ），
# 並讀出那一次呼叫實際執行的 kernel。

SHORT = {"int8 static": "int8", "int8 fused": "fused", "int8 shared": "shared"}
compiled = {
    item.name: atlas.x86_compiled(item)
    for item in atlas.ENTRIES
    if "view size is not compatible" in results[item.name]["x86"].get("error", "")
    or (
        results[item.name]["x86"].get("coverage", {}).get("status") == "int8 fused"
        and not results[item.name]["x86"]["op"].startswith("fused")
    )
}


def status(result: dict) -> str:
    if result.get("coverage", {}).get("status", "not reported") == "not reported":
        return result["annotation"]  # 讀自 convert 後的圖（或 "error"）
    return result["coverage"]["status"]


def cell(result: dict) -> str:
    return SHORT.get(status(result), status(result))


def x86_kernel(name: str) -> str:
    result = results[name]["x86"]
    if name in compiled:
        post_ops = compiled[name]["post_ops"]
        kernels = ["+".join([k.split("::")[1], *post_ops[k]]) for k in sorted(post_ops)]
        return ", ".join(kernels) + " (compiled)"
    where = result.get("op", "error").split(": ", 1)[-1]
    if where == "absent" and result["float"]:  # 被分解了：執行的是它的浮點數 kernel
        where = ", ".join(sorted(result["float"]))
    return where + (" (compiled)" if result.get("path") == "compiled" else "")


def xnnpack_node(result: dict) -> str:
    if "delegated" not in result:
        return "error"
    return "delegate" if result["delegated"] else "portable"


def openvino_ran(result: dict) -> str:
    found = set(result.get("precisions", {}).values()) - {"i32", "i64"}  # 形狀的計算
    return "/".join(sorted(found)) or ("error" if "error" in result else "—")


header = ("op", "x86", "x86 kernel", "XNNPACK", "XNNPACK node", "OpenVINO", "OpenVINO ran", "Arm")
rows = [header]
for name, r in results.items():
    x86, xnnpack, openvino, arm = (r[q] for q in atlas.QUANTIZERS)
    rows.append(
        (
            name,
            cell(x86),
            x86_kernel(name),
            cell(xnnpack),
            xnnpack_node(xnnpack),
            cell(openvino),
            openvino_ran(openvino),
            cell(arm),
        )
    )
widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
for row in rows:
    print("  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip())

# %%
# 步驟 3 — x86：檢查規則
# ----------------------
# ``X86InductorQuantizer`` （torchao 的 ``x86_inductor_quantizer.py`` ）依這些規則標註：
#
# 1. conv2d、linear，以及兩個形狀相同的張量的 ``mul`` 是 int8（它的
#    ``default_quantizable_ops`` ）：兩個 conv 的輸出相乘，或語言模型 SwiGLU 的
#    ``silu(w1 x) * w3 x`` 都是；有一個輸入會廣播的 mul 則不是（ConvNeXt 的 layer scale γ、
#    旋轉位置編碼的 ``cos`` 與 ``sin`` ）：它比較兩個形狀，就像下面的 ``broadcasts`` 。
#    conv1d 只在後面接著 ``nn.ReLU`` 時才是。
# 2. 緊接在 conv 或 linear 後面的活化模組會融合進去，依兩份清單：conv 後面是 ``nn.ReLU`` 、
#    ``nn.ReLU6`` （hardtanh）、 ``nn.Hardswish`` 、 ``nn.SiLU`` ；linear 後面是 ``nn.ReLU`` 、
#    ``nn.LeakyReLU`` 、 ``nn.Tanh`` 、 ``nn.GELU`` 。直接接在自己的 conv 或 linear 後面的
#    ``add`` 也會融合（連同它後面的 ReLU）。
# 3. max_pool2d、cat、avg_pool2d、adaptive_avg_pool2d 與 flatten 的輸入來自量化過的運算時，
#    讓 int8 直接通過（ ``int8_in_int8_out_ops`` ）。
# 4. 其他都留在浮點數：正規化（展開寫的 RMSNorm 也是）、重新取樣、歸約、其他活化函式、
#    conv_transpose2d（x86 沒有轉置 conv 的 int8 運算）、matmul、attention 與 KV 快取的寫入。

X86_INT8 = {"conv2d", "linear", "mul"}
X86_AFTER_CONV = {"relu", "hardtanh", "hardswish", "silu", "add"}
X86_AFTER_LINEAR = {"relu", "leaky_relu", "tanh", "gelu", "add"}
X86_SHARED = {"max_pool2d", "cat", "avg_pool2d", "adaptive_avg_pool2d", "flatten"}


def after_linear(item) -> bool:
    return isinstance(item.build(), atlas.BetweenLinears) or "linear" in item.name


def broadcasts(item) -> bool:
    if item.op != "mul":
        return False
    graph = torch.export.export(item.build(), item.example_args()).graph
    muls = atlas.nodes_of(item, graph)
    shapes = [{tuple(a.meta["val"].shape) for a in n.args[:2]} for n in muls]
    return any(len(pair) > 1 for pair in shapes)  # torchao 的 _same_shape，逐一檢查每個 mul


def x86_rule(item) -> str:
    if item.op in X86_INT8 and not broadcasts(item):
        return "int8 static"
    if item.op in (X86_AFTER_LINEAR if after_linear(item) else X86_AFTER_CONV):
        return "int8 fused"
    if item.op in X86_SHARED:
        return "int8 shared"
    return "float"


x86_wrong = {
    item.name: (status(results[item.name]["x86"]), x86_rule(item))
    for item in atlas.ENTRIES
    if status(results[item.name]["x86"]) != x86_rule(item)
}
print(x86_wrong or "x86：每個運算都如規則所說")
assert not x86_wrong, "x86 依它的規則標註每個運算"

# %%
# 實際執行的情形也和規則一致，只有兩個運算與一個 weight 例外。每個 int8 conv 與 linear 都執行了
# oneDNN 的 int8 kernel，每個融合的運算都以該 kernel 的 post-op（ ``relu`` 、 ``gelu`` 、
# ``add`` ）執行，讀自 oneDNN 對那次呼叫的紀錄；linear 後面的 Tanh 與 LeakyReLU 除外：標註為
# 融合，qlinear 卻沒有它們的 post-op。quantizer 把 Linear + Tanh 與 Linear + LeakyReLU 各當成
# 一個模式標註，但 inductor 的 int8 linear 融合只有 ReLU 與 GELU 的 post-op，所以 Tanh 或
# LeakyReLU 在 inductor 的浮點數迴圈裡、對 linear 的浮點數輸出計算。lowering 本身只融合了
# ReLU 與 add（步驟 2）：其他融合的運算在 lowering 後的圖裡仍然完整，那一列讀的是編譯後的那次
# 呼叫。融合的那幾列：

LOWERING_FUSES = {"relu", "add"}
NO_POST_OP = {"tanh", "leaky_relu"}
SHARED_WEIGHT = "linear · weight shared"

outside = []  # 運算在 int8 kernel 之外執行的融合列
for item in atlas.ENTRIES:
    r = results[item.name]["x86"]
    if status(r) == "int8 static" and item.op != "mul":
        assert r["op"].startswith("oneDNN"), f"{item.name}：執行了 oneDNN 的 int8 kernel"
        assert ("fp32" in r["op"]) == (item.name == SHARED_WEIGHT), f"{item.name}：全是 int8"
    if status(r) != "int8 fused":
        continue
    if item.op not in LOWERING_FUSES:
        assert r["op"].startswith("loop"), f"{item.name}：lowering 讓這個運算保持完整"
    where = r["op"]
    if item.name in compiled:  # 編譯後那次呼叫執行的 post-op
        post_ops = {op for ops in compiled[item.name]["post_ops"].values() for op in ops}
        if item.op in NO_POST_OP:
            assert item.op not in post_ops, f"{item.name}：這個運算在 kernel 之外執行"
            outside.append(item.name)
            continue
        where = "fused: " + ", ".join(sorted(post_ops)) + " (compiled)"
    assert where.startswith("fused: ") and item.op in where.replace("sum", "add"), (
        f"{item.name}：是 int8 kernel 的 post-op"
    )
    print(f"{item.name:26} {where}")
print(f"標註為融合、qlinear 卻沒有它們的 post-op：{', '.join(outside)}")
assert outside == ["leaky_relu · after linear", "tanh"], "linear 後面的 Tanh 與 LeakyReLU"

# %%
# 在 convert 後的圖裡，融合的運算前面沒有 quantize／dequantize：x86 讓 linear 的輸出以浮點數
# 交給 GELU，oneDNN 再在 int8 linear 裡面算它。

gelu = atlas.entry("gelu")
draw(atlas.quantize(gelu, "x86"), highlight=["linear", "gelu"], title="x86：linear + GELU，融合")

# %%
# 其他運算為什麼留在浮點數，用 quantizer 的規則說（ ``coverage`` 的原因）：

why_float = Counter(
    results[item.name]["x86"]["coverage"]["reason"]["zh_TW"]
    for item in atlas.ENTRIES
    if results[item.name]["x86"]["coverage"]["status"] == "float"
)
for reason, count in why_float.most_common():
    print(f"×{count:<3}{reason}")

# %%
# 那個 weight：同一個 ``nn.Linear`` 在遞迴單元的兩個步驟各呼叫一次
# （ ``linear · weight shared`` 那一列；用 ``nn.Linear`` 寫的類 GRU 單元，每個步驟都會呼叫
# 它的 weight）。兩次呼叫都標註為 int8，lowering 後也執行兩個 int8 kernel；編譯後卻以浮點數
# 執行（ ``aten::addmm`` ），只有它們前面的 linear 是 int8。編譯在執行 freezing pass 之前會
# 合併相同的 node：同一個 int8 weight 的兩個 dequantize node 合併成一個有兩個使用者的 node，
# 而這些 pass 的 int8 weight 模式（只有一個使用者）比對不到它。

shared = results[SHARED_WEIGHT]["x86"]
print(f"{SHARED_WEIGHT}：{shared['path']}，int8 {shared['int8']}，float {shared['float']}")
assert shared["path"] == "compiled", "編譯後的呼叫：lowering 會以 int8 執行它們"
assert shared["int8"] == {"onednn::qlinear_pointwise": 1}, "它們前面的 linear 是 int8"
assert shared["float"] == {"aten::addmm": 2}, "共用 weight 的兩次讀取都以浮點數執行"

# %%
# 解法是每個讀取者各有一個 int8 常數：讓每個步驟有自己的一份模組副本（數值相同，輸出也相同）。
# 編譯後，每個 linear 都以 int8 執行。

unrolled = atlas.entry(SHARED_WEIGHT)


def copy_per_step() -> nn.Module:
    model = unrolled.build()
    model.steps = nn.ModuleList(copy.deepcopy(step) for step in model.steps)
    return model


copied = atlas.Entry(
    "linear · weight copied", unrolled.ops, "a copy per step", copy_per_step, unrolled.shape
)
x = unrolled.example_args()
assert torch.equal(copy_per_step()(*x), unrolled.build()(*x)), "輸出相同"
fixed = atlas.x86_compiled(copied)
print(f"副本：int8 {fixed['int8']}，float {fixed['float']}")
assert fixed["int8"] == {"onednn::qlinear_pointwise": 3} and not fixed["float"], "全是 int8"

# %%
# 步驟 4 — XNNPACK：委派，或為什麼沒有
# -------------------------------------
# ``XNNPACKQuantizer`` 依它自己的規則標註（它的 ``SUPPORTED_PATTERNS`` 與
# ``propagate_annotation`` ）：
#
# 1. 每個 conv（1-D、2-D、depthwise、轉置）、linear、add 與 mul 都是 int8，各有自己的模式；
#    緊接在 conv 或 linear 後面的 ReLU 會融合進去。
# 2. cat、max_pool2d、adaptive_avg_pool2d、hardtanh、mean 與 layout 運算（只搬移資料的運算：
#    flatten、reshape、permute、transpose、slice），以及 eval 模式的 dropout，共用輸入的
#    qparams。除了對 H 與 W 取平均、keepdim 的 4-D mean，其他 mean 都會被 XNNPACK 的
#    partitioner 拒絕，改在 portable kernel 上以浮點數執行： ``coverage`` 把它算成浮點數。
# 3. 其他都留在浮點數，scaled_dot_product_attention 也是：quantizer 沒有在它身上標註任何東西。
#    夾在 int8 linear 之間時，它讀的是它們 dequantize 後的輸出，它的輸出也會為下一個 linear
#    量化，但它自己的計算沒有一項是 int8（見下方）。

XNNPACK_INT8 = {"conv1d", "conv2d", "conv_transpose2d", "linear", "add", "mul"}
XNNPACK_SHARED = {"cat", "max_pool2d", "adaptive_avg_pool2d", "hardtanh", "mean"}
XNNPACK_SHARED |= {"flatten", "reshape", "permute", "transpose", "slice", "dropout"}


def xnnpack_rule(item) -> str:
    if item.op in XNNPACK_INT8:
        return "int8 static"
    if item.op == "relu":
        return "int8 fused"
    if item.op == "mean" and item.name != "mean · keepdim":
        return "float"  # 有標註，卻被 partitioner 拒絕：portable，浮點數
    return "int8 shared" if item.op in XNNPACK_SHARED else "float"


xnnpack_wrong = {
    item.name: (status(results[item.name]["xnnpack"]), xnnpack_rule(item))
    for item in atlas.ENTRIES
    if status(results[item.name]["xnnpack"]) != xnnpack_rule(item)
}
print(xnnpack_wrong or "XNNPACK：每個運算都如規則所說")
assert not xnnpack_wrong, "XNNPACK 依它的規則標註每個運算"

# %%
# 所以 scaled_dot_product_attention 是夾在 int8 linear 之間的浮點數運算。XNNPACK 的 delegate
# 以 int8 接手那些 linear，也以 ``bmm`` 接手 attention 的兩個矩陣乘法，但 XNNPACK 只有 ``bmm``
# 的浮點數 kernel（ ``common.edge.SUPPORTED`` ），算的是 dequantize 後的 q、k、v；它的 softmax
# 也是浮點數，它的縮放與遮罩運算則在 portable kernel 上執行。

sdpa = results["scaled_dot_product_attention"]["xnnpack"]
in_xnnpack = {re.sub(r"^aten_|_default(_\d+)?$", "", n) for n in chain(*sdpa["delegates"].values())}
print(f"scaled_dot_product_attention：{cell(sdpa)}（夾在 int8 linear 之間）")
print(f"  XNNPACK：{', '.join(sorted(in_xnnpack & {'linear', 'bmm', '_softmax'}))}")
print(f"  portable：{', '.join(sdpa['portable'])}")
assert status(sdpa) == sdpa["annotation"] == "float", "XNNPACK 沒有在 SDPA 上標註任何東西"
assert {"linear", "bmm", "_softmax"} <= in_xnnpack, "linear、bmm 與 softmax 在 XNNPACK 裡"
assert not edge.SUPPORTED["bmm.default"].int8, "XNNPACK 的 bmm 只有浮點數版本"

# %%
# ``XnnpackPartitioner`` 在有 config 涵蓋某個運算、且該 config 的限制成立時接手它；拒絕的
# config 會記下原因（ ``WhyNoPartition`` ）。留在 portable kernel 上的運算，附上 XNNPACK 的
# 原因；XNNPACK 沒有 config 可記錄原因時，附上課程 partitioner 的表（ ``common.edge.PORTABLE`` ）。
# 照 Llama 寫法展開的 RMSNorm 在 XNNPACK 裡（以浮點數）執行，只有沿最後一軸的 mean 例外；
# KV 快取的寫入，在 edge graph 上是 ``index_put`` ，XNNPACK 沒有它的 config：

portable = {n: r["xnnpack"] for n, r in results.items() if r["xnnpack"].get("delegated") is False}
for name, r in portable.items():
    table = [edge.PORTABLE[k] for k in edge.PORTABLE if k.split(".")[0] in r["portable"]]
    reason = r["why"] or "; ".join(dict.fromkeys(table)) or "XNNPACK 沒有這個運算的 config"
    print(f"{name:30} {', '.join(r['portable'])[:30]:30} {reason}")
assert "mean · keepdim" not in portable, "4-D、對 H 與 W、keepdim 的 mean 在 XNNPACK 裡執行"
assert "mean · last axis" in portable, "對 3-D 張量最後一軸的 mean 則不會"
assert "layer_norm" in portable, "XNNPACK 沒有 layer norm"
rms_norm = portable["rms_norm · as Llama writes it"]
assert rms_norm["portable"] == ["mean"], "RMSNorm 的 pow 與 rsqrt 在 XNNPACK 裡執行，mean 則不是"
assert portable["index_copy_ · KV cache"]["portable"] == ["index_put"], "快取的寫入"

# %%
# 步驟 5 — OpenVINO 與 Arm
# ------------------------
# OpenVINO 的 CPU 外掛以 u8 執行每個 conv 與 linear。它的執行期模型還顯示了標註看不出的事：
# 有些 NNCF 沒有量化的運算照樣以 u8 執行（外掛把量化移過它們，或把它們融合進前面的 conv），
# 而標註為 int8 的 conv_transpose2d 卻以浮點數執行。 ``OpenVINOQuantizer`` 本身則在四個模型上
# 失敗：layer_norm 與 group_norm 在校準時（它放在正規化層 1-D weight 上的 observer 出錯：
# ``IndexError`` ），遞迴層（LSTM、GRU）在量化時（ ``TypeError`` ）。

openvino = {n: r["openvino"] for n, r in results.items()}
for name in ("conv2d", "linear", "conv1d"):
    assert set(openvino[name]["precisions"].values()) == {"u8"}, f"OpenVINO：{name} 以 u8 執行"
transposed = openvino["conv_transpose2d"]
print(transposed["precisions"])
assert status(transposed) == "int8 static", "標註為 int8"
assert "u8" not in transposed["precisions"].values(), "以浮點數執行"
refused = {n: r["error"] for n, r in openvino.items() if "error" in r}
print(refused)
assert set(refused) == {"layer_norm", "group_norm", "lstm", "gru"}
assert refused["layer_norm"].startswith("IndexError"), "正規化層在校準時失敗"

# %%
# ``ArmInductorQuantizer`` 繼承 ``X86InductorQuantizer`` ，配方較窄、設定是自己的（int8
# 活化值、per-tensor weight）：conv2d 與 linear 是 int8，只有 x86 的一部分融合模式，沒有讓 int8
# 直接通過的運算。它量化的每個運算，x86 也都量化：

arm = Counter(status(r["arm"]) for r in results.values())
print(dict(arm))
arm_int8 = {n for n, r in results.items() if status(r["arm"]) != "float"}
x86_int8 = {n for n, r in results.items() if status(r["x86"]) != "float"}
print(sorted(arm_int8))
assert arm_int8 <= x86_int8, "x86 留在浮點數的運算，Arm 一個也沒有量化"
assert "int8 shared" not in arm

# %%
# 小結
# ----
# - x86：conv2d、linear、形狀相同的 mul 是 int8（會廣播的 mul 是浮點數）；ReLU、ReLU6、
#   Hardswish、SiLU 在 conv 後面融合，ReLU、LeakyReLU、Tanh、GELU 在 linear 後面融合，add 在
#   自己的 conv 或 linear 後面融合；max_pool2d、cat、avg_pool2d、adaptive_avg_pool2d、flatten
#   讓 int8 直接通過；其餘是浮點數。
#   實際執行：每個融合的運算都是 oneDNN 的 post-op（lowering 融合 ReLU 與 add，其他的由編譯
#   融合），只有 linear 後面的 Tanh 與 LeakyReLU 被 inductor 留在浮點數迴圈裡；編譯後，讀同一個
#   weight 的那些 linear 以浮點數執行：每個讀取者要有自己的 int8 常數。
# - XNNPACK：conv、linear、add、mul 是 int8，ReLU 融合，最大池化、cat 與 layout 運算共用 qparams；
#   SDPA 是夾在 int8 linear 之間的浮點數；留在 portable 的運算，不是沒有 config 涵蓋，就是被
#   限制拒絕（mean 只接受 4-D 張量、對 H 與 W、keepdim）。
# - OpenVINO：conv 與 linear 以 u8 執行；其他運算要看執行期模型，不是看標註。
# - Arm：只有標註；是 x86 的子集。
#
# 練習
# ----
# 1. 把 ``nn.SiLU`` 放在兩個 linear 之間，而不是兩個 conv 之間。預測 x86 的標註。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from torch import nn
#
#          silu = atlas.Entry(
#              "silu · after linear",
#              ("silu",),
#              "between linears",
#              lambda: atlas.BetweenLinears(nn.SiLU()).eval(),
#              atlas.TOKENS,
#          )
#          fate = atlas.reported(silu, "x86")
#          print(fate["reason"]["zh_TW"])
#          assert fate["status"] == "float", "SiLU 只在 conv 後面融合"
#
# 2. 把 Inception v3 的池化分支 ``nn.AvgPool2d(3, stride=1, padding=1)`` 放在兩個 conv 之間
#    （圖鑑的 ``avg_pool2d`` 沒有 padding）。預測 XNNPACK 會不會委派它；再換成
#    ``count_include_pad=False`` 預測一次。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          def branch_pool(include_pad: bool) -> atlas.Entry:
#              pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=include_pad)
#              return atlas.Entry(
#                  f"avg_pool2d · padding 1, count_include_pad={include_pad}",
#                  ("avg_pool2d",),
#                  "between convs (Inception v3's pool branch)",
#                  lambda: atlas.BetweenConvs(pool).eval(),
#                  atlas.IMAGE,
#              )
#
#
#          for include_pad in (True, False):
#              pool = branch_pool(include_pad)
#              ran = atlas.xnnpack_runs(pool, atlas.quantize(pool, "xnnpack"))
#              print(f"count_include_pad={include_pad}：委派 {ran['delegated']} {ran['why']}")
#              assert ran["delegated"] is not include_pad, "XNNPACK 只對真實的像素取平均"
#
# 延伸閱讀
# --------
# - `X86InductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `XNNPACK partitioner 的 config
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/partition/config>`_
#
# 下一課
# ------
# :ref:`M07-5 · 換來更多 int8 的改寫 <sphx_glr_lessons_m07_your_model_m07_5_rewrites_for_int8.py>`
# 用五個不改變輸出的改寫，讓圖鑑裡留在浮點數的幾個運算成為 int8。
