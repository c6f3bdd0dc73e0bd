"""torchao at load time (``--quantize torchao:TYPE``): diffusers' ``TorchAoConfig`` (transformers' for a text
encoder) with the torchao config each name stands for. diffusers 0.42.1's ``TorchAoConfig`` takes only an
``AOBaseConfig`` instance (quantizers/quantization_config.py:585-611); the names are the ones earlier diffusers took as
strings: int8wo, int4wo, float8wo, float8dq (per tensor or per row)."""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quiet import quiet_import


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["torchao"].types] = "int8wo"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


@register
class TorchAo(QuantizeAtLoad):
    name = "torchao"
    summary = BACKENDS["torchao"].summary
    Config = Config
    package = ("torchao", "quant")
    one_byte_types = ("int8wo", "float8wo", "float8dq-tensor", "float8dq-row")

    def cannot_run(self, target: Target) -> str | None:
        kind = self.config.type
        if kind == "int4wo" and importlib.util.find_spec("mslk") is None:
            return "torchao's int4 weight-only packing needs the mslk kernels (CUDA): pip install mslk"
        if kind.startswith("float8dq"):
            # torchao 0.18 asserts it: per tensor or per row needs CUDA with compute capability >= 8.9 (or MI300+/XPU)
            # (float8/inference.py:297-305, `_check_hardware_support`; quantization/quant_api.py:1333-1336)
            if target.device.type != "cuda":
                where = target.device.type
                return (
                    f"torchao's float8 dynamic activations need a CUDA GPU of compute capability 8.9+ (Ada, Hopper); "
                    f"this run is on {where}: use torchao:int8wo here"
                )
            if torch.cuda.is_available() and torch.cuda.get_device_capability(target.device) < (8, 9):
                return "torchao's float8 dynamic activations need compute capability 8.9 or newer (Ada, Hopper)"
        return None

    def config_for(self, target: Target, transformers: bool):
        with quiet_import():
            from torchao.quantization import (
                Float8DynamicActivationFloat8WeightConfig,
                Float8WeightOnlyConfig,
                Int4WeightOnlyConfig,
                Int8WeightOnlyConfig,
                PerRow,
                PerTensor,
            )
        made = {
            "int8wo": Int8WeightOnlyConfig,
            "int4wo": Int4WeightOnlyConfig,
            "float8wo": Float8WeightOnlyConfig,
            "float8dq-tensor": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerTensor()),
            "float8dq-row": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
        }[self.config.type]()
        if transformers:
            from transformers import TorchAoConfig
        else:
            from diffusers import TorchAoConfig
        return TorchAoConfig(quant_type=made)
