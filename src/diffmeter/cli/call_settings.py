"""The settings a profile took from the catalog, against what the pipeline's own bare call runs."""

from __future__ import annotations

#: the asked fields each difference of a bare call stands for (``pipeline_defaults.bare_call_differences``)
UNSET = {
    "steps": ("steps",),
    "size": ("height", "width"),
    "guidance_scale": ("guidance_scale",),
    "num_frames": ("num_frames",),
}


def settings_line(spec) -> str | None:
    """Where the catalog's settings (a model card's) that this generation took differ from what a bare
    ``pipeline(prompt)`` call runs (a new user's trial: flux-dev's 50 steps, FluxPipeline's 28), or None."""
    from diffmeter.catalog import resolve
    from diffmeter.catalog.pipeline_defaults import bare_call_differences

    entry = resolve(spec.model)
    if entry.is_tiny or entry.origin != "catalog":
        return None
    differing = bare_call_differences(entry)
    taken = [text for key, text in differing.items() if all(getattr(spec, f) is None for f in UNSET[key])]
    if not taken:
        return None
    return (
        f"settings: the model card's, as the catalog has them; a bare {entry.pipeline_class}(prompt) call runs "
        f"{', '.join(taken)} (ask for them with --steps, --height/--width, --guidance-scale, --num-frames)"
    )
