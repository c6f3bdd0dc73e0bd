"""SDNQ at load time (``--quantize sdnq:TYPE``): ``diffusers.SDNQConfig``, which builds the sdnq library's own
config (quantizers/quantization_config.py), for diffusers and transformers models alike. Its defaults are kept as
users get them: layers under 16384 weights stay unquantized, and on a CPU without OpenVINO it runs PyTorch's eager
kernels."""

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
    type: Literal[BACKENDS["sdnq"].types] = "int8"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


@register
class Sdnq(QuantizeAtLoad):
    name = "sdnq"
    summary = BACKENDS["sdnq"].summary
    Config = Config
    package = ("sdnq", "sdnq")
    one_byte_types = ("int8", "uint8", "float8_e4m3fn", "float8_e5m2")

    def config_for(self, target: Target, transformers: bool):
        with quiet_import():
            from diffusers import SDNQConfig

            return SDNQConfig(weights_dtype=self.config.type)

    def note(self, target: Target) -> str | None:
        return "sdnq keeps layers under 16384 weights unquantized (its default; most layers of a tiny pipeline)"
