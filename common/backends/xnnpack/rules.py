"""Why ExecuTorch's ``XNNPACKQuantizer`` (1.5.1) leaves an op float, and which ops
``XnnpackPartitioner`` refuses (``refused``), with the words they say it with (en, zh_TW), for
``common.coverage``."""

import torch

from common.coverage import words
from common.coverage.classify import Rules, _generic_reason, _op_name, _unobserved
from common.coverage.ops import _COMPUTE_KINDS, _float_cache, aten
from common.coverage.words import _Text

__all__ = ["XnnpackRules"]

#: What XNNPACK's rules say, by key, in each language (fields as in ``common.coverage.words``).
_TEXTS = {
    "xnnpack shares": {
        "en": (
            "XNNPACK passes int8 through aten.{op} only when the op before it has a quantized "
            "output (propagate_annotation); {producer} has none"
        ),
        "zh_TW": (
            "XNNPACK 只在前一個運算的輸出有量化時才讓 int8 直接通過 aten.{op}"
            "（propagate_annotation）；{producer} 的輸出沒有"
        ),
    },
    "in no pattern": {
        "en": "aten.{op} is in none of the quantizer's patterns (SUPPORTED_PATTERNS)",
        "zh_TW": "aten.{op} 不在 quantizer 的任何一個模式裡（SUPPORTED_PATTERNS）",
    },
    "cache update": {
        "en": (
            "aten.{op} is in none of the quantizer's patterns (SUPPORTED_PATTERNS): the cache "
            "it writes keeps float values, and XnnpackPartitioner has no config for the write "
            "(ExecuTorch's portable kernels run it)"
        ),
        "zh_TW": (
            "aten.{op} 不在 quantizer 的任何一個模式裡（SUPPORTED_PATTERNS）：它寫入的快取"
            "保持浮點數值，而 XnnpackPartitioner 沒有這個寫入的設定（由 ExecuTorch 的 "
            "portable kernel 執行）"
        ),
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
    "xnnpack refuses": {
        "en": (
            "XNNPACK's partitioner refuses it ({why}): ExecuTorch's portable kernels run it "
            "in float"
        ),
        "zh_TW": (
            "XNNPACK 的 partitioner 拒絕它（{why}）：由 ExecuTorch 的 portable kernel 以浮點數執行"
        ),
    },
    "xnnpack refuses annotated": {
        "en": (
            "annotated {status}, but XNNPACK's partitioner refuses it ({why}): ExecuTorch's "
            "portable kernels run it in float, between dequantize and quantize"
        ),
        "zh_TW": (
            "標註為 {status}，但 XNNPACK 的 partitioner 拒絕它（{why}）：由 ExecuTorch 的 "
            "portable kernel 在 dequantize 與 quantize 之間以浮點數執行"
        ),
    },
}


def _text(key: str, **values) -> _Text:
    """A line in XNNPACK's words (a key of ``_TEXTS``)."""
    return _Text(key, tuple(values.items()), _TEXTS)


class XnnpackRules(Rules):
    """Why ExecuTorch's ``XNNPACKQuantizer`` (1.5.1) left a node float, from its source; and
    which nodes ``XnnpackPartitioner`` refuses (``refused``)."""

    def __init__(self, quantizer, prepared):
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
        # the configs' names are edge ops: a cache's index_copy_ is an index_put there
        self.writes_delegated = any(
            getattr(config, "target_name", "").startswith(("index_put", "index_copy"))
            for config in ALL_PARTITIONER_CONFIGS
        )
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
            return words._text("no config")
        if kind not in _COMPUTE_KINDS:
            from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils as utils

            if utils._is_share_obs_or_fq_op(node.target) and isinstance(
                node.args[0], torch.fx.Node
            ):
                producer = _unobserved(node.args[0]).name
                return _text("xnnpack shares", op=_op_name(node), producer=producer)
        if kind == "cache update" and _float_cache(node) and node.target not in self.targets:
            if not self.writes_delegated:
                return _text("cache update", op=_op_name(node))
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
        return words._text("no rule")

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

    def refusal(self, node, status: str) -> _Text | None:
        """``refused``, said as a reason: the status the quantizer's annotation gave it, and
        the partitioner's words."""
        why = self.refused(node)
        if why is None:
            return None
        if status:
            return _text("xnnpack refuses annotated", status=status, why=why)
        return _text("xnnpack refuses", why=why)


#: The rules ``common.coverage`` asks for an ``XNNPACKQuantizer``.
RULES = XnnpackRules


def _xnnpack_dynamic_conv(node) -> _Text:
    users = list(node.users)
    if len(users) == 1 and users[0].target in (aten.relu.default, aten.relu_.default):
        return _text("dynamic: conv + ReLU")
    weight = _unobserved(node.args[1]).meta.get("val")
    if weight is not None and weight.dim() != 4:
        return _text("dynamic: 2-D only")
    if weight is not None and weight.shape[1] == 1:
        return _text("dynamic: depthwise")
    return words._text("no rule")
