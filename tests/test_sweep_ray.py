"""`diffmeter sweep --ray`: cells as Ray tasks on a local instance, results shipped back, a lost worker's cell rerun,
and Ray missing named as its extra."""

import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from sweep_executors import FAST, stored
from test_sweep import corrupt_folder

from diffmeter.errors import DiffmeterError
from diffmeter.runs.storage import read_result
from diffmeter.sweep.file import SweepFile
from diffmeter.sweep.run import run_sweep


def ray_cell_folder(cmdline: list[str]) -> str | None:
    """The scratch folder of a cell a Ray worker started (``ray_executor.run_on_node``), or None for any other
    process: a local sweep's cell of another test beside this one has its parent in the xdist worker, which must
    not be killed."""
    if "diffmeter.sweep.cell" not in cmdline:
        return None
    _, out, _ = cmdline[cmdline.index("diffmeter.sweep.cell") + 1 :]  # NAME OUT PARENT_PID (sweep/cell.py)
    return out if Path(out).name.startswith("diffmeter-cell-") else None


def is_ray_cell(cmdline: list[str]) -> bool:
    return ray_cell_folder(cmdline) is not None


@pytest.mark.slow
def test_the_ray_executor_runs_cells_as_tasks_and_ships_results_back(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'diffmeter[ray]')")
    from diffmeter.sweep.ray_executor import RayExecutor  # imports Ray past amdsmi's import-time failure

    broken = corrupt_folder(tmp_path)
    out = tmp_path / "out"
    sweep = SweepFile(name="cluster", axes={"model": ["tiny-sd", str(broken)]}, fixed=FAST)
    seen, watching = [], threading.Event()

    def count_cells():  # CPU cells time on every core: Ray ran two at once on this 2-core instance
        # counted by scratch folder, one per cell: a process the cell starts shows the cell's command line between
        # its fork and its exec, which a process count once took for a second cell (CI, stop 76)
        while not watching.is_set():
            folders = {ray_cell_folder(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])}
            seen.append(len(folders - {None}))
            time.sleep(0.05)

    try:
        executor = RayExecutor(out, "auto", num_cpus=2)
        threading.Thread(target=count_cells, daemon=True).start()
        record = run_sweep(sweep, out, executor, here=False)
        watching.set()
        assert max(seen) == 1, "two CPU cells ran at once on one node"
        assert [cell.status for cell in record.cells] == ["done", "failed"]
        assert "Ray cluster" in record.executor and all("pid" in cell.where for cell in record.cells)
        runs = stored(out)
        assert sorted(run["status"] for run in runs.values()) == ["complete", "failed"]
        (complete,) = [name for name, run in runs.items() if run["status"] == "complete"]
        assert read_result(out / complete).summary.iterations == 1 and (out / complete / "bench.log").is_file()
        # the driver's OMP_NUM_THREADS, not Ray's (the task's CPUs, which every rank of a parallel cell then ran)
        variables = read_result(out / complete).environment.variables
        assert variables.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")
        resumed = run_sweep(sweep, out, executor, here=False)
        assert [cell.status for cell in resumed.cells] == ["skipped", "failed"]
        # CUDA cells on a cluster without a GPU: refused before any runs, where Ray would wait for such a node for
        # ever, and failed results of cells that never ran (asking to "lower the parallel degrees" of one-GPU cells)
        # would stay in the study
        wide = SweepFile(
            name="wide", axes={"model": ["tiny-flux"], "ulysses_degree": [1, 2]}, fixed={**FAST, "device": "cuda"}
        )
        before = set(stored(out))
        with pytest.raises(DiffmeterError, match="cells of this sweep run on CUDA .* the Ray cluster has no GPU"):
            run_sweep(wide, out, executor, here=False)
        assert set(stored(out)) == before

        killed = []

        def kill_the_worker_once():  # a lost node, as far as one machine can show it: its worker dies mid-cell
            deadline = time.monotonic() + 300
            while not killed and time.monotonic() < deadline:
                for process in psutil.process_iter(["cmdline"]):
                    if is_ray_cell(process.info["cmdline"] or []):
                        worker = process.parent()
                        if is_ray_cell(worker.cmdline()):  # a process the cell started: the worker is a step up
                            worker = worker.parent()
                        worker.kill()
                        killed.append(worker.pid)
                        return
                time.sleep(0.05)

        threading.Thread(target=kill_the_worker_once, daemon=True).start()
        lost = SweepFile(name="lost", axes={"model": ["tiny-sd"], "steps": [2]}, fixed=FAST)
        (cell,) = run_sweep(lost, out, executor, here=False).cells
        assert killed and cell.status == "done" and str(killed[0]) not in cell.where  # rerun by another worker
    finally:
        sys.modules["ray"].shutdown()


def test_ray_missing_is_one_line_naming_the_extra(tmp_path, cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    code, _, err = cli("sweep", "--model", "tiny-sd", "--steps", "1", "--out", tmp_path, "--ray", "auto")
    assert code == 2 and "pip install 'diffmeter[ray]'" in err and len(err.strip().splitlines()) == 1
