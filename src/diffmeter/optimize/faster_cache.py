"""FasterCache: reuse attention outputs across steps, and (for guided models) approximate
the unconditional branch from the conditional one on most steps."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.hook_cache import HookCache
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_skip_range: int = Field(2, ge=2)
    timestep_skip_range: tuple[int, int] = (-1, 681)
    unconditional_batch_skip_range: int = Field(5, ge=1)
    unconditional_batch_timestep_skip_range: tuple[int, int] = (-1, 781)
    attention_weight: float = 0.3


@register
class FasterCache(HookCache):
    name = "faster-cache"
    summary = "reuse attention across steps and skip most unconditional (CFG) passes"
    Config = Config
    needs_timestep = True

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
