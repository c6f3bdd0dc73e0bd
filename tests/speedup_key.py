"""An answer key for speed-ups that shares no code with diffmeter's: the per-image times of a run's measured calls
read from its results.json as plain JSON, and the Hodges-Lehmann estimate worked from them by its definition (the
median over every pair of calls of the baseline's time over the candidate's, taken on logs)."""

import json
import math
import statistics
from pathlib import Path


def per_image_times(folder) -> list[float]:
    """Seconds per image of every measured call, as results.json stores them."""
    calls = json.loads((Path(folder) / "results.json").read_text())["iterations"]
    return [call["total_s"] / call["images"] for call in calls]


def hodges_lehmann(baseline: list[float], candidate: list[float]) -> float:
    """How many times faster the candidate is: above 1 when its calls took less time."""
    return math.exp(statistics.median(math.log(a) - math.log(b) for a in baseline for b in candidate))


def rank_symmetric(low: float, high: float, baseline: list[float], candidate: list[float]) -> bool:
    """Whether ``low`` and ``high`` are the k-th smallest and k-th largest of the pairwise ratios baseline /
    candidate, for one k: the shape of the exact Mann-Whitney interval of the estimate (swapped sides fail it)."""
    ratios = sorted(math.log(a) - math.log(b) for a in baseline for b in candidate)
    ends = math.log(low), math.log(high)
    return any(
        math.isclose(ratios[k], ends[0], abs_tol=1e-9) and math.isclose(ratios[-1 - k], ends[1], abs_tol=1e-9)
        for k in range(len(ratios))
    )
