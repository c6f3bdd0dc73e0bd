"""`diffmeter compare` and the existing-result check on two real runs whose spec is the same but whose torch
threads differ (OMP_NUM_THREADS=1 against torch's default): what changes speed is said, never "same settings";
the tiny weights and each side's noise notes are carried."""

import json

import pytest
import torch

from diffmeter.errors import DiffmeterError
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.speedups import noise_notes
from diffmeter.runs.storage import read_result

pytestmark = pytest.mark.slow
FAST = {"model": "tiny-sd", "steps": 1, "iterations": 2, "device": "cpu", "predict": False}


def _threads(count: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    return previous


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same spec run with 2 torch threads into a/ and with 1 into b/: one folder name."""
    out = tmp_path_factory.mktemp("threads")
    previous = _threads(2)
    try:
        _, a = bench(BenchSpec(**FAST), out=out / "a")
        torch.set_num_threads(1)
        _, b = bench(BenchSpec(**FAST), out=out / "b")
    finally:
        torch.set_num_threads(previous)
    assert a.name == b.name
    return out, a, b


def test_compare_lists_the_thread_count_among_the_differences(cli, pair):
    _, a, b = pair
    code, out, err = cli("compare", a, b, "--json", "--no-images")
    assert code == 0, err
    (compared,) = json.loads(out)["pairs"]
    assert compared["differences"] == ["torch threads: 2 -> 1"]
    for side, folder in (("a", a), ("b", b)):
        assert compared[f"{side}_weights_random"] is True
        assert compared[f"{side}_weights"] == read_result(folder).weights
    notes = [f"{side}: {note}" for side, folder in (("A", a), ("B", b)) for note in noise_notes(read_result(folder))]
    assert compared["noise"] == notes
    code, shown, _ = cli("compare", a, b, "--no-images")
    lines = [line.strip() for line in shown.splitlines()]
    assert code == 0 and "torch threads: 2 -> 1" in lines and "same settings" not in lines
    assert "weights (A and B): tiny random weights (a test pipeline: timings say nothing about the real model)" in (
        " ".join(shown.split())
    )


def test_a_run_with_other_threads_into_the_same_folder_is_not_called_the_same_run(pair):
    out, a, _ = pair
    previous = _threads(1)
    try:
        with pytest.raises(DiffmeterError, match="already exists") as refused:
            bench(BenchSpec(**FAST), out=out / "a")
    finally:
        torch.set_num_threads(previous)
    message = str(refused.value)
    assert "different torch threads 2 -> 1" in message and "the same settings" not in message, message
    previous = _threads(2)
    try:
        with pytest.raises(DiffmeterError, match=r"already exists.*\(the same settings\)"):
            bench(BenchSpec(**FAST), out=out / "a")
    finally:
        torch.set_num_threads(previous)
