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
    cost: Callable[[T], float] | None = None,
    size: Callable[[T], int] | None = None,
) -> list[R]:
    """``[function(item) for item in items]`` in up to ``jobs`` processes (0: one per CPU), in order;
    ``done(finished, total)`` is called as results come in, counting each item as ``size(item)``
    (default 1). With ``cost``, the costliest items start first, so a long one started last does
    not keep one worker busy while the others idle.

    Workers are forked, so they start with everything the parent has imported; errors raised in
    a worker (a ``DiffmeterError`` for bad input) are raised here unchanged. Workers ignore
    Ctrl-C: the parent receives it, stops them and raises KeyboardInterrupt once.
    """
    done = done or (lambda *_: None)
    size = size or (lambda _: 1)
    total = sum(size(item) for item in items)
    jobs = min(jobs or os.cpu_count() or 1, len(items))
    if jobs <= 1:
        results, finished = [], 0
        for item in items:
            results.append(function(item))
            finished += size(item)
            done(finished, total)
        return results
    order = sorted(range(len(items)), key=lambda index: -cost(items[index])) if cost else list(range(len(items)))
    pool = _pool(jobs)
    try:
        results: dict[int, R] = {}
        finished = 0
        for index, result in zip(order, pool.imap(function, [items[index] for index in order]), strict=True):
            results[index] = result
            finished += size(items[index])
            done(finished, total)
        pool.close()
        return [results[index] for index in range(len(items))]
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


def _pool(jobs: int):
    """Workers forked with SIGINT blocked, so a Ctrl-C between a fork and the worker's initializer
    cannot interrupt it half-started (which left the pool waiting on it forever); the parent gets
    that Ctrl-C as soon as the pool exists. Workers the pool forks later, from its own thread,
    inherit the block too."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return multiprocessing.get_context("fork").Pool(jobs, initializer=_ignore_interrupts)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
