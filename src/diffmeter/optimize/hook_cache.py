"""The shared part of the caches diffusers ships as hooks (First-Block-Cache, PAB,
FasterCache, TaylorSeer, MagCache, SeaCache): they attach to denoisers built on ``CacheMixin``."""

from __future__ import annotations

from diffmeter.optimize.base import Optimization, Target, denoisers


class HookCache(Optimization):
    """Subclasses set ``hook_config(pipe, target)``; ``needs_timestep`` for timestep-gated caches."""

    kind = "cache"
    lossless = False
    exclusive = True
    needs_timestep = False

    def supports(self, target: Target) -> str | None:
        from diffusers.models.cache_utils import CacheMixin

        if not issubclass(target.denoiser_class, CacheMixin):
            return f"{target.denoiser_class.__name__} has no diffusers cache hooks (it is not a CacheMixin model)"
        if self.needs_timestep and not hasattr(target.pipeline_class, "current_timestep"):
            return f"{target.entry.pipeline_class} does not expose current_timestep, which {self.name} is gated on"
        return None

    def hook_config(self, pipe, target: Target):
        raise NotImplementedError

    def apply(self, pipe, target: Target) -> None:
        for module in denoisers(pipe, target):
            module.enable_cache(self.hook_config(pipe, target))
