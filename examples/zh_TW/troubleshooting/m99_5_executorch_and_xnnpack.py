"""
疑難排解：ExecuTorch 與 XNNPACK
===============================

``convert_pt2e`` 之後，從輸出 ``.pte`` 到在 ExecuTorch 執行環境上執行，一路上會遇到的問題：
無法輸出的程式、無法載入的 delegate、沒有任何 Python 錯誤就當掉的行程，以及 weight 從未量測過的
動態模型。每個條目以錯誤訊息第一行的原文（或讀者描述的症狀）為標題，並在本站的環境（torch
2.13、torchao 0.18、executorch 1.5.1）上重現它；若是讀者在較舊版本回報、這裡已不再發生的錯誤，
條目會說明這一點並實際示範。每個條目都指出原因，以 assert 驗證修正方法，並連到解釋它的那一課。

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

from common.edge import delegated

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
# 下一頁
# ------
# 回到 :ref:`M06-3 · 由內而外看 .pte
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>` ，或從疑難排解的第一頁
# :ref:`疑難排解：匯入與匯出 <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`
# 讀起。
