"""What a sweep did, cell by cell: ``<out>/sweep-<name>.json``, rewritten atomically after every
cell. The run folders stay the truth (a rerun reads them); this record names which folders
belong to the sweep and why a cell has none."""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from diffmeter.errors import DiffmeterError
from diffmeter.runs import storage
from diffmeter.sweep.file import SweepFile

#: a cell's status in the record
DONE, SKIPPED, FAILED, REFUSED, PENDING = "done", "skipped", "failed", "refused", "pending"


class CellRecord(BaseModel):
    label: str
    values: dict[str, Any]
    #: done (run now) | skipped (done before) | failed | refused (before anything loaded) | pending
    status: str
    folder: str | None = None
    reason: str | None = None
    seconds: float | None = None
    #: offline compute of one pipeline call, in TFLOPs (10^12 FLOPs, not a rate), as the dry run's JSON names it
    tflops_per_call: float | None = None
    #: batch_size "auto": the largest batch that fit, and the batches tried
    largest_batch: int | None = None
    batches_tried: list[int] = []
    where: str | None = None


class SweepRecord(BaseModel):
    name: str
    created_utc: str
    updated_utc: str
    executor: str
    definition: SweepFile
    cells: list[CellRecord]

    def counts(self) -> dict[str, int]:
        order = (DONE, SKIPPED, FAILED, REFUSED, PENDING)
        return {status: sum(cell.status == status for cell in self.cells) for status in order}


def record_path(out: Path, name: str) -> Path:
    return out / f"sweep-{storage.slug(name)}.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def earlier_times(out: Path, name: str) -> dict[str, tuple[float | None, str | None]]:
    """Folder -> (seconds, where) of the cells an earlier run of the sweep recorded done or skipped, which a rerun
    skips: kept in its record, not lost (none where that record is missing or unreadable)."""
    try:
        earlier = SweepRecord.model_validate_json(record_path(out, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {
        cell.folder: (cell.seconds, cell.where)
        for cell in earlier.cells
        if cell.folder and cell.status in (DONE, SKIPPED) and cell.seconds is not None
    }


def save(record: SweepRecord, out: Path) -> None:
    record.updated_utc = now()
    storage.write_json(record_path(out, record.name), record.model_dump(mode="json"))


@contextlib.contextmanager
def exclusive(out: Path):
    """Hold ``out`` for this sweep: a second sweep writing to the same folder is refused."""
    import fcntl

    folder = out / ".sweep"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise DiffmeterError(
                f"another sweep ({holder}) is writing to {out}; wait for it to finish or pass another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)
