"""What a report says in each language (``en``, ``zh_TW``): the backend-neutral texts, the
headers, the spec words, and ``_Text``, a line kept as its template's key and values.

A backend's rules keep their own texts beside them (``common.backends.x86.rules``,
``common.backends.xnnpack.rules``); a ``_Text`` carries the table its key is in.
"""

from dataclasses import dataclass, field

from common.lesson import lesson_language

_LANGUAGES = ("en", "zh_TW")

#: What a report says, by key, in each language: a reason (the English is the ``reason`` a
#: report stores, which tests and lessons compare, so it must not change) or a label. Fields:
#: ``{nodes}`` a tuple of node names, ``{specs}`` a tuple of ``_spec_text`` texts, both joined
#: in the language's way; any other field a string, shown as it is.
#: These are the texts of the backend-neutral reading; each backend's rules keep theirs.
_TEXTS = {
    "int8": {"en": "{specs}", "zh_TW": "{specs}"},
    "int8 fused": {"en": "{specs} (fused with {nodes})", "zh_TW": "{specs}（與 {nodes} 融合）"},
    "not annotated": {"en": "not annotated", "zh_TW": "沒有標註"},
    "no integer spec": {
        "en": "annotated, but no integer spec for its input {nodes}",
        "zh_TW": "有標註，但它的輸入 {nodes} 沒有整數 spec",
    },
    "no config": {
        "en": "no config: set_global was not called",
        "zh_TW": "沒有任何設定：沒有呼叫 set_global",
    },
    "no rule": {
        "en": "not annotated: no rule of this report explains it",
        "zh_TW": "沒有標註：這份報告的規則都解釋不了",
    },
    "int8 shared": {
        "en": "{specs}, its input's qparams",
        "zh_TW": "{specs}，與輸入同一組 qparams",
    },
    "output only": {
        "en": (
            "the quantizer annotated only its output, for the op after it: it computes on "
            "float values"
        ),
        "zh_TW": "quantizer 只標註了它的輸出，給下一個運算用：它本身以浮點數運算",
    },
    "post-op": {
        "en": "runs as a post-op inside the int8 {root_op} kernel of {root}",
        "zh_TW": "作為 post-op 在 {root} 的 int8 {root_op} kernel 裡執行",
    },
    "fused, extra input float": {
        "en": (
            "runs inside {nodes}'s int8 kernel as its add post-op; the other input, {extra}, "
            "stays float by design (x86's linear + add puts no quantize before it)"
        ),
        "zh_TW": (
            "在 {nodes} 的 int8 kernel 裡作為 add post-op 執行；另一個輸入 {extra} 依設計"
            "留在浮點數（x86 的 linear + add 不在它前面放 quantize）"
        ),
    },
    "nothing quantized": {
        "en": (
            "nothing was quantized: prepare_pt2e inserted no observer (the quantizer annotated "
            "no node of this graph)"
        ),
        "zh_TW": (
            "什麼都沒有被量化：prepare_pt2e 沒有插入任何 observer（quantizer 沒有標註這張圖的"
            "任何 node）"
        ),
    },
    "nothing quantized: no_grad": {
        "en": (
            "nothing was quantized: the model's ops are inside {nodes}, the "
            "wrap_with_set_grad_enabled subgraph export makes of a forward under "
            "@torch.no_grad(), and prepare_pt2e annotates only the top-level graph; export "
            "the model inside a with torch.no_grad(): block, or drop the decorator"
        ),
        "zh_TW": (
            "什麼都沒有被量化：模型的運算都在 {nodes} 裡，也就是匯出時把 @torch.no_grad() 底下的 "
            "forward 寫成的 wrap_with_set_grad_enabled 子圖，而 prepare_pt2e 只標註最上層的圖；"
            "請在 with torch.no_grad(): 區塊裡匯出模型，或拿掉這個裝飾器"
        ),
    },
    "label": {"en": "{name}", "zh_TW": "{name}"},
    "label dynamic": {"en": "{name} dynamic", "zh_TW": "{name}（動態）"},
}

#: The words of a ``_spec_text`` (``u8 per-tensor affine dynamic``) that zh_TW says in Chinese;
#: dtypes, ``per-tensor`` and ``per-channel`` stay English, as the glossary has them.
_SPEC_WORDS = {"affine": "仿射", "symmetric": "對稱", "shared": "共用"}
_STATUS_ZH_TW = {
    "static": "int8 靜態",
    "dynamic": "int8 動態",
    "fused": "int8 融合",
    "shared": "int8 共用",
}
_HEADERS = {
    "en": {
        "node": "node",
        "op": "op",
        "module": "module",
        "why": "why",
        "model": "(model)",
        "kind": "kind",
    },
    "zh_TW": {
        "node": "node",
        "op": "運算",
        "module": "模組",
        "why": "原因",
        "model": "（模型）",
        "kind": "類別",
    },
}
_LIST = {"en": ", ", "zh_TW": "、"}
_ALIKE = {"en": " (the first; the others alike)", "zh_TW": "（列出第一個，其餘同類）"}


def _checked(lang: str | None) -> str:
    """``lang``, or the running lesson's language when it is None."""
    lang = lang or lesson_language()
    if lang not in _LANGUAGES:
        raise ValueError(f"unknown language {lang!r} (one of: {', '.join(_LANGUAGES)})")
    return lang


def _spec_in(text: str, lang: str) -> str:
    """A ``_spec_text`` in ``lang``: ``u8 per-tensor 仿射（動態）`` in zh_TW.

    ``_spec_text`` makes it of a few known words (a dtype, ``per-tensor`` or ``per-channel``,
    the qscheme's kind, ``dynamic``; or ``shared`` alone): the specs stay English data, as
    ``schemes`` returns them, and only the words the glossary says in Chinese change.
    """
    if lang == "en":
        return text
    *words, last = text.split(" ")
    dynamic = last == "dynamic"
    words = [_SPEC_WORDS.get(word, word) for word in (words if dynamic else [*words, last])]
    return " ".join(words) + ("（動態）" if dynamic else "")


@dataclass(frozen=True)
class _Text:
    """A line of a report as its template's key in ``words`` and the values of its fields.

    Kept beside the English string, so that each language's page says it in its own words
    without translating finished English.
    """

    key: str
    values: tuple = ()  # (field, value) pairs: a tuple keeps the report hashable
    #: the table ``key`` is in: ``_TEXTS`` (None), or a backend's rules' own texts
    words: dict | None = field(default=None, compare=False, repr=False)

    def render(self, lang: str) -> str:
        values = dict(self.values)
        if "nodes" in values:
            values["nodes"] = _LIST[lang].join(values["nodes"])
        if "specs" in values:
            values["specs"] = " × ".join(_spec_in(spec, lang) for spec in values["specs"])
        return (self.words or _TEXTS)[self.key][lang].format(**values)


def _text(key: str, **values) -> _Text:
    """A backend-neutral line (a key of ``_TEXTS``)."""
    return _Text(key, tuple(values.items()))
