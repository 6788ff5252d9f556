"""The test session's fixtures and hooks; the helpers the test modules import are plain modules
beside it (lesson_scripts, built_site, marks, graphs)."""

import functools
import os
import shutil
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

# docs/ holds site_facts, site_build, course_conf, pattern_graphs, ...: the tests import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))

from built_site import (
    BUILT,
    CHROMIUM,
    CHROMIUM_ARGS,
    QuietHandler,
    build_both,
    no_sources_from_the_future,
    site_lock,
)
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


def pytest_terminal_summary(terminalreporter):
    """Say how many reader runs ran and how many passed before with the same inputs
    (test_lessons.py): a kept one is not a run of this session."""
    found = {"ran": 0, "kept": 0}
    for report in terminalreporter.stats.get("passed", []):
        for name, value in report.user_properties:
            if name == "reader_run":
                found[value] += 1
    if found["kept"]:
        terminalreporter.write_line(
            f"reader runs: {found['ran']} ran, {found['kept']} kept from a passing run with the "
            "same inputs (build/cache/reader-runs; PT2E_COURSE_RERUN_READERS=1 runs them all)"
        )


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_per_worker():
    if torch_threads():
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def torchao_patterns_exported_once():
    """The docs build's cache (docs/pattern_graphs.py), for the whole session of a worker.

    Requested by the modules that prepare and convert many models (``pytestmark`` in
    test_handmade.py, test_lowering.py, test_edge.py, test_runtime.py, test_atlas.py and
    tests/backends/test_xnnpack_*.py), not by every test: a run of the others imports neither
    torchao nor ExecuTorch for it (test_fixtures.py checks).
    """
    import executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (imports the modules it patches)

    from pattern_graphs import export_once

    return export_once()


# The built site is shared by the readers' runs (test_lessons.py compares their pictures with
# the site's), test_site.py, test_build.py and test_zh_spacing.py, on both xdist workers: the
# first to ask builds it, the other waits on the lock and then uses it without building.
@pytest.fixture(scope="session")
def site() -> Path:
    """The built site's root folder (holding index.html, en/ and zh_TW/).

    Built as nox -s docs builds it, into build/html: incrementally, so Sphinx and
    sphinx-gallery decide what to redo (nothing, a few seconds, when the site is up to date).
    """
    if os.environ.get("PT2E_COURSE_SITE"):  # test a site built elsewhere, as it is
        return Path(os.environ["PT2E_COURSE_SITE"]).resolve()
    started = time.perf_counter()
    # The other xdist worker's build of this same test run is the site: building it again
    # (even with nothing to do, Sphinx rewrites _static/ and the search index) would change
    # files under the browser tests this worker's neighbour is running (issue #43).
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    stamp = BUILT.parent / "site-built-by-test-run"
    with site_lock():
        if run and stamp.exists() and stamp.read_text() == run:
            return BUILT
        stamp.unlink(missing_ok=True)
        no_sources_from_the_future()
        build_both(BUILT)
        if run:
            stamp.write_text(run)
    print(f"built the site into {BUILT} in {time.perf_counter() - started:.0f} s")
    return BUILT


# ------------------------------------------------- the browser tests' fixtures (test_site, ...)


@pytest.fixture(scope="session")
def server(site):
    """Serve the built site on 127.0.0.1 in a thread; yield its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=site))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def chromium():
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def browse(chromium, server):
    """browse(locale) -> a new page; every request any page makes is checked to stay local."""
    contexts, requests = [], []

    def new_page(locale: str = "en-US", **options):
        options.setdefault("viewport", {"width": 1280, "height": 900})
        context = chromium.new_context(locale=locale, **options)
        context.on("request", lambda request: requests.append(request.url))
        contexts.append(context)
        return context.new_page()

    yield new_page
    for context in contexts:
        context.close()
    local = urlparse(server).netloc
    remote = sorted(
        {u for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")}
        - {u for u in requests if urlparse(u).netloc == local}
    )
    assert not remote, "requests left localhost:\n" + "\n".join(remote)
