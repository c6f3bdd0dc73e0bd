"""Where the time goes: each run's middle call split into its stages, and the time of every denoising step."""

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
from diffmeter.runs.iteration import Iteration


def middle_call(run: Run) -> Iteration:
    """The measured call whose total is the median (the lower of the middle two for an even count)."""
    ordered = sorted(run.result.iterations, key=lambda iteration: iteration.total_s)
    return ordered[(len(ordered) - 1) // 2]


def stage_shares(call: Iteration) -> dict[str, tuple[float, float]]:
    """Stage -> (seconds, percent of the call): the stages of one call, so the percents add up to 100."""
    seconds = {stage: getattr(call.stages, f"{stage}_s") for stage in STAGES}
    total = sum(seconds.values())
    return {stage: (value, 100 * value / total if total else 0.0) for stage, value in seconds.items()}


def time_breakdown(study: Study) -> list[Figure]:
    """Stacked bars: each run's middle call split into its stages; and the time of every step."""
    runs = [run for run in study.complete if run.result.iterations]
    if not runs:
        return []
    calls = [middle_call(run) for run in runs]
    labels = [f"{run.label} ({units.seconds(call.total_s)} call)" for run, call in zip(runs, calls, strict=True)]
    shares = [stage_shares(call) for call in calls]
    bars = go.Figure()
    for stage, name in STAGES.items():
        if stage == "image_encoding" and not any(share[stage][0] for share in shares):
            continue  # no run encoded an input image
        bars.add_bar(
            name=name,
            y=labels,
            x=[share[stage][1] for share in shares],
            customdata=[share[stage][0] for share in shares],
            orientation="h",
            marker_color=STAGE_COLORS[stage],
            hovertemplate="%{y}<br>" + name + ": %{customdata:.4g} s, %{x:.1f}% of the call<extra></extra>",
        )
    axis, rows = "share of the median call (%)", "run (its median call's time)"
    share_bars(bars, "Where the time goes", runs, axis, rows, len(runs))
    figures = [
        Figure(
            bars,
            "Each bar is one run's median call (the measured call whose total time is the median) split into its "
            "stages (text encoding, image encoding, the denoising loop, VAE decode, everything else), device-timed: "
            "the stages of one call, so they add up to 100%; hover for seconds. " + measured(runs),
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
            x=list(range(count)), y=medians, mode="lines+markers", name=run.label, legendgroup=run.label, **style
        )
        first = run.result.first_call
        if first is not None and first.stages.steps_s:
            values += first.stages.steps_s
            figure.add_scatter(
                x=list(range(len(first.stages.steps_s))),
                y=first.stages.steps_s,
                mode="lines",
                line={"dash": "dot", "color": colors[run.label]},
                name=f"{run.label} (first call)",
                legendgroup=run.label,
                visible="legendonly",
            )
    layout(figure, "Time of each denoising step", drawn, "denoising step (index)", "time per step (log scale)")
    figure.update_yaxes(**log_ticks(values, units.seconds))
    return Figure(
        figure,
        "Median over the measured calls of each step's time (from one scheduler step to the next), log scale: a "
        "cache that skips work shows as cheap steps, compilation as a slow first call (dotted, hidden until "
        "clicked in the legend). " + measured(drawn),
    )
