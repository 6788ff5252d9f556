"""What ran an atlas entry with XNNPACK: its ``XNNPACKQuantizer`` graph lowered with
ExecuTorch's ``XnnpackPartitioner``, each of the op's nodes inside a delegate or left to the
portable kernels, with the constraint the partitioner logged for it (``WhyNoPartition``).

Imports nothing of ``common.atlas``: an entry is asked for its input
(``item.example_args()``) and its op's nodes (``item.holds(node)``, ``item.ops``).
"""

import contextlib
import io
import logging

import torch

from common.graph import base_name


class _Why(logging.Handler):
    """Collects XNNPACK's ``WhyNoPartition`` records: the constraint that refused each node."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, str] = {}

    def emit(self, record):
        why = record.msg
        node, reason = getattr(why, "node", None), getattr(why, "reason", None)
        if node is not None and reason:
            self.reasons.setdefault(node.name, reason)


_NOT_THE_OP = {
    "getitem",
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "dequantize_per_channel",
    "view_copy",
    "permute_copy",
    "_clone_dim_order",
    "_to_dim_order_copy",
}

#: How the edge graph names the compute ops inside a delegate (``aten_convolution_default``).
_EDGE_NAMES = {
    "conv1d": "convolution",
    "conv2d": "convolution",
    "conv_transpose2d": "convolution",
    "matmul": "bmm",
}


def xnnpack_runs(item, converted, *, partitioner=None) -> dict:
    """Lower the XNNPACK graph with ``XnnpackPartitioner`` (or ``partitioner``).

    Args:
        item: a ``common.atlas.Entry``.
        converted: its model converted for ``XNNPACKQuantizer``.
        partitioner: the partitioner to lower with (e.g. ``common.edge.CoursePartitioner()``).

    Returns:
        dict: ``delegated`` whether every node of the op runs inside an XNNPACK delegate;
        ``inside`` the op's nodes in delegates, ``portable`` those left to the portable
        kernels (edge names; for an op the edge graph decomposed, the compute left outside);
        ``why`` XNNPACK's logged constraint for the first of them (``""``: XNNPACK has no
        config for that op, so it logged none); ``delegates`` each delegate's node names.
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from common.edge import delegated

    # Each config module logs through its own logger, below this one.
    logger = logging.getLogger("executorch.backends.xnnpack.partition.config")
    handler, level, propagate = _Why(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the records go to the handler only, not to the page
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            program = torch.export.export(converted, item.example_args())
            partitioners = [partitioner or XnnpackPartitioner()]
            edge = to_edge_transform_and_lower(program, partitioner=partitioners)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    lowered = edge.exported_program()
    delegates = delegated(lowered)
    names = [_EDGE_NAMES.get(op, op) for op in item.ops]
    inside = [n for found in delegates.values() for n in found if any(op in n for op in names)]
    outside = [
        n
        for n in lowered.graph.nodes
        if n.op == "call_function"
        and not n.name.startswith("executorch_call_delegate")
        and base_name(n.target) not in _NOT_THE_OP
    ]
    mine = [n for n in outside if item.holds(n)] or ([] if inside else outside)
    why = next((handler.reasons[n.name] for n in mine if n.name in handler.reasons), "")
    return {
        "delegated": not mine,
        "inside": sorted(set(inside)),
        "portable": sorted({base_name(n.target) for n in mine}),
        "why": why,
        "delegates": delegates,
    }
