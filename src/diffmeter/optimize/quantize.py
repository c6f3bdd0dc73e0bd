"""Weight-only quantization with torchao: int8 (any device) or float8 (GPUs with FP8 tensor
cores, compute capability 8.9+), for the denoiser or named components."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import KeepsInductorFlags, Optimization, Target, unknown_components
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import DENOISER
from diffmeter.quiet import quiet_import


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weights: Literal["int8", "fp8"] = "int8"
    #: components to quantize; empty means the denoiser
    components: list[str] = []


@register
class Quantize(KeepsInductorFlags, Optimization):
    name = "quantize"
    kind = "quantization"
    lossless = False
    exclusive = True
    summary = "torchao weight-only quantization: int8 or fp8 weights, dequantized in the matmul"
    Config = Config
    package = ("torchao", "quant")

    def components(self, target: Target) -> list[str]:
        denoisers = list(target.family.denoisers(target.entry))
        names = self.config.components or [DENOISER]  # --quantize int8 beside NAME=int8 names "denoiser"
        return list(dict.fromkeys(n for name in names for n in (denoisers if name == DENOISER else [name])))

    def supports(self, target: Target) -> str | None:
        if reason := unknown_components(target, self.components(target)):
            return reason
        if self.config.weights == "fp8":
            if target.device.type != "cuda":
                return f"fp8 weights need a GPU with FP8 tensor cores; this run is on {target.device.type}"
            if torch.cuda.is_available() and torch.cuda.get_device_capability(target.device) < (8, 9):
                return "fp8 weights need compute capability 8.9 or newer (Ada, Hopper)"
        return None

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(Config(weights=weights)) for weights in ("int8", "fp8")]

    def one_byte_components(self, target: Target) -> tuple[str, ...]:
        return tuple(self.components(target))

    def quantized_components(self, target: Target) -> tuple[str, ...]:
        return tuple(self.components(target))

    def holds_back(self, target: Target) -> tuple[str, ...]:
        return tuple(self.components(target)) if target.device.type == "cuda" else ()

    def apply(self, pipe, target: Target) -> None:
        with quiet_import():
            from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

        self.keep_inductor_flags()  # torchao sets its recommended inductor flags globally
        config = Int8WeightOnlyConfig() if self.config.weights == "int8" else Float8WeightOnlyConfig()
        for name in self.components(target):
            module = getattr(pipe, name)
            if name in target.held:  # on the CPU: each linear layer moved to the GPU, then quantized there
                quantize_(module, config, device=target.device)  # torchao's quantize_(device=...)
                module.to(target.device)  # what quantize_ does not touch: norms, embeddings, convolutions
            else:
                quantize_(module, config)

    def label(self) -> str:
        return f"quantize-{self.config.weights}"
