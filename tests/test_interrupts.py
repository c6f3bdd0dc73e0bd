"""Ctrl-C, as a terminal sends it: exit 130, one line, and nothing staged left behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


def _start(*args: str, cwd: Path) -> subprocess.Popen:
    """The command as a terminal starts it: Ctrl-C's SIGINT at its default (a suite started in the background
    by a shell without job control inherits SIGINT ignored, and Python then keeps ignoring it)."""
    return subprocess.Popen(
        ["diffmeter", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt(process: subprocess.Popen) -> tuple[int, str]:
    """SIGINT to the whole process group (workers too), as Ctrl-C in a terminal does."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return process.returncode, err


def _wait_for(condition, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out waiting for the run to start"
        time.sleep(0.2)


def test_ctrl_c_during_a_measured_run_exits_130_and_leaves_nothing_staged(tmp_path):
    out = tmp_path / "out"
    process = _start("bench", "tiny-sd", "--steps", "20", "--iterations", "100000", "--out", str(out), cwd=tmp_path)
    _wait_for(lambda: any(out.glob(".*partial*/images/*.png")), process)  # measuring: images are being saved
    code, err = _interrupt(process)
    assert code == 130, err
    *before, last = err.strip().splitlines()
    assert last == "interrupted: nothing was stored for the unfinished run"
    # before it, only progress (a plain line every 30 s: stderr is no terminal here), no traceback
    assert all(re.fullmatch(r"[\w ]+: \d+ of \d+ \(\d+ s\)", line) for line in before), before
    assert not out.exists()  # the folder it made for the result, left empty, is removed with the staged run


def test_ctrl_c_during_parallel_profiles_exits_130_with_one_line(tmp_path):
    process = _start("profile", "--all", "--jobs", "2", cwd=tmp_path)
    time.sleep(8)  # imports done, workers counting
    assert process.poll() is None, "profile --all finished before the interrupt"
    code, err = _interrupt(process)
    assert code == 130 and "Traceback" not in err
    assert err.strip().splitlines() == ["interrupted: nothing was stored for the unfinished run"]


def test_ctrl_c_during_a_ladder_keeps_and_names_the_finished_rungs(tmp_path):
    """Interrupted in its compile rung (compiling takes a while on a CPU), a ladder says which rungs it kept and
    that a rerun resumes; with its output not on a terminal it said nothing at all until then: now a line a rung."""
    out = tmp_path / "out"
    process = _start(
        "ladder", "tiny-sd", "--rungs", "compile", "--steps", "2", "--iterations", "2", "--out", str(out), cwd=tmp_path
    )
    _wait_for(lambda: any(out.glob("*/results.json")), process)  # the baseline is stored
    time.sleep(1)
    code, err = _interrupt(process)
    assert code == 130 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("ladder: rung 1 of 2 (baseline) done: median")
    assert any(line.strip().startswith("baseline: median") and "stored in" in line for line in lines)
    assert "kept: 1 finished rung(s)" in err and "run the same command again to resume" in err
    (baseline,) = out.glob("*/results.json")
    assert baseline.exists() and not list(out.glob(".*partial*"))


def test_ctrl_c_during_a_sweep_says_the_finished_cells_are_kept_and_how_to_resume(tmp_path):
    """An interrupted sweep said only 'nothing was stored for the unfinished run' (a new user's trial): it also says
    the finished cells are stored and that the same command resumes, and the finished cell is there."""
    out = tmp_path / "out"
    args = ("sweep", "--model", "tiny-sd", "--steps", "1,1000", "--iterations", "1", "--out", str(out))
    process = _start(*args, cwd=tmp_path)
    _wait_for(lambda: any(out.glob("*/results.json")), process)  # the 1-step cell is stored; the other runs
    time.sleep(1)
    code, err = _interrupt(process)
    assert code == 130 and "Traceback" not in err, err
    assert " ".join(err.split()).endswith(
        "interrupted: nothing was stored for the unfinished run; the cells that finished are stored: the same command "
        "again resumes the sweep"
    )
    (finished,) = out.glob("*/results.json")
    assert finished.exists() and not list(out.glob(".*partial*"))
