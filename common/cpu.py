"""What this CPU gives int8 kernels (ISA, VNNI, AMX, bf16), and running a step under another ISA."""

import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from common.cache import ROOT, measured_once
from common.digest import digest
from common.lesson import lesson_language
from common.turns import subprocess_environment, waiting

__all__ = [
    "ISA_PATHS",
    "CpuInfo",
    "describe",
    "isa_environment",
    "run_under_isa",
    "weaker_paths",
]

#: The kernel paths a lesson can ask for, weakest first, and the variables that cap oneDNN's,
#: ATen's and MKL's instruction sets in a fresh process (each is read once, at first use, so
#: they cannot change inside a running interpreter). A cap never raises a path above what the
#: hardware has; ATen is capped only on the AVX2 path, since AVX512 is its best on x86. MKL
#: ignores oneDNN's and ATen's caps, and ``torch.compile`` with freezing runs static float
#: linears on MKL (``mkl::_mkl_linear``): without its own cap, "AVX2" float linears would still
#: run AVX-512 (``MKL_VERBOSE=1`` prints the ISA each MKL call took).
ISA_PATHS = {
    "AVX2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "AVX512_CORE": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "AVX512_CORE_VNNI": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
}

# oneDNN's names for the int8 paths, weakest first; a cap never raises the path above what
# the hardware has.
_ONEDNN_ORDER = ("AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_AMX")
_MARK = "@@pt2e-course-result@@"


@dataclass(frozen=True)
class CpuInfo:
    """One CPU as the int8 kernels see it; ``describe()`` makes one.

    Attributes:
        name: the CPU's name as torch reads it (e.g. ``"AMD EPYC"``).
        aten: ATen's vector ISA, ``torch.backends.cpu.get_cpu_capability()``
            (``"AVX2"``, ``"AVX512"``; it says ``"AVX512"`` with or without VNNI).
        onednn: the instruction set oneDNN's int8 kernels use, in oneDNN's names
            (``"AVX2"``, ``"AVX512_CORE"``, ``"AVX512_CORE_VNNI"``, ...): the best the
            hardware has, lowered by ``ONEDNN_MAX_CPU_ISA`` when that is set.
        vnni: True when those kernels have VNNI, the instruction that adds int8 products
            into int32 in one step (without it, pairs of products go through int16 and can
            saturate).
        amx_int8: the hardware has AMX tiles for int8 (and oneDNN is allowed to use them).
        bf16: the hardware computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16``) and
            oneDNN is allowed AVX-512.
        threads: ``torch.get_num_threads()``.
        cores: logical cores.
        emulated: True when ``ONEDNN_MAX_CPU_ISA`` or ``ATEN_CPU_CAPABILITY`` caps the path.
    """

    name: str
    aten: str
    onednn: str
    vnni: bool
    amx_int8: bool
    bf16: bool
    threads: int
    cores: int
    emulated: bool

    @property
    def verdict(self) -> str:
        """One line for a page: the ISA, VNNI, AMX and bf16 yes/no, and the threads, in the
        language of the lesson that asks (``lesson_language()``)."""
        return self.verdict_in(lesson_language())

    def verdict_in(self, lang: str) -> str:
        """``verdict`` in ``lang``, ``"en"`` or ``"zh_TW"``.

        >>> info = CpuInfo("CPU", "AVX2", "AVX2", False, False, False, 1, 2, False)
        >>> info.verdict_in("en")
        'CPU: ATen AVX2, oneDNN int8 path AVX2; VNNI no, AMX no, bf16 no; 1 of 2 threads'
        >>> info.verdict_in("zh_TW")
        'CPU：ATen AVX2，oneDNN int8 路徑 AVX2；VNNI 無，AMX 無，bf16 無；使用 2 個執行緒中的 1 個'
        """
        if lang == "zh_TW":
            yes = {True: "有", False: "無"}
            capped = "（受 ONEDNN_MAX_CPU_ISA／ATEN_CPU_CAPABILITY 限制）" if self.emulated else ""
            return (
                f"{self.name}：ATen {self.aten}，oneDNN int8 路徑 {self.onednn}{capped}；"
                f"VNNI {yes[self.vnni]}，AMX {yes[self.amx_int8]}，bf16 {yes[self.bf16]}；"
                f"使用 {self.cores} 個執行緒中的 {self.threads} 個"
            )
        if lang != "en":
            raise ValueError(f"unknown language {lang!r} (one of: en, zh_TW)")
        yes = {True: "yes", False: "no"}
        capped = " (capped by ONEDNN_MAX_CPU_ISA/ATEN_CPU_CAPABILITY)" if self.emulated else ""
        return (
            f"{self.name}: ATen {self.aten}, oneDNN int8 path {self.onednn}{capped}; "
            f"VNNI {yes[self.vnni]}, AMX {yes[self.amx_int8]}, bf16 {yes[self.bf16]}; "
            f"{self.threads} of {self.cores} threads"
        )

    @classmethod
    def from_verdict(cls, line: str) -> "CpuInfo | None":
        """The ``CpuInfo`` a ``verdict`` line (in either language) describes, or None.

        Timings keep the English line (both languages' pages show one measurement); a page
        prints it in its own language through this.

        >>> info = describe()
        >>> CpuInfo.from_verdict(info.verdict_in("en")) == info
        True
        >>> CpuInfo.from_verdict(info.verdict_in("zh_TW")) == info
        True
        """
        found = _VERDICT.fullmatch(line) or _VERDICT_ZH_TW.fullmatch(line)
        if found is None:
            return None
        yes = {"yes": True, "no": False, "有": True, "無": False}
        return cls(
            name=found["name"],
            aten=found["aten"],
            onednn=found["onednn"],
            vnni=yes[found["vnni"]],
            amx_int8=yes[found["amx"]],
            bf16=yes[found["bf16"]],
            threads=int(found["threads"]),
            cores=int(found["cores"]),
            emulated=bool(found["capped"]),
        )

    @property
    def kernel_path(self) -> str:
        """A short key naming the float and int8 kernels in use, e.g. ``"AVX512+AVX512_CORE_VNNI"``.

        Two processes with the same key run the same instructions; the trained-weights cache
        is keyed by it, since float kernels of different ISAs round differently.
        """
        return f"{self.aten}+{self.onednn}"

    def as_dict(self) -> dict:
        """The fields as a plain dict (for JSON)."""
        return asdict(self)


_VERDICT = re.compile(
    r"(?P<name>.*): ATen (?P<aten>\S+), oneDNN int8 path (?P<onednn>\w+)"
    r"(?P<capped> \(capped[^)]*\))?; "
    r"VNNI (?P<vnni>yes|no), AMX (?P<amx>yes|no), bf16 (?P<bf16>yes|no); "
    r"(?P<threads>\d+) of (?P<cores>\d+) threads"
)
_VERDICT_ZH_TW = re.compile(
    r"(?P<name>.*)：ATen (?P<aten>\S+)，oneDNN int8 路徑 (?P<onednn>\w+)(?P<capped>（受[^）]*）)?；"
    r"VNNI (?P<vnni>有|無)，AMX (?P<amx>有|無)，bf16 (?P<bf16>有|無)；"
    r"使用 (?P<cores>\d+) 個執行緒中的 (?P<threads>\d+) 個"
)


def _native_onednn(caps: dict) -> str:
    if caps.get("amx_int8") and caps.get("avx512_vnni"):
        return "AVX512_CORE_AMX"
    if caps.get("avx512_vnni"):
        return "AVX512_CORE_VNNI"
    if caps.get("avx512_bw") and caps.get("avx512_vl") and caps.get("avx512_dq"):
        return "AVX512_CORE"
    if caps.get("avx_vnni"):
        return "AVX2_VNNI"
    return "AVX2"


def describe() -> CpuInfo:
    """Read this process's CPU and kernel path.

    The hardware comes from ``torch.cpu.get_capabilities()`` (every OS, no ``/proc``); the
    caps from this process's environment, as oneDNN and ATen read them.

    Returns:
        CpuInfo: the CPU, its int8 path and the thread count.

    >>> info = describe()
    >>> info.onednn in ("AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_AMX")
    True
    >>> info.vnni == info.onednn.endswith(("VNNI", "AMX"))
    True
    """
    caps = torch.cpu.get_capabilities()
    onednn = _native_onednn(caps)
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap in _ONEDNN_ORDER and _ONEDNN_ORDER.index(cap) < _ONEDNN_ORDER.index(onednn):
        onednn = cap
    return CpuInfo(
        name=str(caps.get("cpu_name") or "unknown CPU"),
        aten=torch.backends.cpu.get_cpu_capability(),
        onednn=onednn,
        vnni=onednn.endswith(("VNNI", "AMX")),
        amx_int8=onednn == "AVX512_CORE_AMX",
        bf16=bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
        and _ONEDNN_ORDER.index(onednn) >= _ONEDNN_ORDER.index("AVX512_CORE"),
        threads=torch.get_num_threads(),
        cores=int(caps.get("num_logical_cores") or os.cpu_count() or 1),
        emulated=bool(cap or os.environ.get("ATEN_CPU_CAPABILITY")),
    )


def weaker_paths(*, cpu: CpuInfo | None = None) -> list[str]:
    """The ``ISA_PATHS`` below this process's int8 path, weakest first.

    A cap never raises a path above what the hardware has, so these are the paths
    ``run_under_isa`` can show beside the native one: ``["AVX2", "AVX512_CORE"]`` on a CPU
    with AVX512-VNNI, none on an AVX2 CPU (or in a process already capped at AVX2).

    Args:
        cpu: the CPU to compare with; ``describe()`` when omitted.

    Returns:
        list: names from ``ISA_PATHS``.

    >>> set(weaker_paths()) <= set(ISA_PATHS)
    True
    >>> from dataclasses import replace
    >>> weaker_paths(cpu=replace(describe(), onednn="AVX2"))
    []
    >>> weaker_paths(cpu=replace(describe(), onednn="AVX512_CORE_AMX"))
    ['AVX2', 'AVX512_CORE', 'AVX512_CORE_VNNI']
    """
    own = _ONEDNN_ORDER.index((cpu or describe()).onednn)
    return [isa for isa in ISA_PATHS if _ONEDNN_ORDER.index(isa) < own]


def isa_environment(isa: str) -> dict:
    """The environment variables that cap a fresh process at ``isa``.

    Args:
        isa: one of ``ISA_PATHS`` (``"AVX2"``, ``"AVX512_CORE"``, ``"AVX512_CORE_VNNI"``),
            or ``"native"`` for no cap.

    Returns:
        dict: variable name to value (empty for ``"native"``).

    Raises:
        ValueError: for an unknown ``isa``; the message lists the valid ones.

    >>> isa_environment("AVX2")  # doctest: +NORMALIZE_WHITESPACE
    {'ONEDNN_MAX_CPU_ISA': 'AVX2', 'ATEN_CPU_CAPABILITY': 'avx2',
     'MKL_ENABLE_INSTRUCTIONS': 'AVX2'}
    >>> isa_environment("SSE")
    Traceback (most recent call last):
    ...
    ValueError: unknown ISA 'SSE' (one of: native, AVX2, AVX512_CORE, AVX512_CORE_VNNI)
    """
    if isa == "native":
        return {}
    if isa not in ISA_PATHS:
        raise ValueError(f"unknown ISA {isa!r} (one of: {', '.join(['native', *ISA_PATHS])})")
    return dict(ISA_PATHS[isa])


def run_under_isa(isa: str, source: str, *, timeout: float = 900, key: str | None = None) -> dict:
    """Run ``source`` in a fresh Python capped at ``isa``; return its ``result`` and its CPU.

    oneDNN and ATen read their ISA caps once per process, so the only way to see another
    kernel path from a running lesson is a new interpreter. ``source`` runs with ``common``
    importable and ``quiet()`` already applied, and must assign a JSON-serialisable
    ``result``. What it prints is discarded; an exception is re-raised here with its message.

    Emulation changes the instructions, hence the numbers they compute; it does not give a
    real AVX2 chip's speed.

    Args:
        isa: ``"native"`` or one of ``ISA_PATHS``.
        source: Python statements that set ``result``.
        timeout: seconds before the subprocess is stopped.
        key: what ``source`` computes, when its text does not say it all; by default the
            text without its comments, each file it names standing for its contents. While
            the site is built, the step runs once per key and the other language's build
            reuses its answer (``common.cache.measured_once``). The key holds ``isa`` and
            this CPU's name, not the kernel path of the process asking: the subprocess's path
            is ``isa``'s, whichever path its parent runs on.

    Returns:
        dict: ``{"result": <result>, "cpu": CpuInfo.as_dict() of the subprocess}``.

    Raises:
        ValueError: for an unknown ``isa``.
        RuntimeError: if ``source`` fails or sets no ``result``; the message ends with the
            subprocess's last error line.
    """
    cpu = describe()
    stamp = digest(isa, key or _what_source_computes(source), cpu.name)
    return measured_once(f"isa-{stamp}", lambda: _run_under_isa(isa, source, timeout))


def _what_source_computes(source: str) -> str:
    """``source`` as a key: its tokens without comments (the twins of a lesson comment their
    steps in their own language), each string naming an existing file replaced by a digest of
    the file (a lesson passes weights through a temporary file, named anew at each run).

    >>> _what_source_computes("x = 1  # one") == _what_source_computes("x = 1  # 一")
    True
    """
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            continue
        text = token.string
        if token.type == tokenize.STRING:
            with contextlib.suppress(ValueError, SyntaxError, TypeError, OSError):
                named = Path(ast.literal_eval(text))
                if named.is_file():
                    text = digest(named)
        kept.append(text)
    return " ".join(kept)


def _run_under_isa(isa: str, source: str, timeout: float) -> dict:
    env = {**os.environ, **isa_environment(isa)}
    if isa == "native":
        for variable in {name for path in ISA_PATHS.values() for name in path}:
            env.pop(variable, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(subprocess_environment())  # the step computes, and times, as part of the build
    program = "\n".join(
        [
            "import json",
            "from common.turns import working",
            "working()",
            "from common.pt2e import quiet",
            "quiet()",
            source,
            "from common.cpu import describe",
            f"print({_MARK!r} + json.dumps({{'result': result, 'cpu': describe().as_dict()}}))",
        ]
    )
    with waiting():  # the subprocess computes in this process's stead
        done = subprocess.run(
            [sys.executable, "-c", program],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode or not lines:
        errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = errors[-1] if errors else "no result was printed"
        raise RuntimeError(f"the step run under ISA {isa} failed (exit {done.returncode}): {last}")
    return json.loads(lines[-1][len(_MARK) :])
