"""NVIDIA ModelOpt at load time (``--quantize modelopt:TYPE``): diffusers' ``NVIDIAModelOptConfig(quant_type=TYPE)``
(weight-only, its default) given to ``from_pretrained``, which calibrates and compresses each layer as it loads
(quantizers/modelopt/modelopt_quantizer.py:81-108). A folder saved quantized carries the same config in its
config.json and loads as it is. transformers has no ModelOpt config: diffusers models only.

diffusers 0.42.1 asks only for the package (modelopt_quantizer.py:40-44) and checks no device, but:

* its config spreads ``mtq.config._default_disabled_quantizer_cfg`` as a dict (quantization_config.py:849-858), a
  list from nvidia-modelopt 0.44.0 on ("'list' object is not a mapping"): 0.43 is the last it builds with;
* nvidia-modelopt 0.43 multiplies the compressed weights only with its CUDA GEMMs, fp8 per tensor on compute
  capability 8.9+ and nvfp4 on 10.0+ (torch/quantization/backends/fp8_per_tensor_gemm.py:107, nvfp4_gemm.py:205,
  utils.py:23-28); elsewhere its fallback hands ``F.linear`` the compressed tensor (nn/modules/quant_linear.py:239),
  which fails: run here on this CPU with 0.43.0, fp8 and int8 loaded and their first forward raised "linear():
  argument 'weight' must be Tensor, not FP8QTensor" (INT8QTensor)."""

from __future__ import annotations

import importlib.metadata
from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quiet import quiet_import

#: the first nvidia-modelopt whose disabled-quantizer table diffusers 0.42.1 cannot spread (module docstring)
TOO_NEW = (0, 44)


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["modelopt"].types] = "fp8"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


@register
class ModelOpt(QuantizeAtLoad):
    name = "modelopt"
    summary = BACKENDS["modelopt"].summary
    Config = Config
    package = ("modelopt", "modelopt")
    one_byte_types = BACKENDS["modelopt"].types

    def cannot_run(self, target: Target) -> str | None:
        if target.device.type != "cuda":
            return (
                f"nvidia-modelopt multiplies its compressed weights only with CUDA GEMMs (its fallback fails on "
                f"{target.device.type}): run on --device cuda"
            )
        import torch

        capability = torch.cuda.get_device_capability(target.device)
        need = {"fp8": (8, 9), "nvfp4": (10, 0)}.get(self.config.type)
        if need and capability < need:
            return (
                f"nvidia-modelopt's {self.config.type} GEMM needs compute capability {need[0]}.{need[1]}+, this is "
                f"{capability[0]}.{capability[1]}"
            )
        return None

    def supports(self, target: Target) -> str | None:
        made_by_transformers = [
            n for n in self.components(target) if n in target.entry.components and self.is_transformers(target, n)
        ]
        if made_by_transformers:
            return (
                f"modelopt quantizes diffusers models only; {', '.join(made_by_transformers)} is a transformers model"
            )
        reason = self.cannot_run(target)
        if reason is None and not self.missing_package():
            version = importlib.metadata.version("nvidia-modelopt")
            if tuple(int(part) for part in version.split(".")[:2]) >= TOO_NEW:
                pin = "pip install 'nvidia-modelopt<0.44'"
                return f"diffusers 0.42.1 builds no ModelOpt config with nvidia-modelopt {version}: {pin}"
        return reason or super().supports(target)

    def config_for(self, target: Target, transformers: bool):
        with quiet_import():
            from diffusers import NVIDIAModelOptConfig

            return NVIDIAModelOptConfig(quant_type=self.config.type.upper())
