"""The optimization ladder as a table: one row per rung, speed next to its quality cost."""

from __future__ import annotations

from rich.markup import escape

from diffmeter import units
from diffmeter.measure.speedup import within_noise_rule
from diffmeter.report.layout import Column, FittedTable
from diffmeter.report.run_table import RANDOM_QUALITY
from diffmeter.runs.ladder_record import Ladder


def ladder_table(ladder: Ladder) -> FittedTable:
    table = FittedTable(
        escape(f"optimization ladder: {ladder.model} on {ladder.device}"),
        [
            Column("rung", justify="left"),
            Column("adds", justify="left", drop=6),
            Column("steps", drop=2),
            Column("dtype", justify="left", drop=3),
            Column("latency"),
            Column("expected", drop=5),
            Column("speed-up"),
            Column("coverage", drop=4),
            Column("cold start", drop=1),
            Column("peak memory", drop=4),
            Column("energy / image", drop=0),
            Column("PSNR vs baseline", drop=7),
            Column("SSIM", drop=4),
        ],
    )
    noisy: list[str] = []
    for row in ladder.rows:
        if row.skipped:
            first = row.skipped.split("; ")[0]  # a missing package first, else the first refusal; --json has all
            first = first.split(": ", 1)[-1] if " cannot be used with " in first else first
            table.add_row(row.rung, f"[dim]skipped: {escape(first)}[/]", *[""] * 11)
            continue
        quality = row.quality
        if quality is None:
            psnr, ssim = "-", "-"
        elif quality.mean_psnr_db is None:
            psnr, ssim = "identical", f"{quality.mean_ssim:.4f}"
        else:
            psnr, ssim = f"{quality.mean_psnr_db:.2f} dB", f"{quality.mean_ssim:.4f}"
        detail = row.speedup_detail
        if row.rung == "baseline":
            speedup, coverage = "1x (baseline)", ""
        else:  # a ladder stored before speed-ups carried their verdict shows none
            speedup, coverage = (detail.text(), f"{detail.coverage:.0%}") if detail else ("-", "-")
        for note in detail.notes if detail else []:
            line = note if note.startswith("baseline: ") else f"{row.rung}: {note.removeprefix('this run: ')}"
            noisy += [line] if line not in noisy else []
        table.add_row(
            row.rung,
            escape(row.adds),
            str(row.steps),
            row.dtype,
            units.seconds(row.latency_s),
            _expected(row),
            speedup,
            coverage,
            units.seconds(row.cold_start_overhead_s) if row.cold_start_overhead_s else "none",
            units.gib(row.peak_memory_bytes),
            units.joules(row.energy_j_per_image) if row.energy_j_per_image is not None else "-",
            psnr,
            ssim,
        )
    captions = [
        "each rung adds one technique to the one above; latency = median per call; speed-up over the baseline per "
        "image: Hodges-Lehmann estimate over every pair of calls with its exact Mann-Whitney interval (coverage: "
        "how often such an interval holds the true factor), within noise when "
        f"{within_noise_rule()}; (noisy): a run's timings were noisy (notes below); cold start = "
        "first call minus median (compilation); peak memory = CUDA max allocated, else process peak RSS; "
        "quality = images against the baseline's at the same seeds; expected: the range each rung's run predicted "
        "from its settings alone (as `profile --gpu` does for its device) and where the median fell: inside, or "
        "how far above or below"
    ]
    if ladder.weights:
        captions.append(f"weights: {escape(ladder.weights)}")
    if ladder.weights_random and any(row.quality is not None for row in ladder.rows):
        captions.append("quality" + RANDOM_QUALITY)
    if ladder.baseline_recheck_s is not None:
        captions.append(f"baseline measured again at the end: {units.seconds(ladder.baseline_recheck_s)}")
    captions += [f"note: {escape(note)}" for note in [*ladder.notes, *noisy]]
    table.caption = "\n".join(captions)
    return table


def _expected(row) -> str:
    """The rung's expected range per call and its median against it; "-" where none was stored."""
    if row.expected_s is None:
        return "-" if row.expected_verdict is None else "not timed"
    low, high = row.expected_s
    verdict = row.expected_verdict.removeprefix("outside: ").removesuffix(" the range")  # "inside", "83% below"
    return f"{units.seconds(low)}-{units.seconds(high)}: {verdict}"
