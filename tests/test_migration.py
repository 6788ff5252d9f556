"""The migration map (common/migration.py): every row's old import does what the map says on the
pinned stack, its new import works, and the troubleshooting page m99_6 shows the row in both
languages with a link to a lesson that exists.

The imports run inside the tests (``attempt``), never at collection: a test that quantizes
nothing must not load torchao (tests/test_fixtures.py).
"""

import importlib.util

import pytest
from lesson_scripts import EXAMPLES, lessons

from common.migration import MOVES, Move, attempt, move

from site_facts import LANGUAGES

PAGE = "troubleshooting/m99_6_migration_map.py"
ROWS = [pytest.param(row, id=row.api) for row in MOVES]


def installed(row: Move) -> None:
    """Fail, not skip: a row whose packages are missing would otherwise pass unchecked."""
    missing = [name for name in row.needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(
            f"{row.api} needs {', '.join(missing)}, pinned in pyproject.toml's docs extra: "
            "pip install -e '.[docs,test]' (nox -s tests does)"
        )


def test_rows_have_distinct_names_and_move_finds_them():
    assert len({row.api for row in MOVES}) == len(MOVES)
    assert all(move(row.api) is row for row in MOVES)
    with pytest.raises(KeyError, match="one of: export_for_training"):
        move("quantize_pt2e")


@pytest.mark.parametrize("row", ROWS)
def test_the_old_import_does_what_the_map_says(row):
    installed(row)
    assert attempt(row.old)[1] == row.old_result


@pytest.mark.parametrize("row", ROWS)
def test_the_new_import_works(row):
    installed(row)
    assert attempt(row.new)[1] == ""


@pytest.mark.parametrize("row", [r for r in ROWS if not r.values[0].old_result])
def test_an_old_import_that_still_works_binds_other_objects(row):
    old, _ = attempt(row.old)
    new, _ = attempt(row.new)
    for name in old.keys() & new.keys():
        assert old[name] is not new[name], f"{name}: the old home gives the new object"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_page_shows_every_row_and_links_its_lesson(lang):
    text = (EXAMPLES / lang / PAGE).read_text(encoding="utf-8")
    labels = {f"sphx_glr_lessons_{p.parent.name}_{p.stem}.py" for p in lessons(lang)}
    for row in MOVES:
        assert f'"{row.api}"' in text, f"{lang}: no entry runs the row {row.api!r}"
        assert row.lesson in labels, f"{row.api}: {row.lesson} is no lesson"
        assert row.lesson in text, f"{lang}: {row.api}: no link to {row.lesson}"
        module = row.new.split()[1]
        assert f"from {module} import" in text, f"{lang}: the page never imports from {module}"


def test_to_edge_then_to_backend_logs_its_deprecation_and_one_call_does_not(caplog):
    """The row whose old import still works: the old two calls log XNNPACK's deprecation,
    ``to_edge_transform_and_lower`` lowers without it (m99_6 runs both)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    row = move("to_edge, to_backend")
    old, _ = attempt(row.old)
    new, _ = attempt(row.new)
    linear = torch.nn.Linear(4, 2).eval()

    def program():
        return torch.export.export(linear, (torch.randn(1, 4),))

    with caplog.at_level("WARNING"):
        old["to_edge"](program()).to_backend(XnnpackPartitioner())
    assert "deprecated 'to_edge() + to_backend()' workflow" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        new["to_edge_transform_and_lower"](program(), partitioner=[XnnpackPartitioner()])
    assert "to_backend" not in caplog.text
