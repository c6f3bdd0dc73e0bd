"""What to profile: a model and the generation settings, defaults filled from the catalog."""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffmeter.errors import DiffmeterError


@dataclass(frozen=True)
class ProfileSpec:
    """A generation to count. ``None`` fields take the model's catalog defaults."""

    model: str
    height: int | None = None
    width: int | None = None
    steps: int | None = None
    batch_size: int = 1
    guidance_scale: float | None = None
    num_frames: int | None = None
    dtype: str | None = None
    prompt_tokens: int | None = None
    negative_prompt_tokens: int | None = None
    instruction_tokens: int | None = None
    resolution_binning: bool | None = None
    max_sequence_length: int | None = None

    def with_defaults(self, defaults) -> ProfileSpec:
        """Fill unset fields from a catalog ``Defaults`` and check every value."""
        spec = replace(
            self,
            height=self.height or defaults.height,
            width=self.width or defaults.width,
            steps=self.steps if self.steps is not None else defaults.steps,
            guidance_scale=defaults.guidance_scale if self.guidance_scale is None else self.guidance_scale,
            num_frames=self.num_frames or defaults.num_frames,
            dtype=self.dtype or defaults.dtype,
            resolution_binning=defaults.resolution_binning
            if self.resolution_binning is None
            else self.resolution_binning,
        )
        spec.check()
        return spec

    def check(self) -> None:
        for name in ("height", "width", "steps", "batch_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise DiffmeterError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        if self.num_frames is not None and self.num_frames <= 0:
            raise DiffmeterError(f"--num-frames must be a positive integer, got {self.num_frames}")
        for name in ("prompt_tokens", "negative_prompt_tokens", "instruction_tokens", "max_sequence_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise DiffmeterError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        if self.dtype not in (None, "float16", "bfloat16", "float32"):
            raise DiffmeterError(f"unknown dtype '{self.dtype}': use float16, bfloat16 or float32")
