"""
M07-5 換來更多 int8 的改寫
==========================

M07-1 的報告（ ``common.coverage`` ）與 M07-4 的運算圖鑑會告訴你，模型裡哪些運算留在
浮點數。有五個小改寫能改變這一點，又不改變模型算出來的結果：把 ConvNeXt 的 layer scale
折疊進它前面的 linear、讓殘差 add 緊接在它的 linear 之後、把 ``kernel_size`` 等於 stride
的 ``ConvTranspose2d`` 換成 1×1 conv 加 ``pixel_shuffle`` 、給 XNNPACK 一個 4-D、
``keepdim`` 的 mean，以及拿掉匯出後的 ``nn.TransformerEncoderLayer`` 保留下來的 eval 模式
dropout node。每一個改寫都讓更多運算
成為 int8（改寫前後都以 assert 檢查），輸出也保持不變（同樣 assert）；接著編譯或下放、
讀出執行的 kernel 並計時。int8 的運算變多，不等於模型變快：inductor 本來就在它無論如何都要
執行的迴圈裡算掉浮點數的逐元素運算；而其中一個改寫，遇上記憶體配置不對的影像，會慢上許多。
第六個改寫讓 GRU 的每個步驟各有一份 cell 的副本（共用的 weight 編譯後以浮點數執行），並量測
int8 在遞迴模型上能換來多少。

**你會學到**

- 六個讓浮點數運算或 kernel 在 x86 或 XNNPACK 下變成 int8 的改寫，以及怎麼確認每個改寫都不
  改變輸出
- 怎麼讀出每個改寫實際執行了哪些 kernel，以及計時結果說了什麼
- 為什麼 int8 運算變多不一定跑得更快、融合殘差 add 的記憶體配置陷阱，以及為什麼遞迴模型從
  int8 得到的好處比 conv 網路少

**先備知識**： :ref:`M07-1 · 我的 quantizer 會把什麼留在浮點數？
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`、 :ref:`M07-4 · 運算圖鑑
<sphx_glr_lessons_m07_your_model_m07_4_op_atlas.py>`、 :ref:`M03-3 · 量測速度與大小
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# 準備
# ----
# 四個使用隨機 weight（固定種子）的小模型，各自照該架構自己的程式碼寫法寫成：一個 ConvNeXt
# block、一個 U-Net 的上取樣步驟、一個 1-D 關鍵字偵測模型與一個 GRU；第五個就是
# ``nn.TransformerEncoderLayer`` 本身。 ``quantized`` 匯出、prepare、用範例批次校準，再
# convert。 ``computing`` 只留下報告裡會做計算的運算（不含 view、permute、slice 這類只搬動
# 值的運算）， ``float_ops`` 數其中的浮點數運算。 ``verdict`` 依兩個中位數的比值與它的 95 %
# 區間（ ``Timings.ratio_interval`` ，M03-3）說出計時結果代表什麼：兩個模型在同樣的交錯輪次
# 裡量測，所以在這次執行之內，區間不含 1 的比值就是差別；下一次執行可能落在別處。只印出來，
# 從不 assert。

import copy
import hashlib
import warnings

import torch
from torch import nn

from common.coverage import MOVING_KINDS, coverage
from common.cpu import describe
from common.kernels import time_by_kind
from common.numerics import sqnr
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import as_compiled, compare_speed, race
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import to_executorch, xnnpack_quantizer
from common.runtime import operators_run

# inductor 的 int8 lowering 用 torch.tensor(tensor) 複製 zero point：會發出一個 UserWarning
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
aten = torch.ops.aten

# 表格與結論裡各列的名稱。
AS_WRITTEN, FOLDED, ADD_NEXT = "原本的寫法", "折疊 layer scale", "add 緊接 linear"
TRANSPOSED, SHUFFLED = "ConvTranspose2d", "1×1 conv + pixel_shuffle"
MEAN_OVER_T, MEAN_4D = "對 T 取 mean", "4-D keepdim mean"
WITH_DROPOUT, NO_DROPOUT = "保留 dropout", "移除 dropout"


def quantized(graph, args, quantizer):
    prepared = prepare_pt2e(copy.deepcopy(graph), quantizer)
    prepared(*args)  # 校準：範例批次
    return convert_pt2e(prepared)


def computing(report) -> dict:
    return {k: c for k, c in report.counts().items() if k not in MOVING_KINDS}


def float_ops(report) -> int:
    return sum(n - i for i, n in computing(report).values())


def show(label, report):
    counts = "、".join(f"{k} {i}/{n}" for k, (i, n) in computing(report).items())
    print(f"{label}：{float_ops(report)} 個浮點數運算（{counts}）")


def verdict(timings, before: str, after: str) -> str:
    b, a = timings[before], timings[after]
    low, high = timings.ratio_interval(before, after)  # before ÷ after，兩個中位數都取最壞的一端
    medians = f"{b.median:.3f} → {a.median:.3f} ms（{low:.2f}–{high:.2f}×）"
    if low > 1:
        return f"{before} → {after}：{medians}，這次執行變快"
    if high < 1:
        return f"{before} → {after}：{medians}，這次執行變慢"
    return f"{before} → {after}：{medians}，區間包含 1×：這次執行量不出差別"


# %%
# ConvNeXt block：一個 7×7 depthwise conv，接著在通道在後的配置下做 LayerNorm、一個把寬度
# 放大四倍的 linear、GELU、一個縮回原寬度的 linear、學來的逐通道 layer scale ``gamma`` ，
# 最後在輸入的配置下做殘差 add。兩個旗標就是步驟 1 與步驟 2 的改寫。x86 的 conv 以
# channels-last 執行，所以影像以 channels-last 傳入（步驟 2 會說明這在這裡為什麼重要）。


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim=32, *, layer_scale=True, add_next_to_linear=False):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1, self.act = nn.Linear(dim, 4 * dim), nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.1) if layer_scale else None
        self.add_next_to_linear = add_next_to_linear

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        if self.gamma is not None:
            y = self.gamma * y
        if self.add_next_to_linear:
            return (x.permute(0, 2, 3, 1) + y).permute(0, 3, 1, 2)
        return x + y.permute(0, 3, 1, 2)


torch.manual_seed(0)
block = ConvNeXtBlock().eval()
images = torch.randn(2, 32, 14, 14, generator=torch.Generator().manual_seed(1))
images = (images.contiguous(memory_format=torch.channels_last),)

# %%
# 步驟 1 — 把 layer scale 折疊進 linear
# -------------------------------------
# 照原本的寫法，x86 把這個 block 的三個運算留在浮點數：LayerNorm、殘差 add，以及
# ``gamma * y`` 。x86 只在兩個張量形狀相同時才量化 ``mul`` ，而 ``gamma`` 是一個廣播到整個
# 活化值上的向量（M07-1 的步驟 3）。

as_written = coverage(export_module(block, images), x86_quantizer(), every_op=True)
show(AS_WRITTEN, as_written)
print(as_written[as_written.names(kind="mul")[0]].why)
assert computing(as_written)["mul"] == (0, 1) and float_ops(as_written) == 3

# %%
# ``gamma`` 乘在 ``pwconv2`` 的每一個輸出通道上，所以它可以放進這個 linear 的 weight 各列與
# bias： ``gamma * (W y + b) = (gamma[:, None] * W) y + gamma * b`` 。折疊後的 block 算出的
# 結果只差浮點數的捨入（容許誤差 1e-6），而 ``mul`` 不見了：少了一個浮點數運算。


def fold_layer_scale(model: ConvNeXtBlock) -> ConvNeXtBlock:
    folded = copy.deepcopy(model)
    with torch.no_grad():
        folded.pwconv2.weight.mul_(folded.gamma[:, None])
        folded.pwconv2.bias.mul_(folded.gamma)
    folded.gamma = None
    return folded


folded = fold_layer_scale(block)
torch.testing.assert_close(folded(*images), block(*images), rtol=0, atol=1e-6)
folded_report = coverage(export_module(folded, images), x86_quantizer(), every_op=True)
show(FOLDED, folded_report)
assert "mul" not in computing(folded_report) and float_ops(folded_report) == 2

# %%
# 步驟 2 — 讓殘差 add 緊接在它的 linear 之後
# ------------------------------------------
# add 還是浮點數：x86 只在 add 直接接在餵它的 conv 或 linear 後面時，把它融合進去一起標註，
# 而這裡中間夾著一個轉回 ``(N, C, H, W)`` 的 ``permute`` 。改成在通道在後的配置下、緊接在
# ``pwconv2`` 之後加上殘差，再 permute 相加的結果，算出的數字完全相同（ ``torch.equal`` ），
# 而 x86 把 add 融合進 int8 linear。

next_to_linear = copy.deepcopy(folded)
next_to_linear.add_next_to_linear = True
assert torch.equal(next_to_linear(*images), folded(*images)), "同樣的加法，只是換了記憶體配置"
add_report = coverage(export_module(next_to_linear, images), x86_quantizer(), every_op=True)
show(ADD_NEXT, add_report)
print(add_report[add_report.names(kind="add")[0]].why)
assert computing(add_report)["add"] == (1, 1) and float_ops(add_report) == 1

# %%
# 改寫前後 convert 出來的圖：第一張圖裡，add（醒目標示）隔著一個 permute 讀取 linear 的輸出；
# 第二張圖裡，它直接接在 ``pwconv2`` 後面，兩者之間沒有 quantize node：這正是 oneDNN 用一個
# kernel 執行的模式。

convnext_int8 = {
    AS_WRITTEN: quantized(export_module(block, images), images, x86_quantizer()),
    FOLDED: quantized(export_module(folded, images), images, x86_quantizer()),
    ADD_NEXT: quantized(export_module(next_to_linear, images), images, x86_quantizer()),
}


def adds(gm) -> list[str]:
    return [n.name for n in gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)]


def add_reads_linear(gm) -> bool:
    (add,) = gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)
    return any(getattr(arg, "target", None) == aten.linear.default for arg in add.args)


before_graph = convnext_int8[FOLDED]
draw(before_graph, highlight=adds(before_graph), title="x86：linear 與 add 之間夾著 permute")
assert not add_reads_linear(before_graph), "中間夾著一個 permute"

# %%

after_graph = convnext_int8[ADD_NEXT]
draw(after_graph, highlight=adds(after_graph), title="x86：add 緊接在它的 linear 之後")
assert add_reads_linear(after_graph), "linear 的輸出直接進入 add"

# %%
# 開啟 freezing 編譯並計時（ ``race`` ，M03-3）。三者執行相同的 oneDNN int8 kernel：一個
# conv、兩個 linear，第一個 linear 以 GELU 為 post-op；步驟 2 之後，第二個 linear 也把 add
# 當成 post-op 執行。三者都沒有執行任何浮點數的 conv 或 linear kernel。表格與結論是這台機器
# 的量測，只印出來，從不 assert。

convnext_race = race(convnext_int8, images)
print(convnext_race.table())
linear = "onednn::qlinear_pointwise"
for label, ran in convnext_race.kernels.items():
    assert ran.int8 == {"onednn::qconv_pointwise": 1, linear: 2} and not ran.float, label
    added = {"gelu": 1, "add": 1} if label == ADD_NEXT else {"gelu": 1}
    assert ran.post_ops[linear] == added, f"{label}：post-op 是 {ran.post_ops[linear]}"
print(verdict(convnext_race, AS_WRITTEN, FOLDED))
print(verdict(convnext_race, FOLDED, ADD_NEXT))

# %%
# 為什麼少了兩個浮點數運算卻不一定更快：編譯之後，浮點數的 ``mul`` 與 ``add`` 本來就不是
# 獨立的 kernel（kernel 那幾行顯示三者呼叫相同的 oneDNN kernel，也沒有浮點數 kernel）。
# inductor 反正要產生一個 C++ 迴圈，讀取 int8 linear 的浮點數輸出、以輸入的配置寫出 block
# 的結果，就在那個迴圈裡把它們算掉：每個值多一次乘法與一次加法，而那一趟記憶體讀寫不管怎樣
# 都會發生（ ``TORCH_LOGS=output_code`` 會印出這些迴圈）。
#
# 記憶體配置的陷阱：融合的 add 的另一個輸入，送到 oneDNN 時必須和 linear 的輸出有相同的
# 配置，也就是每個像素一列。影像若用 PyTorch 預設的配置，也就是連續的 ``(N, C, H, W)`` ，
# 殘差 ``x.permute(0, 2, 3, 1)`` 就是一個轉置過的 view；對這種配置的 add 輸入，oneDNN
# 沒有最佳化的 int8 matmul 可用，於是改用它的參考實作（ ``ref_int8`` ，讀自 oneDNN 對這次呼叫
# 的紀錄： ``implementations`` ）。在步驟 2 之前，add 留在 linear 之外，同樣的影像會走快速的
# kernel：

standard = (images[0].contiguous(),)
assert not standard[0].permute(0, 2, 3, 1).is_contiguous(), "殘差以轉置的配置送達"
trap_models = {k: convnext_int8[k] for k in (FOLDED, ADD_NEXT)}
trap = race(trap_models, standard, rounds=10)
print(trap.table())
for label, ran in trap.kernels.items():
    print(f"{label}：{dict(ran.implementations[linear])}")
print(verdict(trap, FOLDED, ADD_NEXT))
reference = {
    k: any(i.startswith("ref") for i in r.implementations[linear]) for k, r in trap.kernels.items()
}
assert reference == {FOLDED: False, ADD_NEXT: True}

# %%
# 步驟 3 — 把 ConvTranspose2d 換成 1×1 conv 加 pixel_shuffle
# ----------------------------------------------------------
# U-Net 解碼器的一步：一個 stride 2 的 conv 往下（接 ReLU）、一個 ``kernel_size`` 2、stride 2
# 的 ``ConvTranspose2d`` 往上、skip 串接、一個 3×3 conv。x86 沒有 int8 的轉置 conv：
# ``conv_transpose2d`` 不在它的運算集合裡，於是留在浮點數。


class UpStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.down, self.relu = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU()
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.out = nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        return self.out(torch.cat([self.up(self.relu(self.down(x))), x], 1))


torch.manual_seed(0)
unet = UpStep().eval()
feature_map = torch.randn(2, 16, 32, 32, generator=torch.Generator().manual_seed(1))
feature_map = (feature_map.contiguous(memory_format=torch.channels_last),)
unet_report = coverage(export_module(unet, feature_map), x86_quantizer(), every_op=True)
show(TRANSPOSED, unet_report)
print(unet_report[unet_report.names(op="conv_transpose2d")[0]].why)
assert computing(unet_report)["conv"] == (2, 3), "轉置 conv 是浮點數"

# %%
# 當 ``kernel_size`` = stride = r（而且沒有 padding），每個輸入像素寫出輸出裡屬於它自己的一塊
# r×r： ``out[c, r·i + a, r·j + b] = Σ_k W[k, c, a, b] · x[k, i, j] + bias[c]`` 。這就是
# 一個輸出 ``c · r²`` 個通道的 1×1 conv，而 ``pixel_shuffle(r)`` 把它的第 ``c·r² + a·r + b``
# 個通道搬到 ``(c, r·i + a, r·j + b)`` 。 ``as_pixel_shuffle`` 從 ``ConvTranspose2d`` 的
# weight 建出它，其他的轉置 conv 一律拒絕。輸出相同（容許誤差 1e-5：加總的順序不同）；x86 把
# 新的 conv 變成 int8。


def as_pixel_shuffle(up: nn.ConvTranspose2d) -> nn.Sequential:
    r = up.stride[0]
    if not (
        up.kernel_size == up.stride == (r, r)
        and up.padding == up.output_padding == (0, 0)
        and up.dilation == (1, 1)
        and up.groups == 1
    ):
        raise ValueError(
            f"{up} 不是一個 pixel shuffle：需要 kernel_size == stride（正方形）、沒有 padding "
            "與 output_padding、dilation 為 1、groups 為 1；請保留這一層原本的樣子"
        )
    cin, cout = up.in_channels, up.out_channels
    conv = nn.Conv2d(cin, cout * r * r, 1, bias=up.bias is not None)
    with torch.no_grad():  # W[k, c, a, b] -> conv 的 weight [c·r² + a·r + b, k]
        conv.weight.copy_(up.weight.permute(1, 2, 3, 0).reshape(cout * r * r, cin, 1, 1))
        if up.bias is not None:
            conv.bias.copy_(up.bias.repeat_interleave(r * r))
    return nn.Sequential(conv, nn.PixelShuffle(r))


shuffled = copy.deepcopy(unet)
shuffled.up = as_pixel_shuffle(unet.up)
torch.testing.assert_close(shuffled(*feature_map), unet(*feature_map), rtol=0, atol=1e-5)
shuffle_report = coverage(export_module(shuffled, feature_map), x86_quantizer(), every_op=True)
show(SHUFFLED, shuffle_report)
assert computing(shuffle_report)["conv"] == (3, 3), "每個 conv 都是 int8"
assert shuffle_report.statuses("pixel_shuffle") == {"float": 1}

# %%
# 一個浮點數運算變成了 int8，另一個浮點數運算卻補上了它的位置： ``pixel_shuffle`` 也不在
# x86 的運算集合裡，所以它後面的 ``cat`` 仍然有一個浮點數輸入。實際執行的：改寫前，是 oneDNN
# 的浮點數轉置 conv（ ``mkldnn::_convolution_transpose_pointwise`` ）加上兩個 int8 conv；
# 改寫後，是三個 int8 conv，沒有任何浮點數的 conv kernel。

unet_race = race(
    {
        TRANSPOSED: quantized(export_module(unet, feature_map), feature_map, x86_quantizer()),
        SHUFFLED: quantized(export_module(shuffled, feature_map), feature_map, x86_quantizer()),
    },
    feature_map,
)
print(unet_race.table())
before, after = unet_race.kernels.values()
assert before.int8["onednn::qconv_pointwise"] == 2
assert before.float == {"mkldnn::_convolution_transpose_pointwise": 1}
assert after.int8["onednn::qconv_pointwise"] == 3 and not after.float
print(verdict(unet_race, TRANSPOSED, SHUFFLED))

# %%
# 轉置 conv 原本只是小特徵圖上的一個浮點數 kernel；換成 int8 之後，新的 conv 前面多了一個
# quantize，後面還留著一個浮點數運算： ``pixel_shuffle`` 搬移資料的那一次複製。上面的結論就是
# 這台機器量到的結果。
#
# 步驟 4 — 給 XNNPACK 一個 keepdim 的 4-D mean
# --------------------------------------------
# 一個要放上手機的 1-D 關鍵字偵測模型：兩個 ``Conv1d`` + ReLU，處理 49 個音框、每個音框 16 個
# 特徵，接著對時間取 mean，最後一個 linear 輸出 8 個詞。 ``XNNPACKQuantizer`` 把 ``mean``
# 標註為 int8（共用它輸入的 qparams），但 ``XnnpackPartitioner`` 的 ``mean.dim`` config
# 只接受對最後兩個維度（H 與 W）取平均、 ``keepdim=True`` 的 4-D 輸入；這個對 3-D 張量最後
# 一軸取的 mean，會交給 ExecuTorch 的 portable kernel 以浮點數執行。


class TimeMean(nn.Module):
    def forward(self, x):  # (N, C, T) -> (N, C)
        return x.mean(-1)


class TimeMean4d(nn.Module):
    """同一個 mean，寫成對 H 與 W、keepdim 的 4-D mean：(N, C, 1, T) -> (N, C, 1, 1)。"""

    def forward(self, x):
        n, c, t = x.shape
        return x.reshape(n, c, 1, t).mean((2, 3), keepdim=True).flatten(1)


class KeywordSpotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.relu1 = nn.Conv1d(16, 32, 5, padding=2), nn.ReLU()
        self.conv2, self.relu2 = nn.Conv1d(32, 32, 5, padding=2), nn.ReLU()
        self.pool, self.fc = TimeMean(), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x))))))


torch.manual_seed(0)
spotter = KeywordSpotter().eval()
frames = (torch.randn(2, 16, 49, generator=torch.Generator().manual_seed(1)),)
spotter_4d = copy.deepcopy(spotter)
spotter_4d.pool = TimeMean4d()
torch.testing.assert_close(spotter_4d(*frames), spotter(*frames), rtol=0, atol=1e-6)

# %%
# 報告（ ``every_op=True`` ）會說出 partitioner 將拒絕什麼； ``reshape`` 與 ``flatten`` 只搬動
# 值，XNNPACK 讓 int8 直接通過它們。

spotters = {MEAN_OVER_T: spotter, MEAN_4D: spotter_4d}
xnnpack_reports = {}
for label, model in spotters.items():
    report = coverage(export_module(model, frames), xnnpack_quantizer(), every_op=True)
    show(label, report)
    print(f"  mean：{report[report.names(op='mean')[0]].why}")
    xnnpack_reports[label] = report
assert xnnpack_reports[MEAN_OVER_T].statuses("mean") == {"float": 1}
assert xnnpack_reports[MEAN_4D].statuses("mean") == {"int8 shared": 1}

# %%
# 用 ``XnnpackPartitioner`` 下放，再帶著 ETDump 在 ExecuTorch 執行環境上執行一次
# （ ``operators_run`` ，M06）：改寫前，有一個 portable kernel ``mean.out`` 以浮點數執行；
# 改寫後一個也沒有：每個運算都在 XNNPACK 裡執行，也沒有任何 XNNPACK 運算子的名稱標明浮點數
# （其中的 mean 與 reshape 名稱沒有標明資料型別：摘要把它們另外列出）。兩個程式與浮點數模型
# 的差距都在 0.02 之內。

programs, methods = {}, {}
for label, model in spotters.items():
    int8 = quantized(export_module(model, frames), frames, xnnpack_quantizer())
    programs[label] = to_executorch(int8, frames, partitioner=XnnpackPartitioner()).buffer
    ran = operators_run(programs[label], frames)
    print(f"{label}：\n{ran.summary}")
    loaded = Runtime.get().load_program(programs[label])  # 和它的方法一起保持存活
    methods[label] = (loaded, loaded.load_method("forward"))
    (out,) = methods[label][1].execute(list(frames))
    torch.testing.assert_close(out, spotter(*frames), rtol=0, atol=0.02)
    assert not ran.float_only, f"{label}：沒有以浮點數執行的 XNNPACK 運算子"
    assert ran.portable == ({"mean.out": 1} if label == MEAN_OVER_T else {}), ran.portable

# %%
# 在執行環境上計時（一個執行緒、交錯輪流）。對 49 個值取 mean 只占這個模型的一小部分；結論
# 就是這台機器量到的結果。

key = hashlib.sha256(b"".join(programs.values())).hexdigest()
spotter_timing = compare_speed(
    {label: lambda *x, m=method: m.execute(list(x)) for label, (_, method) in methods.items()},
    frames,
    rounds=100,
    key=key,
)
print(spotter_timing.table())
print(verdict(spotter_timing, MEAN_OVER_T, MEAN_4D))

# %%
# 步驟 5 — 拿掉 eval 模式的 dropout node
# --------------------------------------
# ``nn.TransformerEncoderLayer`` （寬度 64、4 個 head）計算 ``norm2(x + dropout2(linear2(
# ...)))`` 。在 eval 模式下 ``dropout2`` 什麼也不做，但匯出的圖把它留成一個 ``train=False``
# 的 ``aten.dropout`` node，夾在 ``linear2`` 與 add 之間；而 x86 的 linear + add 模式要求
# add 緊接在 linear 之後（M07-1 的步驟 4）。一個圖的 pass 就能移除這類 node；訓練模式的
# dropout 會改變輸出，所以遇到時它會拒絕。

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
tokens = (torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1)),)
layer_graph = export_module(layer, tokens)


def drop_eval_dropout(graph: torch.fx.GraphModule) -> list[str]:
    """移除每個 ``train=False`` 的 ``aten.dropout`` node（恆等運算）；回傳它們的名稱。"""
    removed = []
    for node in graph.graph.find_nodes(op="call_function", target=aten.dropout.default):
        if node.args[2] is not False:
            raise ValueError(
                f"{node.name} 是訓練模式的 dropout（train={node.args[2]}）；移除它會改變輸出："
                "請先在 eval 模式下匯出模型（model.eval()）"
            )
        node.replace_all_uses_with(node.args[0])
        graph.graph.erase_node(node)
        removed.append(node.name)
    graph.recompile()
    return removed


no_dropout = copy.deepcopy(layer_graph)
print(drop_eval_dropout(no_dropout))
assert torch.equal(no_dropout(*tokens), layer_graph(*tokens)), "這些 dropout 都是恆等運算"

# %%
# ``linear2`` 之後的 add 變成 ``int8 融合`` 。另一個 add 仍是浮點數：它接在 attention 後面，
# 而 attention 的輸出投影是 ``nn.MultiheadAttention`` 裡的一次 ``F.linear`` 呼叫，x86 不會
# 標註它（M07-2 把 attention 換成 x86 會標註的版本）。

layer_reports = {}
for label, graph in ((WITH_DROPOUT, layer_graph), (NO_DROPOUT, no_dropout)):
    layer_reports[label] = coverage(graph, x86_quantizer(), every_op=True)
    show(label, layer_reports[label])
print(layer_reports[NO_DROPOUT].table(only="add"))
assert computing(layer_reports[WITH_DROPOUT])["add"] == (0, 2)
assert computing(layer_reports[NO_DROPOUT])["add"] == (1, 2)

# %%
# 實際執行的又是另一回事。兩個 int8 模型算出完全相同的輸出，編譯後也執行相同的 kernel：
# inductor 自己就會移除 eval 模式的 dropout，而它的 int8 linear 融合會把 int8 linear 後面的
# 浮點數 add 當成 kernel 的 add post-op，不論 quantizer 有沒有標註它。這個改寫改變的是報告，
# 不是程式（attention 的兩個浮點數 linear 是兩者共同的浮點數 kernel）。

layer_int8 = {
    WITH_DROPOUT: quantized(layer_graph, tokens, x86_quantizer()),
    NO_DROPOUT: quantized(no_dropout, tokens, x86_quantizer()),
}
same = torch.equal(layer_int8[WITH_DROPOUT](*tokens), layer_int8[NO_DROPOUT](*tokens))
assert same, "兩個 int8 模型算出相同的結果"
layer_race = race(layer_int8, tokens)
print(layer_race.table())
with_dropout, without = layer_race.kernels.values()
assert with_dropout.int8 == without.int8 and with_dropout.float == without.float
assert with_dropout.post_ops == without.post_ops and with_dropout.post_ops[linear]["add"] == 1
assert sum(with_dropout.float.values()) == 2, "attention 的兩個 linear 是浮點數"
print(verdict(layer_race, WITH_DROPOUT, NO_DROPOUT))

# %%
# 步驟 6 — 讓遞迴模型的每個步驟各有自己的 weight
# ----------------------------------------------
# 一個用 ``nn.Linear`` 寫成的 GRU，照使用者平常的寫法：一個 cell 用兩個 linear 算出 reset、
# update 與 candidate 三個 gate，一個 linear 讀步驟的輸入，另一個讀隱藏狀態；模型在每個
# 步驟呼叫同一個 cell，最後接一個 linear head。 ``GRUPerStep`` 是 M07-4 步驟 3 的解法：同一個
# 模型，但每個步驟各有一份 cell 的副本，於是每次 linear 呼叫都讀自己的 int8 weight。


class GRUCell(nn.Module):
    def __init__(self, features=64, width=256):
        super().__init__()
        self.x_gates, self.h_gates = nn.Linear(features, 3 * width), nn.Linear(width, 3 * width)

    def forward(self, x, h):
        xr, xz, xn = self.x_gates(x).chunk(3, -1)
        hr, hz, hn = self.h_gates(h).chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1 - z) * torch.tanh(xn + r * hn) + z * h


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell, self.head = GRUCell(), nn.Linear(256, 10)

    def forward(self, x, h):  # x：(N, 步驟數, 64)，h：(N, 256)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.head(h)


class GRUPerStep(nn.Module):
    """``gru`` 的每個步驟（共 ``steps`` 個）各有一份 cell 的副本。"""

    def __init__(self, gru: GRU, steps: int):
        super().__init__()
        self.cells = nn.ModuleList(copy.deepcopy(gru.cell) for _ in range(steps))
        self.head = copy.deepcopy(gru.head)

    def forward(self, x, h):
        for t, cell in enumerate(self.cells):
            h = cell(x[:, t], h)
        return self.head(h)


# %%
# 8 個步驟，一個批次 128 個序列。副本的數值都相同：輸出也完全相同。

STEPS = 8
torch.manual_seed(0)
gru = GRU().eval()
sequence = torch.randn(128, STEPS, 64, generator=torch.Generator().manual_seed(1))
gru_args = (sequence, torch.zeros(128, 256))
per_step = GRUPerStep(gru, STEPS).eval()
assert torch.equal(per_step(*gru_args), gru(*gru_args)), "每個步驟都是同一個 cell 的數值"

# %%
# 單獨 convert 一個步驟：x86 把兩個 linear 與三個 mul 都量化成 int8（每個 mul 都是兩個同形狀
# 張量相乘），add、sigmoid 與 tanh 則留在浮點數。int8 運算的輸入都要先 quantize：步驟的
# 輸入、它收到的隱藏狀態，以及 mul 相乘的值。展開後的模型在每個步驟都這樣做一次。

cell_args = (sequence[:, 0], gru_args[1])
cell_graph = export_module(gru.cell, cell_args)
cell_report = coverage(cell_graph, x86_quantizer(), every_op=True)
show("單一步驟", cell_report)
cell_ops = {"linear": (2, 2), "mul": (3, 3), "add": (0, 4), "activation": (0, 3)}
assert computing(cell_report) == cell_ops, "linear 與 mul 是 int8；add、sigmoid、tanh 是浮點數"
cell_int8 = quantized(cell_graph, cell_args, x86_quantizer())
quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
quantizes = cell_int8.graph.find_nodes(op="call_function", target=quantize)
print(f"單一步驟有 {len(quantizes)} 個 quantize node")
quantized_inputs = {n.args[0].name for n in quantizes if n.args[0].op == "placeholder"}
assert quantized_inputs == {"x", "h"}, "步驟的輸入與隱藏狀態都經過 quantize"

# %%
# convert 之後，兩個 int8 模型的每個 linear 都經由一個 dequantize node 讀取 weight：在圖裡
# 都是 int8。以 freezing 編譯、與 fp32 一起計時（ ``race`` ），它們執行的 kernel 卻不同。
# 照原本的寫法，只有讀取一次的 head 以 int8 執行；cell 的兩個 linear 在每個步驟都以浮點數
# 執行（ ``aten::addmm`` ），因為它們的 weight 各被 8 個 linear 讀取。每個步驟一份副本時，
# 每個 linear 都執行 oneDNN 的 int8 kernel，沒有一個以浮點數執行。

GRU_FP32, SHARED, PER_STEP = "fp32", "int8，一個 cell", "int8，每步一個 cell"
gru_models = {
    GRU_FP32: export_module(gru, gru_args),
    SHARED: quantized(export_module(gru, gru_args), gru_args, x86_quantizer()),
    PER_STEP: quantized(export_module(per_step, gru_args), gru_args, x86_quantizer()),
}
dequantize_weight = torch.ops.quantized_decomposed.dequantize_per_channel.default
for label in (SHARED, PER_STEP):
    linears = gru_models[label].graph.find_nodes(op="call_function", target=aten.linear.default)
    assert {n.args[1].target for n in linears} == {dequantize_weight}, f"{label}：linear 都是 int8"
gru_race = race(gru_models, gru_args, rounds=60)
print(gru_race.table())
ran_one, ran_per_step = gru_race.kernels[SHARED], gru_race.kernels[PER_STEP]
assert ran_one.int8 == {linear: 1}, "只有 head 以 int8 執行"
assert ran_one.float == {"aten::addmm": 2 * STEPS}, "cell 的 linear 在每個步驟都是浮點數"
assert ran_per_step.int8 == {linear: 2 * STEPS + 1} and not ran_per_step.float, "全部是 int8"

# %%
# 與 fp32 相比，改寫後的模型以 q/dq 圖執行（不編譯）時，SQNR 高於 30 dB（M01-1 的界線：誤差
# 的範數不到輸出的 3 %）。有 VNNI 時，兩個編譯後的模型也一樣。沒有 VNNI 時，oneDNN 的 int8
# linear 以 16 位元累加成對的 uint8 × int8 乘積，可能飽和，編譯後的模型就可能遠低於這條線
# （M04-2 量測了這件事，並用 ``reduce_range`` 解決）；表格的 CPU 那一行說明這一頁是在哪一種
# 情況下建置的。接著是判定：fp32 與每個 int8 模型的比較，在同樣的輪次裡量測。

with as_compiled(gru_race.threads):  # 與編譯時相同，否則會重新編譯（見 race 的說明）
    gru_float = gru(*gru_args)
    gru_sqnr = {"q/dq": sqnr(gru_float, gru_models[PER_STEP](*gru_args)).item()}
    gru_sqnr |= {
        k: sqnr(gru_float, gru_race.models[k](*gru_args)).item() for k in (SHARED, PER_STEP)
    }
    split = {label: time_by_kind(model, gru_args) for label, model in gru_race.models.items()}
print("；".join(f"{label}：{db:.1f} dB" for label, db in gru_sqnr.items()))
assert gru_sqnr["q/dq"] > 30, "q/dq 模型高於 30 dB"
if describe().vnni:
    assert min(gru_sqnr.values()) > 30, "有 VNNI 時，編譯後的 int8 模型也高於 30 dB"
print(verdict(gru_race, GRU_FP32, SHARED))
print(verdict(gru_race, GRU_FP32, PER_STEP))

# %%
# 一次呼叫的時間花在哪裡（ ``time_by_kind`` ，M03-3：profiler 把一次呼叫分成 int8 kernel、
# 浮點數 kernel 與其餘部分），只印出來，從不 assert：

for label, parts in split.items():
    print(f"{label}：" + "，".join(f"{kind} {ms:.2f} ms" for kind, ms in parts.items()))
fp32_split, int8_split = split[GRU_FP32], split[PER_STEP]
print(
    f"只看 linear：int8 快 {fp32_split['float'] / int8_split['int8']:.2f} 倍；其餘部分："
    f"fp32 {fp32_split['other']:.2f} ms，int8 {int8_split['other']:.2f} ms"
)

# %%
# int8 在遞迴模型上能換來多少，受什麼限制：int8 kernel 加快的是 linear，而 linear 只是一個
# 步驟的一部分；conv 網路的時間則大多花在 conv 上（M03-3）。每個步驟的兩個 linear 都是小小的
# 矩陣乘積（128 列分別乘上 64×768 與 256×768 的 weight）；步驟的其餘部分（算在上面的
# ``other`` 裡）是 gate 的 add、sigmoid 與 tanh（留在浮點數），以及步驟輸入、隱藏狀態與 mul
# 輸入的 quantize 和 dequantize（只有 int8 模型要算）；這兩者 inductor 都在它產生的迴圈裡
# 執行。int8 kernel 對這部分毫無幫助，quantize 還在其中多加了工作：整個模型的加速比只看
# linear 時少（把 linear 的倍數和第二個判定比一比）。照原本的寫法，int8 模型保留了浮點數的
# linear，卻仍然要 quantize：第一個判定說明這在這台機器上是否讓它比 fp32 慢。

# %%
# 小結
# ----
# ===============================  =============================  ==========================
# 改寫                             int8：改寫前 → 改寫後          實際執行的 kernel
# ===============================  =============================  ==========================
# 折疊 layer scale（x86）          3 個浮點數 → 2 個（mul 消失）  相同的 oneDNN kernel
# add 緊接它的 linear（x86）       2 個浮點數 → 1 個（add 融合）  多了 add 這個 post-op
# ConvTranspose2d → 1×1 + shuffle  conv 2/3 → 3/3                 不再有浮點數的 conv kernel
# 4-D keepdim mean（XNNPACK）      mean 浮點數 → int8             不再有 portable kernel
# 拿掉 eval 模式的 dropout（x86）  add 0/2 → 1/2                  相同的 kernel、相同的輸出
# 每步一份 GRU cell（x86）         兩者的 linear 都是 int8        addmm ×16 → qlinear ×17
# ===============================  =============================  ==========================
#
# 每一個改寫都保持輸出不變；前五個讓 quantizer 報告裡的 int8 運算變多，第六個讓編譯後的 int8
# kernel 變多。這換來了什麼，就是上面這台機器量到的計時結果，而原因 kernel 那幾行都看得到：
# 浮點數的 ``mul`` 與 ``add`` 本來就不是獨立的 kernel，inductor 在它反正要跑的迴圈裡就算掉
# 了；轉置 conv 只是一個小小的浮點數 kernel，換來的是一個 quantize 和一個浮點數的
# ``pixel_shuffle`` ；mean 只占關鍵字偵測模型的一小部分工作；拿掉 dropout 的改寫則沒有改變
# 任何 kernel。GRU 的副本讓圖裡的每個 linear 一如以往都是 int8，改變的是執行的 kernel：它的
# linear 以 int8 執行，周圍則是 gate 與 quantize 的工作，而 int8 加快不了這些。只有當改寫後
# 變成 int8 的那個運算本身很吃重時，才值得為 int8 改寫（大特徵圖上的轉置 conv；若不改寫，
# 就得離開 XNNPACK delegate 去執行的 mean）；改寫之後要計時，並檢查融合 kernel 收到的記憶體
# 配置：融合的 add 若收到轉置過的殘差，oneDNN 會用它的參考實作執行。
#
# 練習
# ----
# 1. 不移除 node，改用 ``dropout=0.0`` 建立這層 Transformer。預測 x86 的 int8 add 數。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          zero = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
#          zero_report = coverage(export_module(zero, tokens), x86_quantizer(), every_op=True)
#          assert computing(zero_report)["add"] == (0, 2), "p=0.0 仍然匯出 dropout node"
#
# 2. 把 ``ConvTranspose2d(32, 16, 3, stride=2, padding=1)`` 交給 ``as_pixel_shuffle`` 。
#    預測會發生什麼事。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#
#          with expect_error(ValueError, match="kernel_size == stride"):
#              as_pixel_shuffle(nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1))
#
# 3. 把原本寫法與經過步驟 3 改寫的 U-Net 步驟都為 XNNPACK 下放，各執行一次
#    （ ``operators_run`` ）。預測兩者之中，哪一個在 XNNPACK 裡只執行 int8 運算子，而且沒有
#    留任何運算給 portable kernel。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          for label, model in ((TRANSPOSED, unet), (SHUFFLED, shuffled)):
#              graph = export_module(model, feature_map)
#              int8 = quantized(graph, feature_map, xnnpack_quantizer())
#              pte = to_executorch(int8, feature_map, partitioner=XnnpackPartitioner()).buffer
#              ran = operators_run(pte, feature_map)
#              print(f"{label}：\n{ran.summary}")
#              rewritten = label == SHUFFLED
#              assert bool(ran.float_only) == bool(ran.portable) == rewritten, (
#                  "原本的寫法：XNNPACK 的 int8 轉置 conv；改寫後：浮點數的 pixel_shuffle"
#              )
#
# 延伸閱讀
# --------
# - `X86InductorQuantizer 原始碼
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `inductor 的 int8 融合（torch/_inductor/fx_passes/quantization.py）
#   <https://github.com/pytorch/pytorch/blob/main/torch/_inductor/fx_passes/quantization.py>`_
# - `XNNPACK partitioner 的 config
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/partition/config>`_
#
# 下一課
# ------
# M07 到此結束；疑難排解的條目從你自己的模型可能引發的錯誤出發，例如 :ref:`疑難排解：prepare
# 與 convert <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` 。
