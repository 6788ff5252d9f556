"""The build's CPU turns (common.turns): a timing of one language's build waits for the other
build's lesson, and a build waiting for a figure a timing makes lets it run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lesson_scripts import ROOT

from common import cache, lesson, turns


@pytest.fixture
def stopped():
    yield
    lesson.stop()


def other_build(folder: Path, steps: str) -> subprocess.Popen:
    """A process of the other language's build: it starts a lesson and runs ``steps``,
    printing "working" once its lesson has started."""
    program = (
        "import sys, time\nfrom common import cache, lesson\n"
        f"lesson.start(lang='zh_TW', name='a', measured={str(folder)!r})\n"
        "print('working', flush=True)\n" + steps
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "working"
    return child


def test_a_timing_of_the_build_waits_for_the_other_builds_lesson_and_holds_the_next(
    tmp_path, stopped
):
    with turns.alone():  # a reader's timing runs at once
        pass
    child = other_build(
        tmp_path,
        "time.sleep(1.5)\n"
        f"lesson.start(lang='zh_TW', name='b', measured={str(tmp_path)!r})\n"
        "print(time.time(), flush=True)\n",
    )
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    started = time.monotonic()
    with turns.alone():
        waited = time.monotonic() - started
        time.sleep(0.5)
        ended = time.time()
    resumed = float(child.stdout.readline())
    assert child.wait(timeout=30) == 0
    assert waited > 1.0, "the other build's lesson ran to its end first"
    assert resumed >= ended, "its next lesson started after the timing"


def test_a_build_waiting_for_a_figure_a_timing_makes_lets_it_run(tmp_path, stopped):
    """The other build asks measured_once for the figure being timed: it waits for the entry's
    lock, and pauses meanwhile, or the timing would wait for it until PATIENCE."""
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    child = None

    def timed():
        nonlocal child
        child = other_build(
            tmp_path, "print(cache.measured_once('k', lambda: 0), time.time(), flush=True)\n"
        )
        time.sleep(0.5)  # the other build is now waiting for 'k'
        started = time.monotonic()
        with turns.alone():
            waited = time.monotonic() - started
        return waited

    waited = cache.measured_once("k", timed)
    figure, _ = child.stdout.readline().split()
    assert child.wait(timeout=30) == 0
    assert waited < 5, f"the timing waited {waited:.0f} s for a build that waited for it"
    assert float(figure) == waited, "the other build read the figure measured"


def test_a_timing_waits_for_the_other_builds_next_cell_not_its_whole_lesson(tmp_path, stopped):
    """A long lesson of the other build stops for a waiting timing at its next pause point
    (``let_a_timing_in``: after each cell, before each cache entry) and stays stopped while
    it runs; a reader's call does nothing."""
    turns.let_a_timing_in()  # no build: returns at once
    child = other_build(
        tmp_path,
        "import json\nfrom common import turns\n"
        "beats, end = [], time.time() + 6\n"
        "while time.time() < end:\n"
        "    turns.let_a_timing_in()\n"
        "    beats.append(time.time())\n"
        "    time.sleep(0.05)\n"
        "print(json.dumps(beats), flush=True)\n",
    )
    lesson.start(lang="en", name="m03_3", measured=tmp_path)
    started = time.monotonic()
    with turns.alone():
        waited = time.monotonic() - started
        began = time.time()
        time.sleep(1.0)
        ended = time.time()
    beats = json.loads(child.stdout.readline())
    assert child.wait(timeout=30) == 0
    assert waited < 2, f"the timing waited {waited:.1f} s, as for the end of the lesson"
    assert not [beat for beat in beats if began < beat < ended], "the other build computed"
    assert beats[-1] > ended, "and went on after it"
