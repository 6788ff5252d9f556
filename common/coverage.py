"""What a PT2E quantizer leaves in float: each compute op of an exported graph, int8 or not, why."""

import copy
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from common.charts import display_width, pad
from common.lesson import lesson_language

__all__ = ["COMPUTE_OPS", "Coverage", "OpCoverage", "coverage", "side_by_side", "spec_table"]

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
    "label": {"en": "{name}", "zh_TW": "{name}"},
    "label dynamic": {"en": "{name} dynamic", "zh_TW": "{name}（動態）"},
}

#: The words of a ``_spec_text`` (``u8 per-tensor affine dynamic``) that zh_TW says in Chinese;
#: dtypes, ``per-tensor`` and ``per-channel`` stay English, as the glossary has them.
_SPEC_WORDS = {"affine": "仿射", "symmetric": "對稱", "shared": "共用"}
_STATUS_ZH_TW = {"static": "int8 靜態", "dynamic": "int8 動態", "fused": "int8 融合"}
_HEADERS = {
    "en": {"node": "node", "op": "op", "module": "module", "why": "why", "model": "(model)"},
    "zh_TW": {"node": "node", "op": "運算", "module": "模組", "why": "原因", "model": "（模型）"},
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
        kind: ``conv``, ``linear``, ``matmul``, ``attention``, ``add`` or ``mul``.
        module: the innermost module the node was recorded in (``blocks.0.se``; ``""``: the model).
        module_type: that module's class name.
        int8: whether every input the op computes on is quantized (or fused into the int8
            op before it).
        mode: ``static``, ``dynamic`` or ``fused`` for an int8 op; ``""`` for a float one.
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
        """``int8 static``, ``int8 dynamic``, ``int8 fused`` or ``float``."""
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
        ops: the compute ops.
        said: ``label`` as its template and values, when ``coverage`` made it (a zh_TW
            table says ``X86InductorQuantizer（動態）``); None for a label given by hand.
    """

    label: str
    ops: tuple
    said: _Text | None = field(default=None, compare=False, repr=False)

    def _label_in(self, lang: str) -> str:
        return self.said.render(lang) if self.said is not None else self.label

    def __getitem__(self, node: str) -> OpCoverage:
        for op in self.ops:
            if op.node == node:
                return op
        raise KeyError(f"no compute op named {node!r} (one of: {', '.join(self.names())})")

    def names(self, *, kind: str | None = None, int8: bool | None = None) -> list[str]:
        """The nodes' names, optionally only one ``kind`` and only int8 (True) or float (False)."""
        return [
            op.node
            for op in self.ops
            if (kind is None or op.kind == kind) and (int8 is None or op.int8 == int8)
        ]

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
        """Int8 ops out of all, per kind; then each float reason with its count, a line each.

        Args:
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.
        """
        lang = _checked(lang)
        int8 = sum(op.int8 for op in self.ops)
        kinds = _kinds(self, lang)
        said = {op.reason: op.reason_in(lang) for op in self.ops if not op.int8}
        label, count = self._label_in(lang), len(self.ops)
        if lang == "zh_TW":
            lines = [f"{label}：{count} 個計算運算中有 {int8} 個是 int8（{kinds}）"]
            lines += [f"  浮點數 ×{n}：{said[r]}" for r, n in self.reasons().most_common()]
        else:
            lines = [f"{label}: {int8} of {count} compute ops int8 ({kinds})"]
            lines += [f"  float ×{n}: {said[r]}" for r, n in self.reasons().most_common()]
        return "\n".join(lines)

    def table(self, *, only: str | None = None, lang: str | None = None) -> str:
        """A plain-text table: node, op, module, status, reason.

        Args:
            only: ``"float"`` or ``"int8"`` to list those ops only; all of them when omitted.
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.

        Raises:
            ValueError: if ``only`` is another value.
        """
        if only not in (None, "float", "int8"):
            raise ValueError(f"only={only!r}: use 'float', 'int8' or leave it out")
        lang = _checked(lang)
        words = _HEADERS[lang]
        rows = [
            (op.node, op.op, op.module or words["model"], op.status_in(lang), op.reason_in(lang))
            for op in self.ops
            if only is None or op.int8 == (only == "int8")
        ]
        header = (words["node"], words["op"], words["module"], self._label_in(lang), words["why"])
        return _format([header], rows)


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


def coverage(model: torch.fx.GraphModule, quantizer, *, label: str | None = None) -> Coverage:
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

    Args:
        model: an exported graph, ``torch.export.export(model, args).module()``; not changed.
        quantizer: a PT2E quantizer, configured (``set_global``).
        label: the quantizer's name in tables; by default its class name, plus ``dynamic``
            when its global config quantizes activations dynamically.

    Returns:
        Coverage: one ``OpCoverage`` per compute op, in graph order.

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
    wanted = _compute_nodes(model)
    try:
        prepared = prepare_pt2e(copy.deepcopy(model), quantizer)
    except ValueError as error:
        if "more than one output node" not in str(error):
            raise
        raise ValueError(_reused_message(model, quantizer, error)) from error
    rules = _rules_for(quantizer, prepared)
    nodes = {node.name: node for node in prepared.graph.nodes}
    ops = []
    for name, kind in wanted:
        node = nodes.get(name)
        if node is None:  # removed by prepare (none of COMPUTE_OPS is, on the course's models)
            continue
        module, module_type = _module(node)
        int8, mode, said, specs = _classify(prepared, node, kind, rules)
        op = node.target._overloadpacket.__name__
        reason = said.render("en")
        ops.append(OpCoverage(name, op, kind, module, module_type, int8, mode, reason, specs, said))
    if label:
        return Coverage(label, tuple(ops))
    said = _label(quantizer)
    return Coverage(said.render("en"), tuple(ops), said)


def _compute_nodes(model: torch.fx.GraphModule) -> list[tuple[str, str]]:
    found = []
    for node in model.graph.nodes:
        kind = COMPUTE_OPS.get(node.target) if node.op == "call_function" else None
        if kind in ("add", "mul") and not all(_is_tensor(a) for a in node.args[:2]):
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
    if not missing and texts:
        mode = "fused" if fused else "dynamic" if dynamic else "static"
        if fused:
            detail = _text("int8 fused", specs=tuple(texts), nodes=tuple(a.name for a in fused))
        else:
            detail = _text("int8", specs=tuple(texts))
        return True, mode, detail, tuple(roles)
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
            if not annotation.input_qspec_map and annotation.output_qspec is None:
                return _text("None config")
            return _generic_reason(node, kind, annotation, missing)
        configs = [self.quantizer.global_config, *self.quantizer.module_name_qconfig.values()]
        if not any(configs) and not any(self.quantizer.operator_type_qconfig.values()):
            return _text("no config")
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
                return _text("add fed by no conv")
            busy = tuple(a.name for a in feeding if len(a.users) > 1)
            if busy:
                return _text("add fed by a busy conv", nodes=busy)
            return _text("add not fused")
        return _text("no rule")


class _XnnpackRules:
    """Why ExecuTorch's ``XNNPACKQuantizer`` (1.5.1) left a node float, from its source."""

    def __init__(self, quantizer):
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
