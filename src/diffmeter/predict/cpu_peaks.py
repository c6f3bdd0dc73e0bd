"""This CPU's peaks, measured: the best matrix-multiply rate per dtype and the best copy rate.

A CPU has no datasheet row the way a GPU has, so a roofline for CPU runs needs its figures measured
on the spot, at the thread count torch runs with. The copy rate is the best at any size from 1 MiB
(in cache) to 256 MiB (memory): a tensor that fits in cache moves at cache speed, and the roofline
must stay a lower bound for it.
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


class CpuPeaks(BaseModel):
    """Measured peaks of this CPU at ``threads`` torch threads: TFLOP/s per dtype, bytes/s."""

    cpu: str
    threads: int
    tflops: dict[str, float]
    bandwidth_bytes_per_s: float


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
    without bfloat16 units runs them a hundred times slower), and copies of each size."""
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
    return CpuPeaks(cpu=cpu_name(), threads=torch.get_num_threads(), tflops=tflops, bandwidth_bytes_per_s=bandwidth)


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
    cache.store("cpu-peaks", key, found.model_dump())
    return found


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
