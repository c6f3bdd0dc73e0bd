"""Pick PyTorch's scaled-dot-product-attention kernel (flash, memory-efficient, cuDNN, math)
for every call, for models that call SDPA directly (UNets, SD3, PixArt, SANA, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register

KERNELS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernel: Literal["flash", "efficient", "cudnn", "math"] = "flash"


@register
class SDPAKernel(Optimization):
    name = "sdpa-kernel"
    kind = "attention"
    lossless = True
    exclusive = True
    summary = "restrict torch SDPA to one kernel (flash, efficient, cudnn, math) during each call"
    Config = Config

    def supports(self, target: Target) -> str | None:
        if self.config.kernel in ("flash", "efficient", "cudnn") and target.device.type != "cuda":
            return f"the {self.config.kernel} SDPA kernel runs on CUDA only; this run is on {target.device.type}"
        return None

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(Config(kernel=kernel)) for kernel in KERNELS]

    def apply(self, pipe, target: Target) -> None:
        """Nothing to change on the pipeline: the kernel choice is per call (see ``call_context``)."""

    def call_context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, KERNELS[self.config.kernel]))

    def label(self) -> str:
        return f"sdpa-kernel-{self.config.kernel}"
