"""How a catalog entry's default guidance scale acts, as its family runs it: classifier-free guidance, a scale
the denoiser embeds (guidance-distilled: one pass), or none; what `diffmeter models` shows."""

from __future__ import annotations

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.families.base import get_family
from diffmeter.pipelines import config_value
from diffmeter.spec import ProfileSpec

CFG, EMBEDDED, NONE = "cfg", "embedded", "none"


def guidance_mode(entry: PipelineEntry) -> str:
    """``CFG`` where the family guides at the entry's defaults (as the profile counts it), else ``EMBEDDED``
    where its denoiser takes the scale as an input (``guidance_embeds``, the class's default where the config
    leaves it out: FLUX.2 [dev]), else ``NONE``."""
    family = get_family(entry.family)
    if family.guided(family.shapes(entry, ProfileSpec(model=entry.name).with_defaults(entry.defaults))):
        return CFG
    try:
        embeds = config_value(entry.components[family.denoiser], "guidance_embeds")
    except KeyError:  # a denoiser class without the setting
        embeds = False
    return EMBEDDED if embeds else NONE
