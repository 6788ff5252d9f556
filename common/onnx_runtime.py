"""ONNX Runtime for PT2E models: a quiet ONNX export, a CPU session, the kernels a run ran.

M03-5 exports a converted (q/dq) model with ``torch.onnx.export(..., dynamo=True)`` as a QDQ
ONNX graph and runs it on ONNX Runtime's CPU provider. ONNX Runtime's graph optimizer fuses a
``DequantizeLinear → Conv → QuantizeLinear`` group into one int8 kernel (``QLinearConv``)
when the session is created; which kernels a call really ran is read from the session's own
profile (``SessionOptions.enable_profiling``), not from the file.
"""

import contextlib
import json
import logging
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from common.timing import timing_threads

__all__ = ["OPTIMIZATION_LEVELS", "kernels_ran", "onnx_export", "root_cause", "runner", "session"]

#: The names ``session`` takes for ONNX Runtime's graph optimization levels.
OPTIMIZATION_LEVELS = {
    "none": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@contextlib.contextmanager
def root_cause() -> Iterator[None]:
    """Re-raise an ONNX exporter error as the error at the bottom of its chain.

    ``torch.onnx.export`` wraps what went wrong (a ``DispatchError: No ONNX function found
    for <OpOverload(...)>``, a ``TypeError`` in a translation) in a ``ConversionError`` whose
    first line, in colour, says only that step 3/3 failed. The bottom of the chain names the
    node and the op.

    Raises:
        BaseException: the innermost ``__cause__`` of a ``torch.onnx`` exporter error (other
            errors propagate unchanged).

    >>> with root_cause():
    ...     try:
    ...         raise KeyError("the op")
    ...     except KeyError as inner:
    ...         raise torch.onnx.errors.OnnxExporterError("step 3/3") from inner
    Traceback (most recent call last):
    ...
    KeyError: 'the op'
    """
    try:
        yield
    except torch.onnx.errors.OnnxExporterError as error:
        cause: BaseException = error
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if cause is error:
            raise
        raise cause from None


def onnx_export(
    model: torch.nn.Module,
    args: tuple,
    *,
    translations: dict[Callable, Callable] | None = None,
    dynamic_shapes=None,
):
    """``torch.onnx.export(model, args, dynamo=True)``, with its progress lines off the page.

    The exporter prints its steps, logs a warning per torchvision op it cannot register
    (torchvision is not installed) and warns that an exported ``GraphModule`` is "in training
    mode" (it has no ``eval()``); none of it says anything about the model. The log level and
    the warning filter are set for the call only. A failed export raises its root cause
    (``root_cause``).

    Args:
        model: the model, e.g. a converted PT2E ``GraphModule``.
        args: its example inputs.
        translations: ``custom_translation_table``: a torch op (``OpOverload``) to the function
            that writes its ONNX nodes, for ops the exporter has no translation of, or whose
            translation should be replaced.
        dynamic_shapes: as ``torch.export.export`` takes them.

    Returns:
        torch.onnx.ONNXProgram: ``.model`` is the ONNX graph, ``.save(path)`` writes it.

    Raises:
        torch.onnx._internal.exporter._errors.DispatchError: an op has no translation.
        Exception: the root cause of another failed export.
    """
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), root_cause():
            warnings.filterwarnings("ignore", message="Exporting a model while it is in training")
            return torch.onnx.export(
                model,
                args,
                dynamo=True,
                verbose=False,
                custom_translation_table=translations,
                dynamic_shapes=dynamic_shapes,
            )
    finally:
        logger.setLevel(level)


def session(
    path: str | Path,
    *,
    threads: int | None = None,
    optimization: str = "all",
    profile: bool = False,
):
    """An ONNX Runtime ``InferenceSession`` on the CPU provider, with its threads stated.

    Args:
        path: the ``.onnx`` file.
        threads: intra-op threads; ``timing_threads()`` when omitted, as the course's timings
            use (inter-op: one, the graph runs in order).
        optimization: the graph optimization level: one of ``OPTIMIZATION_LEVELS``
            (``"all"``, ONNX Runtime's default, fuses QDQ groups into int8 kernels).
        profile: write a profile of every call (``kernels_ran`` reads it).

    Returns:
        onnxruntime.InferenceSession: the session (ONNX Runtime's own warnings off).

    Raises:
        ValueError: if ``optimization`` is not a name of ``OPTIMIZATION_LEVELS``.
    """
    import onnxruntime as ort

    if optimization not in OPTIMIZATION_LEVELS:
        raise ValueError(
            f"unknown optimization {optimization!r} (one of: {', '.join(OPTIMIZATION_LEVELS)})"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or timing_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    level = OPTIMIZATION_LEVELS[optimization]
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3  # errors only: no shape-merging notes on stderr
    options.enable_profiling = profile
    if profile:
        options.profile_file_prefix = str(Path(path).with_suffix("")) + "_profile"
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def runner(onnx_session) -> Callable[..., torch.Tensor]:
    """A callable that runs ``onnx_session`` on torch tensors and returns its first output.

    Args:
        onnx_session: an ``InferenceSession`` (``session``).

    Returns:
        Callable: ``run(*tensors) -> torch.Tensor``, for ``race``'s ``also`` or a comparison.
    """
    names = [value.name for value in onnx_session.get_inputs()]

    def run(*tensors: torch.Tensor) -> torch.Tensor:
        feeds = {name: t.detach().numpy() for name, t in zip(names, tensors, strict=True)}
        return torch.from_numpy(onnx_session.run(None, feeds)[0])

    return run


def kernels_ran(path: str | Path, args: tuple, *, optimization: str = "all") -> Counter:
    """The kernels one call of the model ran on ONNX Runtime's CPU provider, and how often.

    A profiling session is made (the graph is optimized when it is created, as any session's
    is), called once on ``args``, and its profile read: each node event (``cat == "Node"``)
    names the kernel it ran (``args.op_name``: ``QLinearConv``, ``QGemm``, ``Conv``, ...).
    The profile file is removed.

    Args:
        path: the ``.onnx`` file.
        args: the inputs, torch tensors.
        optimization: the graph optimization level (``session``).

    Returns:
        Counter: kernel name to the number of nodes that ran it.

    Raises:
        RuntimeError: if a node ran on another provider than the CPU's.
    """
    profiled = session(path, threads=1, optimization=optimization, profile=True)
    runner(profiled)(*args)
    profile = Path(profiled.end_profiling())
    try:
        events = json.loads(profile.read_text("utf-8"))
    finally:
        profile.unlink(missing_ok=True)
    ran = Counter()
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        provider = event["args"].get("provider")
        if provider != "CPUExecutionProvider":
            raise RuntimeError(f"node {event['name']!r} ran on {provider}, not the CPU provider")
        ran[event["args"]["op_name"]] += 1
    return ran
