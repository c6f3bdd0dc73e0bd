"""How long each model's prediction (its fake-tensor run) took on this machine, in seconds by model name: what a
cold ``fit --all`` estimates its wait from. A measurement of the machine, not an answer derived from code, so it
is kept across versions, in the cache's folder (nothing is kept when the cache is off); best-effort like the cache.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from diffmeter import cache

FILE = "prediction-seconds.json"


def _path() -> Path | None:
    root = cache.directory()
    return root / FILE if root is not None else None


def load() -> dict[str, float]:
    """Every model's last prediction time here (seconds); empty when none was kept or the file is unreadable."""
    path = _path()
    try:
        stored = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
        return {str(name): float(seconds) for name, seconds in stored.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def remember(name: str, seconds: float) -> None:
    """Keep ``name``'s prediction time (atomically; silently skipped when the disk says no)."""
    path = _path()
    if path is not None:
        cache.write_json(path, {**load(), name: seconds}, indent=1)


def estimate_s(names: list[str], known: dict[str, float]) -> float | None:
    """Seconds to predict ``names``: each one's last time here, the median of the known times for the others;
    None when no time is known."""
    if not known:
        return None
    typical = statistics.median(known.values())
    return sum(known.get(name, typical) for name in names)
