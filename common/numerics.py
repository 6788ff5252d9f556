"""Measuring quantization error: every node's output, SQNR, and BatchNorm folded for comparison."""

import copy

import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval

__all__ = ["DIGITS_CONV_BN", "fold_batch_norm_modules", "int8_conv_steps", "record", "sqnr"]

#: ``common.data.DigitsCNN``'s (conv, BatchNorm) module pairs, for ``fold_batch_norm_modules``.
DIGITS_CONV_BN = (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3"))


def record(gm: torch.fx.GraphModule, x: torch.Tensor) -> dict:
    """Run ``gm`` on ``x`` under ``torch.no_grad()`` and keep every node's output.

    ``convert_pt2e`` keeps the names of the nodes it quantizes, so the records of a float
    graph and of its int8 version pair up by name.

    Args:
        gm: a graph module (an exported ``.module()``, a prepared or converted model).
        x: its one positional input.

    Returns:
        dict: node name to that node's output, for every node that ran.

    Raises:
        TypeError: if ``gm`` is not a ``torch.fx.GraphModule``.

    >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    >>> record(gm, torch.tensor([-1.0, 2.0]))["relu"]
    tensor([0., 2.])
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(
            f"record needs a torch.fx.GraphModule (e.g. torch.export.export(...).module()), "
            f"got {type(gm).__name__}"
        )
    outputs = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            outputs[node.name] = result = super().run_node(node)
            return result

    with torch.no_grad():
        Recorder(gm).run(x)
    return outputs


def sqnr(signal: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """Signal-to-quantization-noise ratio, ``20·log10(‖signal‖ / ‖signal − noisy‖)``, in dB.

    This is ``torchao.quantization.utils.compute_error``, called here (bit for bit the
    formula, and the number torchao's numeric debugger reports). Each 6 dB halves the error.

    Args:
        signal: the reference tensor (the numeric debugger passes the quantized one).
        noisy: the same values with noise, of the same shape.

    Returns:
        torch.Tensor: a 0-d float tensor; ``inf`` when the two are equal.

    Raises:
        ValueError: if the shapes differ (a silent broadcast would give a wrong number).

    >>> sqnr(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.5])).item()  # 20·log10(5/0.5)
    20.0
    """
    if signal.shape != noisy.shape:
        raise ValueError(
            f"sqnr compares tensors of one shape, got {tuple(signal.shape)} and "
            f"{tuple(noisy.shape)}; pair the nodes by name (record) before comparing"
        )
    from torchao.quantization.utils import compute_error  # lazy: torchao's import is noisy

    return compute_error(signal, noisy)


def fold_batch_norm_modules(model: torch.nn.Module, *, pairs) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with each BatchNorm module folded into its conv.

    ``prepare_pt2e`` folds BatchNorm into the conv before it, so a float graph compares node
    by node with an int8 one only after the same folding (M04-1). The BatchNorm modules
    become ``nn.Identity``; ``model`` is left alone. (``common.handmade.fold_batch_norm`` is
    the other kind: a pass that folds BatchNorm nodes in a graph, in place.)

    Args:
        model: the eager model.
        pairs: ``(conv, batch_norm)`` submodule names, conv first, e.g. :data:`DIGITS_CONV_BN`.

    Returns:
        torch.nn.Module: the folded copy, computing what ``model.eval()`` computes (up to
        float rounding).

    Raises:
        ValueError: if a name in ``pairs`` is not a ``Conv2d`` / ``BatchNorm2d`` of ``model``.

    >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    >>> fold_batch_norm_modules(model, pairs=[("0", "1")])
    Sequential(
      (0): Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1))
      (1): Identity()
    )
    """
    folded = copy.deepcopy(model).eval()
    modules = dict(folded.named_modules())
    for conv, bn in pairs:
        if not isinstance(modules.get(conv), torch.nn.Conv2d) or not isinstance(
            modules.get(bn), torch.nn.BatchNorm2d
        ):
            raise ValueError(
                f"cannot fold {bn!r} into {conv!r}: pairs must name a Conv2d and a BatchNorm2d "
                f"of the model (its Conv2d: "
                f"{', '.join(n for n, m in modules.items() if isinstance(m, torch.nn.Conv2d))})"
            )
        folded.set_submodule(conv, fuse_conv_bn_eval(modules[conv], modules[bn]))
        folded.set_submodule(bn, torch.nn.Identity())
    return folded


def int8_conv_steps(simulated: torch.fx.GraphModule, x: torch.Tensor) -> list:
    """Lower ``simulated`` to oneDNN int8 ops and compare each conv with its q/dq version.

    Each int8 conv of the lowered graph gets the very uint8 input its q/dq twin got, so the
    two differ only by how the conv is computed: the q/dq graph in float, oneDNN in integers
    on this process's kernel path (run it under ``common.cpu.run_under_isa`` to see another).
    Exact int32 sums leave at most one step, a rounding at a half-step; more is saturation.
    The lowered conv's output is a full uint8, so values above a reduced ``quant_max`` are
    clipped to it before comparing, as the q/dq graph does.

    Args:
        simulated: a q/dq model from ``convert_pt2e`` with the x86 quantizer, every conv
            followed by its output quantize (with or without a ReLU between).
        x: its input.

    Returns:
        list: one dict per conv in graph order: ``{"conv": node name, "max_steps": int,
        "share": fraction of outputs more than one step apart, "values": output count}``.

    Raises:
        ValueError: if ``simulated`` is not such a q/dq graph, or its lowering does not make
            one int8 conv per conv.
    """
    from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86

    from common.lowering import reshape_views

    def after(node):  # conv -> (relu) -> quantize
        while "quantize_per_tensor" not in node.name:
            node = next(iter(node.users))
        return node

    convs = [n for n in simulated.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    if not convs or any("dequantize" not in conv.args[0].name for conv in convs):
        raise ValueError(
            "expected a q/dq graph whose every aten conv2d reads a dequantize: pass a "
            "convert_pt2e model quantized with X86InductorQuantizer"
        )
    lowered = lower_pt2e_quantized_to_x86(simulated, (x,))
    reshape_views(lowered)
    qconvs = [n for n in lowered.graph.nodes if "qconv" in str(n.target)]
    if len(qconvs) != len(convs):
        raise ValueError(
            f"expected one int8 conv per conv ({len(convs)}), the lowering made {len(qconvs)}: "
            f"pass a convert_pt2e model quantized with X86InductorQuantizer"
        )
    reference = record(simulated, x)
    inputs = {q: reference[c.args[0].args[0].name] for q, c in zip(qconvs, convs, strict=True)}
    outputs = {}

    class SameInputs(torch.fx.Interpreter):
        def run_node(self, node):
            if node not in inputs:
                return super().run_node(node)
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            outputs[node] = result = node.target(inputs[node], *args[1:], **kwargs)
            return result

    with torch.no_grad():
        SameInputs(lowered).run(x)
    steps = []
    for qconv, conv in zip(qconvs, convs, strict=True):
        quantize = after(conv)
        low, high = quantize.args[3], quantize.args[4]
        expected = reference[quantize.name].int()
        gap = (outputs[qconv].int().clamp(low, high) - expected).abs()
        steps.append(
            {
                "conv": conv.name,
                "max_steps": gap.max().item(),
                "share": (gap > 1).float().mean().item(),
                "values": gap.numel(),
            }
        )
    return steps
