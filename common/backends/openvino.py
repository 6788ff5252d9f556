"""OpenVINO: ``OpenVINOQuantizer`` (ExecuTorch's, on NNCF) and what OpenVINO's CPU plugin ran:
the ``runtimePrecision`` of the runtime layers that hold an atlas entry's op.

Imports nothing of ``common.atlas``: an entry is asked for its input
(``item.example_args()``) and its ops (``item.ops``, ``item.op``).
"""

import contextlib
import io

import torch


def quantizer():
    """A new ``OpenVINOQuantizer`` with its defaults."""
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer

    return OpenVINOQuantizer()


#: OpenVINO's runtime layer type for the compute ops, whose aten name the runtime model
#: does not keep (a conv is ``aten.convolution``, as the context's convs are).
_OPENVINO_LAYER = {
    "conv1d": "Convolution",
    "conv2d": "Convolution",
    "conv_transpose2d": "Deconvolution",
    "linear": "FullyConnected",
}


def openvino_runs(item, unfolded) -> dict:
    """Compile the OpenVINO q/dq program (weights not folded) for the CPU plugin.

    Args:
        item: a ``common.atlas.Entry``.
        unfolded: its model converted for ``OpenVINOQuantizer`` with ``fold_quantize=False``.

    Returns:
        dict: ``precisions``: the ``runtimePrecision`` of each runtime layer that holds the
        op, ``{layerType: precision}``.
    """
    import openvino as ov

    with contextlib.redirect_stderr(io.StringIO()):
        model = ov.convert_model(torch.export.export(unfolded, item.example_args()))
        compiled = ov.Core().compile_model(model, "CPU")
    precisions = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str)
        original = info["originalLayersNames"].astype(str).split(",")
        layers = [name.split("/")[1] for name in original if name.count("/") >= 2]
        wanted = _OPENVINO_LAYER.get(item.op)
        if kind in ("Const", "Convert", "Reorder", "Input", "Output"):
            continue
        if (kind == wanted) if wanted else any(_aten_matches(item, layer) for layer in layers):
            precisions[kind] = info["runtimePrecision"].astype(str)
    return {"precisions": precisions}


def _aten_matches(item, layer: str) -> bool:
    if not layer.startswith("aten."):
        return False
    name = layer.split(".")[1].lstrip("_")
    return any(name.startswith(op) for op in item.ops)
