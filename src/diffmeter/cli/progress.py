"""Progress on stderr for long commands: a live bar on a terminal; elsewhere (a log file, CI) a plain line at most
every ``PLAIN_EVERY_S`` seconds, so a long run is never silent; nothing when quiet."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console

#: seconds between two plain progress lines where stderr is not a terminal
PLAIN_EVERY_S = 30.0


def plain_update(stderr: Console, every_s: float | None = None):
    """``update(what, done, total)`` writing one plain line when ``every_s`` (``PLAIN_EVERY_S``) passed since the
    start or the last line."""
    every_s = PLAIN_EVERY_S if every_s is None else every_s
    start = last = time.monotonic()

    def update(what: str, done: int, total: int | None) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < every_s:
            return
        last = now
        count = f"{done} of {total}" if total else f"{done}"
        stderr.print(f"{what}: {count} ({now - start:.0f} s)", highlight=False, soft_wrap=True)

    return update


@contextmanager
def progress_bar(disabled: bool):
    """Yields ``update(what, done, total)``, or None when quiet."""
    stderr = Console(stderr=True)
    if disabled:
        yield None
        return
    if not stderr.is_terminal:
        yield plain_update(stderr)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def update(what: str, done: int, total: int | None) -> None:
            bar.update(task, description=what, completed=done, total=total)

        yield update
