"""The expected time range of eager runs on CUDA GPUs, fitted on published, measured runs
(``benchmarks/calibrate_published.py`` reads benchmarks/published_figures.yaml and writes the fit into
``data/efficiency.json``, one calibration per GPU architecture).

Model, per architecture: a run's time = the sum over kind groups (``GROUPS``) of a_group x the eager bound of the
group's operators + score_s x its attention scores (the softmax exponentials, on the special-function units, which
make attention with a 64-wide head slower per FLOP than with a 128-wide one) + overhead x its operators. a = 1 / the
fraction of the roofline a group achieves, so a >= 1 (no eager operator beats its bound; the compute group's a at
least the inverse of a bare matmul's measured fraction, ``BARE_MATMUL_FRACTION``), score_s and the overhead >= 0;
fitted by least squares on relative errors (each run counts alike, whatever its length). With fewer than
``FULL_MODEL_ROWS`` runs or ``FULL_MODEL_MODELS`` models, one multiplier on the whole eager bound instead.

The range: the midpoint times [1 / w, w], hi / lo = w^2 = 1.5 (``RANGE_FACTOR``, the width issue 27 asks for, not
fitted), widened where fewer than ``LEAST_INSIDE`` (80%) of the fitted runs would fall inside it; the validation
below measures how many held-out runs it holds.
Validation leaves one source (not one row) out at a time, or one model where a single source measured every run
of an architecture: the held-out runs against the range fitted without them (coverage, the midpoint's median
error, the width hi / lo).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from diffmeter.predict.roofline import Calibration

#: the operator kinds fitted together, each group with its own multiplier: the dense compute at the dtype's peak;
#: attention; normalization (layer, group and RMS norms: eager kernels far under their bandwidth bound on every
#: fitted card); elementwise; the rest (copies, reductions, indexing)
GROUPS = {
    "compute": ("matmul", "convolution"),
    "attention": ("attention",),
    "normalization": ("normalization",),
    "elementwise": ("elementwise",),
    "other": ("other",),
}
GROUP_OF_KIND = {kind: group for group, kinds in GROUPS.items() for kind in kinds}
COVERAGE = 0.95
#: the time range's factor w (hi / lo 1.5), and the share of the fitted runs it must hold, else it is widened
RANGE_FACTOR, LEAST_INSIDE = math.sqrt(1.5), 0.8
FULL_MODEL_ROWS, FULL_MODEL_MODELS = 8, 4
#: the scores column's unit in the least squares (seconds per 10^12 scores), so its columns are alike in size
SCORE_UNIT = 1e-12
#: per architecture, the highest fraction of the table's dense bf16 peak a bare 8192^3 bf16 matmul reached,
#: measured: no eager matmul or convolution beats it, so the compute group's a is at least its inverse (an
#: architecture not measured keeps a >= 1). Hopper: 782-802 TFLOP/s of the H200's 989.5 in five runs
#: (benchmarks/results/gpu_validation_nvidia-h200.md, the peak chunk, CUDA events)
BARE_MATMUL_FRACTION = {"hopper": 802 / 989.5}


@dataclass(frozen=True)
class PublishedRun:
    """One published eager run with its predicted work: the eager bound per kind group (seconds, ``GROUPS``), its
    attention scores and operators."""

    id: str
    source: str
    architecture: str
    model: str
    published_s: float
    bounds: dict[str, float] = field(hash=False)
    scores: int
    operators: int

    @property
    def eager_s(self) -> float:
        """The whole eager bound (seconds)."""
        return sum(self.bounds.values())

    def features(self) -> list[float]:
        return [self.bounds.get(group, 0.0) for group in GROUPS] + [self.scores * SCORE_UNIT, self.operators]


@dataclass(frozen=True)
class Fit:
    """a per kind group (>= 1), seconds per attention score and per operator (>= 0), and the range's factor w."""

    multipliers: dict[str, float] = field(hash=False)
    score_s: float
    overhead_s: float
    width: float

    def midpoint(self, run: PublishedRun) -> float:
        eager = sum(self.multipliers[group] * seconds for group, seconds in run.bounds.items())
        return eager + self.score_s * run.scores + self.overhead_s * run.operators

    def range(self, run: PublishedRun) -> tuple[float, float]:
        middle = self.midpoint(run)
        return middle / self.width, middle * self.width


def _bounded_least_squares(matrix: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """min |matrix x - 1| with x >= lower: every set of variables held at their bound tried (7 variables: 128 sets)."""
    best, best_residual = None, math.inf
    count = matrix.shape[1]
    for held in itertools.chain.from_iterable(itertools.combinations(range(count), k) for k in range(count + 1)):
        x = lower.astype(float).copy()
        free = [i for i in range(count) if i not in held]
        if free:
            target = np.ones(matrix.shape[0]) - matrix[:, list(held)] @ x[list(held)]
            x[free] = np.linalg.lstsq(matrix[:, free], target, rcond=None)[0]
        if np.any(x < lower - 1e-12):
            continue
        residual = float(np.sum((matrix @ x - 1) ** 2))
        if residual < best_residual:
            best, best_residual = x, residual
    return best


def fit(runs: list[PublishedRun]) -> Fit:
    """The model fitted on ``runs`` (one architecture), with its range's factor."""
    full = len(runs) >= FULL_MODEL_ROWS and len({run.model for run in runs}) >= FULL_MODEL_MODELS
    published = np.array([[run.published_s] for run in runs])
    if full:
        floor = {group: 1.0 for group in GROUPS}  # each a >= 1, compute's >= 1 / the bare matmul's fraction
        floor["compute"] = 1 / min(BARE_MATMUL_FRACTION.get(run.architecture, 1.0) for run in runs)
        lower = np.array([*floor.values(), 0.0, 0.0])  # the score and operator costs >= 0
        *a, score, overhead = _bounded_least_squares(np.array([run.features() for run in runs]) / published, lower)
        point = Fit(dict(zip(GROUPS, a, strict=True)), score * SCORE_UNIT, overhead, 1.0)
    else:
        (a,) = _bounded_least_squares(np.array([[run.eager_s] for run in runs]) / published, np.array([1.0]))
        point = Fit(dict.fromkeys(GROUPS, a), 0.0, 0.0, 1.0)
    width = max(RANGE_FACTOR, covering([point.midpoint(run) / run.published_s for run in runs], LEAST_INSIDE))
    return replace(point, width=width)


def covering(ratios: list[float], share: float = COVERAGE) -> float:
    """The smallest factor w with ``share`` of the predicted / published ``ratios`` inside [1 / w, w]."""
    spread = sorted(max(ratio, 1 / ratio) for ratio in ratios)
    return spread[min(len(spread) - 1, math.ceil(share * len(spread)) - 1)] * (1 + 1e-9)  # the edge run inside


@dataclass(frozen=True)
class HeldOut:
    run: PublishedRun
    midpoint: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.run.published_s <= self.high

    @property
    def error(self) -> float:
        """The midpoint's error, a fraction of the published time."""
        return self.midpoint / self.run.published_s - 1


def leave_one_out(runs: list[PublishedRun], by: str = "source") -> list[HeldOut]:
    """Each group's runs (``by``: "source", or "model" where one source measured them all) against the fit of the
    other groups' runs; a single group is not held out."""
    found = []
    for group in sorted({getattr(run, by) for run in runs}):
        others = [run for run in runs if getattr(run, by) != group]
        if not others:
            continue
        fitted = fit(others)
        for run in runs:
            if getattr(run, by) == group:
                found.append(HeldOut(run, fitted.midpoint(run), *fitted.range(run)))
    return found


def summary(held: list) -> dict[str, float]:
    """Coverage (fraction inside), the midpoint's median absolute error, and the median width hi / lo, of held-out
    predictions (``HeldOut``, ``fit_energy.HeldOutEnergy``)."""
    return {
        "coverage": sum(h.inside for h in held) / len(held),
        "median_error": statistics.median(abs(h.error) for h in held),
        "median_width": statistics.median(h.high / h.low for h in held),
    }


def as_calibration(found: Fit, source: str, runs: list[PublishedRun]) -> Calibration:
    """The fit of ``runs`` as achieved fractions per kind ([lowest, highest]), an overhead range, and the least eager
    bound per operator among the runs (under it, a prediction says it is outside the fit): the expected range
    ``roofline.expected_s`` computes from them is the midpoint times [1 / w, w]. A highest fraction may pass 1 (a
    kind fitted at its bound); ``roofline.predict_time`` keeps a range from going under the eager bound."""
    fractions = {
        kind: (1 / (found.multipliers[group] * found.width), found.width / found.multipliers[group])
        for kind, group in GROUP_OF_KIND.items()
    }
    overhead = (found.overhead_s / found.width, found.overhead_s * found.width)
    score = (found.score_s / found.width, found.score_s * found.width)
    least = min(run.eager_s / run.operators for run in runs)
    return Calibration(
        source=source, fractions=fractions, overhead_s=overhead, score_s=score, least_bound_per_operator_s=least
    )
