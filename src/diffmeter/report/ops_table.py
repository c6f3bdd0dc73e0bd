"""The traced call's operators (``bench --trace``) as terminal tables: `diffmeter show RUN --ops`."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.text import Text

from diffmeter import units
from diffmeter.measure.ops import OUTSIDE, OpsTable
from diffmeter.report.layout import Column, FittedTable
from diffmeter.report.run_table import STAGE_LABELS


def ops_tables(table: OpsTable, top: int = 10) -> Group:
    """Per stage: the ``top`` operators by self time, the rest in one row, the time outside any
    operator, then the totals per kind of operator."""
    time = "self CPU time" if table.time_base == "cpu" else "self kernel time (CUDA)"
    parts = []
    for stage in table.stages:
        fitted = FittedTable(
            escape(f"{STAGE_LABELS[stage.stage]}: {units.seconds(stage.range_s)} in the traced call, by {time}"),
            [
                Column("operator", justify="left"),
                Column("kind", justify="left", drop=2),
                Column("self time"),
                Column("share"),
                Column("calls", drop=3),
                Column("FLOPs", drop=1),
                Column("achieved", drop=4),
            ],
        )
        ops = [row for row in stage.rows if row.name != OUTSIDE]
        for row in ops[:top]:
            fitted.add_row(escape(row.name), row.kind, *_cells(row))
        rest = ops[top:]
        if rest:
            rest_s = sum(row.self_s for row in rest)
            share = f"{100 * rest_s / stage.range_s:.1f}%" if stage.range_s > 0 else "-"
            calls = f"{sum(row.calls for row in rest):,}"
            fitted.add_row(f"{len(rest)} other operators", "", units.seconds(rest_s), share, calls, "", "", style="dim")
        for row in stage.rows:
            if row.name == OUTSIDE:
                fitted.add_row(escape(OUTSIDE), "", units.seconds(row.self_s), f"{100 * row.share:.1f}%", "", "", "")
        first = True
        for kind, total in stage.kinds.items():
            fitted.add_row(f"all {kind}", "", *_cells(total), style="bold", section=first)
            first = False
        parts.append(fitted)
    parts.append(
        Text(
            "the traced call ran once after the measured calls, under torch.profiler (slower than they are); "
            "FLOPs from torch.utils.flop_counter's formulas on the recorded shapes (2 FLOPs per multiply-add); "
            "achieved: FLOPs / self time",
            style="dim",
        )
    )
    return Group(*parts)


def _cells(row) -> list[str]:
    return [
        units.seconds(row.self_s),
        f"{100 * row.share:.1f}%",
        f"{row.calls:,}",
        units.flops(row.flops) if row.flops else "-",
        units.flop_rate(row.achieved_tflops * 1e12) if row.achieved_tflops else "-",
    ]
