"""`diffmeter sweep`: the dry run, cells in their own processes (a cell that raises, one killed by a signal, one
past its timeout), resume after the sweep is killed, the batch-size search (the sweep file's expansion and
refusals: test_sweep_file.py; the Ray executor: test_sweep_ray.py)."""

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from sweep_executors import FAST, InProcessExecutor, stored

from diffmeter.catalog import resolve
from diffmeter.runs.prepared import prepare
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS, read_result
from diffmeter.sweep.file import SweepFile
from diffmeter.sweep.local import Job, LocalExecutor, Outcome
from diffmeter.sweep.run import job_of, run_sweep
from diffmeter.tiny import tiny_pipeline


def corrupt_folder(tmp_path: Path) -> Path:
    """A saved tiny SD pipeline whose UNet weights are garbage: found on disk, fails when loaded."""
    folder = tmp_path / "broken-sd"
    tiny_pipeline(resolve("tiny-sd")).save_pretrained(folder)
    (weights,) = (folder / "unet").glob("*.safetensors")
    weights.write_bytes(b"not a safetensors file")
    return folder


def test_the_dry_run_shows_each_cell_done_refused_or_to_run_with_its_compute(tmp_path, cli):
    from diffmeter.flops.profile import profile
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    out = tmp_path / "out"
    bench(BenchSpec(model="tiny-sd", batch_size=2, **FAST), out=out)
    study = tmp_path / "study.yaml"
    study.write_text(
        "axes:\n  model: [tiny-sd]\n  batch_size: [1, 2]\n  optimizations: ['', first-block-cache]\n"
        f"fixed: {json.dumps(FAST)}\n"
    )
    code, text, _ = cli("sweep", study, "--out", out, "--dry-run", "--json")
    assert code == 0
    cells = json.loads(text)
    assert [(c["values"]["batch_size"], c["values"]["optimizations"], c["status"]) for c in cells] == [
        (1, "", "to run"),
        (1, "first-block-cache", "refused"),
        (2, "", "done"),
        (2, "first-block-cache", "refused"),
    ]
    assert "UNet2DConditionModel has no diffusers cache hooks" in cells[1]["reason"]
    assert cells[2]["tflops_per_call"] == profile("tiny-sd", steps=1, batch_size=2).total_flops / 1e12
    code, text, _ = cli("sweep", study, "--out", out, "--dry-run")
    assert code == 0 and "refused" in text and "GFLOPs" in text
    assert len(stored(out)) == 1  # nothing ran


def test_a_cell_whose_prompts_file_cannot_be_read_is_refused_in_the_plan(tmp_path, cli):
    """It was planned "to run", loaded its weights, then failed: refused before anything loads, as a bad LoRA is."""
    study = tmp_path / "study.yaml"
    study.write_text(f"axes: {{model: [tiny-sd]}}\nfixed: {{prompts_file: {tmp_path / 'missing.txt'}}}\n")
    code, text, _ = cli("sweep", study, "--out", tmp_path / "out", "--dry-run", "--json")
    (cell,) = json.loads(text)
    assert code == 0 and cell["status"] == "refused"
    assert "cannot read prompts file" in cell["reason"] and "No such file or directory" in cell["reason"]


def test_the_dry_run_shows_the_compute_of_a_cell_refused_for_missing_weights(tmp_path, cli, monkeypatch):
    """The compute needs no weights: a cell refused for them still shows its offline profile's FLOPs."""
    from huggingface_hub import constants

    from diffmeter.flops.profile import profile

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))  # sd15's weights are not here
    study = tmp_path / "study.yaml"
    study.write_text("axes: {model: [sd15]}\nfixed: {steps: 2, height: 256}\n")
    code, text, _ = cli("sweep", study, "--out", tmp_path / "out", "--dry-run", "--json")
    (cell,) = json.loads(text)
    assert code == 0 and cell["status"] == "refused" and "hf download" in cell["reason"]
    assert cell["tflops_per_call"] == profile("sd15", steps=2, height=256).total_flops / 1e12


@pytest.mark.slow
def test_cells_run_in_their_own_processes_and_a_failing_cell_is_stored_failed(tmp_path, cli):
    """One cell loads a corrupt checkpoint and raises; the other completes; a rerun skips both
    and --retry-failed runs the failed one again."""
    earlier = {child.pid for child in psutil.Process().children()}  # other tests' processes are not this one's
    broken = corrupt_folder(tmp_path)
    out = tmp_path / "out"
    study = tmp_path / "study.yaml"
    study.write_text(f"name: mixed\naxes:\n  model: [tiny-sd, '{broken}']\nfixed: {json.dumps(FAST)}\n")
    code, text, _ = cli("sweep", study, "--out", out)
    assert code == 1  # a failed cell: the sweep finished, and says so
    runs = stored(out)
    assert sorted(run["status"] for run in runs.values()) == ["complete", "failed"]
    (failed,) = [run for run in runs.values() if run["status"] == "failed"]
    assert "exited with code 2 without a result" in failed["error"] and "safetensors" in failed["error"].lower()
    from diffmeter.report.results_table import reason_line

    # the one-line reason the summary and `table` show is the error the cell's output ends on, not its preamble
    said = reason_line(failed["error"])
    assert said.startswith("the cell's process exited with code 2") and "safetensors" in said.lower().split(":")[-1]
    code_table, shown, _ = cli("table", out)
    joined = "".join(shown.split())  # the caption wraps where it will
    assert code_table == 0 and "failed," in joined and said.replace(" ", "") in joined
    record = json.loads((out / "sweep-mixed.json").read_text())
    assert [cell["status"] for cell in record["cells"]] == ["done", "failed"]
    code_show, _, err = cli("show", out / "sweep-mixed.json")  # a record, not a broken run to re-run
    assert code_show == 2 and "is a sweep's record, not a run: `diffmeter table" in " ".join(err.split())
    left = [child for child in psutil.Process().children() if child.pid not in earlier]
    assert not left, [(child.pid, child.name(), child.status()) for child in left]  # no cell process left

    before = {name: (out / name / RESULTS).read_bytes() for name in runs}
    code, text, _ = cli("sweep", study, "--out", out)
    assert code == 1 and {name: (out / name / RESULTS).read_bytes() for name in runs} == before
    assert [c["status"] for c in json.loads((out / "sweep-mixed.json").read_text())["cells"]] == ["skipped", "failed"]
    code, text, _ = cli("sweep", study, "--out", out, "--retry-failed")
    assert code == 1 and stored(out).keys() == runs.keys()
    (name,) = [name for name, run in runs.items() if run["status"] == "failed"]
    retried = json.loads((out / name / RESULTS).read_text())
    assert retried["status"] == "failed" and retried["created_utc"] > failed["created_utc"]  # run again, stored anew
    assert (out / next(n for n in runs if n != name) / RESULTS).read_bytes() == before[
        next(n for n in runs if n != name)
    ]


def test_a_cell_past_its_timeout_is_stopped_and_stored_failed(tmp_path):
    out = tmp_path / "out"
    sweep = SweepFile(name="slow", axes={"model": ["tiny-sd"]}, fixed=FAST, timeout_s=1.0)
    record = run_sweep(sweep, out, LocalExecutor(out, slots=[None], timeout_s=sweep.timeout_s))
    (cell,) = record.cells
    assert cell.status == "failed" and "timeout" in cell.reason
    (run,) = stored(out).values()
    assert run["status"] == "failed" and "stopped at the sweep's per-cell timeout" in run["error"]


def test_a_cell_whose_baseline_failed_is_failed_with_its_reason_not_run(tmp_path):
    """A cell comparing against a baseline that failed would measure that baseline again inside its own cell
    (a new user's sweep spent its timeout so): it is stored failed, quoting the baseline, and never started."""
    ran = []

    class BaselineCrashes(LocalExecutor):
        def run_cell(self, job, slot):
            ran.append(job.name)
            return Outcome(1, "RuntimeError: the baseline's loader broke", 0.1)

    out = tmp_path / "out"
    fixed = {**FAST, "save_images": True, "compare_baseline": True}
    sweep = SweepFile(name="base", axes={"model": ["tiny-sd"], "optimizations": [[], ["fuse-qkv"]]}, fixed=fixed)
    record = run_sweep(sweep, out, BaselineCrashes(out, slots=[None]))
    assert len(ran) == 1 and "opt-" not in ran[0]  # the baseline ran; the cell needing it did not
    optimized = next(cell for cell in record.cells if cell.values["optimizations"])
    assert optimized.status == "failed" and f"its baseline {ran[0]} did not complete" in optimized.reason
    assert "exited with code 1" in optimized.reason and "--retry-failed" in optimized.reason
    assert stored(out)[optimized.folder]["error"] == optimized.reason


def test_no_cell_starts_after_an_interrupt(tmp_path):
    """A Ctrl-C while a cell runs (here: raised by ``finished``, as the sweep's main thread gets it) stops the
    sweep: the worker that freed up started the next cell at once, which then ran to the end beside an
    "interrupted" message (a new user's trial with `timeout -s INT`). Cells run as recorded calls here: whether a
    next one starts is the executor's decision alone."""
    ran = []

    class Recorded(LocalExecutor):
        def run_cell(self, job, slot):
            ran.append(job.name)
            time.sleep(0.2)
            return Outcome(0, "", 0.2)

    def interrupt(job, outcome):
        raise KeyboardInterrupt

    jobs = [Job(spec=BenchSpec(model="tiny-sd"), name=f"cell-{index}") for index in range(3)]
    with pytest.raises(KeyboardInterrupt):
        Recorded(tmp_path, slots=[None]).map(jobs, lambda job: None, interrupt)
    time.sleep(0.5)  # a cell started by a worker would be recorded by now
    assert ran == ["cell-0"]


def test_a_cell_stored_before_ctrl_c_reached_the_sweep_is_recorded_done(tmp_path):
    """Ctrl-C after a cell stored its result but before the sweep heard of it left the cell "pending" in the sweep's
    record (a new user's trial: results.json at 08:18:31, the record rewritten at 08:18:33 still pending)."""

    class StoredThenStopped(InProcessExecutor):
        def map(self, jobs, started, finished):
            from diffmeter.runs.lifecycle import bench

            if not jobs:  # the phase of baselines: none here
                return
            bench(jobs[0].spec, out=self.out)
            raise KeyboardInterrupt  # the cell's process ended with its result stored; the sweep is stopped

    out = tmp_path / "out"
    sweep = SweepFile(name="stopped", axes={"model": ["tiny-sd"], "batch_size": [1, 2]}, fixed=FAST)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, out, StoredThenStopped(out))
    cells = json.loads((out / "sweep-stopped.json").read_text())["cells"]
    assert [cell["status"] for cell in cells] == ["done", "pending"]


def test_a_parallel_cell_gets_a_gpu_per_process_and_no_gpu_is_shared(tmp_path):
    """A parallel cell on CUDA (ulysses 2: 2 processes) was given one GPU slot, so its ranks found 1 GPU visible
    and the cell failed though the machine had more. Each cell now takes as many free slots as it needs GPUs, in
    order, and gives them back when it ends. Cells run as recorded calls (no GPU here)."""
    ran, lock = [], threading.Lock()
    busy: set[str] = set()

    class Recorded(LocalExecutor):
        def run_cell(self, job, slots):
            with lock:
                assert not busy & set(slots), f"{job.name} given a GPU in use: {slots}"
                busy.update(slots)
                ran.append((job.name, list(slots)))
            time.sleep(0.1)
            with lock:
                busy.difference_update(slots)
            return Outcome(0, "", 0.1)

    parallel = BenchSpec(model="tiny-flux", device="cuda", ulysses_degree=2)
    assert job_of(prepare(parallel, here=False)).gpus == 2
    assert job_of(prepare(BenchSpec(model="tiny-flux", device="cuda"), here=False)).gpus == 1
    assert job_of(prepare(BenchSpec(model="tiny-flux", device="cpu", ulysses_degree=2), here=False)).gpus == 0
    needs = {"a": 2, "b": 1, "c": 2, "d": 3, "e": 1}
    jobs = [Job(spec=parallel, name=name, gpus=gpus) for name, gpus in needs.items()]
    finished = []
    Recorded(tmp_path, slots=["0", "1", "2"]).map(jobs, lambda job: None, lambda job, _: finished.append(job.name))
    assert [name for name, _ in ran] == list(needs) and sorted(finished) == sorted(needs)
    assert {name: len(slots) for name, slots in ran} == needs
    assert all(len(set(slots)) == len(slots) for _, slots in ran)


@pytest.mark.slow
def test_a_parallel_cell_is_compared_with_its_one_device_cell(tmp_path):
    """Cells of one sweep at ulysses 2 and 1: the one-device cell runs first (listed second), so the parallel one
    finds it stored and names it as its scaling's reference (it ran first and said there was none)."""
    out = tmp_path / "out"
    fixed = {**FAST, "model": "tiny-flux"}
    sweep = SweepFile(name="scaling", axes={"ulysses_degree": [2, 1]}, fixed=fixed)
    record = run_sweep(sweep, out, LocalExecutor(out, slots=[None]))
    assert [cell.status for cell in record.cells] == ["done", "done"]
    parallel, single = (read_result(out / cell.folder) for cell in record.cells)
    assert parallel.parallel.scaling.one_device_run == record.cells[1].folder
    assert single.created_utc <= parallel.created_utc


@pytest.mark.slow
def test_a_cell_killed_by_a_signal_is_stored_failed_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "out"
    sweep = SweepFile(name="crash", axes={"model": ["tiny-sd"], "steps": [1, 2]}, fixed=FAST)
    executor = LocalExecutor(out, slots=[None])
    killed = []

    def kill_first_cell():  # a segfault cannot be provoked on purpose in a healthy run: deliver its signal
        while not killed:
            for child in psutil.Process().children(recursive=True):
                if "diffmeter.sweep.cell" in " ".join(child.cmdline()):
                    child.send_signal(signal.SIGSEGV)
                    killed.append(child.pid)
                    return
            time.sleep(0.05)

    threading.Thread(target=kill_first_cell, daemon=True).start()
    record = run_sweep(sweep, out, executor)
    assert killed and [cell.status for cell in record.cells] == ["failed", "done"]
    assert "killed by SIGSEGV" in record.cells[0].reason
    assert sorted(run["status"] for run in stored(out).values()) == ["complete", "failed"]


@pytest.mark.slow
def test_a_cell_killed_mid_run_keeps_its_log_and_its_failure_quotes_it(tmp_path):
    """A cell killed while measuring logged what it did to bench.log in its staged folder: its stored failure
    quotes that log's last lines and keeps the whole log, which storing the failure would remove."""
    out = tmp_path / "out"
    sweep = SweepFile(name="killed", axes={"model": ["tiny-sd"]}, fixed={**FAST, "iterations": 100000})
    killed = []

    def kill_measuring_cell():
        while not killed:
            for log in out.glob(".*.partial-*/bench.log"):
                if "first call" in log.read_text():
                    (cell,) = [c for c in psutil.Process().children(recursive=True) if is_cell_of(c.cmdline(), out)]
                    cell.send_signal(signal.SIGKILL)
                    killed.append(log.read_text())
                    return
            time.sleep(0.05)

    threading.Thread(target=kill_measuring_cell, daemon=True).start()
    record = run_sweep(sweep, out, LocalExecutor(out, slots=[None]))
    (cell,) = record.cells
    assert killed and cell.status == "failed" and "killed by SIGKILL" in cell.reason
    assert "the last lines of its bench.log:" in cell.reason and "first call" in cell.reason
    (folder,) = out.glob("model-*")
    assert read_result(folder).error == cell.reason and (folder / "bench.log").read_text().startswith(killed[0])
    assert not list(out.glob(".*.partial-*"))
    (stored_cell,) = json.loads((out / "sweep-killed.json").read_text())["cells"]  # its compute named as a count
    assert (
        "tflops" not in stored_cell and stored_cell["tflops_per_call"] == read_result(folder).profile.total_flops / 1e12
    )


def is_cell_of(cmdline: list[str], out: Path) -> bool:
    """Whether a process is a cell of the sweep writing to ``out`` (other tests' sweeps may run beside this one)."""
    return "diffmeter.sweep.cell" in cmdline and str(out) in cmdline


@pytest.mark.slow
def test_killing_the_sweep_at_a_random_moment_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-c", "from diffmeter.cli import main; main()", "sweep", "--model", "tiny-sd"]
    command += ["--steps", "1,2,3", "--iterations", "1", "--device", "cpu", "--out", str(out)]
    log = tmp_path / "sweep.log"
    with log.open("wb") as output:
        sweep = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900  # a loaded 2-core CI machine runs the other tests' processes beside it
    while not stored(out) and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stored(out), f"no cell stored a result (sweep exit code {sweep.poll()}):\n{log.read_text()[-2000:]}"
    time.sleep(random.uniform(0.0, 3.0))  # somewhere in the second cell (or the third)
    sweep.kill()
    sweep.wait()
    time.sleep(1.0)
    cells = [p for p in psutil.process_iter(["cmdline"]) if is_cell_of(p.info["cmdline"] or [], out)]
    assert not cells, "a cell outlived the sweep that started it"
    survivors = {name: (out / name / RESULTS).read_bytes() for name in stored(out)}
    assert 1 <= len(survivors) <= 3

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    runs = stored(out)
    assert len(runs) == 3 and all(run["status"] == "complete" for run in runs.values())
    assert sorted(run["spec"]["steps"] for run in runs.values()) == [1, 2, 3]  # each cell once
    assert {name: (out / name / RESULTS).read_bytes() for name in survivors} == survivors  # kept, not rerun
    assert not [path for path in out.iterdir() if ".partial-" in path.name]
    # the killed cell's spec file, left by the sweep killed before removing it, was its rerun's and is gone
    assert not list((out / ".sweep" / "logs").glob("*.json"))
    record = json.loads((out / "sweep-command-line.json").read_text())
    assert sorted(cell["status"] for cell in record["cells"]) == sorted(
        ["skipped"] * len(survivors) + ["done"] * (3 - len(survivors))
    )


def test_batch_size_auto_doubles_until_out_of_memory_and_records_the_largest_that_fit(tmp_path):
    out = tmp_path / "out"
    sweep = SweepFile(name="search", axes={"model": ["tiny-sd"], "batch_size": ["auto"]}, fixed=FAST)
    executor = InProcessExecutor(out, fits=2)
    (cell,) = run_sweep(sweep, out, executor).cells
    assert executor.batches == [1, 2, 4]
    assert cell.status == "done" and cell.largest_batch == 2 and cell.batches_tried == [1, 2, 4]
    assert read_result(out / cell.folder).spec.batch_size == 2
    assert sorted((r["spec"]["batch_size"], r["status"]) for r in stored(out).values()) == [
        (1, "complete"),
        (2, "complete"),
        (4, "failed"),
    ]
    resumed = InProcessExecutor(out, fits=2)
    (again,) = run_sweep(sweep, out, resumed).cells
    assert resumed.batches == [] and again.largest_batch == 2  # every batch tried was stored
    limited = SweepFile(name="cap", axes={"model": ["tiny-sd"], "batch_size": ["auto"]}, fixed=FAST, batch_limit=2)
    (capped,) = run_sweep(limited, out, InProcessExecutor(out, fits=64)).cells
    assert capped.largest_batch == 2 and "raise batch_limit" in capped.reason


def test_a_sweep_whose_every_cell_is_refused_fails_and_suggests_nothing(tmp_path, cli):
    """Nothing measured is not a success: one line, exit 2, and no `diffmeter table` hint that would then fail."""
    study = tmp_path / "study.yaml"
    study.write_text(
        "name: nothing\naxes:\n  optimizations: [offload, 'sdpa-kernel:kernel=cudnn']\n"
        f"fixed: {json.dumps({**FAST, 'model': 'tiny-sd', 'device': 'cpu'})}\n"
    )
    code, out, err = cli("sweep", study, "--out", tmp_path / "out")
    assert code == 2 and "all 2 cells of sweep 'nothing' were refused" in err and "Traceback" not in err
    assert "refused" in out and "diffmeter table" not in out
    assert (tmp_path / "out" / "sweep-nothing.json").exists()  # the record keeps the reasons


def test_a_sweep_into_a_folder_it_cannot_write_is_one_line(cli):
    """--out /proc/x: a new user's sweep ended in a FileNotFoundError traceback where bench says one line."""
    code, _, err = cli("sweep", "--model", "tiny-sd", "--steps", "1", "--out", "/proc/diffmeter-sweep")
    assert code == 2 and err.startswith("error: cannot write results under /proc/diffmeter-sweep: ")
    assert len(err.strip().splitlines()) == 1
