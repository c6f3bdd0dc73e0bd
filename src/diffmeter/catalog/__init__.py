"""Known pipelines as data, and resolution of a MODEL argument to a PipelineEntry.

MODEL may be a catalog alias or hub id, a local diffusers directory, or a hub id
present in the local Hugging Face cache.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

from diffmeter.catalog.controlnets import CONTROLNET, with_controlnet
from diffmeter.catalog.entry import ComponentEntry, Defaults, PipelineEntry, closest_names
from diffmeter.catalog.local import entry_from_directory, hf_cache_directory
from diffmeter.errors import DiffmeterError

__all__ = ["ComponentEntry", "Defaults", "PipelineEntry", "all_entries", "entry_of", "resolve"]


@cache
def all_entries() -> tuple[PipelineEntry, ...]:
    """Every shipped entry: real pipelines first, then the tiny random ones."""
    data = resources.files("diffmeter.catalog") / "data"
    entries = []
    for folder, origin in ((data, "catalog"), (data / "tiny", "tiny")):
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            if path.name.endswith(".json"):
                raw = json.loads(path.read_text())
                entries.append(PipelineEntry.model_validate({**raw, "origin": origin}))
    return tuple(entries)


def _by_name() -> dict[str, PipelineEntry]:
    names = {}
    for entry in all_entries():
        for name in (entry.id, *entry.aliases):
            names[name.lower()] = entry
    return names


def resolve(model: str) -> PipelineEntry:
    """Turn a MODEL argument into an entry, or fail with the closest names."""
    path = Path(model).expanduser()
    if path.is_dir():
        return entry_from_directory(path, all_entries())
    names = _by_name()
    if model.lower() in names:
        return names[model.lower()]
    cached = hf_cache_directory(model)
    if cached is not None:
        return entry_from_directory(cached, all_entries(), repo_id=model)
    if model.startswith(("/", "./", "../", "~")) or (len(model) > 1 and model[1] == ":"):  # a path, not a name
        raise DiffmeterError(
            f"no such folder: {model}; point MODEL at a diffusers pipeline folder (with model_index.json), "
            "or name a catalog model or hub id"
        )
    close = closest_names(model, names)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise DiffmeterError(
        f"unknown model '{model}': not a catalog name, a local diffusers directory, "
        f"or a hub id in the local Hugging Face cache.{hint} Run `diffmeter models` for the list."
    )


def entry_of(spec) -> PipelineEntry:
    """The entry a ``ProfileSpec`` (or ``BenchSpec``) runs: its model's, with its ControlNet if it names one; the
    ControlNet call options refused in one line where it runs none."""
    entry = with_controlnet(resolve(spec.model), spec.controlnet)
    names = ("control_guidance_start", "control_guidance_end", "controlnet_conditioning_scale")
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(spec, name, None) is not None]
    if given and CONTROLNET not in entry.components:
        raise DiffmeterError(
            f"{', '.join(given)} set a ControlNet's call and {entry.name} runs none: add --controlnet NAME, or "
            "drop them"
        )
    return entry
