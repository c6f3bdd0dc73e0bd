"""The report's plots (Plotly), one builder per question; each returns the figures it can draw
from the study (none when the study holds nothing for it), with captions saying what was
measured, where, and with which weights."""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from dataclasses import dataclass

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diffmeter import units
from diffmeter.flops.schema import Profile
from diffmeter.report.html.study import WEIGHTS_LABELS, Run, Study

STAGES = {
    "text_encoding": "text encoding",
    "denoising": "denoising",
    "vae_decode": "VAE decode",
    "other": "other",
}
STAGE_COLORS = {"text_encoding": "#4c78a8", "denoising": "#f58518", "vae_decode": "#54a24b", "other": "#bab0ac"}


@dataclass
class Figure:
    figure: go.Figure
    caption: str
    #: a table shown under the plot (already escaped HTML)
    table: str = ""


def weights_tag(weights: set[str]) -> str:
    """What every plot of runs with these weights must say about them (empty for pretrained only)."""
    marked = [WEIGHTS_LABELS[w] for w in ("tiny-random", "random") if w in weights]
    return f" [{' + '.join(marked)}]" if marked else ""


def _measured(runs: list[Run]) -> str:
    hardware = sorted({run.row["hardware"] for run in runs})
    weights = sorted({WEIGHTS_LABELS[run.weights] for run in runs})
    calls = sorted({run.result.summary.iterations for run in runs if run.result.summary})
    calls_text = f"{calls[0]}" if len(calls) == 1 else f"{calls[0]}-{calls[-1]}"
    return f"Measured on {', '.join(hardware)}, {calls_text} calls per run; weights: {', '.join(weights)}."


def _stage_median(run: Run, stage: str) -> float:
    stats = run.result.summary.stages_s.get(stage)
    return stats.median if stats is not None else 0.0


def _color(name: str, names: list[str]) -> str:
    """One color per name, the same in every panel."""
    palette = plotly.colors.qualitative.Plotly
    return palette[sorted(names).index(name) % len(palette)]


def _layout(figure, title: str, runs: list[Run], x: str, y: str, **extra) -> None:
    tag = weights_tag({run.weights for run in runs})
    layout = {
        "title": {"text": title + tag, "font": {"size": 15}},
        "template": "plotly_white",
        "xaxis_title": x,
        "yaxis_title": y,
        "margin": {"l": 60, "r": 20, "t": 60, "b": 50},
        "legend": {"font": {"size": 11}},
    }
    figure.update_layout(**{**layout, **extra})


def time_breakdown(study: Study) -> list[Figure]:
    """Stacked bars: each run's median call split into its stages; and the time of every step."""
    runs = study.complete
    if not runs:
        return []
    labels = [f"{run.label} ({units.seconds(run.result.summary.latency_s.median)} per call)" for run in runs]
    bars = go.Figure()
    for stage, name in STAGES.items():
        seconds = [_stage_median(run, stage) for run in runs]
        bars.add_bar(
            name=name,
            y=labels,
            x=[100 * t / run.result.summary.latency_s.median for t, run in zip(seconds, runs, strict=True)],
            customdata=seconds,
            orientation="h",
            marker_color=STAGE_COLORS[stage],
            hovertemplate="%{y}<br>" + name + ": %{customdata:.4g} s, %{x:.1f}% of the call<extra></extra>",
        )
    _layout(
        bars,
        "Where the time goes",
        runs,
        "share of the median call (%)",
        "run (median seconds per call)",
        barmode="stack",
        height=max(320, 80 + 26 * len(runs)),
        legend={"orientation": "h", "y": -0.15},
    )
    bars.update_yaxes(automargin=True, autorange="reversed")
    figures = [
        Figure(
            bars,
            "Each bar is one run's median call split into its stages (text encoding, the denoising loop, VAE "
            "decode, everything else), device-timed, as shares of the call so runs of any size compare; hover "
            "for seconds. The stages' medians need not add up to the call's median exactly. " + _measured(runs),
        )
    ]
    steps = go.Figure()
    for run in runs:
        measured = [iteration.stages.steps_s for iteration in run.result.iterations if iteration.stages.steps_s]
        if not measured:
            continue
        count = min(len(times) for times in measured)
        medians = [statistics.median(times[i] for times in measured) * 1e3 for i in range(count)]
        steps.add_scatter(x=list(range(count)), y=medians, mode="lines+markers", name=run.label)
        first = run.result.first_call
        if first is not None and first.stages.steps_s:
            steps.add_scatter(
                x=list(range(len(first.stages.steps_s))),
                y=[t * 1e3 for t in first.stages.steps_s],
                mode="lines",
                line={"dash": "dot"},
                name=f"{run.label} (first call)",
                visible="legendonly",
            )
    if steps.data:
        _layout(steps, "Time of each denoising step", runs, "denoising step (index)", "milliseconds per step")
        steps.update_yaxes(type="log")
        figures.append(
            Figure(
                steps,
                "Median over the measured calls of each step's time (from one scheduler step to the next), log "
                "scale: a cache that skips work shows as cheap steps, compilation as a slow first call (dotted, "
                "hidden until clicked in the legend). " + _measured(runs),
            )
        )
    return figures


_SETTINGS = ("model", "weights", "hardware", "dtype", "steps", "optimizations", "guidance")


def scaling(study: Study) -> list[Figure]:
    """Latency, throughput and achieved FLOP/s against batch size, and time per image against size."""
    runs = study.complete
    figures = []
    by_batch: dict[tuple, list[Run]] = defaultdict(list)
    by_size: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        row = run.row
        setting = tuple(row[key] for key in _SETTINGS)
        by_batch[setting + (row["width"], row["height"], row["frames"])].append(run)
        by_size[setting + (row["batch"], row["frames"])].append(run)
    batch_groups = {k: v for k, v in by_batch.items() if len({r.row["batch"] for r in v}) > 1}
    if batch_groups:
        figure = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=("latency per call", "throughput", "achieved compute (denoising)"),
        )
        shown = []
        for key, group in batch_groups.items():
            group = sorted(group, key=lambda r: r.row["batch"])
            shown += group
            name = f"{key[0]} {key[7]}x{key[8]} {key[5] or 'unoptimized'}"
            batches = [r.row["batch"] for r in group]
            rows = [r.row for r in group]
            hover = [
                f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU: no datasheet peak for this device"
                for r in rows
            ]
            common = {"mode": "lines+markers", "legendgroup": name}
            figure.add_scatter(
                x=batches, y=[r.result.summary.latency_s.median for r in group], name=name, row=1, col=1, **common
            )
            figure.add_scatter(
                x=batches, y=[r["images_per_s"] for r in rows], name=name, showlegend=False, row=1, col=2, **common
            )
            figure.add_scatter(
                x=batches,
                y=[r["denoise_tflops_per_s"] for r in rows],
                text=hover,
                hovertemplate="batch %{x}: %{y:.3g} TFLOP/s<br>%{text}<extra></extra>",
                name=name,
                showlegend=False,
                row=1,
                col=3,
                **common,
            )
        _layout(figure, "Scaling with batch size", shown, "", "", height=420)
        for col in (1, 2, 3):
            figure.update_xaxes(title_text="batch size (images per call)", type="log", dtick=0.30103, row=1, col=col)
        figure.update_yaxes(title_text="seconds per call (median)", row=1, col=1)
        figure.update_yaxes(title_text="images per second", row=1, col=2)
        figure.update_yaxes(title_text="TFLOP/s (10^12 FLOP/s)", row=1, col=3)
        figures.append(
            Figure(
                figure,
                "Median latency per pipeline call, images per second over the measured calls, and the denoising "
                "loop's achieved TFLOP/s: the offline FLOP count of the loop divided by its measured median time "
                "(hover: MFU against the device's dense datasheet peak). " + _measured(shown),
            )
        )
    size_groups = {k: v for k, v in by_size.items() if len({(r.row["width"], r.row["height"]) for r in v}) > 1}
    if size_groups:
        figure = go.Figure()
        shown = []
        for key, group in size_groups.items():
            group = sorted(group, key=lambda r: r.row["width"] * r.row["height"])
            shown += group
            figure.add_scatter(
                x=[r.row["width"] * r.row["height"] / 1e6 for r in group],
                y=[r.row["s_per_image"] for r in group],
                text=[f"{r.row['width']}x{r.row['height']}" for r in group],
                hovertemplate="%{text}: %{y:.4g} s per image<extra></extra>",
                mode="lines+markers",
                name=f"{key[0]} b{key[7]} {key[5] or 'unoptimized'}",
            )
        _layout(figure, "Scaling with resolution", shown, "megapixels per image", "seconds per image (median)")
        figures.append(
            Figure(
                figure,
                "Median seconds per image against the image size, every other setting equal. " + _measured(shown),
            )
        )
    return figures


def tradeoffs(study: Study) -> list[Figure]:
    """Speed-up against image quality per technique; energy and memory against latency (Pareto)."""
    runs = study.complete
    figures = []
    judged = [run for run in runs if run.result.quality is not None and run.row["speedup"] is not None]
    if judged:
        figure = make_subplots(rows=1, cols=2, subplot_titles=("PSNR (identical images left out)", "SSIM"))
        techniques: dict[str, list[Run]] = defaultdict(list)
        for run in judged:
            techniques[run.row["optimizations"] or "unoptimized"].append(run)
        for name, group in sorted(techniques.items()):
            color = _color(name, list(techniques))
            labels = [run.label for run in group]
            speedups = [run.row["speedup"] for run in group]
            finite = [(s, r.row["psnr_db"], r.label) for s, r in zip(speedups, group, strict=True) if r.row["psnr_db"]]
            figure.add_scatter(
                x=[f[0] for f in finite],
                y=[f[1] for f in finite],
                text=[f[2] for f in finite],
                hovertemplate="%{text}<br>%{x:.2f}x faster, PSNR %{y:.1f} dB<extra></extra>",
                mode="markers",
                marker={"size": 10, "color": color},
                name=name,
                legendgroup=name,
                row=1,
                col=1,
            )
            figure.add_scatter(
                x=speedups,
                y=[run.row["ssim"] for run in group],
                text=labels,
                hovertemplate="%{text}<br>%{x:.2f}x faster, SSIM %{y:.4f}<extra></extra>",
                mode="markers",
                marker={"size": 10, "color": color},
                name=name,
                legendgroup=name,
                showlegend=not finite,
                row=1,
                col=2,
            )
        _layout(figure, "Speed-up against image quality", judged, "", "", height=420)
        for col in (1, 2):
            figure.update_xaxes(title_text="speed-up over the unoptimized run (x)", row=1, col=col)
        figure.update_yaxes(title_text="PSNR vs unoptimized images (dB)", row=1, col=1)
        figure.update_yaxes(title_text="SSIM vs unoptimized images (1 = same)", row=1, col=2)
        figures.append(
            Figure(
                figure,
                "Each point is an optimized run: its speed-up over the unoptimized run of the same settings, "
                "against its images compared with the unoptimized images at the same seeds (mean PSNR, mean "
                "SSIM). Lossless techniques sit at SSIM 1. " + _measured(judged),
            )
        )
    energy_kind = next(
        (kind for kind in ("gpu", "cpu") if any(run.row[f"{kind}_j_per_image"] is not None for run in runs)), None
    )
    if energy_kind:
        measured = [run for run in runs if run.row[f"{energy_kind}_j_per_image"] is not None]
        figures.append(
            _pareto(
                measured,
                [run.row[f"{energy_kind}_j_per_image"] for run in measured],
                f"{energy_kind.upper()} energy per image (J)",
                "Energy per image against latency",
                f"{energy_kind.upper()} energy per image (Zeus) against median seconds per image; a model's line "
                "joins its runs that no other run of that model beats on both. ",
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
                "Peak memory against latency",
                "Peak memory (CUDA max allocated on GPU runs, else the process's peak resident memory) against "
                "median seconds per image; a model's line joins its runs that no other run of that model beats on "
                "both. ",
            )
        )
    if not energy_kind and runs:
        reasons = sorted({run.result.summary.energy.reason for run in runs if run.result.summary.energy.reason})
        figures[-1].caption += f" No energy was measured: {'; '.join(reasons) or 'no counters'}."
    return figures


def _pareto(runs: list[Run], values: list[float], y: str, title: str, caption: str) -> Figure:
    """Each model's runs, and its Pareto frontier (no run of the same model beats one on it on both)."""
    figure = go.Figure()
    by_model: dict[str, list[tuple[float, float, Run]]] = defaultdict(list)
    for run, value in zip(runs, values, strict=True):
        by_model[run.row["model"]].append((run.row["s_per_image"], value, run))
    for model, points in sorted(by_model.items()):
        color = _color(model, list(by_model))
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
            hovertemplate="%{text}<br>%{x:.4g} s per image, %{y:.4g}<extra></extra>",
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
            name=f"{model}: Pareto frontier",
            legendgroup=model,
        )
    _layout(figure, title, runs, "seconds per image (median, log scale)", y + ", log scale")
    figure.update_xaxes(type="log")
    figure.update_yaxes(type="log")
    return Figure(figure, caption + _measured(runs))


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
                text=[f"{row.speedup:.2f}x" for row in rows],
                textposition="outside",
                hovertemplate="%{x}: %{text} overall<extra></extra>",
                connector={"line": {"color": "#999"}},
            )
        )
        runs = [run for row in rows if row.folder and (run := study.run_at(row.folder)) is not None]
        _layout(
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
            f"From {path.relative_to(study.root)}: each bar is what one rung adds to the median-latency speed-up "
            f"of the rung before; the label is the speed-up so far. Measured on {ladder.device}; weights: "
            f"{', '.join(weights)}."
        )
        if skipped:
            caption += " Skipped: " + "; ".join(skipped) + "."
        figures.append(Figure(figure, caption))
    return figures


def compute(study: Study) -> list[Figure]:
    """Offline compute: each profile's components, and compute against size and steps."""
    profiles = study.profiles
    if not profiles:
        return []
    labels = [f"{_profile_label(p)} ({p.total_flops / 1e12:.4g} TFLOPs)" for p in profiles]
    shares = go.Figure()
    names = sorted({(c.role, c.name) for p in profiles for c in p.components})
    for role, name in names:
        shares.add_bar(
            name=f"{name} ({role})",
            y=labels,
            x=[100 * sum(c.share for c in p.components if c.name == name) for p in profiles],
            customdata=[sum(c.flops for c in p.components if c.name == name) / 1e12 for p in profiles],
            orientation="h",
            hovertemplate="%{y}<br>" + name + ": %{customdata:.4g} TFLOPs, %{x:.1f}%<extra></extra>",
        )
    _layout(  # offline counts: no weights, no runs to label
        shares,
        "Compute per component (offline, from configs)",
        [],
        "share of the generation's FLOPs (%)",
        "profile (TFLOPs per generation: 10^12 floating-point operations, 2 per MAC)",
        barmode="stack",
        height=max(320, 80 + 26 * len(profiles)),
        legend={"orientation": "h", "y": -0.15},
    )
    shares.update_yaxes(automargin=True, autorange="reversed")
    figures = [
        Figure(
            shares,
            "Floating-point operations of one whole generation per component, counted offline from the model "
            "configs (no weights: the count is the same for pretrained and random weights; exact for the calls "
            "the pipeline makes).",
        )
    ]
    by_model: dict[str, list[Profile]] = defaultdict(list)
    for profile in profiles:
        by_model[profile.name].append(profile)
    for axis, key, title in (
        ("megapixels per image", lambda p: p.height * p.width / 1e6, "Compute against resolution"),
        ("denoising steps", lambda p: p.steps, "Compute against steps"),
    ):
        figure = go.Figure()
        for name, group in by_model.items():
            points = sorted({(key(p), p.total_flops / 1e12 / p.batch_size) for p in group})
            if len({x for x, _ in points}) > 1:
                figure.add_scatter(x=[x for x, _ in points], y=[y for _, y in points], mode="lines+markers", name=name)
        if figure.data:
            _layout(
                figure,
                title + " (offline, from configs)",
                [],
                axis,
                "TFLOPs per image (10^12 floating-point operations)",
            )
            figures.append(
                Figure(figure, "Whole-generation TFLOPs per image from the stored profiles, counted offline.")
            )
    return figures


def _profile_label(profile: Profile) -> str:
    frames = f"x{profile.num_frames}f" if profile.num_frames else ""
    cfg = "CFG" if profile.cfg else "no CFG"
    return f"{profile.name} {profile.width}x{profile.height}{frames} {profile.steps} steps b{profile.batch_size} {cfg}"


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
        _layout(
            figure,
            f"Operators by kind: {run.label}",
            [run],
            f"share of the stage's time (%, self {unit} time)",
            "stage (its time in the traced call)",
            barmode="stack",
            height=max(260, 90 + 40 * len(stages)),
            legend={"orientation": "h", "y": -0.25},
        )
        figure.update_yaxes(automargin=True, autorange="reversed")
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
                + _measured([run]),
                table,
            )
        )
    return figures


def _rate(total) -> str:
    if total is None or total.achieved_tflops is None:
        return "no FLOP formula"
    return f"{total.achieved_tflops:.3g} TFLOP/s achieved"


def predictions(study: Study) -> list[Figure]:
    """Each run's predicted time per call (roofline lower bound, calibrated expected range) against
    its measured median, and predicted peak memory against the measured CUDA peak where there is one."""
    predicted = [r for r in study.runs if r.result.prediction is not None and r.result.prediction.time is not None]
    timed = [r for r in predicted if not r.result.prediction.time_left_out]  # a prediction of what ran
    left_out = len(predicted) - len(timed)
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
            name="predicted = measured",
        )
        _layout(
            figure, "Predicted against measured time per call", timed, "measured median (s, log)", "predicted (s, log)"
        )
        figure.update_xaxes(type="log")
        figure.update_yaxes(type="log")
        devices = sorted({t.device for t in times})
        found.append(
            Figure(
                figure,
                "Each run's time predicted offline for its device "
                f"({', '.join(devices)}): a lower bound (every operator at max(FLOPs / peak, bytes / bandwidth)) "
                "and, where the device kind is calibrated, the expected range. Points below the dotted line are "
                "predicted faster than measured. "
                + (
                    f"{left_out} run(s) left out: their speed-ups are not in the prediction, which is of the "
                    "pipeline without them. "
                    if left_out
                    else ""
                )
                + _measured(timed),
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
        figure.add_scatter(x=ends, y=ends, mode="lines", line={"color": "#999", "dash": "dot"}, name="equal")
        _layout(figure, "Predicted against measured peak memory", sized, "CUDA max allocated (GiB)", "predicted (GiB)")
        found.append(
            Figure(
                figure,
                "Predicted peak of tensors (fake-tensor tracking, with the run's modelled memory techniques) "
                "against torch.cuda.max_memory_allocated; the CUDA context and the allocator's reserve are in "
                "neither. " + _measured(sized),
            )
        )
    return found
