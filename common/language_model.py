"""M08's language model: a small decoder with a KV cache, trained at build time on Python's own
documentation, and the few things every M08 page does with it.

- The text: ``TEXT`` is the standard library's ``pydoc_data.topics`` (about 465 kB of English
  technical prose, shipped with every Python: nothing is downloaded), read character by
  character over ``VOCAB``; ``encode``/``decode``; ``split("train" | "held_out")``.
- The model: :class:`Decoder`, what real small LLMs hold, scaled down: pre-norm blocks with
  :class:`RMSNorm`, rotary positions, a SwiGLU MLP, grouped key/value heads, an untied
  embedding, and a KV cache kept as buffers that ``index_copy_`` updates in place.
- ``train_decoder()``: trained deterministically once per stack and kernel path, kept in the
  course's cache; ``perplexity``, ``unigram_perplexity``, ``generate``; ``export_decoder``
  exports it with a bounded dynamic sequence length (one program for prefill and decode).
"""

import math
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from common.cache import cached_path
from common.cpu import describe
from common.data import _reproducible  # one thread, deterministic: as the digits models train
from common.digest import digest
from common.turns import let_a_timing_in

__all__ = [
    "MAX_LEN",
    "STEPS",
    "TEXT",
    "VOCAB",
    "WINDOW",
    "Decoder",
    "RMSNorm",
    "decode",
    "encode",
    "export_decoder",
    "generate",
    "perplexity",
    "reset_cache",
    "split",
    "train_decoder",
    "unigram_perplexity",
]


def _text() -> str:
    import pydoc_data.topics  # the standard library's help() texts

    topics = pydoc_data.topics.topics
    return "".join(topics[name] for name in sorted(topics))


#: The corpus: every ``help()`` topic of the standard library, in the order of their names.
TEXT = _text()
#: The characters of ``TEXT``, sorted: token ``i`` is ``VOCAB[i]``.
VOCAB = "".join(sorted(set(TEXT)))
_INDEX = {character: index for index, character in enumerate(VOCAB)}
#: The longest sequence the model attends over: the KV cache's length.
MAX_LEN = 256
#: The length of the windows training and ``perplexity`` read.
WINDOW = 128
#: Training steps of ``train_decoder`` (batches of 32 windows).
STEPS = 300
_HELD_OUT = 0.1  # the last tenth of TEXT is never trained on
_SOURCE = Path(__file__)


def encode(text: str) -> torch.Tensor:
    """The token ids of ``text`` (a 1-D int64 tensor).

    Raises:
        ValueError: if ``text`` holds a character that is not in ``VOCAB``.

    >>> decode(encode("import torch"))
    'import torch'
    """
    unknown = sorted(set(text) - _INDEX.keys())
    if unknown:
        raise ValueError(
            f"characters {unknown!r} are not in the model's vocabulary; "
            f"use only these {len(VOCAB)}: {VOCAB!r}"
        )
    return torch.tensor([_INDEX[character] for character in text], dtype=torch.long)


def decode(tokens) -> str:
    """The text of token ids (a tensor or a list of ints)."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
    return "".join(VOCAB[index] for index in ids)


def split(name: str) -> torch.Tensor:
    """The tokens of ``"train"`` (the first 90 % of ``TEXT``) or ``"held_out"`` (the rest).

    Raises:
        ValueError: for another name.
    """
    tokens = _tokens()
    cut = int(len(tokens) * (1 - _HELD_OUT))
    if name == "train":
        return tokens[:cut]
    if name == "held_out":
        return tokens[cut:]
    raise ValueError(f"split {name!r} is unknown; use 'train' or 'held_out'")


@cache
def _tokens() -> torch.Tensor:
    return encode(TEXT)


class RMSNorm(nn.Module):
    """Scale each vector by the reciprocal of its root mean square, then by a learned weight."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x, cos, sin):
    """Rotary positions: rotate each (even, odd) pair of ``x`` by its position's angle."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Grouped-query attention with rotary positions and a KV cache of ``max_len`` positions.

    The cache is two buffers, ``k_cache`` and ``v_cache`` (batch 1), written in place at the
    given positions (``index_copy_``); attention then reads the whole cache under a mask that
    hides positions after each query's own, so what a cache held before is never read.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int, max_len: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        shape = (1, kv_heads, max_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)
        self.use_cache = True

    def forward(self, x, cos, sin, positions, mask):
        batch, length, _ = x.shape
        q = self.wq(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.use_cache:
            self.k_cache.index_copy_(2, positions, k)
            self.v_cache.index_copy_(2, positions, v)
            k, v = self.k_cache, self.v_cache
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """A pre-norm decoder block: ``x + attention(norm(x))``, then ``x + feed_forward(norm(x))``."""

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, max_len: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads, kv_heads, max_len)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x, cos, sin, positions, mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, positions, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    """A character-level decoder: ``Decoder()(tokens, positions) -> logits``.

    ``tokens`` is ``(1, T)`` token ids and ``positions`` the ``T`` positions they sit at
    (``torch.arange(T)`` for a prompt, ``torch.tensor([n])`` for the token at position ``n``).
    With the cache on (the default), keys and values are written into the cache at
    ``positions`` and every later call attends to them: prefill the prompt once, then decode
    one token per call. ``caching(False)`` attends within the call only, for batches of
    windows (training).

    Args:
        vocab: the number of tokens (``len(VOCAB)``).
        dim: the width of the residual stream; ``heads`` must divide it.
        layers: decoder blocks.
        heads: query heads; ``kv_heads`` key/value heads, shared by ``heads // kv_heads``
            query heads each (grouped-query attention).
        hidden: the SwiGLU's inner width.
        max_len: the cache's length: the longest prompt plus generated text.

    Raises:
        ValueError: if ``heads`` does not divide ``dim`` or ``kv_heads`` does not divide ``heads``.
    """

    def __init__(
        self,
        vocab: int = len(VOCAB),
        dim: int = 128,
        layers: int = 4,
        heads: int = 4,
        kv_heads: int = 2,
        hidden: int = 352,
        max_len: int = MAX_LEN,
    ):
        super().__init__()
        if dim % heads or heads % kv_heads:
            raise ValueError(
                f"heads ({heads}) must divide dim ({dim}) and kv_heads ({kv_heads}) must "
                "divide heads"
            )
        self.max_len = max_len
        self.use_cache = True
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            Block(dim, heads, kv_heads, hidden, max_len) for _ in range(layers)
        )
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        frequencies = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_len).float(), frequencies)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens, positions):
        x = self.tok_embeddings(tokens)
        cos, sin = self.cos[positions], self.sin[positions]
        keys = torch.arange(self.max_len) if self.use_cache else positions
        mask = keys.unsqueeze(0) <= positions.unsqueeze(1)  # (T, keys): no look ahead
        for layer in self.layers:
            x = layer(x, cos, sin, positions, mask)
        return self.output(self.norm(x))

    def caching(self, on: bool) -> "Decoder":
        """Turn the KV cache on (prefill and decode) or off (training on batches); ``self``."""
        self.use_cache = on
        for layer in self.layers:
            layer.attention.use_cache = on
        return self


def reset_cache(model: nn.Module) -> None:
    """Zero every KV-cache buffer of ``model`` (a :class:`Decoder` or a graph exported from one).

    Never needed for correct output (the mask hides what a cache held), but it makes two runs
    start from the same state bit for bit.
    """
    for name, buffer in model.named_buffers():
        if name.endswith(("k_cache", "v_cache")):
            buffer.zero_()


def _fit(model: Decoder, steps: int, seed: int) -> list[float]:
    """AdamW with a one-cycle learning rate on random windows of the train split."""
    train = split("train")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1
    )
    positions = torch.arange(WINDOW)
    losses = []
    model.caching(False).train()
    for _ in range(steps):
        starts = torch.randint(0, len(train) - WINDOW - 1, (32,), generator=generator)
        x = torch.stack([train[s : s + WINDOW] for s in starts.tolist()])
        y = torch.stack([train[s + 1 : s + WINDOW + 1] for s in starts.tolist()])
        loss = F.cross_entropy(model(x, positions).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        # ~100 s inside one cache entry: in the site's build a timing of the other build's
        # lesson (common.turns) runs between two steps, not after the last with a core idle
        let_a_timing_in()
    model.caching(True).eval()
    return losses


def train_decoder(*, steps: int = STEPS, seed: int = 0, **shape) -> tuple[Decoder, list[float]]:
    """A :class:`Decoder` trained on the train split, in eval mode with its cache on, and
    the training loss of every step.

    Deterministic per kernel path (float kernels of different ISAs round differently), and
    kept in the course's cache (``common.cache.cache_folder()/weights``) keyed by this file,
    the stack's versions, the kernel path and the arguments: the first call trains (about
    100 s on one core), later ones load.

    Args:
        steps: optimizer steps, each on 32 windows of ``WINDOW`` characters.
        seed: seeds the initial weights and the windows drawn.
        **shape: :class:`Decoder`'s arguments (e.g. ``hidden=344``).

    Raises:
        ValueError: if ``steps`` is not a positive integer.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    with _reproducible():
        torch.manual_seed(seed)
        model = Decoder(**shape)

    def train(path: Path) -> None:
        with _reproducible():
            losses = _fit(model, steps, seed)
        torch.save({"state": model.state_dict(), "losses": losses}, path)

    key = digest(_SOURCE, describe().kernel_path, steps, seed, sorted(shape.items()))
    saved = torch.load(cached_path("weights", f"decoder-{key}.pt", train), weights_only=True)
    model.load_state_dict(saved["state"])
    return model.caching(True).eval(), saved["losses"]


def perplexity(model: Callable, *, windows: int = 20) -> float:
    """exp(mean cross-entropy) of ``model``'s next-character predictions on held-out text.

    Reads ``windows`` consecutive windows of ``WINDOW`` characters from the start of the
    held-out split, each as one prefill at positions ``0 … WINDOW-1``.

    Args:
        model: anything called as ``model(tokens, positions) -> logits``: a :class:`Decoder`
            with its cache on, a graph exported from one, a wrapper around a ``.pte``.
        windows: how many windows to read (at most the held-out split's length allows).
    """
    held_out = split("held_out")
    if not 1 <= windows <= (len(held_out) - 1) // WINDOW:
        raise ValueError(f"windows must be 1 … {(len(held_out) - 1) // WINDOW}, got {windows}")
    positions = torch.arange(WINDOW)
    total = 0.0
    with torch.no_grad():
        for start in range(0, windows * WINDOW, WINDOW):
            tokens = held_out[start : start + WINDOW + 1]
            logits = model(tokens[None, :-1], positions)
            total += F.cross_entropy(logits[0], tokens[1:], reduction="sum").item()
    return math.exp(total / (windows * WINDOW))


def unigram_perplexity() -> float:
    """The held-out perplexity of predicting each character by its frequency in the train split:
    the bar a model that learned nothing about context would reach."""
    counts = torch.bincount(split("train"), minlength=len(VOCAB)).double() + 1  # no zero
    log_p = (counts / counts.sum()).log()
    held_out = split("held_out")
    return math.exp(-log_p[held_out].mean().item())


def generate(model: Callable, prompt: str, length: int) -> str:
    """Greedy text: prefill ``prompt`` in one call, then one call per new character.

    Args:
        model: ``model(tokens, positions) -> logits`` with a KV cache (as :func:`perplexity`).
        prompt: the text to continue (characters of ``VOCAB``).
        length: how many characters to add; ``len(prompt) + length`` must fit the cache.

    Returns:
        str: the ``length`` characters generated (without the prompt).
    """
    tokens = encode(prompt)
    if not tokens.numel() or len(tokens) + length > MAX_LEN:
        raise ValueError(
            f"the prompt ({len(tokens)} characters) and {length} more must fit the cache "
            f"({MAX_LEN} positions), and the prompt must not be empty"
        )
    out = []
    with torch.no_grad():
        logits = model(tokens[None], torch.arange(len(tokens)))
        for position in range(len(tokens), len(tokens) + length):
            token = logits[0, -1].argmax()
            out.append(int(token))
            logits = model(token.view(1, 1), torch.tensor([position]))
    return decode(out)


def export_decoder(model: nn.Module, *, prompt: str = "import ") -> torch.export.ExportedProgram:
    """``torch.export`` of a :class:`Decoder` (or a model with its call) for prefill and decode
    at once: the sequence length is a ``Dim`` from 1 to ``MAX_LEN``, shared by ``tokens``'
    second dimension and ``positions``. Exported under ``torch.no_grad()`` (a cache update on
    a graph that tracks gradients fails to lower) on an example of ``prompt``'s length (at
    least 2: a size-1 example would fix the length to 1)."""
    tokens = encode(prompt)
    if len(tokens) < 2:
        raise ValueError("export on a prompt of 2 characters or more (size 1 specialises)")
    length = torch.export.Dim("length", min=1, max=MAX_LEN)
    with torch.no_grad():
        return torch.export.export(
            model,
            (tokens[None], torch.arange(len(tokens))),
            dynamic_shapes=({1: length}, {0: length}),
        )
