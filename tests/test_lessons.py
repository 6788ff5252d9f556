"""Every lesson has a twin with identical code, and runs as a plain script in both languages."""

import ast
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from lesson_scripts import (
    ALL_LESSONS,
    EXAMPLES,
    INSTALLED_LESSONS,
    NOTEBOOK_LESSON,
    RUNNER,
    VIRTUALENV_LESSON,
    assert_drew_the_sites_pictures,
    build_measurements,
    drawn_alike_in_any_folder,
    exercise_solutions,
    lessons,
    passed_before,
    reader_run_key,
    remember_pass,
    run_as_a_reader,
)

from site_facts import LANGUAGES


def code_only(path) -> str:
    """The lesson's AST with docstrings and all string constants blanked; comments are gone."""
    return code_only_text(path.read_text(encoding="utf-8"))


def code_only_text(code: str) -> str:
    """The AST of ``code`` with all string constants blanked (comments are not in it)."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
        elif isinstance(node, ast.JoinedStr):  # f-strings: keep the expressions, drop the text
            node.values = [v for v in node.values if not isinstance(v, ast.Constant)]
    return ast.dump(tree)


def test_there_are_lessons():
    assert lessons("en"), "no lesson found under examples/en"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_lesson_has_a_twin(lang):
    others = [other for other in LANGUAGES if other != lang]
    for other in others:
        missing = set(lessons(lang)) - set(lessons(other))
        assert not missing, f"in examples/{lang} but not in examples/{other}: {sorted(missing)}"


@pytest.mark.parametrize("relative", lessons("en"), ids=str)
def test_twins_have_identical_code(relative):
    reference = code_only(EXAMPLES / "en" / relative)
    for lang in LANGUAGES:
        twin = EXAMPLES / lang / relative
        assert twin.exists(), f"{twin} is missing"
        assert code_only(twin) == reference, f"{lang} and en code differ in {relative}"


def test_parity_check_sees_code_changes(tmp_path):
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text('x = 1\nprint(f"a {x}")  # note\n')
    two.write_text('x = 1\nprint(f"甲 {x}")\n')
    assert code_only(one) == code_only(two)
    two.write_text('x = 2\nprint(f"a {x}")\n')
    assert code_only(one) != code_only(two)


# A reader runs a lesson with `python lesson.py`. Each lesson runs so once, in one language (the
# twins' code is identical, and so are their solutions): the Chinese one, whose output is the less
# ASCII of the two; then its solutions, and its pictures must be its page's.
READER_LANGUAGE = "zh_TW"

# The lessons whose numbers or prose depend on the CPU's int8 and float kernels. The site build
# runs them on this CPU's own path; where that path is stronger than AVX2 (VNNI, AMX), their
# reader run is capped at AVX2, so a sentence that holds only on one CPU fails one of the two.
CPU_DEPENDENT = {
    "m03_lowering/m03_1_lowered_graph.py",
    "m03_lowering/m03_3_speed_and_size.py",
    "m04_accuracy/m04_1_measuring_the_error.py",
    "m04_accuracy/m04_2_fixing_it.py",
    "m04_accuracy/m04_3_qat.py",
    "m04_accuracy/m04_4_qat_real_architecture.py",
}


def kernel_cap(relative: Path) -> str | None:
    """The ISA a lesson's reader run is capped at, or None for this CPU's own path."""
    from common.cpu import weaker_paths

    return "AVX2" if str(relative) in CPU_DEPENDENT and "AVX2" in weaker_paths() else None


def test_every_cpu_dependent_lesson_exists():
    for relative in CPU_DEPENDENT:
        assert (EXAMPLES / READER_LANGUAGE / relative).exists(), relative


@pytest.mark.slow
@pytest.mark.parametrize(
    "relative",
    [
        pytest.param(r, marks=[pytest.mark.isa] if str(r) in CPU_DEPENDENT else [])
        for r in lessons(READER_LANGUAGE)
        if r not in (NOTEBOOK_LESSON, VIRTUALENV_LESSON)  # run elsewhere (lesson_scripts.py)
        and (r not in INSTALLED_LESSONS or not drawn_alike_in_any_folder(r))
    ],
    ids=str,
)
def test_lesson_runs_as_a_reader_runs_it_with_its_solutions(
    relative, tmp_path, site, record_property
):
    cap = kernel_cap(relative)
    key = reader_run_key(READER_LANGUAGE, relative, cap)
    if passed_before(key):
        record_property("reader_run", "kept")  # conftest.py counts them in the summary
        return
    script = EXAMPLES / READER_LANGUAGE / relative
    # The build's figures: its timings on this CPU's own path, its run_under_isa answers on any
    measured = build_measurements(READER_LANGUAGE, relative, tmp_path / "kept")
    run_as_a_reader(
        sys.executable,
        script,
        tmp_path,
        env=dict(os.environ),
        cap=cap,
        measured=measured,
        patterns=True,  # exported once per run, as in the build: 15-20 s less for M07-1, M07-3
    )
    if not cap:  # float kernels round differently under a cap: other qparams in the tooltips
        assert_drew_the_sites_pictures(tmp_path, READER_LANGUAGE, relative)
    remember_pass(key)
    record_property("reader_run", "ran")


def test_the_folders_that_draw_without_a_guards_node_are_those_the_tests_name(tmp_path):
    """``drawn_alike_in_any_folder`` says of a lesson's path what ``torch.export``'s ``.module()``
    does when called from a file at that path: a ``_guards_fn`` node in the graph, or none."""
    code = (
        "import torch\n"
        "program = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))\n"
        "graph = program.module().graph\n"
        "guarded = bool(graph.find_nodes(op='call_module', target='_guards_fn'))\n"
    )
    for relative in (
        Path("m03_lowering/m03_4_shipping.py"),
        Path("m06_executorch/m06_3_pte_inside_out.py"),
        Path("troubleshooting/m99_5_executorch_and_xnnpack.py"),
    ):
        script = tmp_path / relative
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(code)
        guarded = runpy.run_path(str(script))["guarded"]
        assert guarded == drawn_alike_in_any_folder(relative), relative


def test_a_reader_runs_key_changes_with_what_the_run_depends_on(monkeypatch):
    """An edit of the lesson, of a common module it imports, or another cap runs it again;
    an edit of a module outside its imports does not."""
    import course_sources

    relative = Path("m00_graphs/m00_2_node_anatomy.py")
    key = reader_run_key("en", relative, None)
    assert reader_run_key("en", relative, "AVX2") != key
    closure = course_sources.common_closure(EXAMPLES / "en" / relative)
    outside = EXAMPLES.parent / "common" / "atlas" / "entries.py"
    assert closure and outside not in closure
    real_read = Path.read_bytes

    def edited(target):
        return lambda self: real_read(self) + (b"#" if self == target else b"")

    monkeypatch.setattr(Path, "read_bytes", edited(EXAMPLES / "en" / relative))
    assert reader_run_key("en", relative, None) != key
    monkeypatch.setattr(Path, "read_bytes", edited(closure[-1]))
    assert reader_run_key("en", relative, None) != key
    monkeypatch.setattr(Path, "read_bytes", edited(outside))
    assert reader_run_key("en", relative, None) == key


def glossary(lang: str) -> list[tuple[list[str], str]]:
    """(terms, lesson number) per entry of docs/<lang>/glossary.md that names a lesson."""
    text = (EXAMPLES.parent / "docs" / lang / "glossary.md").read_text(encoding="utf-8")
    entries, terms = [], []
    for block in re.findall(r"```\{glossary\}\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("  "):  # the definition closes the entry's term lines
                number = re.search(r"\{lesson\}`(M\d\d-\d+)`", line)
                if number:
                    entries.append((terms, number[1]))
                terms = []
            elif line.strip():
                terms.append(line.strip())
    return entries


def squeezed(text: str) -> str:
    """Lower case without comment marks, spaces, '_' or '-': "erase node" matches ``erase_node``
    and a term that wraps onto the next comment line."""
    text = re.sub(r"^\s*# ?", "", text, flags=re.MULTILINE)
    return re.sub(r"[\s_\-]", "", text.lower())


@pytest.mark.parametrize("lang", LANGUAGES)
def test_each_glossary_term_is_used_by_the_lesson_that_introduces_it(lang):
    scripts = {
        f"M{m[1]}-{m[2]}": EXAMPLES / lang / path
        for path in lessons(lang)
        if (m := re.match(r"m(\d\d)_(\d+)_", path.name))
    }
    entries = glossary(lang)
    assert len(entries) >= 40
    unused = [
        f"{terms[0]} ({number})"
        for terms, number in entries
        if number not in scripts
        or not any(squeezed(t) in squeezed(scripts[number].read_text("utf-8")) for t in terms)
    ]
    assert not unused, f"glossary terms their lesson never uses: {unused}"


@pytest.mark.parametrize("relative", lessons("en"), ids=str)
def test_twins_have_identical_solutions(relative):
    reference = exercise_solutions(EXAMPLES / "en" / relative)
    for lang in LANGUAGES:
        twin = exercise_solutions(EXAMPLES / lang / relative)
        assert [code_only_text(c) for c in twin] == [code_only_text(c) for c in reference], (
            f"{lang} and en exercise solutions differ in {relative}"
        )


def test_solutions_are_found(tmp_path):
    lesson = tmp_path / "m09_1_x.py"
    lesson.write_text(
        "x = 1\n# %%\n# Exercises\n# ---------\n# 1. Double it.\n#\n"
        "# .. dropdown:: Solution\n#\n#    .. code-block:: python\n#\n"
        "#       y = 2 * x\n#       assert y == 2\n#\n# 2. Next.\nprint(x)\n"
    )
    assert exercise_solutions(lesson) == ["y = 2 * x\nassert y == 2\n"]


def test_the_reader_runner_runs_the_solutions_in_the_lessons_namespace(tmp_path):
    """tests/run_lesson.py, which run_as_a_reader starts: the lesson as ``python lesson.py``
    (``__main__``, its folder first on sys.path), then each solution; a failing one fails it."""
    lesson = tmp_path / "m09_1_x.py"
    lesson.write_text(
        "import sys\nx = 1\nassert __name__ == '__main__' and sys.argv == [__file__]\n"
    )
    (tmp_path / "beside.py").write_text("NAME = 'beside'\n")
    ran = tmp_path / "ran"
    ran.mkdir()

    def run(*solutions):
        job = json.dumps([str(lesson), list(solutions), None])
        command = [sys.executable, str(RUNNER)]
        return subprocess.run(command, input=job, cwd=ran, capture_output=True, text=True)

    assert run("from beside import NAME\nassert (x, NAME) == (1, 'beside')").returncode == 0
    failed = run("y = 2 * x", "assert y == 3, 'y is 2'")
    assert failed.returncode != 0 and "(solution 2)" in failed.stderr, failed.stderr


def test_the_reader_runner_exports_torchaos_pattern_graphs_once_when_asked(tmp_path):
    """With the docs folder in the job, the torchao modules a lesson imports take the build's
    caching pattern exporter (docs/pattern_graphs.py); without it, torchao's own."""
    lesson = tmp_path / "m09_1_x.py"
    lesson.write_text(
        "from torchao.quantization.pt2e import qat_utils\n"
        "print(hasattr(qat_utils._get_aten_graph_module_for_pattern, 'exported'))\n"
    )

    def run(patterns):
        job = json.dumps([str(lesson), [], None, None, patterns])
        command = [sys.executable, str(RUNNER)]
        done = subprocess.run(command, input=job, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run(str(EXAMPLES.parent / "docs")) == "True"
    assert run(None) == "False"


def test_the_reader_runner_reads_what_the_build_measured_and_measures_what_it_did_not(tmp_path):
    """Given ``measured``, a lesson's ``measured_once`` reads the build's figure for its key and
    measures a key the build did not keep; without it, it measures (a reader's own timing)."""
    lesson = tmp_path / "m09_1_x.py"
    lesson.write_text(
        "from common.cache import measured_once\n"
        "kept = measured_once('kept', lambda: 'measured')\n"
        "new = measured_once('new', lambda: 'measured')\n"
        "print(kept, new)\n"
    )
    (tmp_path / "kept" / "inputs").mkdir(parents=True)
    (tmp_path / "kept" / "inputs" / "kept.json").write_text('"the build\'s"')
    figures = {
        "lang": "en",
        "name": "m09_1_x",
        "folder": str(tmp_path / "kept"),
        "inputs": "inputs",
    }

    def run(measured):
        job = json.dumps([str(lesson), [], None, measured])
        # a lock file of the build's turns left open would warn at exit (a lesson may show it)
        command = [sys.executable, "-W", "default::ResourceWarning", str(RUNNER)]
        done = subprocess.run(command, input=job, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return done.stdout.strip()

    assert run(figures) == "the build's measured"
    assert run(None) == "measured measured"


# The quickstart (examples/<lang>/quickstart/) runs the whole flow on one page and sends the
# reader to the lesson behind each step; it teaches no one idea to practise: no exercises.
# Troubleshooting pages (examples/<lang>/troubleshooting/) are indexes of errors, one entry per
# message, not lessons that teach one idea: they end without exercises (their entries' asserts
# are checked by tests/test_troubleshooting.py).
WITH_EXERCISES = [
    (lang, path)
    for lang, path in ALL_LESSONS
    if path.parts[0] not in ("quickstart", "troubleshooting")
]


@pytest.mark.parametrize(("lang", "relative"), WITH_EXERCISES, ids=lambda v: str(v))
def test_every_lesson_ends_with_two_or_three_exercises_with_solutions(lang, relative):
    # test_exercise_solutions_pass runs every solution found here, so a lesson passes both
    # only when it has exercises and each of their solutions ran.
    found = len(exercise_solutions(EXAMPLES / lang / relative))
    assert 2 <= found <= 3, (
        f"examples/{lang}/{relative} has {found} exercise solutions; a lesson ends with 2–3"
        " exercises, each with a solution in a dropdown (README, 'Adding a lesson')"
    )
