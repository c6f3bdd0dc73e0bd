"""Whether a family's memory prediction was checked against a real run: per family, the tiny random-weight
pipeline's real CPU call against the prediction, every stage (benchmarks/memory_prediction_families_cpu.py,
which writes ``data/memory_checks.json``). Shown beside every memory prediction, so a figure from a family
the check found off says so."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

CHECKS_PATH = Path(__file__).parent / "data" / "memory_checks.json"
#: the largest error of a stage's peak (a fraction of the measured peak) a checked family shows
TOLERANCE = 0.02
RESULTS = "benchmarks/results/memory_prediction_families_cpu.md"


@cache
def _checks() -> dict:
    return json.loads(CHECKS_PATH.read_text()) if CHECKS_PATH.exists() else {}


def memory_check(family: str, editing: bool = False) -> str:
    """One line: how this family's memory prediction compares with its tiny pipeline's real CPU run (``editing``:
    the run with an input image, checked apart)."""
    found = _checks().get("editing" if editing else "families", {}).get(family)
    what = f"{family} editing an image" if editing else family
    if found is None:
        return f"{what}: not checked against a real run"
    if found["within_tolerance"]:
        run = "real CPU run editing an image" if editing else "real CPU run"
        return f"checked: the tiny {family} pipeline's {run}, every stage within {100 * TOLERANCE:g}%"
    stage, error, model = found["worst"]
    return (
        f"NOT within {100 * TOLERANCE:g}% of a real run: {model}'s real CPU run differs by {error:+.1f}% at "
        f"{stage} (tiny sizes magnify small tensors; {RESULTS})"
    )
