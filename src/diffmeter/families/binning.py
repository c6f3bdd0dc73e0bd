"""The size a pipeline really generates at: resolution binning by aspect ratio, as PixArt and SANA pipelines do it
(their own tables, read from diffusers), and the rounding or refusal of a size off the pipeline's multiple."""

from __future__ import annotations

import importlib

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError


def binned_size(
    entry: PipelineEntry, denoiser: str, bin_tables: tuple[str, dict[int, str]], height: int, width: int
) -> tuple[int, int]:
    """The bin ``height`` x ``width`` snaps to: the table (module, {sample_size: table name}) of the denoiser's
    ``sample_size``, classified by diffusers' ``PixArtImageProcessor.classify_height_width_bin``."""
    from diffusers.image_processor import PixArtImageProcessor

    module, tables = bin_tables
    sample_size = entry.components[denoiser].config["sample_size"]
    if sample_size not in tables:
        raise DiffmeterError(
            f"{entry.name}: no resolution bins for sample_size {sample_size}; pass --no-resolution-binning"
        )
    bins = getattr(importlib.import_module(module), tables[sample_size])
    return PixArtImageProcessor.classify_height_width_bin(height, width, ratios=bins)


def rounded_size(
    entry: PipelineEntry, height: int, width: int, step: int, rounding: str
) -> tuple[int, int, str | None]:
    """(height, width) a pipeline makes of a request off its multiple ``step`` (``Family.size_rounding``: "refuse",
    or round "down" / "up"), with a note when it differs; a refusal in one line naming the rule."""
    made = []
    for side, value in (("height", height), ("width", width)):
        down, up = value // step * step, -(-value // step) * step
        if value % step == 0:
            made.append(value)
        elif rounding == "refuse":
            options = " or ".join(str(size) for size in dict.fromkeys((down, up)) if size > 0)
            raise DiffmeterError(
                f"--{side} {value} is not a multiple of {step}, which {entry.pipeline_class} requires "
                f"for {entry.name}; try {options}"
            )
        elif rounding == "down" and down == 0:
            # a pipeline rounding down does not refuse: it makes 0 latent rows (diffusers 0.42.1
            # pipelines/flux/pipeline_flux.py:558, height = 2 * (int(height) // (self.vae_scale_factor * 2)))
            raise DiffmeterError(
                f"--{side} {value} leaves nothing to generate: {entry.pipeline_class} rounds each side down to a "
                f"multiple of {step} pixels ({value} -> 0) for {entry.name}; try {up}"
            )
        else:
            made.append(down if rounding == "down" else up)
    if (made[0], made[1]) == (height, width):
        return height, width, None
    note = (
        f"{entry.pipeline_class} generates {width}x{height} (WxH) at {made[1]}x{made[0]}: it rounds each side "
        f"{rounding} to a multiple of {step} pixels"
    )
    return made[0], made[1], note
