"""Tiny random-weight pipelines, built offline: real diffusers pipeline classes, real
schedulers, and small real tokenizers made from an in-memory vocabulary.

Tokenizer builders live in ``tokenizers.py``; every other module of this package is imported
too, so a family that needs its own kind of tokenizer adds one file here."""

from __future__ import annotations

import importlib
import pkgutil

import diffusers
import torch

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError
from diffmeter.pipelines import build_component
from diffmeter.tiny.tokenizers import TOKENIZERS

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["TOKENIZERS", "assemble", "tiny_pipeline"]


def tiny_pipeline(entry: PipelineEntry, device: str = "cpu", seed: int = 0) -> diffusers.DiffusionPipeline:
    """The real diffusers pipeline of a tiny catalog entry, with seeded random weights."""
    if not entry.is_tiny:
        raise DiffmeterError(f"'{entry.name}' is not a tiny random entry; pick one of the tiny-* models")
    torch.manual_seed(seed)
    parts = {name: build_component(component, device) for name, component in entry.components.items()}
    return assemble(entry.pipeline_class, parts, entry.extra["runtime"], entry.extra.get("pipeline_init", {}))


def assemble(
    pipeline_class_name: str, parts: dict, runtime: dict, init: dict | None = None
) -> diffusers.DiffusionPipeline:
    """A pipeline from built components plus a runtime (offline tokenizers, a scheduler config)
    and ``init``: the pipeline's other ``__init__`` arguments as its model_index.json holds them,
    plain values (Wan 2.2's ``boundary_ratio``) or ``{"class", "config"}`` of diffusers config
    objects (HunyuanImage's guiders) or transformers image processors (Wan 2.1 I2V's)."""
    parts = dict(parts)
    for name, kind in runtime["tokenizers"].items():
        parts[name] = TOKENIZERS[kind]()
    scheduler = runtime["scheduler"]
    parts["scheduler"] = getattr(diffusers, scheduler["class"]).from_config(scheduler["config"])
    for name, value in (init or {}).items():
        parts[name] = configured(value) if isinstance(value, dict) and "class" in value else value
    pipeline_class = getattr(diffusers, pipeline_class_name)
    expected, optional = pipeline_class._get_signature_keys(pipeline_class)
    expected = set(expected)
    parts.update({name: None for name in expected - set(parts)})
    accepted = expected | set(optional)  # optional: plain __init__ arguments such as boundary_ratio
    pipeline = pipeline_class(**{name: part for name, part in parts.items() if name in accepted})
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def configured(value: dict):
    """A diffusers config object (``from_config``) or a transformers image processor (``from_dict``), from its
    class name and config."""
    import transformers

    if hasattr(diffusers, value["class"]):
        return getattr(diffusers, value["class"]).from_config(value["config"])
    return getattr(transformers, value["class"]).from_dict(value["config"])
