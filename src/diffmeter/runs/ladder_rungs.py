"""What a table row of a ladder rung takes from its ladder's file (``ladder-*.json``, read as plain JSON so a table
needs no torch): the ladder's baseline, which its speed-up is against, and its images against that baseline's, which
the ladder measured and the rung's own results.json does not hold."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from diffmeter.measure.quality_schema import Quality


@dataclass(frozen=True)
class LadderRung:
    """A rung's ladder baseline run folder, and the rung's images against it (None: not compared)."""

    baseline: Path
    quality: Quality | None = None


def ladder_rungs(root: Path) -> dict[Path, LadderRung]:
    """Each ladder rung's run folder -> its ``LadderRung``, from the ``ladder-*.json`` files under ``root``
    (``runs.ladder_record.Ladder``: ``rows`` in order, the baseline first, each with its run ``folder``); a rung is
    looked for beside its ladder file, by its folder's name (the recorded path is relative to where the ladder ran,
    and the study may have moved)."""
    found: dict[Path, LadderRung] = {}
    for path in sorted(root.rglob("ladder-*.json")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        try:
            rows = [row for row in json.loads(path.read_text())["rows"] if row.get("folder")]
        except (ValueError, OSError, KeyError, TypeError, AttributeError):
            continue
        if rows and rows[0].get("rung") == "baseline":
            base = resolved(path.parent / Path(rows[0]["folder"]).name)
            for row in rows[1:]:
                found[resolved(path.parent / Path(row["folder"]).name)] = LadderRung(base, _quality(row))
    return found


def _quality(row: dict) -> Quality | None:
    try:
        return Quality.model_validate(row["quality"]) if row.get("quality") else None
    except ValidationError:  # a ladder stored by another version: its speed-up still holds
        return None


def resolved(folder: str | Path) -> Path:
    return Path(folder).expanduser().resolve()
