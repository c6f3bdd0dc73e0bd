"""A progress line on stderr for long commands; nothing when quiet or not on a terminal."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console


@contextmanager
def progress_bar(disabled: bool):
    """Yields ``update(what, done, total)``, or None when there is nothing to show."""
    stderr = Console(stderr=True)
    if disabled or not stderr.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def update(what: str, done: int, total: int | None) -> None:
            bar.update(task, description=what, completed=done, total=total)

        yield update
