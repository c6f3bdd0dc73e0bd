"""Denoiser loop iterations per generation, from the scheduler the pipeline builds, not from ``--steps``.

A pipeline's loop calls the denoiser once per entry of ``scheduler.timesteps`` (diffusers 0.42.1
pipeline_stable_diffusion.py:1032 ``for i, t in enumerate(timesteps)``, after ``retrieve_timesteps`` called
``set_timesteps(num_inference_steps)``, :149), and ``set_timesteps(n)`` need not give n timesteps: PNDMScheduler with
``skip_prk_steps`` repeats its second-to-last one (scheduling_pndm.py:213, n + 1), a Heun-style solver evaluates twice
per step but the last (scheduling_heun_discrete.py:364-367, 2n - 1).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError

#: the samplers a run may swap in (``optimize/scheduler.py``): name -> (diffusers class, config overrides, for
#: flow-matching models); each built from the pipeline's own scheduler config with the overrides
SAMPLERS = {
    "ddim": ("DDIMScheduler", {}, False),
    "dpm++2m": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}, False),
    "dpm++2m-karras": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
        False,
    ),
    "euler": ("EulerDiscreteScheduler", {}, False),
    "euler-ancestral": ("EulerAncestralDiscreteScheduler", {}, False),
    "unipc": ("UniPCMultistepScheduler", {}, False),
    "flow-euler": ("FlowMatchEulerDiscreteScheduler", {}, True),
}


def sampler_refusal(sampler: str, model: str, flow: bool) -> str | None:
    """Why ``sampler`` cannot drive ``model`` (``flow``: a flow-matching model, which takes flow-matching samplers
    only; the others none of them), or None where it can. bench's and profile's one rule."""
    if SAMPLERS[sampler][2] == flow:
        return None
    if flow:
        fitting = ", ".join(name for name, (_, _, is_flow) in SAMPLERS.items() if is_flow)
        return f"{sampler} is not a flow-matching sampler, and {model} is a flow model: use {fitting}"
    return f"{sampler} is a flow-matching sampler; {model} predicts noise, not a flow"


def scheduler_of(entry: PipelineEntry, sampler: str | None = None) -> dict[str, Any] | None:
    """The scheduler the pipeline builds, ``{"class", "config"}``: a catalog entry's shipped ``extra.scheduler``, a
    local folder's own scheduler_config.json (``catalog/local.py``), a tiny entry's runtime one; None when unknown.
    ``sampler``: the one a run swaps in instead, from the pipeline's config with its overrides (``SAMPLERS``)."""
    shipped = entry.extra.get("scheduler")
    own = shipped if isinstance(shipped, dict) else entry.extra.get("runtime", {}).get("scheduler")
    if sampler is None:
        return own
    class_name, overrides, _ = SAMPLERS[sampler]
    return {"class": class_name, "config": {**(own or {}).get("config", {}), **overrides}}


def timesteps(entry: PipelineEntry, steps: int, sampler: str | None = None) -> int:
    """The denoiser loop's iterations at ``steps``: ``len(scheduler.timesteps)`` of the pipeline's scheduler, or
    ``steps`` where the entry does not say which scheduler its pipeline builds."""
    return len(first_places(entry, steps, sampler))


def denoiser_steps(entry: PipelineEntry, spec) -> int:
    """The denoiser steps of ``spec``'s generation (a settled ``ProfileSpec``): its sampler's, else the pipeline's."""
    return timesteps(entry, spec.steps, spec.scheduler)


def first_places(entry: PipelineEntry, steps: int, sampler: str | None = None) -> list[int]:
    """Each denoiser step's timestep as its first place in ``scheduler.timesteps``: the step index DeepCache reads
    (its extension/deepcache.py:41, ``list(scheduler.timesteps).index(t)``), which a repeated timestep repeats (PNDM's
    second and third steps are both 1); ``range(steps)`` where the scheduler is unknown."""
    scheduler = scheduler_of(entry, sampler)
    if scheduler is None:
        return list(range(steps))
    values = _timesteps(scheduler["class"], json.dumps(scheduler["config"], sort_keys=True), steps)
    return [values.index(value) for value in values]


def described(entry: PipelineEntry, steps: int, sampler: str | None = None) -> str:
    """``"PNDMScheduler: 21 denoiser steps at --steps 20"``, or the scheduler alone where they agree."""
    scheduler = scheduler_of(entry, sampler)
    if scheduler is None:
        return f"unknown (the entry ships no scheduler config): {steps} denoiser steps, one per --steps"
    count = timesteps(entry, steps, sampler)
    if count == steps:
        return f"{scheduler['class']}: {count} denoiser steps"
    return (
        f"{scheduler['class']}: {count} denoiser steps at --steps {steps} (its set_timesteps({steps}) gives {count} "
        "timesteps, the pipeline calls the denoiser once per timestep)"
    )


@functools.cache
def _timesteps(class_name: str, config: str, steps: int) -> tuple[float, ...]:
    import diffusers

    settings = {key: value for key, value in json.loads(config).items() if not key.startswith("_")}
    scheduler = getattr(diffusers, class_name).from_config(settings)
    shift = {}
    if scheduler.config.get("use_dynamic_shifting"):
        # the pipelines pass a resolution-dependent mu (FluxPipeline's calculate_shift); it moves each sigma and never
        # changes their number (scheduling_flow_match_euler_discrete.py:355, time_shift elementwise), so the base shift
        # (mu at base_image_seq_len) counts the same timesteps
        # (0.5: FlowMatchEulerDiscreteScheduler's own default base_shift, for a config without one)
        shift = {"mu": scheduler.config.get("base_shift", 0.5)}
    try:
        scheduler.set_timesteps(steps, **shift)
    except ValueError as error:  # more steps than the schedule's trained timesteps (scheduling_ddim.py:349, ...)
        said = " ".join(str(error).split())
        trained = scheduler.config.get("num_train_timesteps")
        fix = f"use --steps {trained} or fewer" if trained and steps > trained else "change --steps"
        raise DiffmeterError(f"--steps {steps}: {class_name} refuses it ({said}): {fix}") from None
    return tuple(scheduler.timesteps.tolist())
