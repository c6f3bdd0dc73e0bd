"""This CPU's measured peaks: stored per machine with the date measured, used by every later prediction (the
same spec's CPU prediction differed between `bench` and `profile --gpu cpu` minutes apart: the peaks were
measured again, under load, each time), measured again only on request, a busy measurement said."""

import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest
import torch

from diffmeter.predict import cpu_peaks_store
from diffmeter.predict.cpu_peaks import BUSY_CORES, cpu_name, stored_or_measured
from diffmeter.predict.devices import this_cpu


@pytest.fixture
def peaks_dir(tmp_path, monkeypatch):
    """An empty store, and no peaks remembered by this process (each test starts as a new process would)."""
    monkeypatch.setenv("DIFFMETER_CPU_PEAKS_DIR", str(tmp_path / "peaks"))
    stored_or_measured.cache_clear()
    yield tmp_path / "peaks"
    stored_or_measured.cache_clear()


def _time(cli) -> dict:
    code, out, err = cli("profile", "tiny-sd", "--gpu", "cpu", "--json")
    assert code == 0, err
    return json.loads(out)["time"]


def test_two_predictions_in_a_row_use_the_stored_peaks_and_remeasuring_replaces_them(peaks_dir, cli):
    first = _time(cli)
    (stored,) = peaks_dir.glob("*.json")
    record = json.loads(stored.read_text())
    precisions = {"fp32", "bf16", "fp16"}
    assert record["cpu"] == cpu_name() and set(record["tflops"]) == precisions | {f"conv-{p}" for p in precisions}
    measured = datetime.fromisoformat(record["measured_at"])
    assert abs((datetime.now(timezone.utc) - measured).total_seconds()) < 600
    assert f"peaks measured {measured:%Y-%m-%d}" in first["device"]
    assert first["peak_tflops"] == record["tflops"]["fp32"]
    assert first["bandwidth_bytes_per_s"] == record["bandwidth_bytes_per_s"]

    stored_or_measured.cache_clear()  # as the next process: it reads the file, it does not measure
    assert _time(cli) == first

    # planted figures (none a measurement would give) prove the next prediction reads them
    planted = {
        **record,
        "tflops": {"fp32": 1.5, "bf16": 3.0, "fp16": 3.0, "conv-fp32": 2.5, "conv-bf16": 4.0, "conv-fp16": 4.0},
        "measured_at": "2020-01-02T03:04:05Z",
    }
    stored.write_text(json.dumps(planted))
    stored_or_measured.cache_clear()
    read = _time(cli)
    assert read["peak_tflops"] == 1.5 and "peaks measured 2020-01-02" in read["device"]
    # tiny-sd's convolutions are charged the rate measured on convolutions, its matmuls the matmul peak
    assert any("convolution at 2.5 TFLOP/s (measured on convolutions)" in line for line in read["other_peaks"])

    code, out, err = cli("doctor", "--remeasure-cpu", "--json")
    assert code == 0, err
    again = json.loads(stored.read_text())
    assert again["tflops"]["fp32"] != 1.5 and again["measured_at"] != planted["measured_at"]
    assert json.loads(out)["cpu_peaks"]["measured_at"].startswith(f"{datetime.now(timezone.utc):%Y-%m-%d}")
    after = _time(cli)
    assert after["peak_tflops"] == again["tflops"]["fp32"] and "2020-01-02" not in after["device"]


def test_peaks_stored_before_convolutions_were_measured_charge_them_the_matmul_peak_and_say_so(peaks_dir, cli):
    """A record of the layout before convolutions were measured (matmul peaks alone) is used as it is, never measured
    again behind the user's back: its convolutions are charged the matmul peak, and the device says so."""
    record = {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "tflops": {"fp32": 1.5, "bf16": 3.0, "fp16": 3.0},
        "bandwidth_bytes_per_s": 12.5e9,
        "measured_at": "2020-01-02T03:04:05Z",
    }
    cpu_peaks_store.save(record)
    device = this_cpu("float32")
    assert device.tflops == {"fp32": 1.5} and "no convolution rate stored" in device.source
    read = _time(cli)
    assert read["peak_tflops"] == 1.5 and read["other_peaks"] == []
    assert json.loads(next(peaks_dir.glob("*.json")).read_text()) == record


def test_doctor_names_the_stored_peaks_with_their_date_and_never_measures(peaks_dir, cli):
    code, out, err = cli("doctor")
    assert code == 0, err
    assert "CPU peaks: not measured yet" in " ".join(out.split()) and not peaks_dir.exists()
    record = {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "tflops": {"fp32": 0.25, "bf16": 0.5, "fp16": 0.01, "conv-fp32": 0.375, "conv-bf16": 0.5, "conv-fp16": 0.01},
        "bandwidth_bytes_per_s": 12.5e9,
        "others_cores": 1.4,
        "measured_at": "2026-01-02T03:04:05Z",
    }
    cpu_peaks_store.save(record)
    code, out, err = cli("doctor")
    text = " ".join(out.split())
    assert code == 0, err
    assert "measured 2026-01-02 03:04 UTC while other processes used 1.4 cores: may be low" in text
    assert "fp32 250.00 GFLOP/s" in text and "conv-fp32 375.00 GFLOP/s" in text and "copy 12.5 GB/s" in text


def test_peaks_measured_on_a_busy_machine_are_stored_and_said_wherever_they_are_named(tmp_path):
    """Two busy-looping processes beside the measurement (real ones): its peaks are flagged in the device's name,
    and stored all the same (they were measured again by every process), flagged again when read back."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        code = (
            "from diffmeter.predict.devices import this_cpu; from diffmeter.predict.cpu_peaks import cpu_peaks; "
            "print(cpu_peaks(('fp32',)).others_cores); print(this_cpu('float32').name)"
        )
        env = {**os.environ, "DIFFMETER_CPU_PEAKS_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    finally:
        for spinner in spinners:
            spinner.kill()
    others, name = done.stdout.strip().splitlines()[-2:]
    assert float(others) > BUSY_CORES, done.stderr[-2000:]  # the two spinners got their share of the cores
    assert "while other processes used" in name and "may be low" in name
    (stored,) = tmp_path.glob("*.json")
    assert json.loads(stored.read_text())["others_cores"] == float(others)
    read = subprocess.run(
        [sys.executable, "-c", "from diffmeter.predict.devices import this_cpu; print(this_cpu('float32').name)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert read.stdout.strip().splitlines()[-1] == name
