"""`diffmeter fit`: which memory settings let a generation fit a GPU, by predicted time where known (``predict/``)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated

import typer

from diffmeter.cli.app import command, console, note
from diffmeter.cli.options import (
    GENERATION,
    AsJson,
    BatchSize,
    ComponentDtype,
    ControlNet,
    FuseLora,
    GpuName,
    GpuSpec,
    GuidanceScale,
    Height,
    ImageSize,
    LoraFile,
    LoraRank,
    LoraTargets,
    NoImage,
    NumFrames,
    Steps,
    Tf32,
    TrueCfgScale,
    Width,
)
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import load_libraries
from diffmeter.spec import sizes_text
from diffmeter.units import counted, gib

#: the settings the table lists without --all-settings
TOP = 12


@command()
def fit(
    model: Annotated[
        str | None,
        typer.Argument(
            metavar="MODEL", help="catalog name, hub id, local diffusers folder or tiny-* entry", show_default=False
        ),
    ] = None,
    all_models: Annotated[
        bool,
        typer.Option(
            "--all", help="the predicted leaderboard: every catalog model at its defaults on every GPU of the table"
        ),
    ] = False,
    html: Annotated[
        Path | None, typer.Option(metavar="FILE", help="with --all: the page (default leaderboard.html)")
    ] = None,
    csv: Annotated[Path | None, typer.Option(metavar="FILE", help="with --all: also the rows as CSV")] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help='GPU memory to fit in, e.g. "22.5GB" (read as GiB: nvidia-smi\'s 23034MiB is 22.5GB) or "23034MiB"',
        ),
    ] = None,
    gpu: GpuName = None,
    gpu_spec: GpuSpec = None,
    tf32: Tf32 = True,
    height: Height = None,
    width: Width = None,
    steps: Steps = None,
    batch_size: BatchSize = 1,
    guidance_scale: GuidanceScale = None,
    true_cfg_scale: TrueCfgScale = None,
    image_size: ImageSize = None,
    no_image: NoImage = False,
    controlnet: ControlNet = None,
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    lora: LoraFile = None,
    fuse_lora: FuseLora = False,
    num_frames: NumFrames = None,
    dtype: Annotated[
        str | None, typer.Option(metavar="DTYPE", help="float16 | bfloat16 | float32", rich_help_panel=GENERATION)
    ] = None,
    component_dtype: ComponentDtype = None,
    all_settings: Annotated[
        bool, typer.Option("--all-settings", help=f"list every setting that fits, not the first {TOP}")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """List the memory settings (offload, quantized formats on the denoiser, VAE tiling, fp8 text encoder) that bench
    can run and whose predicted peak fits the GPU once the CUDA context and libraries are held back, on a named CUDA
    GPU also with the speed-ups bench combines with them (torch.compile, reduce-overhead, a first-block cache): each
    with its predicted lower bound of time, its expected range where every technique of it is timed (ranked by it;
    the rest follow, saying why) and its quality cost. With --all: the predicted leaderboard, every catalog model on
    every GPU (or --gpu's), as a sortable page and CSV."""
    from diffmeter.catalog import entry_of
    from diffmeter.lora_file import lora_fields
    from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, other_cards
    from diffmeter.predict.gpu_spec import chosen_gpu, spec_gpu
    from diffmeter.report.memory_table import fit_table, runtime
    from diffmeter.spec import CPU_DTYPE, CPU_DTYPE_NOTE, ProfileSpec, asked_images, parse_component_dtypes

    if all_models:
        from diffmeter.cli.leaderboard import leaderboard

        if model or memory:
            raise DiffmeterError("--all predicts every catalog model on the table's GPUs: drop MODEL and --memory")
        given = {
            "--height": height, "--width": width, "--steps": steps, "--guidance-scale": guidance_scale,
            "--true-cfg-scale": true_cfg_scale, "--image-size": image_size, "--no-image": no_image,
            "--num-frames": num_frames,
            "--controlnet": controlnet,
            "--lora-rank": lora_rank, "--lora": lora, "--fuse-lora": fuse_lora,
            "--dtype": dtype, "--component-dtype": component_dtype,
            "--batch-size": None if batch_size == 1 else batch_size,
            "--no-tf32": not tf32,
        }  # fmt: skip
        given["--all-settings"] = all_settings
        if named := [flag for flag, value in given.items() if value]:
            raise DiffmeterError(f"--all predicts each model at its catalog defaults: drop {', '.join(named)}")
        return leaderboard(gpu, html, csv, as_json, gpu_spec)
    if html or csv:
        raise DiffmeterError("--html and --csv write the leaderboard: add --all")
    if model is None:
        raise DiffmeterError("name a MODEL (see `diffmeter models`), or pass --all for every catalog model")
    if memory is None and gpu is None and gpu_spec is None:
        raise DiffmeterError("give the memory to fit in: --memory 24GB, --gpu NAME, or --gpu-spec FIGURES")
    given = spec_gpu(_memory(memory)).model_copy(update={"name": _memory_name(memory)}) if memory else None
    target = chosen_gpu(gpu, gpu_spec) if gpu or gpu_spec else given
    if others := other_cards(gpu):
        note(others, as_json)
    if target is not given and given:  # a card sold in several memory sizes (the V100's 16 and 32 GB), or --gpu-spec
        if target.memory_bytes:  # without its memory, takes its size from --memory
            raise DiffmeterError(
                "--gpu-spec gives the memory already: drop --memory"
                if gpu_spec
                else f"{target.name} has one memory size in the table: drop --memory, or --gpu for another"
            )
        target = target.model_copy(update={"memory_bytes": given.memory_bytes})
    if not target.memory_bytes:
        raise DiffmeterError(
            "--gpu-spec gives no memory: add it (e.g. 80GB) or --memory"
            if gpu_spec
            else f"{target.name} comes in several memory sizes: add --memory (e.g. --memory 32GB)"
        )
    held = CUDA_HOLDBACK_BYTES if target.kind == "cuda" else 0  # the CPU's memory keeps no CUDA context
    if dtype is None and target.kind == "cpu":
        dtype = CPU_DTYPE  # what bench runs on a CPU
        note(CPU_DTYPE_NOTE, as_json)
    usable = target.memory_bytes - held
    if usable <= 0:
        raise DiffmeterError(
            f"{target.name}: {gib(target.memory_bytes)} is not more than the {gib(held)} held back for "
            f"{runtime(target)}'s context and libraries; give the card's whole memory, such as --memory 12GB"
        )
    spec = ProfileSpec(
        model=model,
        height=height,
        width=width,
        steps=steps,
        batch_size=batch_size,
        guidance_scale=guidance_scale,
        true_cfg_scale=true_cfg_scale,
        image_sizes=asked_images(image_size, no_image),  # none given: the catalog call's; --no-image: none
        controlnet=controlnet,
        **lora_fields(model, lora_rank, lora_targets, lora, fuse_lora)[0],
        num_frames=num_frames,
        dtype=dtype,
        component_dtypes=parse_component_dtypes(component_dtype),
    )
    entry = entry_of(spec)
    if no_image:
        from diffmeter.families import get_family
        from diffmeter.families.images import refuse_no_image

        refuse_no_image(get_family(entry.family), entry)
    from diffmeter.predict.cached import cached_memory_and_work
    from diffmeter.predict.fit_formats import with_fit_formats
    from diffmeter.predict.kernel_kinds import of_architecture
    from diffmeter.predict.techniques import borderline, fitting
    from diffmeter.runs.fit_speedups import (
        SettingWork,
        bench_flags,
        graphs_as_default,
        is_speedup,
        no_faster,
        optimization,
        quicker_borderline,
        ranked,
        timed,
        with_speedups,
    )
    from diffmeter.runs.fitting import (
        format_times,
        held_out_claims,
        lower_times,
        next_step,
        plain_time,
        quality_costs,
        runnable,
        time_note,
        why_untimed,
    )
    from diffmeter.runs.leaderboard import table_gpus

    on_cuda = target.kind == "cuda"  # a CPU run has no cuDNN copies of its convolutions (as bench predicts it)
    found = cached_memory_and_work(spec, on_cuda)  # asked before: no library to load
    if found is None:
        load_libraries()
        from diffmeter.predict.operators import predict_memory_and_work

        found = predict_memory_and_work(spec, on_cuda)  # one fake run for the memory and the time
    prediction, work = found
    if on_cuda:  # the --quantize BACKEND:TYPE formats fit offers on the denoisers (bench runs them on CUDA)
        prediction = with_fit_formats(prediction, spec, of_architecture(target.architecture))  # quanto's kernels
    # fp8 weights need FP8 tensor cores: a table GPU says whether it has them; a bare --memory is not refused
    fp8 = gpu is None or "fp8" in target.tflops
    settled = spec.with_defaults(entry.defaults)
    plain = plain_time(work, prediction, target, tf32=tf32)
    speeds = bool(plain and on_cuda)  # compile and a cache are offered where they can be timed: a named CUDA GPU
    memory_fits = fitting(prediction, usable, fp8=fp8, timed=speeds)  # timed: fp8 matmuls ranked, not dropped
    fits, refused = runnable(with_speedups(memory_fits) if speeds else memory_fits, entry, settled, target.kind)
    refused = [(chosen, why) for chosen, why in refused if not any(is_speedup(t) for t in chosen)]  # not offered
    formats = format_times(work, prediction, spec, target, tf32, [c for c, _ in fits]) if speeds else {}
    times = lower_times(plain, prediction, target, [chosen for chosen, _ in fits], formats)
    qualities = quality_costs([chosen for chosen, _ in fits])
    notes = {chosen: time_note(chosen, formats) if plain else None for chosen, _ in fits}  # none: no time at all
    setting_work = SettingWork(work, prediction, settled, tuple(prediction.denoisers))
    timings = {chosen: timed(setting_work, chosen, target, tf32) for chosen, _ in fits} if speeds else {}
    expected = {chosen: found.time.expected_s for chosen, found in timings.items() if found.time}
    unranked = {chosen: found.why for chosen, found in timings.items() if found.why}
    skips = {chosen: found.time.cache for chosen, found in timings.items() if found.time and found.time.cache}
    # a setting with a technique the time leaves out has the bound profile gives it: none, as that technique can
    # make the run faster than the pipeline without it (an offload without a fitted rate: its own bound)
    lower = {c: found.time.lower_s if found.time else found.lower for c, found in timings.items()} or times
    by_time = any(bound is not None for bound in lower.values())  # else in the settings' order, least offload first
    rows = ranked([(chosen, peak, lower.get(chosen)) for chosen, peak in fits], timings, usable if by_time else None)
    if speeds:  # a memory saving added where it may be faster (fitting's ``faster``) is kept only where it is
        slower = no_faster(rows, timings, usable)
        rows = [row for row in rows if row[0] not in slower]
    # why a row has no bound, unless only a technique the time leaves out withholds it (``not_ranked`` says which)
    untimed = (
        why_untimed(plain, target, work, tf32, bool(gpu or gpu_spec))
        if any(t is None and (not timings or setting_work.of(c)[0] is not None) for c, _, t in rows)
        else None
    )
    nothing = None if rows else next_step(prediction, entry, settled, fp8, table_gpus())
    if as_json:
        from diffmeter.runs.fit_answer import FitAnswer

        payload = {
            "model": model,
            "device": target.name,  # the table's GPU, or the --memory given
            "settings": dataclasses.asdict(spec),  # the generation fitted; None: the model's default
            "resolved": dataclasses.asdict(settled),  # the same with those defaults filled in (1024x1024, 50 steps)
            "memory_bytes": target.memory_bytes,
            "held_back_bytes": held,
            "host_link": target.host_link,
            "fits": [
                {
                    "techniques": list(chosen),
                    "optimizations": [optimization(t) for t in chosen if is_speedup(t)],  # as bench's --opt
                    "bench": bench_flags(chosen),  # the bench options that run it
                    "peak_bytes": peak,
                    "borderline": borderline(peak, usable),  # within the memory prediction's checked error
                    "left_bytes": usable - peak,  # the table's "left": the card's memory less held back and peak
                    "lower_s": time,
                    "expected_s": expected.get(chosen),  # the calibrated range with every technique of it
                    "not_ranked": unranked.get(chosen),  # why it has no expected range: a technique not timed
                    "cache_skipped_share": skips[chosen].skipped_share if chosen in skips else None,  # of the calls
                    "cache_extrapolated": skips[chosen].extrapolated if chosen in skips else None,  # why, or None
                    "time_note": notes[chosen],  # a quantization whose time is not modelled
                    "quality": qualities[chosen],
                }
                for chosen, peak, time in rows
            ],
            "plain_peak_bytes": prediction.peak_bytes,  # why the unquantized pipeline does not fit, where it does not
            "refused_by_bench": [{"techniques": list(chosen), "reason": reason} for chosen, reason in refused],
            "memory_checked": prediction.checked,
            "time_left_out": untimed,  # why a setting has no lower_s
            # the held-out figure of each expected range given (the eager calibration's, each technique's)
            "held_out": held_out_claims(plain, [c for c, *_ in rows if expected.get(c)]) if expected else None,
            "power_limit": plain.power_limit if expected else None,  # the card's compute under its TDP, if limited
            "next_step": nothing,  # what to do when nothing fits
        }
        print(json.dumps(FitAnswer.model_validate(payload).model_dump(mode="json"), indent=2))
        return
    as_default = [] if all_settings else graphs_as_default(rows, timings)  # --all-settings: every row
    rows = [row for row in rows if row[0] not in as_default]
    shown = rows if all_settings else rows[:TOP]
    table = fit_table(  # the output's size is profile's to state: input images, binning or rounding may set it
        f"{model} ({', '.join(asked_generation(settled, prediction))})",
        prediction,
        target,
        shown,
        held,
        refused,
        untimed,
        nothing,
        (qualities, notes, expected, unranked),
        len(rows),
        skips,
        held_out_claims(plain, [chosen for chosen, _, _ in shown if expected.get(chosen)]) if expected else None,
        catalog_name=entry.name,
    )
    if expected and plain.power_limit:
        table.caption += f"\nOn the {target.name}, {plain.power_limit}."
    if quicker := quicker_borderline(rows[len(shown) :], shown[0][0] if shown else None, timings, usable):
        table.caption += (
            f"\n{counted(quicker, 'borderline setting')} (within the memory prediction's checked error of what is "
            "left: a real run may not fit) expected faster than the first row: ranked after the settings with room "
            "to spare, --all-settings lists them"
        )
    if as_default:
        table.caption += (
            f"\n{counted(len(as_default), 'compile:mode=reduce-overhead row')} left out: each predicted as its "
            "mode=default row, "
            "to the same peak and times (the GPU's work already hides the launches CUDA graphs remove; their memory "
            "pool is not counted); --all-settings lists them"
        )
    console.print(table)


def _memory(text: str) -> str:
    """``--memory``: a positive size in GB or GiB (GB read as GiB), or MB or MiB as nvidia-smi prints it (MB read as
    MiB), such as 24GB or 23034MiB, as the GiB figure ``spec_gpu`` takes; one clear line otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(gb|gib|g|mb|mib|m)?\s*", text, re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise DiffmeterError(
            f"--memory takes a positive size such as 24GB or 24GiB (GB read as GiB), or 23034MiB or 23034MB as "
            f"nvidia-smi prints it (MB read as MiB); got '{text}'"
        )
    mebibytes = (match.group(2) or "g").lower().startswith("m")
    return f"{float(match.group(1)) / 1024:.12f}GB" if mebibytes else f"{match.group(1)}GB"


def _memory_name(text: str) -> str:
    """How ``--memory`` is named where a GPU's name goes: the figure as given, and how a GB or MB figure was read."""
    unit = text.strip().lower().rstrip("i b")
    read = "" if text.strip().lower().endswith("ib") else ", read as MiB" if unit.endswith("m") else ", read as GiB"
    return f"--memory {text.strip()}{read}"


def asked_generation(settled, prediction) -> list[str]:
    """What the fitted generation is, as the header says it: the size the pipeline makes (``prediction``'s) and a
    video's frames, steps and batch, and the inputs, ControlNet and LoRA asked for (new users' trials: three runs of
    one model with other input images read alike; a video model's fit said no size nor frames)."""
    frames = [f"{prediction.num_frames} frames"] if prediction.num_frames else []
    said = [f"{prediction.width}x{prediction.height} px (WxH)", *frames] if prediction.width else []
    said += [f"{settled.steps} steps", f"batch {settled.batch_size}"]
    if settled.image_sizes:
        said.append(f"input image{'s' * (len(settled.image_sizes) > 1)} {sizes_text(settled.image_sizes)}")
    if settled.controlnet:
        said.append(f"ControlNet {settled.controlnet}")
    if settled.lora_rank or settled.lora_layers:
        layers = f"rank {settled.lora_rank}" if settled.lora_rank else f"{len(settled.lora_layers)} layers"
        said.append(f"LoRA {layers}")
    return said
