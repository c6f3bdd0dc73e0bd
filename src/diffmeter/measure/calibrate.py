"""Calibrating the expected range (``roofline.Calibration``) from traced runs (``bench --trace``).

Per stage of a traced run, each operator kind's measured time is its self time in the traced call,
scaled to the stage's measured median (the profiler slows the traced call); the time outside
operators (Python, the pipeline's code) is scaled the same way. Against the roofline lower bounds of
the same generation, each kind's achieved fraction in a run is its bound over its measured time, summed
over the run's stages, and the overhead is the outside time per predicted operator.
``benchmarks/roofline_cpu.py`` ships the CPU calibration; ``benchmarks/gpu_validation.py --chunk
predictions`` measures CUDA's.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel

from diffmeter.measure.ops import OUTSIDE
from diffmeter.measure.trace import read_ops
from diffmeter.predict.calibration import Calibration
from diffmeter.predict.roofline import STAGES

#: a kind below this share of the run's time gives no sample (too little time to divide by)
MIN_SHARE = 0.01
#: the key of kinds ``pooled`` into one
POOL = "pooled"


class StageMeasurement(BaseModel):
    """One stage of a traced run (seconds): its measured median and fastest call, each operator kind's
    time and the time outside operators, scaled to the median."""

    median_s: float
    min_s: float
    kinds_s: dict[str, float]
    outside_s: float


def stage_measurements(result) -> dict[str, StageMeasurement]:
    """The stages of a stored run traced with ``--trace`` (a ``BenchResult`` read from its folder)."""
    found = {}
    for stage in read_ops(result).stages:
        if stage.stage not in STAGES or stage.range_s <= 0:
            continue
        stats = result.summary.stages_s[stage.stage]
        scale = stats.median / stage.range_s
        found[stage.stage] = StageMeasurement(
            median_s=stats.median,
            min_s=stats.min,
            kinds_s={kind: total.self_s * scale for kind, total in stage.kinds.items()},
            outside_s=sum(row.self_s for row in stage.rows if row.name == OUTSIDE) * scale,
        )
    return found


def pooled(
    measured: dict[str, StageMeasurement], lower: dict[str, dict[str, list[float]]], kinds: tuple[str, ...]
) -> tuple[dict[str, StageMeasurement], dict[str, dict[str, list[float]]]]:
    """``measured`` and ``lower`` with ``kinds`` as one kind (``POOL``), where a trace cannot tell them apart: a
    compiled call's generated loops, which the CPU profiler sees as one ``CompiledFxGraph`` call."""
    merged_lower = {}
    for stage, found in lower.items():
        kept = {kind: list(pair) for kind, pair in found.items() if kind not in kinds}
        merged = [sum(found[k][0] for k in kinds if k in found), sum(found[k][1] for k in kinds if k in found)]
        merged_lower[stage] = {**kept, POOL: merged} if merged[1] else kept
    merged_measured = {}
    for stage, found in measured.items():
        times = {kind: s for kind, s in found.kinds_s.items() if kind not in kinds}
        times[POOL] = sum(s for kind, s in found.kinds_s.items() if kind in kinds)
        merged_measured[stage] = found.model_copy(update={"kinds_s": times})
    return merged_measured, merged_lower


def samples(
    measured: dict[str, StageMeasurement], lower: dict[str, dict[str, list[float]]]
) -> tuple[dict[str, float], float | None]:
    """One run's achieved fraction per kind (its bounds over its measured times, summed over the stages,
    so a stage of a few small operators does not weigh like the denoising loop) and its time outside
    operators per operator (seconds); ``lower``: ``roofline.lower_bounds`` of the same generation."""
    bound, spent, outside, operators = defaultdict(float), defaultdict(float), 0.0, 0
    for stage, found in measured.items():
        if stage not in lower:
            continue
        for kind, (seconds, count) in lower[stage].items():
            bound[kind] += seconds
            spent[kind] += found.kinds_s.get(kind, 0.0)
            operators += count
        outside += found.outside_s
    total = sum(found.median_s for stage, found in measured.items() if stage in lower)
    fractions = {
        kind: bound[kind] / spent[kind] for kind in bound if spent[kind] >= MIN_SHARE * total and bound[kind] > 0
    }
    return fractions, outside / operators if operators else None


def calibrate(runs: list[tuple[dict[str, StageMeasurement], dict]], source: str) -> Calibration:
    """The lowest and highest fraction per kind, and overhead, over ``runs`` (measurements, lower bounds);
    "other" spans every kind's when no operator of its own was sampled; the least eager bound per operator of any
    run, under which a prediction is said to be outside the fitted runs (``expected_range.outside``)."""
    fractions, overheads, per_operator = defaultdict(list), [], []
    for measured, lower in runs:
        kinds = [figures for stage in lower.values() for figures in stage.values()]
        if operators := sum(count for _, count in kinds):
            per_operator.append(sum(seconds for seconds, _ in kinds) / operators)
        found, outside = samples(measured, lower)
        for kind, value in found.items():
            fractions[kind].append(value)
        if outside is not None:
            overheads.append(outside)
    if "other" not in fractions:
        fractions["other"] = [min(min(v) for v in fractions.values()), max(max(v) for v in fractions.values())]
    return Calibration(
        source=source,
        fractions={kind: (min(values), max(values)) for kind, values in sorted(fractions.items())},
        overhead_s=(min(overheads), max(overheads)),
        least_bound_per_operator_s=min(per_operator, default=None),
    )
