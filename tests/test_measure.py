"""Measurement parts on their own: stage timer, statistics, peaks, energy, environment."""

import sys
import types

import numpy as np
import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.measure.clock import HostClock
from diffmeter.measure.energy import Energy, EnergyMeter
from diffmeter.measure.environment import collect
from diffmeter.measure.peaks import device_peak
from diffmeter.measure.stages import StageTimer
from diffmeter.measure.stats import Stats
from diffmeter.tiny import tiny_pipeline


@pytest.mark.parametrize("samples", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.0]])
def test_stats_match_numpy(samples):
    stats = Stats.of(samples)
    assert stats.median == np.median(samples) and stats.mean == pytest.approx(np.mean(samples))
    assert stats.p90 == pytest.approx(np.percentile(samples, 90))
    assert stats.std == pytest.approx(np.std(samples, ddof=1) if len(samples) > 1 else 0.0)


def test_stage_timer_leaves_the_pipeline_as_it_found_it():
    pipe = tiny_pipeline(resolve("tiny-sd"))
    before = {
        name: dict(module._forward_pre_hooks)
        for name, module in pipe.components.items()
        if hasattr(module, "_forward_pre_hooks")
    }
    with StageTimer(pipe, ["text_encoder"], "unet", "vae", HostClock()) as timer:
        timer.begin()
        pipe("a cat", num_inference_steps=3, height=32, width=32, output_type="np")
        times = timer.end()
    assert len(times.stages.steps_s) == 3 and times.denoiser_calls == 3 and times.stages.vae_decode_s > 0
    assert "step" not in vars(pipe.scheduler) and "decode" not in vars(pipe.vae)
    after = {
        name: dict(module._forward_pre_hooks)
        for name, module in pipe.components.items()
        if hasattr(module, "_forward_pre_hooks")
    }
    assert after == before


def test_peaks_come_from_the_datasheet_table_without_sparsity():
    assert device_peak("NVIDIA H100 80GB HBM3", "bfloat16").tflops == 989.4
    assert device_peak("NVIDIA H100 PCIe", "float16").tflops == 756.0
    assert device_peak("NVIDIA H200", "bfloat16").tflops == 989.4
    assert device_peak("NVIDIA A100-SXM4-80GB", "float32", tf32=False).tflops == 19.5
    assert device_peak("NVIDIA A100-SXM4-80GB", "float32", tf32=True).tflops == 156.0
    assert device_peak("NVIDIA L40S", "bfloat16").tflops == 362.05  # not "NVIDIA L4"
    assert device_peak("Some Future GPU", "bfloat16") is None
    assert device_peak("Some Future GPU", "bfloat16", override_tflops=123.0).tflops == 123.0


class _FakeZeus:
    """Stands in for Zeus's NVML energy counter, which cannot exist on this GPU-less machine."""

    gpu_indices, cpu_indices = [0], []

    def __init__(self):
        self.windows = {}

    def begin_window(self, key):
        self.windows[key] = True

    def end_window(self, key):
        return types.SimpleNamespace(time=2.0, gpu_energy={0: 500.0}, cpu_energy=None, dram_energy=None)


def test_energy_per_image_and_average_power_from_zeus_windows():
    meter = EnergyMeter(torch.device("cuda"), monitor=_FakeZeus())
    readings = []
    for _ in range(3):
        meter.begin()
        readings.append(meter.end())
    energy = Energy.of(readings, images_per_iteration=4, meter=meter)
    assert energy.available and energy.gpu_j_per_iteration == 500.0 and energy.gpu_j_per_image == 125.0
    assert energy.gpu_avg_power_w == 250.0 and energy.cpu_j_per_image is None


def test_energy_without_zeus_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "zeus", None)  # as if the extra were not installed
    meter = EnergyMeter(torch.device("cpu"))
    energy = Energy.of([], 1, meter)
    assert not energy.available and "pip install 'diffmeter[energy]'" in energy.reason
    assert energy.gpu_j_per_image is None and energy.cpu_j_per_image is None


def test_energy_on_a_machine_without_counters_says_why():
    pytest.importorskip("zeus")
    meter = EnergyMeter(torch.device("cpu"))
    if meter.available:
        pytest.skip("this machine has readable RAPL counters")
    assert not Energy.of([], 1, meter).available and "RAPL" in meter.reason


def test_environment_names_versions_and_our_commit():
    environment = collect()
    assert environment.libraries["torch"] == torch.__version__
    assert environment.libraries["diffusers"] and environment.cpu_count >= 1
    assert environment.diffmeter_commit is None or len(environment.diffmeter_commit.split("-")[0]) == 40
