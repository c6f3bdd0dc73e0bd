"""torch.compile: mode, fullgraph, which components, whole-model or regional, the seed's
inductor flags, channels_last. Compilation happens in the first (cold) call, which the
run reports apart from the steady state."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register

#: the inductor settings the seed applies for diffusion models
SEED_INDUCTOR_FLAGS = {
    "conv_1x1_as_mm": True,
    "coordinate_descent_tuning": True,
    "epilogue_fusion": False,
    "coordinate_descent_check_all_directions": True,
}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    fullgraph: bool = False
    #: pipeline components to compile; empty means the denoiser
    components: list[str] = []
    #: compile only the repeated blocks (diffusers' compile_repeated_blocks): much faster to compile
    regional: bool = False
    inductor_flags: bool = False
    channels_last: bool = False
    backend: str = "inductor"


@register
class Compile(Optimization):
    name = "compile"
    kind = "compile"
    lossless = True
    exclusive = True
    summary = "torch.compile the denoiser (or named components), whole or regionally"
    Config = Config

    def components(self, target: Target) -> list[str]:
        return self.config.components or [target.family.denoiser]

    def supports(self, target: Target) -> str | None:
        unknown = [name for name in self.components(target) if name not in target.entry.components]
        if unknown:
            return f"it has no component {', '.join(unknown)} (it has {', '.join(target.entry.components)})"
        if self.config.regional and not getattr(target.denoiser_class, "_repeated_blocks", None):
            return f"{target.denoiser_class.__name__} declares no repeated blocks for regional compilation"
        if self.config.mode == "reduce-overhead" and target.device.type != "cuda":
            return "reduce-overhead uses CUDA graphs; this run is on " + target.device.type
        return None

    def apply(self, pipe, target: Target) -> None:
        if self.config.inductor_flags:
            import torch._inductor.config as inductor

            for flag, value in SEED_INDUCTOR_FLAGS.items():
                setattr(inductor, flag, value)
        options = {"mode": self.config.mode, "fullgraph": self.config.fullgraph, "backend": self.config.backend}
        if self.config.backend != "inductor":
            options.pop("mode")
        for name in self.components(target):
            module = getattr(pipe, name)
            if self.config.channels_last:
                module.to(memory_format=torch.channels_last)
            if self.config.regional:
                module.compile_repeated_blocks(**options)
            else:
                # a wrapper, so hooks on pipe.<name> (stage timing) stay outside the graph
                setattr(pipe, name, torch.compile(module, **options))
