"""Black Forest Labs' pre-quantized single files (``--quantize bfl:TYPE --weights FILE.safetensors``): the model
class's ``from_single_file`` with ``BFLQuantizationConfig(compute_dtype=<the run's dtype>)``, the only way diffusers
0.42.1 reads them (quantization_config.py: "quantizing a model on the fly is not supported"; ``from_pretrained`` gives
the quantizer no state dict to find the layers by, bfl_quantizer.py:132-134). A linear layer is quantized when its
weight comes with a ``weight_scale``; nvfp4 when a ``weight_scale_2`` comes too (bfl_quantizer.py:63-85).

It runs on a CPU: diffusers needs only accelerate (bfl_quantizer.py:49-53) and dequantizes the weight to the compute
dtype in each forward where no fused kernel runs (bfl/utils.py:192-193, :240-241): fp8 GEMMs through
``torch._scaled_mm`` on CUDA 8.9+ (:175-190), nvfp4 through FlashInfer on Blackwell (:218-238)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.predict.prequantized_formats import bfl_file_types
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quantized_loading import SingleFile


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["bfl"].types] = "fp8"
    #: the .safetensors file (--weights FILE)
    file: str | None = None
    #: the component the file holds; empty means the denoiser
    components: list[str] = []


def file_type(path: Path) -> str | None:
    """fp8 or nvfp4 by the scales a safetensors file holds, as diffusers tells them (bfl_quantizer.py:64-71); None:
    no ``weight_scale``."""
    types = set(bfl_file_types(path).values())
    return ("nvfp4" if "nvfp4" in types else "fp8") if types else None


@register
class Bfl(QuantizeAtLoad):
    name = "bfl"
    summary = BACKENDS["bfl"].summary
    Config = Config
    package = ("accelerate", "bfl")
    one_byte_types = BACKENDS["bfl"].types
    single_file = True

    def supports(self, target: Target) -> str | None:
        return self.file_refusal(target) or super().supports(target)

    def file_refusal(self, target: Target) -> str | None:
        """Why the file cannot be this run's: none given, missing, not safetensors, unscaled, another type."""
        if self.config.file is None:
            return "bfl reads a pre-quantized single file: add --weights FILE.safetensors"
        path = Path(self.config.file).expanduser()
        if not path.is_file():
            return f"no BFL file {path}"
        if len(self.components(target)) != 1:
            return "a BFL file holds one component's weights: name one (NAME=bfl:TYPE)"
        try:
            found = file_type(path)
        except Exception as error:  # safetensors raises its own SafetensorError on a file of another format
            return f"{path} is not a safetensors file ({' '.join(str(error).split())[:120]})"
        if found is None:
            return f"{path.name} has no weight_scale tensors: it is no BFL fp8 or nvfp4 file"
        if found != self.config.type:
            return f"{path.name} holds BFL {found} weights, not {self.config.type}: say --quantize bfl:{found}"
        return None

    def config_for(self, target: Target, transformers: bool):
        from diffusers import BFLQuantizationConfig

        return SingleFile(Path(self.config.file).expanduser(), BFLQuantizationConfig(getattr(torch, target.dtype)))

    def label(self) -> str:
        return f"{super().label()}-{Path(self.config.file or 'none').stem}"
