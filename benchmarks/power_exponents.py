"""The power limit's exponent (``diffmeter.predict.power_limit``) in ``benchmarks/calibrate_published.py``'s report:
which exponent each held-out fold chose, and the same test at each exponent fixed beside the nested one the claims
quote."""

from __future__ import annotations

from diffmeter.predict.fit_holdout import NestedTest, summary
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.predict.power_limit import exponent_text, power_limit


def power_section(figures: list[dict], test: NestedTest, shipped: float) -> list[str]:
    """The nested test beside each exponent's fixed one, over all runs, the power-limited cards' runs (at the shipped
    exponent) and per architecture; and how often each exponent was chosen."""
    limited = {f["id"] for f in figures if f.get("gpu") and power_limit(chosen_gpu(f["gpu"], None), shipped)}
    columns = {"all": lambda h: True, "power-limited cards": lambda h: h.run.id in limited}
    architectures = sorted({h.run.architecture for h in test.nested})
    columns |= {a: lambda h, a=a: h.run.architecture == a for a in architectures}
    picks = ", ".join(f"{exponent_text(exponent)} in {count}" for exponent, count in test.picks.items())
    lines = [
        "## The power limit",
        "",
        "A card with less board power per datasheet TFLOP than its die's reference runs each peak at that share to a "
        "power between 1/3 (dynamic power grows as the clock cubed where voltage follows it) and 1 (at the voltage "
        "floor); 0 is no power term. The fit chooses the exponent whose runs it fits best (least squared relative "
        f"midpoint error, in sample): on all runs {exponent_text(shipped)}, shipped; held out, each fold chose again "
        f"on its other runs ({picks} of {sum(test.picks.values())} folds). The claims quote that nested test; each "
        f"exponent fixed beside it ({sum(h.run.id in limited for h in test.nested)} held-out runs on power-limited "
        "cards; coverage, midpoint median error):",
        "",
        f"| exponent | {' | '.join(columns)} |",
        f"|---|{'---|' * len(columns)}",
    ]
    rows = [*((f"{exponent_text(e)}{' (shipped)' * (e == shipped)}", found) for e, found in test.fixed.items())]
    for label, found in [*rows, ("chosen in each fold (the claims')", test.nested)]:
        cells = []
        for keep in columns.values():
            mine = [h for h in found if keep(h)]
            stats = summary(mine) if mine else None
            cells.append(f"{stats['coverage']:.0%}, {stats['median_error']:.1%}" if stats else "-")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return [*lines, ""]
