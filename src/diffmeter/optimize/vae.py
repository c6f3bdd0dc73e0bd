"""VAE memory savers: decode a batch one image at a time (slicing, exact) or a large image
in overlapping tiles (tiling, blended seams)."""

from __future__ import annotations

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register
from diffmeter.pipelines import component_class


class _VAEMethod(Optimization):
    kind = "memory"
    method: str

    def supports(self, target: Target) -> str | None:
        decoder = component_class(target.entry.components[target.family.decoder].class_name)
        if not hasattr(decoder, self.method):
            return f"{decoder.__name__} has no {self.method}"
        return None

    def apply(self, pipe, target: Target) -> None:
        getattr(getattr(pipe, target.family.decoder), self.method)()


@register
class VAESlicing(_VAEMethod):
    name = "vae-slicing"
    lossless = True
    summary = "decode the batch one latent at a time (lower peak memory at batch > 1)"
    method = "enable_slicing"


@register
class VAETiling(_VAEMethod):
    name = "vae-tiling"
    lossless = False
    summary = "decode in overlapping tiles blended together (lower peak memory at large sizes)"
    method = "enable_tiling"
