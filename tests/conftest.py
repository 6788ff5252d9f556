"""The test session's fixtures and hooks; the helpers the test modules import are plain modules
beside it (lesson_scripts, built_site, marks, graphs)."""

import os
import sys
import time
from pathlib import Path

import pytest

# docs/ holds languages, pattern_graphs, course_conf, zh_spacing: the tests import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))

from built_site import BUILT, build_both, no_sources_from_the_future, site_lock
from lesson_scripts import ROOT, torch_threads


def pytest_configure(config):
    """Refuse a pytest whose node ids pytest-xdist 3.8 cannot tag with their xdist_group: the
    groups would do nothing, and the built-site tests would share no site (two workers would
    build it at once into the same generated folders). Then share torch.compile's kernels
    (M03-3) with the docs builds: they are cached under build/.

    Upstream: pytest-dev/pytest-xdist#1386 (open as of pytest-xdist 3.8.0); drop this guard,
    and raise the pytest pin, with the first pytest-xdist release that fixes it.
    """
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores xdist_group (pytest-xdist's loadgroup sets "
            "item._nodeid, which pytest 9.2 no longer reads); install the pytest pinned in "
            "pyproject.toml"
        )
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor_cache"))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_per_worker():
    if torch_threads():
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def torchao_patterns_exported_once():
    """The docs build's cache (docs/pattern_graphs.py), for the whole session of a worker.

    Requested by the modules that prepare and convert many models (test_handmade.py,
    test_lowering.py, test_edge.py: ``pytestmark``), not by every test: a run of the others
    imports neither torchao nor ExecuTorch for it (test_fixtures.py checks).
    """
    import executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (imports the modules it patches)
    from pattern_graphs import export_once

    return export_once()


# The built site is shared by the readers' runs (test_lessons.py compares their pictures with
# the site's), test_site.py, test_build.py and test_zh_spacing.py, on both xdist workers: the
# first to ask builds it, the other waits on the lock and then finds nothing to do.
@pytest.fixture(scope="session")
def site() -> Path:
    """The built site's root folder (holding index.html, en/ and zh_TW/).

    Built as nox -s docs builds it, into build/html: incrementally, so Sphinx and
    sphinx-gallery decide what to redo (nothing, a few seconds, when the site is up to date).
    """
    if os.environ.get("PT2E_COURSE_SITE"):  # test a site built elsewhere, as it is
        return Path(os.environ["PT2E_COURSE_SITE"]).resolve()
    started = time.perf_counter()
    with site_lock():
        no_sources_from_the_future()
        build_both(BUILT)
    print(f"built the site into {BUILT} in {time.perf_counter() - started:.0f} s")
    return BUILT
