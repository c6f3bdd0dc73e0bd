"""diffusers' attention backends by name (native, flash, _flash_3, sage, xformers, flex, ...),
for denoisers whose attention goes through ``dispatch_attention_fn``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from diffmeter.optimize.base import Optimization, Target, denoiser
from diffmeter.optimize.registry import register

#: the package each backend family needs, as the user installs it
PACKAGES = {
    "flash": "flash-attn",
    "_flash_3": "flash-attn 3 (built from source)",
    "sage": "sageattention",
    "xformers": "xformers",
}


def backend_names() -> list[str]:
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [backend.value for backend in AttentionBackendName]


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backend: str = "native"

    @field_validator("backend")
    @classmethod
    def _known(cls, value: str) -> str:
        names = backend_names()
        if value not in names:
            raise ValueError(f"unknown backend '{value}'; diffusers knows {', '.join(names)}")
        return value


@register
class Attention(Optimization):
    name = "attention"
    kind = "attention"
    lossless = True
    exclusive = True
    summary = "set the denoiser's attention backend (flash, _flash_3, sage, xformers, flex, native, ...)"
    Config = Config

    def supports(self, target: Target) -> str | None:
        if not target.denoiser_source_mentions("dispatch_attention_fn"):
            return (
                f"{target.denoiser_class.__name__} calls scaled_dot_product_attention directly, not through "
                "diffusers' attention dispatcher; use sdpa-kernel to pick the SDPA kernel"
            )
        from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

        backend = AttentionBackendName(self.config.backend)
        try:
            _check_attention_backend_requirements(backend)
        except (RuntimeError, ImportError) as error:
            return str(error).splitlines()[0]
        needs_cuda = backend.value not in ("native", "flex", "_native_math")
        if needs_cuda and target.device.type != "cuda":
            return f"the {backend.value} backend runs on CUDA only; this run is on {target.device.type}"
        return None

    def apply(self, pipe, target: Target) -> None:
        denoiser(pipe, target).set_attention_backend(self.config.backend)

    def label(self) -> str:
        return f"attention-{self.config.backend}"
