"""The front door: the landing page shows what this build's lessons measured, lesson pages say
what built them and how to report a problem, and a downloaded lesson runs where it lands."""

import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import quote

import lesson_scripts
import pytest
from built_site import make_site, sphinx_build
from lesson_scripts import (
    EXAMPLES,
    INSTALLED_LESSONS,
    ROOT,
    RUNNER,
    VIRTUALENV_LESSON,
    assert_drew_the_sites_pictures,
    drawn_alike_in_any_folder,
    page_pictures,
    passed_before,
    remember_pass,
    run_as_a_reader,
)
from marks import needs_dot

import course_conf

pytestmark = [pytest.mark.slow, needs_dot]

# Lessons of a small site, each named like the real lesson the landing page reads (its number
# is what course-results looks up), publishing fixed figures as the real ones publish measured.
FIGURES = {
    "m02_fixture/m02_3_cases.py": {"bit_exact_cases": 8},
    "m03_fixture/m03_3_speed.py": {
        "cpu": "Test CPU: oneDNN int8 path AVX2; VNNI no",
        "int8_path": "AVX2",
        "timing_threads": 1,
        "int8_speedup_compiled": 2.5,
        "compiled_interval": [2.3, 2.7],
        "compiled_load": 1.5,
        "int8_speedup_eager": {"AVX2": 1.25},
        "eager_intervals": {"AVX2": [1.2, 1.3]},
        "eager_loads": {"AVX2": 1.4},
        "size_ratio": 0.27,
    },
    "m04_fixture/m04_1_accuracy.py": {
        "test_images": 500,
        "fp32_accuracy": 0.97,
        "int8_accuracy": 0.964,
    },
    "m04_fixture/m04_3_qat.py": {"fp32_accuracy": 0.97, "ptq_accuracy": 0.8, "qat_accuracy": 0.95},
    "m04_fixture/m04_4_qat_real.py": {
        "fp32_accuracy": 0.97,
        "fp32_tuned_accuracy": 0.984,
        "ptq_accuracy": 0.918,
        "qat_accuracy": 0.974,
    },
    "m08_fixture/m08_2_perplexity.py": {
        "unigram_perplexity": 25.47,
        "perplexity_fp32": 4.276,
        "perplexity_int8_xnnpack": 4.288,
        "perplexity_int8_x86": 4.289,
        "perplexity_int4": 4.318,
    },
    "m08_fixture/m08_3_phone.py": {
        "decode_tokens_per_s": 430.0,
        "decode_interval": [410.0, 450.0],
        "decode_tokens_per_s_fp32": 314.0,
        "timing_load": 2.5,
        "pte_bytes": 592568,
    },
}

LANDING = """\
# Fixture

```{course-results}
```

```{course-map}
:modules:
```

```{toctree}
lessons/index
```
"""


def publishing_lesson(figures: dict) -> str:
    calls = "".join(f"publish({name!r}, {value!r})\n" for name, value in figures.items())
    return (
        textwrap.dedent('''\
        """
        A lesson that publishes
        =======================

        It publishes the figures the landing page reads.
        """

        from common.results import publish

        ''')
        + calls
    )


def small_site(root: Path, figures: dict) -> Path:
    site = make_site(root, {path: publishing_lesson(f) for path, f in figures.items()})
    (site / "docs" / "en" / "index.md").write_text(LANDING, encoding="utf-8")
    return site


def text_of(page: Path) -> str:
    """A page's text, tags removed and whitespace collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page.read_text("utf-8"))))


def text_of_html(markup: str) -> str:
    """The text of a piece of HTML (Sphinx splits literals into one span per word)."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The small site, built once for the tests that read it (about 10 s)."""
    site = small_site(tmp_path_factory.mktemp("front"), FIGURES)
    result = sphinx_build(site)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return site


def test_the_landing_page_shows_the_figures_its_lessons_published(built):
    site = built
    published = json.loads((site / "build/results/en/m03_3_speed.json").read_text("utf-8"))
    assert published == FIGURES["m03_fixture/m03_3_speed.py"], "what the lesson published"
    landing = text_of(site / "build/html/en/index.html")
    for shown in (
        "2.50×",
        "AVX2 1.25×",
        "0.27×",
        "97.0% / 96.4%",
        "97.0% / 80.0% / 95.0%",
        "97.0% / 98.4% / 91.8% / 97.4%",
        "frequencies alone: 25.5",
        "4.276 / 4.288 / 4.289 / 4.318",
        "593 kB",
        "430 tokens/s (95 % interval 410–450; eager fp32: 314 tokens/s; load 2.50)",
    ):
        assert shown in landing, f"{shown!r} is not on the landing page: {landing[:3000]}"
    assert "8 cases" in landing and "Test CPU: oneDNN int8 path AVX2" in landing
    # Accuracies say how many test images apart they are: 0.6 % of 500 is three images.
    assert "97.0% / 96.4% (3 images of 500 apart)" in landing
    for lesson in ("M02-3", "M03-3", "M04-1", "M04-3", "M04-4", "M08-2", "M08-3"):
        assert f">{lesson}<" in (site / "build/html/en/index.html").read_text("utf-8"), (
            f"the figures link to {lesson}"
        )
    # The module cards: one per module, in course order, each linking to the module's page.
    cards = re.findall(r'href="(lessons/m0\d_fixture/index\.html)"', _html(site, "index"))
    assert list(dict.fromkeys(cards)) == [
        "lessons/m02_fixture/index.html",
        "lessons/m03_fixture/index.html",
        "lessons/m04_fixture/index.html",
        "lessons/m08_fixture/index.html",
    ]


def _html(site: Path, page: str) -> str:
    return (site / "build" / "html" / "en" / f"{page}.html").read_text("utf-8")


def test_a_figure_a_lesson_no_longer_publishes_fails_the_build_naming_it(tmp_path):
    figures = {path: dict(f) for path, f in FIGURES.items()}
    del figures["m03_fixture/m03_3_speed.py"]["size_ratio"]
    result = sphinx_build(small_site(tmp_path, figures))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "m03_3_speed.py published no size_ratio" in output, output[-3000:]


def test_lesson_pages_say_what_built_them_and_link_a_report(built):
    site = built
    page = _html(site, "lessons/m04_fixture/m04_3_qat")
    built = re.search(r'<p class="course-built-with">([^<]+)</p>', page)
    assert built, "a built-with line on the lesson page"
    from common.cpu import describe

    versions = r"torch \S+, torchao 0\.18\.0, executorch \S+"
    day = r"\d{4}-\d\d-\d\d"
    assert re.search(rf"Built with {versions} · .+ · this lesson ran on {day}", built[1])
    # The verdict ends with the thread count, which pytest-xdist's workers set to one.
    cpu = html.unescape(built[1]).split(" · ")[1]
    assert cpu.rsplit(";", 1)[0] == describe().verdict.rsplit(";", 1)[0], "the build's CPU"
    report = re.search(r'<a class="course-report-link" href="([^"]+)"', page)
    assert report, "a report link on the lesson page"
    url = html.unescape(report[1])
    assert url.startswith(f"{course_conf.COURSE_REPOSITORY}/issues/new?title=")
    assert "A%20lesson%20that%20publishes" in url, "the issue is titled with the page's title"
    address = f"{course_conf.SITE_URL}en/lessons/m04_fixture/m04_3_qat.html"
    assert quote(address, safe="") in url, "and names its address"
    needs = re.search(r'<p class="course-run-needs"[^>]*>(.+?)</p>', page, re.S)
    assert needs and "pt2e-course @ git+" in text_of_html(needs[1]), "the line by the downloads"
    # A module's page says it too, beside its zips.
    assert re.search(r"<p class=\"course-run-needs\"", _html(site, "lessons/m04_fixture/index"))


def run_needs_command(page: Path) -> str:
    """The pip command the page's line beside its download buttons gives."""
    needs = re.search(r'<p class="course-run-needs"[^>]*>(.+?)</p>', page.read_text("utf-8"), re.S)
    assert needs, f"{page} says nothing beside its download buttons"
    codes = [text_of_html(code) for code in re.findall(r"<code[^>]*>(.*?)</code>", needs[1], re.S)]
    commands = [code for code in codes if code.startswith("pip install")]
    assert len(commands) == 1, codes
    return commands[0]


def test_the_download_line_names_what_a_lesson_imports_beyond_the_course():
    """ExecuTorch for M06, NNCF with OpenVINO where a lesson asks ExecuTorch's OpenVINO
    quantizer (M07-3), ONNX, onnxscript and ONNX Runtime for M03-5: a reader who runs the
    page's one command can run the download."""
    from course_links import run_needs

    def line(relative: str) -> str:
        return run_needs("en", [EXAMPLES / "en" / relative])

    assert "executorch==" not in line("m00_graphs/m00_1_getting_a_graph.py")
    m06 = line("m06_executorch/m06_2_lowering_to_executorch.py")
    assert "executorch==" in m06 and "nncf==" not in m06
    m07 = line("m07_your_model/m07_3_every_quantizer.py")
    assert "executorch==" in m07 and "nncf==" in m07 and "openvino==" in m07
    m03 = line("m03_lowering/m03_5_onnx_runtime.py")
    for needed in ("onnx==", "onnxscript==", "onnxruntime=="):
        assert needed in m03, f"{needed} missing from M03-5's line: {m03}"
    assert "onnx==" not in line("m03_lowering/m03_4_shipping.py")


def test_the_download_line_reads_the_common_modules_a_lesson_imports():
    """M07-4 imports only ``common`` and torch itself; its op atlas (``common.atlas``) asks
    ExecuTorch, OpenVINO's quantizer and ``torch.compile``: the line names them all. M00-1's
    closure holds none of them."""
    from common.digest import _imported_modules

    from course_links import run_needs
    from course_sources import common_closure

    script = EXAMPLES / "en" / "m07_your_model" / "m07_4_op_atlas.py"
    imported = {name.split(".")[0] for name in _imported_modules(script.read_text("utf-8"))}
    assert not imported & {"executorch", "openvino", "nncf"}, "only through common"
    closure = {p.relative_to(ROOT / "common").as_posix() for p in common_closure(script)}
    assert {"atlas/run.py", "backends/xnnpack/runs.py"} <= closure, sorted(closure)
    line = run_needs("en", [script])
    for needed in ("executorch==", "nncf==", "openvino==", "g++"):
        assert needed in line, f"{needed} missing from M07-4's line: {line}"
    first = run_needs("en", [EXAMPLES / "en" / "m00_graphs" / "m00_1_getting_a_graph.py"])
    assert "executorch" not in first and "g++" not in first, first


def files_under(folder: Path) -> dict[str, tuple]:
    """Every file, folder and link under ``folder`` with its size and modification time."""
    found = {}
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(parent, name)
            info = path.lstat()
            size = None if path.is_dir() and not path.is_symlink() else info.st_size
            found[path.relative_to(folder).as_posix()] = (size, info.st_mtime_ns)
    return found


def installed_run_key(files: list[Path], *parts: str) -> str:
    """What a run in a fresh virtualenv depends on: the package as committed (it is
    pip-installed from a clone of HEAD), the downloaded scripts and the pictures they are
    compared with (``files``), this test and the runner, the stack, and ``parts``."""
    from course_sources import inputs_digest

    committed = subprocess.run(
        ["git", "rev-parse", "HEAD:common", "HEAD:pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    here = [Path(__file__), RUNNER, Path(lesson_scripts.__file__)]
    return inputs_digest([*files, *here], "installed", committed, *parts)


@pytest.mark.xdist_group("site")
def test_a_readers_machine_runs_the_downloads_after_their_pages_pip_commands(
    site, tmp_path, record_property
):
    """A reader's machine: a fresh virtualenv, M00-1's page command (the course alone), the
    downloaded M00-1; then the command beside M06-3's downloads (ExecuTorch added), the downloaded
    M03-4 and M06-3 (``INSTALLED_LESSONS``), run from a folder of their own. Each runs with its
    exercise solutions and draws its page's pictures (but M06-3, whose page is drawn in
    ``m06_executorch/``: ``drawn_alike_in_any_folder``); the course's cache goes to the per-user
    cache folder (common.cache.cache_folder), nothing lands beside the installed package.

    There is no GitHub here, so the commands install from a clone of this repository's HEAD (a
    committed state) instead of COURSE_REPOSITORY. One virtualenv for both commands, as on a
    reader's machine: torch is installed once. Cost: about 150 s on 2 cores, pip installing torch
    and ExecuTorch from local wheels, M03-4's AOTInductor packages and M06-3's lowering (nothing
    cached but the trained weights); not run again while what it depends on is that of a run
    that passed (as a reader run).
    """
    from course_links import run_needs

    first = VIRTUALENV_LESSON.stem
    page = site / "en" / "lessons" / VIRTUALENV_LESSON.with_suffix(".html")
    command = run_needs_command(page)
    assert command == f'pip install "pt2e-course @ git+{course_conf.COURSE_REPOSITORY}"'
    downloaded = sorted((site / "en" / "_downloads").glob(f"*/{first}.py"))
    assert downloaded, f"the site offers no {first}.py"
    caching = [EXAMPLES / "en" / relative for relative in INSTALLED_LESSONS]
    second = re.search(r"``(pip install [^`]+)``", run_needs("en", caching))[1]
    pictures = [
        picture
        for relative in (VIRTUALENV_LESSON, *INSTALLED_LESSONS)
        if drawn_alike_in_any_folder(relative)
        for picture in page_pictures(site / "en" / "lessons", relative)
    ]  # the build's, as assert_drew_the_sites_pictures reads them
    key = installed_run_key([downloaded[0], *caching, *pictures], command, second)
    if passed_before(key):
        record_property("reader_run", "kept")  # conftest.py counts them in the summary
        return

    clone = tmp_path / "pt2e-course"
    subprocess.run(["git", "clone", "-q", "--no-local", str(ROOT), str(clone)], check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")

    def pip_install(command: str) -> None:
        """The page's command, run by the virtualenv's own pip (its first word is "pip"); a file
        URL with a host: pip 23's requirement parser refuses "git+file:///path"."""
        command = command.replace(course_conf.COURSE_REPOSITORY, f"file://localhost{clone}")
        done = subprocess.run(
            [python, "-m", *shlex.split(command), "-q"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    home = tmp_path / "home"  # the reader's: their per-user cache lands there
    # Not PYTHONPATH: a checkout on it would hand the virtualenv this repository's common/.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(home / ".cache"), MPLCONFIGDIR=str(home / "mpl"))

    def run_the_download(script: Path, relative: Path) -> None:
        """As a reader runs it, then its exercise solutions; its pictures are its page's."""
        ran = tmp_path / "ran" / relative.stem
        ran.mkdir(parents=True)
        run_as_a_reader(python, Path(shutil.copy(script, ran)), ran, env=env)
        if drawn_alike_in_any_folder(relative):  # else compared in the course's folder
            assert_drew_the_sites_pictures(ran, "en", relative)

    # Where the course is not installed the download stops at its first import (the failure
    # the page's line is there to prevent; it also shows this test can fail).
    bare = subprocess.run([python, downloaded[0]], cwd=tmp_path, capture_output=True, text=True)
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr, bare.stderr[-2000:]
    pip_install(command)
    installed = files_under(venv)
    run_the_download(downloaded[0], VIRTUALENV_LESSON)
    assert files_under(venv) == installed, "M00-1 wrote under the virtualenv"

    pip_install(second)
    installed = files_under(venv)
    # The trained weights the site's build kept (their keys are the same in an installed
    # course): training is not what this test is about, where the cache lands is.
    trained = home / ".cache" / "pt2e-course" / "weights"
    trained.mkdir(parents=True, exist_ok=True)
    for weights in (ROOT / "build" / "cache" / "weights").glob("*.pt"):
        shutil.copy(weights, trained)
    for script, relative in zip(caching, INSTALLED_LESSONS, strict=True):
        run_the_download(script, relative)  # a download is the lesson's file as in examples/
    after = files_under(venv)
    written = sorted(path for path in after if after[path] != installed.get(path))
    assert not written, f"the lessons wrote under the virtualenv: {written[:20]}"
    kept = home / ".cache" / "pt2e-course"
    assert list(kept.glob("executorch/m06_3-conv_net-*/model.pte")), "M06-3's .pte is kept"
    assert list(kept.glob("aoti/*.pt2")), "M03-4's packages are kept"
    remember_pass(key)
    record_property("reader_run", "ran")
