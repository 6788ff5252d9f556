"""Every lesson has a twin with identical code, and runs as a plain script in both languages."""

import ast
import os
import re
import runpy
import subprocess
import sys

import pytest

from conftest import (
    ALL_LESSONS,
    EXAMPLES,
    LANGUAGES,
    ON_THE_PATTERN_WORKER,
    exercise_solutions,
    lessons,
    torch_threads,
)


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


# A reader runs a lesson with `python lesson.py`; one language per lesson is run exactly so (the
# twins' code is identical): the Chinese one, whose output is the less ASCII of the two.
READER_LANGUAGE = "zh_TW"


@pytest.mark.slow
@pytest.mark.parametrize("relative", lessons(READER_LANGUAGE), ids=str)
def test_lesson_runs_as_a_reader_runs_it(relative, tmp_path):
    script = EXAMPLES / READER_LANGUAGE / relative
    env = {**os.environ, **torch_threads(), "PT2E_COURSE_DRAW_DIR": str(tmp_path)}
    # Run from an unrelated folder: the lesson must find common through the installed package.
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stderr[-3000:]}"
    assert result.stderr == "", f"{script} wrote to stderr:\n{result.stderr[-3000:]}"
    assert list(tmp_path.glob("*.svg")), f"{script} drew no picture"


# QAT keeps its BatchNorms until convert_pt2e, which then exports torchao's conv-bn patterns.
EXPORT_BN_PATTERNS = {"m04_3_qat.py"}
IN_PROCESS = [
    pytest.param(
        lang,
        relative,
        id=f"{lang}-{relative}",
        marks=[ON_THE_PATTERN_WORKER] if relative.name in EXPORT_BN_PATTERNS else [],
    )
    for lang, relative in ALL_LESSONS
]


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "relative"), IN_PROCESS)
def test_lesson_and_its_solutions_run(lang, relative, tmp_path, monkeypatch, capfd):
    """Every lesson of both languages as ``__main__``, then its exercise solutions in its namespace.

    In this process (torch is imported once per test worker), as sphinx-gallery runs them.
    """
    script = EXAMPLES / lang / relative
    monkeypatch.setenv("PT2E_COURSE_DRAW_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        namespace = runpy.run_path(str(script), run_name="__main__")
        for number, code in enumerate(exercise_solutions(script), 1):
            exec(compile(code, f"{script} (solution {number})", "exec"), namespace)
    finally:
        forget_lesson_state()
    stderr = capfd.readouterr().err
    assert stderr == "", f"{script} wrote to stderr:\n{stderr[-3000:]}"
    assert list(tmp_path.glob("*.svg")), f"{script} drew no picture"


def forget_lesson_state() -> None:
    """What one lesson leaves behind that the next must not see: charts, compiled graphs."""
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()


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
