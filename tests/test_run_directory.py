"""A run's folder when two runs of the same settings write into one --out at once: neither deletes the other's
staged folder, and the later one does not replace the earlier one's result without --force."""

import subprocess
import sys

import pytest

from diffmeter.errors import DiffmeterError
from diffmeter.runs.prepared import prepare, result_fields
from diffmeter.runs.results import BenchResult
from diffmeter.runs.run_directory import RunDirectory
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS, read_result


def test_a_staged_folder_whose_run_still_runs_is_kept_and_a_dead_runs_is_cleared(tmp_path):
    """A new user's second `bench` of the same settings removed the first one's staged folder while it ran: the
    first then failed writing results.json, "name a file in an existing folder"."""
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        live = tmp_path / f".run.partial-{running.pid}"
        dead = tmp_path / f".run.partial-{int(finished.stdout)}"
        live.mkdir()
        dead.mkdir()
        staging = RunDirectory(tmp_path, "run").open()
        assert live.is_dir() and not dead.exists() and staging.is_dir()
    finally:
        running.kill()
        running.wait()


def test_a_result_stored_meanwhile_is_not_replaced_without_force(tmp_path):
    run = prepare(BenchSpec(model="tiny-sd", steps=1, device="cpu"))
    first, second = RunDirectory(tmp_path, run.name), RunDirectory(tmp_path, run.name)
    first.open()
    second.open()  # both checked before either stored
    first.commit(BenchResult(status="failed", error="the first run's", **result_fields(run)))
    with pytest.raises(DiffmeterError, match="another run of the same settings stored a result at .* --force"):
        second.commit(BenchResult(status="failed", error="the second run's", **result_fields(run)))
    assert read_result(tmp_path / run.name).error == "the first run's"
    forced = RunDirectory(tmp_path, run.name, force=True)
    forced.open()
    forced.commit(BenchResult(status="failed", error="a forced run's", **result_fields(run)))
    assert read_result(tmp_path / run.name).error == "a forced run's" and (tmp_path / run.name / RESULTS).is_file()
