"""`diffmeter compare` as tables: a table per matched pair, a stage per row, and the method said once."""

from __future__ import annotations

import re

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.text import Text

from diffmeter import units
from diffmeter.measure.speedup import Speedup, within_noise_rule
from diffmeter.report.layout import Column, FittedTable
from diffmeter.report.run_table import RANDOM_QUALITY
from diffmeter.runs.compare import Comparison, RunComparison
from diffmeter.stages import STAGE_NAMES

_VERDICT_STYLE = {"faster": "green", "slower": "red", "within noise": "dim"}


def comparison_tables(comparison: Comparison) -> list:
    """Each pair's table, then what only one side holds and how speed-ups are found (once, not per pair)."""
    shown: list = [pair_table(pair) for pair in comparison.pairs]
    lines = [f"only in A: {name}" for name in comparison.only_a] + [f"only in B: {name}" for name in comparison.only_b]
    lines += comparison.skipped
    lines.append(footnote(comparison.criteria.min_effect))
    shown.append(Text("\n".join(lines), style="dim"))
    return shown


def footnote(min_effect: float) -> str:
    return (
        "A, B: each run's median time per image over its measured calls. speed-up: A's time / B's, the "
        "Hodges-Lehmann estimate over every pair of calls with its exact Mann-Whitney interval and that interval's "
        "coverage; it is not the ratio of the two medians, and differs from it when a run's calls are spread "
        f"unevenly. within noise: {within_noise_rule(min_effect)} (--min-effect: two runs of the same settings "
        "differ by more than their calls' interval shows). (noisy): "
        "A's or B's timings were noisy, as the notes under the table say."
    )


def pair_table(pair: RunComparison) -> Group:
    """The pair's folders on lines of their own (whole, so they can be copied), then its stages."""
    table = FittedTable(
        "",
        [
            Column("stage", justify="left"),
            Column("A median / image"),
            Column("B median / image"),
            Column("B's speed-up (interval)", justify="left"),
            Column("coverage", drop=1),
        ],
    )
    for stage in pair.stages:
        style = _VERDICT_STYLE[stage.verdict]
        found = Speedup(
            estimate=stage.speedup,
            low=stage.ci_low,
            high=stage.ci_high,
            coverage=stage.ci_level,
            verdict=stage.verdict,
            notes=pair.noise,
            asked=stage.ci_asked,
        )
        table.add_row(
            STAGE_NAMES.get(stage.stage, "whole call" if stage.stage == "call" else stage.stage),
            units.seconds(stage.a_s_per_image),
            units.seconds(stage.b_s_per_image),
            f"[{style}]{escape(found.text())}[/]",
            f"{stage.ci_level:.0%}",
        )
    table.caption = "\n".join(escape(line) for line in _facts(pair))
    names = [f"A: {pair.a}", f"B: {pair.b}"] if pair.a != pair.b else [pair.a]
    return Group(FolderNames(names), table)


def _facts(pair: RunComparison) -> list[str]:
    lines = list(pair.differences) or ["same settings"]
    lines.append("each stage's median over the calls: the stages' medians need not add up to the whole call's")
    memory = "CUDA max allocated" if pair.memory_kind == "cuda" else "process peak RSS"
    if pair.a_peak_memory_bytes is not None and pair.b_peak_memory_bytes is not None:
        change = pair.b_peak_memory_bytes - pair.a_peak_memory_bytes
        sign = "+" if change >= 0 else "-"
        lines.append(
            f"peak memory ({memory}): A {units.gib(pair.a_peak_memory_bytes)}, "
            f"B {units.gib(pair.b_peak_memory_bytes)} ({sign}{units.gib(abs(change))})"
        )
    if pair.energy_kind:
        lines.append(
            f"{pair.energy_kind.upper()} energy per image: A {units.joules(pair.a_energy_j_per_image)}, "
            f"B {units.joules(pair.b_energy_j_per_image)}"
        )
    else:
        lines.append("energy: not measured on both")
    if pair.quality is not None:
        random = pair.a_weights_random or pair.b_weights_random
        lines.append(quality_line(pair.quality) + (RANDOM_QUALITY if random else ""))
    return lines + _weights(pair) + pair.notes + pair.noise


def _weights(pair: RunComparison) -> list[str]:
    """Random or tiny weights said, once when both sides share them."""
    if not (pair.a_weights_random or pair.b_weights_random):
        return []
    if pair.a_weights == pair.b_weights:
        return [f"weights (A and B): {pair.a_weights}"]
    return [f"weights: A {pair.a_weights}; B {pair.b_weights}"]


def quality_line(quality) -> str:
    """B's images against A's, each fact once: all identical says so and nothing more."""
    count = len(quality.images)
    if quality.identical == count:
        return f"B's images against A's at the same seeds: all {count} identical"
    psnr = "" if quality.mean_psnr_db is None else f", mean PSNR {quality.mean_psnr_db:.2f} dB"
    return (
        f"B's images against A's at the same seeds: {quality.identical} of {count} identical{psnr}, "
        f"mean SSIM {quality.mean_ssim:.4f}"
    )


class FolderNames:
    """Run folder names on lines of their own, broken (when wider than the terminal) only after a "+" or "/",
    so a name is never cut inside a word."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for name in self.names:
            yield Text("\n".join(break_at_separators(name, options.max_width)), style="bold")


def break_at_separators(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, each ending at a "+" or "/" (a part longer than a
    line stays whole)."""
    parts = re.findall(r"[^+/]*[+/]|[^+/]+$", text)
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return lines
