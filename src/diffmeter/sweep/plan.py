"""Each cell checked before anything loads: refused (with the reason), already done, failed
before, or to run; and its offline compute from the profiler."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from diffmeter.catalog import entry_of
from diffmeter.errors import DiffmeterError
from diffmeter.flops.profile import Profile, profile_spec
from diffmeter.runs import storage
from diffmeter.runs.prepared import PreparedRun, prepare
from diffmeter.sweep.file import Cell

TO_RUN, DONE, FAILED, REFUSED, CHANGED = "to run", "done", "failed", "refused", "measured otherwise"


@dataclass
class PlannedCell:
    cell: Cell
    status: str
    run: PreparedRun | None = None
    reason: str | None = None
    profile: Profile | None = None

    @property
    def tflops(self) -> float | None:
        """Offline compute of one pipeline call (one batch), in TFLOPs; also of a cell refused for what the
        compute does not need (weights, a technique, memory)."""
        profile = self.run.profile if self.run else self.profile
        return profile.total_flops / 1e12 if profile else None


def plan(
    cells: list[Cell], out: str | Path, retry_failed: bool = False, here: bool = True, remeasure: bool = False
) -> list[PlannedCell]:
    """The cells in order, each with its status under ``out``; ``remeasure``: a cell stored complete but measured
    otherwise (``storage.MEASURED_BY``) runs again, else it is ``CHANGED``."""
    return [plan_cell(cell, out, retry_failed, here, remeasure) for cell in cells]


def plan_cell(
    cell: Cell, out: str | Path, retry_failed: bool = False, here: bool = True, remeasure: bool = False
) -> PlannedCell:
    try:
        run = prepare(cell.spec, here=here)
    except DiffmeterError as error:
        return PlannedCell(cell, REFUSED, reason=str(error), profile=offline_profile(cell, here))
    stored = _stored(Path(out).expanduser() / run.name)
    status, error = stored.get("status"), stored.get("error")
    if status == "complete" and not cell.batch_auto:
        changes = storage.measured_otherwise(stored.get("spec", {}), run.spec)
        if not changes:
            return PlannedCell(cell, DONE, run)
        if not remeasure:
            return PlannedCell(cell, CHANGED, run, reason=f"stored measured otherwise: {', '.join(changes)}")
    if status == "failed" and not retry_failed and not cell.batch_auto:
        return PlannedCell(cell, FAILED, run, reason=error)
    return PlannedCell(cell, TO_RUN, run)


def offline_profile(cell: Cell, here: bool = True) -> Profile | None:
    """The cell's compute, which needs no weights; None where its settings themselves are refused."""
    try:
        entry = entry_of(cell.spec)
        return profile_spec(cell.spec.settle(entry, here=here).profile_spec())
    except DiffmeterError:
        return None


def measured_otherwise(folder: Path, spec) -> list[str]:
    """Where the result stored in ``folder`` was measured otherwise than ``spec`` asks
    (``storage.measured_otherwise``)."""
    return storage.measured_otherwise(_stored(folder).get("spec", {}), spec)


def _stored(folder: Path) -> dict:
    """The stored results.json, or {} where there is none readable (never run, or interrupted)."""
    try:
        found = json.loads((folder / storage.RESULTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def stored_result(folder: Path) -> tuple[str | None, str | None]:
    """The stored result's status ("complete" or "failed") and error; (None, None) when there is
    none (never run, or interrupted)."""
    result = _stored(folder)
    return result.get("status"), result.get("error")
