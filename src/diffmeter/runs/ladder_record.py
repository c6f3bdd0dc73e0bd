"""A stored ladder (ladder-*.json, written by ``ladder.climb``) and its reader, importable without torch: ``show``
and ``report`` read ladders without running one."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from diffmeter.measure.conditions import Conditions
from diffmeter.measure.quality_schema import Quality
from diffmeter.measure.speedup import Speedup
from diffmeter.runs import storage


class LadderRow(BaseModel):
    rung: str
    adds: str
    skipped: str | None = None
    folder: str | None = None
    steps: int | None = None
    dtype: str | None = None
    latency_s: float | None = None
    #: where the median latency lies (see Stats.ci_low/ci_high/ci_level)
    latency_interval_s: tuple[float, float] | None = None
    #: times faster than the baseline: Hodges-Lehmann estimate over every pair of calls (runs.speedups)
    speedup: float | None = None
    #: its exact Mann-Whitney interval
    speedup_interval: tuple[float, float] | None = None
    #: the whole speed-up: coverage, verdict and both runs' noise notes (None for the baseline itself)
    speedup_detail: Speedup | None = None
    measured_utc: str | None = None
    conditions: Conditions | None = None
    cold_start_overhead_s: float | None = None
    peak_memory_bytes: int | None = None
    energy_j_per_image: float | None = None
    quality: Quality | None = None
    #: seconds per call: the expected range the rung's run stored (predicted from its settings alone), and the
    #: median against it ("inside", "outside: 13% above the range"), or why there is none ("not timed: ...")
    expected_s: tuple[float, float] | None = None
    expected_verdict: str | None = None


class Ladder(BaseModel):
    model: str
    device: str
    rows: list[LadderRow]
    #: the baseline measured again after the last rung: did conditions hold?
    baseline_recheck_s: float | None = None
    baseline_recheck_interval_s: tuple[float, float] | None = None
    #: what a reader must know to trust the speed-ups (drift, rungs reused from other sessions, load)
    notes: list[str] = []
    #: the weights the rungs ran (``BenchResult.weights``: tiny random, random at real size, or pretrained)
    weights: str | None = None
    #: whether they were random (``BenchResult.weights_random``): the images are noise, their quality no quality
    weights_random: bool = False


def read_ladder(path: str | Path) -> Ladder:
    """A stored ladder-*.json; one clear line if it is not one."""
    return storage.read_model(Path(path).expanduser(), Ladder, "ladder", "re-run `diffmeter ladder`")
