"""One Jupyter kernel at a time across the two language builds.

Workaround for jupyter/jupyter_client#487 (port race between concurrent kernels; open, still
in jupyter_client 8.10): a kernel's TCP ports are picked before the kernel binds them, so the
kernel of the other language build, running at the same time, can take one ("Address
already in use"). A build holds this lock from reading a MyST notebook page until its
doctree is done (its kernel is shut down by then); pages served from the execution cache
start no kernel and wait only briefly. Remove it when the issue is closed (myst-nb's
"inline" mode would not help: it starts the same kind of kernel).
"""

from course_conf import ROOT

try:
    import fcntl
except ImportError:  # not on Windows: there the two builds' kernels run unguarded
    fcntl = None

_KERNEL_LOCK = ROOT / "build" / ".kernel.lock"
_held_locks = {}


def _hold_kernel_lock(app, docname: str, source: list[str]) -> None:
    if fcntl is None or "\nkernelspec:" not in source[0][:2000]:
        return
    _KERNEL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = open(_KERNEL_LOCK, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    _held_locks[docname] = handle


def _release_kernel_lock(app, doctree) -> None:
    handle = _held_locks.pop(app.env.docname, None)
    if handle is not None:
        handle.close()  # closing the file releases the lock


def setup(app) -> dict:
    app.connect("source-read", _hold_kernel_lock)
    app.connect("doctree-read", _release_kernel_lock)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
