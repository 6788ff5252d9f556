"""AOTInductor packages compiled with freezing once, kept in the course's cache by what made them.

A lesson that times compiled models pays inductor's compile (seconds per model) on every
build; the FX graph cache cannot help, since frozen graphs hold oneDNN's prepacked weights,
which it does not pickle. A package is machine code for one program, one PyTorch version,
one kernel path and one thread count: with those in its key it is compiled once, and a
second build or a process capped at another ISA (``common.cpu.run_under_isa``) loads it in
well under a second. Before a package is handed out, its outputs are checked against the
program it came from: a fast package that computes other numbers is worth nothing.
"""

import re
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import torch

from common.cache import cached_path
from common.cpu import describe
from common.digest import digest
from common.numerics import sqnr
from common.timing import timing_threads

__all__ = ["check_package", "compiled_package", "kernel_calls", "kernels_ran", "package_key"]


def package_key(program: torch.export.ExportedProgram) -> str:
    """A digest of what a package compiled from ``program`` here would depend on.

    The graph's code and every weight and constant (what it computes, with what), the user
    inputs' shapes (a package is compiled for them), torch's version, this process's kernel
    path (``describe().kernel_path``: ``ATEN_CPU_CAPABILITY`` picks inductor's vector ISA,
    ``ONEDNN_MAX_CPU_ISA`` the layout of prepacked int8 weights) and ``timing_threads()``
    (inductor specializes its CPU kernels on the thread count), through
    ``common.digest.digest``, which adds the installed torch, torchao and ExecuTorch. The saved
    file itself makes no key: its bytes change from one compile to the next.
    """
    tensors = {**program.state_dict, **program.constants}
    inputs = set(program.graph_signature.user_inputs)
    shapes = [tuple(n.meta["val"].shape) for n in program.graph.nodes if n.name in inputs]
    code = program.graph_module.code
    # a dynamic dimension's range (a Dim's min and max); nothing for a static program
    ranges = [sorted(map(str, program.range_constraints.items()))] * bool(program.range_constraints)
    return digest(code, tensors, shapes, *ranges, describe().kernel_path, timing_threads())


def compiled_package(
    program: torch.export.ExportedProgram,
    name: str,
    *,
    freezing: bool = True,
    kernel_profile: bool = False,
    check: bool = True,
) -> Path:
    """The AOTInductor package of ``program``, compiled with freezing unless already cached.

    Compiled at ``timing_threads()`` threads, so that it can be timed beside other models
    with ``common.timing.compare_speed``; load it with ``torch._inductor.aoti_load_package``.
    Before it is returned, its outputs are compared with ``program``'s (:func:`check_package`),
    cached or not.

    Args:
        program: what to compile (``torch.export.export`` of a float or converted model).
        name: the start of the file name, e.g. ``"encoder_fp32"``.
        freezing: compile with freezing (inductor's int8 fusions need it; ``False`` shows
            the float fallback of pytorch/ao#4566).
        kernel_profile: wrap each kernel call in a profiler record
            (``cpp.enable_kernel_profile``), so that :func:`kernels_ran` sees it.
        check: compare the package's outputs with the program's (:func:`check_package`);
            ``False`` returns a package that computes wrong numbers too, to look at it.

    Returns:
        Path: the ``.pt2`` file, ``<cache>/aoti/<name>-<package_key(program)>.pt2``
        (``common.cache.cached_path``; ``-nofreezing`` / ``-profiled`` after the name when
        asked).

    Raises:
        TypeError: if ``program`` is not an ``ExportedProgram``; the message says how to get
            one from a ``GraphModule``.
        RuntimeError: from :func:`check_package`, if the package computes other numbers than
            ``program``.
    """
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(
            f"compiled_package needs a torch.export.ExportedProgram, got {type(program).__name__}"
            "; export it first: torch.export.export(gm, example_inputs)"
        )

    def compile_to(path: Path) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(timing_threads())
        try:
            with torch.no_grad(), warnings.catch_warnings():
                # inductor's int8 lowering copies a zero-point tensor the way torch warns about
                warnings.filterwarnings("ignore", message="To copy construct from a tensor")
                torch._inductor.aoti_compile_and_package(
                    program,
                    package_path=str(path),
                    inductor_configs={
                        "freezing": freezing,
                        "compile_threads": 1,
                        "cpp.enable_kernel_profile": kernel_profile,
                    },
                )
        finally:
            torch.set_num_threads(threads)

    # Locked: the other language's build may be compiling it too.
    options = "-nofreezing" * (not freezing) + "-profiled" * kernel_profile
    path = cached_path("aoti", f"{name}{options}-{package_key(program)}.pt2", compile_to)
    if check:
        check_package(path, program)
    return path


def check_package(
    package: Path | str, program: torch.export.ExportedProgram, *, min_sqnr: float = 10.0
) -> float:
    """The SQNR of a package's outputs against its program's, at the program's example inputs.

    Loads ``package``, calls it and ``program.module()`` on ``program.example_inputs`` (the
    inputs it was exported with: inside a dynamic dimension's range) and compares every output
    tensor with ``common.numerics.sqnr``. The profiler (:func:`kernels_ran`) proves which
    kernels ran, not that they ran right: this does.

    Args:
        package: a ``.pt2`` file compiled from ``program``.
        program: the ``ExportedProgram`` it was compiled from.
        min_sqnr: the least SQNR, in dB, accepted for each output. oneDNN's int8 kernels
            and the q/dq model round differently, more so without VNNI (M05-3's int8 encoder:
            about 50 dB with VNNI, 24 dB capped at AVX2; M06-4's spotter with three input
            channels: 15 to 22 dB there); a wrong layout gives noise, near 0 dB.

    Returns:
        float: the lowest SQNR over the outputs, in dB (``inf`` when they are equal).

    Raises:
        ValueError: if ``program`` has no example inputs to call both with.
        RuntimeError: if an output's SQNR is below ``min_sqnr``; the message names the
            package, the figure and a known cause.
    """
    from torch.utils._pytree import tree_leaves

    if program.example_inputs is None:
        raise ValueError(
            f"{Path(package).name}: the program has no example inputs to compare the package "
            "with; export it again with torch.export.export(model, example_inputs)"
        )
    args, kwargs = program.example_inputs
    runner = torch._inductor.aoti_load_package(str(package))
    with torch.no_grad():
        expected = tree_leaves(program.module()(*args, **kwargs))
        found = tree_leaves(runner(*args, **kwargs))
    worst = min(sqnr(e.float(), f.float()).item() for e, f in zip(expected, found, strict=True))
    if worst < min_sqnr:
        shapes = ", ".join(str(tuple(a.shape)) for a in tree_leaves((args, kwargs)))
        raise RuntimeError(
            f"{Path(package).name} computes other numbers than the program it was compiled "
            f"from: SQNR {worst:.1f} dB at its example inputs {shapes} (at least {min_sqnr:g} "
            "dB expected). A known cause (torch 2.13): an int8 conv whose input has one "
            "channel, in a program with a dynamic batch; export it with a static batch, or "
            "leave that conv float (compiled_package(..., check=False) returns it unchecked)"
        )
    return worst


def kernel_calls(package: Path) -> Counter:
    """The ATen and oneDNN kernels a package's generated C++ calls, by name, with counts.

    Read from the ``wrapper.cpp`` inside the archive: e.g. ``qlinear_pointwise`` for each
    int8 linear oneDNN runs, ``linear_pointwise`` for a float one prepacked by oneDNN.
    """
    with zipfile.ZipFile(package) as archive:
        source = "".join(
            archive.read(n).decode() for n in archive.namelist() if n.endswith("wrapper.cpp")
        )
    return Counter(re.findall(r"(?<!\w)aoti_torch_cpu_+(\w+?)(?:_tensor)?\(", source))


def kernels_ran(runner, args: tuple) -> Counter:
    """The kernels one call of a loaded package ran, by name, with counts, from the profiler.

    Needs a package compiled with ``kernel_profile=True``: its generated C++ then records each
    kernel call (``aoti_torch_cpu__qconv_pointwise_tensor``...) for ``torch.profiler``. Named
    as :func:`kernel_calls` names them: ``qconv_pointwise``, ``addmm_out``, ``convolution``.

    Args:
        runner: what ``torch._inductor.aoti_load_package`` returned.
        args: its positional inputs.

    Returns:
        Counter: kernel name -> calls in that one call; empty for a package compiled without
        ``kernel_profile=True``.
    """
    from common.kernels import native_stderr_silenced

    activities = [torch.profiler.ProfilerActivity.CPU]
    with native_stderr_silenced(), torch.profiler.profile(activities=activities) as profile:
        runner(*args)
    names = [re.fullmatch(r"aoti_torch_cpu_+(\w+?)(?:_tensor)?", e.name) for e in profile.events()]
    return Counter(found[1] for found in names if found)
