"""Per traced run (`bench --trace`): each stage's self time by operator kind, and its top operators."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from diffmeter import units
from diffmeter.report.html.plot_style import STAGES, Figure, layout, measured
from diffmeter.report.html.study import Study

KIND_COLORS = {
    "attention": "#e45756",
    "matmul": "#f58518",
    "convolution": "#4c78a8",
    "normalization": "#72b7b2",
    "elementwise": "#54a24b",
    "other": "#bab0ac",
}
#: traced runs drawn, at most
TRACED_RUNS = 8


def operators(study: Study) -> list[Figure]:
    """Per traced run (`bench --trace`): each stage's self time by operator kind, and its top operators."""
    figures = []
    for run in [run for run in study.complete if run.result.trace is not None][:TRACED_RUNS]:
        trace = run.result.trace
        stages = [stage for stage in trace.top_ops if stage.range_s > 0]
        figure = go.Figure()
        for kind, color in KIND_COLORS.items():
            totals = [stage.kinds.get(kind) for stage in stages]
            figure.add_bar(
                name=kind,
                y=[f"{STAGES.get(stage.stage, stage.stage)} ({units.seconds(stage.range_s)})" for stage in stages],
                x=[100 * total.share if total else 0 for total in totals],
                customdata=[
                    [total.self_s if total else 0, total.calls if total else 0, _rate(total)] for total in totals
                ],
                orientation="h",
                marker_color=color,
                hovertemplate=kind + ": %{x:.1f}% (%{customdata[0]:.4g} s, %{customdata[1]} calls)"
                "<br>%{customdata[2]}<extra></extra>",
            )
        unit = "kernel" if trace.time_base == "cuda" else "CPU"
        layout(
            figure,
            f"Operators by kind: {run.label}",
            [run],
            f"share of the stage's time (%, self {unit} time)",
            "stage (its time in the traced call)",
            barmode="stack",
            height=max(260, 90 + 40 * len(stages)),
            legend={"orientation": "h", "y": -0.3},
        )
        figure.update_xaxes(range=[0, 100])
        figure.update_yaxes(autorange="reversed")
        rows = "".join(
            f"<tr><td class='text'>{html.escape(STAGES.get(stage.stage, stage.stage))}</td>"
            f"<td class='text'>{html.escape(op.name)}</td><td class='text'>{op.kind}</td>"
            f"<td>{op.share:.1%}</td><td>{op.calls}</td>"
            f"<td>{'-' if op.achieved_tflops is None else f'{op.achieved_tflops:.3g}'}</td></tr>"
            for stage in stages
            for op in stage.rows[:3]
        )
        table = (
            "<table class='ops'><thead><tr><th>stage</th><th>operator</th><th>kind</th>"
            f"<th>share of stage</th><th>calls</th><th>TFLOP/s</th></tr></thead><tbody>{rows}</tbody></table>"
        )
        figures.append(
            Figure(
                figure,
                f"One extra call after the measured ones, under torch.profiler (`bench --trace`; slower than the "
                f"measured calls by the profiler's overhead): each stage's self {unit} time by operator kind; "
                "hover for seconds, calls and achieved TFLOP/s where torch's FLOP formulas know the operator. "
                f"The table lists each stage's top 3 operators (all of them: `diffmeter show RUN --ops`). "
                + measured([run]),
                table,
            )
        )
    return figures


def _rate(total) -> str:
    if total is None or total.achieved_tflops is None:
        return "no FLOP formula"
    return f"{total.achieved_tflops:.3g} TFLOP/s achieved"
