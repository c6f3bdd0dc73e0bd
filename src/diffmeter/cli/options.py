"""Options shared by several commands, declared once: the same name, type and help everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

OPTIMIZATIONS = "optimizations (also from --config FILE or DIFFMETER_* variables)"

ModelArgument = Annotated[
    str,
    typer.Argument(
        metavar="MODEL",
        help="catalog name or hub id (weights from the HF cache), local diffusers folder, or a tiny-* test entry",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
Height = Annotated[
    int | None, typer.Option(help="image height in pixels; given alone, the width follows it (default: the model's)")
]
Width = Annotated[
    int | None, typer.Option(help="image width in pixels; given alone, the height follows it (default: the model's)")
]
Steps = Annotated[int | None, typer.Option(help="denoising steps (default: the model's)")]
BatchSize = Annotated[int, typer.Option(help="images (prompts) per pipeline call")]
GuidanceScale = Annotated[float | None, typer.Option(help="classifier-free guidance scale; <= 1 disables CFG")]
NumFrames = Annotated[int | None, typer.Option(help="video models only: frames per video (default: the model's)")]
MaxSequenceLength = Annotated[
    int | None, typer.Option(help="the pipeline's max_sequence_length: tokens of its T5/Gemma/UMT5 encoder")
]
ResolutionBinning = Annotated[
    bool, typer.Option(help="let PixArt/SANA/HunyuanDiT snap sizes to their aspect-ratio bins, as their pipelines do")
]
Seed = Annotated[int, typer.Option(help="image n gets seed + n; also samples the prompts")]
PARALLEL = "parallelism (several processes: docs/multigpu.md)"
UlyssesDegree = Annotated[
    int,
    typer.Option(
        help="context parallelism: GPUs splitting the sequence with Ulysses all-to-all", rich_help_panel=PARALLEL
    ),
]
RingDegree = Annotated[
    int,
    typer.Option(
        help="context parallelism: GPUs splitting the sequence with ring attention (flash/sage attention backends)",
        rich_help_panel=PARALLEL,
    ),
]
TpDegree = Annotated[
    int,
    typer.Option(
        help="tensor parallelism: GPUs each holding a shard of the denoiser (diffusers' _tp_plan: FLUX, QwenImage)",
        rich_help_panel=PARALLEL,
    ),
]
Engine = Annotated[
    str, typer.Option(help="diffusers (xdit: xDiT's xfuser, refused with its reason)", rich_help_panel=PARALLEL)
]
CfgDegree = Annotated[
    int,
    typer.Option(help="CFG parallelism: 2 GPUs, each one half of every guided step", rich_help_panel=PARALLEL),
]
PipefusionDegree = Annotated[
    int, typer.Option(help="xDiT's PipeFusion: refused, with the reason", rich_help_panel=PARALLEL, hidden=True)
]
DataParallel = Annotated[
    int, typer.Option(help="GPUs generating their own batches (throughput)", rich_help_panel=PARALLEL)
]
Device = Annotated[str | None, typer.Option(help="cuda, cuda:N or cpu (default: cuda when present)")]
Warmup = Annotated[int, typer.Option(help="untimed calls first; the first one is reported as the cold call")]
Iterations = Annotated[int, typer.Option(help="measured calls")]
RandomWeights = Annotated[
    bool, typer.Option(help="real-size model with random weights from the catalog configs (no download)")
]
Out = Annotated[str, typer.Option(help="folder that receives one run folder per measured spec", envvar="DIFFMETER_OUT")]
Force = Annotated[bool, typer.Option(help="replace an existing result for the same spec")]


def _optimization(help: str, envvar: str, **kwargs) -> typer.models.OptionInfo:
    return typer.Option(help=help, envvar=f"DIFFMETER_{envvar}", rich_help_panel=OPTIMIZATIONS, **kwargs)


# The shorthands for the registry's techniques (`--opt NAME:k=v` reaches every one of them).
Compile = Annotated[
    str | None,
    _optimization("torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs", "COMPILE"),
]
CompileFullgraph = Annotated[
    bool, _optimization("compile with fullgraph=True (fail on graph breaks)", "COMPILE_FULLGRAPH")
]
CompileRegional = Annotated[
    bool, _optimization("compile the repeated blocks only (faster to compile)", "COMPILE_REGIONAL")
]
CompileComponents = Annotated[
    str | None, _optimization("components to compile, comma-separated (default: the denoiser)", "COMPILE_COMPONENTS")
]
CompileInductorFlags = Annotated[
    bool,
    _optimization(
        "inductor settings tuned for diffusion models (conv 1x1 as matmul, coordinate-descent tuning)",
        "COMPILE_INDUCTOR_FLAGS",
    ),
]
ChannelsLast = Annotated[
    bool, _optimization("channels_last memory format for compiled 2-D convolution models", "CHANNELS_LAST")
]
Attention = Annotated[
    str | None,
    _optimization("diffusers attention backend: native, flash, _flash_3, sage, xformers, flex, ...", "ATTENTION"),
]
SdpaKernel = Annotated[
    str | None,
    _optimization("SDPA kernel inside the denoiser: flash, efficient, cudnn, math", "SDPA_KERNEL"),
]
FuseQkv = Annotated[bool, _optimization("fuse the Q/K/V projections into one matmul", "FUSE_QKV")]
Cache = Annotated[
    str | None,
    _optimization("first-block-cache, pab, faster-cache, taylorseer, mag-cache, deep-cache, cache-dit", "CACHE"),
]
CacheThreshold = Annotated[float | None, _optimization("threshold of the cache", "CACHE_THRESHOLD")]
CacheInterval = Annotated[int | None, _optimization("interval / skip range of the cache", "CACHE_INTERVAL")]
Scheduler = Annotated[str | None, _optimization("ddim, dpm++2m, dpm++2m-karras, euler, unipc, flow-euler", "SCHEDULER")]
Offload = Annotated[str | None, _optimization("CPU offload: model, sequential, group", "OFFLOAD")]
VaeTiling = Annotated[bool, _optimization("decode the image in overlapping tiles (lower peak memory)", "VAE_TILING")]
VaeSlicing = Annotated[bool, _optimization("decode a batch one image at a time (lower peak memory)", "VAE_SLICING")]
Quantize = Annotated[str | None, _optimization("torchao weight-only quantization: int8, fp8", "QUANTIZE")]
Fp8TextEncoder = Annotated[
    bool, _optimization("store T5/UMT5/Gemma text encoders in float8, compute in the run's dtype", "FP8_TEXT_ENCODER")
]
Opt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="NAME:k=v,...",
        help="any technique and parameter, repeatable (see `diffmeter optimizations`)",
        rich_help_panel=OPTIMIZATIONS,
    ),
]
GpuName = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        help="predict peak memory per stage for this GPU: h100, h200, l4, rtx 4090... (a wrong name lists them)",
    ),
]
GpuSpec = Annotated[
    str | None,
    typer.Option(help='a GPU not in the table: "80GB,989TFLOPS,3.35TB/s" or JSON {"memory_gb": 80, ...}'),
]
