"""benchmarks/gpu_validation.py, the one command for a lent GPU, kept from rotting: every check fails on a
wrong input (the self-test), passes on a right one, and the chunks a CPU can run pass here."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_checks  # noqa: E402


def _script(*arguments, **kwargs):
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_validation.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=kwargs.pop("timeout", 120),
        **kwargs,
    )


def test_the_self_test_fails_every_check_on_a_wrong_input():
    """Faked there, and why: no NVML exists on a CPU machine, so two GPUs' energy counters and process lists
    are stand-ins (gpu_checks.FakeNvml); the peak table and the byte counts are plain numbers."""
    done = _script("--self-test")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line[:4] in ("FAIL", "PASS")]
    assert len(lines) == len(gpu_checks.self_test()) >= 6 and all(line.startswith("FAIL") for line in lines)


def test_the_same_checks_pass_on_right_inputs():
    nvml = gpu_checks.FakeNvml()
    read = gpu_checks.nvml_energy_j(1, nvml)
    before = read()
    nvml.window()
    assert gpu_checks.peak_table(989.5, 798.0, "H200 SXM")[0] == "PASS"
    assert gpu_checks.mfu(286.0, 989.5, 798.0)[0] == "PASS"  # FLUX.1-schnell 512 px on an H200: MFU 28.9%
    assert gpu_checks.energy(0.98 * (read() - before), read() - before)[0] == "PASS"
    assert gpu_checks.agree("peak bytes", 10 << 30, 10 << 30, "snapshot", 0.01)[0] == "PASS"
    assert gpu_checks.stray_contexts([1], own=1)[0] == "PASS"
    assert gpu_checks.in_range(0.35, (0.3, 0.45), 0.1)[0] == "PASS"
    assert gpu_checks.energy_in_range(180.0, (150.0, 210.0))[0] == "PASS"
    # the H200's second traced run (benchmarks/results/efficiency_cuda_nvidia-h200.json)
    assert gpu_checks.fractions({"matmul": (0.57, 0.95), "attention": (0.38, 0.64)})[0] == "PASS"


@pytest.mark.slow
def test_help_names_every_chunk():
    done = _script("--help")
    chunks = _script("--list").stdout.split()
    assert done.returncode == 0 and len(chunks) >= 10
    assert all(chunk in done.stdout for chunk in chunks)


@pytest.mark.slow
def test_what_a_cpu_can_run_of_it_passes(tmp_path):
    """The trace chunk is left out: on tiny pipelines a call lasts milliseconds, and a CI machine's scheduler
    moves a stage boundary by that much (tests/test_trace.py holds the traced stages on CPU)."""
    report = tmp_path / "report.md"
    chunks = ["stages", "onnxruntime", "graph-runs", "peak", "measures", "two-process", "cuda1"]
    runs = ["--runs", str(tmp_path / "runs")]
    done = _script(*(f"--chunk={chunk}" for chunk in chunks), "--report", str(report), *runs, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    text = report.read_text()
    assert "| FAIL |" not in text and text.count("| PASS |") >= 6 and "| SKIP |" in text


@pytest.mark.slow
def test_a_chunk_stopped_by_a_time_limit_is_a_failure_that_says_where(tmp_path):
    """``timeout`` sends SIGTERM: the report is still written, and the stopped chunk is a FAIL naming the technique
    it was inside (a lent GPU's run once reported a chunk stopped inside offload-model as 0 FAIL)."""
    report = tmp_path / "report.md"
    script = str(BENCHMARKS / "gpu_validation.py")
    command = [sys.executable, script, "--chunk=techniques-unet", "--report", str(report), "--runs", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:  # the first technique's row: the chunk is under way
            if "techniques-unet" in line:
                break
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=300)
    assert process.returncode != 0
    rows = [row for row in report.read_text().splitlines() if "| chunk stopped | FAIL |" in row]
    assert len(rows) == 1 and "signal 15 after" in rows[0] and " inside " in rows[0], report.read_text()[-2000:]


def test_the_stage_peaks_replayed_from_the_allocators_trace_follow_each_allocations_stack():
    """The allocator's event trace cannot be recorded here (no CUDA): a snapshot in its format (torch/cuda/memory.py
    ``_snapshot``: device_traces of alloc / free_completed events with their Python frames) stands in for one."""
    import gpu_chunks

    def alloc(size, *files):
        return {"action": "alloc", "size": size, "frames": [{"filename": f, "name": "f", "line": 1} for f in files]}

    pipeline = "site-packages/diffusers/pipelines/flux/pipeline_flux.py"
    trace = [
        alloc(100, pipeline),  # latents: outside every component
        alloc(700, "site-packages/transformers/models/t5/modeling_t5.py", pipeline),
        {"action": "free_completed", "size": 700},
        alloc(500, "site-packages/diffusers/models/attention_processor.py",
              "site-packages/diffusers/models/transformers/transformer_flux.py", pipeline),
        {"action": "free_completed", "size": 500},
        alloc(900, "site-packages/diffusers/models/autoencoders/autoencoder_kl.py", pipeline),
    ]  # fmt: skip
    peaks = gpu_chunks.replayed_stage_peaks({"device_traces": [trace]}, 0, 1000)
    assert peaks == {"text encoding": 1800, "denoising step": 1600, "VAE decode": 2000}


def test_the_calibration_runs_name_catalog_models_and_refuse_without_cuda(monkeypatch, capsys):
    """benchmarks/gpu_calibration_runs.py kept from rotting: each run is a valid bench spec of a catalog model, and
    without CUDA the script says so in one line and exits 2 (it runs on a lent GPU)."""
    import gpu_calibration_runs

    from diffmeter.catalog import resolve

    for model, settings in gpu_calibration_runs.RUNS:
        spec = gpu_calibration_runs.spec_of(model, settings)
        assert resolve(spec.model).name == model and spec.random_weights and not spec.predict
    monkeypatch.setattr(sys, "argv", ["gpu_calibration_runs.py"])
    monkeypatch.setattr(gpu_calibration_runs.torch.cuda, "is_available", lambda: False)
    assert gpu_calibration_runs.main() == 2
    assert capsys.readouterr().err.strip().startswith("needs CUDA")


STOPPED_RUN = """
import signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import gpu_runs
from diffmeter.runs.spec import BenchSpec
gpu_runs.RUNS["root"] = Path(sys.argv[2])
signal.signal(signal.SIGTERM, signal.default_int_handler)  # as gpu_validation.py's: the stop is a KeyboardInterrupt
gpu_runs.run(BenchSpec(model="tiny-sd", steps=2, iterations=100000), "stopped-chunk")
"""


def test_a_run_stopped_by_a_time_limit_keeps_its_log_in_its_chunks_folder(tmp_path):
    """The lent GPU's offload chunk was stopped after 410 s with nothing left to say where the time went: the
    chunk's folder keeps the stopped run's bench.log (its load time and per-call lines)."""
    command = [sys.executable, "-c", STOPPED_RUN, str(BENCHMARKS), str(tmp_path)]
    folder = tmp_path / "stopped-chunk"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for _ in range(1200):  # until the log holds a measured call (at most 2 minutes)
            logs = list(folder.glob("*.log"))
            if logs and "iteration 1:" in logs[0].read_text():
                break
            assert process.poll() is None, process.stdout.read()[-3000:]
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
    assert process.returncode != 0
    [log] = folder.glob("*.log")
    text = log.read_text()
    assert "loaded and optimized in" in text and "iteration 0:" in text and "interrupted" in text, text[-2000:]
    assert "tiny-sd+" in log.name and not list(folder.glob(".*partial*"))  # the staged folder discarded, as ever
