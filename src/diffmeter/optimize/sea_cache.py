"""SeaCache: skip the transformer's repeated blocks while the accumulated relative change of a spectrally filtered
view of the latents (its SEA indicator) stays under ``threshold``; a skipped call adds back the blocks' residual,
extrapolated from the last two computed calls. Diffusers reads the latents with built-in adapters for Cosmos 3 and
Wan text-to-video only, and its gate with the scheduler step and sigma the pipeline hands ``cache_context``."""

from __future__ import annotations

import inspect
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from diffmeter.optimize.base import Target
from diffmeter.optimize.hook_cache import HookCache
from diffmeter.optimize.registry import register
from diffmeter.pipelines import component_class

#: where diffusers' own adapters are chosen (diffusers 0.42.1 hooks/sea_cache.py:994-1006): any other denoiser gets
#: no latents to compare and runs every call in full, logging a warning (:566-576)
ADAPTERS = "diffusers 0.42.1 hooks/sea_cache.py:994-1006"


class Config(BaseModel):
    """diffusers' ``SeaCacheConfig`` defaults (hooks/sea_cache.py:80-85) and the checks of its ``__post_init__``
    (:91-109): a finite non-negative threshold, residual order 0 or 1, non-negative step counts, an integer (not a
    bool) consecutive limit, a finite positive exponent."""

    model_config = ConfigDict(extra="forbid")
    #: accumulated relative L1 change of the indicator under which the blocks are skipped
    threshold: float = Field(0.25, ge=0, allow_inf_nan=False)
    #: 0 reuses the last residual, 1 extrapolates it linearly from the last two computed calls
    residual_order: Literal[0, 1] = 1
    #: first and last scheduler steps that always compute
    retention_steps: int = Field(1, ge=0)
    cache_end_steps: int = Field(1, ge=0)
    #: consecutive skipped calls before one is forced to compute (0: no limit)
    max_consecutive_cached: StrictInt = Field(2, ge=0)
    #: exponent of the clean signal's power prior in the spectral filter
    power_exp: float = Field(3.0, gt=0, allow_inf_nan=False)


@register
class SeaCache(HookCache):
    name = "sea-cache"
    summary = "skip the transformer blocks while a spectrally filtered view of the latents barely changes"
    Config = Config
    needs_context = True

    def supports(self, target: Target) -> str | None:
        return super().supports(target) or no_adapter(target) or no_step_context(target) or with_images(target)

    def hook_config(self, pipe, target):
        from diffusers.hooks import SeaCacheConfig

        return SeaCacheConfig(**self.config.model_dump())


def no_adapter(target: Target) -> str | None:
    """Why diffusers' SeaCache has no adapter for the run's denoisers (each expert too), or None."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel

    for name in target.family.denoisers(target.entry):
        component = target.entry.components[name]
        cls = component_class(component.class_name)
        if issubclass(cls, Cosmos3OmniTransformer):
            continue
        if not issubclass(cls, WanTransformer3DModel):
            return (
                f"SeaCache reads the latents of Cosmos 3 and Wan text-to-video transformers only ({ADAPTERS}); "
                f"on {cls.__name__} it would run every call in full"
            )
        channels = component.config.get("in_channels"), component.config.get("out_channels")
        if channels[0] != channels[1]:
            return (
                f"{name} takes {channels[0]} input channels and returns {channels[1]} (an image-to-video "
                f"transformer); SeaCache's Wan adapter reads text-to-video latents only ({ADAPTERS}), so it would "
                "run every call in full"
            )
    return None


def no_step_context(target: Target) -> str | None:
    """Why the pipeline does not give SeaCache's gate the scheduler step and sigma, or None: the hook reads them from
    ``cache_context`` (hooks/sea_cache.py:516-532; WanPipeline passes them, pipeline_wan.py:615-620)."""
    try:
        source = inspect.getsource(target.pipeline_class.__call__)
    except (OSError, TypeError, AttributeError):
        source = ""
    if "cache_context" in source and "sigma" in source:
        return None
    return (
        f"{target.entry.pipeline_class} does not hand the scheduler step and sigma to cache_context, which "
        "SeaCache's gate reads (diffusers hooks/sea_cache.py:516-532); it would run every call in full"
    )


def with_images(target: Target) -> str | None:
    """With input images the Wan family runs WanImageToVideoPipeline (``families/video.py`` conditioned_pipeline),
    whose ``cache_context("cond")`` carries no step or sigma (diffusers pipeline_wan_i2v.py:775)."""
    if not target.images:
        return None
    return (
        "with input images the pipeline runs as its image-to-video pipeline, whose cache_context carries no "
        "scheduler step or sigma (diffusers pipeline_wan_i2v.py:775), so SeaCache would run every call in full; "
        "drop the image"
    )
