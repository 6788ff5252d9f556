"""Show an expected error in a lesson, shaped like ``pytest.raises``."""

from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Caught", "expect_error"]


@dataclass
class Caught:
    """What :func:`expect_error` caught: the exception and the first line of its message."""

    error: BaseException | None = None
    message: str = ""


@contextmanager
def expect_error(expected: type[BaseException] | tuple = Exception, *, match: str | None = None):
    """Run a block that must raise ``expected``; print ``TypeName: first line`` of the error.

    A lesson shows a failure this way without a traceback on the page, and the build fails
    when the failure stops happening.

    Args:
        expected: the exception type (or a tuple of types) the block must raise.
        match: a piece of text the error message must contain.

    Yields:
        Caught: filled in when the block has raised.

    Raises:
        AssertionError: if the block raises nothing, or a message without ``match``.
        BaseException: an error of another type than ``expected`` propagates unchanged.

    >>> with expect_error(ZeroDivisionError, match="by zero") as caught:
    ...     1 / 0
    ZeroDivisionError: division by zero
    >>> caught.message
    'division by zero'
    >>> with expect_error(ValueError):
    ...     pass
    Traceback (most recent call last):
    ...
    AssertionError: expected ValueError, but nothing was raised
    """
    caught = Caught()
    try:
        yield caught
    except expected as error:
        text = str(error).strip()
        caught.error = error
        caught.message = text.splitlines()[0] if text else ""
        print(f"{type(error).__name__}: {caught.message}")
        if match is not None and match not in text:
            raise AssertionError(
                f"{type(error).__name__} was raised, but its message does not contain {match!r}:"
                f" {text[:500]}"
            ) from error
    else:
        names = (
            expected.__name__
            if isinstance(expected, type)
            else " or ".join(t.__name__ for t in expected)
        )
        raise AssertionError(f"expected {names}, but nothing was raised")
