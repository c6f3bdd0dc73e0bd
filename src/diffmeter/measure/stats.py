"""Summary statistics of repeated measurements."""

from __future__ import annotations

import statistics

from pydantic import BaseModel


class Stats(BaseModel):
    """Statistics of ``n`` samples, in the unit of the samples (named by the field holding it)."""

    n: int
    mean: float
    median: float
    p90: float
    std: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        return cls(
            n=len(ordered),
            mean=statistics.fmean(ordered),
            median=statistics.median(ordered),
            p90=percentile(ordered, 0.9),
            std=statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
            min=ordered[0],
            max=ordered[-1],
        )


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
