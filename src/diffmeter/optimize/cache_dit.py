"""cache-dit's DBCache: compute the first ``fn`` and last ``bn`` blocks every step, and the
middle only when the residual changed more than ``threshold`` (the ``cache-dit`` package)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register
from diffmeter.predict.cache_threshold import DEFAULT_THRESHOLD
from diffmeter.quiet import quiet_import


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fn: int = Field(8, ge=1)
    bn: int = Field(0, ge=0)
    threshold: float = Field(DEFAULT_THRESHOLD["cache-dit"], gt=0)
    warmup_steps: int = Field(8, ge=0)


@register
class CacheDiT(Optimization):
    name = "cache-dit"
    kind = "cache"
    lossless = False
    exclusive = True
    summary = "cache-dit DBCache: dual-block residual caching for DiT pipelines"
    Config = Config
    package = ("cache_dit", "cache-dit")
    package_decides_support = True

    def supports(self, target: Target) -> str | None:
        with quiet_import():
            from cache_dit import BlockAdapterRegister

        probe = type(target.entry.pipeline_class, (), {})()  # the registry matches class names
        if not BlockAdapterRegister.is_supported(probe):
            return f"cache-dit has no block adapter for {target.entry.pipeline_class}"
        blocks = target.entry.components[target.family.denoiser].config.get("num_layers")
        if blocks is not None and self.config.fn + self.config.bn >= blocks:
            return (
                f"fn={self.config.fn} + bn={self.config.bn} always-computed blocks leave none to cache in its "
                f"{blocks} transformer blocks; lower fn"
            )
        return None

    def apply(self, pipe, target: Target) -> None:
        with quiet_import():
            import cache_dit
            from cache_dit import DBCacheConfig

        with quiet_import():  # cache-dit reports its adapter choice on stdout
            cache_dit.enable_cache(
                pipe,
                cache_config=DBCacheConfig(
                    Fn_compute_blocks=self.config.fn,
                    Bn_compute_blocks=self.config.bn,
                    residual_diff_threshold=self.config.threshold,
                    max_warmup_steps=self.config.warmup_steps,
                    num_inference_steps=target.steps,
                ),
            )

    def restore(self, pipe, target: Target) -> None:
        """cache-dit patches the pipeline *class*'s ``__call__``: every later pipeline of that class
        in this process would be cached too."""
        with quiet_import():
            import cache_dit

            cache_dit.disable_cache(pipe)
