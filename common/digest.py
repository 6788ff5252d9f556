"""The one key function: ``digest(*parts)``, a short hex digest of files, strings, JSON,
tensors and modules, always with the installed torch, torchao and ExecuTorch versions
(``stack_versions``). Every cache entry and measured figure of the course is named by it.
``import_closure(path)``: the ``common`` files a lesson or a module may run, read from their
imports (what the site's build re-runs a lesson for, and what the op atlas keys its rows by).

Torch-free at import (a tensor or module is read only once torch is imported).
"""

import ast
import hashlib
import inspect
import json
import re
import sys
import types
from functools import cache
from importlib import metadata
from pathlib import Path

__all__ = ["STACK", "digest", "import_closure", "stack_versions"]

_ROOT = Path(__file__).resolve().parents[1]
#: The packages whose versions every ``digest`` covers.
STACK = ("torch", "torchao", "executorch")


@cache
def stack_versions() -> tuple[tuple[str, str], ...]:
    """The installed versions of ``STACK`` (``"none"`` for one not installed).

    >>> dict(stack_versions())["torch"].startswith("2.")
    True
    """
    found = []
    for name in STACK:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, "none"))
    return tuple(found)


def digest(*parts) -> str:
    """A short hex digest of ``parts`` and of the installed torch, torchao and ExecuTorch.

    Each part may be bytes, a string, a ``Path`` (the file's contents), a tensor (its dtype,
    shape and values, whatever its layout), an ``nn.Module`` (see below), a list, tuple or dict
    of these, or any other JSON value. A module stands for what it computes: a GraphModule's
    code and the tensors it reads; another module's class source (up to torch's own classes)
    and ``repr``; for every submodule its plain attributes (numbers, strings, tuples of them:
    what steers ``forward``), every parameter and buffer (persistent or not) and the state
    dict; and the source of the module-level functions and classes (and the plain constants)
    the modules' classes name.

    >>> digest("a", 1) == digest("a", 1) != digest("a", 2)
    True
    >>> len(digest(b"bytes"))
    20
    """
    hasher = hashlib.sha256()
    _feed(hasher, [list(pair) for pair in stack_versions()])
    for part in parts:
        _feed(hasher, part)
    return hasher.hexdigest()[:20]


def _feed(hasher, part) -> None:
    torch = sys.modules.get("torch")  # a tensor or module exists only once torch is imported
    if isinstance(part, bytes | bytearray):
        hasher.update(b"b%d:" % len(part) + bytes(part))
    elif isinstance(part, str):
        _feed(hasher, part.encode())
    elif isinstance(part, Path):
        _feed(hasher, part.read_bytes())
    elif torch is not None and isinstance(part, torch.Tensor):
        _feed(hasher, f"tensor {part.dtype} {tuple(part.shape)}")
        _feed(hasher, _tensor_bytes(part))
    elif torch is not None and isinstance(part, torch.nn.Module):
        _feed_module(hasher, part)
    elif isinstance(part, list | tuple):
        hasher.update(b"[%d" % len(part))
        for item in part:
            _feed(hasher, item)
    elif isinstance(part, set | frozenset):  # in an order that is the same in every process
        _feed(hasher, ["set", *sorted(part, key=repr)])
    elif isinstance(part, dict):
        hasher.update(b"{%d" % len(part))
        for key in sorted(part, key=repr):
            _feed(hasher, repr(key))
            _feed(hasher, part[key])
    else:
        _feed(hasher, json.dumps(part, sort_keys=True, default=repr))


def _tensor_bytes(tensor) -> bytes:
    """A tensor's values as bytes, whatever its layout (oneDNN's prepacked weights, qint8)."""
    tensor = tensor.detach()
    if tensor.is_mkldnn:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    return tensor.cpu().contiguous().view(-1).view(sys.modules["torch"].uint8).numpy().tobytes()


@cache
def _module_internals() -> frozenset:
    """The attribute names every ``nn.Module`` (and GraphModule) sets for itself."""
    torch = sys.modules["torch"]
    return frozenset(vars(torch.nn.Module())) | {"training", "meta", "_graph", "_code"}


def _plain(value) -> bool:
    """A value whose ``repr`` says all it is and is the same in every process."""
    torch = sys.modules["torch"]
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        return True
    if isinstance(value, torch.dtype | torch.device | torch.Size | torch.memory_format):
        return True
    if isinstance(value, tuple | list | frozenset | set):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _feed_module(hasher, model) -> None:
    torch = sys.modules["torch"]
    tensors = {
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),  # non-persistent ones too
    }
    known = {id(tensor) for tensor in tensors.values()}
    # The state dict's other entries (packed weights' extra state), each tensor hashed once.
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in known:
            tensors[f"state:{name}"] = value
    if isinstance(model, torch.fx.GraphModule):
        for node in model.graph.nodes:
            if node.op == "get_attr":  # convert's int8 constants are attributes, not buffers
                value = model
                for part in node.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.Tensor) and id(value) not in known:
                    tensors[f"attr:{node.target}"] = value
    else:
        _feed(hasher, repr(model))
    internals = _module_internals()
    seen_functions: set = set()
    for name, module in model.named_modules(remove_duplicate=False):
        _feed(hasher, [name, type(module).__module__, type(module).__qualname__])
        if isinstance(module, torch.fx.GraphModule):
            _feed(hasher, module.code)
        for cls in type(module).__mro__:
            if cls.__module__.startswith(("torch.", "builtins")):
                break
            _feed_source(hasher, cls, seen_functions)
        attributes = {
            key: value
            for key, value in vars(module).items()
            if key not in internals and _plain(value)
        }
        _feed(hasher, attributes)
        for key, value in vars(module).items():  # a function kept as an attribute
            if key not in internals and isinstance(value, types.FunctionType):
                _feed_source(hasher, value, seen_functions)
    _feed(hasher, tensors)


def _feed_source(hasher, thing, seen: set) -> None:
    """The source of a class or function defined outside torch, and of the module-level
    functions and classes (and the plain constants) it names, recursively."""
    if id(thing) in seen:
        return
    seen.add(id(thing))
    module = getattr(thing, "__module__", "") or ""
    if module.startswith(("torch", "builtins")):
        return
    try:
        _feed(hasher, inspect.getsource(thing))
    except (OSError, TypeError):
        _feed(hasher, f"{module}.{getattr(thing, '__qualname__', '?')}")
    functions = (
        [thing]
        if isinstance(thing, types.FunctionType)
        else [v for v in vars(thing).values() if isinstance(v, types.FunctionType)]
    )
    for function in functions:
        scope = function.__globals__
        for name in sorted(_names(function.__code__)):
            value = scope.get(name)
            if isinstance(value, types.FunctionType | type):
                _feed_source(hasher, value, seen)
            elif value is not None and not isinstance(value, types.ModuleType):
                if _plain(value):
                    _feed(hasher, [name, value])


def _names(code: types.CodeType) -> set:
    """The global names a function's code (and the code nested in it) reads."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


# ----------------------------------------------------------- the code a file may run


#: A module of ``common`` named in a string (a module imported by name, ``importlib``).
_MODULE_NAME = re.compile(r"common(\.[a-z_][a-z0-9_]*)+")


def _imported_modules(code: str, package: str = "") -> set[str]:
    """The dotted names ``code`` imports, anywhere (inside functions too), and those of the
    code it holds in string constants that parse as Python (a step a lesson hands to a fresh
    interpreter, ``common.cpu.run_under_isa``) or that name a module of ``common`` (imported
    with ``importlib``). ``package``: the package ``code`` belongs to,
    for its relative imports (``from .rules import X`` in ``common.backends.xnnpack``)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _MODULE_NAME.fullmatch(node.value):  # importlib.import_module("common.x.rules")
                found.add(node.value)
            elif "import" in node.value and "\n" in node.value:
                found |= _imported_modules(node.value, package)
    return found


@cache
def _file_imports(path: Path, mtime_ns: int, package: str) -> frozenset:
    """``_imported_modules`` of a file, read once per version of it (a build asks for the
    closure of every lesson, and they share most files)."""
    return frozenset(_imported_modules(path.read_text("utf-8"), package))


def _module_files(name: str, root: Path) -> list[Path]:
    """The files importing ``name`` (``common.backends.xnnpack.rules``) runs: each package's
    ``__init__.py`` on the way down, then the module; [] for a name that is not a module of
    ``common`` (a function imported from it)."""
    parts = name.split(".")
    files, folder = [], root
    for depth, part in enumerate(parts):
        folder = folder / part
        if (folder / "__init__.py").is_file():
            files.append(folder / "__init__.py")
        elif folder.with_suffix(".py").is_file() and depth == len(parts) - 1:
            files.append(folder.with_suffix(".py"))
        else:
            break
    return files


def _package_of(path: Path, root: Path) -> str:
    """The dotted package a file of ``common`` belongs to (``common.backends.xnnpack``)."""
    folder = path.parent.relative_to(root)
    return ".".join(folder.parts)


def import_closure(path: Path, root: Path = _ROOT, *, skip=()) -> list[Path]:
    """The files of ``common/`` that running ``path`` may execute: ``common/__init__.py`` and
    every module it imports, directly or through other ``common`` modules (an import inside a
    function counts; so does one in a code string it runs in a subprocess), with the
    ``__init__.py`` of each package on the way; ``path`` itself is not in it. In path order.

    Args:
        path: a lesson, or a module of ``common``.
        root: the folder holding ``common/`` (a source checkout, or site-packages).
        skip: files not to follow (their imports are not read) and not to list.

    >>> [p.name for p in import_closure(_ROOT / "common" / "lesson.py")]
    ['__init__.py', 'charts.py', 'turns.py']
    """
    root, path = Path(root).resolve(), Path(path).resolve()
    common = root / "common"
    if not common.is_dir():
        return []
    skip = {Path(p).resolve() for p in skip}
    seen: set[Path] = set()
    todo = [(path, _package_of(path, root) if path.is_relative_to(common) else "")]
    while todo:
        file, package = todo.pop()
        for name in _file_imports(file, file.stat().st_mtime_ns, package):
            if name.split(".")[0] != "common":
                continue
            for module in _module_files(name, root):
                if module not in seen and module not in skip:
                    seen.add(module)
                    todo.append((module, _package_of(module, root)))
    seen.discard(path)
    return sorted(seen, key=lambda p: p.relative_to(common).parts)
