"""Pyramid Attention Broadcast: within a timestep window, recompute spatial attention only
every ``block_skip_range`` steps and broadcast the cached output in between."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.hook_cache import HookCache, Window
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_skip_range: int = Field(2, ge=2)
    timestep_skip_range: Window = (100, 800)


@register
class PyramidAttentionBroadcast(HookCache):
    name = "pab"
    summary = "reuse spatial attention outputs across steps inside a timestep window"
    Config = Config
    needs_timestep = True

    def hook_config(self, pipe, target):
        from diffusers.hooks import PyramidAttentionBroadcastConfig

        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=self.config.block_skip_range,
            spatial_attention_timestep_skip_range=self.config.timestep_skip_range,
            current_timestep_callback=lambda: pipe.current_timestep,
        )
