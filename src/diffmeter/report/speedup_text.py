"""A table row's speed-up and noise as every table and the report show them (``runs.collect`` columns)."""

from __future__ import annotations

import math
from typing import Any

from diffmeter.measure.speedup import Criteria, Speedup, factor_text
from diffmeter.runs.collect import NOTES_JOINER
from diffmeter.runs.parallel_records import superlinear


def present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def row_speedup(row: dict[str, Any]) -> Speedup | None:
    """The row's speed-up, or None (none measured, or the row is the baseline itself)."""
    if not present(row.get("speedup")) or row.get("speedup_verdict") in (None, "baseline"):
        return None
    notes = _notes(row, "speedup_noise")
    return Speedup(
        estimate=row["speedup"],
        low=row["speedup_ci_low"],
        high=row["speedup_ci_high"],
        coverage=row["speedup_coverage"],
        verdict=row["speedup_verdict"],
        notes=notes,
        asked=Criteria().confidence,  # the coverage runs.collect asks of every row's (speedups.between's default)
    )


def speedup_cell(row: dict[str, Any]) -> str:
    """ "2.10x faster (1.80-2.40x)", "within noise (0.90-1.20x)", "baseline" or "-"; "(noisy)" when either run was."""
    if row.get("speedup_verdict") == "baseline":
        return "baseline"
    found = row_speedup(row)
    return found.text(compact=True) if found is not None else "-"


def noise_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row whose figures carry noise notes: its own, and its baseline's under its speed-up
    when the baseline is not a row here (then its own line says them)."""
    listed = {note for row in rows for note in _notes(row, "noise")}
    lines = []
    for row in rows:
        prefix = "baseline: "
        baseline = [note[len(prefix) :] for note in _notes(row, "speedup_noise") if note.startswith(prefix)]
        baseline = [f"its baseline: {note}" for note in baseline if note not in listed]
        notes = _notes(row, "noise") + baseline
        if notes:
            lines.append(f"{row['folder']}: {'; '.join(notes)}")
    return lines


def _notes(row: dict[str, Any], column: str) -> list[str]:
    value = row.get(column)
    return [note for note in value.split(NOTES_JOINER) if note] if isinstance(value, str) else []


def speedup_tick(value: float) -> str:
    """A speed-up axis's tick as the tables say a factor: "2.00x faster", "11.1x slower" (never a fraction such as
    "0.09x"), and "1x" where it reads as one either way."""
    factor = value if value >= 1 else 1 / value
    if factor_text(factor) == "1.00":
        return "1x"
    return f"{factor_text(factor)}x {'faster' if value > 1 else 'slower'}"


def coverage_line(rows: list[dict]) -> str | None:
    """How often the speed-up intervals shown hold the true factor, which their calls decide (below 95% with few):
    None where no row has an interval."""
    found = sorted({row["speedup_coverage"] for row in rows if present(row.get("speedup_coverage"))})
    if not found:
        return None
    held = f"{found[0]:.1%}" if len(found) == 1 else f"{found[0]:.1%} to {found[-1]:.1%}, by their calls"
    return f"speed-up intervals' coverage (how often such an interval holds the true factor): {held} (--json per row)"


def scaling_cell(row: dict[str, Any]) -> str:
    """A parallel run's speed-up over its one-device run, and that as a share of the processes."""
    if not present(row["scaling_speedup"]):
        return "-" if row["processes"] == 1 else f"{row['processes']} proc."
    text = f"{row['scaling_speedup']:.2f}x = {row['scaling_efficiency']:.0%} of {row['processes']}"
    text += " (superlinear)" if superlinear(row["scaling_efficiency"]) else ""
    return text + (" (within noise)" if row["scaling_verdict"] == "within noise" else "")
