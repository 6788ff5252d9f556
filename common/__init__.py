"""Helpers shared by the pt2e-course lessons: model zoo, export, pictures."""

from importlib import metadata

__all__ = ["SUPPORTED_VERSIONS", "check_versions"]

# Kept equal to the pins in pyproject.toml (a test checks it). The lessons print
# graphs and node names, which change between releases, so other versions are refused.
SUPPORTED_VERSIONS = {"torch": "2.13.0", "torchao": "0.18.0"}


def check_versions(installed=None):
    """Raise ImportError unless the supported torch and torchao are installed.

    Args:
        installed: mapping of distribution name to version; read from the
            environment when omitted (this is for tests).

    Raises:
        ImportError: if torch or torchao is missing or another release than the pinned one;
            the message gives the ``pip install`` command that fixes it.

    >>> check_versions({"torch": "2.13.0+cpu", "torchao": "0.18.0"})
    >>> check_versions({"torch": "2.9.1", "torchao": "0.18.0"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ImportError: pt2e-course needs torch==2.13.0 but torch 2.9.1 is installed; run: pip install ...
    """
    fix = " ".join(f"{name}=={version}" for name, version in SUPPORTED_VERSIONS.items())
    for name, wanted in SUPPORTED_VERSIONS.items():
        if installed is None:
            try:
                found = metadata.version(name)
            except metadata.PackageNotFoundError:
                raise ImportError(
                    f"pt2e-course needs {name}=={wanted} but {name} is not installed; "
                    f"run: pip install {fix}"
                ) from None
        else:
            found = installed[name]
        if found.split("+")[0] != wanted:  # "+cpu" is the build, not the release
            raise ImportError(
                f"pt2e-course needs {name}=={wanted} but {name} {found} is installed; "
                f"run: pip install {fix}"
            )


check_versions()
