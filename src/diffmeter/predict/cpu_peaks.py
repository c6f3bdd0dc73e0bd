"""This CPU's peaks, measured: the best matrix-multiply rate per dtype and the best copy rate.

A CPU has no datasheet row the way a GPU has, so a roofline for CPU runs needs its figures measured
on the spot, at the thread count torch runs with. The copy rate is the best at any size from 1 MiB
(in cache) to 256 MiB (memory): a tensor that fits in cache moves at cache speed, and the roofline
must stay a lower bound for it. A peak measured while other processes used the CPU is low (every bound from it
too slow): it says so in the device's name and is not remembered on disk, so the next process measures again.
"""

from __future__ import annotations

import functools
import platform
import time
from pathlib import Path

import torch
from pydantic import BaseModel

from diffmeter import cache

MATMUL_SIZES = (512, 1024, 2048)
COPY_MIB = (1, 8, 64, 256)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: other processes' use of the CPU (cores, averaged over the measurement) above which the peaks are flagged as low
BUSY_CORES = 0.5


class CpuPeaks(BaseModel):
    """Measured peaks of this CPU at ``threads`` torch threads: TFLOP/s per dtype, bytes/s."""

    cpu: str
    threads: int
    tflops: dict[str, float]
    bandwidth_bytes_per_s: float
    #: cores other processes used, on average, while the peaks were measured
    others_cores: float = 0.0

    @property
    def busy(self) -> bool:
        return self.others_cores > BUSY_CORES


def _best_rate(work: float, run, budget_s: float) -> float:
    """``work`` units per second of ``run``'s fastest repetition (at least 2, until ``budget_s``)."""
    best, spent, repetitions = float("inf"), 0.0, 0
    run()  # first touch: allocation, kernel selection
    while repetitions < 2 or (spent < budget_s and repetitions < 20):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        best, spent, repetitions = min(best, elapsed), spent + elapsed, repetitions + 1
    return work / best


def measure_cpu_peaks(precisions: tuple[str, ...] = tuple(DTYPES), budget_s: float = 0.3) -> CpuPeaks:
    """Measure now: square matmuls of each dtype, growing while one takes less than ``budget_s`` (a CPU
    without bfloat16 units runs them a hundred times slower), and copies of each size; with the cores other
    processes used meanwhile (the machine's busy time less this process's CPU time, over the wall time)."""
    import psutil

    machine, own, start = _busy_s(psutil.cpu_times()), time.process_time(), time.perf_counter()
    tflops = {}
    for key in precisions:
        dtype, rates = DTYPES[key], []
        for size in MATMUL_SIZES:
            a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
            rates.append(_best_rate(2 * size**3, lambda a=a, b=b: torch.mm(a, b), budget_s))
            if 2 * (2 * size) ** 3 / rates[-1] > budget_s:  # the next size would take longer than the budget
                break
        tflops[key] = max(rates) / 1e12
    bandwidth = 0.0
    for mib in COPY_MIB:
        source = torch.ones(mib * 2**20 // 4)
        target = torch.empty_like(source)
        bandwidth = max(bandwidth, _best_rate(2 * source.nbytes, lambda s=source, t=target: t.copy_(s), budget_s))
    others = _busy_s(psutil.cpu_times()) - machine - (time.process_time() - own)
    return CpuPeaks(
        cpu=cpu_name(),
        threads=torch.get_num_threads(),
        tflops=tflops,
        bandwidth_bytes_per_s=bandwidth,
        others_cores=max(0.0, others / (time.perf_counter() - start)),
    )


def _busy_s(times) -> float:
    """Seconds the whole machine's cores spent on any process (``psutil.cpu_times()``: all but idle and I/O wait;
    Linux counts guest time inside user and nice time already, so it is taken out of the sum)."""
    left_out = ("idle", "iowait", "guest", "guest_nice")
    return sum(times) - sum(getattr(times, field, 0.0) for field in left_out)


def cpu_peaks(precisions: tuple[str, ...] = tuple(DTYPES)) -> CpuPeaks:
    """This CPU's peaks at the current thread count for ``precisions`` ("fp32", "bf16", "fp16"): from
    this process's memory or the disk cache, or measured and remembered."""
    return _remembered(cpu_name(), torch.get_num_threads(), tuple(sorted(precisions)))


@functools.cache
def _remembered(cpu: str, threads: int, precisions: tuple[str, ...]) -> CpuPeaks:
    key = {"cpu": cpu, "threads": threads, "torch": torch.__version__, "precisions": precisions}
    stored = cache.load("cpu-peaks", key)
    if stored is not None:
        return CpuPeaks.model_validate(stored)
    found = measure_cpu_peaks(precisions)
    if not found.busy:
        cache.store("cpu-peaks", key, found.model_dump())
    return found


def cpu_name() -> str:
    """This CPU's model name, as /proc/cpuinfo gives it (the key of its remembered peaks)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
