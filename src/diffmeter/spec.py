"""What to profile: a model and the generation settings, defaults filled from the catalog."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from diffmeter.errors import DiffmeterError

#: the short dtype names users type, and the torch names diffmeter stores
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: the dtype a run on a CPU takes when none is asked: half precision there is slow and partly unsupported, and a
#: model card's dtype means a GPU (bench's ``BenchSpec.settle``, and profile and fit predicting ``--gpu cpu``)
CPU_DTYPE = "float32"
#: said where a prediction for this CPU takes it in place of the model's own dtype
CPU_DTYPE_NOTE = f"{CPU_DTYPE}: what bench runs on a CPU (the model's own dtype is for CUDA); --dtype for another"


def normalize_dtype(name: str | None) -> str | None:
    """``bf16``/``bfloat16`` -> ``bfloat16`` (and so on); one clear line for anything else."""
    if name is None:
        return None
    dtype = DTYPE_ALIASES.get(name.lower(), name.lower())
    if dtype not in DTYPE_ALIASES.values():
        raise DiffmeterError(f"unknown dtype '{name}': use bf16, fp16 or fp32 (or bfloat16, float16, float32)")
    return dtype


def paired_size(height: int | None, width: int | None) -> tuple[int | None, int | None]:
    """One side given alone sets both (a square), in every command and the Python API alike."""
    if height is not None and width is None:
        return height, height
    if width is not None and height is None:
        return width, width
    return height, width


def settled_component_dtypes(given, defaults: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The model card's component dtypes (``Defaults.component_dtypes``) with the user's over them, sorted."""
    merged = {**defaults, **{name: normalize_dtype(dtype) for name, dtype in dict(given).items()}}
    return tuple(sorted(merged.items()))


def parse_image_size(value: str) -> tuple[int, int]:
    """``--image-size 1024x768`` (width x height, as the pipelines' docs write sizes) as (height, width)."""
    width, sep, height = value.lower().partition("x")
    if not sep or not width.strip().isdigit() or not height.strip().isdigit():
        raise DiffmeterError(f"--image-size takes WIDTHxHEIGHT in pixels, such as 1024x768; got '{value}'")
    return int(height), int(width)


def size_text(size: tuple[int, int]) -> str:
    """(height, width) as the WxH users type: the inverse of ``parse_image_size``."""
    return f"{size[1]}x{size[0]}"


def sizes_text(sizes, joiner: str = ", ") -> str:
    """Several (height, width) sizes as WxH, joined."""
    return joiner.join(map(size_text, sizes))


def image_sizes_of(values) -> tuple[tuple[int, int], ...]:
    """Input image sizes as (height, width) pairs, from "WxH" strings or (height, width) pairs (the Python API)."""
    return tuple(parse_image_size(v) if isinstance(v, str) else (int(v[0]), int(v[1])) for v in values or ())


def asked_images(values, none: bool = False) -> tuple[tuple[int, int], ...] | None:
    """The ``--image-size`` values as ``ProfileSpec.image_sizes``: () for ``--no-image``, None (the catalog call's)
    when neither is given."""
    if none and values:
        raise DiffmeterError("--no-image and --image-size contradict each other: drop one")
    return () if none else image_sizes_of(values) or None


def parse_component_dtypes(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--component-dtype vae=float32`` (repeatable) as (name, dtype) pairs; one clear line otherwise."""
    pairs = []
    for value in values or []:
        name, _, dtype = value.partition("=")
        if not name or not dtype:
            raise DiffmeterError(f"--component-dtype takes NAME=DTYPE, such as vae=float32; got '{value}'")
        pairs.append((name.strip(), normalize_dtype(dtype.strip())))
    return tuple(pairs)


@dataclass(frozen=True)
class ProfileSpec:
    """A generation to count. ``None`` fields take the model's catalog defaults."""

    model: str
    height: int | None = None
    width: int | None = None
    steps: int | None = None
    batch_size: int = 1
    guidance_scale: float | None = None
    #: FLUX.1's true classifier-free guidance (FluxPipeline's ``true_cfg_scale``, with an empty negative
    #: prompt): above 1, a second, unconditional transformer call per step; None: off, as the pipeline's default
    true_cfg_scale: float | None = None
    num_frames: int | None = None
    dtype: str | None = None
    #: components at another dtype than ``dtype`` ((name, dtype) pairs: a float32 VAE under a bfloat16 pipeline)
    component_dtypes: tuple[tuple[str, str], ...] = ()
    prompt_tokens: int | None = None
    negative_prompt_tokens: int | None = None
    instruction_tokens: int | None = None
    #: tokens a pipeline's prompt template adds around the prompt (system turn, chat markers), as
    #: its own tokenizer counts them; None: the catalog's count. Set from the real tokenizer by bench.
    template_tokens: int | None = None
    #: whether the prompts hold quoted text, which a glyph encoder reads (ByT5 in HunyuanVideo 1.5 and
    #: HunyuanImage 2.1 runs only then); None: assumed they do (an upper bound). Set from the real prompts by bench.
    glyph_text: bool | None = None
    resolution_binning: bool | None = None
    #: the sequence encoder's tokens (the pipeline's ``max_sequence_length``); None: the model card's, else the
    #: pipeline's
    max_sequence_length: int | None = None
    #: Lumina2Pipeline's ``cfg_trunc_ratio``: the unconditional call runs on the steps with (i + 1) / steps at most
    #: this; None: the model card's (Lumina-Image-2.0: 0.25), else the pipeline's 1.0
    cfg_trunc_ratio: float | None = None
    #: the input images' sizes, (height, width) each, in the pipeline's order (an edit's source image, reference
    #: images); None: the catalog call's (an edit or image-to-video checkpoint's default image, else none); empty:
    #: none (text-to-image, ``--no-image``). Each output of a batch has its own input images.
    image_sizes: tuple[tuple[int, int], ...] | None = None
    #: a LoRA on the denoiser (``families.lora``): its rank, on ``lora_targets`` (empty: the family's trainer
    #: default); or ``lora_layers``, every adapted layer's path and rank, as a LoRA file names them
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ()
    lora_layers: tuple[tuple[str, int], ...] = ()
    #: the LoRA folded into the base weights (diffusers' ``fuse_lora``): no extra compute, its weights still held
    fuse_lora: bool = False
    #: a ControlNet steering the denoiser (``catalog.controlnets``), by catalog name or hub id; None: none
    controlnet: str | None = None
    #: the ControlNet call's own options (``control_guidance_start``/``_end``, ``controlnet_conditioning_scale``);
    #: None: the pipeline's defaults. They change no MACs where the pipeline runs the ControlNet every step
    control_guidance_start: float | None = None
    control_guidance_end: float | None = None
    controlnet_conditioning_scale: float | None = None
    #: the sampler a run swaps in for the pipeline's scheduler (``--opt scheduler:name=...``, a name of
    #: ``families.schedule.SAMPLERS``): its timesteps are the denoiser steps; None: the pipeline's own scheduler
    scheduler: str | None = None
    #: no size was asked: ``with_defaults`` filled it from the model's defaults, and a pipeline that sizes its output
    #: by its input images (FLUX.2, Qwen-Image-Edit) does so (``ImageConditioned.size_from_images``)
    size_from_defaults: bool = False

    def with_defaults(self, defaults) -> ProfileSpec:
        """Fill unset fields from a catalog ``Defaults`` and check every value."""
        self.check()
        height, width = paired_size(self.height, self.width)
        spec = replace(
            self,
            height=defaults.height if height is None else height,
            width=defaults.width if width is None else width,
            steps=self.steps if self.steps is not None else defaults.steps,
            guidance_scale=defaults.guidance_scale if self.guidance_scale is None else self.guidance_scale,
            num_frames=self.num_frames if self.num_frames is not None else defaults.num_frames,
            dtype=normalize_dtype(self.dtype) or defaults.dtype,
            component_dtypes=settled_component_dtypes(self.component_dtypes, defaults.component_dtypes),
            resolution_binning=defaults.resolution_binning
            if self.resolution_binning is None
            else self.resolution_binning,
            max_sequence_length=self.max_sequence_length or defaults.max_sequence_length,
            cfg_trunc_ratio=defaults.cfg_trunc_ratio if self.cfg_trunc_ratio is None else self.cfg_trunc_ratio,
            image_sizes=tuple(tuple(size) for size in defaults.image_sizes)
            if self.image_sizes is None
            else self.image_sizes,
            size_from_defaults=self.size_from_defaults or height is None,
        )
        spec.check()
        return spec

    def check_components(self, model: str, components) -> None:
        """Every component named in ``component_dtypes`` is one of the model's."""
        unknown = [name for name, _ in self.component_dtypes if name not in components]
        if unknown:
            raise DiffmeterError(
                f"--component-dtype: {model} has no component {', '.join(unknown)} (it has {', '.join(components)})"
            )

    def dtype_of(self, component: str, cast: str | None = None) -> str:
        """The dtype ``component`` runs at: ``cast`` where a call casts it (SDXL's float32 decode), else its own
        where one is given, else the pipeline's."""
        return cast or dict(self.component_dtypes).get(component, self.dtype)

    def check(self) -> None:
        for _, dtype in self.component_dtypes:
            normalize_dtype(dtype)
        for name in ("height", "width", "steps", "batch_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise DiffmeterError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        if self.num_frames is not None and self.num_frames <= 0:
            raise DiffmeterError(f"--num-frames must be a positive integer, got {self.num_frames}")
        for name in ("prompt_tokens", "negative_prompt_tokens", "max_sequence_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise DiffmeterError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        if self.guidance_scale is not None and not 0 <= self.guidance_scale < math.inf:  # nan fails both
            raise DiffmeterError(f"--guidance-scale must be a finite number, 0 or more, got {self.guidance_scale:g}")
        if self.cfg_trunc_ratio is not None and not 0 <= self.cfg_trunc_ratio <= 1:
            raise DiffmeterError(
                f"--cfg-trunc-ratio is the fraction of the steps that run CFG, 0 to 1; got {self.cfg_trunc_ratio:g}"
            )
        if self.true_cfg_scale is not None and not 1 < self.true_cfg_scale < math.inf:
            raise DiffmeterError(
                f"--true-cfg-scale must be above 1 (at 1 or less the pipeline runs no true CFG), "
                f"got {self.true_cfg_scale:g}"
            )
        for height, width in self.image_sizes or ():
            if height <= 0 or width <= 0:
                raise DiffmeterError(f"--image-size must be positive pixels, got {size_text((height, width))} (WxH)")
        if self.lora_rank is not None and self.lora_rank <= 0:
            raise DiffmeterError(f"--lora-rank must be a positive integer, got {self.lora_rank}")
        if self.lora_rank is not None and self.lora_layers:
            raise DiffmeterError("--lora-rank and --lora name the LoRA twice: the file gives its own ranks, drop one")
        if (self.lora_targets or self.fuse_lora) and self.lora_rank is None and not self.lora_layers:
            flag = "--lora-targets" if self.lora_targets else "--fuse-lora"
            raise DiffmeterError(f"{flag} needs a LoRA: add --lora-rank R (or --lora FILE)")
        if self.template_tokens is not None and self.template_tokens < 0:
            raise DiffmeterError(f"template_tokens must be 0 or more, got {self.template_tokens}")
        if self.instruction_tokens is not None and self.instruction_tokens < 0:
            raise DiffmeterError(
                f"--instruction-tokens must be 0 (no instruction) or more, got {self.instruction_tokens}"
            )
        self.check_control()
        normalize_dtype(self.dtype)

    def check_control(self) -> None:
        """A step range the ControlNet pipelines take (check_inputs, pipeline_controlnet_sd_xl.py:792-800, diffusers
        0.42.1: 0 <= start < end <= 1); ``catalog.entry_of`` refuses them for a pipeline without a ControlNet."""
        start = 0.0 if self.control_guidance_start is None else self.control_guidance_start
        end = 1.0 if self.control_guidance_end is None else self.control_guidance_end
        if not 0.0 <= start < end <= 1.0:
            raise DiffmeterError(
                f"--control-guidance-start {start:g} and --control-guidance-end {end:g}: the ControlNet pipelines "
                "take 0 <= start < end <= 1 (fractions of the steps)"
            )
        scale = self.controlnet_conditioning_scale
        if scale is not None and not math.isfinite(scale):  # nan or inf scales the residuals into nan images
            raise DiffmeterError(f"--controlnet-conditioning-scale must be a finite number, got {scale:g}")
