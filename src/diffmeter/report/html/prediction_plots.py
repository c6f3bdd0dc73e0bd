"""Each run's offline prediction against what it measured: time per call and peak memory."""

from __future__ import annotations

import plotly.graph_objects as go

from diffmeter import units
from diffmeter.report.html.plot_style import Figure, layout, log_ticks
from diffmeter.report.html.plot_style import measured as measured_on
from diffmeter.report.html.study import Study
from diffmeter.report.prediction_lines import under_bounds


def predictions(study: Study) -> list[Figure]:
    """Each run's predicted time per call (roofline lower bound, calibrated expected range) against
    its measured median, and predicted peak memory against the measured CUDA peak where there is one."""
    predicted = [r for r in study.runs if r.result.prediction is not None and r.result.prediction.time is not None]
    timed = [r for r in predicted if not r.result.prediction.time_left_out]  # a prediction of what ran
    left_out = _left_out([r for r in predicted if r.result.prediction.time_left_out], study)
    found = []
    if timed:
        figure = go.Figure()
        measured = [r.result.summary.latency_s.median for r in timed]
        times = [r.result.prediction.time for r in timed]
        expected = [t.expected_s for t in times]
        ranged = [i for i, e in enumerate(expected) if e is not None]
        figure.add_scatter(
            x=[measured[i] for i in ranged],
            y=[(expected[i][0] * expected[i][1]) ** 0.5 for i in ranged],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [expected[i][1] - (expected[i][0] * expected[i][1]) ** 0.5 for i in ranged],
                "arrayminus": [(expected[i][0] * expected[i][1]) ** 0.5 - expected[i][0] for i in ranged],
            },
            text=[timed[i].label for i in ranged],
            hovertemplate="%{text}<br>measured %{x:.4g} s, expected range around %{y:.4g} s<extra></extra>",
            mode="markers",
            marker={"size": 9, "color": "#4c78a8"},
            name="expected range (calibrated)",
        )
        figure.add_scatter(
            x=measured,
            y=[t.lower_s for t in times],
            text=[r.label for r in timed],
            hovertemplate="%{text}<br>measured %{x:.4g} s, lower bound %{y:.4g} s<extra></extra>",
            mode="markers",
            marker={"size": 9, "symbol": "triangle-down", "color": "#e45756"},
            name="roofline lower bound",
        )
        ends = [v for v in [*measured, *(t.lower_s for t in times), *(e[1] for e in expected if e)] if v > 0]
        figure.add_scatter(
            x=[min(ends), max(ends)],
            y=[min(ends), max(ends)],
            mode="lines",
            line={"color": "#999", "dash": "dot"},
            hoverinfo="skip",  # a reference line: no values of its own
            name="predicted = measured",
        )
        title = "Predicted against measured time per call"
        layout(figure, title, timed, "measured median (s, log)", "predicted (s, log)")
        figure.update_xaxes(**log_ticks(ends, units.seconds))
        figure.update_yaxes(**log_ticks(ends, units.seconds))
        devices = sorted({t.device for t in times})
        found.append(
            Figure(
                figure,
                "Each run's time predicted offline for its device "
                f"({', '.join(devices)}): a lower bound (every operator at max(FLOPs / peak, bytes / bandwidth)) "
                "and, where the device kind is calibrated, the expected range. Points below the dotted line are "
                "predicted faster than measured. " + left_out + measured_on(timed) + under_caption(timed),
            )
        )
    sized = [
        r
        for r in study.runs
        if r.result.prediction is not None
        and r.result.prediction.peak_memory_bytes
        and r.result.summary.peak_memory.cuda_max_allocated_bytes
    ]
    if sized:
        figure = go.Figure()
        measured = [r.result.summary.peak_memory.cuda_max_allocated_bytes / 2**30 for r in sized]
        predicted = [r.result.prediction.peak_memory_bytes / 2**30 for r in sized]
        figure.add_scatter(
            x=measured,
            y=predicted,
            text=[r.label for r in sized],
            hovertemplate="%{text}<br>measured %{x:.3g} GiB, predicted %{y:.3g} GiB<extra></extra>",
            mode="markers",
            marker={"size": 9, "color": "#54a24b"},
            name="runs",
        )
        ends = [min(measured + predicted), max(measured + predicted)]
        figure.add_scatter(
            x=ends, y=ends, mode="lines", line={"color": "#999", "dash": "dot"}, hoverinfo="skip", name="equal"
        )
        layout(figure, "Predicted against measured peak memory", sized, "CUDA max allocated (GiB)", "predicted (GiB)")
        found.append(
            Figure(
                figure,
                "Predicted peak of tensors (fake-tensor tracking, with the run's modelled memory techniques) "
                "against torch.cuda.max_memory_allocated; the CUDA context and the allocator's reserve are in "
                "neither. " + measured_on(sized),
            )
        )
    return found


def under_caption(runs) -> str:
    """A sentence naming each run measured under its lower bound (whole call or a stage), or nothing."""
    under = [f"{run.label}: {'; '.join(found)}" for run in runs if (found := under_bounds(run.result))]
    if not under:
        return ""
    return (
        " Measured under the roofline lower bound (no run can beat a right bound: the device's peaks are too low "
        f"or the work is overcounted): {'. '.join(under)}."
    )


def _left_out(untimed: list, study: Study) -> str:
    """The runs the time plot leaves out, and why: what their prediction leaves out (a technique, a parallel
    layer's cost: it is of the run without it), or that no time was predicted (the stored note)."""
    parts = []
    if untimed:
        why = sorted({item for run in untimed for item in run.result.prediction.time_left_out})
        runs = units.counted(len(untimed), "run")
        parts.append(f"{runs} left out, their predicted time leaving out {'; '.join(why)}")
    none = [r for r in study.complete if r.result.prediction is None or r.result.prediction.time is None]
    if none:
        stored = [r.result.prediction for r in none if r.result.prediction is not None]
        notes = sorted({note for found in stored for note in found.notes if note.startswith("no time")})
        said = f" ({'; '.join(notes)})" if notes else " (no prediction stored)"
        parts.append(f"{units.counted(len(none), 'run')} without a predicted time{said}")
    return "".join(f"{part}. " for part in parts)
