"""Sphinx configuration of the en site; everything is shared in docs/course_conf.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_conf import make_config

globals().update(make_config("en"))
