"""The optimization ladder as a table: one row per rung, speed next to its quality cost."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from diffmeter import units
from diffmeter.bench.ladder import Ladder


def ladder_table(ladder: Ladder) -> Table:
    table = Table(title=escape(f"optimization ladder: {ladder.model} on {ladder.device}"), title_justify="left")
    for column in (
        "rung",
        "adds",
        "steps",
        "dtype",
        "latency",
        "speed-up",
        "cold start",
        "peak memory",
        "energy / image",
        "PSNR vs baseline",
        "SSIM",
    ):
        table.add_column(column, justify="left" if column in ("rung", "adds", "dtype") else "right", overflow="fold")
    for row in ladder.rows:
        if row.skipped:
            first = row.skipped.split("; ")[0]  # a missing package first, else the first refusal; --json has all
            first = first.split(": ", 1)[-1] if " cannot be used with " in first else first
            table.add_row(row.rung, f"[dim]skipped: {escape(first)}[/]", *[""] * 9)
            continue
        quality = row.quality
        if quality is None:
            psnr, ssim = "-", "-"
        elif quality.mean_psnr_db is None:
            psnr, ssim = "identical", f"{quality.mean_ssim:.4f}"
        else:
            psnr, ssim = f"{quality.mean_psnr_db:.2f} dB", f"{quality.mean_ssim:.4f}"
        table.add_row(
            row.rung,
            escape(row.adds),
            str(row.steps),
            row.dtype,
            units.seconds(row.latency_s),
            f"{row.speedup:.2f}x",
            units.seconds(row.cold_start_overhead_s) if row.cold_start_overhead_s else "none",
            units.nbytes(row.peak_memory_bytes),
            units.joules(row.energy_j_per_image) if row.energy_j_per_image is not None else "-",
            psnr,
            ssim,
        )
    table.caption = (
        "each rung adds one technique to the one above; latency = median per call; cold start = first call minus "
        "median (compilation); peak memory = CUDA max allocated, else process peak RSS; quality = images against "
        "the baseline's at the same seeds"
    )
    return table
