"""The predicted leaderboard (``runs/leaderboard.py``) as one self-contained, sortable HTML page and as CSV."""

from __future__ import annotations

import csv
import html
import io
from datetime import datetime, timezone

from rich.table import Table

from diffmeter import __version__, units
from diffmeter.report.html.page import SORT_SCRIPT, STYLE
from diffmeter.runs.fit_speedups import setting_name
from diffmeter.runs.leaderboard import Cell

#: (header, the value sorted on, the text shown)
COLUMNS = (
    ("model", lambda c: c.model, lambda c: c.model),
    ("GPU", lambda c: c.gpu, lambda c: c.gpu),
    ("architecture", lambda c: c.architecture or "", lambda c: c.architecture or "-"),
    ("GPU memory", lambda c: c.memory_bytes, lambda c: units.gib(c.memory_bytes)),
    ("fits", lambda c: int(c.fits), lambda c: "yes" if c.fits else "no"),
    ("setting", lambda c: _setting(c), lambda c: _setting(c)),
    ("peak memory", lambda c: c.peak_bytes or c.plain_peak_bytes, lambda c: _peak(c)),
    ("time lower bound", lambda c: c.lower_s, lambda c: _seconds(c.lower_s)),
    ("expected time", lambda c: _middle(c.expected_s), lambda c: _range(c.expected_s, units.seconds)),
    ("energy per output", lambda c: _middle(c.energy_j), lambda c: _range(c.energy_j, units.joules)),
    ("least quantization that fits (model offload allowed)", lambda c: c.least_format or "", lambda c: _least(c)),
    ("fastest predicted setting", lambda c: _fastest(c), lambda c: _fastest(c)),
    ("its expected time", lambda c: _middle(c.fastest_s), lambda c: _range(c.fastest_s, units.seconds)),
)
CSV_FIELDS = (
    "model", "gpu", "architecture", "memory_bytes", "fits", "setting", "least_format", "peak_bytes", "plain_peak_bytes",
    "lower_s", "expected_low_s", "expected_high_s", "energy_low_j", "energy_high_j", "fastest", "fastest_low_s",
    "fastest_high_s", "output", "notes",
)  # fmt: skip


def _setting(cell: Cell) -> str:
    if cell.setting is None:
        return "does not fit"
    return setting_name(tuple(cell.setting)) or "plain"  # as fit and the fastest column name it


def _fastest(cell: Cell) -> str:
    """The fastest predicted setting as ``fit MODEL --gpu CARD`` names it, every technique with its parameters."""
    if cell.fastest is None:
        return "-"
    return setting_name(tuple(cell.fastest)) or "plain"


def _least(cell: Cell) -> str:
    return cell.least_format or "none without layer offload"


def _peak(cell: Cell) -> str:
    if cell.peak_bytes is not None:
        return units.gib(cell.peak_bytes)
    return f"{units.gib(cell.plain_peak_bytes)} plain (nothing fits)"


def _seconds(value: float | None) -> str:
    return units.seconds(value) if value is not None else "-"


def _middle(pair: tuple[float, float] | None) -> float | None:
    return (pair[0] * pair[1]) ** 0.5 if pair else None


def _range(pair: tuple[float, float] | None, show) -> str:
    return f"{show(pair[0])} to {show(pair[1])}" if pair else "-"


def _cache_note() -> str:
    """Why the cache's time rests on an extrapolated skipped share (its threshold outside the published runs', and
    every other model, step count and size than theirs), as a clause."""
    from diffmeter.predict.cache_published import extrapolated, published, published_settings
    from diffmeter.runs.fit_speedups import SPEEDUPS

    name, params = SPEEDUPS["first-block-cache"]
    said = extrapolated(name, params, published())
    runs = f"the published runs are {published_settings(name, params, published())}: other models, steps and sizes"
    threshold = f"at threshold {params['threshold']:g}, diffusers' default: {said}; " if said else ""
    return f" ({threshold}{runs} extrapolated)"


def leaderboard_csv(cells: list[Cell]) -> str:
    """One row per model and GPU; bytes, seconds per generation, joules per output (image or video)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for cell in cells:
        expected, energy = cell.expected_s or (None, None), cell.energy_j or (None, None)
        writer.writerow(
            {
                **{key: getattr(cell, key) for key in ("model", "gpu", "architecture", "memory_bytes", "fits")},
                "setting": "" if cell.setting is None else _setting(cell),
                "least_format": cell.least_format or "",
                **{key: getattr(cell, key) for key in ("peak_bytes", "plain_peak_bytes", "lower_s", "output")},
                "expected_low_s": expected[0],
                "expected_high_s": expected[1],
                "energy_low_j": energy[0],
                "energy_high_j": energy[1],
                "fastest": "" if cell.fastest is None else _fastest(cell),
                "fastest_low_s": cell.fastest_s[0] if cell.fastest_s else None,
                "fastest_high_s": cell.fastest_s[1] if cell.fastest_s else None,
                "notes": " | ".join(cell.notes),
            }
        )
    return out.getvalue()


def leaderboard_html(cells: list[Cell], left_out: list[str]) -> str:
    """The page: every cell a row, sortable by any column, each row's notes (how it was predicted) on hover and
    in its last column; ``left_out``: the table's GPUs not on it, and why."""
    head = "".join(f"<th>{html.escape(header)}</th>" for header, _, _ in COLUMNS) + "<th>how it was predicted</th>"
    rows = []
    for cell in cells:
        parts = []
        for _, value, text in COLUMNS:
            found = value(cell)
            sort = "" if found is None else html.escape(str(found), quote=True)
            kind = "" if isinstance(found, (int, float)) else ' class="text"'
            parts.append(f'<td{kind} data-value="{sort}">{html.escape(text(cell))}</td>')
        notes = "; ".join(cell.notes)
        parts.append(f'<td class="text" data-value="">{html.escape(notes)}</td>')
        rows.append(f'<tr title="{html.escape(notes, quote=True)}">{"".join(parts)}</tr>')
    models, gpus = len({c.model for c in cells}), len({c.gpu for c in cells})
    fitting = sum(c.fits for c in cells)
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>diffmeter: predicted leaderboard</title>'
        f"<style>{STYLE}</style></head><body>"
        "<h1>Predicted leaderboard</h1>"
        f'<p class="meta">{models} catalog models at their defaults on {gpus} GPUs: {fitting} of {len(cells)} pairs '
        f"fit. Predicted offline by diffmeter {html.escape(__version__)} on {when}; nothing here was run on these "
        "GPUs.</p>"
        '<p class="warning">Predictions, not measurements. Memory: live tensors tracked on fake tensors, each '
        "family checked against a real tiny run or marked not checked; the fitting setting is the fastest that "
        "bench can run whose peak fits what is left after the CUDA context and libraries; the least quantization "
        "that fits is the --quantize format (on the denoisers) keeping the most bytes whose setting fits without "
        "layer offloading (model offload allowed), the run's dtype where none is needed. Time: the roofline lower "
        "bound, and for the plain pipeline the expected range fitted on published eager runs per GPU architecture "
        "(coverage and error in the notes). Energy: that expected time's geometric midpoint at the average board "
        "power fitted on published runs' energy, as a share of the card's TDP, widened by the spread that fit "
        "left. Fastest predicted setting: among the settings that fit, with torch.compile (default, reduce-overhead) "
        f"and a first-block cache where bench accepts them{_cache_note()}, the least expected time with every "
        "technique in it "
        "(their held-out tests: benchmarks/results/calibration_*.md); a setting whose time is not modelled is not "
        "a candidate, and a cache's image quality is not measured.</p>"
        f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        '<p class="caption">Click a header to sort; hover a row for how it was predicted. Times are seconds per '
        "generation (one pipeline call at the model's defaults); energy is joules per image (per video for a "
        "video model). The same rows: <code>diffmeter fit --all --csv FILE</code>.</p>"
        + (f'<p class="caption">Not on it: {html.escape("; ".join(left_out))}.</p>' if left_out else "")
        + f"<script>{SORT_SCRIPT}</script></body></html>"
    )


def summary_table(cells: list[Cell]) -> Table:
    """On one GPU, a row per model; on several, a row per GPU counting what fits."""
    gpus = list(dict.fromkeys(cell.gpu for cell in cells))
    if len(gpus) == 1:
        title = f"predicted on {gpus[0]} (catalog defaults; expected range: the setting's; fastest: with speed-ups)"
        table = Table(title=title)
        headers = (
            "model",
            "fits",
            "setting",
            "least quantization",
            "peak memory",
            "expected time",
            "energy per output",
            "fastest predicted (expected s)",
        )
        for header in headers:
            table.add_column(
                header, justify="left" if header in ("model", "setting", "least quantization") else "right"
            )
        for cell in cells:
            table.add_row(
                cell.model,
                "yes" if cell.fits else "no",
                _setting(cell),
                _least(cell),
                _peak(cell),
                _range(cell.expected_s, units.seconds) if cell.expected_s else _seconds(cell.lower_s) + " (bound)",
                _range(cell.energy_j, units.joules),
                f"{_fastest(cell)} ({_range(cell.fastest_s, units.seconds)})" if cell.fastest else "-",
            )
        return table
    table = Table(title="predicted leaderboard: catalog models at their defaults, per GPU")
    for header in ("GPU", "memory", "fit plain", "fit with a setting", "do not fit"):
        table.add_column(header, justify="left" if header == "GPU" else "right")
    for gpu in gpus:
        mine = [cell for cell in cells if cell.gpu == gpu]
        plain = sum(cell.setting == [] for cell in mine)
        table.add_row(
            gpu,
            units.gib(mine[0].memory_bytes),
            str(plain),
            str(sum(cell.fits for cell in mine) - plain),
            str(sum(not cell.fits for cell in mine)),
        )
    return table
