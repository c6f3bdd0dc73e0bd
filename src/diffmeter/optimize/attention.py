"""diffusers' attention backends by name (native, flash, _flash_3, sage, xformers, flex, ...),
for denoisers whose attention goes through ``dispatch_attention_fn``.

What a backend accepts is read from diffusers' own registry: the dtype checks it registers
for each backend, and whether the backend's function raises "`attn_mask` is not supported".
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from diffmeter.optimize.base import Optimization, Target, denoisers
from diffmeter.optimize.registry import register

#: the package each backend family needs, as the user installs it
PACKAGES = {
    "flash": "flash-attn",
    "_flash_3": "flash-attn 3 (built from source)",
    "sage": "sageattention",
    "xformers": "xformers",
}
#: backends that run on CPU as well as CUDA
ANY_DEVICE = ("native", "flex", "_native_math")


def backend_names() -> list[str]:
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [backend.value for backend in AttentionBackendName]


def dtypes_accepted(name: str) -> tuple[str, ...] | None:
    """The dtypes a backend's registered checks allow (None: any); sage kernels quantize half inputs."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    checks = {
        getattr(check, "__name__", "")
        for check in _AttentionBackendRegistry._constraints.get(AttentionBackendName(name), ())
    }
    if "_check_qkv_dtype_bf16" in checks:
        return ("bfloat16",)
    if "_check_qkv_dtype_bf16_or_fp16" in checks or name.lstrip("_").startswith("sage"):
        return ("bfloat16", "float16")
    return None


def refuses_masks(name: str) -> bool:
    """Whether the backend's implementation raises on an attention mask (flash, sage, ...)."""
    import inspect

    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    function = _AttentionBackendRegistry._backends.get(AttentionBackendName(name))
    try:
        return function is not None and "`attn_mask` is not supported" in inspect.getsource(function)
    except (OSError, TypeError):
        return False


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
        backend = self.config.backend
        if backend not in ANY_DEVICE and target.device.type != "cuda":
            return f"the {backend} backend is for CUDA GPUs; this run is on {target.device.type}"
        accepted = dtypes_accepted(backend)
        if accepted and target.dtype not in accepted:
            return (
                f"the {backend} backend takes {' or '.join(accepted)} only and this run is {target.dtype}; use --dtype"
            )
        if target.family.masks_attention and refuses_masks(backend):
            return (
                f"{target.denoiser_class.__name__} passes an attention mask, which the {backend} backend refuses; "
                "use native or xformers"
            )
        return None

    def refusal(self, target: Target) -> tuple[str | None, bool]:
        """Not applying first (``supports``), then the backend's package by diffusers' own requirement check: a
        backend whose package is missing here would apply once installed (``profile --gpu`` predicts it)."""
        from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

        if reason := self.supports(target):
            return reason, False
        try:
            _check_attention_backend_requirements(AttentionBackendName(self.config.backend))
        except (RuntimeError, ImportError) as error:
            return str(error).splitlines()[0], True
        return None, False

    def apply(self, pipe, target: Target) -> None:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        self._previous = _AttentionBackendRegistry._active_backend  # set_attention_backend changes it globally
        for module in denoisers(pipe, target):
            module.set_attention_backend(self.config.backend)

    def restore(self, pipe, target: Target) -> None:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        if hasattr(self, "_previous"):
            _AttentionBackendRegistry.set_active_backend(self._previous)

    def label(self) -> str:
        return f"attention-{self.config.backend}"
