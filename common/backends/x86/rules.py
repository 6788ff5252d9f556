"""Why ``X86InductorQuantizer`` (torchao 0.18) leaves an op float: its fusion tables, its rules
read from its source, and the words they say it with (en, zh_TW), for ``common.coverage``.
"""

import torch
from torch import nn

from common.coverage import words
from common.coverage.classify import (
    Rules,
    _annotated_empty,
    _annotation,
    _generic_reason,
    _is_observer,
    _module,
    _op_name,
    _unobserved,
    _value_inputs,
)
from common.coverage.ops import _COMPUTE_KINDS, COMPUTE_OPS, OPS, _float_cache, aten
from common.coverage.words import _Text

__all__ = ["X86_UNARY_FUSIONS", "X86Rules"]

#: The activations x86 fuses into the conv or linear right before them, read from torchao
#: 0.18's ``_annotate_conv2d_unary`` and ``_annotate_linear_unary`` (nn.ReLU6 exports as
#: hardtanh); tests/backends/test_x86_rules.py checks them against the installed source.
X86_UNARY_FUSIONS = {
    "conv2d": ("relu", "hardtanh", "hardswish", "silu"),
    "conv1d": ("relu",),
    "linear": ("relu", "leaky_relu", "tanh", "gelu"),
}

#: The modules x86's conv/linear + activation patterns match (find_sequential_partitions
#: reads each node's module: source_fn_stack, else the innermost of nn_module_stack).
_PATTERN_MODULES = {
    "Linear", "Conv1d", "Conv2d", "ReLU", "ReLU6", "LeakyReLU", "Tanh", "GELU", "Hardtanh",
    "Hardswish", "SiLU",
}  # fmt: skip


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

#: What x86's rules say, by key, in each language (fields as in ``common.coverage.words``).
_TEXTS = {
    "None config": {
        "en": "a None config keeps it float (set_module_name_qconfig / ..._type_qconfig)",
        "zh_TW": "它的設定是 None，所以留在浮點數（set_module_name_qconfig／..._type_qconfig）",
    },
    "not in op set": {
        "en": "aten.{op} is not in the quantizer's op set (quantizable_ops)",
        "zh_TW": "aten.{op} 不在 quantizer 的運算集合裡（quantizable_ops）",
    },
    "cache update": {
        "en": (
            "aten.{op} is not in the quantizer's op set (quantizable_ops): the cache it "
            "writes keeps float values"
        ),
        "zh_TW": (
            "aten.{op} 不在 quantizer 的運算集合裡（quantizable_ops）：它寫入的快取保持浮點數值"
        ),
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
    "dropout between": {
        "en": (
            "the add's input comes through an eval-mode dropout ({dropout}) from {producer}: "
            "x86's {producer_kind} + add pattern needs the add right after the "
            "{producer_kind}; remove eval-mode dropout nodes before prepare_pt2e"
        ),
        "zh_TW": (
            "add 的輸入來自 {producer}，中間卻經過一個 eval 模式的 dropout（{dropout}）：x86 的 "
            "{producer_kind} + add 模式要求 add 緊接在 {producer_kind} 之後；在 prepare_pt2e "
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
}


def _text(key: str, **values) -> _Text:
    """A line in x86's words (a key of ``_TEXTS``)."""
    return _Text(key, tuple(values.items()), _TEXTS)


class X86Rules(Rules):
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
            return words._text("no config")
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
        return words._text("no rule")

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
        cache_update = OPS.get(target) == "cache update" and target not in x86.quantizable_ops
        if cache_update and _float_cache(node):
            return _text("cache update", op=op)
        unary = _UNARY_NAMES.get(target)
        patterns = [
            f"{first} + {unary}" for first, ops in X86_UNARY_FUSIONS.items() if unary in ops
        ]
        if patterns and isinstance(node.args[0], torch.fx.Node):
            producer = _unobserved(node.args[0])
            said = words._LIST["en"].join(patterns)
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


#: The rules ``common.coverage`` asks for an ``X86InductorQuantizer``.
RULES = X86Rules


def _shapes(node) -> tuple:
    return tuple(tuple(a.meta["val"].shape) for a in node.args[:2])


_UNARY_NAMES = {
    target: target._overloadpacket.__name__.rstrip("_")
    for target, kind in OPS.items()
    if kind == "activation"
}


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
