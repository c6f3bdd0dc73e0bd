"""Independent work spread over forked worker processes (counting is CPU-bound Python)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import TypeVar

T, R = TypeVar("T"), TypeVar("R")


def parallel_map(
    function: Callable[[T], R],
    items: Sequence[T],
    jobs: int = 0,
    done: Callable[[int, int], None] | None = None,
) -> list[R]:
    """``[function(item) for item in items]`` in up to ``jobs`` processes (0: one per CPU), in order;
    ``done(finished, total)`` is called as results come in.

    Workers are forked, so they start with everything the parent has imported; errors raised in
    a worker (a ``DiffmeterError`` for bad input) are raised here unchanged. Workers ignore
    Ctrl-C: the parent receives it, stops them and raises KeyboardInterrupt once.
    """
    done = done or (lambda *_: None)
    jobs = min(jobs or os.cpu_count() or 1, len(items))
    if jobs <= 1:
        results = []
        for item in items:
            results.append(function(item))
            done(len(results), len(items))
        return results
    pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_ignore_interrupts)
    try:
        results = []
        for result in pool.imap(function, items):
            results.append(result)
            done(len(results), len(items))
        pool.close()
        return results
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
