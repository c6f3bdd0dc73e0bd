"""DeepCache for UNets: run the full UNet every ``cache_interval`` steps and only the
shallow branch ``cache_branch_id`` in between (the ``DeepCache`` package)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_interval: int = Field(3, ge=2)
    cache_branch_id: int = Field(0, ge=0)


@register
class DeepCache(Optimization):
    name = "deep-cache"
    kind = "cache"
    lossless = False
    exclusive = True
    summary = "UNets: reuse deep features, recompute only the shallow branch between full steps"
    Config = Config
    package = ("DeepCache", "deepcache")

    def supports(self, target: Target) -> str | None:
        if target.entry.family not in ("sd", "sdxl"):
            return "DeepCache caches Stable Diffusion UNet branches; this model has no such UNet"
        return None

    def apply(self, pipe, target: Target) -> None:
        from DeepCache import DeepCacheSDHelper

        self.helper = DeepCacheSDHelper(pipe=pipe)
        self.helper.set_params(cache_interval=self.config.cache_interval, cache_branch_id=self.config.cache_branch_id)
        self.helper.enable()

    def restore(self, pipe, target: Target) -> None:
        if hasattr(self, "helper"):
            self.helper.disable()
            del self.helper  # it holds the pipeline: a following run in this process would find its memory taken
