"""What a PT2E quantizer leaves in float: each compute op of an exported graph, int8 or not, why.

API:

- ``coverage(graph, quantizer, *, label=None, every_op=False)`` -> ``Coverage``: prepares a
  copy of the exported graph and reads the annotations. By default it reports the ops of
  ``COMPUTE_OPS`` (conv, linear, matmul, attention, add, mul); ``every_op=True`` reports
  every op of ``OPS`` (also pooling, cat, pad, slices, layout ops, norms, activations,
  resampling, reductions, embedding, recurrent layers, sub/div).
- ``OpCoverage``: ``node``, ``op`` (aten name), ``kind``, ``module``, ``status`` (``int8
  static``, ``int8 dynamic``, ``int8 fused``: runs inside the int8 conv/linear before it;
  ``int8 shared``: int8 in and out with its input's qparams; ``float``), ``reason`` (English)
  and ``reason_in(lang)`` / ``why`` (the lesson's language), ``specs``.
- ``Coverage``: ``report[node]``, ``names(kind=, int8=, op=)``, ``statuses(op)``,
  ``counts()`` (kind -> (int8, all)), ``reasons()``, ``schemes(role)``, ``summary()``,
  ``table(only=)`` (``"float"``, ``"int8"`` or a kind), ``grouped(only=, with_layout=)``
  (one row per op, status and reason, with a count: the short table for big models).
- ``side_by_side(*reports)``, ``spec_table(*reports)``: several quantizers on one graph.
- ``X86_UNARY_FUSIONS``: the activations x86 fuses into the conv or linear before them;
  ``MOVING_KINDS``: the kinds that move values without arithmetic.

Float reasons come from the installed quantizers' rules: ``X86InductorQuantizer``'s op sets,
fusion patterns and propagation (torchao 0.18), ``XNNPACKQuantizer``'s patterns and
``propagate_annotation`` and ``XnnpackPartitioner``'s constraints (ExecuTorch 1.5.1); other
quantizers get a generic reason (which input is not quantized).
"""

import copy
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from common.charts import display_width, pad
from common.lesson import lesson_language

__all__ = [
    "COMPUTE_OPS",
    "MOVING_KINDS",
    "OPS",
    "X86_UNARY_FUSIONS",
    "Coverage",
    "OpCoverage",
    "coverage",
    "side_by_side",
    "spec_table",
]

aten = torch.ops.aten

#: The compute ops the report covers, by kind. ``add`` and ``mul`` count only between two
#: tensors (a residual add, a squeeze-excitation scale), not with a Python number.
COMPUTE_OPS = {
    aten.conv1d.default: "conv",
    aten.conv2d.default: "conv",
    aten.conv3d.default: "conv",
    aten.convolution.default: "conv",
    aten.conv_transpose1d.default: "conv",
    aten.conv_transpose2d.input: "conv",
    aten.conv_transpose3d.input: "conv",
    aten.linear.default: "linear",
    aten.matmul.default: "matmul",
    aten.bmm.default: "matmul",
    aten.mm.default: "matmul",
    aten.addmm.default: "matmul",
    aten.baddbmm.default: "matmul",
    aten.scaled_dot_product_attention.default: "attention",
    aten.add.Tensor: "add",
    aten.add_.Tensor: "add",
    aten.mul.Tensor: "mul",
    aten.mul_.Tensor: "mul",
}


def _targets(kind: str, *names: str) -> dict:
    """``{aten.<name>: kind}`` for the overloads named ``op.overload`` that this torch has."""
    found = {}
    for name in names:
        packet, overload = name.split(".")
        target = getattr(getattr(aten, packet, None), overload, None)
        if target is not None:
            found[target] = kind
    return found


#: Every op ``coverage(..., every_op=True)`` reports, by kind: ``COMPUTE_OPS``; the ops that
#: can pass int8 values through (``pool``, ``cat``, ``pad``, ``slice``, ``layout``); ``norm``,
#: ``activation``, ``resample``, ``reduction``, ``embedding``, ``recurrent``; and ``sub`` and
#: ``div`` between two tensors (``elementwise``). An eval-mode dropout, an identity, is not
#: listed.
OPS = {
    **COMPUTE_OPS,
    **_targets(
        "pool",
        "max_pool1d.default",
        "max_pool2d.default",
        "max_pool3d.default",
        "max_pool2d_with_indices.default",
        "avg_pool1d.default",
        "avg_pool2d.default",
        "avg_pool3d.default",
        "adaptive_avg_pool1d.default",
        "adaptive_avg_pool2d.default",
        "adaptive_avg_pool3d.default",
        "adaptive_max_pool1d.default",
        "adaptive_max_pool2d.default",
    ),
    **_targets("cat", "cat.default", "stack.default", "concat.default"),
    **_targets(
        "pad",
        "pad.default",
        "constant_pad_nd.default",
        "reflection_pad1d.default",
        "reflection_pad2d.default",
        "replication_pad1d.default",
        "replication_pad2d.default",
    ),
    **_targets(
        "slice",
        "slice.Tensor",
        "split.Tensor",
        "split_with_sizes.default",
        "chunk.default",
        "narrow.default",
        "select.int",
        "unbind.int",
    ),
    **_targets(
        "layout",
        "view.default",
        "reshape.default",
        "flatten.using_ints",
        "unflatten.int",
        "permute.default",
        "transpose.int",
        "t.default",
        "squeeze.dim",
        "squeeze.dims",
        "squeeze.default",
        "unsqueeze.default",
        "contiguous.default",
        "expand.default",
    ),
    **_targets(
        "norm",
        "layer_norm.default",
        "group_norm.default",
        "batch_norm.default",
        "_native_batch_norm_legit_no_training.default",
        "instance_norm.default",
        "rms_norm.default",
    ),
    **_targets(
        "activation",
        "relu.default",
        "relu_.default",
        "relu6.default",
        "hardtanh.default",
        "hardtanh_.default",
        "leaky_relu.default",
        "leaky_relu_.default",
        "gelu.default",
        "silu.default",
        "silu_.default",
        "mish.default",
        "hardswish.default",
        "hardswish_.default",
        "hardsigmoid.default",
        "hardsigmoid_.default",
        "sigmoid.default",
        "tanh.default",
        "elu.default",
        "prelu.default",
        "softplus.default",
        "softmax.int",
        "_softmax.default",
        "log_softmax.int",
        "clamp.default",
        "clamp_.default",
        "clamp_min.default",
    ),
    **_targets(
        "resample",
        "upsample_nearest1d.vec",
        "upsample_nearest2d.vec",
        "upsample_nearest2d.default",
        "upsample_bilinear2d.vec",
        "upsample_bilinear2d.default",
        "upsample_bicubic2d.vec",
        "pixel_shuffle.default",
        "pixel_unshuffle.default",
        "grid_sampler.default",
    ),
    **_targets(
        "reduction",
        "mean.dim",
        "mean.default",
        "sum.dim_IntList",
        "sum.default",
        "amax.default",
        "amin.default",
        "max.dim",
        "min.dim",
        "var.correction",
        "std.correction",
    ),
    **_targets("embedding", "embedding.default", "embedding_bag.default"),
    **_targets("recurrent", "lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input"),
    **_targets("elementwise", "sub.Tensor", "div.Tensor"),
}
#: The kinds of ``OPS`` whose ops move values without arithmetic (``grouped(with_layout=False)``
#: leaves them out).
MOVING_KINDS = ("layout", "slice")
#: Ops of ``OPS`` that compute on two tensors, reported only when both operands are tensors.
_BINARY = {target for target, kind in OPS.items() if kind in ("add", "mul", "elementwise")}

_KEY = "quantization_annotation"
_ROLES = ("activation", "weight")
_INTEGER = {torch.int8, torch.uint8, torch.int16, torch.int32}
_LANGUAGES = ("en", "zh_TW")

_ADD_RULE = {
    "en": (
        "add is not in the quantizer's op set: it is annotated only fused after the conv or "
        "linear that feeds it (conv + add, linear + add)"
    ),
    "zh_TW": (
        "add 不在 quantizer 的運算集合裡：只在與前面的 conv 或 linear 融合時才標註"
        "（conv + add、linear + add）"
    ),
}

#: What a report says, by key, in each language: a reason (the English is the ``reason`` a
#: report stores, which tests and lessons compare, so it must not change) or a label. Fields:
#: ``{nodes}`` a tuple of node names, ``{specs}`` a tuple of ``_spec_text`` texts, both joined
#: in the language's way; any other field a string, shown as it is.
_TEXTS = {
    "int8": {"en": "{specs}", "zh_TW": "{specs}"},
    "int8 fused": {"en": "{specs} (fused with {nodes})", "zh_TW": "{specs}（與 {nodes} 融合）"},
    "not annotated": {"en": "not annotated", "zh_TW": "沒有標註"},
    "no integer spec": {
        "en": "annotated, but no integer spec for its input {nodes}",
        "zh_TW": "有標註，但它的輸入 {nodes} 沒有整數 spec",
    },
    "None config": {
        "en": "a None config keeps it float (set_module_name_qconfig / ..._type_qconfig)",
        "zh_TW": "它的設定是 None，所以留在浮點數（set_module_name_qconfig／..._type_qconfig）",
    },
    "no config": {
        "en": "no config: set_global was not called",
        "zh_TW": "沒有任何設定：沒有呼叫 set_global",
    },
    "not in op set": {
        "en": "aten.{op} is not in the quantizer's op set (quantizable_ops)",
        "zh_TW": "aten.{op} 不在 quantizer 的運算集合裡（quantizable_ops）",
    },
    "matmul on request": {
        "en": (
            "matmul is in quantizable_ops but not default_quantizable_ops: annotated only on "
            "request (set_function_type_qconfig(torch.matmul, ...), set_module_name_qconfig)"
        ),
        "zh_TW": (
            "matmul 在 quantizable_ops 裡，卻不在 default_quantizable_ops 裡：要指定才會標註"
            "（set_function_type_qconfig(torch.matmul, ...)、set_module_name_qconfig）"
        ),
    },
    "F.linear in a module": {
        "en": (
            "F.linear called inside {module_type}, not an nn.Linear: the linear pattern finds "
            "nn.Linear modules and F.linear calls (get_source_partitions)"
        ),
        "zh_TW": (
            "在 {module_type} 裡呼叫的 F.linear，不是 nn.Linear：linear 的模式找的是 "
            "nn.Linear 模組與 F.linear 呼叫（get_source_partitions）"
        ),
    },
    "conv2d in a module": {
        "en": "conv2d called inside {module_type}, not an nn.Conv2d module",
        "zh_TW": "在 {module_type} 裡呼叫的 conv2d，不是 nn.Conv2d 模組",
    },
    "conv1d without ReLU": {
        "en": "conv1d is annotated only with an nn.ReLU after it (the Conv1d + ReLU pattern)",
        "zh_TW": "conv1d 只在後面接著 nn.ReLU 時才標註（Conv1d + ReLU 的模式）",
    },
    "broadcast mul": {
        "en": (
            "mul of shapes {first} and {second}: the quantizer annotates mul only for two "
            "tensors of the same shape"
        ),
        "zh_TW": "mul 的兩個輸入形狀是 {first} 與 {second}：quantizer 只標註兩個張量形狀相同的 mul",
    },
    "add not fused": _ADD_RULE,
    "add fed by no conv": {
        "en": f"{_ADD_RULE['en']}; no conv or linear feeds this one directly",
        "zh_TW": f"{_ADD_RULE['zh_TW']}；這個 add 前面沒有直接接著 conv 或 linear",
    },
    "add fed by a busy conv": {
        "en": f"{_ADD_RULE['en']}; {{nodes}} feeding it has other users too",
        "zh_TW": f"{_ADD_RULE['zh_TW']}；它前面的 {{nodes}} 還有其他使用者",
    },
    "no rule": {
        "en": "not annotated: no rule of this report explains it",
        "zh_TW": "沒有標註：這份報告的規則都解釋不了",
    },
    "in no pattern": {
        "en": "aten.{op} is in none of the quantizer's patterns (SUPPORTED_PATTERNS)",
        "zh_TW": "aten.{op} 不在 quantizer 的任何一個模式裡（SUPPORTED_PATTERNS）",
    },
    "dynamic: linear and conv only": {
        "en": "the dynamic config annotates only linear and conv (patterns marked is_dynamic)",
        "zh_TW": "動態量化的設定只標註 linear 與 conv（標為 is_dynamic 的模式）",
    },
    "not float32": {
        "en": "{kind} of a tensor that is not float32: observers take float tensors only",
        "zh_TW": "{kind} 有一個輸入不是 float32 張量：observer 只接受浮點數張量",
    },
    "dynamic: conv + ReLU": {
        "en": (
            "a conv followed by a ReLU is annotated only by the conv + ReLU pattern, "
            "which the dynamic config does not apply"
        ),
        "zh_TW": (
            "後面接著 ReLU 的 conv 只由 conv + ReLU 的模式標註，而動態量化的設定不套用這個模式"
        ),
    },
    "dynamic: 2-D only": {
        "en": "the dynamic config annotates 2-D convs only",
        "zh_TW": "動態量化的設定只標註 2-D conv",
    },
    "dynamic: depthwise": {
        "en": "a depthwise conv (one input channel per group) is not annotated dynamically",
        "zh_TW": "depthwise conv（每個 group 一個輸入通道）不會以動態量化標註",
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
    "dropout between": {
        "en": (
            "the add's input comes through an eval-mode dropout ({dropout}) from {producer}: "
            "x86's {producer_kind} + add pattern needs the add right after the "
            "{producer_kind}; remove eval-mode dropout nodes before prepare_pt2e"
        ),
        "zh_TW": (
            "add 的輸入經過一個 eval 模式的 dropout（{dropout}）才來自 {producer}：x86 的 "
            "{producer_kind} + add 模式要 add 緊接在 {producer_kind} 之後；在 prepare_pt2e "
            "之前拿掉 eval 模式的 dropout node"
        ),
    },
    "x86 propagation": {
        "en": (
            "x86 makes aten.{op} int8 only when its input comes from a quantized op "
            "(propagation_quantizable_ops); float input: {nodes}"
        ),
        "zh_TW": (
            "x86 只在輸入來自量化運算時才讓 aten.{op} 成為 int8"
            "（propagation_quantizable_ops）；浮點數輸入：{nodes}"
        ),
    },
    "x86 propagation cat": {
        "en": (
            "x86 makes cat int8 only when every input comes from a quantized op "
            "(propagation_quantizable_ops); float input: {nodes}"
        ),
        "zh_TW": (
            "x86 只在每個輸入都來自量化運算時才讓 cat 成為 int8"
            "（propagation_quantizable_ops）；浮點數輸入：{nodes}"
        ),
    },
    "x86 flatten": {
        "en": "x86 makes flatten int8 only before a quantizable op, and none of its users is one",
        "zh_TW": "x86 只在 flatten 後面接著可量化運算時才讓它成為 int8，而它的使用者都不是",
    },
    "x86 unary": {
        "en": (
            "x86 has no int8 {op} of its own: it fuses it only right after {patterns}; "
            "here it follows {producer} ({producer_op})"
        ),
        "zh_TW": (
            "x86 沒有單獨的 int8 {op}：只在緊接著 {patterns} 時把它融合進去；"
            "這裡它前面是 {producer}（{producer_op}）"
        ),
    },
    "x86 unary function": {
        "en": (
            "x86 fuses {op} right after {producer} only when both are module calls "
            "({patterns} as nn.Linear/nn.Conv then an activation module: "
            "find_sequential_partitions); here {called} is a function called inside {module}: "
            "call it through a module (e.g. nn.ReLU()) before export"
        ),
        "zh_TW": (
            "x86 只在兩者都是模組呼叫時，才把 {op} 融合進緊接在前的 {producer}"
            "（{patterns}：先 nn.Linear／nn.Conv，再接 nn.ReLU 這類模組；"
            "find_sequential_partitions）；這裡 {called} 是在 {module} 裡呼叫的函式：匯出之前"
            "改成透過模組呼叫（例如 nn.ReLU()）"
        ),
    },
    "x86 unary busy": {
        "en": "x86 fuses {op} only right after {patterns}; {producer} before it has other users",
        "zh_TW": "x86 只在緊接著 {patterns} 時融合 {op}；它前面的 {producer} 還有其他使用者",
    },
    "xnnpack shares": {
        "en": (
            "XNNPACK passes int8 through aten.{op} only when the op before it has a quantized "
            "output (propagate_annotation); {producer} has none"
        ),
        "zh_TW": (
            "XNNPACK 只在前一個運算的輸出有量化時才讓 int8 穿過 aten.{op}"
            "（propagate_annotation）；{producer} 的輸出沒有"
        ),
    },
    "xnnpack refuses": {
        "en": (
            "XNNPACK's partitioner refuses it ({why}): ExecuTorch's portable kernels run it "
            "in float"
        ),
        "zh_TW": (
            "XNNPACK 的 partitioner 不收它（{why}）：由 ExecuTorch 的 portable kernel 以浮點數執行"
        ),
    },
    "xnnpack refuses annotated": {
        "en": (
            "annotated {status}, but XNNPACK's partitioner refuses it ({why}): ExecuTorch's "
            "portable kernels run it in float, between dequantize and quantize"
        ),
        "zh_TW": (
            "標註為 {status}，但 XNNPACK 的 partitioner 不收它（{why}）：由 ExecuTorch 的 "
            "portable kernel 在 dequantize 與 quantize 之間以浮點數執行"
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
    """A line of a report as its template's key in ``_TEXTS`` and the values of its fields.

    Kept beside the English string, so that each language's page says it in its own words
    without translating finished English.
    """

    key: str
    values: tuple = ()  # (field, value) pairs: a tuple keeps the report hashable

    def render(self, lang: str) -> str:
        values = dict(self.values)
        if "nodes" in values:
            values["nodes"] = _LIST[lang].join(values["nodes"])
        if "specs" in values:
            values["specs"] = " × ".join(_spec_in(spec, lang) for spec in values["specs"])
        return _TEXTS[self.key][lang].format(**values)


def _text(key: str, **values) -> _Text:
    return _Text(key, tuple(values.items()))


@dataclass(frozen=True)
class OpCoverage:
    """One compute op of the graph, as the quantizer left it.

    Attributes:
        node: the node's name in the exported graph (``conv2d_3``).
        op: the aten op (``conv2d``, ``linear``, ``add_``, ``scaled_dot_product_attention``).
        kind: ``conv``, ``linear``, ``matmul``, ``attention``, ``add`` or ``mul``; with
            ``every_op=True`` also a kind of ``OPS`` (``activation``, ``pool``, ``norm``, ...).
        module: the innermost module the node was recorded in (``blocks.0.se``; ``""``: the model).
        module_type: that module's class name.
        int8: whether every input the op computes on is quantized (or fused into the int8
            op before it).
        mode: ``static``, ``dynamic``, ``fused`` (it runs inside the int8 conv or linear
            before it: a ReLU, a GELU, x86's add) or ``shared`` (int8 in and out with its
            input's qparams: max-pool, cat) for an int8 op; ``""`` for a float one.
        reason: for a float op, why, read from the annotations, the graph and the
            quantizer's rules; for an int8 op, the specs of its inputs.
        specs: ``(role, spec)`` for each input the op computes on and the quantizer
            quantized: role ``activation`` or ``weight`` (a conv's or linear's second
            input), spec as in ``reason`` (``s8 per-channel symmetric``).
        said: ``reason`` as its template and values, from which ``reason_in`` says it in
            either language; None for an op built by hand (``reason_in`` then gives
            ``reason``).
    """

    node: str
    op: str
    kind: str
    module: str
    module_type: str
    int8: bool
    mode: str
    reason: str
    specs: tuple = ()
    said: _Text | None = field(default=None, compare=False, repr=False)

    @property
    def status(self) -> str:
        """``int8 static``, ``int8 dynamic``, ``int8 fused``, ``int8 shared`` or ``float``."""
        return f"int8 {self.mode}" if self.int8 else "float"

    def status_in(self, lang: str) -> str:
        """``status`` in ``lang``, ``"en"`` or ``"zh_TW"`` (``int8 融合``, ``浮點數``)."""
        if _checked(lang) == "en":
            return self.status
        return _STATUS_ZH_TW.get(self.mode, f"int8 {self.mode}") if self.int8 else "浮點數"

    @property
    def why(self) -> str:
        """``reason`` in the language of the lesson that asks (``lesson_language()``): what a
        page prints, while ``reason`` stays the English that asserts compare."""
        return self.reason_in(lesson_language())

    def reason_in(self, lang: str) -> str:
        """``reason`` in ``lang``, ``"en"`` (``reason`` itself) or ``"zh_TW"``.

        >>> said = _text("int8 fused", specs=("u8 per-tensor affine",), nodes=("conv2d",))
        >>> op = OpCoverage("add", "add", "add", "", "", True, "fused", "", said=said)
        >>> op.reason_in("zh_TW")
        'u8 per-tensor 仿射（與 conv2d 融合）'
        """
        lang = _checked(lang)
        if self.said is None or lang == "en":
            return self.reason
        return self.said.render(lang)


@dataclass(frozen=True)
class Coverage:
    """The report of ``coverage``: one ``OpCoverage`` per compute op, in graph order.

    Attributes:
        label: the quantizer's name in tables (``X86InductorQuantizer``, ``... dynamic``).
        ops: the compute ops (every op of ``OPS`` when ``every_op``).
        said: ``label`` as its template and values, when ``coverage`` made it (a zh_TW
            table says ``X86InductorQuantizer（動態）``); None for a label given by hand.
        every_op: whether ``coverage`` was asked for every op (``every_op=True``); the
            summary then says "ops", not "compute ops".
    """

    label: str
    ops: tuple
    said: _Text | None = field(default=None, compare=False, repr=False)
    every_op: bool = field(default=False, compare=False)

    def _label_in(self, lang: str) -> str:
        return self.said.render(lang) if self.said is not None else self.label

    def __getitem__(self, node: str) -> OpCoverage:
        for op in self.ops:
            if op.node == node:
                return op
        what = "op" if self.every_op else "compute op"
        raise KeyError(f"no {what} named {node!r} (one of: {', '.join(self.names())})")

    def names(
        self, *, kind: str | None = None, int8: bool | None = None, op: str | None = None
    ) -> list[str]:
        """The nodes' names, optionally only one ``kind``, only int8 (True) or float (False),
        only one aten ``op`` (``layer_norm``)."""
        return [
            o.node
            for o in self.ops
            if (kind is None or o.kind == kind)
            and (int8 is None or o.int8 == int8)
            and (op is None or o.op == op)
        ]

    def statuses(self, op: str) -> Counter:
        """How many nodes of the aten ``op`` (``max_pool2d``) got each status."""
        return Counter(o.status for o in self.ops if o.op == op)

    def counts(self) -> dict[str, tuple[int, int]]:
        """kind to (int8 ops, all ops), kinds in the order the graph first uses them."""
        found: dict[str, list[int]] = {}
        for op in self.ops:
            entry = found.setdefault(op.kind, [0, 0])
            entry[0] += op.int8
            entry[1] += 1
        return {kind: (int8, total) for kind, (int8, total) in found.items()}

    def schemes(self, role: str) -> list[str]:
        """The distinct specs the quantizer gave the ``activation`` or ``weight`` inputs, sorted.

        Raises:
            ValueError: if ``role`` is neither.
        """
        if role not in _ROLES:
            raise ValueError(f"role={role!r}: use one of {', '.join(map(repr, _ROLES))}")
        return sorted({spec for op in self.ops for r, spec in op.specs if r == role})

    def reasons(self) -> Counter:
        """How many float ops each reason accounts for."""
        return Counter(op.reason for op in self.ops if not op.int8)

    def summary(self, *, lang: str | None = None) -> str:
        """Int8 ops out of all, per kind; then each float reason with its count, a line each
        (reasons that differ only in the nodes they name share a line, the nodes merged).

        Args:
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.
        """
        lang = _checked(lang)
        int8 = sum(op.int8 for op in self.ops)
        kinds = _kinds(self, lang)
        groups: dict[tuple, list[OpCoverage]] = {}
        for op in self.ops:
            if not op.int8:
                groups.setdefault(_reason_key(op), []).append(op)
        ordered = sorted(groups.values(), key=len, reverse=True)  # stable: first seen first
        said = [(len(members), _merged_reason(members, lang)) for members in ordered]
        label, count = self._label_in(lang), len(self.ops)
        if lang == "zh_TW":
            what = "運算" if self.every_op else "計算運算"
            lines = [f"{label}：{count} 個{what}中有 {int8} 個是 int8（{kinds}）"]
            lines += [f"  浮點數 ×{n}：{reason}" for n, reason in said]
        else:
            what = "ops" if self.every_op else "compute ops"
            lines = [f"{label}: {int8} of {count} {what} int8 ({kinds})"]
            lines += [f"  float ×{n}: {reason}" for n, reason in said]
        return "\n".join(lines)

    def _only(self, only: str | None, with_layout: bool = True) -> list[OpCoverage]:
        kinds = {op.kind for op in self.ops}
        ops = [op for op in self.ops if with_layout or op.kind not in MOVING_KINDS]
        if only in (None, "float", "int8"):
            return [op for op in ops if only is None or op.int8 == (only == "int8")]
        if only in kinds:
            return [op for op in ops if op.kind == only]
        raise ValueError(
            f"only={only!r}: use 'float', 'int8', a kind of this report "
            f"({', '.join(sorted(kinds))}) or leave it out"
        )

    def table(self, *, only: str | None = None, lang: str | None = None) -> str:
        """A plain-text table: node, op, module, status, reason.

        Args:
            only: ``"float"`` or ``"int8"`` to list those ops only, or a kind (``"norm"``);
                all of them when omitted.
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.

        Raises:
            ValueError: if ``only`` is another value.
        """
        chosen = self._only(only)
        lang = _checked(lang)
        words = _HEADERS[lang]
        rows = [
            (op.node, op.op, op.module or words["model"], op.status_in(lang), op.reason_in(lang))
            for op in chosen
        ]
        header = (words["node"], words["op"], words["module"], self._label_in(lang), words["why"])
        return _format([header], rows)

    def grouped(
        self, *, only: str | None = None, with_layout: bool = True, lang: str | None = None
    ) -> str:
        """A short table: one row per op, status and reason, with its count, ops of a kind
        together (kinds in the order the graph first uses them). Node names in a reason are
        merged (the first three, then ``…``). ``only`` as in ``table``; ``with_layout=False``
        leaves out the ops that only move values (kinds ``layout`` and ``slice``:
        ``MOVING_KINDS``). No row: the header alone.

        >>> from common.pt2e import export_module, x86_quantizer
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
        >>> gm = export_module(net, (torch.ones(2, 4),))
        >>> report = coverage(gm, x86_quantizer(), every_op=True)
        >>> report.grouped(only="activation", lang="en").splitlines()[1].split("  ")[-1]
        'runs as a post-op inside the int8 linear kernel of linear, linear_1'
        """
        chosen = self._only(only, with_layout)
        lang = _checked(lang)
        kinds = list(dict.fromkeys(op.kind for op in self.ops))
        groups: dict[tuple, list[OpCoverage]] = {}
        for op in sorted(chosen, key=lambda o: kinds.index(o.kind)):
            said = op.said
            key = (op.kind, op.op, op.status, said.key if said else op.reason)
            groups.setdefault(key, []).append(op)
        rows = []
        for members in groups.values():
            first = members[0]
            rows.append(
                (
                    first.kind,
                    first.op,
                    str(len(members)),
                    first.status_in(lang),
                    _merged_reason(members, lang),
                )
            )
        words = _HEADERS[lang]
        header = (words["kind"], words["op"], "n", self._label_in(lang), words["why"])
        return _format([header], rows)


#: The fields of a reason that name nodes: ``grouped`` merges them across a group's members.
_NODE_FIELDS = ("nodes", "root", "producer", "dropout", "extra")


def _reason_key(op: OpCoverage) -> tuple:
    """An op's reason without the nodes it names: the ops ``summary`` counts on one line."""
    if op.said is None:
        return (op.reason,)
    return (op.said.key, *((k, v) for k, v in op.said.values if k not in _NODE_FIELDS))


def _merged_reason(members: list[OpCoverage], lang: str) -> str:
    """The reason of a group of ops: its node fields list every member's nodes (at most 3);
    when the members' other values differ (a broadcast mul's shapes), the first member's,
    said so."""
    said = members[0].said
    if said is None:
        return members[0].reason_in(lang)
    values = dict(said.values)
    others = {tuple((k, v) for k, v in m.said.values if k not in _NODE_FIELDS) for m in members}
    alike = _ALIKE[lang] if len(others) > 1 else ""
    for name in _NODE_FIELDS:
        if name not in values:
            continue
        seen = []
        for member in members:
            value = dict(member.said.values)[name]
            for node in value if isinstance(value, tuple) else (value,):
                if node not in seen:
                    seen.append(node)
        shown = _LIST[lang].join(seen[:3]) + ("…" if len(seen) > 3 else "")
        values[name] = (shown,) if name == "nodes" else shown
    return _Text(said.key, tuple(values.items())).render(lang) + alike


_ALIKE = {"en": " (the first; the others alike)", "zh_TW": "（列出第一個，其餘同類）"}


def _kinds(report: Coverage, lang: str) -> str:
    """``conv 3/3, add 1/1``: int8 ops out of all, per kind, listed in the language's way."""
    return _LIST[lang].join(f"{kind} {i}/{n}" for kind, (i, n) in report.counts().items())


def _format(header: list[tuple], rows: list[tuple]) -> str:
    table = header + rows
    widths = [max(display_width(str(row[i])) for row in table) for i in range(len(table[0]))]
    lines = []
    for row in table:
        cells = [pad(str(cell), width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines)


def side_by_side(*reports: Coverage, lang: str | None = None) -> str:
    """One table, a status column per report: the same graph under several quantizers.

    Args:
        reports: ``coverage`` reports of one exported graph.
        lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
            omitted.

    Returns:
        str: node, op, module, then each report's status (``int8 static``, ``float``, ...).

    Raises:
        ValueError: if no report is given or they cover different nodes (other graphs).
    """
    if not reports:
        raise ValueError("side_by_side needs at least one report: side_by_side(x86, xnnpack)")
    names = [op.node for op in reports[0].ops]
    for report in reports[1:]:
        if [op.node for op in report.ops] != names:
            raise ValueError(
                f"{report.label!r} covers other nodes than {reports[0].label!r}: "
                "give side_by_side reports of the same exported graph"
            )
    lang = _checked(lang)
    words = _HEADERS[lang]
    rows = [
        (op.node, op.op, op.module or words["model"], *(r.ops[i].status_in(lang) for r in reports))
        for i, op in enumerate(reports[0].ops)
    ]
    labels = (r._label_in(lang) for r in reports)
    return _format([(words["node"], words["op"], words["module"], *labels)], rows)


def spec_table(*reports: Coverage, lang: str | None = None) -> str:
    """One row per quantizer: the specs of its activations and weights, its int8 ops per kind.

    Args:
        reports: ``coverage`` reports, of one graph or several.
        lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
            omitted.

    Returns:
        str: quantizer, activations, weights, int8 ops (``conv 3/3, add 1/1, ...``); a
        quantizer that gave one role several specs lists them separated by ``/``.

    Raises:
        ValueError: if no report is given.
    """
    if not reports:
        raise ValueError("spec_table needs at least one report: spec_table(x86, xnnpack)")
    lang = _checked(lang)
    between = " / " if lang == "en" else "／"
    rows = []
    for report in reports:
        activations, weights = (
            between.join(_spec_in(spec, lang) for spec in report.schemes(r)) or "-" for r in _ROLES
        )
        rows.append((report._label_in(lang), activations, weights, _kinds(report, lang)))
    if lang == "zh_TW":
        return _format([("quantizer", "活化值", "weight", "int8 運算")], rows)
    return _format([("quantizer", "activations", "weights", "int8 ops")], rows)


def coverage(
    model: torch.fx.GraphModule, quantizer, *, label: str | None = None, every_op: bool = False
) -> Coverage:
    """Run ``prepare_pt2e`` on a copy of ``model`` and report every compute op: int8 or float, why.

    Each op of ``COMPUTE_OPS`` in the graph is int8 when the quantizer's annotation
    (``node.meta["quantization_annotation"]``) gives each input it computes on (activation and
    weight; both operands of add, mul, matmul; q, k, v of attention) an integer quantization
    spec, or when the quantizer annotated the output of the node that produces that input (an
    integer observer sits on the edge, or before a flatten/view/reshape: ``OpenVINOQuantizer``
    annotates this way; for an op without weights, only when its output is quantized again),
    or when
    that input comes straight from the int8 conv or linear it is fused into (x86's conv + add).
    A float op gets the reason that this quantizer's rules give for it, for
    ``X86InductorQuantizer`` and ExecuTorch's ``XNNPACKQuantizer``: op not in the
    quantizer's set, a linear recorded inside a module that is not an ``nn.Linear``
    (``nn.MultiheadAttention``), ``matmul`` only on request, a broadcast ``mul``, an ``add``
    with no conv or linear to fuse into, a dynamic config that covers linears and convs only,
    a ``None`` config. For other quantizers, float ops say only which input is not quantized.

    With ``every_op=True`` the report covers every op of ``OPS``: also pooling, cat, pad,
    slices, layout ops, norms, activations, resampling, reductions, embeddings, recurrent
    layers. Such an op is ``int8 fused`` when it runs inside the int8 conv, linear or add
    before it (a ReLU or GELU the quantizer annotated as that pattern's end), ``int8 shared``
    when the quantizer gave it int8 input and output with its input's qparams (max-pool, cat,
    XNNPACK's propagated ops), ``int8 static`` when int8 in and out with qparams of its own,
    else ``float`` with the quantizer's rule: for x86, a propagation op whose input is float,
    an activation that x86 fuses only after certain convs and linears, an op x86 has no int8
    form of; for XNNPACK, an op no pattern covers, a pass-through op after a float output,
    and an op XNNPACK's partitioner refuses (its ``check_constraints``, as ``mean`` over
    anything but H and W of a 4-D tensor with ``keepdim``), which ExecuTorch's portable
    kernels then run in float even where the quantizer annotated it.

    Args:
        model: an exported graph, ``torch.export.export(model, args).module()``; not changed.
        quantizer: a PT2E quantizer, configured (``set_global``).
        label: the quantizer's name in tables; by default its class name, plus ``dynamic``
            when its global config quantizes activations dynamically.
        every_op: report every op of ``OPS``, not only ``COMPUTE_OPS``.

    Returns:
        Coverage: one ``OpCoverage`` per compute op (per op of ``OPS`` with ``every_op``), in
        graph order.

    Raises:
        TypeError: if ``model`` is not a ``torch.fx.GraphModule`` or ``quantizer`` has no
            ``annotate``.
        ValueError: if the quantizer cannot annotate the graph because a module is called at
            several places (a reused ``nn.ReLU``); the message names the modules and the fix.

    >>> from common.pt2e import export_module, x86_quantizer
    >>> gm = export_module(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.ones(2, 4),))
    >>> coverage(gm, x86_quantizer()).summary()
    'X86InductorQuantizer: 1 of 1 compute ops int8 (linear 1/1)'
    """
    from common.pt2e import quiet

    quiet()
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    if not isinstance(model, torch.fx.GraphModule):
        raise TypeError(
            f"coverage reads an exported graph, got {type(model).__name__}; pass "
            "torch.export.export(model, args).module() (common.pt2e.export_module)"
        )
    if not callable(getattr(quantizer, "annotate", None)):
        raise TypeError(
            f"{type(quantizer).__name__} is not a PT2E quantizer (it has no annotate); pass e.g. "
            "common.pt2e.x86_quantizer()"
        )
    wanted = _compute_nodes(model, every_op=every_op)
    try:
        prepared = prepare_pt2e(copy.deepcopy(model), quantizer)
    except ValueError as error:
        if "more than one output node" not in str(error):
            raise
        raise ValueError(_reused_message(model, quantizer, error)) from error
    rules = _rules_for(quantizer, prepared)
    nodes = {node.name: node for node in prepared.graph.nodes}
    originals = {node.name: node for node in model.graph.nodes}
    ops = []
    for name, kind in wanted:
        node = nodes.get(name)
        if node is None:  # removed by prepare (none of COMPUTE_OPS is, on the course's models)
            continue
        module, module_type = _module(node)
        if kind in _COMPUTE_KINDS:
            int8, mode, said, specs = _classify(prepared, node, kind, rules)
        else:
            int8, mode, said, specs = _classify_other(prepared, node, kind, rules)
        refused = getattr(rules, "refused", None)
        why = refused(originals[name]) if refused is not None else None
        if why is not None:
            status = f"int8 {mode}" if int8 else ""
            if int8:
                said = _text("xnnpack refuses annotated", status=status, why=why)
            else:
                said = _text("xnnpack refuses", why=why)
            int8, mode, specs = False, "", ()
        op = node.target._overloadpacket.__name__
        reason = said.render("en")
        ops.append(OpCoverage(name, op, kind, module, module_type, int8, mode, reason, specs, said))
    if label:
        return Coverage(label, tuple(ops), every_op=every_op)
    said = _label(quantizer)
    return Coverage(said.render("en"), tuple(ops), said, every_op=every_op)


_COMPUTE_KINDS = frozenset(COMPUTE_OPS.values())


def _compute_nodes(model: torch.fx.GraphModule, *, every_op: bool) -> list[tuple[str, str]]:
    table = OPS if every_op else COMPUTE_OPS
    found = []
    for node in model.graph.nodes:
        kind = table.get(node.target) if node.op == "call_function" else None
        if node.target in _BINARY and not all(_is_tensor(a) for a in node.args[:2]):
            continue
        if kind:
            found.append((node.name, kind))
    return found


def _is_tensor(arg) -> bool:
    return isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)


def _module(node: torch.fx.Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1].strip("'>")
    return path, name


def _label(quantizer) -> _Text:
    name = type(quantizer).__name__
    config = getattr(quantizer, "global_config", None)
    activation = getattr(config, "input_activation", None)
    return _text(
        "label dynamic" if getattr(activation, "is_dynamic", False) else "label", name=name
    )


def _reused_message(model, quantizer, error) -> str:
    calls: dict[str, set] = {}  # module path -> the keys of its calls ("...act", "...act@1")
    types = {}
    for node in model.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if node.op == "call_function" and stack:
            key, (path, _) = list(stack.items())[-1]
            calls.setdefault(path, set()).add(key)
            types[path] = _module(node)[1]
    reused = [f"'{p}' ({types[p]}, {len(k)} calls)" for p, k in calls.items() if len(k) > 1]
    return (
        f"{type(quantizer).__name__} could not annotate this graph ({error}): its fusion "
        "patterns find modules through the nn_module_stack a non-strict export records, one "
        f"partition per module, and these modules are called at several places: "
        f"{', '.join(reused) or 'none found'}. Export with "
        "torch.export.export(model, args, strict=True) (its source_fn_stack names each call), "
        "or give each call its own module"
    )


def _annotation(node):
    return node.meta.get(_KEY)


def _is_observer(arg) -> bool:
    return (
        isinstance(arg, torch.fx.Node)
        and arg.op == "call_module"
        and "activation_post_process" in str(arg.target)
    )


def _unobserved(arg):
    """The producer of an input, looking through an observer prepare inserted."""
    while _is_observer(arg):
        arg = arg.args[0]
    return arg


def _computed_inputs(node: torch.fx.Node, kind: str, *, observed: bool = False) -> list:
    """The inputs the op computes on; as the prepared graph has them (observers included)
    when ``observed``, else their producers."""
    args = list(node.args) if observed else [_unobserved(a) for a in node.args]
    if kind in ("conv", "linear"):
        return args[:2]
    if kind == "attention":
        return args[:3]
    if node.target in (aten.addmm.default, aten.baddbmm.default):
        return args[1:3]
    return [a for a in args[:2] if _is_tensor(_unobserved(a))]


def _spec_text(spec) -> str:
    """``u8 per-tensor affine``: a ``QuantizationSpec``'s or an observer's dtype and qscheme."""
    from torchao.quantization.pt2e.quantizer import QuantizationSpecBase

    if isinstance(spec, QuantizationSpecBase) and not hasattr(spec, "qscheme"):
        return "shared"
    dtype = {torch.int8: "s8", torch.uint8: "u8"}.get(spec.dtype, str(spec.dtype).split(".")[-1])
    scheme = str(spec.qscheme).split(".")[-1]  # torch.per_channel_symmetric
    scheme = scheme.replace("per_tensor_", "per-tensor ").replace("per_channel_", "per-channel ")
    return f"{dtype} {scheme}" + (" dynamic" if getattr(spec, "is_dynamic", False) else "")


_RESHAPES = {aten.flatten.using_ints, aten.view.default, aten.reshape.default}


def _through_reshapes(arg):
    """Back through flatten/view/reshape, which move int8 values without changing them (a
    pooled, observed output flattened for a linear)."""
    while isinstance(arg, torch.fx.Node) and arg.op == "call_function" and arg.target in _RESHAPES:
        arg = arg.args[0]
    return arg


def _requantized(prepared, node) -> bool:
    """The op's output, or that of the one ReLU after it, goes through an integer observer."""
    users = list(node.users)
    if len(users) == 1 and users[0].target in (aten.relu.default, aten.relu_.default):
        users += list(users[0].users)
    return any(_integer_observer(prepared, user) is not None for user in users)


def _integer_observer(prepared, arg):
    """The observer prepare put on this edge, when it quantizes to an integer dtype."""
    if not _is_observer(arg):
        return None
    observer = prepared.get_submodule(arg.target)
    return observer if getattr(observer, "dtype", None) in _INTEGER else None


def _is_fused_into(producer, node) -> bool:
    """``producer`` is a conv or linear annotated as part of a pattern ending later (x86's
    conv + add): its output is not quantized, its value never leaves the int8 kernel."""
    if not isinstance(producer, torch.fx.Node) or COMPUTE_OPS.get(producer.target) not in (
        "conv",
        "linear",
    ):
        return False
    annotation = _annotation(producer)
    return (
        annotation is not None
        and bool(annotation.input_qspec_map)
        and annotation.output_qspec is None
        and not getattr(annotation, "_is_output_of_quantized_pattern", False)
        and list(producer.users) == [node]
    )


def _classify(prepared, node, kind, rules) -> tuple[bool, str, _Text, tuple]:
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    annotation = _annotation(node)
    specs = annotation.input_qspec_map if annotation is not None else {}
    raw = _computed_inputs(node, kind, observed=True)
    # An input not annotated as this op's input is quantized all the same when the quantizer
    # annotated its producer's output (an integer observer on the edge). An op without weights
    # then computes in int8 only when its output is quantized again, as a backend fuses
    # dq -> op [-> relu] -> q; else it computes in float on values an earlier op quantized.
    edges_count = kind in ("conv", "linear") or _requantized(prepared, node)
    missing, fused, texts, roles, dynamic = [], [], [], [], False
    for index, edge in enumerate(raw):
        arg = _unobserved(edge)
        role = "weight" if kind in ("conv", "linear") and index == 1 else "activation"
        spec = specs.get(arg)
        if not isinstance(spec, QuantizationSpec) and (edges_count or spec is not None):
            # the observer on the edge says what a shared spec or a producer's output spec is
            spec = _integer_observer(prepared, _through_reshapes(edge)) or spec
        if spec is None:
            (fused if _is_fused_into(arg, node) else missing).append(arg)
            continue
        if hasattr(spec, "dtype"):
            if spec.dtype not in _INTEGER:
                missing.append(arg)
                continue
            dynamic = dynamic or getattr(spec, "is_dynamic", False)
        texts.append(_spec_text(spec))
        roles.append((role, texts[-1]))
    if kind == "add" and fused and missing and not texts and _annotated_empty(annotation):
        # x86's linear + add: the add runs as the qlinear's post-op, and x86 puts no
        # quantize before its extra input ("accuracy issues", _annotate_linear_binary_unary)
        names = tuple(a.name for a in fused)
        extra = _LIST["en"].join(a.name for a in missing if isinstance(a, torch.fx.Node))
        return True, "fused", _text("fused, extra input float", nodes=names, extra=extra), ()
    if not missing and texts:
        mode = "fused" if fused else "dynamic" if dynamic else "static"
        if fused:
            detail = _text("int8 fused", specs=tuple(texts), nodes=tuple(a.name for a in fused))
        else:
            detail = _text("int8", specs=tuple(texts))
        return True, mode, detail, tuple(roles)
    return False, "", rules(node, kind, annotation, missing), ()


def _annotated_empty(annotation) -> bool:
    """Annotated as part of a pattern, with no spec of its own (x86's linear + add's add)."""
    return (
        annotation is not None
        and getattr(annotation, "_annotated", False)
        and not annotation.input_qspec_map
        and annotation.output_qspec is None
    )


def _fused_root(node):
    """The int8 conv, linear, add or mul whose kernel runs ``node`` as a post-op, or None.

    A quantizer annotates a fusion pattern (x86's conv + ReLU, linear + GELU, linear + add +
    ReLU; XNNPACK's conv + ReLU, add + ReLU) by quantizing the first op's inputs and the last
    op's output, and nothing between: each op after the first is annotated, and the op before
    it has no output spec and no other user.
    """
    annotation = _annotation(node)
    if annotation is None or not getattr(annotation, "_annotated", False):
        return None
    if annotation.input_qspec_map and node.target not in COMPUTE_OPS:
        return None  # an op quantized on its own
    for producer in node.args[:2]:
        if (
            not isinstance(producer, torch.fx.Node)
            or producer.op != "call_function"
            or list(producer.users) != [node]
        ):
            continue
        before = _annotation(producer)
        if (
            before is None
            or before.output_qspec is not None
            or getattr(before, "_is_output_of_quantized_pattern", False)
        ):
            continue
        if before.input_qspec_map and COMPUTE_OPS.get(producer.target) in _FUSING_KINDS:
            return producer
        root = _fused_root(producer)
        if root is not None:
            return root
    return None


_FUSING_KINDS = ("conv", "linear", "add", "mul")


def _value_inputs(node) -> list:
    """The inputs an op of ``OPS`` computes on, as the prepared graph has them: cat's tensors,
    both operands of a binary op, else the first argument."""
    if node.target in (aten.cat.default, aten.stack.default) or (
        hasattr(aten, "concat") and node.target == aten.concat.default
    ):
        return list(node.args[0])
    if node.target in _BINARY:
        return [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
    return [a for a in node.args[:1] if isinstance(a, torch.fx.Node)]


def _classify_other(prepared, node, kind, rules) -> tuple[bool, str, _Text, tuple]:
    """``_classify`` for an op of ``OPS`` beyond ``COMPUTE_OPS``: fused, shared, static, float."""
    from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

    root = _fused_root(node)
    if root is not None:
        said = _text("post-op", root=root.name, root_op=root.target._overloadpacket.__name__)
        return True, "fused", said, ()
    annotation = _annotation(node)
    edges = _value_inputs(node)
    observers = [_integer_observer(prepared, edge) for edge in edges]
    if annotation is not None and annotation.input_qspec_map:
        outputs = [o for o in (_integer_observer(prepared, u) for u in node.users) if o]
        if edges and all(o is not None for o in observers) and outputs:
            specs = [*annotation.input_qspec_map.values(), annotation.output_qspec]
            shared = any(isinstance(spec, SharedQuantizationSpec) for spec in specs)
            text = _spec_text(observers[0])
            dynamic = getattr(observers[0], "is_dynamic", False)
            mode = "shared" if shared else "dynamic" if dynamic else "static"
            said = _text("int8 shared" if shared else "int8", specs=(text,))
            return True, mode, said, (("activation", text),)
    missing = [_unobserved(e) for e, o in zip(edges, observers, strict=True) if o is None]
    if annotation is not None and not annotation.input_qspec_map and annotation.output_qspec:
        return False, "", _text("output only"), ()  # OpenVINOQuantizer: for the op after it
    return False, "", rules(node, kind, annotation, missing), ()


def _rules_for(quantizer, prepared):
    module = type(quantizer).__module__
    if module.startswith("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer"):
        return _X86Rules(quantizer, prepared)
    if module.startswith("executorch.backends.xnnpack.quantizer"):
        return _XnnpackRules(quantizer)
    return _generic_reason


def _generic_reason(node, kind, annotation, missing) -> _Text:
    if annotation is None:
        return _text("not annotated")
    names = tuple(a.name if isinstance(a, torch.fx.Node) else repr(a) for a in missing)
    return _text("no integer spec", nodes=names)


def _shapes(node) -> tuple:
    return tuple(tuple(a.meta["val"].shape) for a in node.args[:2])


class _X86Rules:
    """Why ``X86InductorQuantizer`` (torchao 0.18) left a node float, from its source."""

    def __init__(self, quantizer, prepared):
        from torch.fx.passes.utils.source_matcher_utils import get_source_partitions
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

        self.x86, self.quantizer = x86, quantizer
        self.found = {}
        for kind, sources in (
            ("linear", [nn.Linear, nn.functional.linear]),
            ("conv", [nn.Conv2d, nn.functional.conv2d]),
        ):
            partitions = get_source_partitions(prepared.graph, sources).values()
            self.found[kind] = {n for parts in partitions for p in parts for n in p.nodes}

    def __call__(self, node, kind, annotation, missing) -> _Text:
        x86, target = self.x86, node.target
        if annotation is not None and annotation._annotated:
            if _annotated_empty(annotation) and not annotation._is_output_of_quantized_pattern:
                return _text("None config")
            return _generic_reason(node, kind, annotation, missing)
        configs = [self.quantizer.global_config, *self.quantizer.module_name_qconfig.values()]
        if not any(configs) and not any(self.quantizer.operator_type_qconfig.values()):
            return _text("no config")
        if kind not in _COMPUTE_KINDS:
            return self._other(node)
        if target not in x86.quantizable_ops and kind not in ("add",):
            return _text("not in op set", op=target._overloadpacket.__name__)
        if target == aten.matmul.default:
            return _text("matmul on request")
        if kind == "linear" and node not in self.found["linear"]:
            return _text("F.linear in a module", module_type=_module(node)[1])
        if target == aten.conv2d.default and node not in self.found["conv"]:
            return _text("conv2d in a module", module_type=_module(node)[1])
        if target == aten.conv1d.default:
            return _text("conv1d without ReLU")
        if kind == "mul":
            first, second = _shapes(node)
            if first != second:
                return _text("broadcast mul", first=str(list(first)), second=str(list(second)))
        if kind == "add":
            feeding = [
                a
                for a in node.args[:2]
                if isinstance(a, torch.fx.Node) and COMPUTE_OPS.get(a.target) in ("conv", "linear")
            ]
            if not feeding:
                dropout = _dropout_after_compute(node)
                if dropout is not None:
                    producer = dropout.args[0]
                    return _text(
                        "dropout between",
                        dropout=dropout.name,
                        producer=producer.name,
                        producer_kind=COMPUTE_OPS[producer.target],
                    )
                return _text("add fed by no conv")
            busy = tuple(a.name for a in feeding if len(a.users) > 1)
            if busy:
                return _text("add fed by a busy conv", nodes=busy)
            return _text("add not fused")
        return _text("no rule")

    def _quantized(self, node) -> bool:
        node = _unobserved(node)
        annotation = _annotation(node)
        return bool(annotation is not None and annotation._is_output_of_quantized_pattern)

    def _other(self, node) -> _Text:
        """Why x86 left an op beyond the compute ops float (``_annotate_propagation_...``,
        ``_annotate_conv2d_unary``, ``_annotate_linear_unary``)."""
        x86, target = self.x86, node.target
        op = target._overloadpacket.__name__
        if target in x86.propagation_quantizable_ops:
            if target == aten.flatten.using_ints and not any(
                user.target in x86.quantizable_ops for user in _observed_users(node)
            ):
                return _text("x86 flatten")
            inputs = [_unobserved(a) for a in _value_inputs(node)]
            floats = tuple(a.name for a in inputs if not self._quantized(a))
            if target == aten.cat.default:
                return _text("x86 propagation cat", nodes=floats)
            return _text("x86 propagation", op=op, nodes=floats)
        unary = _UNARY_NAMES.get(target)
        patterns = [
            f"{first} + {unary}" for first, ops in X86_UNARY_FUSIONS.items() if unary in ops
        ]
        if patterns and isinstance(node.args[0], torch.fx.Node):
            producer = _unobserved(node.args[0])
            said = _LIST["en"].join(patterns)
            first_ops = {p.split(" + ")[0] for p in patterns}
            if _op_name(producer) in first_ops and len(producer.users) > 1:
                return _text("x86 unary busy", op=op, patterns=said, producer=producer.name)
            if _op_name(producer) in first_ops:
                called = [n for n in (producer, node) if not _called_as_module(n)]
                if called:
                    return _text(
                        "x86 unary function",
                        op=op,
                        patterns=said,
                        producer=producer.name,
                        called=called[-1].name,
                        module=_innermost_module(called[-1]) or "the model",
                    )
            return _text(
                "x86 unary",
                op=op,
                patterns=said,
                producer=producer.name,
                producer_op=_described(producer),
            )
        return _text("not in op set", op=op)


#: The activations x86 fuses into the conv or linear right before them, read from torchao
#: 0.18's ``_annotate_conv2d_unary`` and ``_annotate_linear_unary`` (nn.ReLU6 exports as
#: hardtanh); tests/test_coverage.py checks them against the installed source.
X86_UNARY_FUSIONS = {
    "conv2d": ("relu", "hardtanh", "hardswish", "silu"),
    "conv1d": ("relu",),
    "linear": ("relu", "leaky_relu", "tanh", "gelu"),
}
_UNARY_NAMES = {
    target: target._overloadpacket.__name__.rstrip("_")
    for target, kind in OPS.items()
    if kind == "activation"
}


def _op_name(node) -> str:
    """``conv2d`` for a call of aten.conv2d; the node's kind (``placeholder``) otherwise."""
    if node.op == "call_function" and hasattr(node.target, "_overloadpacket"):
        return node.target._overloadpacket.__name__
    return node.op


#: The modules x86's conv/linear + activation patterns match (find_sequential_partitions
#: reads each node's module: source_fn_stack, else the innermost of nn_module_stack).
_PATTERN_MODULES = {
    "Linear", "Conv1d", "Conv2d", "ReLU", "ReLU6", "LeakyReLU", "Tanh", "GELU", "Hardtanh",
    "Hardswish", "SiLU",
}  # fmt: skip


def _innermost_module(node) -> str:
    """The class name of the module export recorded ``node`` inside (``Linear``), or ``""``."""
    stack = node.meta.get("source_fn_stack") or []
    if stack and isinstance(stack[-1][1], type):
        return stack[-1][1].__name__
    modules = node.meta.get("nn_module_stack") or {}
    if not modules:
        return ""
    kind = list(modules.values())[-1][1]
    return kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]


def _called_as_module(node) -> bool:
    """Whether ``node`` is the call of a module x86's patterns match (nn.ReLU, not F.relu)."""
    return _innermost_module(node) in _PATTERN_MODULES


def _described(node) -> str:
    """``aten.linear`` for a call of an aten op; the node's kind (``placeholder``) otherwise."""
    name = _op_name(node)
    return f"aten.{name}" if name != node.op else name


def _observed_users(node) -> list:
    """The users of ``node``, looking through an observer prepare put after it."""
    users = []
    for user in node.users:
        users += list(user.users) if _is_observer(user) else [user]
    return users


_DROPOUTS = {aten.dropout.default, aten.dropout_.default, aten.native_dropout.default}


def _dropout_after_compute(node):
    """A dropout feeding ``node`` whose own input is a conv or linear with no other user."""
    for arg in node.args[:2]:
        arg = _unobserved(arg)
        if isinstance(arg, torch.fx.Node) and arg.target in _DROPOUTS:
            producer = arg.args[0]
            if (
                isinstance(producer, torch.fx.Node)
                and COMPUTE_OPS.get(producer.target) in ("conv", "linear")
                and len(producer.users) == 1
            ):
                return arg
    return None


class _XnnpackRules:
    """Why ExecuTorch's ``XNNPACKQuantizer`` (1.5.1) left a node float, from its source; and
    which nodes ``XnnpackPartitioner`` refuses (``refused``)."""

    def __init__(self, quantizer):
        from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
        from executorch.backends.xnnpack.partition.config.generic_node_configs import (
            GenericNodePartitionerConfig,
        )

        self.configs = {
            config.target_name: config
            for config in ALL_PARTITIONER_CONFIGS
            if issubclass(config, GenericNodePartitionerConfig)
        }
        self.quantizer = quantizer
        self.targets = {aten.add_.Tensor, aten.mul_.Tensor}  # its add and mul annotators take both
        for pattern in quantizer.SUPPORTED_PATTERNS:
            self.targets |= set(pattern.op_overloads)
        self.dynamic_targets = set()
        for pattern in quantizer.SUPPORTED_PATTERNS:
            if pattern.is_dynamic:
                self.dynamic_targets |= set(pattern.op_overloads)

    def __call__(self, node, kind, annotation, missing) -> _Text:
        config = self.quantizer.global_config
        if annotation is not None and annotation._annotated:
            return _generic_reason(node, kind, annotation, missing)
        if config is None and not self.quantizer.module_name_config:
            return _text("no config")
        if kind not in _COMPUTE_KINDS:
            from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils as utils

            if utils._is_share_obs_or_fq_op(node.target) and isinstance(
                node.args[0], torch.fx.Node
            ):
                producer = _unobserved(node.args[0]).name
                return _text("xnnpack shares", op=_op_name(node), producer=producer)
        if node.target not in self.targets:
            return _text("in no pattern", op=node.target._overloadpacket.__name__)
        activation = getattr(config, "input_activation", None)
        if activation is not None and activation.is_dynamic:
            if node.target not in self.dynamic_targets:
                return _text("dynamic: linear and conv only")
            if kind == "conv":
                return _xnnpack_dynamic_conv(node)
        if kind in ("add", "mul") and any(
            a.meta["val"].dtype != torch.float32 for a in node.args[:2]
        ):
            return _text("not float32", kind=kind)
        return _text("no rule")

    def refused(self, node) -> str | None:
        """Why ``XnnpackPartitioner`` would not take ``node`` (a node of the exported graph, as
        its op's name is in the edge dialect: ``mean.dim``, ``max_pool2d``, ``cat``), in its
        own words, from the config of that name's ``check_constraints``; None when it takes
        it or no such config exists (the gemm configs need the lowered program)."""
        from executorch.backends.xnnpack.partition.config import generic_node_configs
        from executorch.exir.backend.canonical_partitioners.config_partitioner import (
            format_target_name,
        )

        config = self.configs.get(format_target_name(node.target.__name__))
        if config is None:
            return None
        why = generic_node_configs.why
        why.reason = ""
        try:
            taken = config().check_constraints(node, None)
        except Exception:  # a check that needs the lowered program: not known here
            return None
        return None if taken else why.reason or "check_constraints"


def _xnnpack_dynamic_conv(node) -> _Text:
    users = list(node.users)
    if len(users) == 1 and users[0].target in (aten.relu.default, aten.relu_.default):
        return _text("dynamic: conv + ReLU")
    weight = _unobserved(node.args[1]).meta.get("val")
    if weight is not None and weight.dim() != 4:
        return _text("dynamic: 2-D only")
    if weight is not None and weight.shape[1] == 1:
        return _text("dynamic: depthwise")
    return _text("no rule")
