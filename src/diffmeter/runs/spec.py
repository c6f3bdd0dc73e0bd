"""What to benchmark: a model, generation settings, prompts and the measurement plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError
from diffmeter.flops.schema import HEIGHT_WIDTH
from diffmeter.lora_file import lora_fields
from diffmeter.measure.speedup import DEFAULT_CALLS
from diffmeter.optimization_spec import OptimizationSpec
from diffmeter.spec import CPU_DTYPE, ProfileSpec, image_sizes_of, normalize_dtype, sizes_text

if TYPE_CHECKING:
    import torch


class BenchSpec(BaseModel):
    """A measured run. ``None`` settings take the model's catalog defaults (see ``settle``)."""

    model_config = ConfigDict(frozen=True)

    model: str
    prompt: str | None = None
    prompts_file: str | None = None
    num_prompts: int | None = None
    batch_size: int = 1
    height: int | None = None
    width: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    #: FLUX.1's true CFG (FluxPipeline's ``true_cfg_scale``, empty negative prompt); None: off
    true_cfg_scale: float | None = None
    num_frames: int | None = None
    max_sequence_length: int | None = None
    #: Lumina2Pipeline's ``cfg_trunc_ratio`` (CFG on the first steps only); None: the model card's, else the pipeline's
    cfg_trunc_ratio: float | None = None
    resolution_binning: bool | None = None
    #: input images' sizes, (height, width) each, in the pipeline's order: each output gets its own, seeded noise
    #: (seed + n, as its generator) unless ``images`` names the files; settled from the files when they are given
    image_sizes: list[tuple[int, int]] = Field(default=[], description=HEIGHT_WIDTH)
    #: input image files, in the pipeline's order (every output edits the same ones)
    images: list[str] = []
    #: no input image where the catalog call has one (FLUX.1 Kontext called text-to-image): ``--no-image``
    no_image: bool = False
    #: a LoRA on the denoiser: a fresh adapter of this rank (peft) on ``lora_targets`` (empty: the family's trainer
    #: default), or a diffusers LoRA file or folder (``lora``); ``fuse_lora``: folded into the weights (fuse_lora)
    lora_rank: int | None = None
    lora_targets: list[str] = []
    lora: str | None = None
    fuse_lora: bool = False
    #: a ControlNet steering the denoiser (``diffmeter models --controlnets``): each output gets a seeded-noise
    #: control image at the output size
    controlnet: str | None = None
    #: the ControlNet call's options (None: the pipeline's defaults), passed to ``__call__``
    control_guidance_start: float | None = None
    control_guidance_end: float | None = None
    controlnet_conditioning_scale: float | None = None
    seed: int = 0
    dtype: str | None = None
    #: components at another dtype than ``dtype``: {"vae": "float32"} (defaults: the model card's)
    component_dtypes: dict[str, str] = {}
    device: str | None = None
    warmup: int = 1
    iterations: int = DEFAULT_CALLS
    min_duration_s: float = 0.0
    #: keep measuring until the median latency's 95% interval is within +- this fraction of it
    target_precision: float | None = None
    #: the most measured calls --target-precision may take
    max_iterations: int = 100
    random_weights: bool = False
    save_images: bool = True
    peak_tflops: float | None = None
    #: speed-ups by name (see ``diffmeter optimizations``), applied in registry order
    optimizations: list[OptimizationSpec] = []
    #: TF32 for float32 matmuls; None: on for CUDA runs (it is added to ``optimizations``)
    tf32: bool | None = None
    #: also run the unoptimized pipeline and compare images (PSNR, SSIM)
    compare_baseline: bool = False
    #: refuse up front a run whose lower-bound memory exceeds what the device has available
    memory_check: bool = True
    #: one extra call after the measured ones under torch.profiler (trace and operators table)
    trace: bool = False
    #: store the offline prediction (peak memory, roofline time) for the run's device beside the measurements
    predict: bool = True
    #: context parallelism (diffusers): ranks splitting the sequence with Ulysses all-to-all / ring attention
    ulysses_degree: int = 1
    ring_degree: int = 1
    #: tensor parallelism (diffusers' TensorParallelConfig): ranks each holding a shard of the denoiser's weights
    tp_degree: int = 1
    #: CFG parallelism: the conditional and unconditional halves of each guided step on two ranks
    cfg_degree: int = 1
    #: xDiT's PipeFusion: refused with its reason (it needs xDiT's own patched models)
    pipefusion_degree: int = 1
    #: request-level data parallelism: ranks each generating their own batches
    data_parallel: int = 1
    #: what runs the pipeline: diffusers (xdit, xDiT's xfuser, is refused with its reason)
    engine: str = "diffusers"

    @field_validator("image_sizes", mode="before")
    @classmethod
    def _sizes_as_typed(cls, sizes):
        """A sweep file or the Python API may write each size as the CLI does: "1024x768" (WxH)."""
        return list(image_sizes_of(sizes))

    @property
    def lora_text(self) -> str:
        """The run's LoRA as tables show it ("rank 16, unfused", "my_lora.safetensors, fused"); "" without one."""
        if self.lora is None and self.lora_rank is None:
            return ""
        return f"{self.lora or f'rank {self.lora_rank}'}, {'fused' if self.fuse_lora else 'unfused'}"

    @property
    def context_degree(self) -> int:
        return self.ulysses_degree * self.ring_degree

    @property
    def model_parallel(self) -> int:
        """Ranks that generate the same images together (context, tensor or CFG parallelism)."""
        return self.context_degree * self.tp_degree * self.cfg_degree

    @property
    def world_size(self) -> int:
        """Processes (GPUs) the run uses: the model-parallel group times the data-parallel degree."""
        return self.model_parallel * self.data_parallel

    def settle(self, entry: PipelineEntry, here: bool = True) -> BenchSpec:
        """Fill defaults from the catalog and the device, and check every value; ``here=False``
        (a run planned for another machine) names the device without looking for it."""
        self.check()
        if self.no_image and (self.image_sizes or self.images):
            raise DiffmeterError("--no-image and --image-size/--image contradict each other: drop one")
        device = resolve_device(self.device) if here else _named_device(self.device)
        dtype = normalize_dtype(self.dtype)
        if dtype is None:
            dtype = entry.defaults.dtype if device.type == "cuda" else CPU_DTYPE
        image_sizes = image_sizes_of_files(self.images, self.image_sizes)
        profile = (
            self.model_copy(update={"dtype": dtype, "image_sizes": image_sizes})
            .profile_spec()
            .with_defaults(entry.defaults)
        )
        profile.check_components(entry.name, list(entry.components))  # before those equal to dtype are dropped
        from diffmeter.families import get_family
        from diffmeter.families.images import image_sized, refuse_ignored_size, refuse_no_image

        family = get_family(entry.family)
        if self.no_image:
            refuse_no_image(family, entry)
        refuse_ignored_size(family, entry, (self.height, self.width), profile)
        height, width = (image_sized(family, entry, profile) or (profile.height, profile.width))[:2]
        if not family.bins(entry, profile):
            height, width, _ = family.pipeline_size(entry, height, width)
        elif not family.restores_binned_size:  # the images come out at the binned size
            height, width = family.binned_size(entry, height, width)
        # the frames the pipeline makes (HunyuanVideo, LTX floor to their VAE's kt+1): what every rate is of
        frames = family.pipeline_frames(entry, profile.num_frames)[0] if profile.num_frames else profile.num_frames
        optimizations = list(self.optimizations)
        names = [o.name for o in optimizations]
        # unset: on CUDA, or where the tf32 technique is asked by name (a CPU then refuses it with its reason)
        tf32 = (device.type == "cuda" or "tf32" in names) if self.tf32 is None else self.tf32
        if tf32 and "tf32" not in names:
            optimizations.append(OptimizationSpec(name="tf32"))
        if not tf32 and "tf32" in names:
            raise DiffmeterError("--no-tf32 contradicts the tf32 optimization asked for")
        return self.model_copy(
            update={
                "optimizations": optimizations,
                "tf32": tf32,
                # a run without a technique is its own baseline: nothing to compare, so stored as not compared
                "compare_baseline": self.compare_baseline and bool(optimizations),
                "height": height,
                "width": width,
                "image_sizes": list(profile.image_sizes),
                "steps": profile.steps,
                "guidance_scale": profile.guidance_scale,
                "num_frames": frames,
                "resolution_binning": profile.resolution_binning,
                "max_sequence_length": profile.max_sequence_length,
                "cfg_trunc_ratio": profile.cfg_trunc_ratio,
                "dtype": profile.dtype,
                "component_dtypes": {n: d for n, d in profile.component_dtypes if d != profile.dtype},
                "device": str(device),
            }
        )

    def baseline(self) -> BenchSpec:
        """The same run without any optimization (TF32 off): what lossy techniques are compared to."""
        return self.model_copy(update={"optimizations": [], "tf32": False, "compare_baseline": False, "trace": False})

    def profile_spec(self) -> ProfileSpec:
        """The offline profile of the same generation (for FLOP/s and MFU)."""
        return ProfileSpec(
            model=self.model,
            height=self.height,
            width=self.width,
            steps=self.steps,
            batch_size=self.batch_size,
            guidance_scale=self.guidance_scale,
            true_cfg_scale=self.true_cfg_scale,
            # none given: the catalog call's; --no-image: none at all
            image_sizes=() if self.no_image else tuple(tuple(size) for size in self.image_sizes) or None,
            **lora_fields(self.model, self.lora_rank, ",".join(self.lora_targets), self.lora, self.fuse_lora)[0],
            num_frames=self.num_frames,
            dtype=self.dtype,
            component_dtypes=tuple(sorted(self.component_dtypes.items())),
            max_sequence_length=self.max_sequence_length,
            cfg_trunc_ratio=self.cfg_trunc_ratio,
            resolution_binning=self.resolution_binning,
            controlnet=self.controlnet,
            # a swapped sampler's timesteps are the run's denoiser steps (optimize/scheduler.py)
            scheduler=next((o.params.get("name") for o in self.optimizations if o.name == "scheduler"), None),
            control_guidance_start=self.control_guidance_start,
            control_guidance_end=self.control_guidance_end,
            controlnet_conditioning_scale=self.controlnet_conditioning_scale,
        )

    def check(self) -> None:
        for name in (
            "batch_size",
            "iterations",
            "warmup",
            "ulysses_degree",
            "ring_degree",
            "tp_degree",
            "cfg_degree",
            "pipefusion_degree",
            "data_parallel",
        ):
            value = getattr(self, name)
            if value < 1:
                hint = " (the first call is cold and reported apart)" if name == "warmup" else ""
                raise DiffmeterError(f"--{name.replace('_', '-')} must be at least 1{hint}, got {value}")
        if self.seed < 0:
            raise DiffmeterError(f"--seed must be 0 or more (image i of a run uses seed + i), got {self.seed}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise DiffmeterError(f"--num-prompts must be at least 1, got {self.num_prompts}")
        if self.min_duration_s < 0:
            raise DiffmeterError(f"--min-duration must be 0 or more seconds, got {self.min_duration_s}")
        if self.target_precision is not None and not 0 < self.target_precision < 1:
            raise DiffmeterError(
                f"--target-precision is a fraction of the median (0.02 for +-2%), got {self.target_precision}"
            )
        if self.target_precision is not None and self.max_iterations < self.iterations:
            raise DiffmeterError(
                f"--max-iterations {self.max_iterations} is below --iterations {self.iterations}; raise it"
            )
        if self.prompt is not None and self.prompts_file is not None:
            raise DiffmeterError("pass either --prompt or --prompts, not both")
        if self.compare_baseline and not self.save_images:
            raise DiffmeterError("--compare-baseline compares saved images; drop --no-save-images")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise DiffmeterError(f"--peak-tflops must be positive, got {self.peak_tflops}")
        normalize_dtype(self.dtype)


def image_sizes_of_files(paths: list[str], sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (height, width) of each ``--image`` file, read from its header; ``--image-size`` alone when no file is
    given. Both given: they must name the same sizes."""
    if not paths:
        return [tuple(size) for size in sizes]
    from PIL import Image, UnidentifiedImageError

    read = []
    for path in paths:
        try:
            with Image.open(path) as image:
                read.append((image.height, image.width))
        except FileNotFoundError:
            raise DiffmeterError(f"--image {path}: no such file") from None
        except (UnidentifiedImageError, OSError) as error:
            raise DiffmeterError(f"--image {path}: not an image PIL can read ({error}); pass a PNG or JPEG") from None
    if sizes and [tuple(size) for size in sizes] != read:
        raise DiffmeterError(
            f"--image-size {sizes_text(sizes)} contradicts the --image files ({sizes_text(read)}): drop --image-size"
        )
    return read


def _named_device(name: str | None) -> torch.device:
    """The device a run on another machine will use: ``cuda`` is its first GPU; no name is CUDA."""
    import torch

    device = torch.device(name or "cuda")
    return torch.device("cuda", device.index or 0) if device.type == "cuda" else device


def resolve_device(name: str | None) -> torch.device:
    """The device to run on: CUDA when present unless told otherwise; absent CUDA is an error."""
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise DiffmeterError(f"unknown device '{name}': use cuda, cuda:N or cpu") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DiffmeterError(
                f"--device {name} asked for, but torch {torch.__version__} sees no CUDA device "
                "(CPU-only build, no driver, or CUDA_VISIBLE_DEVICES empty); use --device cpu"
            )
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise DiffmeterError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    if device.type == "mps":
        raise DiffmeterError(
            "--device mps is not supported: diffmeter times stages with CUDA events or the host clock, and neither "
            "is honest for Apple's asynchronous MPS queue; use --device cpu"
        )
    if device.type != "cpu":
        raise DiffmeterError(f"unsupported device '{name}': use cuda, cuda:N or cpu")
    return device
