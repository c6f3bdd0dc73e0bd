"""The profile of the prompts a run really uses, for families whose compute depends on them."""

from __future__ import annotations

import dataclasses

from diffmeter.flops.profile import Profile, profile_spec


def profile_of_the_prompts(spec, family, pipe, workload, profile: Profile) -> tuple[Profile, str | None, object]:
    """Re-count families whose compute depends on the prompt (Kandinsky 3, Lumina, SANA's
    instruction, Qwen-Image's text) with the real token counts; the longest prompt makes its batch exact. Returns
    the profile, when re-counted the note that says so, and the ProfileSpec counted (the prediction's too)."""
    if workload.class_conditional:
        return profile, None, spec.profile_spec()
    settings = family.prompt_settings(pipe, workload.pool)
    if not settings:
        return profile, None, spec.profile_spec()
    counts = ", ".join(f"{name} {value}" for name, value in settings.items())
    note = (
        f"the stored profile counts this run's prompts with the pipeline's tokenizer ({counts}, longest prompt): "
        "exact for batches holding the longest prompt, an upper bound for the others"
    )
    counted = dataclasses.replace(spec.profile_spec(), **settings)
    return profile_spec(counted), note, counted
