"""nox sessions: build the site, run the tests, lint (nox -l lists them)."""

import hashlib
import json
import os
import sys
import time
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "docs"))
from site_build import build_site  # noqa: E402

BUILD = ROOT / "build" / "html"
PYTHON = "3.11"
STAMP = ".pt2e-course-installed"  # in a session's virtualenv: what install() installed

nox.options.sessions = ["docs", "tests", "lint"]
nox.options.reuse_venv = "yes"  # torch is large; a second run must not reinstall it


def install(session: nox.Session, extras: str, venv: Path | None = None) -> None:
    """pip install -e .[extras] into the session's virtualenv (or ``venv``), skipped when
    pyproject.toml has not changed since it was last done there."""
    venv = venv or Path(session.virtualenv.location)
    if installed(venv, extras):
        return
    # torch is pinned exactly in pyproject.toml; pip (not uv) finds the local CPU wheel.
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-e", f".[{extras}]"]
    session.run(*pip, external=True)
    (venv / f"{STAMP}-{extras}").write_text(_wanted(extras))


def installed(venv: Path, extras: str) -> bool:
    """Whether install(session, extras) has installed this pyproject.toml into ``venv``."""
    stamp = venv / f"{STAMP}-{extras}"
    return stamp.exists() and stamp.read_text() == _wanted(extras)


def _wanted(extras: str) -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the site in both languages into build/html (args go to sphinx-build;
    ``-- --lesson m07_4`` runs that lesson's twins alone and leaves every other page as it was)."""
    install(session, "docs")
    started = time.perf_counter()
    args, lessons = lesson_option(session.posargs)
    if lessons:  # read by docs/course_conf.py (sphinx-gallery's filename_pattern, the re-runs)
        os.environ["PT2E_COURSE_LESSON"] = lessons
    # Both languages at once, then the site root (index.html, 404.html, sitemap.xml).
    results = build_site(str(Path(session.bin) / "python"), BUILD, args)
    for lang, (_, output) in results.items():
        if output.strip():
            print(f"--- sphinx-build {lang} ---\n{output.rstrip()}", flush=True)
    failed = [lang for lang, (code, _) in results.items() if code]
    if failed:
        session.error(f"the {', '.join(failed)} build failed; its messages are printed above")
    session.log(f"site built in {time.perf_counter() - started:.1f} s: {BUILD / 'index.html'}")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite: common's unit tests, twin parity, every lesson as a script."""
    # The tests run in nox -s docs's virtualenv when it is installed: one install of torch,
    # ExecuTorch and OpenVINO instead of two (a minute or more on a fresh machine), and the
    # site the tests build is built by the interpreter that built it before, so neither
    # command rewrites every page after the other (tests/built_site.py, SITE_PYTHON).
    docs_venv = Path(session.virtualenv.location).with_name("docs")
    venv = docs_venv if installed(docs_venv, "docs") else Path(session.virtualenv.location)
    install(session, "docs,test", venv)
    install_axe(session)
    python = str(venv / "bin" / "python")
    path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {"PT2E_COURSE_SITE_PYTHON": python, "VIRTUAL_ENV": str(venv), "PATH": path}
    session.run(python, "-m", "pytest", *session.posargs, env=env, external=True)


def lesson_option(args: list[str]) -> tuple[list[str], str]:
    """``args`` without ``--lesson NAME`` (or ``--lesson=NAME``), and the names it gave.

    >>> lesson_option(["--lesson", "m07_4", "-v"])
    (['-v'], 'm07_4')
    """
    rest, names = [], []
    args = list(args)
    while args:
        arg = args.pop(0)
        if arg == "--lesson" and args:
            names.append(args.pop(0))
        elif arg.startswith("--lesson="):
            names.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest, ",".join(names)


def install_axe(session: nox.Session) -> None:
    """npm ci: axe-core (pinned in package-lock.json) for the browser tests' a11y checks."""
    with open(ROOT / "package.json", "rb") as f:
        wanted = json.load(f)["devDependencies"]["axe-core"]
    installed = ROOT / "node_modules" / "axe-core" / "package.json"
    if installed.exists() and json.loads(installed.read_text())["version"] == wanted:
        return
    session.run("npm", "ci", "--no-audit", "--no-fund", external=True)


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Measure build, rebuild, test and drawing costs; writes benchmarks/RESULTS.md."""
    install(session, "docs,test,bench")
    session.run("python", "benchmarks/bench.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Check style with ruff (lint and format)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        ruff = tomllib.load(f)["project"]["optional-dependencies"]["lint"]
    session.install(*ruff)  # the pin lives in pyproject.toml; the course itself is not needed
    session.run("ruff", "check", *session.posargs)
    session.run("ruff", "format", "--check", *session.posargs)
