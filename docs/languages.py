"""The course's languages, listed once: docs builds, nox sessions and tests import this."""

# Folder name (under examples/ and docs/, and in the built site) -> Sphinx language code.
LANGUAGES = {"zh_TW": "zh_TW", "en": "en"}
