"""Summary statistics of repeated measurements, with an interval that says how far to trust the median.

The interval is the distribution-free one for a median: between two order statistics chosen
from the binomial distribution, so it needs no assumption about the shape of the timings
(which are skewed: a slow outlier is common, a fast one is not). With fewer than six samples
no pair of order statistics reaches 95%: the interval is then [min, max] and ``ci_level``
says how much less it covers (75% for three samples).
"""

from __future__ import annotations

import math
import statistics

from pydantic import BaseModel

#: the coverage asked of the median's interval
CONFIDENCE = 0.95


class Stats(BaseModel):
    """Statistics of ``n`` samples, in the unit of the samples (named by the field holding it)."""

    n: int
    mean: float
    median: float
    p90: float
    std: float
    min: float
    max: float
    #: an interval for the median, and the probability it covers the true median (>= 0.95 when n >= 6)
    ci_low: float
    ci_high: float
    ci_level: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        low, high, level = median_interval(ordered)
        return cls(
            n=len(ordered),
            mean=statistics.fmean(ordered),
            median=statistics.median(ordered),
            p90=percentile(ordered, 0.9),
            std=statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
            min=ordered[0],
            max=ordered[-1],
            ci_low=low,
            ci_high=high,
            ci_level=level,
        )

    @property
    def relative_ci(self) -> float:
        """Half the interval's width over the median: 0.02 means the median is known to +-2%."""
        return (self.ci_high - self.ci_low) / 2 / self.median if self.median else math.inf


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_interval(ordered: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest symmetric pair of order statistics whose coverage of
    the median is at least ``confidence`` (or [min, max] with its lower coverage for small n)."""
    n = len(ordered)
    if n == 1:
        return ordered[0], ordered[0], 0.0
    k = 0  # 0-based: the interval is [ordered[k], ordered[n - 1 - k]]
    while k + 1 < n - 1 - (k + 1) and _coverage(n, k + 1) >= confidence:
        k += 1
    return ordered[k], ordered[n - 1 - k], _coverage(n, k)


def _coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n-1-k)) for 0-based k: 1 - 2 P(Binomial(n, 1/2) <= k)."""
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return 1 - 2 * tail


def ratio_interval(numerator: Stats, denominator: Stats) -> tuple[float, float, float]:
    """A conservative interval for median(numerator) / median(denominator) from the two medians'
    intervals (their worst-case combination), and its least coverage (Bonferroni)."""
    return (
        numerator.ci_low / denominator.ci_high,
        numerator.ci_high / denominator.ci_low,
        max(0.0, numerator.ci_level + denominator.ci_level - 1),
    )
