"""First-Block-Cache: run the first transformer block; when its residual changed less than
``threshold`` since the last full step, reuse the cached output of the remaining blocks."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.hook_cache import HookCache
from diffmeter.optimize.registry import register
from diffmeter.predict.cache_threshold import DEFAULT_THRESHOLD


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: relative change of the first block's residual below which the rest is skipped; diffusers' own default
    threshold: float = Field(DEFAULT_THRESHOLD["first-block-cache"], gt=0)


@register
class FirstBlockCache(HookCache):
    name = "first-block-cache"
    summary = "skip all blocks after the first while the first block's output barely changes"
    Config = Config
    needs_context = True
    needs_registered_blocks = True

    def hook_config(self, pipe, target):
        from diffusers.hooks import FirstBlockCacheConfig

        return FirstBlockCacheConfig(threshold=self.config.threshold)
