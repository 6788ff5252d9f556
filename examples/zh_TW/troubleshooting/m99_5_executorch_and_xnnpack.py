"""
疑難排解：ExecuTorch 與 XNNPACK
===============================

``convert_pt2e`` 之後，從輸出 ``.pte`` 到在 ExecuTorch 執行環境上執行，一路上會遇到的問題：
無法輸出的程式、無法載入的 delegate、沒有任何 Python 錯誤就當掉的行程、weight 從未量測過的
動態模型，以及在梯度模式開著時匯出、KV 快取讓 ``to_executorch()`` 失敗的語言模型。每個條目以
錯誤訊息第一行的原文（或讀者描述的症狀）為標題，並在本站的環境（torch 2.13、torchao 0.18、
executorch 1.5.1）上重現它；若是讀者在較舊版本回報、這裡已不再發生的錯誤，條目會說明這一點並
實際示範。每個條目都指出原因，以 assert 驗證修正方法，並連到解釋它的那一課。

**先備知識**：無；每個條目都連到解釋它的那一課。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 本頁用到三樣東西：per-channel weight 的 ``XNNPACKQuantizer`` （和 M06 的用法相同）、M06-2
# 的 lowering（ ``to_edge_transform_and_lower`` 搭配 ``XnnpackPartitioner`` ，再
# ``to_executorch()`` ），以及在 ExecuTorch 執行環境上載入並執行 ``.pte`` 的 ``run`` 。執行環境
# 會把讀到的 CPU 資訊與 delegate 失敗的原因寫到 stderr： ``run`` 把這些紀錄攔下來，不印在頁面
# 上，而是交給呼叫者。

import contextlib
import copy
import io
import re
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from common.expect import expect_error
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.runtime import Runtime
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerGroup
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import delegated, to_executorch
from common.runtime import load_check, operators_run

qd = torch.ops.quantized_decomposed


def quantized(model, args, *, calibrate=True, **options) -> torch.fx.GraphModule:
    """讓 ``model`` 經過 ``XNNPACKQuantizer`` ：prepare、在 ``args`` 上執行一次、convert。"""
    config = get_symmetric_quantization_config(is_per_channel=True, **options)
    prepared = prepare_pt2e(export_module(model, args), XNNPACKQuantizer().set_global(config))
    if calibrate:
        with torch.no_grad():
            prepared(*args)
    return convert_pt2e(prepared)


def lowered(model, args):
    """M06-2 的 lowering：先切出 XNNPACK delegate，再產生 ExecuTorch 程式。"""
    program = torch.export.export(model, args)
    return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()


def run(pte: bytes, args, log: io.StringIO | None = None) -> torch.Tensor:
    """在 ExecuTorch 執行環境上載入 ``pte`` 並執行 ``forward`` ；紀錄寫進 ``log`` 。"""
    with contextlib.redirect_stderr(log or io.StringIO()):
        program = Runtime.get().load_program(pte)
        method = program.load_method("forward")  # ``method`` 執行期間 ``program`` 都還活著
        return method.execute(list(args))[0]


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


torch.manual_seed(0)
net = SmallNet().eval()
x = (torch.randn(2, 3, 8, 8),)
qdq = quantized(net, x)

# %%
# RuntimeError: Missing out variants
# ----------------------------------
# 量化後的程式若沒有任何部分交給 delegate（ ``to_edge(...)`` 之後直接 ``.to_executorch()`` ，
# 沒有 partitioner），就無法輸出。訊息後面接著 quantize 與 dequantize 運算的集合，每次執行的
# 順序都不同： ``{'quantized_decomposed::dequantize_per_tensor', ...}`` （executorch#1263、#7775、
# #8369）。

edge = to_edge(torch.export.export(qdq, x))
with expect_error(RuntimeError, match="Missing out variants") as caught:
    edge.to_executorch()

# %%
# **原因**： ``to_executorch()`` 把每個運算換成它的「out 變體」，也就是把結果寫進記憶體規劃
# 預先配置好的位置的那個 kernel；out 變體要從這個行程已註冊的 kernel 裡找。portable kernel
# 涵蓋 ``aten`` ；q/dq 運算的 out 變體則在另一個函式庫 ``executorch.kernels.quantized`` 裡，
# 而它還沒有被載入。
# 缺少的運算正好就是圖中的 q/dq 運算：

missing = set(re.findall(r"'([\w:]+)'", caught.message))
in_graph = {
    f"quantized_decomposed::{n.target.__name__.split('.')[0]}"
    for n in qdq.graph.nodes
    if n.op == "call_function" and "quantized_decomposed" in str(n.target)
}
print(f"缺少：{sorted(missing)}")
assert missing == in_graph, "正是圖中的 quantize 與 dequantize 運算，沒有別的"

# %%
# **修正**：用 ``XnnpackPartitioner`` 下放，q/dq node 就會進入 XNNPACK delegate，由它以 int8
# 張量執行，不會輸出任何 q/dq kernel（ :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>` ）。若想改用 portable
# kernel 執行 q/dq 圖（逐個運算，算法和 q/dq 模型相同），先
# ``import executorch.kernels.quantized`` ，註冊這些 out 變體。

delegate = lowered(qdq, x)
assert (run(delegate.buffer, x) - qdq(*x)).abs().max() < 0.05, "XNNPACK：接近 q/dq 模型"
with contextlib.redirect_stderr(io.StringIO()):
    import executorch.kernels.quantized
portable = edge.to_executorch()
assert torch.equal(run(portable.buffer, x), qdq(*x)), "portable kernel：與 q/dq 模型的值相同"

# %%
# RuntimeError: Missing out variants: {\'torchao::dequantize_affine\'}
# --------------------------------------------------------------------
# 模型若用 torchao 的 ``quantize_`` 只量化 weight（這裡是 int8 weight 的
# ``IntxWeightOnlyConfig`` ），再不經 partitioner 交給 ``to_edge`` ，同樣無法輸出；剛才載入的
# ``executorch.kernels.quantized`` 也幫不上忙（executorch#10663）。

torch.manual_seed(0)
linear = nn.Sequential(nn.Linear(64, 32)).eval()
weight_only = copy.deepcopy(linear)
quantize_(weight_only, IntxWeightOnlyConfig())
tokens = (torch.randn(2, 64),)
weight_only_program = torch.export.export(weight_only, tokens)
with expect_error(RuntimeError, match="Missing out variants: {'torchao::dequantize_affine'}"):
    to_edge(weight_only_program).to_executorch()

# %%
# **原因**： ``quantize_`` 把 weight 換成張量子類別；export 把它的反量化寫成
# ``torchao.dequantize_affine`` ，這是 torchao 自己的運算，不是 PT2E 的 ``quantized_decomposed``
# 運算；ExecuTorch 沒有任何 kernel 函式庫提供它的 out 變體，只有 delegate 能執行它。

ops = {str(n.target) for n in weight_only_program.graph.nodes if n.op == "call_function"}
print(sorted(ops))
assert "torchao.dequantize_affine.default" in ops, "torchao 自己的 dequantize 運算"

# %%
# **修正**：換一個 ``XnnpackPartitioner`` 讀得懂的配方再下放。只要活化值在執行時才量化成
# int8，它的 partitioner 就會收下 torchao 的 ``choose_qparams_affine`` 、 ``quantize_affine``
# 與 ``dequantize_affine`` ，就像收下 PT2E 的 q/dq 運算一樣。這個配方是 ``quantize_`` 搭配
# ``Int8DynamicActivationIntxWeightConfig`` （int8 動態活化值，4 或 8 位元的 weight；這裡是
# 4 位元、每 32 個一組），也是 ExecuTorch 自己匯出 LLM 時用的配方。整個程式落在同一個
# delegate 裡；它在執行環境上算出的值，和 ``quantize_`` 模型在 eager 下算的相差不到 0.01
# （光是 4 位元的 weight，就讓輸出離浮點 linear 遠了十倍）。

llm_recipe = copy.deepcopy(linear)
quantize_(
    llm_recipe,
    Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
)
llm_program = lowered(llm_recipe, tokens)
outside = [
    str(n.target) for n in llm_program.exported_program().graph.nodes if n.op == "call_function"
]
(inside,) = delegated(llm_program.exported_program()).values()
with torch.no_grad():
    eager, float_out = llm_recipe(*tokens), linear(*tokens)
error = (run(llm_program.buffer, tokens) - eager).abs().max().item()
rounding = (eager - float_out).abs().max().item()
print(f"delegate 之外：{outside}")
print(f"delegate 之內：{inside}")
print(
    f"執行環境與 quantize_ eager 的差距：{error:.5f}；quantize_ int4 與浮點的差距：{rounding:.5f}"
)
assert set(outside) == {"executorch_call_delegate", "<built-in function getitem>"}, "整個收進去"
assert "aten_linear_default" in inside and any("dequantize_affine" in n for n in inside)
assert error < 0.01 < rounding, "執行環境算出的就是 quantize_ 模型的值，差距在 0.01 以內"

# %%
# 也可以改用 PT2E 與 ``XNNPACKQuantizer`` 量化：XNNPACK 的 partitioner 會把它的 q/dq 運算收進
# delegate（上一個條目）。 ``is_dynamic=True`` 是同一類配方，只是 weight 只能是 int8。
# partitioner 怎麼挑選 node，見 :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>` 。

dynamic_linear = quantized(linear, tokens, is_dynamic=True)
error = (run(lowered(dynamic_linear, tokens).buffer, tokens) - dynamic_linear(*tokens)).abs()
print(f"XNNPACK 上的 PT2E 動態量化，與它的 q/dq 模型的最大差距：{error.max():.5f}")
assert error.max() < 0.01, "delegate 算出的就是 q/dq 模型算的"

# %%
# 只量化 weight 的配方則不行。 ``XnnpackPartitioner`` 同樣會把這種模型的 ``dequantize_affine``
# → ``linear`` 收進 delegate，程式也能輸出、能執行；但在本站的環境上，它的輸出和 ``quantize_``
# 模型相差很遠：算出來的是輸入乘上沒有乘回 scale 的 int8 weight，再加上 bias，也就是 delegate
# 丟掉了 weight 的 scale。交付這樣的程式之前，先檢查它的數值。

weight = weight_only[0].weight  # torchao 的張量子類別：int8 的 ``qdata`` ，每列一個 scale
out = run(lowered(weight_only, tokens).buffer, tokens)
error = (out - weight_only(*tokens)).abs().max().item()
print(f"XNNPACK 上的 quantize_，與 quantize_ 模型的最大差距：{error:.1f}")
unscaled = tokens[0] @ weight.qdata.float().T + weight_only[0].bias
assert error > 1 and torch.allclose(out, unscaled, atol=1e-3), "是 int8 的值，沒有乘上 scale"

# %%
# AttributeError: \'OutDtypeOperator\' object has no attribute \'_schema\'
# ------------------------------------------------------------------------
# ``convert_pt2e(prepared, use_reference_representation=True)`` 把它認得的量化模式寫成它們
# 代表的整數算術。這樣的模型可以匯出，也能通過 ``to_edge_transform_and_lower``；接著
# ``to_executorch()`` 失敗（pytorch/pytorch#139718、executorch#6685）。這裡用「準備」一節的
# ``SmallNet``，weight 是 per-tensor：


def reference(model, args, *, per_channel: bool) -> torch.fx.GraphModule:
    """``model`` 經過 ``XNNPACKQuantizer``，convert 成 reference representation。"""
    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    prepared = prepare_pt2e(export_module(model, args), XNNPACKQuantizer().set_global(config))
    prepared(*args)
    with warnings.catch_warnings():  # 改寫呼叫了一個 torch 2.13 已棄用的 pytree API
        warnings.filterwarnings("ignore", r"`treespec\.children_specs`", FutureWarning)
        return convert_pt2e(prepared, use_reference_representation=True)


integer = reference(net, x, per_channel=False)
with expect_error(AttributeError, match="'OutDtypeOperator' object has no attribute '_schema'"):
    lowered(integer, x)

# %%
# **原因**：改寫用 ``out_dtype`` 計算 linear 的 int32 乘積、它的 bias 與重新縮放。
# ``out_dtype`` 是一個高階運算（第一個引數是它要執行的運算），沒有 schema。
# ``to_executorch()`` 把留在 delegate 之外的每個運算換成它的 out 變體（ ``ToOutVarPass`` ，
# ``executorch/exir/passes/__init__.py`` ），過程中讀取每個運算的 ``_schema``；它會進入
# ``cond``、``map``、``while_loop`` 與 ``scan``，卻沒有處理 ``out_dtype`` 的分支。改用
# per-channel 的 weight 也救不了模型：int8 的 add + ReLU 在任何設定下都寫成 ``out_dtype``，
# pytorch/pytorch#139718 的 ResNet-18 就是如此。

OUT_DTYPE = torch.ops.higher_order.out_dtype


def out_dtype_ops(gm) -> list[str]:
    """``gm`` 裡每個 ``out_dtype`` node 執行的運算。"""
    return [str(n.args[0]) for n in gm.graph.find_nodes(op="call_function", target=OUT_DTYPE)]


class AddReLU(nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b)


pair = (torch.randn(2, 8), torch.randn(2, 8))
print(f"SmallNet，per-tensor：{out_dtype_ops(integer)}")
print(f"add + ReLU，per-channel：{out_dtype_ops(reference(AddReLU(), pair, per_channel=True))}")
assert out_dtype_ops(integer) == ["aten.linear.default", "aten.div.Tensor", "aten.mul.Tensor"]
assert not hasattr(OUT_DTYPE, "_schema"), "高階運算：沒有 schema 可讀"

# %%
# **修正**：下放 q/dq 模型（ ``convert_pt2e`` 時不加 ``use_reference_representation`` ）：
# XNNPACK 的 partitioner 把它的 q/dq 群組收進 delegate，以 int8 計算，程式就能輸出、執行，
# 算出和 q/dq 模型一樣的結果。reference representation 是給讀整數 ``aten`` 運算的後端用的，
# 說明見 :ref:`M07-3 · 同一張圖，跑遍這台機器上的每個 quantizer
# <sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py>` 的步驟 7。

config = get_symmetric_quantization_config(is_per_channel=False)
prepared = prepare_pt2e(export_module(net, x), XNNPACKQuantizer().set_global(config))
prepared(*x)
per_tensor_qdq = convert_pt2e(prepared)
error = (run(lowered(per_tensor_qdq, x).buffer, x) - per_tensor_qdq(*x)).abs().max().item()
print(f"XNNPACK 上的 per-tensor q/dq 模型，與它的最大差距：{error:.4f}")
assert error < 0.05, "可以輸出、載入並執行，算出 q/dq 模型的結果"

# %%
# RuntimeError: Failed to load method forward, error: 0x:1
# --------------------------------------------------------
# 程式順利下放、存檔，接著 ``load_method`` 失敗。執行環境的紀錄說得更多：XNNPACK 的
# ``xnn_status_invalid_parameter`` ，以及 ``Init failed for backend XnnpackBackend``
# （回報時的訊息是「XnnpackBackend init failed」，executorch#8830）。這裡把一個 linear 的輸出
# 用 ``.t()`` 轉置，再和一個可學習的欄（ ``nn.Parameter`` ）串接。


class Transposed(nn.Module):
    def __init__(self, method="t"):
        super().__init__()
        self.method = method
        self.fc = nn.Linear(8, 8)
        self.column = nn.Parameter(torch.randn(8, 1) * 5)

    def forward(self, x):
        y = self.fc(x)
        y = y.t() if self.method == "t" else y.transpose(0, 1)
        return torch.cat([self.column, y], 1)


torch.manual_seed(0)
rows = (torch.randn(4, 8),)
bad = quantized(Transposed("t"), rows)
log = io.StringIO()
with expect_error(RuntimeError, match="Failed to load method forward"):
    run(lowered(bad, rows).buffer, rows, log)
failed = [line for line in log.getvalue().splitlines() if "cpuinfo" not in line]
print("\n".join(failed))
assert any("xnn_status_invalid_parameter" in line for line in failed)

# %%
# **原因**，在圖上看： ``t`` node（醒目標示）用一個 scale 讀 linear 的 int8 輸出，卻用另一個
# scale 寫出 ``cat`` 的輸入。XNNPACK 在載入方法時才編譯 delegate；它的靜態轉置只搬動位元組，
# 所以輸入與輸出的 qparams 一旦不同，它就拒絕。 ``XNNPACKQuantizer`` 會讓只搬動值、不改變值
# 的運算共用一個 scale（ ``_is_share_obs_or_fq_op`` ）： ``transpose.int`` 與 ``permute`` 在它
# 的清單裡， ``t`` 與 ``swapaxes`` 不在（executorch#19836），所以 ``t`` 的兩側各自被觀察。

t_node = bad.graph.find_nodes(op="call_function", target=torch.ops.aten.t.default)[0]
scales = (t_node.args[0].args[1], next(iter(t_node.users)).args[1])
draw(bad, highlight=[t_node.name], title="夾在兩個 scale 之間的 t")
print(f"輸入 scale {scales[0]:.5f}，輸出 scale {scales[1]:.5f}")
assert scales[0] != scales[1], "轉置的輸入與輸出 qparams 不同"

# %%
# 程式大一點時，是哪個運算？``common.runtime.load_check`` 在子行程裡載入下放後的程式，並讀取執行
# 環境的紀錄：XNNPACK 以 debug handle 指出它建不起來的 node，``load_check`` 再到 delegate 的圖裡
# 找出那個 node。這裡是 ``t`` node，``to_edge`` 把它寫成了 ``permute_copy`` ：

check = load_check(lowered(bad, rows))
print(check)
assert [r.op for r in check.refused] == ["permute_copy.default"], "就是那個轉置"

# %%
# **修正**：把轉置寫成 ``.transpose(0, 1)`` （或 ``permute`` ），quantizer 會讓它的輸入與
# 輸出共用 qparams，程式就能載入並執行。共用的 spec 見 :ref:`M06-1 · XNNPACK quantizer
# <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>` 的步驟 2。

good = quantized(Transposed("transpose"), rows)
node = good.graph.find_nodes(op="call_function", target=torch.ops.aten.transpose.int)[0]
assert node.args[0].args[1] == next(iter(node.users)).args[1], "兩側同一個 scale"
assert torch.equal(run(lowered(good, rows).buffer, rows), good(*rows)), "它能載入並執行"

# %%
# 方法一執行就發生區段錯誤（segmentation fault）
# ----------------------------------------------
# 一個腳本用一行程式載入 ``.pte`` 並執行；行程直接當掉，沒有任何 Python traceback：是區段
# 錯誤。不過不是每次都會：已釋放的記憶體裡還留著什麼，每次都不一樣，有時則像什麼事都沒發生
# 一樣跑完。本頁在子行程裡執行這個腳本，當掉的只會是子行程；一再重跑，直到它當掉為止（最多
# 十二次）。回傳碼是終止它的訊號的負值：-11（ ``SIGSEGV`` ），有時是 -6（ ``SIGABRT`` ）。

pte_path = Path(tempfile.mkdtemp()) / "small.pte"
pte_path.write_bytes(delegate.buffer)
ONE_LINE = f"""
import torch
from executorch.runtime import Runtime
method = Runtime.get().load_program(open({str(pte_path)!r}, "rb").read()).load_method("forward")
method.execute([torch.randn(2, 3, 8, 8)])
print("ran")
"""
codes = []
while len(codes) < 12 and not any(codes):  # 直到有一次被訊號終止
    codes.append(subprocess.run([sys.executable, "-c", ONE_LINE], capture_output=True).returncode)
code = codes[-1]
name = signal.Signals(-code).name if code < 0 else "沒有訊號"
print(f"第 {len(codes)} 次執行：回傳碼 {code}（{name}）")
assert code != 0, "行程當掉了"  # 通常是 -11（SIGSEGV）；取決於已釋放的記憶體裡剩下什麼

# %%
# **原因**： ``Method`` 不會讓它的 ``Program`` 保持存活。沒有任何變數持有
# ``load_program(...)`` 回傳的 ``Program`` ，所以 Python 在這一行結束時就釋放它，之後方法讀取的
# 是已經不在的記憶體：這是未定義行為，有時看起來也一切正常。
#
# **修正**：只要 ``Program`` 的方法還在執行，就把 ``Program`` 留在變數裡，就像上面的 ``run``
# 與 :ref:`M06-3 · 由內而外看 .pte <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`
# 的寫法。

with contextlib.redirect_stderr(io.StringIO()):
    program = Runtime.get().load_program(pte_path.read_bytes())
    method = program.load_method("forward")
    out = method.execute([x[0]])[0]
assert torch.equal(out, run(delegate.buffer, x)), "方法正常執行"

# %%
# Conv2d(padding=\'same\') 接 ReLU 在 XNNPACK 上執行時失敗
# --------------------------------------------------------
# 在 executorch 1.0.0 與 1.3.1 上回報（executorch#20517）：量化後的 conv 使用
# ``padding='same'`` 與偶數的 ``kernel_size`` ，後面接一個 ReLU；下放成功，程式執行時卻失敗。
# 在 executorch 1.5.1 上已不再重現：回報的模型能執行，整個模型落在同一個 delegate 裡，和 q/dq
# 模型相差不超過一格。


class Same(nn.Module):
    def __init__(self, kernel=32):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, kernel_size=(kernel, 1), padding="same")

    def forward(self, x):
        return torch.relu(self.conv(torch.reshape(x, (1, 1, 256, 1))))


torch.manual_seed(0)
samples = (torch.randn(1, 256),)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
    same = quantized(Same(), samples)
    same_program = lowered(same, samples)
step = [n for n in same.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
steps = ((run(same_program.buffer, samples) - same(*samples)).abs() / step).round().max().item()
print(f"delegate：{list(delegated(same_program.exported_program()))}；相差 {steps:.0f} 格")
assert len(delegated(same_program.exported_program())) == 1 and steps <= 1, "它能執行"

# %%
# **原因** （1.0–1.3）：偶數的 ``kernel_size`` 需要一側比另一側多補一個元素，conv 的 padding
# 欄位表達不了，所以 ``to_edge`` 在 conv 之前寫出一個明確的 ``constant_pad_nd`` 。當時的
# partitioner 不會把這個 pad 和 conv 一起收進去：conv 留在 delegate 之外，ReLU 自成一個分割，
# XNNPACK 拒絕了它（ ``xnn_status_unsupported_parameter`` ）。
#
# **修正**：executorch 1.5.1 已包含 executorch#20553，它把 pad 拉進 conv 的分割
# （ ``InsertPadQDQPass`` 給 pad 和它的輸入相同的 qparams，補零不會改變任何值）：pad 就在
# delegate 裡。在較舊的版本上，改用奇數的 ``kernel_size`` （這裡是 33），兩側補得一樣多，就
# 不需要 pad node。一個分割會收進什麼，見 :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>` 。

(inside,) = delegated(same_program.exported_program()).values()
print(inside)
assert any("constant_pad_nd" in name for name in inside), "pad 在 delegate 裡執行"
odd = to_edge(torch.export.export(Same(kernel=33), samples)).exported_program()
assert not [n for n in odd.graph.nodes if "constant_pad_nd" in str(n.target)], "沒有 pad node"

# %%
# prepare_pt2e 在含有 GRU 的模型上失敗
# ------------------------------------
# 2025 年 4 月用 ``torch.ao`` 的 ``XNNPACKQuantizer`` 與 ``prepare_pt2e`` 回報
# （executorch#10104）。已不再重現：在本站的環境上， ``prepare_pt2e`` 與 ``convert_pt2e`` 都能
# 執行，但什麼都沒有被量化。


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(10, 20, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


torch.manual_seed(0)
sequence = (torch.randn(1, 3, 10),)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="The tensor attributes self.gru._flat_weights")
    gru = quantized(GRUNet().eval(), sequence)
targets = [str(n.target) for n in gru.graph.nodes if n.op == "call_function"]
print(targets)
assert "aten.gru.input" in targets and not any("quantize" in t for t in targets), "全是浮點數"

# %%
# **原因**：export 把 ``nn.GRU`` 整個保留成一個 ``aten.gru.input`` node，weight 都在它裡面，
# 而 ``XNNPACKQuantizer`` 不標註這種運算：GRU 仍是浮點數。
#
# **修正**：要量化 GRU 的矩陣乘法，就用 ``nn.Linear`` 層寫出它的 cell：quantizer 會標註
# linear（周圍的 sigmoid 與 tanh 仍是浮點數）。同一條規則——quantizer 看見的是運算，不是你心裡
# 想的模組——見 :ref:`M05-1 · quantizer 在 attention 裡看見什麼
# <sphx_glr_lessons_m05_transformers_m05_1_attention.py>` 。


class LinearGRU(nn.Module):
    def __init__(self, inputs=10, hidden=20):
        super().__init__()
        self.hidden = hidden
        self.x_gates, self.h_gates = nn.Linear(inputs, 3 * hidden), nn.Linear(hidden, 3 * hidden)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)
        outputs = []
        for t in range(x.shape[1]):
            xr, xz, xn = self.x_gates(x[:, t]).chunk(3, 1)
            hr, hz, hn = self.h_gates(h).chunk(3, 1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            h = (1 - z) * torch.tanh(xn + r * hn) + z * h
            outputs.append(h)
        return torch.stack(outputs, 1)


torch.manual_seed(0)
by_hand = quantized(LinearGRU().eval(), sequence)
linears = by_hand.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
int8 = [n.args[1].target == qd.dequantize_per_channel.default for n in linears]
print(f"{len(linears)} 個 linear，int8 weight：{sum(int8)}")
assert len(linears) == 6 and all(int8), "每一步兩個 linear，weight 都是 int8"

# %%
# 動態量化沒有校準：每個 weight 的 scale 都是 1.0
# -----------------------------------------------
# 既然用了 ``is_dynamic=True`` 、活化值在執行時才量測，prepare 後的模型就沒有先執行，直接
# convert。 ``convert_pt2e`` 發出警告（「must run observer before calling calculate_qparams.
# Returning default values.」），輸出也偏掉了。這裡唯一做動態量化的運算是 linear（conv 後面
# 接 ReLU 沒有動態版本，M06-1）。


def weight_qparams(gm) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """convert 後的圖中每個 per-channel weight 的（int8 weight，scale）。"""
    found = gm.graph.find_nodes(op="call_function", target=qd.dequantize_per_channel.default)
    return [(getattr(gm, n.args[0].target), getattr(gm, n.args[1].target)) for n in found]


with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    uncalibrated = quantized(net, x, calibrate=False, is_dynamic=True)
((int8_weight, scale),) = weight_qparams(uncalibrated)
print(f"weight scale {scale.tolist()}，非零的 int8 weight：{int8_weight.count_nonzero()}")
assert torch.equal(scale, torch.ones(1)), "1.0，observer 的預設值"
assert any("must run observer" in str(w.message) for w in seen), "而且 convert 發出了警告"
far = (uncalibrated(*x) - net(*x)).abs().max().item()

# %%
# **原因**：動態量化在執行時量測的是「活化值」；「weight」的 scale 仍然來自 observer，
# 而 observer 只有在 prepare 後的模型執行時才看得到它的 weight。模型從未執行，每個 observer
# 就都回傳預設值，也就是 scale 1.0：每個 weight 都捨入成整數，而這一層的 weight 全都小於
# 0.5，於是全部變成 0。

assert int8_weight.count_nonzero() == 0 and net.fc.weight.abs().max() < 0.5, "全部捨入成 0"

# %%
# **修正**：在 ``convert_pt2e`` 之前，至少用真實的輸入執行一次 prepare 後的模型
# （ :ref:`M05-2 · 靜態與動態 int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>` ）。這樣一來，每個輸出
# 通道的 weight scale 就是該通道 weight 的最大絕對值除以 127。

calibrated = quantized(net, x, is_dynamic=True)
((_, scale),) = weight_qparams(calibrated)
near = (calibrated(*x) - net(*x)).abs().max().item()
print(f"最大輸出誤差：未校準 {far:.4f}，校準後 {near:.4f}")
assert torch.allclose(scale, net.fc.weight.abs().amax(1) / 127), "每個通道 max |w| / 127"
assert near < far / 10, "離浮點模型近了十倍"

# %%
# RuntimeError: method->set_inputs() for method \'forward\' failed with error 0x10
# --------------------------------------------------------------------------------
# ``.pte`` 在匯出時的批次大小下能執行，換一個批次大小就失敗。在這之前，執行環境的紀錄寫著原因：
# ``Attempted to resize a static tensor`` ，附上預期與收到的形狀（回報時的訊息是「Attempted
# to resize a static tensor to a new shape at dimension 0」，executorch#1350、#9749）；以有
# 上限的 ``Dim`` 匯出的程式超過上限時，則是 ``Attempted to resize a bounded tensor with a
# maximum capacity of ... elements`` 。

log = io.StringIO()
with expect_error(RuntimeError, match="method->set_inputs() for method 'forward' failed"):
    run(delegate.buffer, (torch.randn(3, 3, 8, 8),), log)
resize = [line for line in log.getvalue().splitlines() if "Attempted to resize" in line]
print(resize[0])
assert "static tensor" in resize[0] and "(2, 3, 8, 8)" in resize[0], "依批次 2 規劃"

# %%
# **原因**：``torch.export`` 會把沒有宣告為動態的每個維度固定下來，ExecuTorch 再依這些形狀
# 事先規劃每個張量的記憶體。執行環境不會把規劃好的張量放大；``0x10`` 是 ``InvalidArgument`` 。
# 動態維度依它的上限規劃，超過上限時同樣的錯誤伴隨「bounded tensor」那一行紀錄。
#
# **修正**：把批次宣告為有上限的動態維度 ``Dim("batch", min=1, max=N)`` ，用至少 2 的範例
# 批次匯出，並把同一份 ``dynamic_shapes`` 傳給 ``.pte`` 的匯出
# （ ``common.edge.to_executorch(..., dynamic_shapes=...)`` ）。executorch#8539 的模型（一個
# ``Conv1d`` 、一個 ReLU、一個 ``Linear`` ）在 2025 年初的版本上以動態批次匯出時，於
# ``to_out_var_pass`` 失敗；現在它能下放，並在執行環境上以批次 1 與 8 執行。說明見
# :ref:`M06-4 · 會變的形狀 <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`。


class Reported(nn.Module):  # executorch#8539 的模型
    def __init__(self):
        super().__init__()
        self.conv, self.linear = nn.Conv1d(1, 3, 10), nn.Linear(645, 1000)

    def forward(self, x):
        return self.linear(torch.relu(self.conv(x)).flatten(1))


torch.manual_seed(0)
signals = (torch.randn(2, 1, 224),)
up_to_8 = {"x": {0: Dim("batch", min=1, max=8)}}
config = get_symmetric_quantization_config(is_per_channel=True)
bounded = torch.export.export(Reported().eval(), signals, dynamic_shapes=up_to_8)
prepared = prepare_pt2e(bounded.module(), XNNPACKQuantizer().set_global(config))
for size in (1, 8):
    prepared(torch.randn(size, 1, 224))
reported = convert_pt2e(prepared)
flexible = to_executorch(
    reported, signals, partitioner=XnnpackPartitioner(), dynamic_shapes=up_to_8
)
for size in (1, 8):
    batch = (torch.randn(size, 1, 224),)
    error = (run(flexible.buffer, batch) - reported(*batch)).abs().max().item()
    print(f"批次 {size}：與 q/dq 模型的最大差距 {error:.4f}")
    assert error < 0.05, "範圍兩端都能執行"

# %%
# to_executorch() 之後，圖變了
# ---------------------------------
# 程式用 ``to_edge_transform_and_lower`` 下放、呼叫 ``.to_executorch()`` ，再讀
# ``edge.exported_program()`` 列出留在 delegate 之外的運算，卻看到 edge 圖裡從來沒有的運算：
# ``.out`` 變體與記憶體規劃的 ``alloc`` node。

lowering = to_edge_transform_and_lower(
    torch.export.export(qdq, x), partitioner=[XnnpackPartitioner()]
)


def portable_ops(program) -> list[str]:
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    return [str(n.target) for n in calls if "delegate" not in str(n.target)]


before = portable_ops(lowering.exported_program())
lowering.to_executorch()
after = portable_ops(lowering.exported_program())
print(f"之前：{before}\n之後：{after}")
assert before != after, "同一個程式，被改寫了"

# %%
# **原因**：``to_executorch()`` 直接在 ``edge.exported_program()`` 傳回的 ``ExportedProgram``
# 上執行它的 pass（out 變體、記憶體規劃），再傳回一個新的 manager；edge manager 指向的仍是
# 被改寫過的圖。
#
# **修正**：在 ``to_executorch()`` 之前讀取或複製（ ``copy.deepcopy`` ）edge 程式；delegate
# 本身（ ``common.edge.delegated`` ）在 ``to_executorch()`` 前後都一樣。下放與 edge 圖的說明見
# :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`。

fresh = to_edge_transform_and_lower(torch.export.export(qdq, x), partitioner=[XnnpackPartitioner()])
kept = copy.deepcopy(fresh.exported_program())
fresh.to_executorch()
assert portable_ops(kept) == before, "副本就是 edge 圖"

# %%
# Failed to create static slice node：兩個 scale 之間的量化 slice
# ---------------------------------------------------------------
# 在 executorch 1.4.0 上回報（executorch#21829、#21831）：把 conv 的輸出切成兩半再相加，可以
# 下放，方法卻載入失敗，紀錄寫著 ``Failed to create static slice node ...
# xnn_status_invalid_parameter`` 。在 executorch 1.5.1 上已不再發生：每個 slice 的兩側共用
# 同一個 scale，程式可以載入。


class Halves(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y[:, :4] + y[:, 4:]


torch.manual_seed(0)
image = (torch.randn(1, 3, 32, 32),)
halves = quantized(Halves().eval(), image)
slices = halves.graph.find_nodes(op="call_function", target=torch.ops.aten.slice.Tensor)
for node in slices:
    scale_in, scale_out = node.args[0].args[1], next(iter(node.users)).args[1]
    print(f"{node.name}：輸入 scale {scale_in:.5f}，輸出 {scale_out:.5f}")
assert all(n.args[0].args[1] == next(iter(n.users)).args[1] for n in slices), "共用"

# %%
# **原因** （1.4 上）：``XNNPACKQuantizer`` 讓只搬動數值的運算共用一個 scale
# （ ``_is_share_obs_or_fq_op`` ），它的清單列了 ``to_edge`` 之後的 ``slice_copy`` ，卻沒有
# quantizer 實際看到的 ``aten.slice.Tensor`` ；每個 slice 的兩側因此各自被觀察。XNNPACK
# 在載入時編譯 delegate，它的 static slice 拒絕兩個不同的 scale。
#
# **修正**：executorch 1.5.1 已包含 executorch#21568（清單加入 ``aten.slice.Tensor`` ）與
# #21949（partitioner 把兩個 scale 的 slice 留給 portable kernel）。不論哪個版本，要找出無法
# 載入的方法拒收哪個運算，可以用 ``common.runtime.load_check`` ：它在子行程裡載入程式並指出
# 那個 node（見上面 transpose 的條目）。共用的 spec 見
# :ref:`M06-1 · XNNPACK quantizer <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`
# 的步驟 2。

assert load_check(lowered(halves, image)).loads, "程式可以載入"

# %%
# 量化的 Conv1d(padding=\'same\') 在 XNNPACK 上輸出錯誤
# ------------------------------------------------------
# 在 executorch 1.3 上回報（executorch#20558），是不報錯的失敗： ``kernel_size`` 為偶數、
# ``padding='same'`` 的 int8 ``Conv1d`` 能下放、能執行，沒有任何錯誤，數值卻是錯的。在
# executorch 1.5.1 上已不再發生：``.pte`` 與 q/dq 模型相差在一格以內。


class Same1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, kernel_size=4, padding="same")

    def forward(self, x):
        return self.conv(x)


torch.manual_seed(0)
signal = (torch.randn(1, 2, 16),)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
    same1d = quantized(Same1d().eval(), signal)
    same1d_program = lowered(same1d, signal)
step = [n for n in same1d.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
steps = ((run(same1d_program.buffer, signal) - same1d(*signal)).abs() / step).round().max()
print(f"與 q/dq 模型相差 {steps:.0f} 格")
assert steps <= 1, "數值正確"

# %%
# **原因** （1.3 上）：偶數的 ``kernel_size`` 一側要補的比另一側多，conv 的 padding 欄位無法
# 表達，於是 ``to_edge`` 在 conv 前面寫一個 ``constant_pad_nd`` ；XNNPACK 下放這個 pad 與 conv
# 時，弄丟了兩側不對稱的補齊量。
#
# **修正**：executorch 1.5.1 已包含 executorch#20734（以及 #20553）：pad 以量化的 static pad
# 加入 conv 的 delegate，沿用輸入的 qparams。較舊的版本請用奇數的 ``kernel_size`` ，或明確寫出
# 你要的補齊量。這裡以 delegate 裡的 pad 驗證；一個分割會收進什麼，見
# :ref:`M06-2 · 下放到 ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`。

(inside,) = delegated(same1d_program.exported_program()).values()
assert any("constant_pad_nd" in name for name in inside), "pad 在 delegate 裡執行"

# %%
# Unsupported: quantized nyi in meta tensors with fake tensor propagation.
# ------------------------------------------------------------------------
# 完整的第一行是 ``torch._dynamo.exc.Unsupported: Unsupported: quantized nyi ...`` ，
# 2025 年 2 月回報（executorch#8727）：動態量化（ ``is_dynamic=True`` 、per-tensor weight）的
# 模型，以動態序列長度匯出。這個錯誤在這裡已不再發生：釘選的版本能匯出、prepare 並 convert
# 回報的設定。剩下的是一個不報錯的問題：XNNPACK 不接收這個量化的 linear。在新的行程裡，
# ``to_executorch`` 停在第一個條目的 ``Missing out variants`` ，列出 ``choose_qparams`` ；在這一頁，
# 第一個條目已經載入 ``executorch.kernels.quantized`` ，程式可以執行，它的 linear 卻是 portable
# kernel 上以浮點數計算的 ``addmm`` ：


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x)


frames = (torch.randn(1, 20, 16),)
any_length = {"x": {1: Dim("seq_len", min=1, max=1024)}}


def dynamic_int8(per_channel: bool) -> torch.fx.GraphModule:
    """以動態長度匯出的 ``Encoder`` ，照 executorch#8727 的設定做動態量化。"""
    settings = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=True)
    program = torch.export.export(Encoder().eval(), frames, dynamic_shapes=any_length)
    prepared = prepare_pt2e(program.module(), XNNPACKQuantizer().set_global(settings))
    prepared(*frames)
    return convert_pt2e(prepared)


per_tensor = dynamic_int8(per_channel=False)
tensor_program = to_executorch(
    per_tensor, frames, partitioner=XnnpackPartitioner(), dynamic_shapes=any_length
)
left_out = operators_run(tensor_program.buffer, list(frames))
print(left_out.summary)
assert not left_out.int8 and "addmm.out" in left_out.portable, "linear 在 XNNPACK 之外以浮點數執行"

# %%
# **原因**：「quantized nyi」來自量化張量（ ``torch.qint8`` ，eager 模式的量化）進入 export 的
# fake tensor；PT2E 的圖只有一般的 int8 張量與 q/dq 運算，fake tensor 都支援。剩下的是
# XNNPACK 的規則：動態量化的 linear 只有搭配 per-channel weight 才會被委派，per-tensor
# weight 時 ``choose_qparams`` 與 q/dq 運算留在外面，只有 ``executorch.kernels.quantized`` 提供
# 的 portable kernel 能執行，夾在中間的 linear 則以浮點數執行。
#
# **修正**：``is_dynamic=True`` 搭配 ``is_per_channel=True`` ：linear 被委派，
# ``operators_run`` 在兩種長度下都顯示 XNNPACK 的動態量化 GEMM（ ``QDU8`` ：執行時才量化的
# int8 活化值）。動態量化的說明見
# :ref:`M05-2 · 靜態與動態 int8 <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`。

per_channel = dynamic_int8(per_channel=True)
encoder_program = to_executorch(
    per_channel, frames, partitioner=XnnpackPartitioner(), dynamic_shapes=any_length
)
for length in (5, 20):
    operators = operators_run(encoder_program.buffer, [torch.randn(1, length, 16)])
    print(f"長度 {length}：{operators.summary.splitlines()[0]}")
    assert operators.int8 and not operators.portable, "linear 在 XNNPACK 裡以 int8 執行"

# %%
# 動態量化：.pte 在主機上能載入，在裝置上載入失敗
# -----------------------------------------------
# 有人回報，以 ``is_dynamic=True`` 量化的 Transformer（executorch#11355，仍未關閉）能下放成
# ``.pte`` ，在 Android app 裡 ``load_method`` 卻失敗。這一頁無法執行 Android 的建置。
# 在這裡的執行環境上，同類的程式可以載入並執行：linear 都做了動態量化的
# ``nn.TransformerEncoderLayer`` 。

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
tokens_in = (torch.randn(1, 10, 32),)
dynamic_layer = quantized(layer, tokens_in, is_dynamic=True)
layer_program = lowered(dynamic_layer, tokens_in)
check = load_check(layer_program)
print(f"load_check：{check}")
assert check.loads, "在這裡的執行環境上可以載入"

# %%
# **原因**：這一頁重現不了。XNNPACK 在方法載入時、在載入它的執行環境裡編譯 delegate：
# 主機能證明的只是這個版本的執行環境接受這個程式，這裡用的是 ``QDU8`` GEMM（執行時才量化的
# int8 活化值，見下面第一行）。以另一個 ExecuTorch 版本建置、或 XNNPACK 缺少這些 kernel 的
# 裝置執行環境，是另一個執行環境。
#
# **修正**：裝置上的執行環境，要用與寫出 ``.pte`` 時相同的 ExecuTorch 版本建置，並且包含
# XNNPACK；在主機上以 ``load_check`` 與 ``operators_run`` （ ``common.runtime`` ）檢查程式，
# 再拿裝置的紀錄和這裡列出的運算子比對。動態量化的說明見
# :ref:`M05-2 · 靜態與動態 int8 <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`。

layer_operators = operators_run(layer_program.buffer, list(tokens_in))
print(layer_operators.summary)
assert any("QD" in op for op in layer_operators.int8), "動態量化的 GEMM"

# %%
# RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.
# ----------------------------------------------------------------------------------------
# 一個帶 KV 快取的解碼器（M08 的，只有一個 block，也沒有訓練：出錯的是圖，不是數值），用一般的
# 方式匯出，也就是在梯度模式開著（預設）時呼叫 ``torch.export.export`` ，它能下放到
# XNNPACK；接著 ``to_executorch()`` 失敗。訊息的下一行指出是哪個 node：寫入快取 buffer
# ``b_layers_0_attention_k_cache`` 的 ``copy_`` 。

from common.language_model import MAX_LEN, Decoder, encode, export_decoder, reset_cache

torch.manual_seed(0)
one_block = Decoder(layers=1).eval()
tokens = encode("import ")
prefill = (tokens[None], torch.arange(len(tokens)))
length = Dim("length", min=1, max=MAX_LEN)
grad_on = torch.export.export(one_block, prefill, dynamic_shapes=({1: length}, {0: length}))
edge = to_edge_transform_and_lower(grad_on, partitioner=[XnnpackPartitioner()])
with expect_error(RuntimeError, match="a leaf Variable that requires grad") as caught:
    edge.to_executorch()
node = next(line for line in str(caught.error).splitlines() if "While executing" in line)
written_from = re.search(r"args = \((.*?)\)", node)[1]
print(f"{node.split(' :')[0]}: copy_({written_from})")
assert "copy_" in node and "k_cache" in node, "寫入快取的 copy_"

# %%
# **原因**：在梯度模式開著時匯出，程式的快取輸入是需要梯度的張量（下面印出的是它們追蹤時的值），
# 因為快取寫入的 key 與 value 是由參數算出來的。 ``to_executorch()`` 用一個 ``copy_`` 把每個
# 更新過的 buffer 寫回去，並在它的 pass 裡重新執行這張圖，用的是呼叫者當下的梯度模式；autograd
# 拒絕對需要梯度的葉張量（leaf）做就地寫入。


def cache_inputs(program) -> dict[str, bool]:
    """匯出程式的每個快取輸入，其追蹤值的 requires_grad。"""
    return {
        n.name: n.meta["val"].requires_grad
        for n in program.graph.find_nodes(op="placeholder")
        if "cache" in n.name
    }


print(f"在梯度模式開著時匯出：{cache_inputs(grad_on)}")
assert all(cache_inputs(grad_on).values()), "快取需要梯度"

# %%
# **修正**：在 ``torch.no_grad()`` 下匯出並下放，就像 ``common.language_model.export_decoder``
# 的匯出方式（這裡兩者做一個就夠：同一個已下放的程式在 ``torch.no_grad()`` 下通過
# ``to_executorch()`` ）。程式於是能在 ExecuTorch 執行環境上執行，算出和 eager 模型相同的
# logit：提示詞的，以及下一個 token 的，而後者讀的是提示詞寫入的快取。這個解碼器如何變成
# ``.pte`` ，見 :ref:`M08-3 · 放上手機：會生成文字的 .pte
# <sphx_glr_lessons_m08_language_model_m08_3_to_a_phone.py>`。

print(f"在 no_grad 下匯出：{cache_inputs(export_decoder(one_block))}")
with torch.no_grad(), warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Mutation on a buffer")  # 快取的初始值不重要：遮罩會把它蓋住
    pte = edge.to_executorch()
decode = (torch.tensor([[3]]), torch.tensor([len(tokens)]))
with contextlib.redirect_stderr(io.StringIO()):
    cached_program = Runtime.get().load_program(pte.buffer)  # 它的 method 執行時，它要一直存在
    method = cached_program.load_method("forward")
    on_runtime = [method.execute(list(call))[0] for call in (prefill, decode)]
reset_cache(one_block)
with torch.no_grad():
    eager = [one_block(*call) for call in (prefill, decode)]
assert not any(cache_inputs(export_decoder(one_block)).values()), "沒有梯度，就沒有被拒絕的葉張量"
for ours, theirs in zip(on_runtime, eager, strict=True):
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

# %%
# 下一頁
# ------
# 回到 :ref:`M06-3 · 由內而外看 .pte
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>` ，或從疑難排解的第一頁
# :ref:`疑難排解：匯入與匯出 <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`
# 讀起。
