"""A waterfall per stored ladder: how much each rung adds to the speed-up over the ladder's baseline."""

from __future__ import annotations

import plotly.graph_objects as go

from diffmeter.report.html.plot_style import Figure, layout
from diffmeter.report.html.study import WEIGHTS_LABELS, Study


def ladders(study: Study) -> list[Figure]:
    """A waterfall per ladder: how much each rung adds to the speed-up."""
    figures = []
    for path, ladder in study.ladders:
        rows = [row for row in ladder.rows if not row.skipped and row.speedup is not None]
        if not rows:
            continue
        steps, previous = [], 0.0
        for row in rows:
            steps.append(row.speedup - previous)
            previous = row.speedup
        figure = go.Figure(
            go.Waterfall(
                x=[f"{row.rung}: {row.adds}" if row.rung != "baseline" else "baseline" for row in rows],
                y=steps,
                measure=["absolute"] + ["relative"] * (len(rows) - 1),
                text=[_speedup_text(row) for row in rows],
                textposition="outside",
                hovertemplate="%{x}: %{text} overall<extra></extra>",
                connector={"line": {"color": "#999"}},
            )
        )
        runs = [run for row in rows if row.folder and (run := study.run_at(row.folder)) is not None]
        layout(
            figure,
            f"Optimization ladder: {ladder.model} on {ladder.device}",
            runs,
            "rung (each adds one technique to the one before)",
            "speed-up over the baseline (x)",
            showlegend=False,
        )
        skipped = [f"{row.rung} ({row.skipped.split('; ')[0]})" for row in ladder.rows if row.skipped]
        weights = sorted({WEIGHTS_LABELS[run.weights] for run in runs}) or [
            "unknown here (the ladder's run folders are not under this folder)"
        ]
        caption = (
            f"From {path.relative_to(study.root)}: each bar is what one rung adds to the speed-up of the rung "
            "before (Hodges-Lehmann estimate over every pair of calls); the label is the speed-up so far, with its "
            f"interval and verdict. Measured on {ladder.device}; weights: "
            f"{', '.join(weights)}."
        )
        if skipped:
            caption += " Skipped: " + "; ".join(skipped) + "."
        figures.append(Figure(figure, caption))
    return figures


def _speedup_text(row) -> str:
    if row.rung == "baseline":
        return "1x"
    return row.speedup_detail.text() if row.speedup_detail is not None else f"{row.speedup:.2f}x (no interval stored)"
