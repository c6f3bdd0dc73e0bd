"""Independent work spread over forked worker processes (counting is CPU-bound Python)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T, R = TypeVar("T"), TypeVar("R")


def parallel_map(function: Callable[[T], R], items: Sequence[T], jobs: int = 0) -> list[R]:
    """``[function(item) for item in items]`` in up to ``jobs`` processes (0: one per CPU), in order.

    Workers are forked, so they start with everything the parent has imported; errors raised
    in a worker (a ``DiffmeterError`` for bad input) are raised here unchanged.
    """
    jobs = min(jobs or os.cpu_count() or 1, len(items))
    if jobs <= 1:
        return [function(item) for item in items]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(function, items))
