"""optimum-quanto at load time (``--quantize quanto:TYPE``): diffusers' ``QuantoConfig`` (transformers' for a text
encoder), int8, int4 or float8 weights; runs on the CPU (quanto's own kernels, or dequantized matmuls)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.quantized_formats import stored_tensors
from diffmeter.predict.quantized_layouts import quanto_group
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quiet import quiet_import

#: torch's CPU packing of a weight for tinygemm takes output rows in multiples of this
#: (``_convert_weight_to_int4pack_cpu``: "expect N to be dividable by 16")
TINYGEMM_CPU_ROWS = 16


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

    def cannot_run(self, target: Target) -> str | None:
        """int4 at bfloat16, on any device: diffusers quantizes each layer as it loads it, on the CPU without a
        ``device_map`` (quantizers/quanto/quanto_quantizer.py:115-116; models/model_loading_utils.py:141-142), where
        quanto packs each 2-D weight in groups of 128 for tinygemm (optimum/quanto/tensor/weights/qbits.py:111-121,
        whatever its shape), which torch packs on a CPU only for output rows in multiples of ``TINYGEMM_CPU_ROWS``
        (tinygemm/packed.py:55-56): a layer with others would end the load in a traceback, a CUDA run's too."""
        if self.config.type != "int4" or target.dtype != "bfloat16":
            return None
        for name in self.components(target):
            module = meta_module(target.entry.components[name], torch.bfloat16)
            quantized = {t.name for t in stored_tensors(module, "quanto", "int4", torch.bfloat16) if t.quantized}
            for layer, linear in module.named_modules():
                packed = isinstance(linear, torch.nn.Linear) and quanto_group(linear.in_features) == 128
                if packed and f"{layer}.weight" in quantized and linear.out_features % TINYGEMM_CPU_ROWS:
                    return (
                        f"quanto int4 at bfloat16 packs weights for tinygemm as diffusers loads them, on the CPU, "
                        f"which takes only output rows in multiples of {TINYGEMM_CPU_ROWS}: {name}.{layer} has "
                        f"{linear.out_features}; run --dtype float32 (quanto's unpacked int4), or quanto:int8"
                    )
        return None
