"""TaylorSeer: compute fully every ``cache_interval`` steps and predict the steps in between
from a Taylor expansion of the block outputs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.hook_cache import HookCache
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_interval: int = Field(5, ge=2)
    disable_cache_before_step: int = Field(3, ge=0)
    max_order: int = Field(1, ge=1)


@register
class TaylorSeerCache(HookCache):
    name = "taylorseer"
    summary = "predict block outputs between full steps with a Taylor expansion"
    Config = Config
    needs_context = True

    def hook_config(self, pipe, target):
        from diffusers.hooks import TaylorSeerCacheConfig

        return TaylorSeerCacheConfig(
            cache_interval=self.config.cache_interval,
            disable_cache_before_step=self.config.disable_cache_before_step,
            max_order=self.config.max_order,
        )
