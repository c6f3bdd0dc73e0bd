"""Where the time goes: each run's stage shares of its mean call (as `show`), and the time of every denoising step."""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from diffmeter import units
from diffmeter.report.html.plot_style import (
    STAGE_COLORS,
    STAGES,
    Colors,
    Figure,
    layout,
    log_ticks,
    measured,
    share_bars,
)
from diffmeter.report.html.study import Run, Study


def time_breakdown(study: Study) -> list[Figure]:
    """Stacked bars: each run's stage shares of its mean call, as `show` gives them; and the time of every step."""
    runs = study.complete
    if not runs:
        return []
    summaries = [run.result.summary for run in runs]
    labels = [
        f"{run.label} (median {units.seconds(summary.latency_s.median)} per call)"
        for run, summary in zip(runs, summaries, strict=True)
    ]
    shares = [summary.stage_shares() for summary in summaries]
    bars = go.Figure()
    for stage, name in STAGES.items():
        values = [share.get(stage, (0.0, 0.0)) for share in shares]  # a stage an older run did not time: none
        if stage == "image_encoding" and not any(seconds for seconds, _ in values):
            continue  # no run encoded an input image
        bars.add_bar(
            name=name,
            y=labels,
            x=[percent for _, percent in values],
            customdata=[seconds for seconds, _ in values],
            orientation="h",
            marker_color=STAGE_COLORS[stage],
            hovertemplate="%{y}<br>" + name + ": %{customdata:.4g} s per call (mean), "
            "%{x:.1f}% of the mean call<extra></extra>",
        )
    axis, rows = "share of the mean call (%)", "run (median per call)"
    share_bars(bars, "Where the time goes", runs, axis, rows, len(runs))
    figures = [
        Figure(
            bars,
            "Each bar is one run's measured calls split into their stages (text encoding, image encoding, the "
            "denoising loop, VAE decode, everything else), device-timed: each stage's mean time per call as a share "
            "of the mean call, the share column of diffmeter show (the stages of every call add up to it, so the "
            "shares add up to 100%); hover for seconds. The label gives the median per call, as show and the "
            "summary do. " + measured(runs),
        )
    ]
    steps = step_times(runs)
    if steps is not None:
        figures.append(steps)
    return figures


def step_times(runs: list[Run]) -> Figure | None:
    """Median time of each denoising step per run (log scale), the first call dotted."""
    drawn = [run for run in runs if any(iteration.stages.steps_s for iteration in run.result.iterations)]
    if not drawn:
        return None
    colors = Colors(run.label for run in drawn)
    figure = go.Figure()
    values: list[float] = []
    for run in drawn:
        measured_steps = [iteration.stages.steps_s for iteration in run.result.iterations if iteration.stages.steps_s]
        count = min(len(times) for times in measured_steps)
        medians = [statistics.median(times[i] for times in measured_steps) for i in range(count)]
        values += medians
        style = colors.trace(run.label)
        figure.add_scatter(
            x=list(range(count)),
            y=medians,
            hovertemplate=run.label + "<br>step %{x}: %{y:.4g} s (median)<extra></extra>",
            mode="lines+markers",
            name=run.label,
            legendgroup=run.label,
            **style,
        )
        first = run.result.first_call
        if first is not None and first.stages.steps_s:
            values += first.stages.steps_s
            figure.add_scatter(
                x=list(range(len(first.stages.steps_s))),
                y=first.stages.steps_s,
                mode="lines",
                line={"dash": "dot", "color": colors[run.label]},
                hovertemplate=run.label + "<br>first call, step %{x}: %{y:.4g} s<extra></extra>",
                name=f"{run.label} (first call)",
                legendgroup=run.label,
                visible="legendonly",
            )
    layout(figure, "Time of each denoising step", drawn, "denoising step (index)", "time per step (s, log scale)")
    figure.update_yaxes(**log_ticks(values, units.seconds))
    return Figure(
        figure,
        "Median over the measured calls of each step's time (from one scheduler step to the next), log scale: a "
        "cache that skips work shows as cheap steps, compilation as a slow first call (dotted, hidden until "
        "clicked in the legend). " + measured(drawn),
    )
