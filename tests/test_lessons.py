"""Every lesson has a twin with identical code, and runs as a plain script in both languages."""

import ast
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ALL_LESSONS, EXAMPLES, LANGUAGES, exercise_solutions, lessons


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


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "relative"), ALL_LESSONS, ids=lambda v: str(v))
def test_lesson_runs_as_a_plain_script(lang, relative, tmp_path):
    script = EXAMPLES / lang / relative
    env = {**os.environ, "PT2E_COURSE_DRAW_DIR": str(tmp_path)}
    # Run from an unrelated folder: the lesson must find common through the installed package.
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stderr[-3000:]}"
    assert result.stderr == "", f"{script} wrote to stderr:\n{result.stderr[-3000:]}"
    assert list(tmp_path.glob("*.svg")), f"{script} drew no picture"


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


# Runs a lesson as __main__ in a fresh interpreter, then its exercise solutions in its namespace.
RUN_WITH_SOLUTIONS = """
import json, runpy, sys
script, solutions = sys.argv[1], json.loads(sys.argv[2])
namespace = runpy.run_path(script, run_name="__main__")
for number, code in enumerate(solutions, 1):
    exec(compile(code, f"{script} (solution {number})", "exec"), namespace)
"""

WITH_SOLUTIONS = [
    (lang, path) for lang, path in ALL_LESSONS if exercise_solutions(EXAMPLES / lang / path)
]


@pytest.mark.parametrize("relative", lessons("en"), ids=str)
def test_twins_have_identical_solutions(relative):
    reference = exercise_solutions(EXAMPLES / "en" / relative)
    for lang in LANGUAGES:
        twin = exercise_solutions(EXAMPLES / lang / relative)
        assert [code_only_text(c) for c in twin] == [code_only_text(c) for c in reference], (
            f"{lang} and en exercise solutions differ in {relative}"
        )


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "relative"), WITH_SOLUTIONS, ids=lambda v: str(v))
def test_exercise_solutions_pass(lang, relative, tmp_path):
    script = EXAMPLES / lang / relative
    solutions = exercise_solutions(script)
    env = {**os.environ, "PT2E_COURSE_DRAW_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", RUN_WITH_SOLUTIONS, str(script), json.dumps(solutions)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"a solution of {script} failed:\n{result.stderr[-3000:]}"


def test_solutions_are_found(tmp_path):
    lesson = tmp_path / "m09_1_x.py"
    lesson.write_text(
        "x = 1\n# %%\n# Exercises\n# ---------\n# 1. Double it.\n#\n"
        "# .. dropdown:: Solution\n#\n#    .. code-block:: python\n#\n"
        "#       y = 2 * x\n#       assert y == 2\n#\n# 2. Next.\nprint(x)\n"
    )
    assert exercise_solutions(lesson) == ["y = 2 * x\nassert y == 2\n"]


@pytest.mark.parametrize(("lang", "relative"), ALL_LESSONS, ids=lambda v: str(v))
def test_every_lesson_ends_with_two_or_three_exercises_with_solutions(lang, relative):
    # test_exercise_solutions_pass runs every solution found here, so a lesson passes both
    # only when it has exercises and each of their solutions ran.
    found = len(exercise_solutions(EXAMPLES / lang / relative))
    assert 2 <= found <= 3, (
        f"examples/{lang}/{relative} has {found} exercise solutions; a lesson ends with 2–3"
        " exercises, each with a solution in a dropdown (README, 'Adding a lesson')"
    )
