"""Build facts listed once: the languages, and how sphinx-build is called (nox and tests)."""

# Folder name (under examples/ and docs/, and in the built site) -> Sphinx language code.
LANGUAGES = {"zh_TW": "zh_TW", "en": "en"}

# Warnings are errors; --keep-going reports all of them before failing.
SPHINX_OPTIONS = ["-b", "html", "-W", "--keep-going", "-q"]
