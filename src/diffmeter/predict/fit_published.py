"""The expected time range of eager runs on CUDA GPUs, fitted on published, measured runs
(``benchmarks/calibrate_published.py`` reads benchmarks/published_figures.yaml and writes the fit into
``data/efficiency.json``, one calibration per GPU architecture).

Model, per architecture: a run's time = a_compute x (the eager bound of its matmul and convolution operators)
+ a_attention x (its attention operators') + score_s x (its attention scores: the softmax exponentials, on the
special-function units, which make attention with a 64-wide head slower per FLOP than with a 128-wide one)
+ a_memory x (the eager bound of the others) + overhead x (its operators). a = 1 / the fraction of the roofline a
kind achieves, so a >= 1 (no eager operator beats its bound), score_s and the overhead >= 0; fitted by least
squares on relative errors (each run counts alike, whatever its length). With fewer than ``FULL_MODEL_ROWS`` runs
or ``FULL_MODEL_MODELS`` models, one multiplier on the whole eager bound instead.

The range: the midpoint times [1 / w, w], w the smallest factor that holds ``COVERAGE`` of the fitted runs (95%:
a fit is closer to the runs it has seen than to a held-out source's, which the validation below measures).
Validation leaves one source (not one row) out at a time, or one model where a single source measured every run
of an architecture: the held-out runs against the range fitted without them (coverage, the midpoint's median
error, the width hi / lo).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from diffmeter.predict.roofline import Calibration

COMPUTE_KINDS = ("matmul", "convolution")
MEMORY_KINDS = ("normalization", "elementwise", "other")
COVERAGE = 0.95
FULL_MODEL_ROWS, FULL_MODEL_MODELS = 8, 4
#: the scores column's unit in the least squares (seconds per 10^12 scores), so its columns are alike in size
SCORE_UNIT = 1e-12


@dataclass(frozen=True)
class PublishedRun:
    """One published eager run with its predicted work: the eager bound per kind group (seconds), its attention
    scores and operators."""

    id: str
    source: str
    architecture: str
    model: str
    published_s: float
    compute_s: float
    attention_s: float
    memory_s: float
    scores: int
    operators: int

    def features(self) -> list[float]:
        return [self.compute_s, self.attention_s, self.scores * SCORE_UNIT, self.memory_s, self.operators]


@dataclass(frozen=True)
class Fit:
    """a_compute, a_attention, a_memory (>= 1), seconds per attention score and per operator (>= 0), and the
    range's factor w."""

    a_compute: float
    a_attention: float
    score_s: float
    a_memory: float
    overhead_s: float
    width: float

    def midpoint(self, run: PublishedRun) -> float:
        return (
            self.a_compute * run.compute_s
            + self.a_attention * run.attention_s
            + self.score_s * run.scores
            + self.a_memory * run.memory_s
            + self.overhead_s * run.operators
        )

    def range(self, run: PublishedRun) -> tuple[float, float]:
        middle = self.midpoint(run)
        return middle / self.width, middle * self.width


def _bounded_least_squares(matrix: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """min |matrix x - 1| with x >= lower: every set of variables held at their bound tried (5 variables)."""
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
    if full:
        rows = [run.features() for run in runs]
        lower = np.array([1.0, 1.0, 0.0, 1.0, 0.0])
    else:
        rows = [[r.compute_s + r.attention_s + r.memory_s] for r in runs]
        lower = np.array([1.0])
    matrix = np.array(rows) / np.array([[run.published_s] for run in runs])
    x = _bounded_least_squares(matrix, lower)
    if full:
        point = Fit(x[0], x[1], x[2] * SCORE_UNIT, x[3], x[4], 1.0)
    else:
        point = Fit(x[0], x[0], 0.0, x[0], 0.0, 1.0)
    ratios = [point.midpoint(run) / run.published_s for run in runs]
    return Fit(point.a_compute, point.a_attention, point.score_s, point.a_memory, point.overhead_s, covering(ratios))


def covering(ratios: list[float]) -> float:
    """The smallest factor w with ``COVERAGE`` of the predicted / published ``ratios`` inside [1 / w, w]."""
    spread = sorted(max(ratio, 1 / ratio) for ratio in ratios)
    return spread[min(len(spread) - 1, math.ceil(COVERAGE * len(spread)) - 1)] * (1 + 1e-9)  # the edge run inside


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
    fractions = {}
    for kinds, a in (
        (COMPUTE_KINDS, found.a_compute),
        (("attention",), found.a_attention),
        (MEMORY_KINDS, found.a_memory),
    ):
        for kind in kinds:
            fractions[kind] = (1 / (a * found.width), found.width / a)
    overhead = (found.overhead_s / found.width, found.overhead_s * found.width)
    score = (found.score_s / found.width, found.score_s * found.width)
    least = min((run.compute_s + run.attention_s + run.memory_s) / run.operators for run in runs)
    return Calibration(
        source=source, fractions=fractions, overhead_s=overhead, score_s=score, least_bound_per_operator_s=least
    )
