"""The report's plots (Plotly), one builder per question, each in a module of its own: it returns the figures
it can draw from the study (none when the study holds nothing for it), with captions saying what was measured,
where, and with which weights. ``SECTIONS`` orders them on the page."""

from __future__ import annotations

from diffmeter.report.html.compute_plots import compute
from diffmeter.report.html.ladder_plots import ladders
from diffmeter.report.html.operator_plots import operators
from diffmeter.report.html.plot_style import Figure
from diffmeter.report.html.prediction_plots import predictions
from diffmeter.report.html.scaling_plots import scaling
from diffmeter.report.html.time_plots import time_breakdown
from diffmeter.report.html.tradeoff_plots import tradeoffs

#: (anchor, heading, builder) in page order
SECTIONS = (
    ("time", "Where the time goes", time_breakdown),
    ("operators", "Inside the stages: operators", operators),
    ("scaling", "Scaling", scaling),
    ("tradeoffs", "Trade-offs", tradeoffs),
    ("ladders", "Ladders", ladders),
    ("compute", "Compute", compute),
    ("predictions", "Predicted against measured", predictions),
)

__all__ = ["SECTIONS", "Figure"]
