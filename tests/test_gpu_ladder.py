"""benchmarks/gpu_ladder.py, the ladder a lent GPU runs, kept from rotting: its self-test runs the same code on
tiny-flux on this CPU (CUDA-only rungs refused with their reasons), a chunk stopped by its time limit keeps its log
and the rungs it finished, a rerun resumes it, and a finished chunk is not rerun."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from gpu_ladder import GRACE  # noqa: E402
from gpu_ladder_rungs import RUNGS  # noqa: E402

pytestmark = pytest.mark.slow


def ladder(results: Path, *arguments):
    command = [sys.executable, str(BENCHMARKS / "gpu_ladder.py"), "--self-test", "--results", str(results)]
    command += ["--chunk", "flux-1", "--chunk", "flux-2", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=1800)


def records(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "gpu_ladder_cpu.jsonl").read_text().splitlines()]


def test_the_self_test_climbs_tiny_flux_resumes_a_stopped_chunk_and_reruns_nothing_finished(tmp_path):
    stopped = ladder(tmp_path, "--chunk-limit", "10")  # flux-1 takes 20 s or more here: stopped inside
    assert stopped.returncode == 1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    first = records(tmp_path)
    chunks = {line["chunk"]: line for line in first if line["kind"] == "chunk"}
    assert chunks["flux-1"]["status"] == "stopped" and 10 <= chunks["flux-1"]["seconds"] < 10 + GRACE + 30
    assert chunks["flux-2"]["status"] == "refused"  # it climbs from flux-1's rungs, which have not all run
    assert "run chunk flux-1 first" in (tmp_path / "gpu_ladder_cpu_runs" / "flux-2.log").read_text()
    assert "flux-1: up to 10.000 s" in stopped.stdout
    assert "stopped" in (tmp_path / "gpu_ladder_cpu_runs" / "flux-1.log").read_text()  # its output kept
    for line in first:  # a rung stopped inside its run keeps that run's bench.log beside the run folders
        if line["kind"] == "rung" and line["status"] == "stopped" and "log" in line:
            assert "interrupted" in Path(line["log"]).read_text()
        elif line["kind"] == "rung" and line["status"] == "stopped" and "folder" in line:  # stopped as it closed
            assert "after its run was stored" in line["reason"] and (Path(line["folder"]) / "results.json").exists()
    finished = {line["rung"] for line in first if line["kind"] == "rung" and line["status"] == "complete"}

    resumed = ladder(tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for rung in finished:
        assert f"flux-dev {rung}: complete at" in resumed.stdout  # reused, not rerun
    lines = [line for line in records(tmp_path) if line["kind"] == "rung"]
    ended = {line["rung"]: line for line in lines if line["status"] != "stopped"}
    assert sorted(ended, key=RUNGS.index) == list(RUNGS) and len(ended) == len(lines) - sum(
        line["status"] == "stopped" for line in lines
    )  # every rung ended once
    assert ended["cuda-graphs"]["status"] == "refused" and "CUDA graphs" in ended["cuda-graphs"]["reason"]
    assert ended["fp8dq"]["status"] == "refused" and "compute capability 8.9" in ended["fp8dq"]["reason"]
    complete = [ended[rung] for rung in RUNGS if ended[rung]["status"] == "complete"]
    assert [line["rung"] for line in complete] == ["eager", "sdpa", "fuse-qkv", "compile", "cache", "distilled"]
    eager = complete[0]
    assert eager["expected_s"] is not None and eager["verdict"] != "not timed" and "miss" in eager
    for line, below in zip(complete[1:], complete, strict=False):
        assert line["below"] == below["rung"] and line["speedup_text"]  # against the rung that ran below it
        assert {"text_encoding", "denoising", "vae_decode"} <= set(line["stages_s"]) and line["peak_memory_bytes"] > 0
        assert line["verdict"] == "not timed" or line["expected_s"] is not None
    assert complete[-1]["model"] == "tiny-flux-schnell" and "images not compared" in complete[-1]["difference"]
    assert complete[1]["identical"] is not None  # lossless rungs on the same model: images compared
    report = (tmp_path / "gpu_ladder_cpu.md").read_text()
    assert "| flux-1 | stopped |" in report and "| flux-1 | complete |" in report
    assert "- fp8dq: refused: torchao cannot be used with tiny-flux" in report

    before = records(tmp_path)
    again = ladder(tmp_path)
    assert (
        again.returncode == 0
        and "chunk flux-1: finished at" in again.stdout
        and "chunk flux-2: finished" in again.stdout
    )
    assert records(tmp_path) == before  # nothing ran, nothing recorded


def test_a_stop_that_comes_after_the_run_stored_names_its_folder_and_one_before_keeps_the_log(tmp_path):
    from gpu_ladder_rungs import Journal, stopped
    from gpu_runs import KeptLog

    from diffmeter.runs.lifecycle import MeasuredRun
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec(model="tiny-flux", device="cpu", steps=2, warmup=1, iterations=1, predict=False)
    journal, head = Journal(tmp_path / "journal.jsonl"), {"kind": "rung", "rung": "eager"}
    group = KeptLog()
    _, folder = MeasuredRun(spec, tmp_path / "runs", force=True, group=group).run()
    stopped(journal, head, group, 0.0, "signal 15")  # the stop arrives as the run closes, after it stored
    assert journal.lines[-1]["folder"] == str(folder) and "log" not in journal.lines[-1]
    assert "after its run was stored" in journal.lines[-1]["reason"] and not group.copy.exists()

    group.opened += 60  # a later run into the same folder, stopped before it stored: the old results are not its own
    group.copy.write_text("interrupted\n")
    stopped(journal, head, group, 0.0, "signal 15")
    assert journal.lines[-1]["log"] == str(group.copy) and "folder" not in journal.lines[-1]
