"""What a ``.pte`` does when it runs: the operators it ran, and whether its methods load.

``operators_run(pte, inputs)`` runs the program once on the ExecuTorch runtime with an ETDump
and returns the XNNPACK operators it ran, by XNNPACK's names, and the portable kernels outside
the delegates (M06-4). The names say int8 or float for convs, GEMMs and data moves; the
elementwise operators (``HardSwish (NC)``, ``Add (ND)``) and the conversions name no data type:
they are listed apart, never dropped. ``load_check(program)`` loads each method in a child
process, where XNNPACK compiles its delegates, and names the delegated node XNNPACK refuses, if
any (m99_5). Both take what ``common.edge.to_executorch`` returns (``operators_run`` its
``.buffer``). ``load_quantized_kernels()`` gives the runtime ExecuTorch's quantized kernels
(``embedding_byte`` of an 8-bit embedding, M08-3).
"""

import contextlib
import ctypes
import io
import json
import re
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from torch.fx import Node

from common.graph import op_name
from common.lesson import lesson_language

__all__ = [
    "LoadCheck",
    "OperatorsRun",
    "Refusal",
    "load_check",
    "load_quantized_kernels",
    "operators_run",
]


@cache
def load_quantized_kernels() -> Path:
    """Register ExecuTorch's quantized kernels (``quantized_decomposed::embedding_byte.out``
    and the other ``quantized_ops_lib`` kernels) with the runtime of this process; the library.

    A ``.pte`` that names one of them outside its delegates fails to load without them
    (``Missing operator: quantized_decomposed::embedding_byte.out``). ``import
    executorch.kernels.quantized`` loads the same library, and with it the quantize and
    dequantize out-variants it also adds to torch, for the rest of the process: a later
    ``to_executorch`` of a q/dq program then succeeds where it fails by default (m99_5's first
    entry). Loading the runtime library alone adds only the runtime's kernels.
    """
    import executorch.exir

    library = Path(executorch.exir.__file__).parents[1] / "lib"
    library /= "libexecutorch_kernels_quantized.so"
    ctypes.CDLL(str(library))
    return library


# --- Proof on the runtime: the operators XNNPACK ran, from an ETDump --------------------------

# An XNNPACK profiling event in the ETDump holds the operator's name with " #N" (its count),
# a debug handle of -1 and two times: nothing else. The name is XNNPACK's
# (``xnn_operator_type_to_string_v2``), "Convolution (NHWC, QC8) IGEMM", "Fully Connected (NC,
# QD8, F32, QC8W) GEMM": the data types sit after the layout. Q..8 are int8 types (QS8 static,
# QD8/QDU8 dynamic, QC8/QC8W per-channel weights, QU8 unsigned, QP8/PQS8 packed), S8/U8 signed
# and unsigned int8, X8 moves int8 bytes; F32/F16/BF16 (PF32/PF16 packed) are float, X32/X16
# move 32- and 16-bit values (float, in these programs). The elementwise operators, the
# conversions and the reshapes name no data type: "Add (ND)", "HardSwish (NC)", "Clamp (NC)",
# "Convert (NC)", "Static Reshape (NC)" are the same name on int8 and on float data (an int8
# residual add runs as "Add (ND)" and "Clamp (NC)").
_INT8_TYPE = re.compile(r"^(P?Q[A-Z]*8[A-Z]*|[SU]8|X8)$")
_FLOAT_TYPE = re.compile(r"^(P?F16|P?F32|BF16(_F32)?|X16|X32)$")
# XNNPACK's name for a 256-entry lookup table it builds, when the delegate is loaded, from a
# chain of unary ops that starts and ends on 8-bit data (a hardswish, sigmoid or tanh between
# two int8 ops, with the Converts around it): ``xnn_subgraph_fuse_unary_quantized_into_lut``
# leaves it a unary node with no operator (``xnn_unary_invalid``). It reads and writes int8.
_INT8_NAMES = {"Invalid Unary Op"}
# The runtime's own events, not operators.
_RUNTIME_EVENTS = {
    "Method::init",
    "Program::load_method",
    "Method::execute",
    "DELEGATE_CALL",
    "OPERATOR_CALL",
}


def _types(operator: str) -> list[str]:
    """``"Convolution (NHWC, QC8) IGEMM"`` -> ``["NHWC", "QC8"]``."""
    found = re.search(r"\(([^)]*)\)", operator)
    return [t.strip() for t in found[1].split(",")] if found else []


def _kind(operator: str) -> str:
    """``"int8"``, ``"float"``, ``"conversion"`` or ``"untyped"``: what XNNPACK's name says."""
    if operator.startswith("Convert ("):
        return "conversion"
    types = _types(operator)
    if operator in _INT8_NAMES or any(map(_INT8_TYPE.match, types)):
        return "int8"
    if any(map(_FLOAT_TYPE.match, types)):
        return "float"
    return "untyped"


@dataclass(frozen=True)
class OperatorsRun:
    """The operators one call of a ``.pte`` ran on the ExecuTorch runtime, with counts.

    Every XNNPACK operator that ran is in ``xnnpack`` and in exactly one of ``int8``,
    ``float_only``, ``untyped`` and ``conversions``; ``summary`` prints them all.

    Attributes:
        xnnpack: XNNPACK's operators inside the delegates, by XNNPACK's name, which says the
            data types when it has any: ``Convolution (NHWC, QC8) IGEMM`` (int8 activations,
            per-channel int8 weights), ``Fully Connected (NC, F32) GEMM`` (float),
            ``HardSwish (NC)`` (no data type: int8 or float).
        portable: the kernels outside any delegate (ExecuTorch's portable kernels), by the
            out variant the runtime calls, e.g. ``mean.out``.
    """

    xnnpack: Counter
    portable: Counter = field(default_factory=Counter)

    def _of_kind(self, kind: str) -> Counter:
        return Counter({op: n for op, n in self.xnnpack.items() if _kind(op) == kind})

    @property
    def int8(self) -> Counter:
        """XNNPACK's operators on int8 data: a type ``QS8``, ``QC8``, ``QD8``..., ``S8``, ``X8``
        in the name, or ``Invalid Unary Op``, the lookup table XNNPACK makes of unary ops
        between int8 values (a hardswish between two int8 linears)."""
        return self._of_kind("int8")

    @property
    def float_only(self) -> Counter:
        """XNNPACK's operators whose name says float data only (``F32``, ``F16``, ``X32``)."""
        return self._of_kind("float")

    @property
    def untyped(self) -> Counter:
        """XNNPACK's operators whose name says no data type, so int8 or float:
        ``HardSwish (NC)``, ``Add (ND)``, ``Clamp (NC)``, ``Static Reshape (NC)``. A float
        hardswish after an int8 linear is here; so is an int8 residual add. The ETDump holds
        nothing else about them (no data type, no graph node: the debug handle is -1)."""
        return self._of_kind("untyped")

    @property
    def conversions(self) -> Counter:
        """XNNPACK's conversions between data types (``Convert (NC)``): the quantize of a
        delegate's float input, the dequantize of its output, and the edges of a float island
        inside a delegate."""
        return self._of_kind("conversion")

    @property
    def summary(self) -> str:
        """One line per kind, in the language of the lesson that asks (``lesson_language()``)."""
        return self.summary_in(lesson_language())

    def summary_in(self, lang: str) -> str:
        """``summary`` in ``lang``, ``"en"`` or ``"zh_TW"``.

        The float line says ``none`` only when every operator but the conversions names its
        data type and none names float. With an operator that names no data type and none that
        names float, it says ``unknown``, and the next line lists those operators. The lines of
        untyped operators and of conversions are printed when there are any.

        >>> run = OperatorsRun(Counter({"Convolution (NHWC, QC8) IGEMM": 2}))
        >>> print(run.summary_in("en"))
        XNNPACK int8: Convolution (NHWC, QC8) IGEMM ×2
        XNNPACK float: none
        portable: none
        >>> run = OperatorsRun(
        ...     Counter({"Fully Connected (NC, QS8, QC8W) GEMM": 1, "Convert (NC)": 2,
        ...              "HardSwish (NC)": 1}))
        >>> print(run.summary_in("zh_TW"))
        XNNPACK int8：Fully Connected (NC, QS8, QC8W) GEMM ×1
        XNNPACK 浮點數：不確定（沒有名稱標明浮點數；見下一行）
        XNNPACK int8 或浮點數（名稱沒有標明）：HardSwish (NC) ×1
        XNNPACK 資料型別轉換：Convert (NC) ×2
        portable kernel：無
        """
        zh = lang == "zh_TW"
        none, comma = ("無", "、") if zh else ("none", ", ")
        if zh:  # the glossary's 「kernel」 (核心 is a CPU core), full-width colons
            labels = (
                "XNNPACK int8：",
                "XNNPACK 浮點數：",
                "XNNPACK int8 或浮點數（名稱沒有標明）：",
                "XNNPACK 資料型別轉換：",
                "portable kernel：",
            )
            unknown = "不確定（沒有名稱標明浮點數；見下一行）"
        else:
            labels = (
                "XNNPACK int8: ",
                "XNNPACK float: ",
                "XNNPACK int8 or float (the name does not say): ",
                "XNNPACK conversions between data types: ",
                "portable: ",
            )
            unknown = "unknown (no name says float; see the next line)"

        def listed(ops: Counter) -> str:
            return comma.join(f"{op} ×{n}" for op, n in sorted(ops.items())) or none

        int8, floats, untyped, conversions = (
            self.int8,
            self.float_only,
            self.untyped,
            self.conversions,
        )
        lines = [labels[0] + listed(int8)]
        lines.append(labels[1] + (unknown if untyped and not floats else listed(floats)))
        if untyped:
            lines.append(labels[2] + listed(untyped))
        if conversions:
            lines.append(labels[3] + listed(conversions))
        lines.append(labels[4] + listed(self.portable))
        return "\n".join(lines)


@contextlib.contextmanager
def _runtime_log_silenced():
    """The runtime's log (the ``[cpuinfo_utils.cpp:...]`` lines on first use, a delegate's
    errors) goes through Python's stderr or straight to file descriptor 2: drop both."""
    from common.kernels import native_stderr_silenced

    with contextlib.redirect_stderr(io.StringIO()), native_stderr_silenced():
        yield


def operators_run(pte: bytes, inputs, *, method: str = "forward") -> OperatorsRun:
    """Run ``pte`` once on the ExecuTorch runtime with an ETDump; return the operators it ran.

    The runtime on PyPI records a profiling event per XNNPACK operator it runs inside a
    delegate (and per portable kernel). An XNNPACK event holds the operator's name as XNNPACK
    names it, ``"Convolution (NHWC, QC8) IGEMM #1"``, and its times: no data type, no graph
    node (its debug handle is -1). A delegate that XNNPACK ran in float shows ``F32``
    operators; an int8 one ``QS8``/``QC8``. Elementwise operators name no data type
    (``HardSwish (NC)`` is the same name on float and int8 data): they are in
    ``OperatorsRun.untyped``, and ``summary`` lists them on their own line.

    Args:
        pte: the ``.pte`` file's bytes (``to_executorch(...).buffer``).
        inputs: the method's inputs, a list or tuple of tensors.
        method: the method to run.

    Returns:
        OperatorsRun: XNNPACK's operators and the portable kernels of that one call.

    Raises:
        TypeError: if ``pte`` is not bytes (pass ``program.buffer``).
    """
    from executorch.runtime import Runtime

    with warnings.catch_warnings():  # its schema is read with a deprecated importlib call
        warnings.filterwarnings("ignore", message="read_binary is deprecated")
        from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    if not isinstance(pte, bytes | bytearray):
        raise TypeError(
            f"operators_run expects the .pte file's bytes, got {type(pte).__name__}; pass "
            "program.buffer (or Path(file).read_bytes())"
        )
    with tempfile.TemporaryDirectory() as folder, _runtime_log_silenced():
        program = Runtime.get().load_program(bytes(pte), enable_etdump=True)
        program.load_method(method).execute(list(inputs))  # ``program`` outlives the method
        dump = Path(folder) / "run.etdp"
        program.write_etdump_result_to_file(str(dump), str(Path(folder) / "run.bin"))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="read_binary is deprecated")
            etdump = deserialize_from_etdump_flatcc(dump.read_bytes())
    xnnpack, portable = Counter(), Counter()
    for block in etdump.run_data:
        for event in block.events:
            profiled = event.profile_event
            if profiled is None:
                continue
            if profiled.delegate_debug_id_str:  # e.g. "Convolution (NHWC, QC8) IGEMM #1"
                xnnpack[re.sub(r" #\d+$", "", profiled.delegate_debug_id_str)] += 1
            elif profiled.name and profiled.name not in _RUNTIME_EVENTS:
                portable[profiled.name.removeprefix("native_call_")] += 1  # "mean.out"
    return OperatorsRun(xnnpack=xnnpack, portable=portable)


# --- Will it load? -----------------------------------------------------------------------------

_LOADER = """
import json, sys
from executorch.runtime import Runtime
program = Runtime.get().load_program(open(sys.argv[1], "rb").read())
errors = {}
for name in program.method_names:
    try:
        program.load_method(name)
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
print(json.dumps(errors))
"""
# XNNPACK's compiler names the node it could not build by the graph node's debug handle.
_XNNPACK_NODE = re.compile(r"\[XNNCompiler\.cpp:\d+\] (?P<text>.*\bnode (?P<handle>\d+)\b.*)")


@dataclass(frozen=True)
class Refusal:
    """One node of a delegate that XNNPACK refused to build when the method loaded.

    Attributes:
        delegate: the delegate, ``lowered_module_N`` (see :func:`delegated`).
        node: the node's name in that delegate's graph, e.g. ``aten_permute_copy_default``.
        op: its op, e.g. ``permute_copy.default``.
        xnnpack: XNNPACK's message, e.g. ``Failed to create static transpose node 6 with
            code: xnn_status_invalid_parameter``.
    """

    delegate: str
    node: str
    op: str
    xnnpack: str


@dataclass(frozen=True)
class LoadCheck:
    """Whether a program's methods load on the ExecuTorch runtime, and if not, why.

    Attributes:
        loads: every method loaded.
        errors: the error each method that failed raised, by method name.
        refused: the delegated nodes XNNPACK refused, named in the graph.
        log: the runtime's log of the loads (without its CPU-info lines).
    """

    loads: bool
    errors: dict
    refused: tuple[Refusal, ...]
    log: str

    def __str__(self) -> str:
        if self.loads:  # in the language of the lesson that prints it
            return "可以載入" if lesson_language() == "zh_TW" else "loads"
        lines = [f"{name}: {error}" for name, error in self.errors.items()]
        lines += [f"{r.delegate}: {r.node} ({r.op}): {r.xnnpack}" for r in self.refused]
        return "\n".join(lines)


def load_check(program, *, timeout: float = 120) -> LoadCheck:
    """Load every method of a lowered program on the ExecuTorch runtime, in a child process,
    and name the delegated node XNNPACK refuses, if any.

    A delegate is compiled by its backend when the method loads, not when the program is
    lowered: a program can lower, save and then fail with ``Failed to load method forward``.
    The runtime's log says which XNNPACK node failed, by its debug handle; this finds that
    node in the delegate's graph. The load runs in a child process, so that a backend that
    crashes takes only the child with it.

    Args:
        program: what :func:`to_executorch` (or ``edge.to_executorch()``) returned.
        timeout: seconds the child may take.

    Returns:
        LoadCheck: ``loads``, each method's error, the refused nodes and the runtime's log.

    Raises:
        TypeError: if ``program`` is not an ``ExecutorchProgramManager`` (call
            ``.to_executorch()`` on the result of ``to_edge_transform_and_lower`` first).
    """
    if not (hasattr(program, "buffer") and hasattr(program, "exported_program")):
        raise TypeError(
            "load_check expects the program to_executorch() returns (an "
            f"ExecutorchProgramManager), got {type(program).__name__}; call .to_executorch() "
            "on the result of to_edge_transform_and_lower first"
        )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "program.pte"
        path.write_bytes(program.buffer)
        child = subprocess.run(
            [sys.executable, "-c", _LOADER, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    log = "\n".join(line for line in child.stderr.splitlines() if "cpuinfo" not in line)
    if child.returncode != 0:
        last = (log.strip().splitlines() or [f"return code {child.returncode}"])[-1]
        errors = {"(process)": f"the loading process died: {last}"}
    else:
        errors = json.loads(child.stdout.strip().splitlines()[-1])
    by_handle: dict[int, list[tuple[str, Node]]] = {}
    exported = program.exported_program()
    for node in exported.graph.nodes:
        if node.op == "get_attr" and node.target.startswith("lowered_module_"):
            inner = getattr(exported.graph_module, node.target).original_module
            for member in inner.graph.nodes:
                if member.op == "call_function" and "debug_handle" in member.meta:
                    by_handle.setdefault(member.meta["debug_handle"], []).append(
                        (node.target, member)
                    )
    refused = []
    for line in log.splitlines():
        found = _XNNPACK_NODE.search(line)
        if not found:
            continue
        candidates = by_handle.get(int(found["handle"]), [])
        # q/dq nodes share their op's handle: name the op they surround
        ops = [c for c in candidates if "quantized_decomposed" not in str(c[1].target)]
        for delegate, member in ops or candidates:
            refused.append(Refusal(delegate, member.name, op_name(member.target), found["text"]))
    return LoadCheck(loads=not errors, errors=errors, refused=tuple(refused), log=log)
