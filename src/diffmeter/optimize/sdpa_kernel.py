"""Pick PyTorch's scaled-dot-product-attention kernel (flash, memory-efficient, cuDNN, math)
inside the denoiser, for models that call SDPA directly (UNets, SD3, PixArt, SANA, ...).

The choice is scoped to the denoiser's forward: text encoders keep PyTorch's own choice
(T5 passes padding masks that the CUDA flash kernel refuses). The kernels' limits follow
PyTorch's ``sdp_utils.cpp``: on CUDA, flash and cuDNN take float16/bfloat16 inputs only
and flash takes no attention mask; on CPU, PyTorch has a flash kernel (any float dtype,
masks) and math, and no memory-efficient or cuDNN kernel.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Optimization, Target, denoisers
from diffmeter.optimize.registry import register

KERNELS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
#: on CUDA: kernels that run float16/bfloat16 only, and kernels that refuse an attention mask
HALF_ONLY = ("flash", "cudnn")
NO_MASK = ("flash",)
#: kernels PyTorch has only for CUDA
CUDA_ONLY = ("efficient", "cudnn")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernel: Literal["flash", "efficient", "cudnn", "math"] = "flash"


@register
class SDPAKernel(Optimization):
    name = "sdpa-kernel"
    kind = "attention"
    lossless = True
    exclusive = True
    summary = "restrict torch SDPA inside the denoiser to one kernel (flash, efficient, cudnn, math)"
    Config = Config

    def supports(self, target: Target) -> str | None:
        kernel = self.config.kernel
        if target.device.type != "cuda":
            if kernel in CUDA_ONLY:
                return f"the {kernel} SDPA kernel runs on CUDA only; this run is on {target.device.type}"
            return None
        if kernel in HALF_ONLY and target.dtype == "float32":
            return (
                f"the {kernel} SDPA kernel takes float16/bfloat16 inputs only and this run is float32; "
                "use --dtype bf16, or kernel=efficient"
            )
        if kernel in NO_MASK and target.family.masks_attention:
            return (
                f"{target.denoiser_class.__name__} passes an attention mask to SDPA, which the flash kernel refuses; "
                "use kernel=efficient"
            )
        return None

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(Config(kernel=kernel)) for kernel in KERNELS]

    def apply(self, pipe, target: Target) -> None:
        """Enter the kernel choice before each denoiser call and leave it after (hooks)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, KERNELS[self.config.kernel])
        active = []

        def enter(*_):
            active.append(sdpa_kernel(backend))
            active[-1].__enter__()

        def leave(*_):
            active.pop().__exit__(None, None, None)

        self._handles = [
            handle
            for module in denoisers(pipe, target)
            for handle in (
                module.register_forward_pre_hook(enter),
                module.register_forward_hook(leave, always_call=True),
            )
        ]

    def restore(self, pipe, target: Target) -> None:
        for handle in getattr(self, "_handles", ()):
            handle.remove()

    def label(self) -> str:
        return f"sdpa-kernel-{self.config.kernel}"
