"""This CPU's peaks, measured: the best matrix-multiply and convolution rates per dtype and the best copy rate.

A CPU has no datasheet row the way a GPU has, so a roofline for CPU runs needs its figures measured
on the spot, at the thread count torch runs with. The copy rate is the best at any size from 1 MiB
(in cache) to 256 MiB (memory): a tensor that fits in cache moves at cache speed, and the roofline
must stay a lower bound for it. Convolutions are measured on their own: PyTorch runs them on another library
than its matmuls, at another rate (on an AMD EPYC with AVX-512, torch 2.13: float32 ``torch.mm`` calls MKL's SGEMM,
``MKL_VERBOSE=1`` shows it; ``conv2d`` oneDNN's ``jit:avx512_core`` kernel, ``ONEDNN_VERBOSE=1``; the SD 1.5 VAE's
decode ran at 323 GFLOP/s there, over the 222 GFLOP/s SGEMM peak measured the same day). The peaks are measured
once per machine (CPU name, threads) at every dtype and stored with the time they were measured
(``predict.cpu_peaks_store``): every later prediction uses the same figures until ``diffmeter doctor
--remeasure-cpu`` measures again. A peak measured while other processes used the CPU is low (every bound from it
too slow): it is stored all the same, and said wherever the figures are named.
"""

from __future__ import annotations

import functools
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from pydantic import BaseModel

from diffmeter.predict import cpu_peaks_store
from diffmeter.predict.peaks import conv_key

MATMUL_SIZES = (512, 1024, 2048)
#: 3x3 convolutions, batch 1, as many channels out as in, on a square input: (channels, side), growing
CONV_SHAPES = ((128, 32), (256, 64), (512, 64))
COPY_MIB = (1, 8, 64, 256)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: other processes' use of the CPU (cores, averaged over the measurement) above which the peaks are flagged as low
BUSY_CORES = 0.5


class CpuPeaks(BaseModel):
    """Measured peaks of this CPU at ``threads`` torch threads: TFLOP/s per dtype of matmuls ("fp32") and of
    convolutions ("conv-fp32", ``conv_key``), bytes/s."""

    cpu: str
    threads: int
    tflops: dict[str, float]
    bandwidth_bytes_per_s: float
    #: cores other processes used, on average, while the peaks were measured
    others_cores: float = 0.0
    #: when they were measured (UTC)
    measured_at: datetime
    #: the torch version that measured them
    torch: str = ""

    @property
    def busy(self) -> bool:
        return self.others_cores > BUSY_CORES

    @property
    def measured_on(self) -> str:
        return f"{self.measured_at:%Y-%m-%d}"


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


def _grown_rate(runs, budget_s: float) -> float:
    """The best rate of ``runs`` ((work, run) pairs, growing), stopping before one would take longer than
    ``budget_s`` (a CPU without bfloat16 units runs them a hundred times slower)."""
    rates = []
    for index, (work, run) in enumerate(runs):
        rates.append(_best_rate(work, run, budget_s))
        following = runs[index + 1][0] if index + 1 < len(runs) else None
        if following is not None and following / rates[-1] > budget_s:
            break
    return max(rates)


def _matmuls(dtype: torch.dtype) -> list:
    def square(size: int):
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        return lambda: torch.mm(a, b)

    return [(2 * size**3, square(size)) for size in MATMUL_SIZES]


def _convolutions(dtype: torch.dtype) -> list:
    def convolution(channels: int, side: int):
        x, w = torch.randn(1, channels, side, side).to(dtype), torch.randn(channels, channels, 3, 3).to(dtype)
        return lambda: torch.nn.functional.conv2d(x, w, padding=1)

    return [(2 * 9 * c * c * side * side, convolution(c, side)) for c, side in CONV_SHAPES]


def measure_cpu_peaks(precisions: tuple[str, ...] = tuple(DTYPES), budget_s: float = 0.3) -> CpuPeaks:
    """Measure now: square matmuls and 3x3 convolutions of each dtype, growing while one takes less than
    ``budget_s``, and copies of each size; with the cores other processes used meanwhile (the machine's busy time
    less this process's CPU time, over the wall time)."""
    import psutil

    machine, own, start = _busy_s(psutil.cpu_times()), time.process_time(), time.perf_counter()
    tflops = {}
    with torch.no_grad():
        for key in precisions:
            tflops[key] = _grown_rate(_matmuls(DTYPES[key]), budget_s) / 1e12
            tflops[conv_key(key)] = _grown_rate(_convolutions(DTYPES[key]), budget_s) / 1e12
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
        measured_at=datetime.now(timezone.utc),
        torch=torch.__version__,
    )


def _busy_s(times) -> float:
    """Seconds the whole machine's cores spent on any process (``psutil.cpu_times()``: all but idle and I/O wait;
    Linux counts guest time inside user and nice time already, so it is taken out of the sum)."""
    left_out = ("idle", "iowait", "guest", "guest_nice")
    return sum(times) - sum(getattr(times, field, 0.0) for field in left_out)


def cpu_peaks(precisions: tuple[str, ...] = tuple(DTYPES)) -> CpuPeaks:
    """This CPU's peaks at the current thread count for ``precisions`` ("fp32", "bf16", "fp16"), matmuls' and
    convolutions' (none in a record stored before they were measured: its convolutions are charged the matmul peak
    until remeasured): those stored for this machine, or measured now (at every dtype) and stored for every later
    prediction."""
    found = stored_or_measured(cpu_name(), torch.get_num_threads())
    keys = [key for precision in precisions for key in (precision, conv_key(precision)) if key in found.tflops]
    return found.model_copy(update={"tflops": {key: found.tflops[key] for key in keys}})


@functools.cache
def stored_or_measured(cpu: str, threads: int) -> CpuPeaks:
    """The peaks stored for ``cpu`` at ``threads`` threads, else measured and stored (once per process)."""
    return _read(cpu, threads) or _measure_and_store()


def remeasure(budget_s: float = 0.3) -> CpuPeaks:
    """Measure this CPU's peaks now and replace the stored ones (``diffmeter doctor --remeasure-cpu``); ``budget_s``:
    seconds of repetitions per shape (``measure_cpu_peaks``)."""
    found = _measure_and_store(budget_s)
    stored_or_measured.cache_clear()
    return found


def stored() -> CpuPeaks | None:
    """The peaks stored for this machine at the current thread count, or None; never measures."""
    return _read(cpu_name(), torch.get_num_threads())


def _read(cpu: str, threads: int) -> CpuPeaks | None:
    record = cpu_peaks_store.load(cpu, threads)
    try:
        found = CpuPeaks.model_validate(record) if record is not None else None
    except ValueError:  # a file of an older layout: measured again, and replaced
        return None
    return found if found is not None and set(DTYPES) <= set(found.tflops) else None


def _measure_and_store(budget_s: float = 0.3) -> CpuPeaks:
    found = measure_cpu_peaks(budget_s=budget_s)
    cpu_peaks_store.save(found.model_dump(mode="json"))
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
