"""
M08-3 放上手機：會生成文字的 .pte
=================================

M08-1 的解碼器，用 ExecuTorch 的 LLM 做法量化之後（8da4w 加上 8 位元 embedding，M08-2），在這裡
變成手機 app 唯一要載入的檔案：一個 ``.pte`` ，先接收提示詞，之後每次呼叫接收一個 token，並在
呼叫之間保留它的 KV 快取。本課把它下放到 XNNPACK，在程式裡找到快取（執行環境規劃的記憶體，而
不是檔案裡的位元組），在 ExecuTorch 執行環境上生成文字並和 eager 模型比較，列出實際執行的
運算子與它們的資料型別，並量測每秒 token 數與位元組數。

**你會學到**

- 帶有 8 位元 embedding 的 8da4w 模型，如何下放成同時負責 prefill 與 decode 的單一 ``.pte`` ，
  以及它的 KV 快取放在哪裡
- 執行環境生成的文字與困惑度離 eager 模型有多近，以及為什麼不完全相同
- 哪些運算在 XNNPACK 裡以 int4 執行、哪些在 portable kernel 上執行，以及換來多少每秒 token 數
  與位元組

**先備知識**：
:ref:`M06-2 · 下放到 ExecuTorch
<sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`、
:ref:`M06-3 · 由內而外看 .pte <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`、
:ref:`M08-2 · 三種量化方式
<sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 訓練好的解碼器（M08-1）。整頁都使用計時用的執行緒數量：在兩個共用的核心上，兩個執行緒會互相
# 等待，每次 eager 呼叫都要慢上好幾倍。XNNPACK 的執行緒池也設成同樣的數量，而且要在載入任何方法
# 之前設定（M06-3）。

import contextlib
import copy
import io
import itertools
import json
import re
import textwrap
import warnings
from pathlib import Path

import torch
from torch import nn

from common.cache import cached_path
from common.charts import display_width, pad
from common.digest import digest
from common.language_model import (
    WINDOW,
    RMSNorm,
    encode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    train_decoder,
)
from common.pt2e import quiet
from common.results import publish
from common.timing import compare_speed, timing_threads
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import _get_extended_header
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.runtime import load_quantized_kernels, operators_run

threads_before = torch.get_num_threads()
torch.set_num_threads(timing_threads())
with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
    warnings.filterwarnings("ignore", message="This API is experimental")
    portable_lib._unsafe_reset_threadpool(timing_threads())

model, _ = train_decoder()
PROMPT, LENGTH = "The import statement", 60

# %%
# M08-2 的做法：每個 linear 都用 int8 動態 activation 與每 32 個一組的 int4 weight
# （ **8da4w** ），embedding 的每個值存成一個 int8，每一列一個 scale。

LINEARS_8DA4W = Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int4, weight_granularity=PerGroup(32)
)
EMBEDDING_8BIT = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))


def quantized(*, embedding_8bit: bool = True) -> nn.Module:
    """套用這個做法的解碼器副本；要求時 embedding 保持 fp32。"""
    copied = copy.deepcopy(model)
    if embedding_8bit:
        quantize_(copied, EMBEDDING_8BIT, filter_fn=lambda m, _: isinstance(m, nn.Embedding))
    quantize_(copied, LINEARS_8DA4W)
    return copied


eager_8da4w = quantized()
print(f"embedding：{type(eager_8da4w.tok_embeddings.weight).__name__}")
print(f"linear：   {type(eager_8da4w.layers[0].attention.wq.weight).__name__}")

# %%
# 步驟 1 — 下放
# -------------
# 在 ``export_decoder`` （從 1 到 ``MAX_LEN`` 的每個長度共用一個程式，M08-1）上做 M06-2 的下放，
# 再加上這個做法需要的兩件事。第一，匯出（由 ``export_decoder`` 負責）與下放都在
# ``torch.no_grad()`` 下執行：追蹤梯度的圖，其中的快取更新無法下放（ ``a leaf Variable that
# requires grad is being used in an in-place operation`` ）。第二， ``to_executorch`` 要傳入
# ``do_quant_fusion_and_const_prop=True`` ，ExecuTorch 自己的 LLM 匯出也用這個設定：XNNPACK
# 不接手 embedding，所以 8 位元 embedding 的 ``dequantize_affine`` 留在 delegate 之外，少了這個
# pass， ``to_executorch`` 會停在 ``Missing out variants: {'torchao::dequantize_affine'}``
# （ :ref:`疑難排解：ExecuTorch 與 XNNPACK
# <sphx_glr_lessons_troubleshooting_m99_5_executorch_and_xnnpack.py>` ）；有了它，dequantize
# 與 embedding 合併成一個 ``quantized_decomposed::embedding_byte`` 。
#
# 下放這張圖要花一分鐘左右，所以 ``lowered`` 把 ``.pte`` 存在 ``build/cache/`` ，以產生它的一切
# 的摘要命名，旁邊再存著步驟 2 要從下放後程式的 graph signature 讀取的內容。它先清空 decoder 的
# KV 快取：摘要讀每一個 buffer，快取的也算在內，而步驟 5 的計時一跑就會把它填滿。


def lowered(name: str, make_model) -> tuple[bytes, dict]:
    """``make_model()`` 的 ``.pte`` ，以及它被修改的 buffer 的紀錄（有快取）。"""
    reset_cache(model)  # 程式一律從空的 KV 快取開始，不管之前跑過什麼

    def lower(folder: Path) -> None:
        exported = export_decoder(make_model())
        with torch.no_grad(), warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
            config = ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)
            program = edge.to_executorch(config)
        signature = program.exported_program().graph_signature
        buffers = {v: k for k, v in signature.inputs_to_buffers.items()}  # name -> placeholder
        placeholders = {n.name: n for n in program.exported_program().graph.nodes}
        specs = {}
        for buffer in signature.buffers_to_mutate.values():
            spec = placeholders[buffers[buffer]].meta["spec"]
            specs[buffer] = {"const": spec.const, "mem_id": spec.mem_id, "offset": spec.mem_offset}
        mutation = [str(w.message) for w in said if "Mutation on a buffer" in str(w.message)]
        folder.mkdir()
        (folder / "model.pte").write_bytes(program.buffer)
        notes = {"mutated": dict(signature.buffers_to_mutate), "specs": specs, "said": mutation}
        (folder / "notes.json").write_text(json.dumps(notes))

    recipe = [repr(LINEARS_8DA4W), repr(EMBEDDING_8BIT)]
    folder = cached_path("executorch", f"m08_3-{name}-{digest(model, name, recipe)}", lower)
    return (folder / "model.pte").read_bytes(), json.loads((folder / "notes.json").read_text())


pte, notes = lowered("8da4w", quantized)
print(f"8da4w .pte：{len(pte):,} 位元組")

# %%
# ``.pte`` 在 delegate 之外點名的每個運算子，執行環境都必須有對應的 kernel。
# ``embedding_byte.out`` 不在 portable kernel 裡，而在 ExecuTorch 的量化 kernel 裡，那是 app 要
# 連結的一個函式庫（ ``quantized_ops_lib`` ）。PyPI 上的執行環境以
# ``lib/libexecutorch_kernels_quantized.so`` 提供它， ``import executorch.kernels.quantized``
# 會載入它（同時也替 torch 加上 quantize／dequantize 運算）；只載入這個函式庫，就只會向執行環境
# 註冊 kernel（ ``common.runtime.load_quantized_kernels`` ）。少了它們， ``load_method``
# 會失敗，執行環境的紀錄寫著 ``Missing operator: quantized_decomposed::embedding_byte.out`` 。

header = _get_extended_header(pte)
plan = _flatbuffer_to_program(pte[: header.program_size]).execution_plan[0]
operators = sorted(f"{op.name}.{op.overload}".rstrip(".") for op in plan.operators)
print(f"delegate 之外有 {len(operators)} 個運算子：")
print(textwrap.fill(", ".join(operators), 96))
assert "quantized_decomposed::embedding_byte.out" in operators, "8 位元 embedding 的 kernel"
load_quantized_kernels()

# %%
# 步驟 2 — 快取留在程式裡
# ------------------------
# 下放後程式的 graph signature 列出方法會寫入的 buffer：八份快取（每個區塊一份 key 快取、一份
# value 快取）。每一份都是方法的一個輸出：把 ``index_put`` （分解後的 ``index_copy_`` ）算出的
# 結果 ``copy_`` 回 buffer。

for output, buffer in notes["mutated"].items():
    print(f"{output:26} -> {buffer}")
caches = [f"layers.{i}.attention.{kv}_cache" for i in range(len(model.layers)) for kv in "kv"]
assert sorted(notes["mutated"].values()) == sorted(caches), "每一份快取，沒有別的"

# %%
# 被修改的 buffer 不是常數：記憶體規劃在方法的記憶體區（arena，也就是規劃器配置的 memory 1）
# 裡給它一個位置，檔案只存它的形狀與 dtype。ExecuTorch 的 emitter 在寫出 ``.pte`` 時自己也這麼說。
# 快取是 8 × 64 kB，比 8da4w 程式所有 weight 加起來還多。

cache_bytes = model.layers[0].attention.k_cache.numel() * 4
print(textwrap.fill(notes["said"][0].split(". ")[1], 96))
for buffer, spec in notes["specs"].items():
    print(f"{buffer:26} const={spec['const']}  memory {spec['mem_id']}，位移 {spec['offset']:,}")
starts = sorted(spec["offset"] for spec in notes["specs"].values())
assert not any(spec["const"] for spec in notes["specs"].values()), "沒有一份快取是常數"
assert {spec["mem_id"] for spec in notes["specs"].values()} == {1}, "規劃在記憶體區裡"
assert all(b - a >= cache_bytes for a, b in itertools.pairwise(starts)), "8 個互不重疊的位置"

# %%
# 檔案的內容也一致：規劃在這些位移上的張量，在 ``.pte`` 裡沒有資料（ ``data_buffer_idx`` 為
# 0），執行環境配置的記憶體區容納得下它們，而常數（portable kernel 的常數區段與 XNNPACK 的具名
# 資料）加起來比快取還少。

tensors = [v.val for v in plan.values if type(v.val).__name__ == "Tensor"]
at = {t.allocation_info.memory_offset_low: t for t in tensors if t.allocation_info}
program = _flatbuffer_to_program(pte[: header.program_size])
payloads = {delegate.processed.index for delegate in plan.delegates}
constants = sum(s.size for i, s in enumerate(program.segments) if i not in payloads)
arena = plan.non_const_buffer_sizes[1]
print(f"快取 {len(caches)} × {cache_bytes:,} 位元組；記憶體區 {arena:,}；常數 {constants:,}")
assert all(at[start].data_buffer_idx == 0 for start in starts), "快取沒有存任何資料"
assert max(starts) + cache_bytes <= arena, "記憶體區容納每一份快取"
assert constants < len(caches) * cache_bytes, "快取比所有 weight 加起來還大"

# %%
# ``.pte`` 執行的是一串指令（M06-3）：以索引讀寫值的 kernel 呼叫與 delegate 呼叫。
# ``first_block`` 把到第二個區塊為止的指令串變成一張圖：每個呼叫一個節點，它讀取的每個規劃好的
# 張量一條邊（ ``et_view`` 只是 view，不成為節點），最後是為這個區塊的兩份快取收尾的
# ``copy_`` 呼叫。


def first_block(plan, names: dict) -> torch.fx.GraphModule:
    """方法到第二個區塊為止的指令串，畫成一張圖：每個 kernel 或 delegate 呼叫一個節點，它讀取
    的每個規劃好的張量一條邊，最後是複製回它的快取的呼叫（以 ``names`` 命名：記憶體區位移對應
    buffer 名稱）。"""
    calls = [instruction.instr_args for instruction in plan.chains[0].instructions]

    def name(call) -> str:  # 例如 "aten::mean.out"；delegate 呼叫沒有運算子
        if type(call).__name__ == "DelegateCall":
            return "executorch_call_delegate"
        op = plan.operators[call.op_index]
        return f"{op.name}.{op.overload}".rstrip(".")

    def planned(index: int) -> bool:
        return getattr(plan.values[index].val, "allocation_info", None) is not None

    graph = torch.fx.Graph()
    made = {
        i: graph.placeholder(n) for i, n in zip(plan.inputs, ("tokens", "positions"), strict=True)
    }
    buffers = {
        i: graph.placeholder(names[plan.values[i].val.allocation_info.memory_offset_low])
        for i in range(min(plan.inputs))  # buffer 排在輸入之前
        if planned(i)
    }
    made |= buffers
    means = [k for k, call in enumerate(calls) if name(call) == "aten::mean.out"]
    block = calls[: means[2]]  # 到第二個區塊的第一個 RMSNorm 為止
    read = {a for call in block for a in call.args if a in buffers}
    copies = [c for c in calls if name(c) == "aten::copy_" and c.args[0] in read]
    for call in [*block, *copies]:
        if name(call) == "executorch_prim::et_view.default":  # view：沒有計算
            made[call.args[-1]] = made[call.args[0]]
            continue
        if name(call) == "executorch_call_delegate":
            target = torch.ops.higher_order.executorch_call_delegate
            writes = [a for a in call.args if a not in made and planned(a)]
        else:  # out 版本：最後一個引數是它寫入的張量
            namespace, op = name(call).split("::")
            op, _, overload = op.partition(".")
            target = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
            writes = call.args[-1:]
        node = graph.call_function(target, tuple(made[a] for a in call.args if a in made))
        made |= {a: node for a in writes}
        if call is block[-1]:
            kept = [node]  # 下一個區塊讀取的
    kept += [n for n in graph.nodes if n.target == torch.ops.aten.copy_.default]
    for unused in reversed(list(graph.nodes)):
        if not unused.users and unused not in kept:  # 只有後面區塊才讀取的
            graph.erase_node(unused)
    graph.output(tuple(kept))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# %%
# 執行環境執行的區塊 0：它的 key 與 value 快取（標示處）進入兩個 ``index_put`` 呼叫，attention
# 的 delegate 讀取它們的結果，再經由指令串最後的兩個 ``copy_`` 呼叫寫回。其餘每個方框不是
# portable kernel 就是 XNNPACK 的 delegate 呼叫；下面那一行算出這一個區塊的 delegate 呼叫次數。

names = {spec["offset"]: buffer.replace(".", "_") for buffer, spec in notes["specs"].items()}
block_0 = first_block(plan, names)
cache_ops = (torch.ops.aten.index_put.out, torch.ops.aten.copy_.default)
marked = [n.name for n in block_0.graph.nodes if n.name.endswith("_cache") or n.target in cache_ops]
draw(block_0, highlight=marked, title="8da4w .pte：區塊 0 的指令")
delegate_calls = [n for n in block_0.graph.nodes if "delegate" in n.name]
print(f"{len(delegate_calls)} 個 delegate 呼叫，標示了 {len(marked)} 個快取相關的節點")
assert len(marked) == 6, "兩份快取、兩個 index_put、兩個 copy_"

# %%
# 步驟 3 — 在執行環境上生成
# --------------------------
# ``step`` 讓執行環境的 ``forward`` 看起來就像模型： ``step(tokens, positions) -> logits`` ，
# 所以 ``generate`` 與 ``perplexity`` 可以像接收 eager 模型一樣接收它。快取存在載入的方法裡，
# ``generate`` 的提示詞 prefill 與每次 decode 呼叫都會填入它，就像填入 eager 模型的 buffer。
# 方法執行期間要一直保留 ``Program`` （M06-3）。


def on_runtime(pte: bytes):
    """``(program, step)`` ：載入的 ``.pte`` ，以及當成模型用的 ``forward`` 。"""
    with contextlib.redirect_stderr(io.StringIO()):  # 執行環境的 CPU 資訊紀錄（M06-3）
        program = Runtime.get().load_program(pte)
        forward = program.load_method("forward")

    def step(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return forward.execute([tokens, positions])[0]

    return program, step


runtime_program, step = on_runtime(pte)
texts = {
    "fp32 eager": generate(model, PROMPT, LENGTH),
    "8da4w eager": generate(eager_8da4w, PROMPT, LENGTH),
    "8da4w .pte": generate(step, PROMPT, LENGTH),
}
for label, text in texts.items():
    print(f"{label:12} {text!r}")
same = [a == b for a, b in zip(texts["8da4w .pte"], texts["8da4w eager"], strict=True)]
print(
    f".pte 寫出和 eager 8da4w 相同的文字：{all(same)}"
    + ("" if all(same) else f"（只有前 {same.index(False)} 個字元相同）")
)

# %%
# 如最後一行所說，執行環境的文字可能和 eager 8da4w 模型的分道揚鑣。兩者算的是同一個做法，只是
# 算術不同：torchao 的 eager linear 把 activation 逐列量化，再把它和 int4 weight 都 dequantize，
# 以 fp32 相乘；XNNPACK 的 kernel 用自己的方式量化每一列，再以 int32 逐區塊加總 int8 × int4 的
# 乘積。logits 因此略有差異，而兩個字元幾乎同分時，貪婪選擇可能翻轉；從那裡開始，文字就走上另一
# 條路。在保留的文字上以 teacher forcing 比較（每個位置都拿到前面真正的文字），差距就量得出來：
# 在 ``perplexity`` 讀取的 20 個視窗上，比較每個模型選出的下一個字元與 logits，並對照量化本身
# 造成的差距。

held_out, positions = split("held_out"), torch.arange(WINDOW)
agree, gap = {"runtime": 0.0, "quantization": 0.0}, {"runtime": 0.0, "quantization": 0.0}
with torch.no_grad():
    for start in range(0, 20 * WINDOW, WINDOW):
        window = held_out[start : start + WINDOW][None]
        fp32 = model(window, positions)
        eager = eager_8da4w(window, positions)
        runtime = step(window, positions)
        for key, (a, b) in (("runtime", (runtime, eager)), ("quantization", (eager, fp32))):
            agree[key] += (a.argmax(-1) == b.argmax(-1)).sum().item() / (20 * WINDOW)
            gap[key] = max(gap[key], (a - b).abs().max().item())
for key, label in (("runtime", "執行環境對 eager 8da4w"), ("quantization", "eager 8da4w 對 fp32")):
    print(f"{pad(label, 22)}  選擇相同 {agree[key]:.1%}，logits 相差不到 {gap[key]:.3f}")
assert agree["runtime"] > 0.98, "執行環境幾乎在每個位置都和 eager 模型選得一樣"
assert gap["runtime"] < gap["quantization"] / 4, "它的差距比量化造成的小得多"

# %%
# 用同一個 ``perplexity`` 函式算困惑度：執行環境和 eager 8da4w 模型只差不到百分之一，兩者都比
# fp32 略高（M08-2）。

scores = {"fp32": perplexity(model), "8da4w eager": perplexity(eager_8da4w)}
scores["8da4w .pte"] = perplexity(step)
print("  ".join(f"{label} {value:.3f}" for label, value in scores.items()))
assert abs(scores["8da4w .pte"] / scores["8da4w eager"] - 1) < 0.01, "和 eager 相差不到 1 %"

# %%
# 用同樣方式下放的浮點數程式，說明了差距從哪裡來：它的 XNNPACK kernel 加總的順序也和 eager
# fp32 不同，但沒有量化，就沒有值會落到捨入邊界的另一側。它的 logits 和 eager 模型相差不到
# 1e-4，貪婪生成的文字也一字不差。

fp32_pte, _ = lowered("fp32", lambda: model)
fp32_program, fp32_step = on_runtime(fp32_pte)
fp32_text = generate(fp32_step, PROMPT, LENGTH)
with torch.no_grad():
    fp32_gap = (fp32_step(window, positions) - model(window, positions)).abs().max().item()
print(f"fp32 .pte    {fp32_text!r}\nlogits 和 eager fp32 相差不到 {fp32_gap:.1e}")
assert fp32_text == texts["fp32 eager"], "浮點數 .pte 寫出和 eager 模型相同的文字"
assert fp32_gap < 1e-4, "浮點數 kernel：只有捨入誤差"

# %%
# 步驟 4 — 實際執行了什麼
# ------------------------
# ``operators_run`` （M06-4）帶著 ETDump 執行 ``.pte`` 一次，依名稱列出 XNNPACK 的運算子（名稱
# 帶有資料型別），以及 delegate 之外的 portable kernel：一次是提示詞的 prefill，一次是緊接在後
# 那個位置的 decode 步驟。

tokens = encode(PROMPT)
prefill = operators_run(pte, [tokens[None], torch.arange(len(tokens))])
decode_step = operators_run(pte, [tokens[None, -1:], torch.tensor([len(tokens)])])
print(prefill.summary)
assert decode_step.xnnpack == prefill.xnnpack, "decode 執行和 prefill 相同的運算子"
assert decode_step.portable == prefill.portable, "也執行相同的 portable kernel"

# %%
# 每個 linear 都以 XNNPACK 的 ``Fully Connected`` 執行，weight 是 ``QB4W`` （4 位元，每 32 個
# 一個 scale），activation 是動態量化的 int8（ ``QD8`` ； ``QDU8`` 是它的無號形式，XNNPACK 的
# x86 kernel 用它來做 VNNI 的無號 × 有號乘積）：每個區塊 7 個，加上輸出層，每次呼叫 29 個。
# attention 以浮點數執行（每個區塊兩個批次矩陣乘法與一個 softmax）。

linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
gemms = {op: n for op, n in prefill.xnnpack.items() if op.startswith("Fully Connected")}
for op, n in gemms.items():
    print(f"{op} ×{n}")
assert sum(gemms.values()) == len(linears) == 7 * len(model.layers) + 1, "每一個 linear"
types = [re.search(r"\((.*)\)", op)[1].split(", ") for op in gemms]
assert all(t[1].startswith("QD") and t[-1] == "QB4W" for t in types), "動態 int8 × int4"
assert prefill.xnnpack["Softmax (NC, F32)"] == len(model.layers), "attention：浮點數 softmax"
assert prefill.xnnpack["Batch Matrix Multiply (NC, F32) GEMM"] == 2 * len(model.layers), "QKᵀ 與 PV"

# %%
# 在 delegate 之外、由 portable kernel 執行的有：8 位元 embedding（ ``embedding_byte`` ）、每個
# RMSNorm 的平均（XNNPACK 的平均是全域平均池化，對 4 維張量內側的兩個維度取平均；RMSNorm 則對
# 3 維張量的最後一維取平均）、快取的寫入（ ``index_put`` 寫進快取的副本，再 ``copy_`` 回
# buffer）、旋轉位置編碼的切片，以及 attention 遮罩。在手機上，這些是 app 在 XNNPACK 之外連結的
# C++ kernel；快取的寫入每次呼叫都把每份 64 kB 的快取複製兩次，ExecuTorch 的 LLM 匯出用一個自訂
# 的快取更新運算避免這件事。

asked = ("embedding_byte.out", "mean.out", "index_put.out", "copy_")
print(f"每次呼叫 {sum(prefill.portable.values())} 次 portable kernel 呼叫，其中包括：")
print("、".join(f"{op} ×{prefill.portable[op]}" for op in asked))
norms = sum(isinstance(m, RMSNorm) for m in model.modules())
assert prefill.portable["embedding_byte.out"] == 1, "8 位元 embedding"
assert prefill.portable["mean.out"] == norms, "每個 RMSNorm 一個平均"
assert prefill.portable["index_put.out"] == prefill.portable["copy_"] == len(caches), "快取"

# %%
# 步驟 5 — 每秒 token 數
# ----------------------
# 64 個 token 的 prefill，以及位置 64 的一個 decode 步驟（decode 步驟在遮罩下讀取整份快取，所以
# 每個位置的成本都一樣），以交錯的輪次計時 eager fp32、eager 8da4w，以及執行環境上的 ``.pte`` ，
# 每個速度後面的括號是它的中位數的 95 % 信賴區間。結果取決於機器：和負載、執行緒數量與 CPU 一起
# 印出，從不 assert。XNNPACK 自己依 CPU 挑選 kernel；CPU 那一行描述的是 PyTorch 的。

LABELS = {"fp32": "fp32 eager", "eager": "8da4w eager", "pte": "8da4w .pte（執行環境）"}
calls = {LABELS["fp32"]: model, LABELS["eager"]: eager_8da4w, LABELS["pte"]: step}
key = digest(pte, model, repr(LINEARS_8DA4W), repr(EMBEDDING_8BIT))
prompt_64 = held_out[:64][None]
prefills = compare_speed(calls, (prompt_64, torch.arange(64)), key=key)
decodes = compare_speed(calls, (prompt_64[:, :1], torch.tensor([64])), key=key)


width = max(display_width(label) for label in calls)
columns = pad("prefill token/秒", 24, align=">"), pad("decode token/秒", 18, align=">")
print(f"{pad('', width)}  {columns[0]}  {columns[1]}")
for label in calls:
    print(f"{pad(label, width)}  {prefills[label].rate(64):>24}  {decodes[label].rate(1):>18}")
print(decodes.header())

# %%
# 哪一列最快取決於機器；上表是這次建置的結果。這個解碼器很小，所以 ``.pte`` 的一次呼叫大多是
# 固定成本：29 個小型 GEMM，夾在步驟 4 的 portable kernel 呼叫、進出 delegate 的切換與快取的複製
# 之間。eager 8da4w 把 torchao 的 quantize 與 dequantize 當成獨立的運算，包在 fp32 矩陣乘法外面，
# 沒有融合的 kernel：它模擬這個做法，而不會加速它。 ``.pte`` 帶給手機的，是一個不需要 Python
# 或 PyTorch 的執行環境，以及步驟 6 的位元組。

# %%
# 首頁引用 decode 的速度與 ``.pte`` 的大小。

publish("decode_tokens_per_s", round(1e3 / decodes[LABELS["pte"]].median, 1))
pte_decode = decodes[LABELS["pte"]]
publish(
    "decode_interval", [round(1e3 / t, 1) for t in (pte_decode.median_high, pte_decode.median_low)]
)
publish("decode_tokens_per_s_fp32", round(1e3 / decodes[LABELS["fp32"]].median, 1))
publish("timing_load", round(decodes.load[0], 2))
publish("pte_bytes", len(pte))

# %%
# 步驟 6 — 位元組
# ---------------
# 同一個做法但 embedding 保持 fp32，以及作為參考的 fp32 程式。在這個解碼器裡 embedding 只占一小部分
# （103 個字元 × 128）；在詞彙表有 100 000 個 token 的模型裡，它常常是最大的張量，這正是這個做法
# 要量化它的原因。

fp32_embedding_pte, _ = lowered("8da4w-fp32-embedding", lambda: quantized(embedding_8bit=False))
embedding_bytes = model.tok_embeddings.weight.numel() * 4
sizes = {"8da4w，8 位元 embedding": pte, "8da4w，fp32 embedding": fp32_embedding_pte}
sizes["fp32"] = fp32_pte
for label, data in sizes.items():
    print(f"{pad(label, 24)} {len(data):>10,} 位元組")
share = embedding_bytes / len(fp32_embedding_pte)
print(f"fp32 embedding：{embedding_bytes:,} 位元組，占它的 .pte 的 {share:.1%}")
saved = len(fp32_embedding_pte) - len(pte)
assert 0 < saved < embedding_bytes, "8 位元省下 embedding 大部分的位元組，但不會更多"
assert len(pte) < len(fp32_pte) / 4, "4 位元 linear：不到 fp32 檔案的四分之一"

# %%
# 步驟 7 — 另一條路：PT2E 的動態 int8
# ------------------------------------
# M08-2 給手機用的 PT2E 做法： ``XNNPACKQuantizer`` 搭配動態 int8 activation 與逐通道 int8
# weight，轉換之後用同樣的方式下放：先 prepare，呼叫一次（它的 weight observer 需要這一次呼叫，
# M08-2），再 convert，然後由 ``export_decoder`` 重新匯出。它讓 embedding 保持 fp32。


def pt2e_dynamic() -> nn.Module:
    """經過 ``XNNPACKQuantizer`` 動態 int8 的解碼器：prepare、呼叫一次、convert。"""
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    prepared = prepare_pt2e(export_decoder(model).module(), XNNPACKQuantizer().set_global(config))
    with torch.no_grad():
        prepared(tokens[None], torch.arange(len(tokens)))  # observer 需要的那一次呼叫
    return convert_pt2e(prepared)


pt2e_pte, _ = lowered("pt2e-dynamic-int8-per-channel", pt2e_dynamic)
pt2e_program, pt2e_step = on_runtime(pt2e_pte)
ran = operators_run(pt2e_pte, [tokens[None], torch.arange(len(tokens))])
pt2e_gemms = {op: n for op, n in ran.xnnpack.items() if op.startswith("Fully Connected")}
scores["PT2E .pte"] = perplexity(pt2e_step)
print(", ".join(f"{op} ×{n}" for op, n in pt2e_gemms.items()))
print(f"PT2E .pte：{len(pt2e_pte):,} 位元組，困惑度 {scores['PT2E .pte']:.3f}")
pt2e_types = [re.search(r"\((.*)\)", op)[1].split(", ") for op in pt2e_gemms]
assert sum(pt2e_gemms.values()) == len(linears), "每一個 linear 都在 XNNPACK 裡"
assert all(t[1].startswith("QD") and t[-1] == "QC8W" for t in pt2e_types), "動態 int8 × int8"
assert scores["fp32"] < scores["PT2E .pte"] < scores["8da4w .pte"], "8 位元 weight：更接近 fp32"
assert len(pte) < len(pt2e_pte) < len(fp32_pte), "介於 4 位元與 fp32 檔案之間"
torch.set_num_threads(threads_before)

# %%
# 小結
# ----
# - 在 ``torch.no_grad()`` 下做 ``export_decoder`` → ``to_edge_transform_and_lower`` 搭配
#   ``XnnpackPartitioner`` →
#   ``to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))`` ，得到同時
#   負責 prefill 與 decode 的單一 ``.pte`` 。8 位元 embedding 變成 ``embedding_byte`` ，這是
#   ExecuTorch 量化函式庫裡的 kernel，執行環境必須連結它。
# - KV 快取是被修改的 buffer：規劃在方法的記憶體區裡，不存在檔案中。
# - 在執行環境上， ``.pte`` 幾乎在每個位置都和 eager 8da4w 模型選得一樣，困惑度相差不到百分之一；
#   但在兩個字元幾乎同分的地方，貪婪生成的文字仍可能分道揚鑣。浮點數 ``.pte`` 則和 eager fp32
#   完全一致。
# - 每個 linear 都在 XNNPACK 裡以動態 int8 × int4（ ``QB4W`` ）執行；embedding、RMSNorm 的平均、
#   快取的寫入與 attention 遮罩在 portable kernel 上執行。
# - PT2E 的動態 int8 在 convert 並重新匯出之後，用同樣的方式下放：逐通道 int8 weight
#   （ ``QC8W`` ），檔案較大，困惑度更接近 fp32。
#
# 練習
# ----
# 1. 用 300 個字元對 ``.pte`` 做 prefill，超過它匯出時的 ``MAX_LEN`` （256）。預測執行環境會
#    怎麼做。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#          from common.language_model import MAX_LEN
#
#          long = held_out[:300][None]
#          with expect_error(RuntimeError), contextlib.redirect_stderr(io.StringIO()):
#              step(long, torch.arange(300))
#          assert long.shape[1] > MAX_LEN, "超過匯出時動態長度的上限"
#
# 2. 在同一個已載入的方法上，不重設快取，從同一個提示詞再生成一次。預測文字會不會改變。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          again = generate(step, PROMPT, LENGTH)
#          print(repr(again))
#          # prefill 會改寫位置 0 … len(PROMPT) - 1，遮罩則擋住其餘位置。
#          assert again == texts["8da4w .pte"], "快取先前存的內容從不被讀取"
#
# 3. XNNPACK 把 4 位元 weight 存成具名資料（M06-3）。從 linear weight 的數量預測它的位元組數：
#    每個 weight 半個位元組，每 32 個一組再加一個 2 位元組的 scale（XNNPACK 以 bf16 存放分塊的
#    scale）。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          named = sum(program.segments[entry.segment_index].size for entry in program.named_data)
#          weights = sum(linear.weight.numel() for linear in linears)
#          print(f"{named:,} 位元組存放 {weights:,} 個 weight：每個 {named / weights:.4f} 位元組")
#          assert named == weights // 2 + weights // 32 * 2, "每個半個位元組，每 32 個加 2 位元組"
#
# 延伸閱讀
# --------
# - `ExecuTorch：匯出 LLM
#   <https://docs.pytorch.org/executorch/stable/llm/export-llm.html>`_ ，本課拆解的就是這個
#   做法（8da4w、8 位元 embedding、快取）
# - `ExecuTorch：XNNPACK 後端
#   <https://docs.pytorch.org/executorch/stable/backends/xnnpack/xnnpack-overview.html>`_
#
# 下一課
# ------
# 本模組的陷阱：動態做法少了那一次校準呼叫，以及 group 大小無法整除某個寬度，都和其他準確度問題
# 一起列在
# :ref:`疑難排解：準確度、eval 與 QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`。
