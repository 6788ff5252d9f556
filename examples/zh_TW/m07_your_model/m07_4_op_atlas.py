"""
M07-4 運算圖鑑
==============

conv 與 linear 之間的那些運算，量化後會怎樣？每個運算一個小模型（conv1d、conv2d、
conv_transpose2d、linear、matmul、bmm、scaled_dot_product_attention、embedding、add、sub、
mul、div、cat、max_pool2d、avg_pool2d、adaptive_avg_pool2d、mean、sum、relu、hardtanh、
leaky_relu、gelu、silu、mish、hardswish、hardsigmoid、sigmoid、tanh、softmax、clamp、
layer_norm、group_norm、batch_norm、upsample_nearest2d、upsample_bilinear2d、pixel_shuffle、
pad、flatten、reshape、permute、transpose、slice、split、dropout、lstm、gru），各自放在真實
模型擺放它的位置，交給這台機器上跑得動的每個 quantizer，再追到實際執行它的地方：x86 上的
oneDNN kernel 或 inductor 的迴圈、XNNPACK delegate 或 ExecuTorch 的 portable kernel、OpenVINO
CPU 外掛實際執行的精度。表中每一格都讀自實際的執行，並對照本頁寫明的規則檢查；新版本改變了
某個運算的命運，這一頁就會建置失敗。

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
# 量化一個條目，再追到執行它的地方；結果是單純的資料，存在課程的快取裡，鍵值包含模型、讀取的
# 程式碼、安裝的套件版本與 CPU 的 kernel 路徑（其中沒有任何計時）。

import importlib
from collections import Counter

from common.pt2e import quiet

quiet()

from common import atlas, edge
from common.cpu import describe
from common.kernels import native_stderr_silenced
from common.viz import draw

# sphinx_gallery_start_ignore
# ExecuTorch 的 OpenVINO 套件會匯入 pytorch_tokenizers，它的 C++ 擴充在載入時往行程的 stderr
# 寫一行記錄：不讓它進入建置記錄。
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
    print(f"{item.name:30} {item.where}")
after = {n: results[n]["x86"]["coverage"]["status"] for n in ("gelu", "gelu · after conv")}
print(after)
assert after == {"gelu": "int8 fused", "gelu · after conv": "float"}, "GELU 只在 linear 後面融合"


# %%
# 步驟 2 — 圖鑑
# -------------
# 每個運算一列。 **x86** 、 **XNNPACK** 、 **OpenVINO** 、 **Arm** ：quantizer 怎麼處理這個
# 運算，依 ``coverage`` （M07-1）的報告： ``int8`` （以 int8 輸入計算）、 ``fused`` （在前面
# 的 int8 conv 或 linear 裡以 post-op 執行）、 ``shared`` （int8 直接通過，輸出的 scale 與
# zero point 和輸入相同）或 ``float`` 。 **x86 kernel** ：它在哪裡執行，以 ``kernels_run``
# 讀出：oneDNN kernel 與 oneDNN 實際執行的 post-op、 ``loop u8→u8`` （夾在 dequantize 與
# quantize 之間的運算：inductor 的迴圈直接讀寫 uint8）、浮點數 kernel，或 ``loop fp32``
# （inductor 的浮點數迴圈）；lowering 會分解的運算（attention、循環層）則列出它的模型執行的
# 浮點數 kernel，其中包括它周圍的 3-D linear（lowering 把它們留給 ``aten::addmm`` ）。
# **XNNPACK node** ：在 XNNPACK delegate 裡，或在 ExecuTorch 的
# portable kernel 上。 **OpenVINO ran** ：OpenVINO 的 CPU 外掛以什麼精度執行這個運算的層
# （浮點數層在有 bf16 的 CPU 上用 bf16，否則用 f32）。 **Arm** ：只有標註：x86 機器上沒有
# 東西能執行 Arm 的 int8 圖（M07-3）。
#
# x86 的圖以 ``lower_pt2e_quantized_to_x86`` （inductor 的 freezing pass，每個大約一秒）
# lowering 後直接執行，不編譯：每個模型都 ``torch.compile`` 會讓這一頁的建置時間成倍增加。
# 這些 pass 預先打包 int8 conv 與 linear，並融合 ReLU；quantizer 融合的 GELU、SiLU、
# Hardswish、Tanh 或 ReLU6，則由編譯時接在它們之後的 pass 融合。quantizer 融合了、lowering 卻
# 沒有融合的運算，以及 lowering 後的圖無法直接執行的地方（conv + add：oneDNN 要求殘差輸入是
# channels-last；flatten：它的 ``view`` 不接受 int8 conv 的 channels-last 輸出），那一列會註明
# ``compiled`` ：只有那個模型以 freezing 編譯
# （ ``atlas.x86_compiled`` ），讀取它的那次呼叫。

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
#    ``default_quantizable_ops`` ）；conv1d 只在後面接著 ``nn.ReLU`` 時才是。
# 2. 緊接在 conv 或 linear 後面的活化模組會融合進去，依兩份清單：conv 後面是 ``nn.ReLU`` 、
#    ``nn.ReLU6`` （hardtanh）、 ``nn.Hardswish`` 、 ``nn.SiLU`` ；linear 後面是 ``nn.ReLU`` 、
#    ``nn.LeakyReLU`` 、 ``nn.Tanh`` 、 ``nn.GELU`` 。直接接在自己的 conv 或 linear 後面的
#    ``add`` 也會融合（連同它後面的 ReLU）。
# 3. max_pool2d、cat、avg_pool2d、adaptive_avg_pool2d 與 flatten 的輸入來自量化過的運算時，
#    讓 int8 直接通過（ ``int8_in_int8_out_ops`` ）。
# 4. 其他都留在浮點數：正規化、重新取樣、歸約、其他活化函式、conv_transpose2d（x86 沒有
#    轉置 conv 的 int8 運算）、matmul 與 attention。

X86_INT8 = {"conv2d", "linear", "mul"}
X86_AFTER_CONV = {"relu", "hardtanh", "hardswish", "silu", "add"}
X86_AFTER_LINEAR = {"relu", "leaky_relu", "tanh", "gelu", "add"}
X86_SHARED = {"max_pool2d", "cat", "avg_pool2d", "adaptive_avg_pool2d", "flatten"}


def after_linear(item) -> bool:
    return isinstance(item.build(), atlas.BetweenLinears) or "linear" in item.name


def x86_rule(item) -> str:
    if item.op in X86_INT8 and item.name != "mul · layer scale":  # γ 會廣播：形狀不同
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
# 實際執行的結果一致，只有一個運算例外：每個 int8 conv 與 linear 都執行了 oneDNN 的 int8
# kernel，每個融合的運算都以該 kernel 的 post-op（ ``relu`` 、 ``gelu`` 、 ``add`` ）執行，
# 讀自 oneDNN 對那次呼叫的記錄；linear 後面的 Tanh 除外：quantizer 把 Linear + Tanh 當成一個
# 模式標註，但 inductor 的 int8 linear 融合沒有 Tanh 這個 post-op，所以 Tanh 在 inductor 的
# 浮點數迴圈裡、對 linear 的浮點數輸出計算。融合的那幾列：

NO_POST_OP = {"tanh"}

for item in atlas.ENTRIES:
    r = results[item.name]["x86"]
    if status(r) == "int8 static" and item.op != "mul":
        assert r["op"].startswith("oneDNN"), f"{item.name}：執行了 oneDNN 的 int8 kernel"
    if status(r) != "int8 fused":
        continue
    where = r["op"]
    if item.name in compiled:  # 編譯後那次呼叫執行的 post-op
        post_ops = {op for ops in compiled[item.name]["post_ops"].values() for op in ops}
        if item.op in NO_POST_OP:
            assert item.op not in post_ops, "linear + tanh 的 tanh 在 kernel 之外執行"
            continue
        where = "fused: " + ", ".join(sorted(post_ops)) + " (compiled)"
    assert where.startswith("fused: ") and item.op in where.replace("sum", "add"), (
        f"{item.name}：是 int8 kernel 的 post-op"
    )
    print(f"{item.name:24} {where}")

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
# 步驟 4 — XNNPACK：委派，或為什麼沒有
# -------------------------------------
# ``XNNPACKQuantizer`` 依它自己的規則標註（它的 ``SUPPORTED_PATTERNS`` 與
# ``propagate_annotation`` ）：
#
# 1. 每個 conv（1-D、2-D、depthwise、轉置）、linear、add 與 mul 都是 int8，各有自己的模式；
#    緊接在 conv 或 linear 後面的 ReLU 會融合進去。
# 2. cat、max_pool2d、adaptive_avg_pool2d、hardtanh、mean 與版面運算（flatten、reshape、
#    permute、transpose、slice），以及 eval 模式的 dropout，共用輸入的 qparams。XNNPACK 的
#    partitioner 接著拒絕的 mean（4-D、對 H 與 W、keepdim 以外的都是）在 portable kernel 上
#    以浮點數執行： ``coverage`` 把它算成浮點數。
# 3. 其他都留在浮點數，scaled_dot_product_attention 除外：它的 q、k、v 與輸出都是 linear
#    量化過的張量，所以讀起來是 int8。

XNNPACK_INT8 = {"conv1d", "conv2d", "conv_transpose2d", "linear", "add", "mul"}
XNNPACK_SHARED = {"cat", "max_pool2d", "adaptive_avg_pool2d", "hardtanh", "mean"}
XNNPACK_SHARED |= {"flatten", "reshape", "permute", "transpose", "slice", "dropout"}


def xnnpack_rule(item) -> str:
    if item.op in XNNPACK_INT8 or item.op == "scaled_dot_product_attention":
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
# ``XnnpackPartitioner`` 在有 config 涵蓋某個運算、且該 config 的限制成立時接手它；拒絕的
# config 會記下原因（ ``WhyNoPartition`` ）。留在 portable kernel 上的運算，附上 XNNPACK 的
# 原因；XNNPACK 沒有 config 可記錄原因時，附上課程 partitioner 的表（ ``common.edge.PORTABLE`` ）：

portable = {n: r["xnnpack"] for n, r in results.items() if r["xnnpack"].get("delegated") is False}
for name, r in portable.items():
    table = [edge.PORTABLE[k] for k in edge.PORTABLE if k.split(".")[0] in r["portable"]]
    reason = r["why"] or "; ".join(dict.fromkeys(table)) or "XNNPACK 沒有這個運算的 config"
    print(f"{name:30} {', '.join(r['portable'])[:30]:30} {reason}")
assert "mean · keepdim" not in portable, "4-D、對 H 與 W、keepdim 的 mean 在 XNNPACK 裡執行"
assert "mean · last axis" in portable, "對 3-D 張量最後一軸的 mean 則不會"
assert "layer_norm" in portable, "XNNPACK 沒有 layer norm"

# %%
# 步驟 5 — OpenVINO 與 Arm
# ------------------------
# OpenVINO 的 CPU 外掛以 u8 執行每個 conv 與 linear。它的執行期模型還顯示了標註看不出的事：
# 有些 NNCF 沒有量化的運算照樣以 u8 執行（外掛把量化移過它們，或把它們融合進前面的 conv），
# 而標註為 int8 的 conv_transpose2d 卻以浮點數執行。 ``OpenVINOQuantizer`` 本身則在四個模型上
# 失敗：layer_norm 與 group_norm 在校準時（它放在正規化層 1-D weight 上的 observer 出錯：
# ``IndexError`` ），循環層在量化時（ ``TypeError`` ）。

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
# 活化值、per-tensor weight）：conv2d 與 linear 是 int8，有 x86 的部分融合，沒有讓 int8 直接
# 通過的運算。它量化的每個運算，x86 也都量化：

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
# - x86：conv2d、linear、形狀相同的 mul 是 int8；ReLU、ReLU6、Hardswish、SiLU 在 conv 後面
#   融合，ReLU、LeakyReLU、Tanh、GELU 在 linear 後面融合，add 在自己的 conv 或 linear 後面
#   融合；max_pool2d、cat、avg_pool2d、adaptive_avg_pool2d、flatten 讓 int8 通過；其餘是浮點數。
#   實際執行：每個融合的運算都是 oneDNN 的 post-op，只有 Tanh 被 inductor 留在浮點數迴圈裡。
# - XNNPACK：conv、linear、add、mul 是 int8，ReLU 融合，最大池化、cat 與版面運算共用 qparams；
#   留在 portable 的運算，不是沒有 config 涵蓋，就是被限制拒絕（mean 只接受 4-D 張量、對 H
#   與 W、keepdim）。
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
# 2. 把關鍵字偵測模型的 mean 改成 4-D、對 H 與 W、keepdim 的 mean
#    （ ``entry("mean · keepdim")`` ）交給 XNNPACK。預測它會不會被委派。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          keepdim = atlas.entry("mean · keepdim")
#          ran = atlas.xnnpack_runs(keepdim, atlas.quantize(keepdim, "xnnpack"))
#          assert ran["delegated"], "XNNPACK 的全域平均池化接手了它"
#
# 延伸閱讀
# --------
# - `X86InductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `XNNPACK partitioner 的 config
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/partition/config>`_
#
# 下一步
# ------
# M07 到此結束；疑難排解的條目從你自己的模型可能引發的錯誤出發，例如 :ref:`疑難排解：prepare
# 與 convert <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` 。
