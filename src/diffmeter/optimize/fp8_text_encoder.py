"""Layerwise float8 storage for the large text encoders ("fp8 T5").

Weights are stored in float8 (e4m3) and upcast layer by layer to the compute dtype,
halving the encoder's weight memory. Uses diffusers' ``apply_layerwise_casting``.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register
from diffmeter.pipelines import FP8_SKIP_MODULES_PATTERN
from diffmeter.text_encoders import text_encoders_of


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    storage: str = "float8_e4m3fn"


@register
class FP8TextEncoder(Optimization):
    name = "fp8-text-encoder"
    kind = "precision"
    lossless = False
    summary = "store large text encoders (T5, UMT5, Gemma) in float8, compute in the run's dtype"
    Config = Config

    def encoders(self, target: Target) -> list[str]:
        return text_encoders_of(target.entry, target.family)

    def one_byte_components(self, target: Target) -> tuple[str, ...]:
        return tuple(self.encoders(target))

    def supports(self, target: Target) -> str | None:
        if not self.encoders(target):
            return "it has no large text encoder (T5/UMT5/Gemma) to store in float8"
        if not hasattr(torch, self.config.storage):
            return f"torch {torch.__version__} has no {self.config.storage}"
        return None

    def apply(self, pipe, target: Target) -> None:
        from diffusers.hooks import apply_layerwise_casting

        for name in self.encoders(target):
            encoder = getattr(pipe, name)
            apply_layerwise_casting(
                encoder,
                storage_dtype=getattr(torch, self.config.storage),
                compute_dtype=getattr(torch, target.dtype),
                skip_modules_pattern=FP8_SKIP_MODULES_PATTERN,
            )
