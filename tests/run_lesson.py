"""Run a lesson as a reader does, then its exercise solutions in the lesson's namespace.

``python tests/run_lesson.py < job.json``, the job being ``[lesson path, [solution code, ...],
ISA or null, measured or null]``: the lesson runs as ``python lesson.py`` would run it (its
folder first on ``sys.path``, ``__name__ == "__main__"``), then each solution, then, given an
ISA, a check that the cap on the kernel path took (``common.cpu.isa_environment`` sets it).
``measured`` (``{"lang", "name", "folder", "inputs"}``) hands the lesson the figures the site's
build measured once for it (``common.cache.measured_once``), as the build's second language
gets them: its timings are read, not measured again. Standard library only until then: it
runs in any Python where the course is installed, a bare virtualenv included
(tests/test_front_door.py), and finds ``common`` there, not in this checkout.
"""

import json
import os
import runpy
import sys


def main() -> None:
    path, solutions, capped_at, *measured = json.load(sys.stdin)
    figures = measured[0] if measured else None
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
