"""The one rule for a speed-up, wherever one is shown (`table`, `report`, `compare`, `show`, a sweep, a
ladder): from every timing of both runs, the Hodges-Lehmann estimate of how many times faster the
candidate is, its exact Mann-Whitney interval, a verdict (faster, slower, within noise) and the noise
notes of both runs, so a figure from a noisy run never travels without them. A verdict needs the interval at the
coverage asked (too few calls give a wider, less sure one), and a change in the machine's speed between the runs
(``Drift``) widens the interval by it before the verdict is read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from diffmeter.measure.stats import CONFIDENCE, speedup_interval

#: differences smaller than this are within noise even when the calls' interval excludes 1x
MIN_EFFECT = 0.05


def within_noise_rule(min_effect: float = MIN_EFFECT) -> str:
    """When a speed-up is "within noise", as every table's caption says it (``estimate``'s rule)."""
    return (
        f"the interval holds 1x, the estimate is within {min_effect:.0%} of it, or the calls are too few for the "
        f"coverage asked ({calls_for(CONFIDENCE)} a run for {CONFIDENCE:.0%}; the interval shown is then at the "
        "coverage they reach)"
    )


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
            f"faster or slower when the interval, at the coverage asked, excludes 1x and the estimate differs from 1x "
            f"by {self.min_effect:.0%} or more"
        )


class Drift(BaseModel):
    """The machine's speed changed between the two runs, measured where the candidate's technique cannot act (the
    stages it leaves alone, the baseline measured again later): the candidate's times may hold a factor from ``low``
    (<= 1) to ``high`` (>= 1) that is the machine's, so the speed-up's interval is widened by it."""

    low: float
    high: float
    note: str

    @classmethod
    def of(cls, ratios: Sequence[float], note: str) -> Drift:
        """From the machine's time ratios (later / earlier) where the technique cannot act."""
        return cls(low=min(1.0, *ratios), high=max(1.0, *ratios), note=note)

    @staticmethod
    def joined(found: Sequence[Drift | None]) -> Drift | None:
        """Several changes seen at once: the widest factors, every note; None where none was seen."""
        found = [drift for drift in found if drift is not None]
        if not found:
            return None
        notes = "; ".join(drift.note for drift in found)
        return Drift(low=min(d.low for d in found), high=max(d.high for d in found), note=notes)


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
    #: the coverage asked of the interval: below it, no verdict but "within noise"; None where it is not known (a
    #: figure stored before it was), whose verdict is kept as found
    asked: float | None = None

    @property
    def noisy(self) -> bool:
        return bool(self.notes)

    def interval_text(self, compact: bool = False) -> str:
        """The interval as times faster ("0.90-1.20x"), or as times slower for a slower verdict ("1.96-100x"):
        the inverse of each end, low and high swapped, so a factor never reads as a fraction; from one call each,
        no interval; one short of the coverage asked with its coverage and, unless ``compact`` (a table's cell),
        the calls a run the coverage asked needs."""
        if self.coverage == 0:
            return "one call each: no interval"
        if self.verdict == "slower":
            return f"{factor_text(1 / self.high)}-{factor_text(1 / self.low)}x"
        short = ""
        if self.short:
            short = f" at {self.coverage:.0%} coverage"
            short += "" if compact else f"; {self.asked:.0%} asked needs {calls_for(self.asked)} calls a run"
        return f"{factor_text(self.low)}-{factor_text(self.high)}x{short}"

    @property
    def short(self) -> bool:
        """Whether the interval covers less than asked (too few calls for a verdict)."""
        return self.asked is not None and 0 < self.coverage < self.asked

    def text(self, compact: bool = False) -> str:
        """The figure as every table shows it: a factor only where its interval supports one, and a slower
        candidate's as how many times slower ("11.1x slower (1.96-100x)"), never a fraction; ``compact``: a
        results table's cell (``interval_text``)."""
        mark = " (noisy)" if self.noisy else ""
        if self.verdict == "within noise":
            few = ": too few calls" if self.short else ""  # an interval clear of 1x, but at less than asked
            return f"within noise{few} ({self.interval_text(compact)}){mark}"
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
    if factor < 0.0995:  # an interval's far end (1 / 215): "0.0047", where two decimals said "0.00"
        return f"{factor:.2g}"
    return f"{factor:.2f}"


def calls_for(confidence: float) -> int:
    """The fewest calls each of two runs needs for an interval at ``confidence``: with n a side the widest one
    covers 1 - 2 / C(2n, n) (4 a side for 95%, 97.1%)."""
    calls = 1
    while 1 - 2 / math.comb(2 * calls, calls) < confidence:
        calls += 1
    return calls


#: measured calls a run takes by default: the fewest that give two runs' speed-up an interval at the coverage asked
#: by default (4: 97.1% >= 95%)
DEFAULT_CALLS = calls_for(CONFIDENCE)


def estimate(
    baseline: Sequence[float],
    candidate: Sequence[float],
    criteria: Criteria | None = None,
    notes: Sequence[str] = (),
    drift: Drift | None = None,
) -> Speedup:
    """The speed-up of ``candidate`` over ``baseline`` from each one's per-image times (seconds); ``drift``: the
    machine's change in speed between them, which widens the interval and joins the notes."""
    criteria = criteria or Criteria()
    factor, low, high, coverage = speedup_interval(list(baseline), list(candidate), criteria.confidence)
    if drift is not None:
        low, high, notes = low * drift.low, high * drift.high, [*notes, drift.note]
    # one call each: the one pair's ratio, an "interval" that covers the true factor with probability 0; fewer calls
    # than the coverage asked: an interval that supports no factor at it
    sure = coverage > 0 and coverage >= criteria.confidence - 1e-12
    return Speedup(
        estimate=factor,
        low=low,
        high=high,
        coverage=coverage,
        verdict=verdict(factor, low, high, criteria.min_effect) if sure else "within noise",
        notes=list(notes),
        asked=criteria.confidence,
    )


def verdict(factor: float, low: float, high: float, min_effect: float = MIN_EFFECT) -> Verdict:
    """Faster or slower only when the interval excludes 1x and the factor clears ``min_effect``."""
    worth = 1 + min_effect
    if low > 1 and factor >= worth:
        return "faster"
    if high < 1 and factor <= 1 / worth:
        return "slower"
    return "within noise"
