"""Resolution binning by aspect ratio, as PixArt and SANA pipelines do it: their own tables, read from diffusers."""

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
