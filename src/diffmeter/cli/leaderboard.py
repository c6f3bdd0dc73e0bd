"""`diffmeter fit --all`: the predicted leaderboard, every catalog model on every GPU of the table (or one)."""

from __future__ import annotations

import json
from pathlib import Path

from diffmeter.cli.app import console
from diffmeter.cli.progress import progress_bar
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import load_libraries


def leaderboard(gpu: str | None, html_path: Path | None, csv_path: Path | None, as_json: bool) -> None:
    """Predict every pair, write the page (and the CSV), print a summary (or every cell as JSON)."""
    from diffmeter.catalog import all_entries
    from diffmeter.predict.devices import chosen_gpu
    from diffmeter.report.leaderboard import leaderboard_csv, leaderboard_html
    from diffmeter.runs.leaderboard import model_cells, table_gpus

    gpus = [chosen_gpu(gpu, None)] if gpu else table_gpus()
    if not gpus[0].memory_bytes:
        raise DiffmeterError(f"{gpus[0].name} has no single memory size in the table: nothing can be said to fit it")
    for path in (html_path, csv_path):
        if path is not None and not path.parent.is_dir():
            raise DiffmeterError(f"cannot write {path}: no folder {path.parent}")
    left_out = [] if gpu else _left_out({device.name for device in gpus})
    names = [entry.name for entry in all_entries() if not entry.is_tiny]
    load_libraries()
    cells = []
    with progress_bar(as_json) as update:
        for done, name in enumerate(names):
            if update:
                update(f"predicting {name}", done, len(names))
            cells += model_cells(name, gpus)
    html_path = html_path or Path("leaderboard.html")
    html_path.write_text(leaderboard_html(cells, left_out))
    if csv_path is not None:
        csv_path.write_text(leaderboard_csv(cells))
    if as_json:
        print(json.dumps({"cells": [cell.model_dump(mode="json") for cell in cells], "left_out": left_out}, indent=1))
        return
    from diffmeter.report.leaderboard import summary_table

    console.print(summary_table(cells))
    written = f"{html_path}" + (f" and {csv_path}" if csv_path else "")
    console.print(f"{len(cells)} predictions ({len(names)} models x {len(gpus)} GPUs) written to {written}")


def _left_out(included: set[str]) -> list[str]:
    """The table's GPUs not on the leaderboard, and why."""
    from diffmeter.predict.peaks import PEAKS

    return [f"{row.name} (its row covers several memory sizes)" for row in PEAKS if row.name not in included]
