"""What else the machine was doing while a run was measured: load from other processes, the CPU's
clock, and on CUDA the GPU's clock and temperature, sampled in the background during the
measured calls. Timings taken under different conditions do not compare; this says which
conditions each run had.
"""

from __future__ import annotations

import os
import statistics
import threading

import psutil
from pydantic import BaseModel

from diffmeter import units

#: seconds between samples
PERIOD_S = 0.25
#: CPU cores' worth of other processes' work above which a run is flagged as disturbed
BUSY_CORES = 0.5


class Range(BaseModel):
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Range | None:
        return cls(mean=statistics.fmean(values), min=min(values), max=max(values)) if values else None


class Conditions(BaseModel):
    """Samples over the measured calls; None where this machine cannot say."""

    samples: int
    cpu_count: int
    #: 1-minute load average (runnable processes, this one included)
    load_average: Range | None = None
    #: CPU cores' worth of work by processes other than this run
    other_processes_cores: Range | None = None
    cpu_mhz: Range | None = None
    gpu_sm_mhz: Range | None = None
    gpu_temperature_c: Range | None = None

    def disturbed(self) -> str | None:
        """Why the figures may be slowed by something else, or None."""
        other = self.other_processes_cores
        if other is not None and other.mean > BUSY_CORES:
            return (
                f"other processes used {other.mean:.1f} of {units.counted(self.cpu_count, 'CPU core')} on average "
                "during the measured calls: the figures may be slowed by them"
            )
        return None


class ConditionsMonitor:
    """Samples conditions in a background thread between ``start()`` and ``stop()``."""

    def __init__(self, gpu_index: int | None = None) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()
        self._gpu = _nvml_handle(gpu_index)
        self._values: dict[str, list[float]] = {
            name: [] for name in ("load_average", "other", "cpu_mhz", "gpu_sm_mhz", "gpu_temperature_c")
        }

    def start(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call of each only primes the counters
        self._process.cpu_percent(interval=None)
        self._thread = threading.Thread(target=self._run, name="diffmeter-conditions", daemon=True)
        self._thread.start()

    def stop(self) -> Conditions:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        values = self._values
        return Conditions(
            samples=len(values["other"]),
            cpu_count=os.cpu_count() or 1,
            load_average=Range.of(values["load_average"]),
            other_processes_cores=Range.of(values["other"]),
            cpu_mhz=Range.of(values["cpu_mhz"]),
            gpu_sm_mhz=Range.of(values["gpu_sm_mhz"]),
            gpu_temperature_c=Range.of(values["gpu_temperature_c"]),
        )

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self.sample()

    def sample(self) -> None:
        cores = os.cpu_count() or 1
        system = psutil.cpu_percent(interval=None) / 100 * cores
        own = self._process.cpu_percent(interval=None) / 100
        self._values["other"].append(max(0.0, system - own))
        if hasattr(os, "getloadavg"):
            self._values["load_average"].append(os.getloadavg()[0])
        frequency = psutil.cpu_freq() if hasattr(psutil, "cpu_freq") else None
        if frequency is not None and frequency.current:
            self._values["cpu_mhz"].append(frequency.current)
        if self._gpu is not None:
            import pynvml

            try:
                self._values["gpu_sm_mhz"].append(pynvml.nvmlDeviceGetClockInfo(self._gpu, pynvml.NVML_CLOCK_SM))
                temperature = pynvml.nvmlDeviceGetTemperature(self._gpu, pynvml.NVML_TEMPERATURE_GPU)
                self._values["gpu_temperature_c"].append(temperature)
            except pynvml.NVMLError:
                self._gpu = None  # stop asking a device that cannot say


def _nvml_handle(gpu_index: int | None):
    """An NVML handle for the run's GPU, found by its UUID: NVML numbers GPUs in PCI bus order and CUDA, by default
    (``CUDA_DEVICE_ORDER=FASTEST_FIRST``), fastest first, and ``CUDA_VISIBLE_DEVICES`` may reorder or name them by
    UUID, so no index arithmetic maps one to the other. None without pynvml or a driver."""
    if gpu_index is None:
        return None
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        # str() of a device's uuid is the bare UUID (torch/csrc/cuda/Module.cpp, _CUuuid's __str__); NVML's has "GPU-"
        uuid = str(torch.cuda.get_device_properties(gpu_index).uuid).removeprefix("GPU-")
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except Exception:  # pynvml missing, no driver: no GPU conditions
        return None
