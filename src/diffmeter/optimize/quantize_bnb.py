"""bitsandbytes at load time (``--quantize bnb:TYPE``): diffusers' ``BitsAndBytesConfig`` (transformers' for a text
encoder): NF4 or FP4 4-bit weights (bfloat16-free compute at the run's dtype), or LLM.int8().

bitsandbytes 0.49+ has CPU kernels, but diffusers 0.42.1 refuses to quantize with it without a GPU
(quantizers/bitsandbytes/bnb_quantizer.py:63-65, ``validate_environment``: "No GPU found"), so a CPU run is
refused."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["bnb"].types] = "nf4"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


@register
class BitsAndBytes(QuantizeAtLoad):
    name = "bnb"
    summary = BACKENDS["bnb"].summary
    Config = Config
    package = ("bitsandbytes", "bnb")
    one_byte_types = ("int8", "nf4", "fp4")

    def cannot_run(self, target: Target) -> str | None:
        if target.device.type != "cuda":
            return (
                f"diffusers quantizes with bitsandbytes only on a GPU (its BnB quantizer finds none on "
                f"{target.device.type}); run on CUDA"
            )
        return None

    def config_for(self, target: Target, transformers: bool):
        if transformers:
            from transformers import BitsAndBytesConfig
        else:
            from diffusers import BitsAndBytesConfig
        if self.config.type == "int8":
            return BitsAndBytesConfig(load_in_8bit=True)
        compute = getattr(torch, target.dtype)
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=self.config.type, bnb_4bit_compute_dtype=compute
        )
