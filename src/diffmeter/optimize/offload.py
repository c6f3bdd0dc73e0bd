"""Keep weights on the CPU and bring them to the GPU when needed: whole models
(``model``), layer by layer (``sequential``) or in groups with stream prefetch (``group``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["model", "sequential", "group"] = "model"


@register
class Offload(Optimization):
    name = "offload"
    kind = "memory"
    lossless = True
    exclusive = True
    places_pipeline = True
    summary = "CPU offload: model (whole components), sequential (per layer) or group (prefetched)"
    Config = Config

    def supports(self, target: Target) -> str | None:
        if target.device.type != "cuda":
            return f"offloading moves weights between the CPU and a GPU; this run is on {target.device.type}"
        return None

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(Config(mode=mode)) for mode in ("model", "sequential", "group")]

    def apply(self, pipe, target: Target) -> None:
        if self.config.mode == "model":
            pipe.enable_model_cpu_offload(device=target.device)
        elif self.config.mode == "sequential":
            pipe.enable_sequential_cpu_offload(device=target.device)
        else:
            pipe.enable_group_offload(
                onload_device=target.device, offload_device="cpu", offload_type="leaf_level", use_stream=True
            )

    def label(self) -> str:
        return f"offload-{self.config.mode}"
