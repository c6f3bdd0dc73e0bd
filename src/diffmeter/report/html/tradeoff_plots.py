"""Trade-offs: speed-up against image quality per technique; energy and memory against latency (Pareto)."""

from __future__ import annotations

import math
from collections import defaultdict

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diffmeter import units
from diffmeter.report import outputs
from diffmeter.report.html.plot_style import Colors, Figure, explain, layout, log_ticks, measured
from diffmeter.report.html.study import Run, Study
from diffmeter.report.speedup_text import row_speedup, speedup_tick


def tradeoffs(study: Study) -> list[Figure]:
    """Speed-up against image quality per technique; energy and memory against latency (Pareto)."""
    runs = study.complete
    figures = []
    # the row's quality: a ladder rung's is the ladder's, which its own result does not hold
    judged = [
        run for run in runs if run.row["ssim"] is not None and run.row["speedup_verdict"] not in (None, "baseline")
    ]
    if judged:
        figures.append(quality(judged))
    energy_kind = next(
        (kind for kind in ("gpu", "cpu") if any(run.row[f"{kind}_j_per_image"] is not None for run in runs)), None
    )
    if energy_kind:
        spent = [run for run in runs if run.row[f"{energy_kind}_j_per_image"] is not None]
        figures.append(
            _pareto(
                spent,
                [run.row[f"{energy_kind}_j_per_image"] for run in spent],
                f"{energy_kind.upper()} energy per image (J)",
                "J per image",
                "Energy per image against latency",
                f"{energy_kind.upper()} energy per image (Zeus) against median seconds per image; a model's line "
                "joins its runs that no other run of that model at that output size beats on both. ",
            )
        )
    memory = [run for run in runs if run.row["peak_cuda_bytes"] or run.row["peak_rss_bytes"]]
    if memory:
        values = [(run.row["peak_cuda_bytes"] or run.row["peak_rss_bytes"]) / 2**30 for run in memory]
        figures.append(
            _pareto(
                memory,
                values,
                "peak memory (GiB)",
                "GiB peak memory",
                "Peak memory against latency",
                "Peak memory (CUDA max allocated on GPU runs, else the process's peak resident memory) against "
                "median seconds per image; a model's line joins its runs that no other run of that model at that "
                "output size beats on both; a parallel run's peak is its largest process's, one GPU's: its runs "
                "form a line of their own per process count. ",
                per_process=True,
            )
        )
    if not energy_kind and runs:
        reasons = sorted({run.result.summary.energy.reason for run in runs if run.result.summary.energy.reason})
        figures[-1].caption += f" No energy was measured: {'; '.join(reasons) or 'no counters'}."
    return figures


def _pareto(
    runs: list[Run], values: list[float], y: str, unit: str, title: str, caption: str, per_process: bool = False
) -> Figure:
    """Each model's runs, and its Pareto frontier (no run of the same model and output size beats one on it on both:
    a smaller image is another product, not a faster setting; the size is named where a model has several);
    ``unit`` follows the value on hover ("GiB peak memory"); ``per_process``: the value is one process's, so runs
    of several processes are apart from one-process runs, a line per process count."""
    figure = go.Figure()
    hover = "%{x:.4g} s per image, %{y:.4g} " + unit
    sizes: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        sizes[run.row["model"]].add(outputs.size(run.row))
    by_model: dict[str, list[tuple[float, float, Run]]] = defaultdict(list)
    for run, value in zip(runs, values, strict=True):
        model = run.row["model"]
        group = f"{model} at {outputs.size(run.row)}" if len(sizes[model]) > 1 else model
        group += f", {run.row['processes']} processes" if per_process and run.row["processes"] > 1 else ""
        by_model[group].append((run.row["s_per_image"], value, run))
    colors = Colors(by_model)
    for model, points in sorted(by_model.items()):
        color = colors[model]
        points.sort(key=lambda p: p[:2])
        frontier, best = [], float("inf")
        for latency, value, _run in points:
            if value < best:
                frontier.append((latency, value))
                best = value
        figure.add_scatter(
            x=[p[0] for p in points],
            y=[p[1] for p in points],
            text=[p[2].label for p in points],
            hovertemplate="%{text}<br>" + hover + "<extra></extra>",
            mode="markers",
            marker={"size": 9, "color": color, "opacity": 0.6},
            name=model,
            legendgroup=model,
        )
        figure.add_scatter(
            x=[p[0] for p in frontier],
            y=[p[1] for p in frontier],
            mode="lines+markers",
            line={"color": color, "shape": "hv"},
            marker={"size": 11, "symbol": "diamond", "color": color},
            hovertemplate=f"{model}: Pareto frontier<br>" + hover + "<extra></extra>",
            name=f"{model}: Pareto frontier",
            legendgroup=model,
        )
    layout(figure, title, runs, "time per image (s, median, log scale)", y + ", log scale")
    figure.update_xaxes(**log_ticks([run.row["s_per_image"] for run in runs], units.seconds))
    figure.update_yaxes(**log_ticks(values))
    return Figure(figure, caption + measured(runs))


def quality(judged: list[Run]) -> Figure:
    """Each optimized run's speed-up (with its interval) against its images' PSNR and SSIM; a subplot with
    nothing to draw (every image identical: PSNR is infinite) says so instead of drawing empty axes."""
    figure = make_subplots(rows=1, cols=2, subplot_titles=("PSNR", "SSIM"))
    techniques: dict[str, list[Run]] = defaultdict(list)
    for run in judged:
        techniques[run.row["optimizations"] or "unoptimized"].append(run)
    colors = Colors(techniques)
    finite_any = False
    for name, group in sorted(techniques.items()):
        found = [row_speedup(run.row) for run in group]
        hover = [f"{run.label}<br>{speedup.text()}" for run, speedup in zip(group, found, strict=True)]
        bars = {
            "type": "data",
            "symmetric": False,
            "array": [s.high - s.estimate for s in found],
            "arrayminus": [s.estimate - s.low for s in found],
            "color": colors[name],
        }
        finite = [i for i, run in enumerate(group) if run.row["psnr_db"] is not None]
        finite_any |= bool(finite)
        common = {"mode": "markers", "name": name, "legendgroup": name, "marker": {"size": 10, "color": colors[name]}}
        if finite:
            figure.add_scatter(
                x=[found[i].estimate for i in finite],
                y=[group[i].row["psnr_db"] for i in finite],
                error_x={
                    **bars,
                    "array": [bars["array"][i] for i in finite],
                    "arrayminus": [bars["arrayminus"][i] for i in finite],
                },
                text=[hover[i] for i in finite],
                hovertemplate="%{text}<br>PSNR %{y:.1f} dB<extra></extra>",
                row=1,
                col=1,
                **common,
            )
        figure.add_scatter(
            x=[s.estimate for s in found],
            y=[run.row["ssim"] for run in group],
            error_x=bars,
            text=hover,
            hovertemplate="%{text}<br>SSIM %{y:.4f}<extra></extra>",
            showlegend=not finite,
            row=1,
            col=2,
            **common,
        )
    layout(figure, "Speed-up against image quality", judged, "", "", height=440)
    ends = [value for run in judged for value in (run.row["speedup_ci_low"], run.row["speedup_ci_high"])]
    for col in (1, 2):
        figure.update_xaxes(title_text="speed-up over the unoptimized run (log)", **speedup_ticks(ends), row=1, col=col)
        if col == 2 or finite_any:  # 1x drawn where the panel is: the points right of it are faster
            figure.add_vline(x=1.0, line={"color": "#999", "dash": "dot", "width": 1}, row=1, col=col)
    if finite_any:
        figure.update_yaxes(title_text="PSNR vs unoptimized images (dB)", row=1, col=1)
    else:
        explain(figure, "every image is identical to the unoptimized one:<br>PSNR is infinite", row=1, col=1)
    lowest = min(run.row["ssim"] for run in judged)
    figure.update_yaxes(
        title_text="SSIM vs unoptimized (1 = same)", range=[min(lowest, 0.9) - 0.01, 1.01], row=1, col=2
    )
    noisy = sum(1 for run in judged if row_speedup(run.row).noisy)
    return Figure(
        figure,
        "Each point is an optimized run: its speed-up over the unoptimized run of the same settings (Hodges-Lehmann "
        "estimate, the bar its interval; hover for the verdict), against its images compared with the unoptimized "
        "images at the same seeds (mean PSNR, mean SSIM; identical images have no finite PSNR and sit at SSIM 1); "
        "the dotted line is 1x: points right of it ran faster, left of it slower. "
        + (f"{noisy} of these speed-ups come from noisy runs (the summary's notes say which). " if noisy else "")
        + measured(judged),
    )


def speedup_ticks(values: list[float]) -> dict:
    """A log speed-up axis over ``values`` that always holds 1x, ticked as the tables say a factor ("1.23x faster",
    "1.13x slower"); a tick too near 1x to be read beside it is left out."""
    ticks = log_ticks([*values, 1.0], speedup_tick)
    span = math.log(max(ticks["tickvals"]) / min(ticks["tickvals"]))
    near = [v for v in ticks["tickvals"] if abs(math.log(v)) < 0.15 * span or speedup_tick(v) == "1x"]
    kept = sorted({1.0, *(v for v in ticks["tickvals"] if v not in near)})
    return {**ticks, "tickvals": kept, "ticktext": [speedup_tick(v) for v in kept]}
