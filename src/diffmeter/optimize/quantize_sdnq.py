"""SDNQ at load time (``--quantize sdnq:TYPE``): ``diffusers.SDNQConfig``, which builds the sdnq library's own
config (quantizers/quantization_config.py), for diffusers and transformers models alike. Its defaults are kept as
users get them: layers under 16384 weights stay unquantized, and on a CPU without OpenVINO it runs PyTorch's eager
kernels."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.quantized_formats import stored_tensors
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quiet import quiet_import

#: the layers whose weights SDNQ considers (the rest are norms, embeddings and biases it leaves whole)
LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


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
        """How many layers SDNQ's own rules leave whole here (``predict.quantized_formats.sdnq_tensors``: under 16384
        weights or 32 channels, its skip keys): on a tiny pipeline, all of them."""
        kept = total = 0
        for name in self.components(target):
            module = meta_module(target.entry.components[name], torch.float32)
            layers = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, LAYERS)}
            found = [t for t in stored_tensors(module, "sdnq", self.config.type, torch.float32) if t.name in layers]
            total += len(found)
            kept += sum(not t.quantized for t in found)
        if kept == total:
            return (
                f"sdnq quantizes none of the {total} linear and convolution layers here (its rules keep those under "
                "16384 weights or 32 channels whole): this run measures the unquantized pipeline"
            )
        why = "under 16384 weights or 32 channels, or its skip keys"
        return f"sdnq keeps {kept} of {total} linear and convolution layers whole ({why})" if kept else None
