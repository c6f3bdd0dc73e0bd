"""Memory predictions and operator counts from the disk cache (``diffmeter.cache``), looked up without importing
torch or diffusers; computed answers are stored back by ``memory`` and ``operators``."""

from __future__ import annotations

from dataclasses import asdict

from diffmeter import cache
from diffmeter.catalog import entry_of
from diffmeter.predict.schema import MemoryPrediction, OperatorWork
from diffmeter.predict.vae_decode import VAE_MODES
from diffmeter.spec import ProfileSpec


def cache_key(spec: ProfileSpec, on_cuda: bool = True, vae_modes: tuple[str, ...] = VAE_MODES) -> dict:
    """What a prediction for ``spec`` depends on: the entry's configs, the settings, the device kind and the
    decode modes asked for."""
    entry = entry_of(spec).model_dump(mode="json")
    return {"entry": entry, "spec": asdict(spec), "on_cuda": on_cuda, "vae_modes": sorted(vae_modes)}


def cached_memory(
    spec: ProfileSpec, on_cuda: bool = True, vae_modes: tuple[str, ...] = VAE_MODES
) -> MemoryPrediction | None:
    """The prediction for this exact question from the disk cache, or None."""
    stored = cache.load("memory", cache_key(spec, on_cuda, vae_modes))
    return MemoryPrediction.model_validate(stored) if stored is not None else None


def work_key(spec: ProfileSpec, decode_modes: tuple[str, ...] = ()) -> dict:
    """What an operator count depends on: the prediction's key, and the decode modes it was counted under."""
    return {**cache_key(spec), "decode_modes": sorted(decode_modes)} if decode_modes else cache_key(spec)


def cached_work(spec: ProfileSpec, decode_modes: tuple[str, ...] = ()) -> OperatorWork | None:
    """``operators.operator_work``'s answer from the disk cache, or None."""
    stored = cache.load("operators", work_key(spec, decode_modes))
    return OperatorWork.model_validate(stored) if stored is not None else None


def cached_memory_and_work(
    spec: ProfileSpec, on_cuda: bool = True, vae_modes: tuple[str, ...] = VAE_MODES
) -> tuple[MemoryPrediction, OperatorWork] | None:
    """``operators.predict_memory_and_work``'s answer when both halves are in the disk cache, else None."""
    memory, work = cached_memory(spec, on_cuda, vae_modes), cached_work(spec)
    return (memory, work) if memory is not None and work is not None else None
