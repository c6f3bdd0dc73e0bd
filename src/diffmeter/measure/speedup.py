"""The one rule for a speed-up, wherever one is shown (`table`, `report`, `compare`, `show`, a sweep, a
ladder): from every timing of both runs, the Hodges-Lehmann estimate of how many times faster the
candidate is, its exact Mann-Whitney interval, a verdict (faster, slower, within noise) and the noise
notes of both runs, so a figure from a noisy run never travels without them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from diffmeter.measure.stats import CONFIDENCE, speedup_interval

#: differences smaller than this are within noise even when the calls' interval excludes 1x
MIN_EFFECT = 0.05

Verdict = Literal["faster", "slower", "within noise"]


class Criteria(BaseModel):
    """When a difference counts: the interval's coverage, and the smallest speed-up (or slow-down)
    worth reporting. Calls of one run are not independent of that run (where its memory landed, the
    machine's state while it ran), so two runs of the same settings can differ by more than their
    calls' interval allows; ``min_effect`` is the guard against calling that a speed-up."""

    confidence: float = CONFIDENCE
    min_effect: float = MIN_EFFECT

    @property
    def method(self) -> str:
        return (
            "Hodges-Lehmann estimate of the ratio of per-image times, with its exact Mann-Whitney interval "
            f"({self.confidence:.1%} asked; distribution-free, assuming B's times are A's scaled by one factor); "
            f"faster or slower when the interval excludes 1x and the estimate differs from 1x by {self.min_effect:.0%} "
            "or more"
        )


class Speedup(BaseModel):
    """How many times faster the candidate is than the baseline (above 1: faster), per image."""

    estimate: float
    low: float
    high: float
    #: the probability the interval covers the true factor (below the asked coverage with few calls)
    coverage: float
    verdict: Verdict
    #: why either run's timings are noisy ("baseline: noisy: ..."); empty for two quiet runs
    notes: list[str] = []

    @property
    def noisy(self) -> bool:
        return bool(self.notes)

    def interval_text(self) -> str:
        """The interval as times faster ("0.90-1.20x"), or as times slower for a slower verdict ("1.96-100x"):
        the inverse of each end, low and high swapped, so a factor never reads as a fraction; from one call each,
        no interval."""
        if self.coverage == 0:
            return "one call each: no interval"
        if self.verdict == "slower":
            return f"{factor_text(1 / self.high)}-{factor_text(1 / self.low)}x"
        return f"{factor_text(self.low)}-{factor_text(self.high)}x"

    def text(self) -> str:
        """The figure as every table shows it: a factor only where its interval supports one, and a slower
        candidate's as how many times slower ("11.1x slower (1.96-100x)"), never a fraction."""
        mark = " (noisy)" if self.noisy else ""
        if self.verdict == "within noise":
            return f"within noise ({self.interval_text()}){mark}"
        factor = 1 / self.estimate if self.verdict == "slower" else self.estimate
        return f"{factor_text(factor)}x {self.verdict} ({self.interval_text()}){mark}"

    def sentence(self) -> str:
        """The figure with how it was found and its noise notes, for a line of its own."""
        notes = "".join(f"; {note}" for note in self.notes)
        return (
            f"{self.text()}: Hodges-Lehmann estimate over every pair of calls, interval at {self.coverage:.0%} "
            f"coverage{notes}"
        )


def factor_text(factor: float) -> str:
    """A factor as a person reads it: two decimals below 10 ("2.10"), one below 100 ("11.1"), none above ("100")."""
    if factor >= 99.95:
        return f"{factor:.0f}"
    if factor >= 9.995:
        return f"{factor:.1f}"
    return f"{factor:.2f}"


def estimate(
    baseline: Sequence[float],
    candidate: Sequence[float],
    criteria: Criteria | None = None,
    notes: Sequence[str] = (),
) -> Speedup:
    """The speed-up of ``candidate`` over ``baseline`` from each one's per-image times (seconds)."""
    criteria = criteria or Criteria()
    factor, low, high, coverage = speedup_interval(list(baseline), list(candidate), criteria.confidence)
    return Speedup(
        estimate=factor,
        low=low,
        high=high,
        coverage=coverage,
        # one call each: the one pair's ratio, an "interval" that covers the true factor with probability 0, supports
        # no factor
        verdict=verdict(factor, low, high, criteria.min_effect) if coverage > 0 else "within noise",
        notes=list(notes),
    )


def verdict(factor: float, low: float, high: float, min_effect: float = MIN_EFFECT) -> Verdict:
    """Faster or slower only when the interval excludes 1x and the factor clears ``min_effect``."""
    worth = 1 + min_effect
    if low > 1 and factor >= worth:
        return "faster"
    if high < 1 and factor <= 1 / worth:
        return "slower"
    return "within noise"
