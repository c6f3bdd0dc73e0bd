"""Where this machine's measured CPU peaks are kept: one JSON file per (CPU name, torch threads), read by every
later CPU prediction so two predictions of one spec use the same peaks, replaced only when asked
(``diffmeter doctor --remeasure-cpu``).

The folder is ``$DIFFMETER_CPU_PEAKS_DIR``, else ``cpu-peaks/`` in the cache's folder (``$DIFFMETER_CACHE_DIR``,
``$XDG_CACHE_HOME/diffmeter`` or ``~/.cache/diffmeter``). The peaks are a measurement of the machine, not an answer
derived from code, so they are kept even when the cache is off (``DIFFMETER_CACHE_DIR=off``: the cache's default
folder then). Best-effort like the cache: a file that cannot be read or written is skipped.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from diffmeter import cache


def directory() -> Path:
    setting = os.environ.get("DIFFMETER_CPU_PEAKS_DIR")
    if setting:
        return Path(setting).expanduser()
    return (cache.directory() or cache.home()) / "cpu-peaks"


def path(cpu: str, threads: int) -> Path:
    """The file of ``cpu`` at ``threads`` threads ("AMD-EPYC-2-threads.json")."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", cpu).strip("-") or "cpu"
    return directory() / f"{name}-{threads}-threads.json"


def load(cpu: str, threads: int) -> dict | None:
    """The stored record of ``cpu`` at ``threads`` threads, or None (none stored, unreadable, another CPU's)."""
    try:
        record = json.loads(path(cpu, threads).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = isinstance(record, dict) and record.get("cpu") == cpu and record.get("threads") == threads
    return record if same else None


def save(record: dict) -> Path | None:
    """Store ``record`` (its ``cpu`` and ``threads`` name the file) atomically, replacing what was there; the
    file, or None when the disk says no."""
    target = path(record["cpu"], record["threads"])
    return target if cache.write_json(target, record, indent=2) else None
