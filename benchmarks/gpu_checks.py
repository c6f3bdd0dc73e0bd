"""The rules benchmarks/gpu_validation.py holds diffmeter's GPU figures to, each against an independent
measurement, so that each can fail on a wrong number; and the NVML readers those measurements come from.

Every rule is a function returning (outcome, detail): the chunks feed it what a GPU measured, and
``--self-test`` feeds it deliberately wrong inputs (a peak table off by 2x, an energy reader reading another
GPU's counter, a stray context on another GPU) through the same interfaces, on any machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: a bare bf16 matmul reaches this share of a correct dense datasheet peak at least (H100/H200: 0.77-0.81)
MATMUL_SHARE = (0.5, 1.0)
#: MFU a real pipeline's whole call can plausibly reach in eager PyTorch (published FLUX.1 runs: 21-66%)
MFU_BAND = (0.02, 0.9)
ENERGY_TOLERANCE = 0.05
MEMORY_TOLERANCE = 0.01
PREDICTION_TOLERANCE = 0.10
WALL_TOLERANCE = 0.02

Outcome = tuple[str, str]


def peak_table(datasheet_tflops: float, matmul_tflops: float, name: str) -> Outcome:
    """The datasheet's dense peak against what a bare matmul reached on the card: above it, or far beyond it,
    the table is wrong (and every MFU with it)."""
    share = matmul_tflops / datasheet_tflops
    ok = MATMUL_SHARE[0] <= share <= MATMUL_SHARE[1]
    return (
        "PASS" if ok else "FAIL",
        f"bare bf16 matmul {matmul_tflops:.0f} TFLOP/s is {100 * share:.0f}% of the table's {name} "
        f"{datasheet_tflops:g} TFLOP/s (a right dense peak: {100 * MATMUL_SHARE[0]:.0f}-{100 * MATMUL_SHARE[1]:.0f}%)",
    )


def mfu(achieved_tflops: float, datasheet_tflops: float, matmul_tflops: float) -> Outcome:
    """A pipeline's achieved FLOP/s cannot beat a bare matmul on the same card, and its MFU sits in a plausible
    band; both fail when the FLOPs or the time are off by a factor."""
    share = achieved_tflops / datasheet_tflops
    ok = achieved_tflops <= matmul_tflops and MFU_BAND[0] <= share <= MFU_BAND[1]
    return (
        "PASS" if ok else "FAIL",
        f"achieved {achieved_tflops:.0f} TFLOP/s (MFU {100 * share:.1f}%) against a bare matmul's "
        f"{matmul_tflops:.0f} TFLOP/s (limit) and a plausible MFU of {100 * MFU_BAND[0]:.0f}-{100 * MFU_BAND[1]:.0f}%",
    )


def energy(measured_j: float | None, nvml_j: float) -> Outcome:
    """diffmeter's reading of a window against NVML's total-energy counter of the run's GPU read around the same
    window: another GPU's counter, or a wrong unit, differs."""
    if measured_j is None:
        return "FAIL", f"diffmeter read no energy; NVML counted {nvml_j:.1f} J"
    off = measured_j / nvml_j - 1
    return (
        "PASS" if abs(off) <= ENERGY_TOLERANCE else "FAIL",
        f"diffmeter {measured_j:.1f} J, NVML's counter on the run's GPU {nvml_j:.1f} J "
        f"({100 * off:+.1f}%, limit {100 * ENERGY_TOLERANCE:.0f}%)",
    )


def agree(what: str, reported: float, independent: float, source: str, tolerance: float) -> Outcome:
    """A figure against the same quantity measured another way (bytes or seconds)."""
    off = reported / independent - 1
    return (
        "PASS" if abs(off) <= tolerance else "FAIL",
        f"{what} {reported:,.4g} vs {source} {independent:,.4g} ({100 * off:+.2f}%, limit {100 * tolerance:g}%)",
    )


def in_range(measured_s: float, expected_s: tuple[float, float], lower_s: float) -> Outcome:
    """A measured time against the prediction's expected range (calibrated on published runs): outside it the
    range, or the count it scales, is wrong for this card; under the lower bound the bound is."""
    lo, hi = expected_s
    ok = lo <= measured_s <= hi and measured_s >= lower_s
    return (
        "PASS" if ok else "FAIL",
        f"measured median {measured_s:.3f} s vs expected {lo:.3f}-{hi:.3f} s (midpoint "
        f"{100 * ((lo + hi) / 2 / measured_s - 1):+.0f}%), lower bound {lower_s:.3f} s",
    )


def energy_in_range(measured_j: float, expected_j: tuple[float, float]) -> Outcome:
    """A run's measured energy per image (Zeus) against the predicted range (fitted board power x time)."""
    lo, hi = expected_j
    return (
        "PASS" if lo <= measured_j <= hi else "FAIL",
        f"measured {measured_j:.1f} J per image vs predicted {lo:.1f}-{hi:.1f} J (midpoint "
        f"{100 * ((lo * hi) ** 0.5 / measured_j - 1):+.0f}%)",
    )


def fractions(found: dict[str, tuple[float, float]]) -> Outcome:
    """Achieved fractions of the datasheet peak per operator kind: each between 0 and 1, since no kernel beats the
    peak; above 1, an operator's FLOPs or bytes are counted too high or its time too low."""
    impossible = {kind: hi for kind, (lo, hi) in found.items() if not 0 < lo <= hi <= 1}
    shown = ", ".join(f"{kind} {lo:.2f}-{hi:.2f}" for kind, (lo, hi) in found.items())
    return (
        "FAIL" if impossible else "PASS",
        f"achieved fractions of peak: {shown}"
        + (f"; outside (0, 1]: {', '.join(impossible)}" if impossible else " (each within (0, 1])"),
    )


def stray_contexts(gpus_with_us: list[int], own: int) -> Outcome:
    """This process on no GPU but its own (a context opened on GPU 0 by an index-less call shows up here, which
    ``torch.cuda.memory_allocated(0)`` cannot see)."""
    stray = [index for index in gpus_with_us if index != own]
    return (
        "FAIL" if stray or own not in gpus_with_us else "PASS",
        f"NVML lists this process on GPU(s) {gpus_with_us or 'none'}; the run's is GPU {own}"
        + (f": a stray context on {stray}" if stray else ""),
    )


# ---- NVML, read directly (pynvml, from nvidia-ml-py) ----------------------------------------------------


def nvml_energy_j(index: int, nvml=None) -> Callable[[], float]:
    """A reader of GPU ``index``'s total-energy counter in joules (NVML counts millijoules since the driver
    loaded)."""
    nvml = nvml or _nvml()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000


def gpus_with_process(pid: int | None = None, nvml=None) -> list[int]:
    """The GPUs NVML lists this process on (compute processes): where it holds a context."""
    nvml, pid = nvml or _nvml(), pid or os.getpid()
    found = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if any(process.pid == pid for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle)):
            found.append(index)
    return found


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


# ---- the self-test --------------------------------------------------------------------------------------


class FakeNvml:
    """Two GPUs through pynvml's interface: GPU 0 idle (its counter moves 10 J a window), GPU 1 running the
    work (300 J), and this process holding contexts on both (a stray one on GPU 0). No NVML exists on a CPU
    machine; these are the numbers a wrong reading would give on a real one."""

    def __init__(self) -> None:
        self.counters_mj = [1_000_000, 5_000_000]

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (pynvml's names)
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # noqa: N802
        return self.counters_mj[handle]

    def window(self) -> None:
        self.counters_mj[0] += 10_000
        self.counters_mj[1] += 300_000

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:  # noqa: N802
        from types import SimpleNamespace

        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=500 << 20)]


def self_test() -> list[tuple[str, str, Outcome]]:
    """Each rule fed a deliberately wrong input; every outcome must be FAIL. (name, what is wrong, outcome)."""
    rows = []
    right_peak, matmul = 989.5, 798.0  # H200 SXM bf16 dense, and what a bare matmul reached on one
    rows.append(("peak table", "the datasheet peak halved", peak_table(right_peak / 2, matmul, "H200 SXM")))
    rows.append(("peak table", "the datasheet peak doubled", peak_table(right_peak * 2, matmul, "H200 SXM")))
    rows.append(("MFU", "a profile counting twice the FLOPs", mfu(2 * 700.0, right_peak, matmul)))
    nvml = FakeNvml()
    own, other = nvml_energy_j(1, nvml), nvml_energy_j(0, nvml)  # the run is on GPU 1
    before_own, before_other = own(), other()
    nvml.window()
    wrong = other() - before_other  # a reader of GPU 0's counter
    rows.append(("energy", "read from GPU 0's counter for a run on GPU 1", energy(wrong, own() - before_own)))
    rows.append(
        (
            "stage times",
            "events on a stream the work is not on",
            agree("device-timed total, s", 0.1, 0.3, "host wall clock", WALL_TOLERANCE),
        )
    )
    rows.append(("memory", "a peak read off by 2x", agree("peak bytes", 2 * 10 << 30, 10 << 30, "snapshot", 0.01)))
    rows.append(("fractions", "matmul FLOPs counted twice", fractions({"matmul": (0.9, 1.5), "attention": (0.3, 0.6)})))
    rows.append(("expected range", "a time counted 2x too fast", in_range(0.2, (0.3, 0.45), 0.1)))
    rows.append(("expected range", "a lower bound above the run", in_range(0.4, (0.3, 0.45), 0.5)))
    rows.append(("expected energy", "energy read at 2x the power", energy_in_range(400.0, (150.0, 210.0))))
    rows.append(("cuda:1", "a stray context on GPU 0", stray_contexts(gpus_with_process(nvml=nvml), own=1)))
    return rows
