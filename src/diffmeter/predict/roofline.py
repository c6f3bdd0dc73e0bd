"""Seconds per generation on a device, from every operator's work (``operators``).

Two bounds, each saying what it bounds:
- lower bound, of the eager operators as dispatched: each operator takes at least max(FLOPs / peak, bytes moved /
  bandwidth), summed over every operator of every call; an operator whose bytes fit in the card's L2 cache is
  charged no memory time (its inputs may still be there; no L2 bandwidth is assumed), so a small image on a card
  with a large L2 is not bounded by DRAM it may never touch; a call is never under its ideal bound.
- ideal bound, of any implementation at the run's dtype (compiled, fused): per call, max(its FLOPs / the dense
  peak, its weights read once / bandwidth), weights no larger than L2 not charged (an fp8 run is bounded at the
  fp8 peak, not by this).
Expected: each operator kind's lower bound divided by the fraction of
it that kind achieves, plus a cost per attention score (its softmax exponential runs on the special-function units,
a few TFLOP/s on an H100 against the tensor cores' hundreds: attention with a small head dimension is slower per
FLOP than its FLOPs say), plus a fixed cost per operator (launch, dispatch, Python), all as ranges
calibrated on measured runs (``data/efficiency.json``, written by ``benchmarks/roofline_cpu.py`` for
CPUs and ``benchmarks/calibrate_published.py``, from published runs, per GPU architecture). A device class without a
calibration gets the lower bound alone, and says so.
"""

from __future__ import annotations

import json
from collections import defaultdict
from importlib import resources

from pydantic import BaseModel

from diffmeter.errors import DiffmeterError
from diffmeter.predict.devices import Device
from diffmeter.predict.energy import predict_energy
from diffmeter.predict.schema import CallWork, OperatorWork, StageTime, TimePrediction
from diffmeter.stages import STAGES


class Calibration(BaseModel):
    """Achieved fractions of the roofline per operator kind ([lowest, highest] seen) and the time
    outside operators per operator (seconds), measured on the runs ``source`` names."""

    source: str
    fractions: dict[str, tuple[float, float]]
    overhead_s: tuple[float, float]
    #: seconds per attention score beyond its FLOPs (``OperatorGroup.scores``), where the fit has one
    score_s: tuple[float, float] | None = None
    #: the least eager bound per operator among the runs it was fitted on (seconds): a run under it is launch-bound
    #: beyond anything the fit saw
    least_bound_per_operator_s: float | None = None
    #: the average board power while generating, a share of the card's TDP, and the energy range's factor w,
    #: fitted on published runs' energy (``fit_energy``), with where they come from
    power_fraction: float | None = None
    energy_width: float | None = None
    energy_source: str | None = None


def calibrations() -> dict[str, Calibration]:
    """The shipped calibrations: "cpu", and "cuda:ARCHITECTURE" (eager runs)."""
    text = resources.files("diffmeter.predict").joinpath("data/efficiency.json").read_text()
    return {kind: Calibration.model_validate(found) for kind, found in json.loads(text).items()}


#: where an architecture without a fit of its own borrows one: the fractions are of each card's own peak and
#: bandwidth, so a neighbour's apply scaled by the card's datasheet figures
NEIGHBOURS = {
    "blackwell": "hopper",
    "rtx-blackwell": "blackwell",
    "ada": "ampere",
    "turing": "ampere",
    "volta": "ampere",
    "ampere": "hopper",
}


def calibration_for(device: Device) -> Calibration | None:
    """The device's calibration: its kind's ("cpu"), its architecture's, or the nearest neighbour's (said in the
    source); None where there is none."""
    shipped = calibrations()
    if device.kind != "cuda":
        return shipped.get(device.kind)
    architecture = device.architecture
    tried = []
    while architecture and architecture not in tried:
        found = shipped.get(f"cuda:{architecture}")
        if found is not None:
            if architecture == device.architecture:
                return found
            borrowed = f"{found.source}; borrowed for {device.architecture} ({device.name}) from {architecture}"
            return found.model_copy(update={"source": borrowed})
        tried.append(architecture)
        architecture = NEIGHBOURS.get(architecture)
    return None


def operator_lower_s(flops: int, moved: int, peak_flops: float, bandwidth: float, l2_bytes: int | None = None) -> float:
    """One operator's least time; bytes that fit in ``l2_bytes`` cost none."""
    return max(flops / peak_flops, 0.0 if l2_bytes and moved <= l2_bytes else moved / bandwidth)


def lower_bounds(
    work: OperatorWork, peak_flops: float, bandwidth: float, l2_bytes: int | None = None
) -> dict[str, dict[str, list[float]]]:
    """Per stage, per operator kind: [lower-bound seconds, operators] over one generation."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for call in work.calls:
        for group in call.operators:
            total = found[call.stage][group.kind]
            seconds = operator_lower_s(group.flops, group.bytes, peak_flops, bandwidth, l2_bytes)
            total[0] += seconds * group.calls * call.count
            total[1] += group.calls * call.count
    return found


def call_bounds(
    call: CallWork, read: int, peak_flops: float, bandwidth: float, l2_bytes: int | None = None
) -> tuple[float, float]:
    """One call's (eager, ideal) seconds, times its count. Ideal: its FLOPs at ``peak_flops`` or its weights
    (``read`` bytes) once, whichever takes longer. Eager: its operators' bounds summed, and never under the ideal
    (an operator's bytes may each fit in L2 while the call's weights do not)."""
    flops = sum(group.flops * group.calls for group in call.operators)
    ideal = max(flops / peak_flops, 0.0 if l2_bytes and read <= l2_bytes else read / bandwidth)
    eager = sum(
        operator_lower_s(group.flops, group.bytes, peak_flops, bandwidth, l2_bytes) * group.calls
        for group in call.operators
    )
    return max(eager, ideal) * call.count, ideal * call.count


def stage_bounds(
    work: OperatorWork, weights: dict[str, int], peak_flops: float, bandwidth: float, l2_bytes: int | None = None
) -> dict[str, tuple[float, float]]:
    """Per stage, (eager, ideal) seconds over one generation; ``weights``: the bytes each component's call reads
    of its weights at least."""
    found: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for call in work.calls:
        eager, ideal = call_bounds(call, weights.get(call.component, 0), peak_flops, bandwidth, l2_bytes)
        found[call.stage][0] += eager
        found[call.stage][1] += ideal
    return {stage: (eager, ideal) for stage, (eager, ideal) in found.items()}


def peak_of(device: Device, dtype: str, precision: str | None = None) -> float | None:
    """The device's dense peak (TFLOP/s) for ``dtype``, or for ``precision`` ("tf32") when given."""
    return device.tflops.get(precision) if precision else device.peak_tflops(dtype)


def missing_figures(device: Device, dtype: str, precision: str | None = None) -> str | None:
    """Why ``device``'s figures cannot give a time (no peak for the dtype, no bandwidth), or None."""
    if peak_of(device, dtype, precision) and device.bandwidth_bytes_per_s:
        return None
    return (
        f"{device.name} has no {precision or dtype} peak or no memory bandwidth; give both with --gpu-spec "
        '(e.g. "24GB,165TFLOPS,1TB/s")'
    )


def predict_time(
    work: OperatorWork,
    device: Device,
    precision: str | None = None,
    calibration: Calibration | None = None,
    weights: dict[str, int] | None = None,
    outputs: int = 1,
) -> TimePrediction:
    """The time of the generation ``work`` describes on ``device``; ``precision`` overrides the peak's
    key ("tf32" for float32 matmuls on TF32 tensor cores, "fp8"); ``calibration`` the shipped one for the
    device's kind; ``weights``: the bytes each component's call reads of its weights at least
    (``MemoryPrediction.weight_read_bytes``), for the ideal bound; ``outputs``: the images (or videos) one
    generation makes, for the energy per output."""
    lacking = missing_figures(device, work.dtype, precision)
    if lacking:
        raise DiffmeterError(lacking)
    peak_tflops = peak_of(device, work.dtype, precision)
    calibration = calibration or calibration_for(device)
    bounds = lower_bounds(work, peak_tflops * 1e12, device.bandwidth_bytes_per_s, device.l2_bytes)
    both = stage_bounds(work, weights or {}, peak_tflops * 1e12, device.bandwidth_bytes_per_s, device.l2_bytes)
    stages = []
    for stage in STAGES:
        if stage not in bounds:
            continue
        kinds = bounds[stage]
        flops = sum(g.flops * g.calls * c.count for c in work.calls if c.stage == stage for g in c.operators)
        moved = sum(g.bytes * g.calls * c.count for c in work.calls if c.stage == stage for g in c.operators)
        operators = int(sum(count for _, count in kinds.values()))
        scores = sum(g.scores * g.calls * c.count for c in work.calls if c.stage == stage for g in c.operators)
        stages.append(
            StageTime(
                stage=stage,
                operators=operators,
                flops=flops,
                bytes=moved,
                lower_s=both[stage][0],
                expected_s=at_least(expected_s(kinds, operators, calibration, scores), both[stage][0])
                if calibration
                else None,
                ideal_s=both[stage][1] if weights is not None else None,
            )
        )
    expected = [stage.expected_s for stage in stages]
    lower, operators = sum(stage.lower_s for stage in stages), sum(stage.operators for stage in stages)
    whole = (sum(e[0] for e in expected), sum(e[1] for e in expected)) if calibration else None
    launch_bound = outside(calibration, lower / operators) if calibration and operators else None
    return TimePrediction(
        device=device.name,
        dtype=work.dtype,
        peak_tflops=peak_tflops,
        bandwidth_bytes_per_s=device.bandwidth_bytes_per_s,
        stages=stages,
        lower_s=lower,
        expected_s=whole,
        outside_calibration=launch_bound,
        energy=predict_energy(whole, device, outputs, calibration, launch_bound) if calibration else None,
        ideal_s=sum(both[stage.stage][1] for stage in stages) if weights is not None else None,
        l2_bytes=device.l2_bytes,
        calibration=calibration.source if calibration else f"no calibration for {device.kind} devices yet",
    )


def outside(calibration: Calibration, bound_per_operator_s: float) -> str | None:
    """Why the expected range may not hold for a run whose operators are smaller than any the fit saw, or None."""
    least = calibration.least_bound_per_operator_s
    if least is None or bound_per_operator_s >= least:
        return None
    return (
        f"outside the fitted runs: {bound_per_operator_s * 1e6:.1f} us of eager bound per operator, under the "
        f"{least * 1e6:.1f} us of every run the range was fitted on; so short a run is bound by launching its "
        "operators, and can be up to 2x slower than the range's midpoint (SD 1.5 and PixArt-Sigma at 512 px, 8 steps, "
        "on an H200: benchmarks/results/gpu_validation_nvidia-h200.md)"
    )


def at_least(expected: tuple[float, float], lower: float) -> tuple[float, float]:
    """An expected range never under the eager bound (no eager run is faster)."""
    return max(expected[0], lower), max(expected[1], lower)


def expected_s(
    kinds: dict[str, list[float]], operators: int, calibration: Calibration, scores: int = 0
) -> tuple[float, float]:
    """A stage's expected range: each kind's lower bound over its highest and lowest achieved fraction
    (a kind not calibrated takes "other"'s), plus the cost of its attention ``scores`` and the overhead per
    operator."""
    low, high = (scores * calibration.score_s[0], scores * calibration.score_s[1]) if calibration.score_s else (0, 0)
    for kind, (seconds, _) in kinds.items():
        fractions = calibration.fractions.get(kind, calibration.fractions["other"])
        low += seconds / fractions[1]
        high += seconds / fractions[0]
    return low + operators * calibration.overhead_s[0], high + operators * calibration.overhead_s[1]
