"""`diffmeter bench`: measured runs, and `diffmeter show` to print a stored one."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from diffmeter.cli import options as o
from diffmeter.cli.app import command, console
from diffmeter.cli.progress import progress_bar
from diffmeter.errors import DiffmeterError
from diffmeter.measure.speedup import DEFAULT_CALLS
from diffmeter.quiet import load_libraries
from diffmeter.spec import image_sizes_of, parse_component_dtypes

#: the bench parameters that are optimization shorthands (see optimize/options.py)
OPTIMIZATION_FLAGS = (
    "compile",
    "compile_fullgraph",
    "compile_regional",
    "compile_components",
    "compile_inductor_flags",
    "channels_last",
    "attention",
    "sdpa_kernel",
    "fuse_qkv",
    "cache",
    "cache_threshold",
    "cache_interval",
    "scheduler",
    "offload",
    "vae_tiling",
    "vae_slicing",
    "quantize",
    "weights",
    "fp8_text_encoder",
    "opt",
)


@command()
def bench(
    ctx: typer.Context,
    model: o.ModelArgument,
    prompt: Annotated[str | None, typer.Option(help="one prompt for every image", rich_help_panel=o.GENERATION)] = None,
    prompts: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="prompts file: .txt, .jsonl or .csv", rich_help_panel=o.GENERATION),
    ] = None,
    num_prompts: Annotated[
        int | None,
        typer.Option(help="prompts to sample (default: batch x calls)", rich_help_panel=o.GENERATION),
    ] = None,
    batch_size: o.BatchSize = 1,
    height: o.Height = None,
    width: o.Width = None,
    steps: o.Steps = None,
    guidance_scale: o.GuidanceScale = None,
    true_cfg_scale: o.TrueCfgScale = None,
    image_size: o.ImageSize = None,
    no_image: o.NoImage = False,
    image: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PATH",
            help="an input image file (repeatable; else noise)",
            rich_help_panel=o.GENERATION,
            show_default=False,
        ),
    ] = None,
    controlnet: o.ControlNet = None,
    control_guidance_start: o.ControlGuidanceStart = None,
    control_guidance_end: o.ControlGuidanceEnd = None,
    controlnet_conditioning_scale: o.ControlnetConditioningScale = None,
    lora_rank: o.LoraRank = None,
    lora_targets: o.LoraTargets = None,
    lora: o.LoraFile = None,
    fuse_lora: o.FuseLora = False,
    num_frames: o.NumFrames = None,
    max_sequence_length: o.MaxSequenceLength = None,
    cfg_trunc_ratio: o.CfgTruncRatio = None,
    resolution_binning: o.ResolutionBinning = True,
    seed: o.Seed = 0,
    dtype: Annotated[
        str | None,
        typer.Option(
            metavar="DTYPE",
            help="bf16 | fp16 | fp32 (default: the model's on CUDA, fp32 on CPU)",
            envvar="DIFFMETER_DTYPE",
            rich_help_panel=o.GENERATION,
        ),
    ] = None,
    component_dtype: o.ComponentDtype = None,
    device: o.Device = None,
    warmup: o.Warmup = 1,
    iterations: o.Iterations = DEFAULT_CALLS,
    min_duration: Annotated[
        float,
        typer.Option(metavar="SECONDS", help="measure for at least this long", rich_help_panel=o.MEASUREMENT),
    ] = 0.0,
    target_precision: Annotated[
        float | None,
        typer.Option(
            metavar="X",
            help="measure until the median's 95% interval is within +- this fraction (0.02: +-2%)",
            rich_help_panel=o.MEASUREMENT,
        ),
    ] = None,
    max_iterations: Annotated[
        int, typer.Option(help="most calls --target-precision may take", rich_help_panel=o.MEASUREMENT)
    ] = 100,
    random_weights: o.RandomWeights = False,
    save_images: Annotated[
        bool, typer.Option(help="write the images to the run folder's images/", rich_help_panel=o.OUTPUT)
    ] = True,
    peak_tflops: Annotated[
        float | None,
        typer.Option(
            metavar="X", help="peak TFLOP/s for MFU (default: the datasheet table's)", rich_help_panel=o.MEASUREMENT
        ),
    ] = None,
    tf32: Annotated[
        bool | None,
        typer.Option(
            "--tf32/--no-tf32",
            help="TF32 matmuls (default: on for CUDA)",
            envvar="DIFFMETER_TF32",
            rich_help_panel=o.MEASUREMENT,
        ),
    ] = None,
    compile: o.Compile = None,
    compile_fullgraph: o.CompileFullgraph = False,
    compile_regional: o.CompileRegional = False,
    compile_components: o.CompileComponents = None,
    compile_inductor_flags: o.CompileInductorFlags = False,
    channels_last: o.ChannelsLast = False,
    attention: o.Attention = None,
    sdpa_kernel: o.SdpaKernel = None,
    fuse_qkv: o.FuseQkv = False,
    cache: o.Cache = None,
    cache_threshold: o.CacheThreshold = None,
    cache_interval: o.CacheInterval = None,
    scheduler: o.Scheduler = None,
    offload: o.Offload = None,
    vae_tiling: o.VaeTiling = False,
    vae_slicing: o.VaeSlicing = False,
    quantize: o.Quantize = None,
    weights: o.Weights = None,
    fp8_text_encoder: o.Fp8TextEncoder = False,
    opt: o.Opt = None,
    compare_baseline: Annotated[
        bool,
        typer.Option(help="also run unoptimized; store PSNR/SSIM against it", rich_help_panel=o.OPTIMIZATIONS),
    ] = False,
    memory_check: Annotated[
        bool, typer.Option(help="refuse up front a run that cannot fit", rich_help_panel=o.MEASUREMENT)
    ] = True,
    ulysses_degree: o.UlyssesDegree = 1,
    ring_degree: o.RingDegree = 1,
    tp_degree: o.TpDegree = 1,
    cfg_degree: o.CfgDegree = 1,
    pipefusion_degree: o.PipefusionDegree = 1,
    data_parallel: o.DataParallel = 1,
    engine: o.Engine = "diffusers",
    config: Annotated[
        str | None,
        typer.Option(
            metavar="FILE", help="YAML/JSON file of these options; flags and variables win", envvar="DIFFMETER_CONFIG"
        ),
    ] = None,
    trace: Annotated[
        bool,
        typer.Option(
            help="one more call under torch.profiler: a Chrome trace, top operators per stage (docs/trace.md)",
            rich_help_panel=o.MEASUREMENT,
        ),
    ] = False,
    predict: Annotated[
        bool,
        typer.Option(
            help="store the predicted peak memory and time beside the measured ones (docs/memory-prediction.md)",
            envvar="DIFFMETER_PREDICT",
            rich_help_panel=o.MEASUREMENT,
        ),
    ] = True,
    out: o.Out = "results",
    force: o.Force = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="no progress and no table", rich_help_panel=o.OUTPUT)
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the result summary as JSON", rich_help_panel=o.OUTPUT)
    ] = False,
) -> None:
    """Run real generations and measure per-stage latency, memory, energy and MFU, with speed-ups applied by name."""
    load_libraries()
    from diffmeter.execute import bench as run_bench
    from diffmeter.report.run_table import run_table

    values = _with_config_file(ctx, config)
    _check_variables(ctx, values)  # first: a variable's bad value is named by its variable
    spec = _bench_spec(values)
    with progress_bar(quiet or as_json) as progress:
        result, folder = run_bench(spec, out=values["out"], force=force, progress=progress)
    if result is None:  # a rank other than 0 of a torchrun launch: rank 0 reports
        return
    if as_json:
        print(json.dumps(json_summary(result, folder), indent=2))
    elif not quiet:
        console.print(run_table(result))
        console.print(f"results: {folder}", highlight=False, markup=False)


def json_summary(result, folder) -> dict:
    """What ``bench --json`` prints: the folder, the weights (random or tiny ones say so), the summary, the noise
    notes its figures carry and every other note, and the comparison with a --compare-baseline run."""
    from diffmeter.report.run_table import RANDOM_QUALITY
    from diffmeter.runs.speedups import noise_notes

    summary = {
        "folder": str(folder),
        "weights": result.weights,
        "weights_random": result.weights_random,
        "summary": result.summary.model_dump(mode="json"),
        "noise": noise_notes(result),
        "notes": result.notes,
    }
    if result.quality is not None:
        summary["quality"] = result.quality.model_dump(mode="json", exclude={"images"})
        if result.weights_random:  # the figures say so where they are, as the table's quality line does
            summary["quality"]["caveat"] = RANDOM_QUALITY.removeprefix("; ")
    if result.speedup is not None:
        summary["speedup"] = result.speedup.model_dump(mode="json")
    return summary


def _with_config_file(ctx: typer.Context, config: str | None) -> dict:
    """The command's values, with options left at their defaults taken from ``config``."""
    from diffmeter.optimize.options import read_config_file

    values = dict(ctx.params)
    values["file_optimizations"] = None
    if config is None:
        return values
    for key, value in read_config_file(config).items():
        if key == "optimizations":
            values["file_optimizations"] = value
        elif key not in values or key in ("model", "config"):
            raise DiffmeterError(f"config file {config}: unknown option '{key}' (use the bench option names)")
        elif ctx.get_parameter_source(key).name == "DEFAULT":  # by name: typer may vendor its own click
            values[key] = value
    return values


def _bench_spec(values: dict):
    from diffmeter.optimize.options import from_config, from_flags
    from diffmeter.runs.spec import BenchSpec

    optimizations = from_config(values["file_optimizations"]) if values["file_optimizations"] else []
    optimizations += from_flags(**{name: values[name] for name in OPTIMIZATION_FLAGS})
    return BenchSpec(
        model=values["model"],
        prompt=values["prompt"],
        prompts_file=values["prompts"],
        num_prompts=values["num_prompts"],
        batch_size=values["batch_size"],
        height=values["height"],
        width=values["width"],
        steps=values["steps"],
        guidance_scale=values["guidance_scale"],
        true_cfg_scale=values["true_cfg_scale"],
        image_sizes=list(image_sizes_of(values["image_size"])),
        no_image=values["no_image"],
        images=list(values["image"] or []),
        controlnet=values["controlnet"],
        control_guidance_start=values["control_guidance_start"],
        control_guidance_end=values["control_guidance_end"],
        controlnet_conditioning_scale=values["controlnet_conditioning_scale"],
        lora_rank=values["lora_rank"],
        lora_targets=[name.strip() for name in (values["lora_targets"] or "").split(",") if name.strip()],
        lora=values["lora"],
        fuse_lora=values["fuse_lora"],
        num_frames=values["num_frames"],
        max_sequence_length=values["max_sequence_length"],
        cfg_trunc_ratio=values["cfg_trunc_ratio"],
        resolution_binning=None if values["resolution_binning"] else False,
        seed=values["seed"],
        dtype=values["dtype"],
        component_dtypes=dict(parse_component_dtypes(values["component_dtype"])),
        device=values["device"],
        warmup=values["warmup"],
        iterations=values["iterations"],
        min_duration_s=values["min_duration"],
        target_precision=values["target_precision"],
        max_iterations=values["max_iterations"],
        random_weights=values["random_weights"],
        save_images=values["save_images"],
        peak_tflops=values["peak_tflops"],
        tf32=values["tf32"],
        optimizations=optimizations,
        compare_baseline=values["compare_baseline"],
        memory_check=values["memory_check"],
        trace=values["trace"],
        predict=values["predict"],
        ulysses_degree=values["ulysses_degree"],
        ring_degree=values["ring_degree"],
        tp_degree=values["tp_degree"],
        cfg_degree=values["cfg_degree"],
        pipefusion_degree=values["pipefusion_degree"],
        data_parallel=values["data_parallel"],
        engine=values["engine"],
    )


@command()
def show(
    folder: Annotated[
        str,
        typer.Argument(
            metavar="DIR", help="a run folder (or its results.json), or a ladder-*.json", show_default=False
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the stored result as JSON")] = False,
    ops: Annotated[
        bool, typer.Option("--ops", help="the top operators per stage of a run traced with --trace")
    ] = False,
) -> None:
    """Print a stored measured run (or ladder) as a table."""
    from pathlib import Path

    from diffmeter.report.run_table import run_table
    from diffmeter.runs.storage import read_result

    if Path(folder).name.startswith("ladder-") and Path(folder).is_file():
        from diffmeter.report.ladder_table import ladder_table
        from diffmeter.runs.ladder_record import read_ladder

        ladder = read_ladder(folder)
        if as_json:
            print(json.dumps(ladder.model_dump(mode="json"), indent=2))
        else:
            console.print(ladder_table(ladder))
        return
    if Path(folder).name.startswith("sweep-") and Path(folder).suffix == ".json" and Path(folder).is_file():
        raise DiffmeterError(
            f"{folder} is a sweep's record, not a run: `diffmeter table {Path(folder).parent}` shows its runs, "
            "`diffmeter show` one run folder of it"
        )
    result = read_result(folder)
    if ops:
        from diffmeter.measure.trace import read_ops
        from diffmeter.report.ops_table import ops_tables

        table = read_ops(result)
        if as_json:
            print(table.model_dump_json(indent=2))
        else:
            console.print(ops_tables(table))
    elif as_json:
        print(json.dumps(result.to_json_dict(), indent=2))
    else:
        console.print(run_table(result))


def _check_variables(ctx: typer.Context, values: dict) -> None:
    """A technique set by a DIFFMETER_* variable and refused is named by its variable, not as a flag the user
    never typed (DIFFMETER_COMPILE=bogus)."""
    from diffmeter.optimize import build
    from diffmeter.optimize.options import from_flags

    variables = {p.name: p.envvar for p in ctx.command.params if getattr(p, "envvar", None)}
    for name in OPTIMIZATION_FLAGS:
        if ctx.get_parameter_source(name).name != "ENVIRONMENT":  # by name: typer may vendor its own click
            continue
        try:
            partners = {"quantize": ("weights",), "weights": ("quantize",)}.get(name, ())  # gguf:TYPE and its file
            build(from_flags(**{key: values[key] for key in (name, *partners)}))
        except DiffmeterError as error:
            shown = values[name] if not isinstance(values[name], list) else ",".join(values[name])
            raise DiffmeterError(f"{variables[name]}={shown}: {error}") from None
