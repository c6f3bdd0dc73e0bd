"""The held-out figures of benchmarks/calibrate_published.py as it writes them: markdown tables of held-out runs, per
source, and each card's own runs' claim (``Calibration.held_out_by_card``)."""

from __future__ import annotations

import statistics

from diffmeter.predict.fit_holdout import HeldOut, summary
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.units import counted


def left_out_lines(found: list[tuple[str, str]]) -> list[str]:
    """The "## Left out" list: each reason once, with the runs it leaves out (``found``: (run, why) pairs)."""
    by_why: dict[str, list[str]] = {}
    for run, why in found:
        by_why.setdefault(why, []).append(run)
    return [f"- {why} ({counted(len(runs), 'run')}: {', '.join(runs)})" for why, runs in by_why.items()] or ["none"]


def held_rows(held: list[HeldOut]) -> list[str]:
    """The held-out runs as a markdown table: each run's published time, held-out midpoint and range."""
    return [
        "| run | source | published (s) | held-out midpoint (s) | range (s) | error | inside |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {h.run.id} | {h.run.source} | {h.run.published_s:.3g} | {h.midpoint:.3g} | "
            f"{h.low:.3g} to {h.high:.3g} | {h.error:+.1%} | {'yes' if h.inside else '**no**'} |"
            for h in held
        ),
    ]


def table(held: list[HeldOut], title: str) -> list[str]:
    stats = summary(held)
    return [
        f"{title}: coverage **{stats['coverage']:.0%}** ({sum(h.inside for h in held)} of {len(held)}), midpoint "
        f"median error **{stats['median_error']:.1%}** (signed {statistics.median(h.error for h in held):+.1%}), "
        f"median width hi/lo **{stats['median_width']:.2f}**",
        "",
        *held_rows(held),
        "",
    ]


def per_source(held: list[HeldOut]) -> list[str]:
    """Held-out coverage and error per source, and without the largest, so one harness cannot carry the figure."""
    lines = ["| source | runs | inside | midpoint median error |", "|---|---|---|---|"]
    for source in sorted({h.run.source for h in held}):
        mine = [h for h in held if h.run.source == source]
        stats = summary(mine)
        lines.append(f"| {source} | {len(mine)} | {stats['coverage']:.0%} | {stats['median_error']:.1%} |")
    largest = max({h.run.source for h in held}, key=lambda source: sum(h.run.source == source for h in held))
    rest = [h for h in held if h.run.source != largest]
    stats = summary(rest)
    return [
        *lines,
        "",
        f"Without the largest source ({largest}): coverage **{stats['coverage']:.0%}** "
        f"({sum(h.inside for h in rest)} of {len(rest)}), midpoint median error **{stats['median_error']:.1%}**",
        "",
    ]


def card_claims(held: list[HeldOut], gpus: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per architecture, per table card (its row's name), what its own published runs showed held out by source:
    how many fell inside their range and the midpoint's signed median error, which a prediction on that card says
    beside its architecture's pooled figure, which names the test's script and date (a card can sit off its
    architecture's fit: the A10's 150 W)."""
    cards: dict[tuple[str, str], list[HeldOut]] = {}
    for found in held:
        cards.setdefault((found.run.architecture, chosen_gpu(gpus[found.run.id], None).name), []).append(found)
    claims: dict[str, dict[str, str]] = {}
    for (architecture, card), mine in sorted(cards.items()):
        signed = statistics.median(h.error for h in mine)
        lean = "faster" if signed < 0 else "slower"
        claims.setdefault(architecture, {})[card] = (
            f"the {card}'s own {counted(len(mine), 'published run')} in that test: {sum(h.inside for h in mine)} "
            f"inside their range, midpoint median error {signed:+.0%} (predicted {lean} than measured)"
        )
    return claims
