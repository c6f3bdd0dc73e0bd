"""`diffmeter profile`: compute from configs alone."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Annotated

import typer

from diffmeter.cli.app import command, console, note
from diffmeter.cli.options import (
    GENERATION,
    AsJson,
    BatchSize,
    CfgDegree,
    CfgTruncRatio,
    ComponentDtype,
    ControlGuidanceEnd,
    ControlGuidanceStart,
    ControlNet,
    ControlnetConditioningScale,
    Fp8TextEncoder,
    FuseLora,
    GpuName,
    GpuSpec,
    GuidanceScale,
    ImageSize,
    LoraFile,
    LoraRank,
    LoraTargets,
    MaxSequenceLength,
    NoImage,
    NumFrames,
    Offload,
    Opt,
    Quantize,
    ResolutionBinning,
    RingDegree,
    Tf32,
    TorchVersion,
    TpDegree,
    TrueCfgScale,
    UlyssesDegree,
    VaeSlicing,
    VaeTiling,
)
from diffmeter.cli.profile_output import print_predicted, print_profile, split_line
from diffmeter.cli.progress import progress_bar
from diffmeter.cli.value_lists import numbers, sizes
from diffmeter.errors import DiffmeterError
from diffmeter.predict.attention_kernels import torch_minor
from diffmeter.quiet import load_libraries


@command()
def profile(
    models: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="MODEL",
            help="catalog names or hub ids, local diffusers folders, or hub ids in the HF cache",
            show_default=False,
        ),
    ] = None,
    all_models: Annotated[bool, typer.Option("--all", help="profile every real catalog model")] = False,
    height: Annotated[
        str | None,
        typer.Option(
            metavar="N[,N...]",
            help="pixels, or a list for a scaling table; alone, the width follows",
            rich_help_panel=GENERATION,
        ),
    ] = None,
    width: Annotated[
        str | None,
        typer.Option(
            metavar="N[,N...]",
            help="pixels, a list paired with --height; alone, the height follows",
            rich_help_panel=GENERATION,
        ),
    ] = None,
    steps: Annotated[
        str | None,
        typer.Option(
            metavar="N[,N...]", help="denoising steps, or a list for a scaling table", rich_help_panel=GENERATION
        ),
    ] = None,
    batch_size: BatchSize = 1,
    guidance_scale: GuidanceScale = None,
    true_cfg_scale: TrueCfgScale = None,
    image_size: ImageSize = None,
    no_image: NoImage = False,
    controlnet: ControlNet = None,
    control_guidance_start: ControlGuidanceStart = None,
    control_guidance_end: ControlGuidanceEnd = None,
    controlnet_conditioning_scale: ControlnetConditioningScale = None,
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    lora: LoraFile = None,
    fuse_lora: FuseLora = False,
    num_frames: NumFrames = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            metavar="DTYPE",
            help="float16 | bfloat16 | float32 (parameter memory; with --gpu, the predicted memory and time too)",
            rich_help_panel=GENERATION,
        ),
    ] = None,
    component_dtype: ComponentDtype = None,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(
            help="real prompt tokens, where compute depends on it (Qwen-Image, Z-Image, CogView4, Lumina, Kandinsky 3)",
            rich_help_panel=GENERATION,
        ),
    ] = None,
    negative_prompt_tokens: Annotated[
        int | None, typer.Option(help="real negative-prompt tokens (Lumina-Image-2.0)", rich_help_panel=GENERATION)
    ] = None,
    max_sequence_length: MaxSequenceLength = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            help="count the generation with this sampler in place of the pipeline's scheduler, as bench's "
            "--opt scheduler:name=NAME runs it (its timesteps are the denoiser steps)",
            rich_help_panel=GENERATION,
        ),
    ] = None,
    cfg_trunc_ratio: CfgTruncRatio = None,
    instruction_tokens: Annotated[
        int | None,
        typer.Option(help="SANA: complex human instruction tokens (0: none)", rich_help_panel=GENERATION),
    ] = None,
    glyph_text: Annotated[
        bool | None,
        typer.Option(
            "--glyph-text/--no-glyph-text",
            help="HunyuanImage 2.1, HunyuanVideo 1.5: prompts quote text for the ByT5 glyph encoder "
            "(default: assumed, an upper bound)",
            rich_help_panel=GENERATION,
        ),
    ] = None,
    resolution_binning: ResolutionBinning = True,
    depth: Annotated[int, typer.Option(help="also break MACs down by module, this many levels deep")] = 0,
    jobs: Annotated[int, typer.Option(help="worker processes for several profiles (0: one per CPU)")] = 0,
    as_json: AsJson = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="print CSV, a row per component")] = False,
    ulysses_degree: UlyssesDegree = 1,
    ring_degree: RingDegree = 1,
    cfg_degree: CfgDegree = 1,
    tp_degree: TpDegree = 1,
    gpu: GpuName = None,
    gpu_spec: GpuSpec = None,
    tf32: Tf32 = True,
    torch_version: TorchVersion = None,
    offload: Offload = None,
    vae_tiling: VaeTiling = False,
    vae_slicing: VaeSlicing = False,
    quantize: Quantize = None,
    fp8_text_encoder: Fp8TextEncoder = False,
    opt: Opt = None,
) -> None:
    """Count MACs and FLOPs of a whole generation, per component, from configs alone; with --gpu, its peak
    memory (under bench's memory techniques, named as bench takes them) and time on that GPU."""
    from diffmeter.catalog import all_entries
    from diffmeter.flops.cached import cached_profile
    from diffmeter.lora_file import lora_fields
    from diffmeter.report.export import profiles_csv
    from diffmeter.report.tables import summary_table
    from diffmeter.spec import CPU_DTYPE, CPU_DTYPE_NOTE, ProfileSpec, asked_images, parse_component_dtypes

    names = list(models or [])
    if scheduler is not None:
        from diffmeter.families.schedule import SAMPLERS, sampler_refusal  # the families load torch: asked only

        if scheduler not in SAMPLERS:
            raise DiffmeterError(
                f"--scheduler {scheduler!r} is not a sampler diffmeter swaps in: {', '.join(SAMPLERS)}"
            )
        from diffmeter.catalog import resolve
        from diffmeter.families import get_family

        for name in names:  # refused as bench refuses it (optimize/scheduler.py)
            if why := sampler_refusal(scheduler, name, get_family(resolve(name).family).flow_matching):
                raise DiffmeterError(f"--scheduler: {why}")
    if all_models and names:
        raise DiffmeterError(f"--all profiles every catalog model: drop {' '.join(names)}, or drop --all")
    if all_models:
        names = [entry.name for entry in all_entries() if not entry.is_tiny]
    if not names:
        raise DiffmeterError("name a MODEL (see `diffmeter models`) or pass --all")
    if as_json and as_csv:
        raise DiffmeterError("--json and --csv are two output formats: pick one")
    if depth < 0:
        raise DiffmeterError(f"--depth must be 0 or more, got {depth}")
    if jobs < 0:
        raise DiffmeterError(f"--jobs must be 0 (one per CPU) or more, got {jobs}")
    flags = dict(
        offload=offload,
        vae_tiling=vae_tiling,
        vae_slicing=vae_slicing,
        quantize=quantize,
        fp8_text_encoder=fp8_text_encoder,
        opt=opt,
    )
    refuse_without_gpu(flags, bool(gpu or gpu_spec), tf32, torch_version)  # before any counting
    from diffmeter.predict.devices import is_this_cpu

    if dtype is None and is_this_cpu(gpu):
        dtype = CPU_DTYPE  # what bench runs on a CPU
        note(CPU_DTYPE_NOTE, as_json or as_csv)
    adapters = {}
    for name in names:
        adapters[name], lora_notes = lora_fields(name, lora_rank, lora_targets, lora, fuse_lora)
        for text in lora_notes:
            note(text, as_json or as_csv)
    specs = [
        ProfileSpec(
            model=name,
            height=h,
            width=w,
            steps=n,
            batch_size=batch_size,
            guidance_scale=guidance_scale,
            true_cfg_scale=true_cfg_scale,
            image_sizes=asked_images(image_size, no_image),
            controlnet=controlnet,
            control_guidance_start=control_guidance_start,
            control_guidance_end=control_guidance_end,
            controlnet_conditioning_scale=controlnet_conditioning_scale,
            **adapters[name],
            num_frames=num_frames,
            dtype=dtype,
            component_dtypes=parse_component_dtypes(component_dtype),
            prompt_tokens=prompt_tokens,
            negative_prompt_tokens=negative_prompt_tokens,
            instruction_tokens=instruction_tokens,
            glyph_text=glyph_text,
            max_sequence_length=max_sequence_length,
            scheduler=scheduler,
            cfg_trunc_ratio=cfg_trunc_ratio,
            resolution_binning=None if resolution_binning else False,
        )
        for name, (h, w), n in itertools.product(names, sizes(height, width), numbers(steps, "--steps"))
    ]
    for spec in specs:  # a value no run takes is refused before any counting (--steps 0 took 9 s to refuse)
        spec.check()
    if (height is None) != (width is None):  # 832x832 where a user of --width 832 may have meant 832x480
        given, other = ("--height", "width") if width is None else ("--width", "height")
        note(f"{given} alone: the {other} follows it (a square); give both for another shape", as_json or as_csv)
    if all_models:
        specs = runnable(specs, as_json or as_csv)
    elif no_image:
        refuse_no_image(specs)
    results = [cached_profile(spec, depth) for spec in specs]  # answered before: no library to load
    missing = [spec for spec, found in zip(specs, results, strict=True) if found is None]
    if missing:
        load_libraries()
        from diffmeter.flops.profile import profile_many

        with progress_bar(False) as progress:
            report = (lambda finished, total: progress("profiling", finished, total)) if progress else None
            counted = iter(profile_many(missing, depth=depth, jobs=jobs, done=report))
        results = [found if found is not None else next(counted) for found in results]
    split = None
    degrees = "--ulysses-degree/--ring-degree/--cfg-degree/--tp-degree"
    group = (ulysses_degree, ring_degree, cfg_degree, tp_degree)
    if min(group) < 1:
        raise DiffmeterError(f"{degrees} are GPU counts: 1 or more, got {' '.join(map(str, group))}")
    parallel = group if ulysses_degree * ring_degree * cfg_degree * tp_degree > 1 else None
    if parallel and len(results) != 1:
        raise DiffmeterError(f"{degrees} count one profile: name one model, size and step count")
    if tp_degree > 1 and not (gpu or gpu_spec):
        raise DiffmeterError(
            "--tp-degree is predicted with --gpu NAME (or --gpu-spec): each GPU's shard of the denoiser, its memory "
            "and the all-reduces in the time"
        )
    if parallel and not (gpu or gpu_spec):
        load_libraries()
        from diffmeter.distributed.communication import per_gpu_step

        split = per_gpu_step(results[0], specs[0], ulysses_degree, ring_degree, cfg_degree)  # tp: refused above
    if gpu or gpu_spec:
        print_predicted(specs, results, gpu, gpu_spec, as_json, as_csv, flags, tf32, parallel, torch_version, lora)
    elif as_json:
        if split is not None:  # one profile (more are refused above)
            from diffmeter.predict.predicted_profile import with_prediction

            payload = with_prediction(results[0], context_parallel_per_gpu_step=split)
        elif len(results) == 1:
            payload = results[0].to_json_dict()
        else:
            payload = {"profiles": [p.to_json_dict() for p in results]}
        print(json.dumps(payload, indent=2))
    elif as_csv:
        sys.stdout.write(profiles_csv(results))
    elif len(results) == 1:
        print_profile(results[0], specs[0])
        if split is not None:
            console.print(split_line(split), highlight=False, markup=False)
    else:
        console.print(summary_table(results))


def refuse_without_gpu(flags: dict, gpu: bool, tf32: bool, torch_version: str | None) -> None:
    """What only a prediction reads (bench's technique flags, --no-tf32, --torch-version) refused without --gpu,
    naming the flags given."""
    if torch_version is not None and not gpu:
        raise DiffmeterError("--torch-version changes the predicted time, not the count: add --gpu NAME")
    if torch_version is not None and torch_minor(torch_version) is None:
        raise DiffmeterError(f"--torch-version {torch_version!r} is not a torch version: give it as 2.11 or 2.11.0")
    if not tf32 and not gpu:
        raise DiffmeterError("--no-tf32 changes the predicted time, not the count: add --gpu NAME (or --gpu-spec)")
    from diffmeter.quantization_spec import parse

    for value in flags["quantize"] or []:
        parse(value)  # a format bench would not take is named first, in bench's words
    if flags["offload"] or flags["opt"]:  # likewise a technique's name or parameters (--offload banana)
        from diffmeter.optimize import build
        from diffmeter.optimize.options import from_flags

        build(from_flags(**{**flags, "quantize": None}))
    given = [flag_text(name, value) for name, value in flags.items() if value]
    if given and not gpu:
        raise DiffmeterError(
            f"{' '.join(given)} needs a device to predict for: add --gpu NAME (diffmeter gpus lists them), --gpu-spec "
            "or --gpu cpu; without one, profile counts the plain run's MACs"
        )


def flag_text(name: str, value) -> str:
    """An option as it was given: ``--quantize bnb:nf4``, ``--vae-tiling``, ``--opt a --opt b``."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return flag
    return " ".join(f"{flag} {item}" for item in (value if isinstance(value, list) else [value]))


def refuse_no_image(specs: list) -> None:
    """``--no-image`` on a model that takes no input image: refused as ``--image-size`` is, and as bench refuses it."""
    from diffmeter.catalog import entry_of
    from diffmeter.families import get_family
    from diffmeter.families.images import refuse_no_image as refuse

    for spec in specs:
        entry = entry_of(spec)
        refuse(get_family(entry.family), entry)


def runnable(specs: list, machine_readable: bool) -> list:
    """``--all``'s specs less those whose pipeline refuses the settings (DiT at another size), each left out with
    a note naming why; an error when every one is refused. Answered before: from the disk cache, no library loaded."""
    from diffmeter.flops.cached import cached_refusal, remember_refusal

    kept = []
    for spec in specs:
        known, why = cached_refusal(spec)
        if not known:
            load_libraries()
            from diffmeter.flops.profile import refusal

            why = refusal(spec)
            remember_refusal(spec, why)
        if why is None:
            kept.append(spec)
        else:
            note(f"left out {spec.model}: {why}", machine_readable)
    if not kept:
        raise DiffmeterError("--all: every catalog model refuses these settings (notes above); change them")
    return kept
