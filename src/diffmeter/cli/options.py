"""Options shared by several commands, declared once: the same name, type and help everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

#: the panels `--help` groups options in (cli/help.py); options without one go under "Options"
GENERATION = "Generation"
MEASUREMENT = "Measurement"
OUTPUT = "Output"
OPTIMIZATIONS = "Optimizations (all of them: diffmeter optimizations)"
PARALLEL = "Parallelism (several processes: docs/multigpu.md)"

ModelArgument = Annotated[
    str,
    typer.Argument(
        metavar="MODEL",
        help="catalog name, hub id (weights from the HF cache), local diffusers folder or tiny-* entry",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
Height = Annotated[
    int | None,
    typer.Option(help="height in px; alone, the width follows", rich_help_panel=GENERATION),
]
Width = Annotated[
    int | None,
    typer.Option(help="width in px; alone, the height follows", rich_help_panel=GENERATION),
]
Steps = Annotated[int | None, typer.Option(help="denoising steps (default: the model's)", rich_help_panel=GENERATION)]
BatchSize = Annotated[int, typer.Option(help="images per pipeline call", rich_help_panel=GENERATION)]
GuidanceScale = Annotated[
    float | None,
    typer.Option(metavar="X", help="classifier-free guidance scale; <= 1 disables CFG", rich_help_panel=GENERATION),
]
ComponentDtype = Annotated[
    list[str] | None,
    typer.Option(
        "--component-dtype",
        metavar="NAME=DTYPE",
        help="one component at another dtype, e.g. vae=float32 (repeatable; default: the model card's)",
        rich_help_panel=GENERATION,
    ),
]
TrueCfgScale = Annotated[
    float | None,
    typer.Option(
        metavar="X",
        help="FLUX.1's true_cfg_scale: above 1, two calls a step",
        rich_help_panel=GENERATION,
    ),
]
ImageSize = Annotated[
    list[str] | None,
    typer.Option(
        "--image-size",
        metavar="WxH",
        help="an input image's size (repeatable, in order); with --controlnet, the control image's",
        rich_help_panel=GENERATION,
        show_default=False,
    ),
]
NoImage = Annotated[
    bool,
    typer.Option(
        "--no-image",
        help="no input image (Kontext: text-to-image)",
        rich_help_panel=GENERATION,
    ),
]
ControlNet = Annotated[
    str | None,
    typer.Option(
        "--controlnet",
        metavar="NAME",
        help="a ControlNet (see `models --controlnets`)",
        rich_help_panel=GENERATION,
    ),
]
ControlGuidanceStart = Annotated[
    float | None,
    typer.Option(metavar="F", help="ControlNet steers from this step fraction", rich_help_panel=GENERATION),
]
ControlGuidanceEnd = Annotated[
    float | None,
    typer.Option(metavar="F", help="ControlNet steers until this step fraction", rich_help_panel=GENERATION),
]
ControlnetConditioningScale = Annotated[
    float | None,
    typer.Option(metavar="S", help="its residuals' scale", rich_help_panel=GENERATION),
]
LoraRank = Annotated[
    int | None,
    typer.Option(
        metavar="R",
        help="a LoRA of rank R on the denoiser",
        rich_help_panel=GENERATION,
    ),
]
LoraTargets = Annotated[
    str | None,
    typer.Option(
        metavar="A,B",
        help="layers --lora-rank adapts (target_modules)",
        rich_help_panel=GENERATION,
    ),
]
LoraFile = Annotated[
    str | None,
    typer.Option(
        "--lora",
        metavar="PATH",
        help="a diffusers LoRA: its file or folder",
        rich_help_panel=GENERATION,
    ),
]
FuseLora = Annotated[
    bool,
    typer.Option("--fuse-lora", help="the LoRA fused into the weights (fuse_lora)", rich_help_panel=GENERATION),
]
NumFrames = Annotated[
    int | None, typer.Option(help="video models: frames per video (default: the model's)", rich_help_panel=GENERATION)
]
MaxSequenceLength = Annotated[
    int | None,
    typer.Option(help="T5/Gemma/UMT5 tokens (max_sequence_length)", rich_help_panel=GENERATION),
]
CfgTruncRatio = Annotated[
    float | None,
    typer.Option(
        metavar="R",
        help="Lumina 2: CFG on this share of the steps",
        rich_help_panel=GENERATION,
    ),
]
ResolutionBinning = Annotated[
    bool,
    typer.Option(help="PixArt/SANA/HunyuanDiT snap sizes to aspect-ratio bins", rich_help_panel=GENERATION),
]
Seed = Annotated[int, typer.Option(help="image n gets seed + n; also samples prompts", rich_help_panel=GENERATION)]
UlyssesDegree = Annotated[
    int,
    typer.Option(help="sequence split over N GPUs (Ulysses)", rich_help_panel=PARALLEL),
]
RingDegree = Annotated[
    int,
    typer.Option(
        help="sequence split over N GPUs (ring attention)",
        rich_help_panel=PARALLEL,
    ),
]
TpDegree = Annotated[
    int,
    typer.Option(help="denoiser split over N GPUs (FLUX, QwenImage)", rich_help_panel=PARALLEL),
]
Engine = Annotated[
    str,
    typer.Option(metavar="NAME", help="diffusers (xdit: refused, says why)", rich_help_panel=PARALLEL),
]
CfgDegree = Annotated[int, typer.Option(help="2 GPUs, each one half of every guided step", rich_help_panel=PARALLEL)]
PipefusionDegree = Annotated[
    int, typer.Option(help="xDiT's PipeFusion: refused, with the reason", rich_help_panel=PARALLEL, hidden=True)
]
DataParallel = Annotated[int, typer.Option(help="N GPUs, each running its own batches", rich_help_panel=PARALLEL)]
Device = Annotated[
    str | None,
    typer.Option(
        metavar="DEVICE", help="cuda, cuda:N or cpu (default: cuda when present)", rich_help_panel=MEASUREMENT
    ),
]
Warmup = Annotated[int, typer.Option(help="untimed calls (>= 1), the first one cold", rich_help_panel=MEASUREMENT)]
Iterations = Annotated[int, typer.Option(help="measured calls", rich_help_panel=MEASUREMENT)]
RandomWeights = Annotated[
    bool,
    typer.Option(help="real-size random weights from catalog configs (no download)", rich_help_panel=MEASUREMENT),
]
Out = Annotated[
    str,
    typer.Option(metavar="DIR", help="folder for the run folders", envvar="DIFFMETER_OUT", rich_help_panel=OUTPUT),
]
Force = Annotated[bool, typer.Option(help="replace a stored result for the same spec", rich_help_panel=OUTPUT)]


def _optimization(help: str, envvar: str, **kwargs) -> typer.models.OptionInfo:
    """An optimization's option: in the optimizations panel, also read from ``DIFFMETER_<envvar>``."""
    return typer.Option(help=help, envvar=f"DIFFMETER_{envvar}", rich_help_panel=OPTIMIZATIONS, **kwargs)


# The shorthands for the registry's techniques (`--opt NAME:k=v` reaches every one of them).
Compile = Annotated[
    str | None,
    _optimization(
        "torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
        "COMPILE",
        metavar="MODE",
    ),
]
CompileFullgraph = Annotated[bool, _optimization("fullgraph=True: fail on graph breaks", "COMPILE_FULLGRAPH")]
CompileRegional = Annotated[
    bool, _optimization("compile the repeated blocks only (compiles faster)", "COMPILE_REGIONAL")
]
CompileComponents = Annotated[
    str | None,
    _optimization("components to compile (default: the denoiser)", "COMPILE_COMPONENTS", metavar="A,B"),
]
CompileInductorFlags = Annotated[
    bool, _optimization("inductor settings tuned for diffusion models", "COMPILE_INDUCTOR_FLAGS")
]
ChannelsLast = Annotated[bool, _optimization("channels_last memory for compiled conv models", "CHANNELS_LAST")]
Attention = Annotated[
    str | None,
    _optimization(
        "attention backend: native, flash, _flash_3, sage, xformers, flex, ...", "ATTENTION", metavar="BACKEND"
    ),
]
SdpaKernel = Annotated[
    str | None, _optimization("SDPA kernel: flash, efficient, cudnn, math", "SDPA_KERNEL", metavar="KERNEL")
]
FuseQkv = Annotated[bool, _optimization("fuse the Q/K/V projections into one matmul", "FUSE_QKV")]
Cache = Annotated[
    str | None,
    _optimization("a denoiser cache by name (diffmeter optimizations lists them)", "CACHE", metavar="NAME"),
]
CacheThreshold = Annotated[float | None, _optimization("threshold of the cache", "CACHE_THRESHOLD", metavar="X")]
CacheInterval = Annotated[int | None, _optimization("interval / skip range of the cache", "CACHE_INTERVAL")]
Scheduler = Annotated[
    str | None,
    _optimization(
        "ddim, dpm++2m, dpm++2m-karras, euler, euler-ancestral, unipc, flow-euler", "SCHEDULER", metavar="NAME"
    ),
]
Offload = Annotated[str | None, _optimization("CPU offload: model, sequential, group", "OFFLOAD", metavar="KIND")]
VaeTiling = Annotated[bool, _optimization("decode in tiles (lower peak memory)", "VAE_TILING")]
VaeSlicing = Annotated[bool, _optimization("decode one image at a time (lower peak memory)", "VAE_SLICING")]
Quantize = Annotated[
    list[str] | None,
    _optimization("[NAME=]BACKEND:TYPE, e.g. bnb:nf4; repeatable", "QUANTIZE", metavar="SPEC"),
]
Weights = Annotated[
    str | None,
    _optimization(
        "GGUF/BFL file, Nunchaku/AutoRound folder",
        "WEIGHTS",
        metavar="PATH",
    ),
]
Fp8TextEncoder = Annotated[bool, _optimization("T5/UMT5/Gemma text encoders stored in float8", "FP8_TEXT_ENCODER")]
Opt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="NAME:k=v,...",
        help="any technique with its parameters; repeatable",
        rich_help_panel=OPTIMIZATIONS,
    ),
]


def _card_named(value: str | None) -> str | None:
    """An empty ``--gpu`` names no card: refused, not read as no ``--gpu`` at all."""
    if value is not None and not value.strip():
        raise typer.BadParameter("an empty name: name the card, e.g. --gpu h100 (a wrong name lists them)")
    return value


GpuName = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        metavar="NAME",
        callback=_card_named,
        help="predict peak memory per stage for this GPU: h100, h200, l4, rtx 4090... (a wrong name lists them)",
    ),
]
TorchVersion = Annotated[
    str | None,
    typer.Option(
        metavar="X.Y",
        help="with --gpu: the torch version the run will use (default: the installed one); it decides the kernel "
        "SDPA's attention runs on (cuDNN's on Hopper from 2.11)",
    ),
]
Tf32 = Annotated[
    bool,
    typer.Option(
        "--tf32/--no-tf32",
        help="with --gpu: float32 matmuls and convolutions timed on TF32, as bench runs them on CUDA (--no-tf32: "
        "in strict float32, as bench --no-tf32 runs them)",
    ),
]
GpuSpec = Annotated[
    str | None,
    typer.Option(
        metavar="SPEC",
        help='a GPU not in the table: "80GB,989TFLOPS,3.35TB/s,arch=hopper" (GB read as GiB) or JSON '
        '{"memory_gib": 80, ...}',
    ),
]
