"""torchao at load time (``--quantize torchao:TYPE``): diffusers' ``TorchAoConfig`` (transformers' for a text
encoder) with the torchao config each name stands for. diffusers 0.42.1's ``TorchAoConfig`` takes only an
``AOBaseConfig`` instance (quantizers/quantization_config.py:609-628); the names are the ones earlier diffusers took as
strings: int8wo, int4wo, float8wo, float8dq (per tensor or per row).

torchao 0.18's transforms set its recommended inductor flags process-wide as they quantize (quantization/
quant_api.py:783, :1108, :1338, ``recommended_inductor_config_setter``), at load here: the flags found before loading
are put back after the run (``restore``), as the older ``--quantize`` does after its ``quantize_``."""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import KeepsInductorFlags, Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quiet import quiet_import


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["torchao"].types] = "int8wo"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


#: the types torchao 0.18 takes only at bfloat16, and why
BFLOAT16_ONLY = {
    # quant_api.py:1237-1242: "PerRow quantization only works for bfloat16 precision input weight", asserted at load
    "float8dq-row": "quantizes per row only bfloat16 weights (torchao asserts it as it loads)",
    # Int4Tensor's linear is mslk's bf16i4bf16_rowwise (quantize_/workflows/int4/int4_tensor.py:224-230), which takes
    # bfloat16 activations; diffusers warns that its integer types support bfloat16 only (torchao_quantizer.py:221-227)
    "int4wo": "multiplies with mslk's bf16i4bf16 kernel, bfloat16 activations only",
}


@register
class TorchAo(KeepsInductorFlags, QuantizeAtLoad):
    name = "torchao"
    summary = BACKENDS["torchao"].summary
    Config = Config
    package = ("torchao", "quant")
    one_byte_types = ("int8wo", "float8wo", "float8dq-tensor", "float8dq-row")

    def cannot_run(self, target: Target) -> str | None:
        kind = self.config.type
        if kind == "int4wo" and target.device.type != "cuda":
            return f"torchao's int4 weight-only packing needs the mslk kernels, which run on CUDA, not {target.device}"
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
        if kind in BFLOAT16_ONLY and target.dtype != "bfloat16":
            return f"torchao:{kind} {BFLOAT16_ONLY[kind]}: add --dtype bfloat16"
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

    def load_configs(self, target: Target) -> dict:
        """The configs, with the inductor flags as they are before the loader quantizes (module docstring)."""
        self.keep_inductor_flags()
        return super().load_configs(target)
