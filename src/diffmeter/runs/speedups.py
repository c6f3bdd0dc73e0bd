"""Two stored runs into one speed-up by the rule of ``measure.speedup``: their per-image times of a
stage from every measured call, and the noise notes each run stored about itself."""

from __future__ import annotations

import statistics

from diffmeter.measure.speedup import Criteria, Drift, Speedup, estimate
from diffmeter.quantization_spec import DENOISER
from diffmeter.runs.results import AppliedOptimization, BenchResult
from diffmeter.stages import STAGE_NAMES
from diffmeter.stages import STAGES as PIPELINE_STAGES

#: stages a speed-up can be of, as (name, the Iteration's field holding one call's seconds of it)
STAGES: dict[str, str] = {"call": "total_s", **{stage: f"{stage}_s" for stage in (*PIPELINE_STAGES, "other")}}

#: how a stored note about the run's own timings begins (runs.summary.measurement_notes writes them)
NOISE_PREFIXES = ("noisy:", "--target-precision", "other processes used")
#: kinds of technique that change the denoiser or its loop alone (caches, samplers, fused projections, attention
#: backends and SDPA kernels, each applied to the denoisers: ``optimize.base.denoisers``): their run's other stages
#: time the machine, not them
DENOISER_ONLY = ("cache", "scheduler", "fusion", "attention")
#: how far (either way) one of those stages' medians may move between the two runs before the machine is said to have
#: changed speed: far beyond the few percent two calls of one run differ by on a quiet machine
DRIFT = 1.25
#: spec fields two runs may differ in and still do the same work outside the denoising loop: how they were measured
#: and stored, the techniques (checked by kind), the step count
SAME_WORK_BESIDES = (
    "optimizations",
    "steps",
    "warmup",
    "iterations",
    "min_duration_s",
    "target_precision",
    "max_iterations",
    "save_images",
    "compare_baseline",
    "memory_check",
    "trace",
    "predict",
)


def per_image(result: BenchResult, stage: str = "call") -> list[float]:
    """Seconds per image of ``stage`` in every measured call."""
    field = STAGES[stage]
    return [
        (iteration.total_s if field == "total_s" else getattr(iteration.stages, field)) / iteration.images
        for iteration in result.iterations
    ]


def noise_notes(result: BenchResult) -> list[str]:
    """What the run stored about noise in its own timings (an interval too wide, other processes busy)."""
    notes = [note for note in result.notes if note.startswith(NOISE_PREFIXES)]
    conditions = result.summary.conditions if result.summary is not None else None
    disturbed = conditions.disturbed() if conditions is not None else None
    if disturbed and disturbed not in notes:
        notes.append(disturbed)
    return notes


def between(
    baseline: BenchResult,
    candidate: BenchResult,
    stage: str = "call",
    criteria: Criteria | None = None,
    names: tuple[str, str] = ("baseline", "this run"),
    drift: Drift | None = None,
) -> Speedup | None:
    """How many times faster ``candidate`` is than ``baseline`` at ``stage``; None when either is not a
    complete run or one of them does not have the stage (a DiT encodes no text). ``drift``: a change in the
    machine's speed seen otherwise (a ladder's baseline measured again), beside the one the stages show."""
    if any(r.status != "complete" or not r.iterations for r in (baseline, candidate)):
        return None
    times = per_image(baseline, stage), per_image(candidate, stage)
    if min(times[0] + times[1]) <= 0:
        return None
    runs = zip(names, (baseline, candidate), strict=True)
    notes = [f"{name}: {note}" for name, run in runs for note in noise_notes(run)]
    return estimate(*times, criteria, notes, Drift.joined([machine_drift(baseline, candidate), drift]))


def machine_drift(baseline: BenchResult, candidate: BenchResult) -> Drift | None:
    """Where ``candidate`` does the same work as ``baseline`` but in the denoising loop (it adds only techniques of a
    ``DENOISER_ONLY`` kind, at the same settings) and a stage outside the loop took more than ``DRIFT`` times longer
    (or shorter) in it: the machine's speed changed between them, and the speed-up holds that change too (new users'
    trials: "23.3x slower" for SeaCache while the untouched text encoding took 24x as long; "22.2x faster" for fused
    QKV while text encoding took a third). The interval is widened by every untouched stage's ratio. None otherwise."""
    added = {o.label: o for o in candidate.optimizations}
    for applied in baseline.optimizations:
        added.pop(applied.label, None)
    if not added or not all(map(denoiser_only, added.values())) or not _same_work(baseline, candidate):
        return None
    ratios = {}
    for stage in PIPELINE_STAGES:
        if stage == "denoising":
            continue
        before, after = per_image(baseline, stage), per_image(candidate, stage)
        if before and after and min(statistics.median(before), statistics.median(after)) > 1e-3:
            ratios[stage] = statistics.median(after) / statistics.median(before)
    if not any(r > DRIFT or r < 1 / DRIFT for r in ratios.values()):
        return None
    said = ", ".join(f"{STAGE_NAMES[stage]} {ratio:.2f}x" for stage, ratio in ratios.items())
    techniques = " + ".join(added)
    return Drift.of(
        list(ratios.values()),
        f"machine changed speed: stages that {techniques} leaves alone took other times than in the baseline "
        f"({said} as long), so the interval is widened by that; measure both again (--force)",
    )


def denoiser_only(applied: AppliedOptimization) -> bool:
    """Whether ``applied`` changes the denoisers or their loop alone: a ``DENOISER_ONLY`` kind, or a quantization of
    the denoisers (``--quantize`` names no component, or "denoiser": its default; a new user's trial: "other 1.85x
    faster" under quanto:int8, which leaves the pipeline's own work alone, while the machine's load changed)."""
    if applied.kind == "quantization":
        return set(applied.params.get("components") or [DENOISER]) == {DENOISER}
    return applied.kind in DENOISER_ONLY


def _same_work(baseline: BenchResult, candidate: BenchResult) -> bool:
    """Whether the two runs' settings differ only in what ``SAME_WORK_BESIDES`` lists (not in dtype, size, batch)."""
    before, after = (run.spec.model_dump(exclude=set(SAME_WORK_BESIDES)) for run in (baseline, candidate))
    return before == after
