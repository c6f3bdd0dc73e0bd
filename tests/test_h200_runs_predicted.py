"""The expected time of diffmeter's own eager runs on a lent H200 (issue 50's proof), each predicted on this CPU
from the spec its stored result holds, as `bench` predicts a run: the three 512 px runs of run 8
(benchmarks/results/gpu_runs_nvidia-h200.jsonl, 2026-11-27 19:17-19:18 UTC) and the eight long runs of
benchmarks/results/gpu_calibration_nvidia-h200.jsonl. These runs are in the fit (benchmarks/published_figures.yaml),
so this holds the shipped calibration to what it was fitted on, not a held-out claim."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from diffmeter.predict.devices import of_row
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.peaks import find_device
from diffmeter.predict.roofline import BENCH_FP32, predict_time
from diffmeter.runs.spec import BenchSpec

pytestmark = pytest.mark.slow

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"
SHORT = [json.loads(line) for line in (RESULTS / "gpu_runs_nvidia-h200.jsonl").read_text().splitlines()]
SHORT = [run for run in SHORT if run["created_utc"].startswith("2026-11-27T19:1")]  # run 8
LONG = [json.loads(line) for line in (RESULTS / "gpu_calibration_nvidia-h200.jsonl").read_text().splitlines()]


def stored_spec(stored: dict):
    """The profile spec a stored run ran: these runs predate bench passing FLUX.1-schnell's card length (256), so the
    pipeline padded T5 to its own 512, as each stored profile's text_encoder_2 row says."""
    spec = BenchSpec.model_validate(stored["spec"]).profile_spec()
    if spec.model == "flux-schnell" and spec.max_sequence_length is None:
        return replace(spec, max_sequence_length=512)
    return spec


def predicted(stored: dict):
    spec = stored_spec(stored)
    memory, work = predict_memory_and_work(spec, on_cuda=True)
    device = of_row(find_device("NVIDIA H200"))
    return predict_time(
        work,
        device,
        weights=memory.weight_read_bytes,
        outputs=spec.batch_size,
        fp32_math=BENCH_FP32,
        torch_version=stored["environment"]["libraries"]["torch"],  # 2.11.0: SDPA ran cuDNN's attention
    )


def test_run_8_is_the_three_short_runs_the_issue_names():
    assert [run["spec"]["model"] for run in SHORT] == ["sd15", "flux-schnell", "pixart-sigma-1024"]
    assert len(LONG) == 8


def test_the_stored_flux_schnell_runs_padded_t5_to_512():
    for stored in SHORT + LONG:
        if stored["spec"]["model"] == "flux-schnell":
            t5 = next(c for c in stored["profile"]["components"] if c["name"] == "text_encoder_2")
            assert [i["note"] for i in t5["invocations"]] == ["512 tokens"]
            assert stored_spec(stored).max_sequence_length == 512


@pytest.mark.parametrize("stored", SHORT + LONG, ids=lambda run: f"{run['spec']['model']}-{run['spec']['height']}")
def test_each_h200_run_is_inside_its_expected_range(stored):
    measured = stored["summary"]["latency_s"]["median"]
    low, high = predicted(stored).expected_s
    assert low <= measured <= high


def test_the_runs_stack_is_the_one_they_ran_on():
    assert predicted(LONG[0]).stack == "torch 2.11.0, SDPA on cudnn"


def test_sd15s_short_denoising_waits_for_its_host_and_says_so():
    time = predicted(SHORT[0])
    denoising = next(stage for stage in time.stages if stage.stage == "denoising")
    assert time.host_bound and denoising.host_s[0] > denoising.gpu_s[0]
    assert 0.3 < time.busy_share < 0.7  # the GPU busy about half of the time, as the trace's idle gaps say
