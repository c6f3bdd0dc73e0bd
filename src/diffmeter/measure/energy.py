"""Energy with Zeus (the ``energy`` extra): GPU joules from NVML/AMDSMI counters, CPU and
DRAM joules from RAPL. Where nothing is measurable the result says so, and why.

The counters advance in steps (NVML's total-energy counter updates every few tens of
milliseconds), so Zeus reports 0 J for a window shorter than a step. A zero is never
stored as a measurement: each measured call has its own window, and one more window spans
the whole measured loop. Per-image energy comes from the per-call windows when every one
of them saw the counter move, else from the loop window (which then also counts the short
gaps between calls, where images are saved), else it is reported as not measured.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

#: the counters this module reads, as fields of EnergyReading
COUNTERS = ("gpu_j", "cpu_j", "dram_j")


class EnergyReading(BaseModel):
    """Joules over one window, summed over the monitored devices; None where the counter
    did not move (too short a window) or is not monitored."""

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
    #: "per-call windows" or "measured loop" (see the module docstring)
    basis: str | None = None
    loop_s: float | None = None
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
    def of(cls, calls: list[EnergyReading], loop: EnergyReading | None, images: int, meter: EnergyMeter) -> Energy:
        """Per-iteration and per-image energy from the per-call windows, or the loop window."""
        if not meter.available:
            return cls.unavailable(meter.reason)
        if not calls or loop is None:
            return cls.unavailable("no measured call")
        per_call = all(reading.gpu_j is not None for reading in calls) if meter.gpu_indices else True
        if per_call and meter.cpu_indices:
            per_call = all(reading.cpu_j is not None for reading in calls)
        if per_call:
            windows, seconds, basis = calls, sum(reading.seconds for reading in calls), "per-call windows"
        else:
            windows, seconds, basis = [loop], loop.seconds, "measured loop"
        totals = {counter: _total(windows, counter) for counter in COUNTERS}
        if all(value is None for value in totals.values()):
            return cls.unavailable(
                f"the energy counters did not advance during the measured calls ({loop.seconds:.3f} s): "
                "too short to measure; keep measuring longer with --min-duration 5"
            )
        iterations = len(calls)

        def per(value, count):
            return None if value is None else value / count

        gpu = totals["gpu_j"]
        return cls(
            available=True,
            source=meter.source,
            gpu_indices=meter.gpu_indices,
            cpu_indices=meter.cpu_indices,
            basis=basis,
            loop_s=loop.seconds,
            gpu_j_per_iteration=per(gpu, iterations),
            gpu_j_per_image=per(gpu, images),
            gpu_avg_power_w=None if gpu is None or not seconds else gpu / seconds,
            cpu_j_per_iteration=per(totals["cpu_j"], iterations),
            cpu_j_per_image=per(totals["cpu_j"], images),
            dram_j_per_iteration=per(totals["dram_j"], iterations),
            dram_j_per_image=per(totals["dram_j"], images),
        )


def _total(readings: list[EnergyReading], counter: str) -> float | None:
    values = [getattr(reading, counter) for reading in readings]
    return None if None in values else sum(values)


class EnergyMeter:
    """Zeus windows: ``begin(key)`` then ``end(key)``; windows may overlap."""

    def __init__(self, device: torch.device, monitor=None) -> None:
        self.available, self.reason, self.source = False, None, None
        self.gpu_indices: list[int] = []
        self.cpu_indices: list[int] = []
        self._monitor = monitor
        self._names = itertools.count()
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

    def begin(self) -> str | None:
        """Open a window; returns its key for ``end`` (None when nothing is measurable)."""
        if not self.available:
            return None
        key = f"diffmeter-{next(self._names)}"
        self._monitor.begin_window(key)
        return key

    def end(self, key: str | None) -> EnergyReading | None:
        if key is None:
            return None
        with _zeus_quiet():
            measurement = self._monitor.end_window(key)
        return EnergyReading(
            seconds=measurement.time,
            gpu_j=_measured(measurement.gpu_energy) if self.gpu_indices else None,
            cpu_j=_measured(measurement.cpu_energy) if self.cpu_indices else None,
            dram_j=_measured(measurement.dram_energy) if self.cpu_indices else None,
        )


def _measured(joules: dict[int, float] | None) -> float | None:
    """The sum over devices, or None when a counter did not move (a zero is not a measurement)."""
    if not joules or any(value <= 0.0 for value in joules.values()):
        return None
    return sum(joules.values())


@contextlib.contextmanager
def _zeus_quiet():
    """Zeus warns when a window reads zero; diffmeter reports that itself."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
