"""Where each PT2E API lives now: the import older code uses, what it does here, the new one."""

import warnings
from dataclasses import dataclass

from common.kernels import native_stderr_silenced

__all__ = ["MOVES", "Move", "attempt", "move"]


@dataclass(frozen=True)
class Move:
    """One row of the migration map (troubleshooting page m99_6).

    Attributes:
        api: the names a reader meets, as they appear in code.
        old: the import older code and tutorials write.
        old_result: what ``old`` does on the pinned stack: ``""`` when it still imports, else
            the error as ``Type: first line`` (see :func:`attempt`).
        new: the import that works with torch 2.13, torchao 0.18 and executorch 1.5.1.
        lesson: the page label of the lesson that uses the new import.
        needs: packages beyond torch, torchao and executorch that both imports need
            (without them each fails with ``ModuleNotFoundError`` instead).
    """

    api: str
    old: str
    old_result: str
    new: str
    lesson: str
    needs: tuple[str, ...] = ()


def _lesson(name: str) -> str:
    return f"sphx_glr_lessons_{name}.py"


_GONE_QUANTIZER = "ModuleNotFoundError: No module named 'torch.ao.quantization.quantizer'"
_GONE_PT2E = "ModuleNotFoundError: No module named 'torch.ao.quantization.pt2e'"

#: The rows, in the order the course meets the APIs.
MOVES: tuple[Move, ...] = (
    Move(
        "export_for_training",
        "from torch.export import export_for_training",
        "ImportError: cannot import name 'export_for_training' from 'torch.export'",
        "from torch.export import export",
        _lesson("m00_graphs_m00_1_getting_a_graph"),
    ),
    Move(
        "capture_pre_autograd_graph",
        "from torch._export import capture_pre_autograd_graph",
        "ImportError: cannot import name 'capture_pre_autograd_graph' from 'torch._export'",
        "from torch.export import export",
        _lesson("m00_graphs_m00_1_getting_a_graph"),
    ),
    Move(
        "prepare_pt2e, convert_pt2e, prepare_qat_pt2e",
        "from torch.ao.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e, "
        "prepare_qat_pt2e",
        "ModuleNotFoundError: No module named 'torch.ao.quantization.quantize_pt2e'",
        "from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, "
        "prepare_qat_pt2e",
        _lesson("m01_quantized_graphs_m01_1_pt2e_flow"),
    ),
    Move(
        "MinMaxObserver, HistogramObserver, PerChannelMinMaxObserver",
        "from torch.ao.quantization.observer import HistogramObserver, MinMaxObserver, "
        "PerChannelMinMaxObserver",
        "",  # still imports, without a warning: another class, which convert_pt2e ignores
        "from torchao.quantization.pt2e.observer import HistogramObserver, MinMaxObserver, "
        "PerChannelMinMaxObserver",
        _lesson("m01_quantized_graphs_m01_3_observers"),
    ),
    Move(
        "QuantizationSpec, QuantizationAnnotation, Quantizer",
        "from torch.ao.quantization.quantizer import QuantizationAnnotation, QuantizationSpec, "
        "Quantizer",
        _GONE_QUANTIZER,
        "from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, "
        "QuantizationSpec, Quantizer",
        _lesson("m02_by_hand_m02_1_what_a_quantizer_writes"),
    ),
    Move(
        "X86InductorQuantizer",
        "from torch.ao.quantization.quantizer.x86_inductor_quantizer import "
        "X86InductorQuantizer, get_default_x86_inductor_quantization_config",
        _GONE_QUANTIZER,
        "from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import "
        "X86InductorQuantizer, get_default_x86_inductor_quantization_config",
        _lesson("m03_lowering_m03_1_lowered_graph"),
    ),
    Move(
        "lower_pt2e_quantized_to_x86",
        "from torch.ao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86",
        _GONE_PT2E,
        "from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86",
        _lesson("m03_lowering_m03_1_lowered_graph"),
    ),
    Move(
        "numeric debugger",
        "from torch.ao.quantization import generate_numeric_debug_handle, "
        "prepare_for_propagation_comparison, extract_results_from_loggers, compare_results",
        "ImportError: cannot import name 'generate_numeric_debug_handle' from "
        "'torch.ao.quantization'",
        "from torchao.quantization.pt2e import generate_numeric_debug_handle, "
        "prepare_for_propagation_comparison, extract_results_from_loggers, compare_results",
        _lesson("m04_accuracy_m04_1_measuring_the_error"),
    ),
    Move(
        "move_exported_model_to_eval, move_exported_model_to_train",
        "from torch.ao.quantization import move_exported_model_to_eval, "
        "move_exported_model_to_train",
        "ImportError: cannot import name 'move_exported_model_to_eval' from "
        "'torch.ao.quantization'",
        "from torchao.quantization.pt2e import move_exported_model_to_eval, "
        "move_exported_model_to_train",
        _lesson("m04_accuracy_m04_3_qat"),
    ),
    Move(
        "disable_observer",
        "from torch.ao.quantization import disable_observer",
        "",  # still imports: it ignores torchao's fake quantizers
        "from torchao.quantization.pt2e import disable_observer",
        _lesson("m04_accuracy_m04_3_qat"),
    ),
    Move(
        "XNNPACKQuantizer (torch.ao)",
        "from torch.ao.quantization.quantizer.xnnpack_quantizer import XNNPACKQuantizer, "
        "get_symmetric_quantization_config",
        _GONE_QUANTIZER,
        "from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, "
        "get_symmetric_quantization_config",
        _lesson("m06_executorch_m06_1_xnnpack_quantizer"),
    ),
    Move(
        "XNNPACKQuantizer (torchao)",
        "from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, "
        "get_symmetric_quantization_config",
        "",  # imports; a private copy for torchao's tests, deprecated when constructed
        "from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, "
        "get_symmetric_quantization_config",
        _lesson("m06_executorch_m06_1_xnnpack_quantizer"),
    ),
    Move(
        "to_edge, to_backend",
        "from executorch.exir import to_edge",
        "",  # imports; to_edge(...).to_backend(XnnpackPartitioner()) logs a DEPRECATION WARNING
        "from executorch.exir import to_edge_transform_and_lower",
        _lesson("m06_executorch_m06_2_lowering_to_executorch"),
    ),
    Move(
        "OpenVINOQuantizer",
        "from nncf.experimental.torch.fx import OpenVINOQuantizer",
        "ImportError: cannot import name 'OpenVINOQuantizer' from 'nncf.experimental.torch.fx'",
        "from executorch.backends.openvino.quantizer import OpenVINOQuantizer",
        _lesson("m07_your_model_m07_3_every_quantizer"),
        needs=("nncf", "openvino"),
    ),
    Move(
        "quantize_dynamic (eager mode)",
        "from torch.ao.quantization import quantize_dynamic",
        "",  # imports; calling it warns that torch.ao.quantization is deprecated
        "from torchao.quantization import quantize_",
        _lesson("m05_transformers_m05_4_pt2e_or_quantize"),
    ),
    Move(
        "prepare_fx, convert_fx (FX graph mode)",
        "from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx",
        "",  # imports; calling them warns that torch.ao.quantization is deprecated
        "from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, "
        "prepare_qat_pt2e",
        _lesson("m01_quantized_graphs_m01_1_pt2e_flow"),
    ),
)


def move(api: str) -> Move:
    """The row of ``api``.

    Raises:
        KeyError: if no row has that ``api``; the message lists the rows.

    >>> move("export_for_training").new
    'from torch.export import export'
    """
    for row in MOVES:
        if row.api == api:
            return row
    raise KeyError(f"no row {api!r} (one of: {', '.join(row.api for row in MOVES)})")


def attempt(statement: str) -> tuple[dict[str, object], str]:
    """Run an import statement in a namespace of its own.

    Args:
        statement: Python source, e.g. ``"from torch.export import export"``.

    Returns:
        The names it bound, and ``""`` if it ran, else the error as ``Type: first line``;
        an ``ImportError``'s message loses the file path it ends with, which differs from one
        installation to the next.

    Warnings that importing raises are dropped (a deprecated module warns when *called*), and
    so are the lines C++ code writes to the process's stderr meanwhile (importing ExecuTorch's
    OpenVINO backend logs a ``Registering override fallback regex`` there).

    >>> attempt("from math import tau")[1]
    ''
    >>> attempt("from math import half_pi")[1]
    "ImportError: cannot import name 'half_pi' from 'math'"
    """
    names: dict[str, object] = {}
    try:
        with warnings.catch_warnings(), native_stderr_silenced():
            warnings.simplefilter("ignore")
            exec(statement, names)
    except ImportError as error:
        message = str(error).splitlines()[0]
        message = message.removesuffix(f" ({error.path or 'unknown location'})")
        result = f"{type(error).__name__}: {message}"
    else:
        result = ""
    names.pop("__builtins__", None)
    return names, result
