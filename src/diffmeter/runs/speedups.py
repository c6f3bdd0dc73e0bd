"""Two stored runs into one speed-up by the rule of ``measure.speedup``: their per-image times of a
stage from every measured call, and the noise notes each run stored about itself."""

from __future__ import annotations

from diffmeter.measure.speedup import Criteria, Speedup, estimate
from diffmeter.runs.results import BenchResult
from diffmeter.stages import STAGES as PIPELINE_STAGES

#: stages a speed-up can be of, as (name, the Iteration's field holding one call's seconds of it)
STAGES: dict[str, str] = {"call": "total_s", **{stage: f"{stage}_s" for stage in (*PIPELINE_STAGES, "other")}}

#: how a stored note about the run's own timings begins (runs.summary.measurement_notes writes them)
NOISE_PREFIXES = ("noisy:", "--target-precision", "other processes used")


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
) -> Speedup | None:
    """How many times faster ``candidate`` is than ``baseline`` at ``stage``; None when either is not a
    complete run or one of them does not have the stage (a DiT encodes no text)."""
    if any(r.status != "complete" or not r.iterations for r in (baseline, candidate)):
        return None
    times = per_image(baseline, stage), per_image(candidate, stage)
    if min(times[0] + times[1]) <= 0:
        return None
    runs = zip(names, (baseline, candidate), strict=True)
    notes = [f"{name}: {note}" for name, run in runs for note in noise_notes(run)]
    return estimate(*times, criteria, notes)
