"""The power limit's exponent held out (``benchmarks/calibrate_published.py``): the eager fit's leave-one-source-out
test with no power term and with a steeper one, beside the shipped cube law's (``diffmeter.predict.power_limit``)."""

from __future__ import annotations

from published_runs import published_run

from diffmeter.predict.devices import chosen_gpu
from diffmeter.predict.fit_holdout import HeldOut, leave_one_out, summary
from diffmeter.predict.power_limit import EXPONENT, power_limit

#: the power limit's exponents held out beside the shipped one (``power_limit.EXPONENT``, the cube law's): none, and
#: a steeper one
OTHER_EXPONENTS = (0.0, 0.5)


def power_section(figures: list[dict], held: list[HeldOut]) -> list[str]:
    """The power limit's exponent: the held-out test without the power term and with a steeper one beside the
    shipped cube law's, over all runs, per architecture and on the power-limited cards' runs (reported, not used to
    choose it)."""
    tests = {EXPONENT: held}
    for exponent in OTHER_EXPONENTS:
        tests[exponent] = leave_one_out([run for figure in figures if (run := published_run(figure, exponent)[0])])
    limited = {f["id"] for f in figures if f.get("gpu") and power_limit(chosen_gpu(f["gpu"], None)) is not None}
    columns = {"all": lambda h: True, "power-limited cards": lambda h: h.run.id in limited}
    columns |= {a: lambda h, a=a: h.run.architecture == a for a in sorted({h.run.architecture for h in held})}
    lines = [
        "## The power limit",
        "",
        "A card with less board power per datasheet TFLOP than its die's reference runs each peak at that share to "
        f"the power {EXPONENT:.3g} (`diffmeter.predict.power_limit`: dynamic power grows with the cube of the clock; "
        "the exponent is that law's, not fitted). The same held-out test with no power term and with a steeper one, "
        f"{sum(h.run.id in limited for h in held)} of the held-out runs on power-limited cards (coverage, midpoint "
        "median error):",
        "",
        f"| exponent | {' | '.join(columns)} |",
        f"|---|{'---|' * len(columns)}",
    ]
    for exponent, found in sorted(tests.items()):
        cells = []
        for keep in columns.values():
            mine = [h for h in found if keep(h)]
            stats = summary(mine) if mine else None
            cells.append(f"{stats['coverage']:.0%}, {stats['median_error']:.1%}" if stats else "-")
        shipped = " (shipped)" if exponent == EXPONENT else ""
        lines.append(f"| {exponent:.3g}{shipped} | {' | '.join(cells)} |")
    return [*lines, ""]
