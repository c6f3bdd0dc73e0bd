"""`diffmeter compare` as tables: a table per matched pair, a stage per row."""

from __future__ import annotations

from rich.markup import escape

from diffmeter import units
from diffmeter.report.layout import Column, FittedTable
from diffmeter.runs.compare import Comparison, RunComparison

_VERDICT_STYLE = {"faster": "green", "slower": "red", "within noise": "dim"}


def comparison_tables(comparison: Comparison) -> list[FittedTable]:
    tables = [pair_table(pair, comparison.criteria.min_effect) for pair in comparison.pairs]
    if tables:
        unmatched = [f"only in A: {name}" for name in comparison.only_a]
        unmatched += [f"only in B: {name}" for name in comparison.only_b]
        tables[-1].caption += "".join(f"\n{escape(line)}" for line in unmatched)
    return tables


def pair_table(pair: RunComparison, min_effect: float) -> FittedTable:
    table = FittedTable(
        escape(f"B: {pair.b}\nagainst A: {pair.a}" if pair.a != pair.b else pair.a),
        [
            Column("stage", justify="left"),
            Column("A / image"),
            Column("B / image"),
            Column("B's speed-up"),
            Column("interval", drop=2),
            Column("coverage", drop=1),
            Column("verdict", justify="left"),
        ],
    )
    for stage in pair.stages:
        style = _VERDICT_STYLE[stage.verdict]
        table.add_row(
            stage.stage,
            units.seconds(stage.a_s_per_image),
            units.seconds(stage.b_s_per_image),
            f"{stage.speedup:.3f}x",
            f"{stage.ci_low:.3f}-{stage.ci_high:.3f}x",
            f"{stage.ci_level:.0%}",
            f"[{style}]{stage.verdict}[/]",
        )
    lines = [f"{escape(line)}" for line in pair.differences] or ["same settings"]
    memory = "CUDA max allocated" if pair.memory_kind == "cuda" else "process peak RSS"
    if pair.a_peak_memory_bytes is not None and pair.b_peak_memory_bytes is not None:
        change = pair.b_peak_memory_bytes - pair.a_peak_memory_bytes
        sign = "+" if change >= 0 else "-"
        lines.append(
            f"peak memory ({memory}): A {units.nbytes(pair.a_peak_memory_bytes)}, "
            f"B {units.nbytes(pair.b_peak_memory_bytes)} ({sign}{units.nbytes(abs(change))})"
        )
    if pair.energy_kind:
        lines.append(
            f"{pair.energy_kind.upper()} energy per image: A {units.joules(pair.a_energy_j_per_image)}, "
            f"B {units.joules(pair.b_energy_j_per_image)}"
        )
    else:
        lines.append("energy: not measured on both")
    quality = pair.quality
    if quality is not None:
        psnr = "identical" if quality.mean_psnr_db is None else f"mean PSNR {quality.mean_psnr_db:.2f} dB"
        lines.append(
            f"B's images against A's at the same seeds: {quality.identical}/{len(quality.images)} identical, "
            f"{psnr}, mean SSIM {quality.mean_ssim:.4f}"
        )
    lines += [escape(note) for note in pair.notes]
    lines.append(
        "speed-up = A's time / B's; interval and coverage: Hodges-Lehmann estimate with its exact Mann-Whitney "
        f"interval over every measured call (per image); within noise = the interval holds 1x, or the speed-up is "
        f"under {min_effect:.0%} either way (--min-effect: two runs of the same settings differ by more than their "
        "calls' interval shows)"
    )
    table.caption = "\n".join(lines)
    return table
