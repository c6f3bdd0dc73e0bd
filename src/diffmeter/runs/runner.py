"""A measured run: resolve, check, load, warm up, iterate under the stage timer, summarize, store.

Everything that can be refused (unknown model, bad settings, missing weights, an
existing result, an unwritable folder, an empty prompts file) is refused before a
folder is created or a weight is loaded. Out-of-memory becomes a stored failed result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from diffmeter import units
from diffmeter.catalog import PipelineEntry, resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import DENOISER, TEXT_ENCODER, VAE_DECODER, get_family
from diffmeter.flops.profile import Profile, profile_spec
from diffmeter.loading import WeightsSource, load_pipeline, locate_weights
from diffmeter.measure.clock import clock_for, device_scope
from diffmeter.measure.compilation import watch_compilation
from diffmeter.measure.conditions import ConditionsMonitor
from diffmeter.measure.energy import Energy, EnergyMeter
from diffmeter.measure.environment import collect
from diffmeter.measure.memory import loaded_bytes, read_peaks, reset_peaks
from diffmeter.measure.peaks import device_peak
from diffmeter.measure.quality import Quality, clip_scorer, compare, lpips_scorer, summarize
from diffmeter.measure.stages import StageTimer
from diffmeter.measure.stats import CONFIDENCE, Stats
from diffmeter.measure.trace import TraceSummary, trace_call
from diffmeter.optimize import Target, build, check
from diffmeter.optimize.tf32 import fp32_math, fp32_precision
from diffmeter.runs import storage
from diffmeter.runs.memory_check import check_fits
from diffmeter.runs.parallel_support import check as check_parallel
from diffmeter.runs.results import (
    AppliedOptimization,
    BenchResult,
    ImageRecord,
    Iteration,
    ModelInfo,
    Speedup,
    Summary,
)
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.workload import Workload, outputs, save_output

#: the median latency's interval half-width, as a fraction of it, above which a run is flagged noisy
NOISY = 0.05
#: progress callback: (what is happening, calls done, calls planned or None)
Progress = Callable[[str, int, int | None], None]


@dataclasses.dataclass
class PreparedRun:
    """A run checked before anything loads: settled spec, offline profile, techniques, weights, folder name."""

    spec: BenchSpec
    entry: PipelineEntry
    profile: Profile
    target: Target
    optimizations: list
    source: WeightsSource
    name: str


def prepare(
    spec: BenchSpec, here: bool = True, device: torch.device | None = None, check_memory: bool = True
) -> PreparedRun:
    """Every refusal that needs no weights: defaults and values, sizes (the offline profile),
    techniques against the model and device, weights on disk and, ``here`` (on this machine's
    devices), the memory lower bound on ``device`` (a rank's own GPU; else the spec's), unless
    ``check_memory`` is False (a launcher: each rank checks its own GPU). Raises DiffmeterError with the reason."""
    entry = resolve(spec.model)
    spec = spec.settle(entry, here=here)
    profile = profile_spec(spec.profile_spec())  # also checks sizes against the model
    target = Target(entry, get_family(entry.family), torch.device(spec.device), spec.dtype, spec.steps)
    optimizations = build(spec.optimizations)
    check(optimizations, target)
    if spec.world_size > 1 or spec.engine != "diffusers":
        check_parallel(spec, target, optimizations, here)
    if here or entry.is_tiny or spec.random_weights:
        source = locate_weights(entry, spec.random_weights)
    else:  # the weights are looked for where the run happens
        source = WeightsSource("pretrained")
    if spec.memory_check and here and check_memory:
        check_fits(spec, entry, target.family.decoder, profile, device or torch.device(spec.device))
    return PreparedRun(spec, entry, profile, target, optimizations, source, _run_name(spec, entry, optimizations))


def bench(spec: BenchSpec, out: str | Path = "results", force: bool = False, progress: Progress | None = None):
    """Run ``spec`` in this process and store it under ``out``; returns (BenchResult, run folder). A spec of
    several processes runs through ``diffmeter.execute.bench``, which starts them."""
    progress = progress or (lambda *_: None)
    if spec.world_size > 1:
        raise DiffmeterError(
            f"this spec runs over {spec.world_size} processes: start it with diffmeter.execute.bench (or `diffmeter "
            "bench`), which launches them"
        )
    run = prepare(spec)
    spec, entry, optimizations = run.spec, run.entry, run.optimizations
    workload = Workload(spec, entry)
    folder = storage.RunDirectory(out, run.name, force, spec)
    folder.check()
    baseline = stored_or_run(spec.baseline(), out, progress) if spec.compare_baseline and optimizations else None
    staging = folder.open()
    log = storage.file_logger(staging)
    try:
        storage.write_json(staging / storage.REQUESTS, workload.requests(spec.iterations))
        result = measure_run(
            spec, entry, run.source, workload, run.profile, staging, log, progress, optimizations, run.target
        )
        if len(result.iterations) > spec.iterations:  # --min-duration or --target-precision asked for more
            storage.write_json(staging / storage.REQUESTS, workload.requests(len(result.iterations)))
        if baseline is not None and result.status == "complete":
            result.quality = compare_with_baseline(result, staging, *baseline)
            result.speedup = Speedup.of(result.summary.latency_s, baseline[0].summary.latency_s, str(baseline[1]))
            result.notes += _baseline_notes(result, baseline[0])
        if spec.predict and result.status == "complete":
            _add_prediction(result, log)
        log.info("done: %s", result.status)
        final = folder.commit(result)
    except BaseException:
        log.exception("interrupted")
        storage.close_logger(log)
        folder.discard()  # nothing half-written stays behind
        raise
    storage.close_logger(log)
    result._folder = final
    if result.status == "failed":
        raise DiffmeterError(f"{result.error} (recorded as a failed result in {final})")
    return result, final


def stored_or_run(spec: BenchSpec, out, progress: Progress | None = None, rerun: bool = False):
    """The complete result of ``spec`` stored in ``out`` when it holds every image the spec
    asks for (same seed and prompt or class); otherwise run it, replacing what is there.
    Returns (result, folder)."""
    entry = resolve(spec.model)
    settled = spec.settle(entry)
    folder = Path(out).expanduser() / _run_name(settled, entry, build(settled.optimizations))
    if not rerun and (folder / storage.RESULTS).exists():
        stored = storage.read_result(folder)
        workload = Workload(settled, entry)
        wanted = set()
        for index in range(settled.iterations):
            batch = workload.batch(index)
            wanted |= set(zip(batch.seeds, batch.prompts or batch.class_labels, strict=True))
        held = {
            (image.seed, image.prompt if image.prompt is not None else image.class_label) for image in stored.images
        }
        if stored.status == "complete" and wanted <= held:
            return stored, folder
    return bench(spec, out=out, force=True, progress=progress)


def _run_name(spec: BenchSpec, entry, optimizations) -> str:
    return storage.run_name(spec, entry, [optimization.label() for optimization in optimizations])


def _baseline_notes(result: BenchResult, baseline: BenchResult) -> list[str]:
    """A baseline reused from another session was measured under conditions that may differ."""
    apart = abs(datetime.fromisoformat(result.created_utc) - datetime.fromisoformat(baseline.created_utc))
    if apart.total_seconds() <= 3600:
        return []
    return [
        f"the baseline was measured {baseline.created_utc} and this run {result.created_utc}: the speed-up compares "
        "two sessions; --force on the baseline's folder, or a fresh --out, measures both now"
    ]


def compare_with_baseline(result: BenchResult, folder: Path, baseline: BenchResult, baseline_folder: Path) -> Quality:
    """Each image of ``result`` (in ``folder``) against the baseline's image with the same seed."""
    by_seed = {image.seed: image for image in baseline.images}
    clip, clip_reason = clip_scorer()
    lpips, lpips_reason = lpips_scorer()
    compared = [
        compare(folder / image.path, baseline_folder / by_seed[image.seed].path, image.seed, image.prompt, clip, lpips)
        for image in result.images
        if image.seed in by_seed
    ]
    reasons = {name: reason for name, reason in (("lpips", lpips_reason), ("clip_score", clip_reason)) if reason}
    return summarize(str(baseline_folder), compared, clip.name if clip else None, reasons)


def _add_prediction(result: BenchResult, log) -> None:
    """The offline prediction beside the measurements; a prediction that cannot be made is a note."""
    from diffmeter.predict.bench_prediction import predict_or_note

    result.prediction, note = predict_or_note(result.spec, result.optimizations, result.fp32_precision)
    if note:
        log.warning(note)
        result.notes.append(note)


def _result_fields(spec, entry, source, profile, optimizations) -> dict:
    """What every result of ``spec`` records, measured or not."""
    return dict(
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        spec=spec,
        model=ModelInfo(
            id=entry.id, name=entry.name, family=entry.family, pipeline_class=entry.pipeline_class, origin=entry.origin
        ),
        weights=source.describe(),
        weights_random=source.random,
        environment=collect(),
        profile=profile,
        notes=_notes(spec, entry, optimizations),
        optimizations=[
            AppliedOptimization(
                name=o.name, label=o.label(), kind=o.kind, lossless=o.lossless, params=o.config.model_dump(mode="json")
            )
            for o in optimizations
        ],
    )


def store_failure(run: PreparedRun, out: str | Path, error: str) -> Path:
    """A failed result for a run that died before it could store one itself (killed, crashed, timed out)."""
    folder = storage.RunDirectory(out, run.name, force=True, spec=run.spec)
    folder.open()
    result = BenchResult(
        status="failed", error=error, **_result_fields(run.spec, run.entry, run.source, run.profile, run.optimizations)
    )
    return folder.commit(result)


def measure_run(
    spec, entry, source, workload, profile, staging, log, progress, optimizations, target, parallel=None
) -> BenchResult:
    """``parallel`` (one rank of a multi-process run) splits the loaded pipeline's work with its ``apply``."""
    device = torch.device(spec.device)
    family = get_family(entry.family)
    base = _result_fields(spec, entry, source, profile, optimizations)
    log.info("spec %s", spec.model_dump_json())
    log.info("weights: %s", source.describe())
    result, applied, pipe = {}, [], None
    try:
        with device_scope(device), _strict_fp32(device):
            progress("loading", 0, None)
            start = time.perf_counter()
            placed = any(o.places_pipeline for o in optimizations)
            pipe = load_pipeline(entry, source, torch.device("cpu") if placed else device, spec.dtype, spec.seed)
            family.prepare_pipeline(pipe, spec.guidance_scale, spec.batch_size)
            for optimization in optimizations:
                log.info("applying %s", optimization.label())
                optimization.apply(pipe, target)
                applied.append(optimization)
            if parallel is not None:
                parallel.apply(pipe)
            _synchronize(device)
            result["load_s"] = time.perf_counter() - start
            log.info("loaded and optimized in %.3f s", result["load_s"])
            profile = _profile_of_the_prompts(spec, family, pipe, workload, profile, base)
            loaded = loaded_bytes(device)
            meter = EnergyMeter(device)
            timer = StageTimer(
                pipe, list(family.text_encoders), list(family.denoisers(entry)), family.decoder, clock_for(device)
            )
            compiling = any(o.kind == "compile" for o in optimizations)
            with timer:
                contexts = [o.call_context for o in optimizations]
                result.update(
                    _iterate(spec, pipe, timer, meter, workload, staging, log, progress, device, contexts, compiling)
                )
            summary = summarize_run(
                spec,
                result["iterations"],
                read_peaks(device, loaded, result.pop("rss_was_reset")),
                Energy.of(result.pop("energy"), result.pop("energy_loop"), result["images_measured"], meter),
                profile,
                result["first_call_s"],
                result.pop("compilation"),
                result.pop("conditions"),
            )
            if spec.trace:  # after the measured calls and their peaks: it changes neither
                with timer:
                    result["trace"] = _traced_call(pipe, timer, workload, staging, contexts, device)
    except (torch.cuda.OutOfMemoryError, MemoryError, RuntimeError) as error:
        if not out_of_memory(error):
            raise
        message = f"out of memory on {spec.device}: {(str(error) or type(error).__name__).splitlines()[0]}"
        log.error(message)
        return BenchResult(status="failed", error=message, load_s=result.get("load_s"), **base)
    finally:
        for optimization in reversed(applied):
            optimization.restore(pipe, target)
    base["notes"] += measurement_notes(summary, result.pop("shape_warmups"))
    images = result.pop("images")
    result.pop("images_measured")
    return BenchResult(status="complete", summary=summary, images=images, **result, **base)


def out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's RuntimeError."""
    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return "can't allocate memory" in str(error) or "not enough memory" in str(error).lower()


def _strict_fp32(device: torch.device):
    """On CUDA, float32 matmuls and convolutions in strict IEEE float32 unless a technique (tf32)
    says otherwise for its calls; PyTorch's own default runs convolutions in TF32."""
    return fp32_math(False) if device.type == "cuda" else contextlib.nullcontext()


def _iterate(spec, pipe, timer, meter, workload, staging, log, progress, device, contexts, compiling) -> dict:
    """The cold call, the other warm-up calls (plus one per input shape not yet seen when
    compiling), then measured calls until both the iteration count and the minimum duration
    are reached."""
    warmups = list(range(spec.warmup))
    shape_warmups = _unseen_shapes(spec, pipe, workload) if compiling else []
    calls = len(warmups) + len(shape_warmups) + spec.iterations
    progress("warm-up", 0, calls)
    warmup = []
    for done, index in enumerate(warmups + shape_warmups):
        progress("warm-up", done, calls)
        iteration = timed_call(
            pipe, timer, workload.call_arguments(pipe, workload.batch(index)), index, None, contexts
        )[0]
        warmup.append(iteration.total_s)
        if done == 0:
            first = iteration
            log.info("first call %.3f s", first.total_s)
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        precision = fp32_precision() if device.type == "cuda" else None
    rss_was_reset = reset_peaks(device)
    iterations, energy, images = [], [], []
    elapsed = 0.0
    monitor = ConditionsMonitor(device.index or 0 if device.type == "cuda" else None)
    monitor.start()
    with watch_compilation() as compilation:
        loop = meter.begin()
        while _keep_measuring(spec, iterations, elapsed):
            index = len(iterations)
            progress("measuring", len(warmup) + index, calls if index < spec.iterations else None)
            batch = workload.batch(index)
            iteration, output = timed_call(pipe, timer, workload.call_arguments(pipe, batch), index, meter, contexts)
            iterations.append(iteration)
            energy.append(iteration.energy)
            elapsed += iteration.wall_s
            log.info(
                "iteration %d: %.4f s (text %.4f, %d steps %.4f, decode %.4f, other %.4f)",
                index,
                iteration.total_s,
                iteration.stages.text_encoding_s,
                len(iteration.stages.steps_s),
                iteration.stages.denoising_s,
                iteration.stages.vae_decode_s,
                iteration.stages.other_s,
            )
            if spec.save_images:
                images += _save(outputs(output), batch, index, staging)
        energy_loop = meter.end(loop)
    conditions = monitor.stop()
    progress("measuring", calls, calls)
    return {
        "first_call_s": first.total_s,
        "first_call": first,
        "warmup_s": warmup,
        "iterations": iterations,
        "energy": energy if meter.available else [],
        "energy_loop": energy_loop,
        "images": images,
        "images_measured": sum(iteration.images for iteration in iterations),
        "rss_was_reset": rss_was_reset,
        "compilation": compilation,
        "conditions": conditions,
        "shape_warmups": len(shape_warmups),
        "fp32_precision": precision,
    }


def _traced_call(pipe, timer, workload, staging: Path, contexts, device) -> TraceSummary:
    """``--trace``: one more call of the first batch under torch.profiler, never a measured one."""
    arguments = workload.call_arguments(pipe, workload.batch(0))

    def call():
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context())
            pipe(**arguments)

    return trace_call(timer, call, staging, device)


def _keep_measuring(spec: BenchSpec, iterations: list[Iteration], elapsed: float) -> bool:
    """Until the iteration count and the minimum duration are reached, and, with a target
    precision, until the median's 95% interval is that narrow (or the call budget is spent)."""
    if len(iterations) < spec.iterations or elapsed < spec.min_duration_s:
        return True
    if spec.target_precision is None or len(iterations) >= spec.max_iterations:
        return False
    latency = Stats.of([iteration.total_s for iteration in iterations])
    return latency.ci_level < CONFIDENCE or latency.relative_ci > spec.target_precision


def _unseen_shapes(spec, pipe, workload) -> list[int]:
    """Measured batches whose input shapes (prompt-dependent token counts: Kandinsky 3, Lumina,
    SANA) the warm-up calls have not run, one per shape: a compiled model recompiles (or records
    a new CUDA graph) on a new shape, which must not happen inside a measured call."""
    if workload.class_conditional:
        return []
    family = workload.family

    def shape(index: int) -> tuple:
        return tuple(sorted(family.prompt_settings(pipe, workload.batch(index).prompts).items()))

    seen = {shape(index) for index in range(spec.warmup)}
    period = len(workload.pool) // math.gcd(len(workload.pool), spec.batch_size)  # batches repeat after this
    unseen = []
    for index in range(max(spec.iterations, period)):
        key = shape(index)
        if key not in seen:
            seen.add(key)
            unseen.append(index)
    return unseen


def timed_call(pipe, timer: StageTimer, arguments: dict, index: int, meter: EnergyMeter | None, contexts=()):
    """One timed pipeline call, inside an energy window when a meter is given, and inside
    the per-call contexts of the optimizations (``contexts``: callables returning one)."""
    window = meter.begin() if meter is not None else None
    start = time.perf_counter()
    timer.begin()
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        output = pipe(**arguments)
    times = timer.end()
    wall = time.perf_counter() - start
    reading = meter.end(window) if meter is not None else None
    iteration = Iteration(
        index=index,
        images=len(arguments["generator"]),
        total_s=times.total_s,
        wall_s=wall,
        denoiser_calls=times.denoiser_calls,
        stages=times.stages,
        energy=reading,
    )
    return iteration, output


def _save(produced: list, batch, index: int, staging: Path) -> list[ImageRecord]:
    records = []
    for k, output in enumerate(produced):
        label = batch.prompts[k] if batch.prompts else f"class-{batch.class_labels[k]}"
        path = save_output(output, staging / storage.IMAGES, batch.seeds[k], label)
        records.append(
            ImageRecord(
                path=str(path.relative_to(staging)),
                iteration=index,
                seed=batch.seeds[k],
                prompt=batch.prompts[k] if batch.prompts else None,
                class_label=batch.class_labels[k] if batch.class_labels else None,
            )
        )
    return records


def _profile_of_the_prompts(spec, family, pipe, workload, profile: Profile, base: dict) -> Profile:
    """Re-count families whose compute depends on the prompt (Kandinsky 3, Lumina, SANA's
    instruction) with the real token counts; the longest prompt makes its batch exact."""
    if workload.class_conditional:
        return profile
    settings = family.prompt_settings(pipe, workload.pool)
    if not settings:
        return profile
    profile = profile_spec(dataclasses.replace(spec.profile_spec(), **settings))
    base["profile"] = profile
    counts = ", ".join(f"{name} {value}" for name, value in settings.items())
    base["notes"].append(
        f"the stored profile counts this run's prompts with the pipeline's tokenizer ({counts}, longest prompt): "
        "exact for batches holding the longest prompt, an upper bound for the others"
    )
    return profile


def summarize_run(
    spec, iterations: list[Iteration], memory, energy: Energy, profile: Profile, first_call_s, compilation, conditions
):
    totals = [it.total_s for it in iterations]
    images = sum(it.images for it in iterations)
    stages = {
        "text_encoding": Stats.of([it.stages.text_encoding_s for it in iterations]),
        "denoising": Stats.of([it.stages.denoising_s for it in iterations]),
        "vae_decode": Stats.of([it.stages.vae_decode_s for it in iterations]),
        "other": Stats.of([it.stages.other_s for it in iterations]),
    }
    step = Stats.of([s for it in iterations for s in it.stages.steps_s] or [0.0])
    denoising = _flops(profile, DENOISER)
    flops = {
        "text_encoding": _flops(profile, TEXT_ENCODER),
        "denoising": denoising,
        "step": denoising // spec.steps,
        "vae_decode": _flops(profile, VAE_DECODER),
        "total": profile.total_flops,
    }
    seconds = {name: stats.median for name, stats in stages.items()}
    seconds.update(step=step.median, total=statistics.median(totals))
    achieved = {name: flops[name] / seconds[name] / 1e12 for name in flops if seconds[name] > 0 and flops[name]}
    device_name = torch.cuda.get_device_name(torch.device(spec.device)) if spec.device.startswith("cuda") else "cpu"
    peak = (
        device_peak(device_name, spec.dtype, tf32=spec.tf32, override_tflops=spec.peak_tflops)
        if device_name != "cpu" or spec.peak_tflops
        else None
    )
    note = None
    if peak is None:
        precision = "tf32" if spec.tf32 and spec.dtype == "float32" else spec.dtype
        note = f"no peak TFLOP/s known for {device_name} at {precision}; pass --peak-tflops to get MFU"
    return Summary(
        iterations=len(iterations),
        images=images,
        latency_s=Stats.of(totals),
        stages_s=stages,
        step_s=step,
        images_per_s=images / sum(totals),
        s_per_image=sum(totals) / images,
        cold_start_overhead_s=max(0.0, first_call_s - statistics.median(totals)),
        peak_memory=memory,
        energy=energy,
        flops=flops,
        achieved_tflops=achieved,
        peak=peak,
        mfu={name: value / peak.tflops for name, value in achieved.items()} if peak else {},
        mfu_note=note,
        compilation=compilation,
        conditions=conditions,
        target_precision=spec.target_precision,
    )


def _flops(profile: Profile, role: str) -> int:
    return sum(component.flops for component in profile.components if component.role == role)


def _notes(spec: BenchSpec, entry, optimizations) -> list[str]:
    notes = []
    if any(o.kind == "cache" for o in optimizations):
        notes.append(
            "a cache skips work: achieved FLOP/s and MFU divide the full (uncached) profile by the time, "
            "so they are effective rates, not executed ones"
        )
    if spec.device == "cpu" and spec.dtype == "float32" and entry.defaults.dtype != "float32":
        notes.append(f"ran in float32 on CPU; the model's default is {entry.defaults.dtype} on GPU (--dtype)")
    return notes


def measurement_notes(summary: Summary, shape_warmups: int) -> list[str]:
    """What a reader must know to trust the figures: noise, other load on the machine,
    recompilation inside measured calls, MFU above 100%, extra warm-up calls."""
    notes = []
    latency = summary.latency_s
    if latency.relative_ci > NOISY:
        interval = f"{units.seconds(latency.ci_low)} - {units.seconds(latency.ci_high)}"
        notes.append(
            f"noisy: the median latency {units.seconds(latency.median)} is only known to within {interval} "
            f"({100 * latency.ci_level:.0f}% interval, {latency.n} calls); do not compare it closely: "
            "measure longer with --target-precision 0.02 on a quieter machine"
        )
    target = summary.target_precision
    if target and (latency.ci_level < CONFIDENCE or latency.relative_ci > target):
        notes.append(
            f"--target-precision {target:g} not reached: +-{100 * latency.relative_ci:.1f}% after "
            f"{latency.n} calls (--max-iterations)"
        )
    if summary.conditions is not None and summary.conditions.disturbed():
        notes.append(summary.conditions.disturbed())
    compilation = summary.compilation
    if not compilation.clean:
        notes.append(
            f"compilation inside the measured calls ({compilation.graphs_compiled} graphs compiled, "
            f"{compilation.cuda_graphs_recorded} CUDA graphs recorded): their time is in the figures"
        )
    if any(value > 1.0 for value in summary.mfu.values()):
        notes.append("MFU above 100%: the peak used is below what ran (see --peak-tflops), or a cache skipped work")
    if shape_warmups:
        notes.append(
            f"{shape_warmups} extra warm-up call(s), one per prompt-dependent input shape the measured calls use"
        )
    return notes


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
