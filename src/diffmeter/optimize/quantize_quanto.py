"""optimum-quanto at load time (``--quantize quanto:TYPE``): diffusers' ``QuantoConfig`` (transformers' for a text
encoder), int8, int4 or float8 weights; runs on the CPU (quanto's own kernels, or dequantized matmuls)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quiet import quiet_import


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["quanto"].types] = "int8"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


@register
class Quanto(QuantizeAtLoad):
    name = "quanto"
    summary = BACKENDS["quanto"].summary
    Config = Config
    package = ("optimum.quanto", "quanto")
    one_byte_types = ("int8", "float8")

    def config_for(self, target: Target, transformers: bool):
        if transformers:
            from transformers import QuantoConfig

            return QuantoConfig(weights=self.config.type)
        with quiet_import():  # diffusers' QuantoConfig warns it is deprecated, at every call
            from diffusers import QuantoConfig

            return QuantoConfig(weights_dtype=self.config.type)
