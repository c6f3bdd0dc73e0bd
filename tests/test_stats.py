"""The interval of a median: exact coverage from the binomial distribution, no shape assumed."""

import math
import random

import pytest

from diffmeter.measure.stats import Stats, median_interval


@pytest.mark.parametrize(
    ("n", "low", "high", "level"),
    [
        (3, 1, 3, 0.75),  # too few for 95%: [min, max] and what it covers
        (5, 1, 5, 1 - 2 / 32),
        (6, 1, 6, 1 - 2 / 64),
        (10, 2, 9, 1 - 2 * 11 / 1024),
    ],
)
def test_order_statistics_and_their_exact_coverage(n, low, high, level):
    assert median_interval(list(range(1, n + 1))) == (low, high, pytest.approx(level))


def test_the_interval_covers_the_true_median_as_often_as_it_says():
    """Skewed timings (lognormal, true median 1.0): the stated coverage is the observed one."""
    generator = random.Random(7)
    for n in (6, 15):
        level = median_interval(list(range(n)))[2]
        trials = 4000
        hits = 0
        for _ in range(trials):
            low, high, _ = median_interval(sorted(generator.lognormvariate(0, 1) for _ in range(n)))
            hits += low <= 1.0 <= high
        assert abs(hits / trials - level) < 0.02


def test_relative_precision():
    fast = Stats.of([1.0, 1.01, 0.99, 1.0, 1.02, 0.98])
    assert fast.relative_ci == pytest.approx(0.02)
    assert math.isclose(Stats.of([5.0]).ci_low, 5.0) and Stats.of([5.0]).ci_level == 0.0
