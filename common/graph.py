"""One vocabulary for reading PT2E graphs, shared by the reports and the backends.

Two ways to name an op, for two kinds of question:

- ``op_name(target)``: the op with its overload, ``relu.default``, the same for an ATen op
  and its Edge dialect twin (``<EdgeOpOverload: aten.relu.default>``): what ExecuTorch's
  partitioner tables list (``common.backends.xnnpack.table``). ``calls_overload(node, name)``
  asks it of a node.
- ``base_name(target)``: the op alone, ``max_pool2d_with_indices``: what the op atlas and the
  run readers ask about, whatever the overload. ``calls(node, names)`` asks it of a node.

And the walks a reader of a converted graph needs: ``tensor_inputs`` (what an op computes on,
not its constants) and ``users_through_getitem`` (past the ``getitem`` of an op with several
outputs).

The hand-written passes (``common.handmade``, ``common.lowering``) compare targets with
the ``OpOverload`` objects themselves, as torchao's passes do, and keep their own names.
"""

from torch.fx import Node

__all__ = [
    "DEQUANTIZE",
    "GEMM_BASES",
    "QUANTIZE",
    "base_name",
    "calls",
    "calls_overload",
    "op_name",
    "tensor_inputs",
    "users_through_getitem",
]

#: ``base_name`` of the per-tensor quantize (``quantized_decomposed``).
QUANTIZE = "quantize_per_tensor"
#: ``base_name`` of the dequantizes a static int8 graph holds.
DEQUANTIZE = ("dequantize_per_tensor", "dequantize_per_channel")
#: Ops whose weight is ``args[1]``: ``tensor_inputs`` reads only their ``args[0]``.
GEMM_BASES = ("conv1d", "conv2d", "conv_transpose2d", "linear", "convolution")


def op_name(target) -> str:
    """``aten.relu.default`` or ``<EdgeOpOverload: aten.relu.default>`` -> ``relu.default``.

    >>> import torch
    >>> op_name(torch.ops.aten.relu.default)
    'relu.default'
    """
    return ".".join(getattr(target, "__name__", str(target)).split(".")[-2:])


def base_name(target) -> str:
    """The op without namespace or overload: ``aten.max_pool2d_with_indices.default`` ->
    ``max_pool2d_with_indices``; a Python function by its name (``getitem``).

    >>> import operator, torch
    >>> base_name(torch.ops.aten.max_pool2d_with_indices.default), base_name(operator.getitem)
    ('max_pool2d_with_indices', 'getitem')
    """
    if hasattr(target, "_overloadpacket"):
        return target._overloadpacket.__name__
    return getattr(target, "__name__", str(target)).split(".")[-1]


def calls(node, names) -> bool:
    """``node`` is a ``call_function`` of an op whose ``base_name`` is ``names`` (one or a
    tuple of them)."""
    names = (names,) if isinstance(names, str) else names
    return isinstance(node, Node) and node.op == "call_function" and base_name(node.target) in names


def calls_overload(node, name: str) -> bool:
    """``node`` is a ``call_function`` of the op ``name`` with its overload (``op_name``)."""
    return isinstance(node, Node) and node.op == "call_function" and op_name(node.target) == name


def tensor_inputs(node: Node) -> list:
    """The values an op computes on: its node arguments but constants (``get_attr``: weights,
    biases, qparams); of a conv or linear only its input (its weight is ``args[1]``)."""
    found = []
    for arg in node.args:
        for a in arg if isinstance(arg, list | tuple) else [arg]:
            if isinstance(a, Node) and a.op != "get_attr":
                found.append(a)
    if base_name(node.target) in GEMM_BASES:
        found = found[:1]
    return found


def users_through_getitem(node: Node) -> list:
    """``node``'s users, each ``getitem`` (an op with several outputs) replaced by its users."""
    users = []
    for user in node.users:
        users += list(user.users) if calls(user, "getitem") else [user]
    return users
