"""Figures a lesson publishes for the landing page, written only while the site is built."""

import json

from common.lesson import publish_figure

__all__ = ["publish"]


def publish(name: str, value) -> None:
    """Publish a figure a lesson printed, for the landing page of the build that ran it.

    While the site is built, ``value`` goes to the running lesson's file under ``name``
    (``build/results/<lang>/<lesson>.json``, ``common.lesson.publish_figure``); the landing
    page's ``course-results`` directive reads it there. A file whose content would not change
    is left as it is (Sphinx reads the landing page again when the file changes).

    Args:
        name: what the figure is, e.g. ``"int8_speedup_compiled"``.
        value: a number, string, list or dict of them (JSON); floats must be finite.

    Raises:
        TypeError: if ``value`` is not JSON (e.g. a tensor: publish ``float(t)`` instead).
        ValueError: if ``value`` holds NaN or infinity.

    >>> publish("answer", 42)  # the site is not being built: nothing is written
    """
    try:
        text = json.dumps(value, allow_nan=False)
    except TypeError:
        raise TypeError(
            f"publish({name!r}, ...) needs a number, string, list or dict, not "
            f"{type(value).__name__}; convert it first, e.g. float(value)"
        ) from None
    except ValueError:
        raise ValueError(f"publish({name!r}, ...) got NaN or infinity: {value!r}") from None
    publish_figure(name, json.loads(text))
