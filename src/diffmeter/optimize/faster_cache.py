"""FasterCache: reuse attention outputs across steps, and (for guided models) approximate
the unconditional branch from the conditional one on most steps."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.hook_cache import HookCache, Window
from diffmeter.optimize.registry import register


class Config(BaseModel):
    """diffusers' own defaults (FasterCacheConfig, hooks/faster_cache.py:86-102; the attention weight it uses without
    a callback, :524-532)."""

    model_config = ConfigDict(extra="forbid")
    block_skip_range: int = Field(2, ge=2)
    timestep_skip_range: Window = (-1, 681)
    unconditional_batch_skip_range: int = Field(5, ge=1)
    unconditional_batch_timestep_skip_range: Window = (-1, 641)
    attention_weight: float = 0.5


@register
class FasterCache(HookCache):
    name = "faster-cache"
    summary = "reuse attention across steps and skip most unconditional (CFG) passes"
    Config = Config
    needs_timestep = True

    def supports(self, target):
        if target.family.cfg_mode == "separate":  # hooks/faster_cache.py splits each call's batch in two halves
            return (
                f"{target.entry.pipeline_class} runs its unconditional and conditional passes as separate calls; "
                "diffusers' FasterCache approximates the unconditional half of one batched call (it would fail at "
                "the first call)"
            )
        return super().supports(target)

    def hook_config(self, pipe, target):
        from diffusers.hooks import FasterCacheConfig

        return FasterCacheConfig(
            spatial_attention_block_skip_range=self.config.block_skip_range,
            spatial_attention_timestep_skip_range=self.config.timestep_skip_range,
            unconditional_batch_skip_range=self.config.unconditional_batch_skip_range,
            unconditional_batch_timestep_skip_range=self.config.unconditional_batch_timestep_skip_range,
            current_timestep_callback=lambda: pipe.current_timestep,
            attention_weight_callback=lambda _: self.config.attention_weight,
            tensor_format="BFCHW" if target.family.is_video else "BCHW",
            is_guidance_distilled=target.family.cfg_mode == "never",
        )
