"""The results.json schema of a measured run (exported to docs/bench.schema.json).

"images" counts outputs: an image, or a whole video for video models.

Every duration is in seconds (``_s``), memory in bytes, energy in joules (``_j``),
power in watts (``_w``), throughput in TFLOP/s (10^12 floating-point operations per
second, 2 per multiply-accumulate), host-link copy rates in GB/s (``_gb_s``, 10^9 bytes per second).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, PrivateAttr

from diffmeter.flops.schema import Profile
from diffmeter.measure.compilation import Compilation
from diffmeter.measure.conditions import Conditions
from diffmeter.measure.energy import Energy
from diffmeter.measure.environment import Environment
from diffmeter.measure.memory import PeakMemory
from diffmeter.measure.quality_schema import Quality
from diffmeter.measure.speedup import Speedup as Rule
from diffmeter.measure.speedup import Verdict
from diffmeter.measure.stats import Stats
from diffmeter.measure.trace import TraceSummary
from diffmeter.predict.peaks import Peak
from diffmeter.predict.schema import RunPrediction
from diffmeter.runs.iteration import Iteration
from diffmeter.runs.parallel_records import Parallel
from diffmeter.runs.spec import BenchSpec

SCHEMA_VERSION = 2


class ImageRecord(BaseModel):
    """A saved output: the prompt (or class label) and the seed that made it."""

    path: str
    iteration: int
    seed: int
    prompt: str | None = None
    class_label: int | None = None


class Summary(BaseModel):
    """Statistics over the measured iterations."""

    iterations: int
    images: int
    latency_s: Stats
    stages_s: dict[str, Stats]
    #: one denoising step: statistics over the measured calls of each call's median step (n: calls)
    step_s: Stats
    images_per_s: float
    s_per_image: float
    #: first call minus the steady-state median (0 when the first call was not slower): first-call allocation,
    #: lazy initialization, caches, and compilation where ``first_call_compilation`` counted some
    cold_start_overhead_s: float
    peak_memory: PeakMemory
    energy: Energy
    #: FLOPs of each stage per call ("step": one denoising step), from the stored profile
    flops: dict[str, int]
    #: those FLOPs divided by the stage's median time, in TFLOP/s
    achieved_tflops: dict[str, float]
    peak: Peak | None = None
    #: achieved_tflops / peak; empty when the peak is unknown (see ``mfu_note``)
    mfu: dict[str, float] = {}
    mfu_note: str | None = None
    #: compilation inside the measured calls (should be none: see notes when not)
    compilation: Compilation = Compilation()
    #: compilation inside the first (cold) call; None in runs stored before it was counted
    first_call_compilation: Compilation | None = None
    #: what else the machine was doing during the measured calls
    conditions: Conditions | None = None
    #: the precision --target-precision asked for (None: a fixed number of calls)
    target_precision: float | None = None

    def stage_shares(self) -> dict[str, tuple[float, float]]:
        """Stage -> (mean seconds per call, percent of the mean call): the shares `show`, `table` and the report
        give; the stages of every call add up to it, so the percents add up to 100."""
        total = self.latency_s.mean
        return {name: (stats.mean, 100 * stats.mean / total if total else 0.0) for name, stats in self.stages_s.items()}


class Speedup(BaseModel):
    """The record of a --compare-baseline run: which run was its baseline and the speed-up per image of the
    whole call by the rule every command shows (``runs.speedups.between``: the Hodges-Lehmann estimate over
    both runs' calls and its exact interval), so the stored figure and the shown one are the same."""

    baseline: str
    factor: float
    ci_low: float
    ci_high: float
    #: the probability the interval covers the true factor
    ci_level: float
    #: the rule's verdict, the figure as every table words it ("within noise (0.49-1.71x) (noisy)",
    #: ``measure.speedup.Speedup.text``) and why either run's timings are noisy; None and [] in runs stored before
    verdict: Verdict | None = None
    text: str | None = None
    noise: list[str] = []

    @classmethod
    def of(cls, rule: Rule, baseline: str) -> Speedup:
        """The record of ``rule`` (``runs.speedups.between``'s) against the run stored in ``baseline``."""
        return cls(
            baseline=baseline,
            factor=rule.estimate,
            ci_low=rule.low,
            ci_high=rule.high,
            ci_level=rule.coverage,
            verdict=rule.verdict,
            text=rule.text(),
            noise=rule.notes,
        )

    @property
    def within_noise(self) -> bool:
        """The verdict's (the interval holds 1x, or the estimate is within the least effect of it); in a run stored
        without one, whether the interval holds 1x."""
        return self.verdict == "within noise" if self.verdict else self.ci_low <= 1.0 <= self.ci_high


class AppliedOptimization(BaseModel):
    """A technique applied to the run, as the registry describes it; ``params`` holds every
    parameter value that ran, defaults included."""

    name: str
    label: str
    kind: str
    lossless: bool
    params: dict[str, Any] = {}


class ModelInfo(BaseModel):
    id: str
    name: str
    family: str
    pipeline_class: str
    origin: str


class BenchResult(BaseModel):
    """A whole measured run; ``status`` is "complete" or "failed" (then ``error`` says why)."""

    schema_version: int = SCHEMA_VERSION
    status: Literal["complete", "failed"]
    created_utc: str
    spec: BenchSpec
    model: ModelInfo
    weights: str
    weights_random: bool
    environment: Environment
    #: each model component's dtype as loaded (its first floating-point parameter's); empty for a failed load
    component_dtypes: dict[str, str] = {}
    load_s: float | None = None
    #: how float32 matmuls and convolutions ran in the measured calls ("tf32" or "ieee"); CUDA only
    fp32_precision: dict[str, str] | None = None
    first_call_s: float | None = None
    first_call: Iteration | None = None
    warmup_s: list[float] = []
    iterations: list[Iteration] = []
    summary: Summary | None = None
    profile: Profile | None = None
    optimizations: list[AppliedOptimization] = []
    #: images against the unoptimized run at the same seeds (``--compare-baseline``)
    quality: Quality | None = None
    #: speed against that same unoptimized run (``--compare-baseline``)
    speedup: Speedup | None = None
    images: list[ImageRecord] = []
    #: ``--trace``: one extra call after the measured ones, under torch.profiler (not in ``iterations``)
    trace: TraceSummary | None = None
    #: the offline prediction for the run's settings on its device (``bench --predict``, the default)
    prediction: RunPrediction | None = None
    #: a multi-process run (``--ulysses-degree``, ``--ring-degree``, ``--data-parallel``): its ranks
    parallel: Parallel | None = None
    notes: list[str] = []
    error: str | None = None

    #: the run folder it was stored in or read from (not part of results.json)
    _folder: Path | None = PrivateAttr(default=None)

    @property
    def folder(self) -> Path | None:
        return self._folder

    def stored_in(self, folder: Path) -> BenchResult:
        """This result, marked as stored in (or read from) the run folder ``folder``."""
        self._folder = folder
        return self

    def to_json_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)


def json_schema() -> dict:
    return BenchResult.model_json_schema(by_alias=True, mode="serialization")
