"""Helpers shared by the pt2e-course lessons, one job per module.

- ``aoti``: AOTInductor packages compiled once, cached by what made them; the kernels they call.
- ``atlas``: the op atlas: one small model per op, through every quantizer, to what ran it.
- ``backends``: what the course knows of each backend (x86, XNNPACK, OpenVINO, Arm), one home
  each: its tables, its rules with their words, its run readers.
- ``cache``: one cache for what is expensive (``cached``, ``cached_path``), ``measured_once``.
- ``charts``: the course's look for charts and printed tables (CJK fonts, display widths).
- ``coverage``: what a PT2E quantizer leaves in float, op by op, and why.
- ``cpu``: what this CPU gives int8 kernels (ISA, VNNI, AMX), and a step run under another ISA.
- ``data``: the digits data in fixed splits, the CNN and ViT trained on them, ``accuracy``.
- ``digest``: ``digest``, the one key: files, tensors, modules, with the stack's versions.
- ``edge``: ExecuTorch: ``CoursePartitioner`` written by hand, ``to_executorch``, ``delegated``.
- ``expect``: ``expect_error``, an expected error shown as its type and first line.
- ``graph``: one vocabulary for reading PT2E graphs: op names, Q/DQ, the walks a reader needs.
- ``handmade``: ``prepare`` and ``convert`` written by hand, bit-exact with torchao's.
- ``kernels``: ``kernels_run`` and ``time_by_kind``: the compute kernels a model really ran.
- ``language_model``: M08's character decoder with a KV cache, its text, training, perplexity.
- ``lesson``: the running lesson: its language, where its figures and pictures go while the
  site is built.
- ``lowering``: x86 lowering written by hand (``lower``), bit-exact with torchao's.
- ``migration``: the migration map torch.ao → torchao → ExecuTorch, a row per API; ``attempt``.
- ``models``: the model zoo, ``get_model`` and ``example_inputs``.
- ``numerics``: quantization error: every node's output (``record``), ``sqnr``, BatchNorm folded.
- ``onnx_runtime``: a PT2E model exported to ONNX and run on ONNX Runtime; the kernels it ran.
- ``pt2e``: export, calibration, the x86 quantizer, frozen constants, quieter logs.
- ``qat``: M04-4's MobileNetV2 on the digits and a QAT run that resumes in another process.
- ``quantizer``: ``CourseQuantizer``, the course's own PT2E quantizer.
- ``results``: the figures a lesson publishes for the landing page while the site is built.
- ``runtime``: what a ``.pte`` does when it runs: ``operators_run``, ``load_check``.
- ``timing``: ``compare_speed`` and ``race``, timings that hold on a small shared machine.
- ``turns``: while the site is built, a timing runs alone (``alone``, ``working``, ``waiting``,
  ``let_a_timing_in``).
- ``vision_models``: torchvision's architectures rewritten (torchvision does not import here).
- ``viz``: ``draw`` and ``draw_diff``, torch.fx graphs as Graphviz pictures.

Importing ``common`` checks that the pinned torch and torchao are installed.
"""

from importlib import metadata

__all__ = ["SUPPORTED_VERSIONS", "check_versions"]

# Kept equal to the pins in pyproject.toml (a test checks it). The lessons print
# graphs and node names, which change between releases, so other versions are refused.
SUPPORTED_VERSIONS = {"torch": "2.13.0", "torchao": "0.18.0"}


def check_versions(installed=None):
    """Raise ImportError unless the supported torch and torchao are installed.

    Args:
        installed: mapping of distribution name to version; read from the
            environment when omitted (this is for tests).

    Raises:
        ImportError: if torch or torchao is missing or another release than the pinned one;
            the message gives the ``pip install`` command that fixes it.

    >>> check_versions({"torch": "2.13.0+cpu", "torchao": "0.18.0"})
    >>> check_versions({"torch": "2.9.1", "torchao": "0.18.0"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ImportError: pt2e-course needs torch==2.13.0 but torch 2.9.1 is installed; run: pip install ...
    """
    fix = " ".join(f"{name}=={version}" for name, version in SUPPORTED_VERSIONS.items())
    for name, wanted in SUPPORTED_VERSIONS.items():
        if installed is None:
            try:
                found = metadata.version(name)
            except metadata.PackageNotFoundError:
                raise ImportError(
                    f"pt2e-course needs {name}=={wanted} but {name} is not installed; "
                    f"run: pip install {fix}"
                ) from None
        else:
            found = installed[name]
        if found.split("+")[0] != wanted:  # "+cpu" is the build, not the release
            raise ImportError(
                f"pt2e-course needs {name}=={wanted} but {name} {found} is installed; "
                f"run: pip install {fix}"
            )


check_versions()
