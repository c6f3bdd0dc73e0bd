"""How runs scale: latency, throughput and achieved compute against batch size; time per image against size."""

from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diffmeter import units
from diffmeter.report.html.plot_style import Colors, Figure, layout, measured
from diffmeter.report.html.study import Run, Study, told_apart

SETTINGS = ("model", "weights", "hardware", "dtype", "steps", "optimizations", "guidance", "settings", "parallel")
#: where a group's key continues after SETTINGS: (width, height, frames) or (batch, frames)
AFTER = len(SETTINGS)


def scaling(study: Study) -> list[Figure]:
    """Latency, throughput and achieved FLOP/s against batch size, and time per image against size."""
    runs = study.complete
    figures = []
    by_batch: dict[tuple, list[Run]] = defaultdict(list)
    by_size: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        row = run.row
        setting = tuple(row[key] for key in SETTINGS)
        by_batch[setting + (row["width"], row["height"], row["frames"])].append(run)
        by_size[setting + (row["batch"], row["frames"])].append(run)
    batch_groups = {k: v for k, v in by_batch.items() if len({r.row["batch"] for r in v}) > 1}
    if batch_groups:
        peak = max((r.row["denoise_tflops_per_s"] or 0 for g in batch_groups.values() for r in g), default=0)
        rate = units.prefix(peak * 1e12)  # the achieved rate in the unit that reads 1-999
        figure = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=("latency per call", "throughput", "achieved compute (denoising)"),
        )
        shown = []
        names = _names(batch_groups, _batch_name)
        colors = Colors(names.values())
        values: dict[str, list[float]] = {"latency": [], "throughput": [], "compute": []}
        for key, group in batch_groups.items():
            group = sorted(group, key=lambda r: r.row["batch"])
            shown += group
            name = names[key]
            batches = [r.row["batch"] for r in group]
            rows = [r.row for r in group]
            hover = [
                f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU: no datasheet peak for this device"
                for r in rows
            ]
            common = {"mode": "lines+markers", "legendgroup": name, **colors.trace(name)}
            latency = [r.result.summary.latency_s.median for r in group]
            values["latency"] += latency
            values["throughput"] += [r["images_per_s"] for r in rows]
            values["compute"] += [r["denoise_tflops_per_s"] * 1e12 for r in rows if r["denoise_tflops_per_s"]]
            figure.add_scatter(
                x=batches,
                y=latency,
                hovertemplate="batch %{x}: %{y:.4g} s per call (median)<extra></extra>",
                name=name,
                row=1,
                col=1,
                **common,
            )
            figure.add_scatter(
                x=batches,
                y=[r["images_per_s"] for r in rows],
                hovertemplate="batch %{x}: %{y:.4g} images per second<extra></extra>",
                name=name,
                showlegend=False,
                row=1,
                col=2,
                **common,
            )
            figure.add_scatter(
                x=batches,
                y=[r["denoise_tflops_per_s"] * 1e12 / rate[0] if r["denoise_tflops_per_s"] else None for r in rows],
                text=hover,
                hovertemplate="batch %{x}: %{y:.3g} " + rate[1] + "FLOP/s<br>%{text}<extra></extra>",
                name=name,
                showlegend=False,
                row=1,
                col=3,
                **common,
            )
        layout(figure, "Scaling with batch size", shown, "", "", height=440)
        batches = sorted({r.row["batch"] for r in shown})
        for col in (1, 2, 3):
            figure.update_xaxes(
                title_text="batch (images per call)", type="log", tickvals=batches, ticktext=batches, row=1, col=col
            )
        figure.update_yaxes(title_text="seconds per call (median)", row=1, col=1)
        figure.update_yaxes(title_text="images per second", row=1, col=2)
        figure.update_yaxes(title_text=f"{rate[1]}FLOP/s", row=1, col=3)
        figures.append(
            Figure(
                figure,
                "Median latency per pipeline call, images per second over the measured calls, and the denoising "
                f"loop's achieved {rate[1]}FLOP/s: the offline FLOP count of the loop divided by its measured median "
                "time (hover: MFU against the device's dense datasheet peak). " + measured(shown),
            )
        )
    size_groups = {k: v for k, v in by_size.items() if len({(r.row["width"], r.row["height"]) for r in v}) > 1}
    if size_groups:
        figure = go.Figure()
        shown = []
        names = _names(size_groups, _size_name)
        colors = Colors(names.values())
        for key, group in size_groups.items():
            group = sorted(group, key=lambda r: r.row["width"] * r.row["height"])
            shown += group
            figure.add_scatter(
                x=[r.row["width"] * r.row["height"] / 1e6 for r in group],
                y=[r.row["s_per_image"] for r in group],
                text=[f"{r.row['width']}x{r.row['height']}" for r in group],
                hovertemplate="%{text} (%{x:.3g} megapixels): %{y:.4g} s per image<extra></extra>",
                mode="lines+markers",
                name=names[key],
                **colors.trace(names[key]),
            )
        layout(figure, "Scaling with resolution", shown, "megapixels per image", "seconds per image (median)")
        figures.append(
            Figure(
                figure,
                "Median seconds per image against the image size, every other setting equal. " + measured(shown),
            )
        )
    return figures


def _names(groups: dict[tuple, list[Run]], short) -> dict[tuple, str]:
    """Each group's legend name: ``short`` of its key, told apart from the figure's other groups of that name."""
    keys = list(groups)
    return dict(zip(keys, told_apart([short(key) for key in keys], [groups[key][0].row for key in keys]), strict=True))


def _batch_name(key: tuple) -> str:
    return f"{key[0]} {key[AFTER]}x{key[AFTER + 1]} {key[5] or 'unoptimized'}"


def _size_name(key: tuple) -> str:
    return f"{key[0]} b{key[AFTER]} {key[5] or 'unoptimized'}"
