"""What `diffmeter profile` prints for one generation: its table, what its input images add, the parallel split,
and with --gpu/--gpu-spec the predicted memory and time."""

from __future__ import annotations

import json
import re
import shlex

from diffmeter.cli import call_settings
from diffmeter.cli.app import console, note
from diffmeter.cli.profile_refusals import refuse_inapplicable, refuse_without_fp8
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import load_libraries


def print_profile(found, spec) -> None:
    """One generation's table; with input images, what they add against the same generation from text alone."""
    from dataclasses import replace

    from diffmeter.flops.cached import cached_profile
    from diffmeter.report.tables import conditioning_line, profile_table

    console.print(profile_table(found))
    if said := call_settings.settings_line(spec):
        console.print(said, highlight=False, markup=False)
    if not found.input_images and not found.controlnet:
        return
    # at the edit's output size, which its images set where none was asked (FLUX.2)
    plain = replace(spec, image_sizes=(), controlnet=None, height=spec.height or found.height)
    plain = replace(plain, control_guidance_start=None, control_guidance_end=None, controlnet_conditioning_scale=None)
    plain = replace(plain, width=spec.width or found.width)
    baseline = cached_profile(plain)
    if baseline is None:
        load_libraries()
        from diffmeter.flops.profile import profile_spec

        try:
            baseline = profile_spec(plain)
        except DiffmeterError:  # an image-to-video checkpoint: no generation from text alone to compare with
            return
    console.print(conditioning_line(found, baseline), highlight=False, markup=False)


def split_line(split: dict) -> str:
    from diffmeter import units

    calls = ", ".join(f"{count} {name}" for name, count in split["collectives_per_denoiser_call"].items())
    what = [f"{calls} per denoiser call"] if calls else []
    if split["cfg_degree"] > 1:
        what.append(f"the other half's prediction, {units.gib(split['cfg_bytes_per_step'])} per step")
    received = units.gib(split["bytes_received_per_step_per_gpu"])
    return (
        f"ulysses {split['ulysses_degree']} x ring {split['ring_degree']} x CFG {split['cfg_degree']}, per GPU per "
        f"denoising step: compute {units.flops(split['flops_per_step_per_gpu'])} (of "
        f"{units.flops(split['flops_per_step'])}), communication {received} received ({'; '.join(what)}; offline: "
        "the denoiser on the meta device)"
    )


def print_predicted(
    specs, results, gpu: str | None, gpu_spec: str | None, as_json: bool, as_csv: bool, flags, tf32: bool,
    parallel: tuple[int, int, int, int] | None = None, torch_version: str | None = None, lora: str | None = None,
) -> None:  # fmt: skip
    """Each profile with its predicted peak memory and time on the chosen device (``predict/``); ``flags``:
    bench's technique options, parsed by bench's own parser and named as bench's stored prediction names them;
    ``tf32``: float32 matmuls and convolutions timed on TF32, as bench's ``--tf32``; ``parallel``: (ulysses, ring,
    cfg, tp) degrees: one GPU of that group's memory and the generation's time (``predict.parallel``)."""
    from diffmeter.cli.fit_hint import fit_command
    from diffmeter.predict.devices import is_this_cpu, other_cards
    from diffmeter.predict.gpu_spec import chosen_gpu
    from diffmeter.report.memory_table import memory_table
    from diffmeter.report.tables import run_dtypes
    from diffmeter.report.time_table import energy_line, time_table

    if as_csv:
        raise DiffmeterError("--csv has no place for predictions: use --json with --gpu/--gpu-spec")
    chosen = None if is_this_cpu(gpu) else chosen_gpu(gpu, gpu_spec)  # a wrong name fails before any work
    if others := other_cards(gpu):
        note(others, as_json)
    load_libraries()
    from diffmeter.distributed.group_prediction import RankSplit
    from diffmeter.optimize import build
    from diffmeter.optimize.options import from_flags
    from diffmeter.predict.attention_kernels import asked_kernel
    from diffmeter.predict.cache_published import threshold_outside
    from diffmeter.predict.cache_time import CACHES, skipped_line
    from diffmeter.predict.kernel_kinds import of_architecture
    from diffmeter.predict.layerwise_casting import cast_work
    from diffmeter.predict.offload_time import offload_line, offload_of, with_offload, with_transfer_bound
    from diffmeter.predict.offload_time import why_untimed as why_offload_untimed
    from diffmeter.predict.operators import operator_work, predict_memory_and_work
    from diffmeter.predict.predicted_profile import with_prediction
    from diffmeter.predict.quantized_memory import Format, split_values, with_formats
    from diffmeter.predict.quantized_modelled import held_out_claim, needs_fp8, why_not_modelled
    from diffmeter.predict.quantized_work import quantized_work
    from diffmeter.predict.roofline import bench_fp32_math, missing_figures, predict_time
    from diffmeter.predict.technique_names import AS_TORCHAO, memory_technique
    from diffmeter.predict.techniques import peak_under, short_of, stage_peaks_under
    from diffmeter.predict.timed_techniques import HELD_OUT as TECHNIQUES_HELD_OUT
    from diffmeter.predict.timed_techniques import TIME_ONLY, timed_work, without_untimed
    from diffmeter.predict.vae_decode import VAE_MODES

    legacy, formats = split_values(flags.get("quantize"))  # BACKEND:TYPE formats: their stored bytes, no file needed
    asked = from_flags(**{**flags, "quantize": legacy})
    refuse_inapplicable(build(asked), specs, results, formats, on_cpu=is_this_cpu(gpu))  # as bench checks them
    unmodelled = [o.name for o in asked if memory_technique(o.name, o.params) is None and o.name not in TIME_ONLY]
    if unmodelled:
        raise DiffmeterError(
            f"{', '.join(unmodelled)}: the prediction models offload, VAE tiling and slicing, quantize, the fp8 text "
            f"encoder, compile, the attention kernels and the denoiser caches ({', '.join(CACHES)}); drop the others "
            "here" + ("; float32 on TF32 is --tf32 (the default)" if "tf32" in unmodelled else "")
        )
    techniques = tuple(memory_technique(o.name, o.params) for o in asked if o.name not in TIME_ONLY)
    techniques += tuple({f.technique: 0 for f in formats})
    if parallel and parallel[3] > 1 and [t for t in techniques if t.startswith("quantize")]:
        raise DiffmeterError(
            "diffusers cannot shard quantized parameters for tensor parallelism (bench refuses the pair): drop "
            "--quantize or --tp-degree"
        )
    if parallel and any(t.startswith("offload") for t in techniques):
        raise DiffmeterError(
            "offloading moves the denoiser between devices; a parallel run keeps each rank's on its own GPU: drop the "
            "offload or the parallelism"
        )
    if "quantize-fp8" in techniques and chosen and chosen.tflops and "fp8" not in chosen.tflops:  # as `fit` does
        raise DiffmeterError(
            f"--quantize fp8 needs FP8 tensor cores, which the {chosen.name} lacks (no fp8 peak in the table): "
            "use --quantize int8"
        )

    aliases = [] if is_this_cpu(gpu) else [t for t in techniques if t in AS_TORCHAO]  # --quantize int8: int8wo's time
    timed_formats = [] if is_this_cpu(gpu) else [f for f in formats if not why_not_modelled(f.backend, f.type)]
    timed_formats += [Format("torchao", AS_TORCHAO[t], after_loading=True) for t in aliases]
    if fp8 := [f for f in timed_formats if needs_fp8(f.backend, f.type)]:
        refuse_without_fp8(fp8[0], chosen)
    if parallel:  # a split diffusers refuses, refused before any prediction runs
        from diffmeter.distributed.rank_prediction import check

        check(specs[0], *parallel, attention=[o for o in asked if o.name == "attention"])  # bench's backend rules
    modes = tuple(t for t in techniques if t in VAE_MODES)  # a video's tiled decode is slow to track: only if asked
    on_cuda = not is_this_cpu(gpu)  # this CPU: no cuDNN copies of convolutions, as bench predicts a CPU run
    predicted = [predict_memory_and_work(spec, on_cuda, modes) for spec in specs]  # one fake run for both
    if modes:  # the decode's operators as the tiled or sliced decode runs them
        predicted = [(memory, operator_work(spec, modes)) for (memory, _), spec in zip(predicted, specs, strict=True)]
    one_gpu = predicted[0][0]
    split = RankSplit(specs[0], parallel, on_cuda) if parallel else None
    if split:  # one GPU's share of every denoiser call, counted as diffusers splits it
        predicted = [split.split(*predicted[0])]
    kernels = of_architecture(chosen.architecture) if chosen else None  # this CPU: the prediction's own (on_cuda)
    memories = [
        with_formats(memory, spec, formats, kernels=kernels) for (memory, _), spec in zip(predicted, specs, strict=True)
    ]
    if timed_formats:  # the quantized layers' matmuls as each backend runs them (predict.quantized_time)
        predicted = [
            (memory, quantized_work(work, spec, timed_formats))
            for (memory, work), spec in zip(predicted, specs, strict=True)
        ]
    if "fp8-text-encoder" in techniques:  # each encoder call's layers cast to the compute dtype and back
        predicted = [
            (memory, cast_work(work, spec, memory.large_text_encoders))
            for (memory, work), spec in zip(predicted, specs, strict=True)
        ]
    applied = [
        timed_work(work, [(o.name, o.params) for o in asked], tuple(m.denoisers), spec, is_this_cpu(gpu))
        for (m, work), spec in zip(predicted, specs, strict=True)
    ]
    predicted = [(memory, work) for (memory, _), (work, _, _) in zip(predicted, applied, strict=True)]
    _, time_techniques, time_untimed = applied[0]  # compile, attention kernels: the same for every profile
    chosen = chosen or chosen_gpu(gpu, gpu_spec, tuple({dtype for _, work in predicted for dtype in work.dtypes()}))
    fp32_math = bench_fp32_math(tf32)
    missing = [missing_figures(chosen, work, fp32_math) for _, work in predicted]
    times = [
        None
        if lacking
        else predict_time(
            work,
            chosen,
            weights=memory.weight_read_bytes,
            outputs=spec.batch_size,
            fp32_math=fp32_math,
            attention=asked_kernel([(o.name, o.params) for o in asked]),
            torch_version=torch_version,
        )
        for (memory, work), lacking, spec in zip(predicted, missing, specs, strict=True)
    ]
    offload, offload_gap = offload_of(techniques), why_offload_untimed(techniques, chosen.host_link_bytes_per_s)
    if offload and not offload_gap:  # its host transfers inside the range, at the achieved link rate fitted
        link = (chosen.host_link, chosen.host_link_bytes_per_s)
        times = [time and with_offload(time, m, techniques, *link) for time, m in zip(times, memories, strict=True)]
    timed = (
        VAE_MODES
        + ("fp8-text-encoder",)
        + tuple(f.technique for f in timed_formats)
        + tuple(aliases)
        + ((offload,) if offload and not offload_gap else ())
    )
    # ("label: why", whether it can make the run faster) of each technique the time leaves out; an offload's gap
    # already reads "offload-model: why", and its transfers can only slow the run
    left_out = [
        (offload_gap, False) if t == offload else (f"{t}: {untimed_format(t, formats)}", True)
        for t in techniques
        if t not in timed
    ] + [(said, True) for said in time_untimed]  # compile, attention kernels, caches: all speed-ups
    untimed = [said for said, _ in left_out]
    withheld = [None if time is None else without_untimed(time, left_out) for time in times]
    why_none = [
        f"{'; '.join(untimed)}: left out of the time; the bounds of the pipeline without it do not bound this run "
        "(other kernels, bytes or calls), so no range, bound or energy is given"
        if time is not None and kept is None
        else None
        for time, kept in zip(times, withheld, strict=True)
    ]
    missing = [lacking or why for lacking, why in zip(missing, why_none, strict=True)]
    times = withheld
    if offload and offload_gap and chosen.host_link_bytes_per_s:  # no range, but its transfers may still bound it
        link = (chosen.host_link, chosen.host_link_bytes_per_s)
        times = [
            time and with_transfer_bound(time, m, techniques, *link) for time, m in zip(times, memories, strict=True)
        ]
    group, parallel_untimed = None, []
    if split:
        peaks = (
            peak_under(with_formats(one_gpu, specs[0], formats, kernels=kernels), techniques),
            peak_under(memories[0], techniques),
        )
        time, group, parallel_untimed = split.communicate(times[0], chosen, peaks)
        times = [time]
    shorts = [short_of(memory, chosen, techniques) for memory in memories]  # None: it fits, or no single size
    if as_json:
        staged = [stage_peaks_under(memory, techniques) for memory in memories]
        payloads = [
            with_prediction(
                found,
                gpu=chosen,
                memory=memory,
                memory_techniques=list(techniques),
                time_techniques=time_techniques,
                peak_memory_bytes=max(stages.values(), default=0),  # the largest stage's (peak_under)
                stage_peak_memory_bytes=stages,
                fits=None if not chosen.memory_bytes else short is None,
                short_of_bytes=short,
                time=time,
                no_time=lacking,
                quantized_time_held_out=held_out_claim([f"{f.backend}:{f.type}" for f in timed_formats])
                if time and timed_formats
                else None,
                time_left_out=untimed + (parallel_untimed if time else []),
                **({"parallel": group} if group else {}),
            )
            for found, memory, stages, time, lacking, short in zip(
                results, memories, staged, times, missing, shorts, strict=True
            )
        ]
        print(json.dumps(payloads[0] if len(payloads) == 1 else {"profiles": payloads}, indent=2))
        return
    for found, spec, memory, time, lacking, short in zip(results, specs, memories, times, missing, shorts, strict=True):
        print_profile(found, spec)
        if group:
            console.print(parallel_line(group), highlight=False, markup=False)
        card = f"--gpu {shlex.quote(gpu)}" if gpu else f"--gpu-spec {shlex.quote(gpu_spec or '')}"
        console.print(memory_table(memory, chosen, techniques, fit_command(spec, card, lora, tf32), run_dtypes(found)))
        console.print(time_table(time, short) if time else f"no time prediction: {lacking}", markup=False)
        if time and time.expected_s:
            console.print(energy_line(time, "video" if found.num_frames else "image", short is None), markup=False)
        if time and modes:
            console.print(
                f"VAE decode timed as {' and '.join(modes)} runs it (its FLOPs above: the count table's are the "
                "plain decode's)",
                markup=False,
            )
        if time and timed_formats:
            named = list(dict.fromkeys(f"{f.backend}:{f.type}" for f in timed_formats))  # each format once
            compiled = any(t.startswith("compile") for t in time_techniques)
            how = (
                "compiled (GGUF's and torchao's dequantization fused into inductor's kernels, bitsandbytes' and "
                "quanto's custom kernels as in eager mode: quantized_time.fused_dequantize)"
                if compiled
                else "in eager mode"
            )
            said = f"quantized layers timed as {', '.join(named)} runs them {how}; {held_out_claim(named)}"
            if not compiled and any(needs_fp8(f.backend, f.type) for f in timed_formats):  # why it may be slower
                said += (
                    "; in eager mode fp8 dynamic activations quantize each layer's input in operators of their own "
                    "(abs, amax, scale, cast), which can make the run slower than without them: --opt compile fuses "
                    "them"
                )
            console.print(said, markup=False)
        if time and time.offload:
            console.print(offload_line(time.offload), markup=False)
        if time and untimed:
            console.print(f"no expected range without {'; '.join(untimed)}", markup=False)
        if time and time.cache:  # a cache: its skipped share, how it was obtained, how well it held
            console.print(skipped_line(time.cache), markup=False)
            if threshold_outside(time.cache.extrapolated):
                note(
                    f"{time.cache.technique}: the threshold is outside every published run's, so its skipped share "
                    "and expected range are extrapolated: the held-out test below did not cover them"
                )
        if time and (others := [t for t in time_techniques if not time.cache or t != time.cache.technique]):
            console.print(
                f"time with {', '.join(others)}; memory as without"
                + (" (CUDA graphs' pool not counted)" if any("reduce-overhead" in t for t in others) else "")
                + "".join(
                    AUTOTUNE[mode]
                    for mode in sorted({m for t in others for m in COMPILE_MODE.findall(t)} & set(AUTOTUNE))
                )
                + "; "
                + TECHNIQUES_HELD_OUT,
                markup=False,
            )


#: a technique label's compile mode ("compile:mode=max-autotune-no-cudagraphs")
COMPILE_MODE = re.compile(r"mode=([a-z-]+)")
#: compile's autotuning modes as the time has them (``compiled_time.CUDA_GRAPH_MODES``): what each shares with a mode
#: a published run measured
AUTOTUNE = {
    "max-autotune": "; compile mode=max-autotune timed as reduce-overhead (CUDA graphs, inductor's fusion): the "
    "kernels its autotuning picks are not modelled, and no published run of it is held out",
    "max-autotune-no-cudagraphs": "; compile mode=max-autotune-no-cudagraphs timed as mode=default (inductor's "
    "fusion, no CUDA graphs): the kernels its autotuning picks are not modelled, and no published run of it is held "
    "out",
}


def untimed_format(technique: str, formats) -> str:
    """Why a memory technique's time is not modelled: a ``--quantize BACKEND:TYPE`` format's own reason (on this
    CPU none is timed), else none has been modelled."""
    from diffmeter.predict.quantized_modelled import why_not_modelled

    found = next((f for f in formats if f.technique == technique), None)
    if found is None:
        return "not modelled in time yet"
    why = why_not_modelled(found.backend, found.type)
    return why or "quantized layers are timed on a CUDA GPU, not on this CPU"


def parallel_line(group) -> str:
    """The group, each GPU's peak against one GPU's, and the link its communication is timed over."""
    from diffmeter import units
    from diffmeter.predict.parallel import communication_fit

    degrees = group.degrees_text()
    fit = communication_fit()
    how = (
        f"calibrated on published multi-GPU runs: {fit.held_out}"
        if group.communication_calibrated and fit
        else "at the datasheet rate: a fit on published multi-GPU runs did no better held out, not used"
    )
    link = (
        f"over {group.link.name}: {group.communication_s:.3g} s added to denoising ({how})"
        if group.link
        else "no link figure for this device: the communication is not timed"
    )
    return (
        f"{degrees} = {group.gpus} GPUs; the memory below is per GPU: {units.gib(group.per_gpu_peak_memory_bytes)} at "
        f"peak each (one GPU alone: {units.gib(group.one_gpu_peak_memory_bytes)}); each receives "
        f"{units.gib(group.bytes_received_per_gpu)} per generation in {group.collectives_per_generation:,} "
        f"collectives {link}"
    )
