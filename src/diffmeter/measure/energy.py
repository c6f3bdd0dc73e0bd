"""Energy with Zeus (the ``energy`` extra): GPU joules from NVML/AMDSMI counters, CPU and
DRAM joules from RAPL. Where nothing is measurable the result says so, and why."""

from __future__ import annotations

import contextlib
import io
import itertools
import logging

import torch
from pydantic import BaseModel


class EnergyReading(BaseModel):
    """Joules over one measured window, summed over the monitored devices."""

    seconds: float
    gpu_j: float | None = None
    cpu_j: float | None = None
    dram_j: float | None = None


class Energy(BaseModel):
    """Energy of the measured iterations: joules per iteration and per image, watts."""

    available: bool
    reason: str | None = None
    source: str | None = None
    gpu_indices: list[int] = []
    cpu_indices: list[int] = []
    gpu_j_per_iteration: float | None = None
    gpu_j_per_image: float | None = None
    gpu_avg_power_w: float | None = None
    cpu_j_per_iteration: float | None = None
    cpu_j_per_image: float | None = None
    dram_j_per_iteration: float | None = None
    dram_j_per_image: float | None = None

    @classmethod
    def unavailable(cls, reason: str) -> Energy:
        return cls(available=False, reason=reason)

    @classmethod
    def of(cls, readings: list[EnergyReading], images_per_iteration: int, meter: EnergyMeter) -> Energy:
        if not meter.available:
            return cls.unavailable(meter.reason)

        def per_iteration(field: str) -> float | None:
            values = [getattr(reading, field) for reading in readings]
            return None if not values or None in values else sum(values) / len(values)

        gpu, cpu, dram = per_iteration("gpu_j"), per_iteration("cpu_j"), per_iteration("dram_j")
        seconds = sum(reading.seconds for reading in readings)
        return cls(
            available=True,
            source=meter.source,
            gpu_indices=meter.gpu_indices,
            cpu_indices=meter.cpu_indices,
            gpu_j_per_iteration=gpu,
            gpu_j_per_image=None if gpu is None else gpu / images_per_iteration,
            gpu_avg_power_w=None if gpu is None or not seconds else gpu * len(readings) / seconds,
            cpu_j_per_iteration=cpu,
            cpu_j_per_image=None if cpu is None else cpu / images_per_iteration,
            dram_j_per_iteration=dram,
            dram_j_per_image=None if dram is None else dram / images_per_iteration,
        )


class EnergyMeter:
    """Zeus windows around each measured iteration: ``begin()`` then ``end()``."""

    def __init__(self, device: torch.device, monitor=None) -> None:
        self.available, self.reason, self.source = False, None, None
        self.gpu_indices: list[int] = []
        self.cpu_indices: list[int] = []
        self._monitor = monitor
        self._names = itertools.count()
        self._window = None
        if monitor is None:
            self._monitor = self._zeus_monitor(device)
        if self._monitor is not None:
            self.gpu_indices = list(self._monitor.gpu_indices)
            self.cpu_indices = list(self._monitor.cpu_indices)
            if self.gpu_indices or self.cpu_indices:
                self.available = True
            else:
                self.reason = "Zeus found no GPU counter (NVML/AMDSMI) and no readable RAPL for this device"

    def _zeus_monitor(self, device: torch.device):
        try:
            import zeus
            from zeus.device.cpu import rapl_is_available
            from zeus.monitor import ZeusMonitor
        except ImportError:
            self.reason = "the zeus package is not installed: pip install 'diffmeter[energy]'"
            return None
        self.source = f"zeus {zeus.__version__}"
        quiet = io.StringIO()
        zeus_logger = logging.getLogger("zeus")
        level = zeus_logger.level
        zeus_logger.setLevel(logging.ERROR)
        try:
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                gpus = [device.index or 0] if device.type == "cuda" else []
                cpus = None if rapl_is_available() else []
                return ZeusMonitor(gpu_indices=gpus, cpu_indices=cpus, sync_execution_with="torch")
        except Exception as error:  # Zeus raises its own init errors for missing NVML/RAPL
            self.reason = f"Zeus could not start: {error}"
            return None
        finally:
            zeus_logger.setLevel(level)

    def begin(self) -> None:
        if self.available:
            self._window = f"diffmeter-{next(self._names)}"
            self._monitor.begin_window(self._window)

    def end(self) -> EnergyReading | None:
        if not self.available:
            return None
        measurement = self._monitor.end_window(self._window)
        return EnergyReading(
            seconds=measurement.time,
            gpu_j=sum(measurement.gpu_energy.values()) if self.gpu_indices else None,
            cpu_j=sum(measurement.cpu_energy.values()) if self.cpu_indices and measurement.cpu_energy else None,
            dram_j=sum(measurement.dram_energy.values()) if self.cpu_indices and measurement.dram_energy else None,
        )
