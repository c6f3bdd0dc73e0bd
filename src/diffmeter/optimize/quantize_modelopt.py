"""NVIDIA ModelOpt at load time (``--quantize modelopt:TYPE``): diffusers' ``NVIDIAModelOptConfig(quant_type=TYPE)``
(weight-only, its default) given to ``from_pretrained``, which calibrates and compresses each layer as it loads
(quantizers/modelopt/modelopt_quantizer.py:81-110). transformers has no ModelOpt config: diffusers models only.

No device runs it with diffusers 0.42.1:

* its config spreads ``mtq.config._default_disabled_quantizer_cfg`` as a dict (quantization_config.py:857), a list
  from nvidia-modelopt 0.44.0 on ("'list' object is not a mapping"): 0.43 is the last it builds with;
* with nvidia-modelopt 0.43.0, diffusers calls ``mtq.compress(module)`` on each linear layer alone
  (modelopt_quantizer.py:107), and compress converts only a module's children to ``RealQuantLinear``
  (modelopt/torch/quantization/conversion.py:202-211, called from compress.py:84-86): the layer stays a
  ``QuantLinear`` whose weight quantizer, made real (``fake_quant`` False), returns an ``FP8QTensor``/``INT8QTensor``
  that ``F.linear`` refuses at the first forward (quant_module.py:233-240, torch/nn/modules/linear.py:134). Nothing of
  it depends on the device; run here with 0.43.0 on a tiny FluxTransformer2DModel, weight-only or not: "linear():
  argument 'weight' (position 2) must be Tensor, not FP8QTensor". (With a ``RealQuantLinear`` the CUDA GEMMs would
  still need the input quantizer the weight-only config disables: backends/gemm_registry.py:115-125.)"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS


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
        instead = "torchao:float8dq-row or bnb:nf4" if target.device.type == "cuda" else "quanto:int8 or torchao:int8wo"
        return (
            "diffusers 0.42.1 compresses each layer alone with nvidia-modelopt (mtq.compress(module)), which "
            "leaves it unconverted: its first forward hands F.linear the quantized tensor on any device "
            f"(quantize_modelopt.py); use {instead}"
        )

    def supports(self, target: Target) -> str | None:
        made_by_transformers = [
            n for n in self.components(target) if n in target.entry.components and self.is_transformers(target, n)
        ]
        if made_by_transformers:
            return (
                f"modelopt quantizes diffusers models only; {', '.join(made_by_transformers)} is a transformers model"
            )
        return self.cannot_run(target)
