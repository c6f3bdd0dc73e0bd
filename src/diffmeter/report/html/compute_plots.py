"""Offline compute: each profile's FLOPs per component, and FLOPs against resolution and steps."""

from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

from diffmeter import units
from diffmeter.flops.schema import Profile
from diffmeter.report.html.plot_style import Colors, Figure, layout, share_bars
from diffmeter.report.html.study import Study


def compute(study: Study) -> list[Figure]:
    """Offline compute: each profile's components, and compute against size and steps."""
    profiles = study.profiles
    if not profiles:
        return []
    labels = [f"{profile_label(p)} ({units.flops(p.total_flops)})" for p in profiles]
    shares = go.Figure()
    names = sorted({(c.role, c.name) for p in profiles for c in p.components})
    for role, name in names:
        shares.add_bar(
            name=f"{name} ({role})",
            y=labels,
            x=[100 * sum(c.share for c in p.components if c.name == name) for p in profiles],
            customdata=[units.flops(sum(c.flops for c in p.components if c.name == name)) for p in profiles],
            orientation="h",
            hovertemplate="%{y}<br>" + name + ": %{customdata}, %{x:.1f}%<extra></extra>",
        )
    share_bars(  # offline counts: no weights, no runs to label
        shares,
        "Compute per component (offline, from configs)",
        [],
        "share of the generation's FLOPs (%)",
        "profile",
        len(profiles),
    )
    figures = [
        Figure(
            shares,
            "Floating-point operations (2 per multiply-accumulate) of one whole generation per component, counted "
            "offline from the model "
            "configs (no weights: the count is the same for pretrained and random weights; exact for the calls "
            "the pipeline makes).",
        )
    ]
    by_model: dict[str, list[Profile]] = defaultdict(list)
    for profile in profiles:
        by_model[profile.name].append(profile)
    for axis, unit, key, title in (
        ("megapixels per image", "megapixels", lambda p: p.height * p.width / 1e6, "Compute against resolution"),
        ("denoising steps", "steps", lambda p: p.steps, "Compute against steps"),
    ):
        figure = go.Figure()
        series = {
            name: sorted({(key(p), p.total_flops / p.batch_size) for p in group}) for name, group in by_model.items()
        }
        series = {name: points for name, points in series.items() if len({x for x, _ in points}) > 1}
        if not series:
            continue
        factor, prefix = units.prefix(max(y for points in series.values() for _, y in points))
        colors = Colors(series)
        for name, points in series.items():
            figure.add_scatter(
                x=[x for x, _ in points],
                y=[y / factor for _, y in points],
                mode="lines+markers",
                hovertemplate=f"{name}<br>%{{x:.4g}} {unit}: %{{y:.4g}} {prefix}FLOPs per image<extra></extra>",
                name=name,
                **colors.trace(name),
            )
        layout(figure, title + " (offline, from configs)", [], axis, f"{prefix}FLOPs per image")
        figures.append(Figure(figure, "Whole-generation FLOPs per image from the stored profiles, counted offline."))
    return figures


def profile_label(profile: Profile) -> str:
    frames = f"x{profile.num_frames}f" if profile.num_frames else ""
    cfg = "CFG" if profile.cfg else "no CFG"
    return f"{profile.name} {profile.width}x{profile.height}{frames} {profile.steps} steps b{profile.batch_size} {cfg}"
