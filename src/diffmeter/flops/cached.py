"""Profiles and parameter counts from the disk cache (``diffmeter.cache``), looked up without
importing torch or diffusers; computed answers are stored back by ``flops.profile``."""

from __future__ import annotations

from dataclasses import asdict

from diffmeter import cache
from diffmeter.catalog import ComponentEntry, entry_of
from diffmeter.flops.schema import Profile
from diffmeter.spec import ProfileSpec


def _profile_key(spec: ProfileSpec, depth: int) -> dict:
    return {"entry": entry_of(spec).model_dump(mode="json"), "spec": asdict(spec), "depth": depth}


def cached_profile(spec: ProfileSpec, depth: int = 0) -> Profile | None:
    stored = cache.load("profiles", _profile_key(spec, depth))
    return Profile.model_validate(stored) if stored is not None else None


def remember_profile(spec: ProfileSpec, depth: int, profile: Profile) -> None:
    cache.store("profiles", _profile_key(spec, depth), profile.model_dump(mode="json"))


def _component_key(component: ComponentEntry) -> dict:
    return {"class": component.class_name, "config": component.config}


def cached_params(component: ComponentEntry) -> int | None:
    return cache.load("params", _component_key(component))


def remember_params(component: ComponentEntry, params: int) -> None:
    cache.store("params", _component_key(component), params)
