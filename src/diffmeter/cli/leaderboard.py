"""`diffmeter fit --all`: the predicted leaderboard, every catalog model on every GPU of the table (or one)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from diffmeter import units
from diffmeter.cli.app import console, note
from diffmeter.cli.progress import progress_bar
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import load_libraries


def leaderboard(
    gpu: str | None, html_path: Path | None, csv_path: Path | None, as_json: bool, gpu_spec: str | None
) -> None:
    """Predict every pair, write the page (and the CSV), print a summary (or every cell as JSON); ``gpu`` or
    ``gpu_spec``: one GPU instead of the table's."""
    from diffmeter.catalog import all_entries
    from diffmeter.predict.gpu_spec import chosen_gpu
    from diffmeter.report.leaderboard import leaderboard_csv, leaderboard_html
    from diffmeter.runs import prediction_times
    from diffmeter.runs.leaderboard import model_cells, table_gpus, uncached
    from diffmeter.runs.storage import writable, write_text

    gpus = [chosen_gpu(gpu, gpu_spec)] if gpu or gpu_spec else table_gpus()
    if not gpus[0].memory_bytes:
        raise DiffmeterError(
            "--gpu-spec gives no memory: add it (e.g. 80GB)"
            if gpu_spec
            else f"{gpus[0].name} has no single memory size in the table: nothing can be said to fit it"
        )
    html_path = writable(html_path or "leaderboard.html")  # before the predictions, which take minutes
    csv_path = writable(csv_path) if csv_path is not None else None
    left_out = [] if gpu or gpu_spec else _left_out({device.name for device in gpus})
    names = [entry.name for entry in all_entries() if not entry.is_tiny]
    missing = uncached(names)
    known = prediction_times.load()
    if missing:
        note(wait_note(len(missing), len(names), prediction_times.estimate_s(missing, known)), as_json)
        load_libraries()
    cells, timed = [], set()
    with progress_bar(as_json) as update:
        for done, name in enumerate(names):
            if update:
                left = prediction_times.estimate_s([n for n in missing if n not in timed], known)
                update(f"predicting {name}" + (f", about {units.seconds(left)} left" if left else ""), done, len(names))
            start = time.perf_counter()
            cells += model_cells(name, gpus)
            if name in missing:
                known[name] = time.perf_counter() - start
                timed.add(name)
                prediction_times.remember(name, known[name])
    write_text(html_path, leaderboard_html(cells, left_out))
    if csv_path is not None:
        write_text(csv_path, leaderboard_csv(cells))
    if as_json:
        print(json.dumps({"cells": [cell.model_dump(mode="json") for cell in cells], "left_out": left_out}, indent=1))
        return
    from diffmeter.report.leaderboard import summary_table

    console.print(summary_table(cells))
    written = f"{html_path}" + (f" and {csv_path}" if csv_path else "")
    console.print(f"{len(cells)} predictions ({len(names)} models x {len(gpus)} GPUs) written to {written}")


def wait_note(missing: int, total: int, estimate_s: float | None) -> str:
    """What a cold leaderboard says before it starts: how many models need a fake-tensor run, and how long."""
    said = f"{missing} of {total} models are not in the cache: each is predicted on fake tensors first"
    if estimate_s is None:
        return said + " (no earlier prediction timed on this machine to estimate from); later runs answer in seconds"
    return said + f", about {units.seconds(estimate_s)} from their last times here; later runs answer in seconds"


def _left_out(included: set[str]) -> list[str]:
    """The table's GPUs not on the leaderboard, and why."""
    from diffmeter.predict.peaks import PEAKS

    return [f"{row.name} (its row covers several memory sizes)" for row in PEAKS if row.name not in included]
