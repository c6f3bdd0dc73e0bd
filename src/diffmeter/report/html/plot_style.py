"""What every plot of the report shares: the figure with its caption, titles naming the weights, one colour
per series in every subplot and legend, axes whose titles are never clipped, log axes ticked with whole
numbers, and a plot with nothing to draw saying why instead of drawing empty axes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.colors
import plotly.graph_objects as go

from diffmeter import units
from diffmeter.report.html.study import WEIGHTS_LABELS, Run
from diffmeter.report.speedup_text import noise_lines
from diffmeter.stages import STAGE_NAMES

STAGES = {**STAGE_NAMES, "other": "other"}
STAGE_COLORS = {
    "text_encoding": "#4c78a8",
    "image_encoding": "#b279a2",
    "denoising": "#f58518",
    "vae_decode": "#54a24b",
    "other": "#bab0ac",
}


@dataclass
class Figure:
    figure: go.Figure
    caption: str
    #: a table shown under the plot (already escaped HTML)
    table: str = ""


class Colors:
    """One colour per series name, fixed before any trace is drawn, so every subplot and the legend agree."""

    def __init__(self, names) -> None:
        palette = plotly.colors.qualitative.Plotly
        self.map = {name: palette[index % len(palette)] for index, name in enumerate(sorted(set(names)))}

    def __getitem__(self, name: str) -> str:
        return self.map[name]

    def trace(self, name: str, line: bool = True) -> dict:
        """A scatter trace's colour settings: marker and line alike."""
        style = {"marker": {"color": self.map[name]}}
        if line:
            style["line"] = {"color": self.map[name]}
        return style


def weights_tag(weights: set[str]) -> str:
    """What every plot of runs with these weights must say about them (empty for pretrained only)."""
    marked = [WEIGHTS_LABELS[w] for w in ("tiny-random", "random") if w in weights]
    return f" [{' + '.join(marked)}]" if marked else ""


def measured(runs: list[Run]) -> str:
    hardware = sorted({run.row["hardware"] for run in runs})
    weights = sorted({WEIGHTS_LABELS[run.weights] for run in runs})
    calls = sorted({run.result.summary.iterations for run in runs if run.result.summary})
    calls_text = units.counted(calls[0], "call") if len(calls) == 1 else f"{calls[0]}-{calls[-1]} calls"
    noisy = sorted({run.label for run in runs if noise_lines([run.row])})
    said = f" Noisy timings (the summary's notes say why; compare them loosely): {', '.join(noisy)}." if noisy else ""
    return f"Measured on {', '.join(hardware)}, {calls_text} per run; weights: {', '.join(weights)}.{said}"


def layout(figure, title: str, runs: list[Run], x: str, y: str, **extra) -> None:
    tag = weights_tag({run.weights for run in runs})
    settings = {
        "title": {"text": title + tag, "font": {"size": 15}},
        "template": "plotly_white",
        "xaxis_title": x,
        "yaxis_title": y,
        "margin": {"l": 70, "r": 20, "t": 70, "b": 60},
        "legend": {"font": {"size": 11}},
    }
    figure.update_layout(**{**settings, **extra})
    figure.update_xaxes(automargin=True)  # a long tick label pushes the title out instead of over it
    figure.update_yaxes(automargin=True)


def share_bars(figure, title: str, runs: list[Run], x: str, y: str, rows: int) -> None:
    """Horizontal bars of shares stacked to 100%, one row per run (or profile), listed top to bottom."""
    height = max(320, 80 + 26 * rows)
    layout(figure, title, runs, x, y, barmode="stack", height=height, legend={"orientation": "h", "y": -0.2})
    figure.update_xaxes(range=[0, 100])
    figure.update_yaxes(autorange="reversed")


def log_ticks(values: list[float], render=lambda v: f"{v:.3g}") -> dict:
    """Tick settings for a log axis over ``values``: 1-2-5 steps from the one below the lowest value to the one
    above the highest (powers of ten over many decades), each labelled in full ("200 ms", never a bare "2")."""
    positive = [v for v in values if v > 0]
    if not positive:
        return {}
    low, high = min(positive), max(positive)
    ticks = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        ticks += [mantissa * 10.0**exponent for mantissa in (1, 2, 5)]
    below = max(t for t in ticks if t <= low * (1 + 1e-9))
    above = min(t for t in ticks if t >= high * (1 - 1e-9))
    inside = [t for t in ticks if below <= t <= above]
    if len(inside) > 9:  # many decades: powers of ten only
        inside = [t for t in inside if math.isclose(10 ** round(math.log10(t)), t)]
    if high / low < 1.5:  # a narrow range: its ends labelled in full (one when they would overlap)
        inside = sorted({low, high}) if high / low >= 1.1 else [low]
        pad = max(0.3 * math.log10(high / low), 0.01)  # in decades
        return {
            "type": "log",
            "tickvals": inside,
            "ticktext": [render(t) for t in inside],
            "range": [math.log10(low) - pad, math.log10(high) + pad],
        }
    shown = [math.log10(below) - 0.02, math.log10(above) + 0.02]  # the ticks' span, so none is off the plot
    return {"type": "log", "tickvals": inside, "ticktext": [render(t) for t in inside], "range": shown}


def explain(figure: go.Figure, why: str, row: int | None = None, col: int | None = None) -> None:
    """No axes where there is nothing to draw: the reason, in their place."""
    axes = {"row": row, "col": col} if row is not None else {}
    figure.update_xaxes(visible=False, **axes)
    figure.update_yaxes(visible=False, **axes)
    x, y = 0.5, 0.5  # in paper coordinates: the middle of the subplot (an invisible axis hides what refers to it)
    if row is not None:
        subplot = figure.get_subplot(row, col)
        x, y = (sum(subplot.xaxis.domain) / 2, sum(subplot.yaxis.domain) / 2)
    figure.add_annotation(
        text=why,
        x=x,
        y=y,
        xref="paper",
        yref="paper",
        xanchor="center",
        yanchor="middle",
        showarrow=False,
        font={"size": 13, "color": "#555"},
    )
