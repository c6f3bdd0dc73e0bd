"""Swap the scheduler for a faster sampler, keeping the pipeline's own noise schedule config.

Only samplers that fit the model are allowed: flow-matching models take flow-matching
schedulers, epsilon/v-prediction models the others. The step count is the run's --steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.families.schedule import SAMPLERS as SCHEDULERS
from diffmeter.families.schedule import sampler_refusal
from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["ddim", "dpm++2m", "dpm++2m-karras", "euler", "euler-ancestral", "unipc", "flow-euler"]


@register
class Scheduler(Optimization):
    name = "scheduler"
    kind = "scheduler"
    lossless = False
    exclusive = True
    summary = f"another sampler: {', '.join(SCHEDULERS)}"
    Config = Config

    def supports(self, target: Target) -> str | None:
        return sampler_refusal(self.config.name, target.entry.name, target.is_flow)

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(Config(name=name)) for name in SCHEDULERS]

    def apply(self, pipe, target: Target) -> None:
        import diffusers

        class_name, overrides, _ = SCHEDULERS[self.config.name]
        pipe.scheduler = getattr(diffusers, class_name).from_config(pipe.scheduler.config, **overrides)

    def label(self) -> str:
        return f"scheduler-{self.config.name}"
