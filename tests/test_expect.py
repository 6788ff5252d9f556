"""common.expect: expect_error shows an expected error as its type and first line."""

import pytest

from common.expect import expect_error


def test_the_error_is_printed_as_its_type_and_first_line_and_kept(capsys):
    with expect_error(ValueError, match="second") as caught:
        raise ValueError("first line\nsecond line")
    assert capsys.readouterr().out == "ValueError: first line\n"
    assert isinstance(caught.error, ValueError) and caught.message == "first line"


def test_a_tuple_of_types_is_accepted_and_named_when_nothing_is_raised(capsys):
    with expect_error((KeyError, IndexError)):
        [][0]
    assert capsys.readouterr().out.startswith("IndexError: ")
    with pytest.raises(AssertionError, match="expected KeyError or IndexError, but nothing"):
        with expect_error((KeyError, IndexError)):
            pass


def test_a_message_without_the_match_fails_and_chains_the_error():
    with pytest.raises(AssertionError, match=r"does not contain 'nope'") as info:
        with expect_error(ValueError, match="nope"):
            raise ValueError("something else")
    assert isinstance(info.value.__cause__, ValueError)


def test_an_error_of_another_type_propagates_unchanged():
    with pytest.raises(KeyError, match="key"):
        with expect_error(ValueError):
            raise KeyError("key")


def test_an_empty_message_gives_an_empty_first_line(capsys):
    with expect_error(RuntimeError) as caught:
        raise RuntimeError
    assert caught.message == "" and capsys.readouterr().out == "RuntimeError: \n"
