"""MagCache: skip steps while the accumulated residual-magnitude error, predicted from
ratios calibrated per checkpoint, stays under ``threshold``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.base import Target
from diffmeter.optimize.hook_cache import HookCache
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: float = Field(0.06, gt=0)
    max_skip_steps: int = Field(3, ge=1)
    retention_ratio: float = Field(0.2, ge=0, le=1)


@register
class MagCache(HookCache):
    name = "mag-cache"
    summary = "skip steps while predicted residual magnitudes stay close (calibrated ratios)"
    Config = Config
    needs_context = True
    needs_registered_blocks = True

    def supports(self, target: Target) -> str | None:
        reason = super().supports(target)
        if reason is None and target.entry.family != "flux":
            reason = "MagCache needs magnitude ratios calibrated per checkpoint; diffusers ships them for FLUX only"
        return reason

    def hook_config(self, pipe, target):
        from diffusers.hooks import MagCacheConfig
        from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

        return MagCacheConfig(
            threshold=self.config.threshold,
            max_skip_steps=self.config.max_skip_steps,
            retention_ratio=self.config.retention_ratio,
            num_inference_steps=target.steps,
            mag_ratios=FLUX_MAG_RATIOS,
        )
