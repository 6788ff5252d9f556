"""Run a lesson as a reader does, then its exercise solutions in the lesson's namespace.

``python tests/run_lesson.py < job.json``, the job being ``[lesson path, [solution code, ...],
ISA or null, measured or null]``: the lesson runs as ``python lesson.py`` would run it (its
folder first on ``sys.path``, ``__name__ == "__main__"``), then each solution, then, given an
ISA, a check that the cap on the kernel path took (``common.cpu.isa_environment`` sets it).
``measured`` (``{"lang", "name", "folder", "inputs"}``) hands the lesson the figures the site's
build measured once for it (``common.cache.measured_once``), as the build's second language
gets them: its timings are read, not measured again. ``patterns`` (a folder holding the
build's ``pattern_graphs.py``, or null) exports torchao's pattern graphs once per process, as
the build does: the first time torchao loads ``torchao.quantization.pt2e.utils``, its exporter
becomes the caching one, which every module imported after it takes (docs/pattern_graphs.py
says why a process needs each pattern once; tests/test_handmade.py checks a remembered graph
is the freshly exported one). Standard library only until then: it runs in any Python where
the course is installed, a bare virtualenv included (tests/test_front_door.py, no
``patterns``), and finds ``common`` there, not in this checkout.
"""

import importlib.abc
import importlib.util
import json
import os
import runpy
import sys

EXPORTER_HOME = "torchao.quantization.pt2e.utils"


class _ExportOnce(importlib.abc.MetaPathFinder):
    """When ``EXPORTER_HOME`` is imported (by the lesson, when it imports torchao), run
    ``pattern_graphs.export_once()`` right after the module runs, before anyone imports from it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != EXPORTER_HOME:
            return None
        sys.meta_path.remove(self)  # once; and find the real spec without this finder
        spec = importlib.util.find_spec(fullname)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            import pattern_graphs

            pattern_graphs.export_once()

        spec.loader.exec_module = exec_module
        return spec


def main() -> None:
    path, solutions, capped_at, *rest = json.load(sys.stdin)
    figures = rest[0] if rest else None
    patterns = rest[1] if len(rest) > 1 else None
    if patterns:
        sys.path.append(patterns)
        sys.meta_path.insert(0, _ExportOnce())
    sys.argv, sys.path[0] = [path], os.path.dirname(path)
    if figures:
        from common import lesson

        lesson.start(
            lang=figures["lang"],
            name=figures["name"],
            measured=figures["folder"],
            inputs=figures["inputs"],
            pictures=False,
        )
    try:
        namespace = runpy.run_path(path, run_name="__main__")
        for number, code in enumerate(solutions, 1):
            exec(compile(code, f"{path} (solution {number})", "exec"), namespace)
    finally:
        if figures:
            lesson.stop()  # closes the turns' lock files start opened
    if capped_at:
        from common.cpu import describe

        assert describe().onednn == capped_at, f"not capped at {capped_at}: {describe().verdict}"


if __name__ == "__main__":
    main()
