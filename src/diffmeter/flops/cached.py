"""Profiles, parameter counts and guidance modes from the disk cache (``diffmeter.cache``), looked up without
importing torch or diffusers; computed answers are stored back by ``flops.profile``."""

from __future__ import annotations

from dataclasses import asdict

from diffmeter import cache
from diffmeter.catalog import ComponentEntry, PipelineEntry, entry_of
from diffmeter.flops.schema import Profile
from diffmeter.spec import ProfileSpec


def _profile_key(spec: ProfileSpec, depth: int) -> dict:
    return {"entry": entry_of(spec).model_dump(mode="json"), "spec": asdict(spec), "depth": depth}


def cached_profile(spec: ProfileSpec, depth: int = 0) -> Profile | None:
    stored = cache.load("profiles", _profile_key(spec, depth))
    return Profile.model_validate(stored) if stored is not None else None


def remember_profile(spec: ProfileSpec, depth: int, profile: Profile) -> None:
    cache.store("profiles", _profile_key(spec, depth), profile.model_dump(mode="json"))


def cached_refusal(spec: ProfileSpec) -> tuple[bool, str | None]:
    """(whether the disk cache holds the answer, why ``spec``'s pipeline refuses its settings or None)."""
    stored = cache.load("refusals", _profile_key(spec, 0))
    return stored is not None, stored["why"] if stored is not None else None


def remember_refusal(spec: ProfileSpec, why: str | None) -> None:
    cache.store("refusals", _profile_key(spec, 0), {"why": why})


def _component_key(component: ComponentEntry) -> dict:
    return {"class": component.class_name, "config": component.config}


def cached_params(component: ComponentEntry) -> int | None:
    return cache.load("params", _component_key(component))


def remember_params(component: ComponentEntry, params: int) -> None:
    cache.store("params", _component_key(component), params)


def _entry_key(entry: PipelineEntry) -> dict:
    components = {name: _component_key(component) for name, component in entry.components.items()}
    return {
        "id": entry.id,
        "family": entry.family,
        "defaults": entry.defaults.model_dump(mode="json"),
        "components": components,
    }


def cached_guidance(entry: PipelineEntry) -> str | None:
    """``families.guidance.guidance_mode`` of the entry, remembered: `models` answers without torch."""
    return cache.load("guidance", _entry_key(entry))


def remember_guidance(entry: PipelineEntry, mode: str) -> None:
    cache.store("guidance", _entry_key(entry), mode)
