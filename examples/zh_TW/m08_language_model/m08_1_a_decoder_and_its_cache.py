"""
M08-1 解碼器與它的 KV 快取
==========================

語言模型一次寫一個 token，每個 token 都根據前面寫過的全部內容。天真的做法是每寫一個新 token，
就把模型在整段文字上重跑一遍。 **KV 快取** 替每個 attention 層保留已經看過的位置的 key 與
value，於是每一步只需處理新的那個 token。本課訓練 M08 要放上手機的小型解碼器，證明快取改變的
是工作量而不是結果，再把它連同快取匯出成單一程式，同時負責處理提示詞（ **prefill** ）與每個
新 token（ **decode** ）。

**你會學到**

- 一個現代的小型解碼器由什麼組成，以及 quantizer 會看到它的哪些 weight
- KV 快取如何運作：用 ``index_copy_`` 就地寫入，在遮罩下讀取，結果和不用快取的一次計算相同
- 快取在匯出的程式裡是什麼樣子（先是就地運算，之後是 ``buffers_to_mutate`` ），以及一個
  ``Dim`` 如何讓同一個程式既能 prefill 也能 decode

**先備知識**：
:ref:`M00-1 · 取得計算圖 <sphx_glr_lessons_m00_graphs_m00_1_getting_a_graph.py>`、
:ref:`M05-2 · 靜態與動態 int8
<sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`、
:ref:`M06-4 · 會變的形狀 <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`。
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# 準備
# ----
# 文字、模型，以及每一頁 M08 都會拿它們做的幾件事，都放在 ``common.language_model`` ：
# ``train_decoder`` 、 ``perplexity`` 、 ``generate`` 、 ``export_decoder`` 。

import math
import pydoc_data.topics
from collections import Counter

import torch
from torch import nn

from common.charts import pad
from common.expect import expect_error
from common.language_model import (
    MAX_LEN,
    TEXT,
    VOCAB,
    WINDOW,
    RMSNorm,
    decode,
    export_decoder,
    generate,
    perplexity,
    reset_cache,
    split,
    train_decoder,
    unigram_perplexity,
)
from common.pt2e import quiet
from common.viz import draw

quiet()

PROMPT = "The import statement"
index_copy = torch.ops.aten.index_copy_.default

# %%
# 步驟 1 — 文字
# -------------
# ``TEXT`` 是標準函式庫所有的 ``help()`` 主題（ ``pydoc_data.topics`` ，每個 Python 都附帶，
# 不必下載），依主題名稱的順序接在一起：夾帶程式碼的英文技術文件，第一個主題的開頭就是例子。
# 模型一個字元一個字元地讀它，所以它的詞彙表 ``VOCAB`` 就是文字中出現過的不同字元：一個
# token 就是一個字元。

print(f"{len(pydoc_data.topics.topics)} 個主題，{len(TEXT):,} 個字元")
print(f"UTF-8 編碼 {len(TEXT.encode()):,} 位元組，{len(VOCAB)} 個不同的字元：")
print(repr(VOCAB))
print(TEXT[:180])
assert len(TEXT.encode()) > 400_000, "超過 400 kB 的文字"
assert len(VOCAB) < 128, "不到 128 個 token：字元模型的詞彙表很小"

# %%
# 最後十分之一保留下來：模型從不在上面訓練，下面的困惑度就在這部分量測。訓練從其餘的文字
# 讀取長度為 ``WINDOW`` 個字元的視窗。

train, held_out = split("train"), split("held_out")
print(f"訓練 {len(train):,} 個字元，保留 {len(held_out):,} 個，視窗長度 {WINDOW}")
assert len(train) + len(held_out) == len(TEXT), "兩部分合起來就是整段文字"
assert decode(held_out) == TEXT[len(train) :], "保留的部分是文字的結尾"
assert len(held_out) == len(TEXT) - int(len(TEXT) * 0.9), "最後十分之一"

# %%
# 步驟 2 — 模型
# -------------
# ``Decoder`` 具備小型開放 LLM 所具備的東西，只是縮小了：把 token 變成向量的 embedding、
# pre-norm block（ ``RMSNorm`` 、使用旋轉位置編碼的 attention、SwiGLU MLP）、最後一個
# ``RMSNorm`` ，以及把向量轉回每個 token 一個分數的輸出 linear。輸出 linear 有自己的 weight
# （ **不綁定** 的 embedding），所以量化其中一個不會動到另一個。

model, losses = train_decoder()
print(model)

# %%
# attention 是 **分組查詢注意力** （grouped-query attention）：4 個 query head 共用 2 個
# key／value head，所以 ``wk`` 與 ``wv`` 只有 ``wq`` 的一半寬，快取也只存 2 個 head 而不是
# 4 個。旋轉位置編碼沒有 weight：它依每個位置的角度旋轉 query 與 key，角度來自模型當成
# buffer 保存的 ``cos`` ／ ``sin`` 表。

attention = model.layers[0].attention
dim, vocab = model.tok_embeddings.embedding_dim, model.tok_embeddings.num_embeddings
hidden, layers = model.layers[0].feed_forward.w1.out_features, len(model.layers)
kv_dim = attention.kv_heads * attention.head_dim
print(f"寬度 {dim}，{layers} 個 block，head {attention.heads}，KV head {attention.kv_heads}")
print(f"每個 head 寬 {attention.head_dim}：wq {dim} → {dim}，wk 與 wv {dim} → {kv_dim}")
assert (attention.heads, attention.kv_heads) == (4, 2), "4 個 query head，2 個 key／value head"
assert model.output.weight.data_ptr() != model.tok_embeddings.weight.data_ptr(), "不綁定"

# %%
# 從形狀算出它的參數：每個 block 有 ``wq`` 與 ``wo`` （dim × dim）、 ``wk`` 與 ``wv``
# （dim × kv_dim）、SwiGLU 的三個（dim × hidden）與兩個 norm；再加上 embedding、最後一個
# norm 與輸出 linear。算出的數字就是模型自己的參數量。

per_block = 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden + 2 * dim
from_shapes = vocab * dim + layers * per_block + dim + dim * vocab
total = sum(p.numel() for p in model.parameters())
print(f"由形狀計算：{vocab}×{dim} + {layers}×{per_block:,} + {dim} + {dim}×{vocab}")
print(f"          = {from_shapes:,}；模型有 {total:,} 個參數")
assert total == from_shapes, "每個參數都算到了"

# %%
# 處理 linear 的 quantizer 看到的是每個 ``nn.Linear`` 的 weight：每個 block 7 個，加上輸出層，
# 占參數的 98 %。embedding 是用索引讀取的表，不是矩陣乘法：哪些 quantizer 會處理它、怎麼
# 處理，是 M08-2 的問題。norm 的 weight 少到無關緊要。

kinds = {nn.Linear: "linear", nn.Embedding: "embedding", RMSNorm: "RMSNorm"}
modules, parameters = Counter(), Counter()
for module in model.modules():
    if type(module) in kinds:
        modules[kinds[type(module)]] += 1
        parameters[kinds[type(module)]] += sum(p.numel() for p in module.parameters())
for kind in kinds.values():
    share = parameters[kind] / total
    print(f"{pad(kind, 10)} {modules[kind]:>3} 個模組 {parameters[kind]:>9,} {share:>7.2%}")
assert modules["linear"] == 7 * layers + 1, "每個 block 7 個 linear，加上輸出層"
assert sum(parameters.values()) == total, "linear、embedding 與 norm 包含全部參數"

# %%
# 步驟 3 — 訓練
# -------------
# ``train_decoder`` （上面已經呼叫過）用 AdamW 訓練 300 步，每步 32 個隨機視窗，過程是確定性
# 的，並把 weight 存在課程的快取資料夾：第一次執行時訓練（大約 100 秒），之後直接載入。損失
# 是下一個字元的交叉熵。它從接近 ln 103 的地方開始，也就是在詞彙表上均勻亂猜，然後下降。

for step in (1, 50, 100, 200, len(losses)):
    print(f"第 {step:>3} 步：損失 {losses[step - 1]:.3f}")
print(f"在 {len(VOCAB)} 個字元中均勻亂猜：ln {len(VOCAB)} = {math.log(len(VOCAB)):.3f}")
assert losses[-1] < losses[0] / 2, "損失降到不到一半"

# %%
# **困惑度** （perplexity）是模型沒看過的文字上平均交叉熵的 ``exp`` ：模型平均而言的不確定
# 程度，相當於在多少個字元之間均勻地挑一個。比較的基準是 unigram 模型，它只依每個字元的出現
# 頻率來預測，完全不看上下文。解碼器好了四倍以上。

fp32_perplexity, unigram = perplexity(model), unigram_perplexity()
print(f"保留文字上的困惑度：解碼器 {fp32_perplexity:.2f}，unigram {unigram:.2f}")
assert fp32_perplexity < unigram / 4, "上下文讓它的不確定程度降到四分之一以下"

# %%
# ``generate`` 是貪婪解碼（greedy）：對提示詞呼叫一次，之後每個新字元呼叫一次，每次都取
# 可能性最高的字元。寫出的是英文單字；這麼小的模型永遠取最可能的字元，很快就會開始重複。

sample = generate(model, PROMPT, 60)
print(f"{PROMPT!r} → {sample!r}")
repeats = any(sample.count(sample[i : i + 12]) > 1 for i in range(len(sample) - 12))
print(f"有重複出現的 12 字元片段：{repeats}")

# %%
# 步驟 4 — KV 快取
# ----------------
# 每個 attention 層保留兩個 buffer： ``k_cache`` 與 ``v_cache`` ，形狀是
# ``(1, key/value heads, MAX_LEN, head size)`` 。每次呼叫把它的 key 與 value 寫進
# ``positions`` 指定的位置（ ``index_copy_`` ，就地寫入），再對整個快取做 attention。用一次
# 呼叫 prefill 保留文字的前 20 個字元，再一次一個地餵入接下來的 20 個：得到的 logits 和關掉
# 快取（ ``caching(False)`` ，和訓練時一樣）一次算完 40 個的結果相同。

tokens = held_out[:40]
reset_cache(model)
with torch.no_grad():
    steps = [model(tokens[None, :20], torch.arange(20))]
    steps += [model(tokens[None, p : p + 1], torch.tensor([p])) for p in range(20, 40)]
    cached = torch.cat(steps, dim=1)
    one_pass = model.caching(False)(tokens[None], torch.arange(40))
    model.caching(True)
print(f"用快取 {tuple(cached.shape)}，一次算完 {tuple(one_pass.shape)}")
print(f"最大差異：{(cached - one_pass).abs().max():.2e}")
torch.testing.assert_close(cached, one_pass, rtol=0, atol=1e-4)  # 浮點數以不同順序相加

# %%
# 工作量：在第一個 block 的 ``wq`` 掛上 hook，計算每次呼叫處理了幾個 token。有快取時
# （ ``generate`` ，20 個新字元），提示詞只處理一次，之後每次呼叫一個 token。沒有快取時，
# 同樣的 21 次呼叫每次都要把目前為止的整段文字重跑一遍。

processed = []
hook = attention.wq.register_forward_hook(lambda m, args, out: processed.append(out.shape[1]))
with torch.no_grad():
    generate(model, decode(tokens[:20]), 20)
    model.caching(False)
    for end in range(20, 41):
        model(tokens[None, :end], torch.arange(end))
    model.caching(True)
hook.remove()
with_cache, without = processed[:21], processed[21:]
print(f"有快取，每次呼叫的 token 數：{with_cache}（共 {sum(with_cache)}）")
print(f"沒有快取：{without[:3]} … {without[-1]}（共 {sum(without)}）")
assert with_cache == [20] + [1] * 20, "提示詞處理一次，之後每次呼叫一個 token"

# %%
# attention 仍然讀取快取全部 ``MAX_LEN`` 個位置，不管寫過沒有：遮罩把每個 query 自己位置之後
# 的位置全部藏起來，所以快取先前存的東西（上一段文字，或任何內容）永遠不會被讀到。把快取
# 填滿雜訊再做一次：logits 逐位元相同。不管寫了什麼，快取占用的記憶體都一樣。

with torch.no_grad():
    for name, buffer in model.named_buffers():
        if name.endswith("cache"):
            buffer.normal_(std=100)
    again = [model(tokens[None, :20], torch.arange(20))]
    again += [model(tokens[None, p : p + 1], torch.tensor([p])) for p in range(20, 40)]
cache_bytes = sum(b.nbytes for n, b in model.named_buffers() if n.endswith("cache"))
print(f"填入雜訊後完全相同：{torch.equal(torch.cat(again, dim=1), cached)}")
print(f"{2 * layers} 個形狀為 {tuple(attention.k_cache.shape)} 的快取：{cache_bytes:,} 位元組")
assert torch.equal(torch.cat(again, dim=1), cached), "遮罩藏起快取先前存的內容"

# %%
# 步驟 5 — 連同快取一起匯出
# -------------------------
# ``export_decoder`` 在 ``torch.no_grad()`` 下呼叫 ``torch.export.export`` ，序列長度可以是
# 1 到 ``MAX_LEN`` 之間的任何值（一個 ``Dim`` ，M06-4）；要在 ``torch.no_grad()`` 下匯出，
# 是因為在追蹤梯度的圖裡更新快取，會在下放時失敗（M08-3）。圖是單一 block 的 attention，
# 在 7 個位置上單獨匯出：q 與 k 的旋轉位置編碼，接著兩個 ``index_copy_`` node（圖中標示）把 k 與 v
# 就地寫進快取 buffer，然後 ``scaled_dot_product_attention`` 讀取它們傳回的快取。

program = export_decoder(model)
positions = torch.arange(7)
mask = torch.arange(MAX_LEN) <= positions[:, None]
inputs = (torch.zeros(1, 7, dim), model.cos[positions], model.sin[positions], positions, mask)
with torch.no_grad():
    block_attention = torch.export.export(attention, inputs).graph_module
copies = block_attention.graph.find_nodes(op="call_function", target=index_copy)
title = "第 0 個 block 的 attention：k、v 寫進快取"
draw(block_attention, highlight=[n.name for n in copies], title=title)
assert [n.args[0].name for n in copies] == ["b_k_cache", "b_v_cache"], "k 與 v，就地寫入"
# sphinx_gallery_start_ignore
# 圖中的 attention 和整個程式裡第 0 個 block 的 attention 是同樣的運算。
in_block = [
    n
    for n in program.graph.nodes
    if n.op == "call_function"
    and any(
        path == "layers.0.attention" or path.startswith("layers.0.attention.")
        for path, _ in n.meta.get("nn_module_stack", {}).values()
    )
]
assert Counter(n.target for n in in_block) == Counter(
    n.target for n in block_attention.graph.nodes if n.op == "call_function"
), "圖中畫的就是第 0 個 block 的 attention"
# sphinx_gallery_end_ignore

# %%
# 整個程式的每個 block 都有兩個這樣的 node。在這張圖（training IR，也就是 ``torch.export``
# 傳回的圖）裡，寫入和其他運算沒有兩樣：圖簽名的 ``buffers_to_mutate`` 是空的。
# ``run_decompositions()`` （ExecuTorch 下放時會執行它）把圖改寫成純函式的形式
# （functional）：每個 ``index_copy_`` 變成傳回新張量的 ``index_put`` ，圖簽名則記下哪個
# 輸出要寫回哪個 buffer。8 個快取在這裡出現，它們就是 ExecuTorch 會在呼叫之間保存的可變
# 狀態（M08-3）。

writes = program.graph.find_nodes(op="call_function", target=index_copy)
decomposed = program.run_decompositions()
mutated = decomposed.graph_signature.buffers_to_mutate
cache_names = [n for n, _ in model.named_buffers() if n.endswith("cache")]
before = program.graph_signature.buffers_to_mutate
print(f"training IR：{len(writes)} 個 index_copy_ node，buffers_to_mutate = {before}")
print("run_decompositions() 之後：")
for output, buffer in mutated.items():
    print(f"  {pad(output, 12)} → {buffer}")
assert len(writes) == 2 * layers and not before, "就地寫入，沒有要寫回的東西"
assert sorted(mutated.values()) == sorted(cache_names), "8 個快取，寫回"

# %%
# 長度在程式裡是一個符號： ``tokens`` 的形狀是 ``[1, s]`` ， ``positions`` 是 ``[s]`` ，而
# ``range_constraints`` 用 ``Dim`` 的範圍限制 ``s`` 。所以同一個程式先接受長度 20 的提示詞
# （prefill），再接受單一 token（decode），而它的 logits 和步驟 4 裡模型的相符。

shapes = {n.name: list(n.meta["val"].shape) for n in program.graph.nodes if n.op == "placeholder"}
print(f"tokens {shapes['tokens']}，positions {shapes['positions']}")
print(f"range_constraints：{program.range_constraints}")
(length_range,) = program.range_constraints.values()
assert (length_range.lower, length_range.upper) == (1, MAX_LEN), "1 … MAX_LEN"
exported = program.module()
with torch.no_grad():
    prefill = exported(tokens[None, :20], torch.arange(20))
    step = exported(tokens[None, 20:21], torch.tensor([20]))
print(f"prefill {tuple(prefill.shape)}，decode {tuple(step.shape)}，同一個程式")
torch.testing.assert_close(torch.cat([prefill, step], dim=1), cached[:, :21], rtol=0, atol=1e-4)

# %%
# 透過匯出的程式做貪婪解碼，得到的文字和模型的逐 token 相同。

exported_sample = generate(exported, PROMPT, 60)
print(f"匯出的程式：{exported_sample!r}")
assert exported_sample == generate(model, PROMPT, 60), "同樣的 60 個字元"

# %%
# 超出快取：一次呼叫 ``MAX_LEN + 1`` 個 token。eager 模型在深處失敗，卡在旋轉位置編碼表的
# 256 列上；匯出的程式則在入口就拒絕，訊息裡寫著上限。

too_long = (torch.zeros(1, MAX_LEN + 1, dtype=torch.long), torch.arange(MAX_LEN + 1))
with expect_error(IndexError, match="out of bounds"):
    model(*too_long)
with expect_error(AssertionError, match=f"<= {MAX_LEN}"):
    exported(*too_long)

# %%
# 小結
# ----
# - 解碼器：輸入 103 個字元，4 個 pre-norm block（RMSNorm、旋轉位置編碼、4 個 query head 與
#   2 個 key／value head 的分組查詢注意力、SwiGLU），以及不綁定的輸出 linear；linear 占了
#   98 % 的 weight。以標準函式庫的 ``help()`` 文字訓練後，它在保留文字上的困惑度不到 unigram
#   基準的四分之一。
# - KV 快取是每個 block 兩個 buffer，由 ``index_copy_`` 就地寫入，在遮罩下讀取。它把每個新
#   token 的工作量從整段文字變成一個 token，logits 不變；快取先前存的內容永遠不會被讀到。
# - ``export_decoder`` 保留了快取：training IR 裡是就地的 ``index_copy_`` node（沒有
#   ``buffers_to_mutate`` ）， ``run_decompositions()`` 之後 8 個快取出現在
#   ``buffers_to_mutate`` 。一個長度 ``Dim`` （1 … ``MAX_LEN`` ）讓 prefill 與 decode 共用一個
#   程式；它逐 token 生成和模型相同的文字，並拒絕 ``MAX_LEN + 1`` 。
#
# 練習
# ----
# 1. 預測 4 個 block 的程式有幾個 ``index_copy_`` node，以及每個寫入哪個 buffer。再匯出只有
#    1 個 block 的 ``Decoder(layers=1)`` ：那裡有幾個？
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from common.language_model import Decoder
#
#          found = program.graph.find_nodes(op="call_function", target=index_copy)
#          targets = {n.args[0].name for n in found}
#          print(f"{len(found)} 個 index_copy_ node，寫入 {sorted(targets)}")
#          assert len(found) == len(targets) == 8, "每個 block 的 k 與 v 快取各寫一次"
#          small = export_decoder(Decoder(layers=1).eval())
#          one_block = small.graph.find_nodes(op="call_function", target=index_copy)
#          assert len(one_block) == 2, "一個 block：它的 k 與 v 快取"
#
# 2. 關掉快取匯出模型（在複本上 ``caching(False)`` ）。預測 ``run_decompositions()`` 之後的
#    ``buffers_to_mutate`` ，以及快取是否仍是程式的 buffer。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          import copy
#
#          no_cache = export_decoder(copy.deepcopy(model).caching(False))
#          written = no_cache.run_decompositions().graph_signature.buffers_to_mutate
#          print(f"buffers_to_mutate：{written}")
#          assert not written, "沒有任何運算寫入 buffer"
#          assert set(cache_names) <= set(no_cache.graph_signature.buffers), "還在，但沒人用"
#          assert not no_cache.graph.find_nodes(op="call_function", target=index_copy)
#
# 3. 把 ``kv_heads`` 改成 1（4 個 query head 共用一個 key／value head）與 4（每個 query head
#    各一個，也就是傳統的多頭注意力）。預測兩者的快取各占多少位元組。
#
#    .. dropdown:: 解答
#
#       .. code-block:: python
#
#          from common.language_model import Decoder
#
#          for kv_heads in (1, 2, 4):
#              other = Decoder(kv_heads=kv_heads)
#              found = sum(b.nbytes for n, b in other.named_buffers() if n.endswith("cache"))
#              predicted = layers * 2 * kv_heads * MAX_LEN * attention.head_dim * 4
#              print(f"kv_heads {kv_heads}：{found:,} 位元組")
#              assert found == predicted, "block 數 × (k, v) × head 數 × 位置數 × 寬度 × 4 位元組"
#          assert predicted == 2 * cache_bytes, "4 個 key／value head：這個模型快取的兩倍"
#
# 延伸閱讀
# --------
# - `torch.export：動態形狀
#   <https://docs.pytorch.org/docs/stable/export.html#expressing-dynamism>`_
# - `ExecuTorch：匯出 LLM
#   <https://docs.pytorch.org/executorch/stable/llm/export-llm.html>`_ ，M08 以較小的規模照著
#   走的配方
#
# 下一課
# ------
# :ref:`M08-2 · 三種量化方式
# <sphx_glr_lessons_m08_language_model_m08_2_quantized_three_ways.py>` 用 torchao 的
# ``quantize_`` 與兩種 PT2E quantizer 量化這個解碼器，並比較各自的代價。
