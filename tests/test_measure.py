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
from diffmeter.measure.stages import StageTimer
from diffmeter.measure.stats import Stats
from diffmeter.predict.peaks import PEAKS, device_peak, find_device
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


#: device names as nvidia-smi and torch.cuda.get_device_name() spell them -> dense bf16 TFLOP/s (None: unknown)
DEVICE_NAMES = {
    "NVIDIA H100 80GB HBM3": 989.5,
    "NVIDIA H100 PCIe": 756.5,
    "NVIDIA H100 NVL": 835.5,
    "NVIDIA H200": 989.5,
    "NVIDIA H200 NVL": 835.5,
    "NVIDIA GH200 480GB": 989.5,
    "NVIDIA GH200 144G HBM3e": 989.5,
    "NVIDIA H800": 989.5,
    "NVIDIA H20": 148.0,
    "NVIDIA B200": 2250.0,
    "NVIDIA GB200": 2500.0,
    "NVIDIA B300 SXM6 AC": 2250.0,  # as nvidia-smi names it
    "AMD Instinct MI300X": 1307.4,  # as ROCm's torch.cuda.get_device_name names it
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A800-SXM4-80GB": 312.0,
    "NVIDIA A800 80GB PCIe": 312.0,
    "NVIDIA A800 40GB Active": 312.0,
    "NVIDIA A10G": 70.0,
    "NVIDIA A10": 125.0,
    "NVIDIA A40": 149.7,
    "NVIDIA L4": 121.0,
    "NVIDIA L40": 181.05,
    "NVIDIA L40S": 362.05,
    "NVIDIA GeForce RTX 4090": 165.2,
    "NVIDIA GeForce RTX 3090": 71.0,
    "NVIDIA GeForce RTX 4070": 58.3,
    "NVIDIA GeForce RTX 4070 Ti": 80.2,
    "NVIDIA GeForce RTX 4070 Ti SUPER": 88.2,
    "NVIDIA GeForce RTX 4060 Ti": 44.1,  # the 8 GB and 16 GB cards: one name, peaks and bandwidth
    "NVIDIA GeForce RTX 5060 Ti": 47.4,
    "NVIDIA GeForce RTX 5070": 61.7,
    "NVIDIA GeForce RTX 5070 Ti": 87.9,
    "NVIDIA RTX 6000 Ada Generation": 364.2,
    "NVIDIA RTX A6000": 154.8,
    # look-alikes that must not borrow a neighbour's figure
    "NVIDIA GeForce RTX 4090 D": None,
    "NVIDIA GeForce RTX 4070 SUPER": None,
    "NVIDIA GeForce RTX 4060": None,
    "NVIDIA GeForce RTX 5060": None,
    "NVIDIA GeForce RTX 3060 Ti": None,
    "NVIDIA GeForce RTX 3060": None,  # the 12 GB card (360 GB/s) and the 8 GB one (240 GB/s) share the name
    "NVIDIA A800-SXM4-40GB": None,  # not in the table
    "NVIDIA H200 MIG 2g.35gb": None,
    "NVIDIA H100": None,
    "NVIDIA H20-3e": None,
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": None,
    "AMD Instinct MI300A": None,
    "AMD Instinct MI325X": None,
    "Some Future GPU": None,
}


@pytest.mark.parametrize(("name", "bf16"), DEVICE_NAMES.items())
def test_peaks_match_real_device_names_by_whole_tokens(name, bf16):
    peak = device_peak(name, "bfloat16")
    assert (peak.tflops if peak else None) == bf16


def test_peaks_are_dense_and_follow_the_precision_that_ran():
    assert device_peak("NVIDIA A100-SXM4-80GB", "float32", tf32=False).tflops == 19.5
    assert device_peak("NVIDIA A100-SXM4-80GB", "float32", tf32=True).tflops == 156.0
    assert device_peak("NVIDIA H100 80GB HBM3", "float32", tf32=True).tflops == 494.5  # not the 67 of plain FP32
    assert device_peak("Tesla T4", "float16").tflops == 65.0 and device_peak("Tesla T4", "bfloat16") is None
    assert device_peak("Tesla V100-SXM2-32GB", "float16").tflops == 125.0
    assert device_peak("Some Future GPU", "bfloat16", override_tflops=123.0).tflops == 123.0
    # one figure copied from a sparse column would break the 2 : 1 : 0.5 pattern of fp8 : half : tf32
    # (within the datasheets' own rounding: the L40S sheet says 362.05 bf16 next to 733 fp8)
    for peak in PEAKS:
        half = peak.tflops.get("bf16", peak.tflops["fp16"])
        assert peak.tflops.get("fp8", 2 * half) <= 2.03 * half and peak.tflops.get("tf32", half / 2) <= 0.51 * half


def test_the_current_cards_are_matched_by_their_driver_names_and_borrow_their_generations_fit():
    """RTX 5090 and 5080 (GeForce Blackwell: the B200's fit, borrowed and said so), RTX 4080 and L20 (Ada's own); a
    4080 SUPER or an L2 is another card."""
    from diffmeter.predict.calibration import calibration_for
    from diffmeter.predict.devices import named_gpu

    assert device_peak("NVIDIA GeForce RTX 5090", "bfloat16").tflops == 209.5
    assert device_peak("NVIDIA L20", "float16").tflops == 119.5
    assert find_device("NVIDIA GeForce RTX 4080 SUPER") is None and find_device("NVIDIA L2") is None
    assert device_peak("NVIDIA GeForce RTX 5080", "float32", tf32=True) is None  # no TF32 figure found stated
    assert named_gpu("rtx 5090").architecture == "rtx-blackwell" and named_gpu("l20").architecture == "ada"
    assert named_gpu("rtx 5090").memory_bytes == 32_607 * 2**20 and named_gpu("l20").tdp_w is None
    assert "borrowed for rtx-blackwell (RTX 5080) from ada" in calibration_for(named_gpu("rtx 5080")).source
    assert "published eager runs on ada GPUs" in calibration_for(named_gpu("rtx 4080")).source  # Ada's own fit


class _FakeZeus:
    """Stands in for Zeus's NVML energy counter, which cannot exist on this GPU-less machine.
    ``joules`` lists what successive windows read, in the order they end."""

    gpu_indices, cpu_indices = [0], []

    def __init__(self, joules):
        self.joules = list(joules)

    def begin_window(self, key):
        pass

    def end_window(self, key):
        return types.SimpleNamespace(time=2.0, gpu_energy={0: self.joules.pop(0)}, cpu_energy=None, dram_energy=None)


def _measure(meter, calls):
    """A measured loop of ``calls`` calls: one window per call inside one window over the loop."""
    loop = meter.begin()
    readings = []
    for _ in range(calls):
        readings.append(meter.end(meter.begin()))
    return readings, meter.end(loop)


def test_energy_per_image_from_per_call_windows_when_every_one_moved():
    meter = EnergyMeter(torch.device("cuda"), monitor=_FakeZeus([500.0, 500.0, 500.0, 1600.0]))
    energy = Energy.of(*_measure(meter, 3), images=12, meter=meter)
    assert energy.available and energy.basis == "per-call windows"
    assert energy.gpu_j_per_iteration == 500.0 and energy.gpu_j_per_image == 125.0
    assert energy.gpu_avg_power_w == 250.0 and energy.cpu_j_per_image is None and energy.loop_s == 2.0


def test_a_window_too_short_for_the_counter_is_not_a_zero_measurement():
    """Zeus returns 0 J for a window shorter than the counter's update step: it is never stored."""
    meter = EnergyMeter(torch.device("cuda"), monitor=_FakeZeus([0.0, 400.0, 0.0, 900.0]))
    readings, loop = _measure(meter, 3)
    assert [reading.gpu_j for reading in readings] == [None, 400.0, None]
    energy = Energy.of(readings, loop, images=3, meter=meter)
    assert energy.basis == "measured loop" and energy.gpu_j_per_image == 300.0 and energy.gpu_j_per_iteration == 300.0
    nothing = EnergyMeter(torch.device("cuda"), monitor=_FakeZeus([0.0, 0.0, 0.0]))
    energy = Energy.of(*_measure(nothing, 2), images=2, meter=nothing)
    assert not energy.available and "--min-duration" in energy.reason and energy.gpu_j_per_image is None


def test_energy_without_zeus_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "zeus", None)  # as if the extra were not installed
    meter = EnergyMeter(torch.device("cpu"))
    energy = Energy.of([], None, 1, meter)
    assert not energy.available and "pip install 'diffmeter[energy]'" in energy.reason
    assert energy.gpu_j_per_image is None and energy.cpu_j_per_image is None


def test_energy_on_a_machine_without_counters_says_why():
    pytest.importorskip("zeus")
    meter = EnergyMeter(torch.device("cpu"))
    if meter.available:
        pytest.skip("this machine has readable RAPL counters")
    assert not Energy.of([], None, 1, meter).available and "RAPL" in meter.reason


def test_environment_names_versions_and_our_commit():
    environment = collect()
    assert environment.libraries["torch"] == torch.__version__
    assert environment.libraries["diffusers"] and environment.cpu_count >= 1
    assert environment.diffmeter_commit is None or len(environment.diffmeter_commit.split("-")[0]) == 40


def test_conditions_name_other_processes_busy_during_the_measured_calls():
    """The monitor counts a busy process beside this one: at least the CPU that process itself used in the
    window (read from its own counters), whatever else the machine runs (another test worker, CI's neighbours)."""
    import subprocess
    import time

    import psutil

    from diffmeter.measure.conditions import ConditionsMonitor

    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 4\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)
        process = psutil.Process(busy.pid)
        before, started = sum(process.cpu_times()[:2]), time.monotonic()
        monitor = ConditionsMonitor()
        monitor.start()
        time.sleep(1.5)
        conditions = monitor.stop()
        used = (sum(process.cpu_times()[:2]) - before) / (time.monotonic() - started)
    finally:
        busy.kill()
    assert conditions.samples >= 4 and conditions.cpu_count >= 1
    assert conditions.other_processes_cores.mean > 0.5  # the busy process held about one core
    assert conditions.other_processes_cores.mean >= used - 0.25  # its own counters: it was counted
    assert "other processes used" in conditions.disturbed()


def test_each_a100_is_its_own_row_with_its_bandwidth_power_and_memory():
    """The driver names of the four A100s pick their rows (bandwidth and TDP differ by memory and form), so a run on
    any of them gets a time and an energy; ``--gpu a100`` is the 80GB SXM, as ``h100`` is the SXM."""
    from diffmeter.predict.devices import named_gpu

    rows = {  # name: row, GB/s, W, MiB as nvidia-smi reports it
        "NVIDIA A100-SXM4-80GB": ("A100 80GB SXM", 2039, 400, 81920),
        "NVIDIA A100 80GB PCIe": ("A100 80GB PCIe", 1935, 300, 81920),
        "NVIDIA A100-SXM4-40GB": ("A100 40GB SXM", 1555, 400, 40960),
        "NVIDIA A100-PCIE-40GB": ("A100 40GB PCIe", 1555, 250, 40536),
    }
    for driver_name, (row, bandwidth, tdp, mib) in rows.items():
        device = named_gpu(find_device(driver_name).name)
        assert (device.name, device.bandwidth_bytes_per_s, device.tdp_w) == (row, bandwidth * 1e9, tdp)
        assert device.l2_bytes == 40 * 2**20 and device.architecture == "ampere" and device.memory_bytes == mib * 2**20
    assert named_gpu("a100").name == "A100 80GB SXM" and named_gpu("a100 40gb").name == "A100 40GB SXM"
    assert find_device("NVIDIA A100-SXM4-80GB MIG 1g.10gb") is None


def test_each_a800_is_its_own_row_with_its_bandwidth_and_a_bare_a800_is_the_sxm():
    """One "A800" row covered four cards, with peaks but no bandwidth, so `profile --gpu a800` gave no time (issue
    50): the driver names pick their rows, and "a800", as users and published figures name it, is the 80GB SXM, as
    "a100" is."""
    from diffmeter.predict.devices import named_gpu, other_cards

    rows = {  # name: row, GB/s, W (None: not found), MiB as nvidia-smi reports it (None: not found)
        "NVIDIA A800-SXM4-80GB": ("A800 80GB SXM", 2039, 400, 81920),
        "NVIDIA A800 80GB PCIe": ("A800 80GB PCIe", 1935, None, 81920),
        "NVIDIA A800 40GB Active": ("A800 40GB Active", 1555, 240, None),
    }
    for driver_name, (row, bandwidth, tdp, mib) in rows.items():
        device = named_gpu(find_device(driver_name).name)
        assert (device.name, device.bandwidth_bytes_per_s, device.tdp_w) == (row, bandwidth * 1e9, tdp)
        assert device.l2_bytes == 40 * 2**20 and device.architecture == "ampere" and device.memory_bytes
        assert mib is None or device.memory_bytes == mib * 2**20
    assert named_gpu("a800").name == named_gpu("A800").name == "A800 80GB SXM"
    assert other_cards("a800").endswith(
        "also has the A800 80GB PCIe, A800 40GB PCIe, A800 40GB Active: name one for another card"
    )
    assert named_gpu("a800 40gb pcie").bandwidth_bytes_per_s == 1555e9


def test_conditions_read_the_runs_gpu_whatever_order_cuda_numbers_it(monkeypatch):
    """NVML numbers GPUs by PCI bus, CUDA fastest first unless CUDA_DEVICE_ORDER says otherwise, and
    CUDA_VISIBLE_DEVICES reorders them: the monitor finds the run's GPU by UUID, so it reads cuda:0's temperature
    and clock, not those of whatever NVML numbers 0 or 1 (issue 51, item 5). NVML and CUDA cannot exist here: a
    stand-in NVML with two GPUs and CUDA device properties naming their UUIDs."""
    import sys
    import types

    import torch

    from diffmeter.measure.conditions import ConditionsMonitor

    gpus = {"GPU-aaaa": (1410, 41), "GPU-bbbb": (1980, 67)}  # NVML index 0, 1 (bus order): SM MHz, temperature
    nvml = types.SimpleNamespace(
        NVMLError=RuntimeError,
        NVML_CLOCK_SM=0,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: list(gpus)[index],
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid if uuid in gpus else (_ for _ in ()).throw(RuntimeError(uuid)),
        nvmlDeviceGetClockInfo=lambda handle, _: gpus[handle][0],
        nvmlDeviceGetTemperature=lambda handle, _: gpus[handle][1],
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cuda_uuids = ["bbbb", "aaaa"]  # CUDA numbers the faster card first (its default order): its 0 is NVML's 1
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=cuda_uuids[i]))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    for visible in (None, "GPU-bbbb"):  # every GPU, or the run's named by its UUID
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        monitor = ConditionsMonitor(gpu_index=0)
        monitor.sample()
        conditions = monitor.stop()
        assert (conditions.gpu_sm_mhz.mean, conditions.gpu_temperature_c.mean) == (1980, 67), visible
