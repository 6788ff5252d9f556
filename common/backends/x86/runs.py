"""What ran an atlas entry on x86: its ``X86InductorQuantizer`` graph lowered
(``lower_pt2e_quantized_to_x86``) or compiled (``torch.compile`` with freezing), read with
``common.kernels.kernels_run``.

Both run inductor's freezing passes, on different graphs. The lowering exports the q/dq
graph and runs only the CompositeImplicit decompositions, so ``aten.gelu``, ``aten.silu``,
``aten.hardswish`` and ``aten.hardtanh`` stay whole, while the passes' unary patterns for the
int8 conv and linear match inductor's decomposed forms (SiLU as ``x / (exp(-x) + 1)``, ReLU6
as ``clamp_min`` / ``clamp_max``, GELU with ``erf``): the lowering fuses a ReLU and an add, and
only a compile, which decomposes first, fuses the others. Tanh and LeakyReLU after a linear
have no int8 post-op in either. A compile also first merges equal nodes
(``fx_graph_cse`` in inductor's ``freezing.py``): the dequantize nodes of one int8 weight read
by several linears become one node with several users, which the passes' weight pattern
(one user) no longer matches, and those linears run float.

Freezing is set for the process (``torch._inductor.config.freezing = True``) before a compile
and left set, as ``common.timing.race`` does: a ``config.patch`` around the first call would
lose it at a later recompile (a new input shape, ``torch._dynamo.reset()``), which then runs
float convs. Imports nothing of ``common.atlas``: an entry is asked for its input
(``item.example_args()``), its op's nodes (``item.holds(node)``) and its int8 model
(``item.quantized(quantizer)``).
"""

import copy
import warnings
from pathlib import Path

import torch

from common.graph import base_name, calls, tensor_inputs, users_through_getitem

#: The names oneDNN gives each op as a post-op attribute.
_POST_OP_NAMES = {
    "relu": ("relu",),
    "hardtanh": ("hardtanh",),
    "leaky_relu": ("leaky_relu",),
    "gelu": ("gelu",),
    "silu": ("swish", "silu"),
    "hardswish": ("hardswish",),
    "tanh": ("tanh",),
    "add": ("sum", "add"),
    "sub": ("sum", "add"),
}


def _freezing() -> None:
    """Inductor's freezing, for the process: every later (re)compile freezes too."""
    torch._inductor.config.freezing = True


def _compiled_run(converted, args):
    """``kernels_run`` of the call after the compile (``torch.compile``, freezing set)."""
    from common.kernels import kernels_run

    _freezing()
    with torch.no_grad(), warnings.catch_warnings():
        # inductor's int8 lowering copies a zero point with torch.tensor(tensor): a warning
        warnings.filterwarnings("ignore", "To copy construct from a tensor", UserWarning)
        compiled = torch.compile(converted)
        compiled(*args)  # the compile
        return kernels_run(compiled, args)


# The few graph readings the x86 reader needs (common.atlas.run reads converted graphs the
# same way; a backend imports nothing of the atlas).


# --- Lowered (or, where that cannot run or a compile runs it otherwise, compiled) --------------


def x86_runs(item, converted) -> dict:
    """Lower the x86 graph (``lower_pt2e_quantized_to_x86``), run it once under ``kernels_run``.

    Where the lowered graph cannot run eagerly (a conv with a fused add whose extra input is
    not channels-last: oneDNN's "accum tensor must be contiguous"), or where a compile runs it
    otherwise (an int8 weight read by several convs or linears, :func:`shared_weights`: the
    lowering keeps a dequantize per reader and runs them int8, a compile merges those and runs
    them float), the converted model is compiled instead (``torch.compile``, freezing set for
    the process and left set) and that run is read.

    Args:
        item: a ``common.atlas.Entry``.
        converted: its model converted for ``X86InductorQuantizer``.

    Returns:
        dict: ``int8`` and ``float`` the kernels the profiler saw; ``post_ops`` the post-ops
        oneDNN ran fused into each int8 kernel (``{"onednn::qconv_pointwise": ["relu"]}``, from
        its verbose log of the same call); ``path`` ``lowered`` or ``compiled``; ``op`` where
        the op ran: ``fused: qconv_pointwise+relu`` (a post-op), ``oneDNN: qlinear_pointwise``
        (a conv or linear; ``oneDNN: qlinear_pointwise; fp32: aten::addmm`` when some of them
        ran float, ``fp32: aten::addmm`` when all did), ``loop u8→u8`` (between a dequantize
        and a quantize: inductor computes it in one loop from and to uint8), ``fp32:
        aten::bmm`` (a float kernel), ``loop fp32`` or ``absent``.
    """
    from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86

    from common.kernels import kernels_run

    args = item.example_args()
    path = "compiled" if shared_weights(converted) else "lowered"
    with torch.no_grad():
        lowered = lower_pt2e_quantized_to_x86(copy.deepcopy(converted), args)
        if path == "lowered":
            try:
                ran = kernels_run(lowered, args)
            except RuntimeError as error:
                if "must be contiguous" not in str(error):
                    raise
                path = "compiled"
        if path == "compiled":
            ran = _compiled_run(copy.deepcopy(converted), args)
    post_ops = {k: sorted(v) for k, v in (ran.post_ops or {}).items()}
    kernels = sorted(
        f"{k.split('::')[1]}+{'+'.join(ops)}" if ops else k.split("::")[1]
        for k, ops in post_ops.items()
    )
    mine = [n for n in lowered.graph.nodes if item.holds(n)]
    if item.op in ("conv1d", "conv2d", "linear"):
        int8 = ["oneDNN: " + ", ".join(kernels)] if kernels else []
        where = "; ".join(int8 + ([f"fp32: {', '.join(sorted(ran.float))}"] if ran.float else []))
    elif not mine:
        names = _POST_OP_NAMES.get(item.op, ())
        fused = [k for k in kernels if any(p in k.split("+")[1:] for p in names)]
        where = f"fused: {fused[0]}" if fused else "absent"
    elif all(_reads_and_writes_u8(n) for n in mine):
        where = "loop u8→u8"
    else:
        where = _float_kernel(ran, mine)
    return {
        "int8": dict(ran.int8),
        "float": dict(ran.float),
        "post_ops": post_ops,
        "path": path,
        "op": where,
    }


def shared_weights(converted) -> dict:
    """The int8 weights that several convs or linears of a converted graph read, each with the
    names of its readers: ``convert_pt2e`` gives each reader a dequantize of its own, of one
    constant (one ``nn.Linear`` called at several places)."""
    found = {}
    for node in converted.graph.nodes:
        if node.op != "get_attr":
            continue
        readers = [
            reader.name
            for dequantize in node.users
            if calls(dequantize, "dequantize_per_channel") and dequantize.args[0] is node
            for reader in dequantize.users
            if base_name(reader.target) in ("conv1d", "conv2d", "linear")
            and reader.args[1] is dequantize
        ]
        if len(readers) > 1:
            found[node.name] = readers
    return found


def _reads_and_writes_u8(node) -> bool:
    inputs = tensor_inputs(node)
    users = users_through_getitem(node)
    return (
        bool(inputs)
        and all(calls(a, "dequantize_per_tensor") for a in inputs)
        and bool(users)
        and all(calls(u, "quantize_per_tensor") for u in users)
    )


def _float_kernel(ran, mine=()) -> str:
    """``fp32: aten::bmm`` when the op is one of the float kernels the profiler names."""
    for node in mine:
        for kernel in ran.float:
            if (
                kernel.split("::")[1]
                .lstrip("_")
                .startswith(base_name(node.target).lstrip("_")[:12])
            ):
                return f"fp32: {kernel}"
    return "loop fp32"


# --- Compiled -----------------------------------------------------------------------------------


def x86_compiled(item) -> dict:
    """The entry's x86 model compiled (``torch.compile`` with freezing), read with ``kernels_run``.

    ``lower_pt2e_quantized_to_x86`` runs the freezing passes a compile runs, but on a graph
    that keeps ``aten.gelu``, ``aten.silu``, ``aten.hardswish`` and ``aten.hardtanh`` whole,
    while the passes' unary patterns match inductor's decomposed forms of them; the lowering
    fuses a ReLU (and an add) only, a compile decomposes first and fuses GELU, SiLU, Hardswish
    and ReLU6 too (see the module docstring; Tanh and LeakyReLU after a linear have no int8
    post-op at all). For an op the quantizer fused, this is what ran. Freezing is set for the
    process before the compile and left set (see the module docstring). Kept in the cache
    (kind ``op_atlas_compiled``), keyed by the model, this file, the file of the entry's
    recipe (``Entry.quantized``) and the stack.

    Args:
        item: a ``common.atlas.Entry``.

    Returns:
        dict: ``int8`` and ``float`` kernels, ``post_ops`` per oneDNN kernel.
    """
    from importlib.metadata import version

    from common.cache import cached
    from common.cpu import describe
    from common.digest import digest
    from common.pt2e import x86_quantizer

    def run() -> dict:
        ran = _compiled_run(item.quantized(x86_quantizer()), item.example_args())
        post_ops = {k: sorted(v) for k, v in (ran.post_ops or {}).items()}
        return {"int8": dict(ran.int8), "float": dict(ran.float), "post_ops": post_ops}

    stack = [version("nncf"), version("openvino"), describe().kernel_path]
    code = [Path(__file__), Path(type(item).quantized.__code__.co_filename)]
    key = digest(item.name, list(item.ops), list(item.shape), item.build(), code, stack)
    return cached("op_atlas_compiled", key, run)
