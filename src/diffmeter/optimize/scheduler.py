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
        new = getattr(diffusers, class_name)
        kept = {**patched_values(pipe.scheduler, new), **overrides}
        pipe.scheduler = new.from_config(pipe.scheduler.config, **kept)

    def label(self) -> str:
        return f"scheduler-{self.config.name}"


def patched_values(scheduler, new_class) -> dict:
    """The old scheduler's values its config marks as defaults (``_use_default_values``, which ``from_config``
    drops: diffusers/configuration_utils.py:491-492) but that differ from its class's defaults: set after
    loading, as StableDiffusionPipeline's ``__init__`` sets ``clip_sample=False`` and ``steps_offset=1`` on a
    config that lacks them (pipeline_stable_diffusion.py:214-239); kept where ``new_class`` takes them, so the
    swap keeps the schedule the pipeline ran."""
    import inspect

    config = dict(scheduler.config)
    defaults = {k: p.default for k, p in inspect.signature(type(scheduler).__init__).parameters.items()}
    taken = inspect.signature(new_class.__init__).parameters
    return {
        key: config[key]
        for key in config.get("_use_default_values", [])
        if key in config and key in taken and key in defaults and config[key] != defaults[key]
    }
