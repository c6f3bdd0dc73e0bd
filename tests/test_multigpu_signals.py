"""A parallel run stopped from outside (CPU, gloo, 2 processes): a rank that dies ends the run with a failed result
quoting it; Ctrl-C stops it as a one-process run stops, nothing stored."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from diffmeter.runs.storage import RESULTS, read_result


def _loaded_rank_1(out) -> int | None:
    """The process id of rank 1 once it has loaded the pipeline (from its log)."""
    for log in out.glob(".*partial*/ranks/rank-1/bench.log"):
        text = log.read_text()
        if "loaded and optimized" in text:
            return int(re.search(r"process (\d+)", text).group(1))
    return None


def _signalled_once_loaded(out, send) -> tuple[int, str]:
    """A 2-rank bench of tiny FLUX run in its own session until rank 1 has loaded, then ``send(process, rank 1's
    pid)``: (its exit code, its standard error), the whole session killed should it hang."""
    process = subprocess.Popen(
        ["diffmeter", "bench", "tiny-flux", "--device", "cpu", "--ulysses-degree", "2", "--steps", "50"]
        + ["--iterations", "1000", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while (loaded := _loaded_rank_1(out)) is None:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the ranks did not load"
            time.sleep(0.2)
        send(process, loaded)
        _, err = process.communicate(timeout=120)  # no hang: rank 0 is not left waiting in a collective
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, err


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_rank_that_dies_ends_the_run_with_a_failed_result(tmp_path):
    out = tmp_path / "out"
    code, err = _signalled_once_loaded(out, lambda process, rank_1: os.kill(rank_1, signal.SIGKILL))
    assert code == 2 and "Traceback" not in err
    assert "rank 1 died (killed by signal SIGKILL)" in err
    # what the rank had done (its own log's last line), not a library's warning; nor the resource tracker's leak
    # warning for the killed rank's semaphores
    assert "its log ends: " in err and "loaded and optimized" in err and "Warning" not in err, err
    (stored,) = out.glob(f"*/{RESULTS}")
    result = read_result(stored.parent)
    assert result.status == "failed" and "rank 1 died" in result.error
    assert not list(out.glob(".*partial*"))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_stops_a_parallel_run_with_exit_130_and_stores_nothing(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) once the ranks have loaded: the run stops as a single
    process's does, exit 130 and nothing stored; it was recorded as a failed result, which then refused the same
    command without --force (a new user's finding)."""
    out = tmp_path / "out"
    code, err = _signalled_once_loaded(out, lambda process, _: os.killpg(process.pid, signal.SIGINT))
    assert code == 130 and "Traceback" not in err and "failed" not in err, err
    assert not list(out.glob(f"*/{RESULTS}")) and not list(out.glob(".*partial*"))
