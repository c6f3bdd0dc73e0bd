"""The `diffmeter` command line."""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console

from diffmeter.errors import DiffmeterError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure diffusion-model inference.")
console = Console(width=None if sys.stdout.isatty() else 160)


def _numbers(text: str | None, option: str, kind=int) -> list:
    """Parse '512,768,1024' into numbers, or fail with one clear line."""
    if text is None:
        return [None]
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DiffmeterError(f"{option} takes numbers separated by commas, got '{text}'") from None


def _sizes(height: str | None, width: str | None) -> list[tuple[int | None, int | None]]:
    heights, widths = _numbers(height, "--height"), _numbers(width, "--width")
    if width is None:
        return [(h, h) for h in heights]
    if height is None:
        return [(w, w) for w in widths]
    if len(heights) != len(widths):
        raise DiffmeterError("--height and --width lists must have the same length (they are paired)")
    return list(zip(heights, widths, strict=True))


def _version(value: bool) -> None:
    if value:
        from diffmeter import __version__

        print(f"diffmeter {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Measure diffusion-model inference: exact MACs/FLOPs per component, from configs alone."""


@app.command()
def profile(
    models: Annotated[
        list[str] | None,
        typer.Argument(metavar="MODEL", help="catalog name or hub id, local diffusers dir, or hub id in the HF cache"),
    ] = None,
    all_models: Annotated[bool, typer.Option("--all", help="profile every real catalog model")] = False,
    height: Annotated[str | None, typer.Option(help="pixels; a comma list for a scaling table (width follows)")] = None,
    width: Annotated[str | None, typer.Option(help="pixels; comma list paired with --height")] = None,
    steps: Annotated[str | None, typer.Option(help="denoising steps; a comma list for a scaling table")] = None,
    batch_size: Annotated[int, typer.Option(help="prompts per generation")] = 1,
    guidance_scale: Annotated[float | None, typer.Option(help="CFG scale; <= 1 disables CFG")] = None,
    num_frames: Annotated[int | None, typer.Option(help="video models: frames")] = None,
    dtype: Annotated[str | None, typer.Option(help="float16 | bfloat16 | float32 (parameter memory)")] = None,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(help="real prompt tokens, for pipelines whose compute depends on it (Kandinsky 3, Lumina)"),
    ] = None,
    negative_prompt_tokens: Annotated[
        int | None, typer.Option(help="real negative-prompt tokens (Lumina-Image-2.0)")
    ] = None,
    max_sequence_length: Annotated[
        int | None, typer.Option(help="the pipeline's max_sequence_length: tokens of its T5/Gemma/UMT5 encoder")
    ] = None,
    instruction_tokens: Annotated[
        int | None, typer.Option(help="SANA: tokens of the complex human instruction")
    ] = None,
    resolution_binning: Annotated[
        bool, typer.Option(help="snap sizes to the pipeline's aspect-ratio bins, as PixArt/SANA/HunyuanDiT do")
    ] = True,
    depth: Annotated[int, typer.Option(help="also break MACs down by module, this many levels deep")] = 0,
    jobs: Annotated[int, typer.Option(help="worker processes for several profiles (default: CPU count)")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="print CSV, a row per component")] = False,
) -> None:
    """Count MACs and FLOPs of a whole generation, per component, from configs alone."""
    from diffmeter.catalog import all_entries
    from diffmeter.flops.profile import profile_many
    from diffmeter.report.export import profiles_csv
    from diffmeter.report.tables import profile_table, summary_table
    from diffmeter.spec import ProfileSpec

    names = list(models or [])
    if all_models:
        names += [entry.name for entry in all_entries() if not entry.is_tiny]
    if not names:
        raise DiffmeterError("name a MODEL (see `diffmeter models`) or pass --all")
    if depth < 0:
        raise DiffmeterError(f"--depth must be 0 or more, got {depth}")
    if jobs < 0:
        raise DiffmeterError(f"--jobs must be 0 (one per CPU) or more, got {jobs}")
    specs = [
        ProfileSpec(
            model=name,
            height=h,
            width=w,
            steps=n,
            batch_size=batch_size,
            guidance_scale=guidance_scale,
            num_frames=num_frames,
            dtype=dtype,
            prompt_tokens=prompt_tokens,
            negative_prompt_tokens=negative_prompt_tokens,
            instruction_tokens=instruction_tokens,
            max_sequence_length=max_sequence_length,
            resolution_binning=None if resolution_binning else False,
        )
        for name, (h, w), n in itertools.product(names, _sizes(height, width), _numbers(steps, "--steps"))
    ]
    results = profile_many(specs, depth=depth, jobs=jobs)
    if as_json:
        payload = results[0].to_json_dict() if len(results) == 1 else {"profiles": [p.to_json_dict() for p in results]}
        print(json.dumps(payload, indent=2))
    elif as_csv:
        sys.stdout.write(profiles_csv(results))
    elif len(results) == 1:
        console.print(profile_table(results[0]))
    else:
        console.print(summary_table(results))


@app.command()
def models(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """List the catalog: family, components, parameters and defaults."""
    from diffmeter.catalog import all_entries
    from diffmeter.parallel import parallel_map
    from diffmeter.report.tables import catalog_table

    entries = list(all_entries())
    params = dict(zip((e.id for e in entries), parallel_map(_entry_params, entries), strict=True))
    if as_json:
        rows = [
            {
                "name": e.name,
                "id": e.id,
                "aliases": e.aliases,
                "family": e.family,
                "origin": e.origin,
                "components": {n: c.class_name for n, c in e.components.items()},
                "params": params[e.id],
                "defaults": e.defaults.model_dump(),
                "text_max_length": e.text_max_length,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
    else:
        console.print(catalog_table(entries, params))


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
    "fp8_text_encoder",
    "opt",
)
OPT = "optimizations (also from --config FILE or DIFFMETER_* variables)"


@app.command()
def bench(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL",
            help="catalog name or hub id (weights from the HF cache), local diffusers dir, or a tiny-* entry",
        ),
    ],
    prompt: Annotated[str | None, typer.Option(help="one prompt for every image")] = None,
    prompts: Annotated[
        str | None, typer.Option(metavar="FILE", help="prompts from a .txt (a line each), .jsonl or .csv file")
    ] = None,
    num_prompts: Annotated[
        int | None, typer.Option(help="prompts sampled with the seed (default: batch-size x iterations)")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="images per pipeline call")] = 1,
    height: Annotated[int | None, typer.Option(help="pixels (default: the model's)")] = None,
    width: Annotated[int | None, typer.Option(help="pixels (default: the model's)")] = None,
    steps: Annotated[int | None, typer.Option(help="denoising steps (default: the model's)")] = None,
    guidance_scale: Annotated[float | None, typer.Option(help="CFG scale; <= 1 disables CFG")] = None,
    num_frames: Annotated[int | None, typer.Option(help="video models: frames")] = None,
    max_sequence_length: Annotated[int | None, typer.Option(help="tokens of the T5/Gemma/UMT5 encoder")] = None,
    resolution_binning: Annotated[
        bool, typer.Option(help="let PixArt/SANA/HunyuanDiT snap sizes to their aspect-ratio bins")
    ] = True,
    seed: Annotated[int, typer.Option(help="image n gets seed + n; also samples the prompts")] = 0,
    dtype: Annotated[
        str | None,
        typer.Option(help="bf16 | fp16 | fp32 (default: the model's on CUDA, fp32 on CPU)", envvar="DIFFMETER_DTYPE"),
    ] = None,
    device: Annotated[str | None, typer.Option(help="cuda, cuda:N or cpu (default: cuda when present)")] = None,
    warmup: Annotated[int, typer.Option(help="untimed calls first; the first is reported as the cold call")] = 1,
    iterations: Annotated[int, typer.Option(help="measured calls")] = 3,
    min_duration: Annotated[float, typer.Option(help="keep measuring until this many seconds have passed")] = 0.0,
    random_weights: Annotated[
        bool, typer.Option(help="real-size model with random weights from the catalog config (no download)")
    ] = False,
    save_images: Annotated[bool, typer.Option(help="write the generated images to images/")] = True,
    peak_tflops: Annotated[
        float | None, typer.Option(help="the device's peak TFLOP/s for MFU (default: from the datasheet table)")
    ] = None,
    tf32: Annotated[
        bool | None,
        typer.Option("--tf32/--no-tf32", help="TF32 matmuls (default: on for CUDA)", envvar="DIFFMETER_TF32"),
    ] = None,
    compile: Annotated[
        str | None,
        typer.Option(
            help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
            envvar="DIFFMETER_COMPILE",
            rich_help_panel=OPT,
        ),
    ] = None,
    compile_fullgraph: Annotated[
        bool, typer.Option(envvar="DIFFMETER_COMPILE_FULLGRAPH", help="fullgraph=True", rich_help_panel=OPT)
    ] = False,
    compile_regional: Annotated[
        bool,
        typer.Option(envvar="DIFFMETER_COMPILE_REGIONAL", help="compile the repeated blocks only", rich_help_panel=OPT),
    ] = False,
    compile_components: Annotated[
        str | None,
        typer.Option(
            envvar="DIFFMETER_COMPILE_COMPONENTS", help="comma list (default: the denoiser)", rich_help_panel=OPT
        ),
    ] = None,
    compile_inductor_flags: Annotated[
        bool,
        typer.Option(
            envvar="DIFFMETER_COMPILE_INDUCTOR_FLAGS", help="the seed's inductor settings", rich_help_panel=OPT
        ),
    ] = False,
    channels_last: Annotated[
        bool, typer.Option(help="channels_last memory format for compiled components", rich_help_panel=OPT)
    ] = False,
    attention: Annotated[
        str | None,
        typer.Option(
            help="diffusers attention backend: native, flash, _flash_3, sage, xformers, flex, ...",
            envvar="DIFFMETER_ATTENTION",
            rich_help_panel=OPT,
        ),
    ] = None,
    sdpa_kernel: Annotated[
        str | None,
        typer.Option(
            help="SDPA kernel for models calling SDPA directly: flash, efficient, cudnn, math",
            envvar="DIFFMETER_SDPA_KERNEL",
            rich_help_panel=OPT,
        ),
    ] = None,
    fuse_qkv: Annotated[
        bool, typer.Option(help="fuse Q/K/V projections", envvar="DIFFMETER_FUSE_QKV", rich_help_panel=OPT)
    ] = False,
    cache: Annotated[
        str | None,
        typer.Option(
            help="first-block-cache, pab, faster-cache, taylorseer, mag-cache, deep-cache, cache-dit",
            envvar="DIFFMETER_CACHE",
            rich_help_panel=OPT,
        ),
    ] = None,
    cache_threshold: Annotated[
        float | None,
        typer.Option(help="threshold of the cache", envvar="DIFFMETER_CACHE_THRESHOLD", rich_help_panel=OPT),
    ] = None,
    cache_interval: Annotated[
        int | None,
        typer.Option(help="interval / skip range of the cache", envvar="DIFFMETER_CACHE_INTERVAL", rich_help_panel=OPT),
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            help="ddim, dpm++2m, dpm++2m-karras, euler, unipc, flow-euler",
            envvar="DIFFMETER_SCHEDULER",
            rich_help_panel=OPT,
        ),
    ] = None,
    offload: Annotated[
        str | None,
        typer.Option(help="CPU offload: model, sequential, group", envvar="DIFFMETER_OFFLOAD", rich_help_panel=OPT),
    ] = None,
    vae_tiling: Annotated[bool, typer.Option(envvar="DIFFMETER_VAE_TILING", rich_help_panel=OPT)] = False,
    vae_slicing: Annotated[bool, typer.Option(envvar="DIFFMETER_VAE_SLICING", rich_help_panel=OPT)] = False,
    quantize: Annotated[
        str | None,
        typer.Option(help="torchao weight-only: int8, fp8", envvar="DIFFMETER_QUANTIZE", rich_help_panel=OPT),
    ] = None,
    fp8_text_encoder: Annotated[
        bool,
        typer.Option(help="float8 storage for T5/UMT5/Gemma", envvar="DIFFMETER_FP8_TEXT_ENCODER", rich_help_panel=OPT),
    ] = False,
    opt: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME[:k=v,...]", help="any technique and parameter, repeatable", rich_help_panel=OPT),
    ] = None,
    compare_baseline: Annotated[
        bool, typer.Option(help="also run without optimizations; store PSNR/SSIM against it", rich_help_panel=OPT)
    ] = False,
    config: Annotated[
        str | None,
        typer.Option(
            metavar="FILE", help="YAML/JSON file of these options; flags and variables win", envvar="DIFFMETER_CONFIG"
        ),
    ] = None,
    out: Annotated[
        str, typer.Option(help="folder that receives one run folder per spec", envvar="DIFFMETER_OUT")
    ] = "results",
    force: Annotated[bool, typer.Option(help="replace an existing result for the same spec")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress and no table")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result summary as JSON")] = False,
) -> None:
    """Run real generations and measure them: per-stage latency, memory, energy and MFU,
    with speed-ups applied by name and their quality cost against the unoptimized images."""
    from diffmeter.bench.runner import bench as run_bench
    from diffmeter.report.run_table import run_table

    values = _with_config_file(ctx, config)
    spec = _bench_spec(values)
    with _progress(quiet or as_json) as progress:
        result, folder = run_bench(spec, out=values["out"], force=force, progress=progress)
    if as_json:
        summary = {"folder": str(folder), "summary": result.summary.model_dump(mode="json")}
        if result.quality is not None:
            summary["quality"] = result.quality.model_dump(mode="json", exclude={"images"})
        print(json.dumps(summary, indent=2))
    elif not quiet:
        console.print(run_table(result))
        console.print(f"results: {folder}", highlight=False)


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
    from diffmeter.bench.spec import BenchSpec
    from diffmeter.optimize.options import from_config, from_flags

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
        num_frames=values["num_frames"],
        max_sequence_length=values["max_sequence_length"],
        resolution_binning=None if values["resolution_binning"] else False,
        seed=values["seed"],
        dtype=values["dtype"],
        device=values["device"],
        warmup=values["warmup"],
        iterations=values["iterations"],
        min_duration_s=values["min_duration"],
        random_weights=values["random_weights"],
        save_images=values["save_images"],
        peak_tflops=values["peak_tflops"],
        tf32=values["tf32"],
        optimizations=optimizations,
        compare_baseline=values["compare_baseline"],
    )


@app.command()
def show(
    folder: Annotated[
        str, typer.Argument(metavar="DIR", help="a run folder (or its results.json), or a ladder-*.json")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the stored result as JSON")] = False,
) -> None:
    """Print a stored measured run (or ladder) as a table."""
    from pathlib import Path

    from diffmeter.bench.storage import read_ladder, read_result
    from diffmeter.report.run_table import run_table

    if Path(folder).name.startswith("ladder-") and Path(folder).is_file():
        from diffmeter.report.ladder_table import ladder_table

        ladder = read_ladder(folder)
        if as_json:
            print(json.dumps(ladder.model_dump(mode="json"), indent=2))
        else:
            console.print(ladder_table(ladder))
        return
    result = read_result(folder)
    if as_json:
        print(json.dumps(result.to_json_dict(), indent=2))
    else:
        console.print(run_table(result))


@app.command()
def optimizations(
    model: Annotated[str | None, typer.Argument(metavar="[MODEL]", help="say which techniques apply to MODEL")] = None,
    device: Annotated[str, typer.Option(help="the device the run would use (cuda or cpu)")] = "cuda",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The optimization registry: every technique, and which apply to a model and why not."""
    import torch

    import diffmeter.optimize  # noqa: F401  (registers the techniques)
    from diffmeter.catalog import all_entries, resolve
    from diffmeter.optimize.matrix import compatibility
    from diffmeter.report.optimizations_table import matrix_table, model_table

    target_device = torch.device(device)
    if model is not None:
        entry = resolve(model)
        rows = compatibility(entry, target_device)
        if as_json:
            print(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
        else:
            console.print(model_table(f"optimizations for {entry.name} ({entry.id}) on {device}", rows))
        return
    families = {}
    for entry in all_entries():
        if entry.origin == "catalog":
            families.setdefault(entry.family, entry)
    columns = {family: compatibility(entry, target_device) for family, entry in families.items()}
    names = [row.name for row in next(iter(columns.values()))]
    matrix = {name: [next(r for r in rows if r.name == name) for rows in columns.values()] for name in names}
    if as_json:
        payload = {
            name: {family: cell.model_dump(mode="json") for family, cell in zip(columns, cells, strict=True)}
            for name, cells in matrix.items()
        }
        print(json.dumps(payload, indent=2))
    else:
        title = f"optimizations x families on {device} (one catalog model per family)"
        console.print(matrix_table(title, [f"{f}" for f in columns], matrix))


@app.command()
def ladder(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="as for bench")],
    rungs: Annotated[
        str, typer.Option(help="techniques added in turn: scheduler, compile, half, attention, cache")
    ] = "scheduler,compile,half,attention,cache",
    steps: Annotated[int | None, typer.Option(help="baseline steps (default: the model's)")] = None,
    fast_steps: Annotated[
        int | None, typer.Option(help="steps from the scheduler rung on (default: min(20, steps))")
    ] = None,
    compile_mode: Annotated[str, typer.Option(help="torch.compile mode of the compile rung")] = "default",
    batch_size: Annotated[int, typer.Option(help="images per call")] = 1,
    height: Annotated[int | None, typer.Option(help="pixels")] = None,
    width: Annotated[int | None, typer.Option(help="pixels")] = None,
    seed: Annotated[int, typer.Option(help="image n gets seed + n")] = 0,
    device: Annotated[str | None, typer.Option(help="cuda, cuda:N or cpu")] = None,
    warmup: Annotated[int, typer.Option(help="untimed calls per rung, the first one cold")] = 1,
    iterations: Annotated[int, typer.Option(help="measured calls per rung")] = 3,
    random_weights: Annotated[bool, typer.Option(help="real-size model with random weights")] = False,
    out: Annotated[str, typer.Option(help="folder for the rung runs and ladder-*.json")] = "results",
    force: Annotated[bool, typer.Option(help="re-run rungs already stored in --out")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the ladder as JSON")] = False,
) -> None:
    """The seed tutorial's table, measured: baseline, then one technique added per rung, each
    with time, speed-up, peak memory, energy and quality against the baseline images."""
    from diffmeter.bench.ladder import climb, plan
    from diffmeter.bench.spec import BenchSpec
    from diffmeter.report.ladder_table import ladder_table

    spec = BenchSpec(
        model=model,
        steps=steps,
        batch_size=batch_size,
        height=height,
        width=width,
        seed=seed,
        device=device,
        warmup=warmup,
        iterations=iterations,
        random_weights=random_weights,
    )
    names = tuple(part.strip() for part in rungs.split(",") if part.strip())
    planned = plan(spec, names, fast_steps, compile_mode)
    with _progress(as_json) as progress:
        result = climb(planned, out, force=force, progress=progress)
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        console.print(ladder_table(result))


@contextmanager
def _progress(disabled: bool):
    """A rich progress line on stderr for ``bench``; none when disabled or stderr is not a terminal."""
    stderr = Console(stderr=True)
    if disabled or not stderr.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def update(what: str, done: int, total: int | None) -> None:
            bar.update(task, description=what, completed=done, total=total)

        yield update


def _entry_params(entry) -> int:
    from diffmeter.flops.profile import MetaComponent

    return sum(MetaComponent(component).params for component in entry.components.values())


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2."""
    import diffusers  # imported quietly by the package
    import transformers

    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    try:
        app(standalone_mode=False)
    except DiffmeterError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        Console(stderr=True).print("interrupted: nothing was stored for the unfinished run", highlight=False)
        raise SystemExit(130) from None
    except Exception as error:  # click usage errors carry their own exit code
        import click

        if isinstance(error, click.ClickException):
            error.show()
            raise SystemExit(error.exit_code) from None
        raise


if __name__ == "__main__":
    main()
