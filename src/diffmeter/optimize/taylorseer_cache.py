"""TaylorSeer: compute fully every ``cache_interval`` steps and predict the steps in between
from a Taylor expansion of the block outputs."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.hook_cache import HookCache, denoiser_modules
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

    def supports(self, target):
        """Refused where diffusers' default patterns hook no module: every call would run in full."""
        from diffusers.hooks.taylorseer_cache import _TRANSFORMER_BLOCK_IDENTIFIERS  # hooks/taylorseer_cache.py:14-20

        if reason := super().supports(target):  # not a CacheMixin model, no cache context: said first
            return reason
        for name, module in denoiser_modules(target):
            names = [path for path, _ in module.named_modules()]
            if not any(re.fullmatch(p, path) for p in _TRANSFORMER_BLOCK_IDENTIFIERS for path in names):
                example = next((path for path in names if "attn" in path), "none")
                return (
                    f"diffusers' TaylorSeer patterns ({', '.join(_TRANSFORMER_BLOCK_IDENTIFIERS)}, matched whole) "
                    f"name no module of {name} (its attention is {example}): every call would run in full"
                )
        return None

    def hook_config(self, pipe, target):
        from diffusers.hooks import TaylorSeerCacheConfig

        return TaylorSeerCacheConfig(
            cache_interval=self.config.cache_interval,
            disable_cache_before_step=self.config.disable_cache_before_step,
            max_order=self.config.max_order,
        )
