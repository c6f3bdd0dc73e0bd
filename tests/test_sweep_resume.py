"""Resuming a sweep: a stored cell or baseline measured otherwise than the sweep now asks is refused, or measured
again with ``remeasure``; one stored as asked is skipped."""

import pytest
from sweep_executors import FAST, InProcessExecutor, stored

from diffmeter.errors import DiffmeterError
from diffmeter.runs.spec import BenchSpec
from diffmeter.sweep.file import SweepFile
from diffmeter.sweep.run import run_sweep


def test_a_stored_cell_measured_otherwise_is_refused_or_measured_again_never_kept_as_asked(tmp_path):
    """A new user's resumed sweep asked 8 calls per cell where 4 were stored: every cell was "skipped" and the
    record stated 8. A stored cell or baseline measured otherwise (its iterations here) refuses the sweep in one
    line before anything runs, or with ``remeasure`` is measured again; stored as asked, it is skipped."""
    from diffmeter.runs.lifecycle import bench

    out = tmp_path / "out"
    bench(BenchSpec(model="tiny-sd", **FAST), out=out)  # the baseline, one call
    asked = {**FAST, "iterations": 2, "save_images": True, "compare_baseline": True}
    sweep = SweepFile(name="more", axes={"model": ["tiny-sd"], "optimizations": [["fuse-qkv"]]}, fixed=asked)
    executor = InProcessExecutor(out)
    with pytest.raises(DiffmeterError, match="1 stored run in .* was measured otherwise") as refused:
        run_sweep(sweep, out, executor)
    assert "the baseline of tiny-sd: stored measured otherwise: iterations 1 -> 2" in str(refused.value)
    assert "--remeasure" in str(refused.value) and executor.ran == [] and not list(out.glob("sweep-*.json"))
    record = run_sweep(sweep, out, executor, remeasure=True)
    assert len(executor.ran) == 2 and "opt-" not in executor.ran[0]  # the baseline again, then the cell
    assert {run["spec"]["iterations"] for run in stored(out).values()} == {2}
    assert [cell.status for cell in record.cells] == ["done"]
    again = run_sweep(sweep, out, executor)  # stored as asked: nothing runs
    assert len(executor.ran) == 2 and [cell.status for cell in again.cells] == ["skipped"]
    fewer = sweep.model_copy(update={"fixed": {**asked, "iterations": 1}})
    with pytest.raises(DiffmeterError, match="2 stored runs in .* were measured otherwise .* and 1 more"):
        run_sweep(fewer, out, executor)
    both = fewer.model_copy(update={"axes": {**fewer.axes, "optimizations": [[], ["fuse-qkv"]]}})
    with pytest.raises(DiffmeterError, match="2 stored runs in"):  # the baseline is a cell too: said once
        run_sweep(both, out, executor)


def test_a_compared_sweeps_cell_without_techniques_is_its_own_baseline_and_resumes(tmp_path):
    """A new user's sweep with compare_baseline and a cell without techniques, stopped after that cell, refused its
    own rerun: that cell is the other cells' baseline, asked compared as a cell and not as a baseline. With nothing to
    compare it is settled as not compared, so the rerun runs the rest and the next one skips every cell."""
    out = tmp_path / "out"
    asked = {**FAST, "save_images": True, "compare_baseline": True}
    sweep = SweepFile(name="compared", axes={"model": ["tiny-sd"], "optimizations": [[], ["fuse-qkv"]]}, fixed=asked)
    executor = InProcessExecutor(out)
    first = sweep.model_copy(update={"axes": {**sweep.axes, "optimizations": [[]]}})  # stopped after that cell
    assert [cell.status for cell in run_sweep(first, out, executor).cells] == ["done"]
    record = run_sweep(sweep, out, executor)
    assert [cell.status for cell in record.cells] == ["skipped", "done"] and len(executor.ran) == 2
    again = run_sweep(sweep, out, executor)
    assert [cell.status for cell in again.cells] == ["skipped", "skipped"] and len(executor.ran) == 2
    baseline = next(run for name, run in stored(out).items() if "opt-" not in name)
    assert baseline["spec"]["compare_baseline"] is False


def test_a_skipped_cell_keeps_the_time_and_machine_its_run_recorded(tmp_path):
    """A resumed sweep rewrote its record with the cells it skipped at seconds and where null: when and where each
    was measured was lost (a new user's trial). They are carried over from the earlier record."""
    out = tmp_path / "out"
    sweep = SweepFile(name="kept", axes={"model": ["tiny-sd"], "batch_size": [1]}, fixed=FAST)
    (done,) = run_sweep(sweep, out, InProcessExecutor(out)).cells
    assert done.status == "done" and done.where == "this machine" and done.seconds is not None
    (skipped,) = run_sweep(sweep, out, InProcessExecutor(out)).cells
    assert skipped.status == "skipped" and (skipped.seconds, skipped.where) == (done.seconds, done.where)
