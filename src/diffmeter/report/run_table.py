"""A measured run as a terminal table: where the time went, how fast, how big, how hungry."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.text import Text

from diffmeter import units
from diffmeter.errors import DiffmeterError
from diffmeter.measure.host_link import link_line
from diffmeter.report.layout import Column, FittedTable
from diffmeter.report.prediction_lines import prediction_lines
from diffmeter.runs import speedups
from diffmeter.runs.results import BenchResult
from diffmeter.runs.storage import read_result
from diffmeter.stages import STAGE_NAMES

STAGE_LABELS = {**STAGE_NAMES, "other": "other"}


def run_table(result: BenchResult) -> Group:
    spec = result.spec
    device = f"CPU ({result.environment.cpu})"
    if spec.device.startswith("cuda"):
        device = result.environment.devices[int(spec.device.partition(":")[2] or 0)]
    frames = f", {spec.num_frames} frames" if spec.num_frames else ""
    title = (
        f"{result.model.name} ({result.model.id}) on {device}: {spec.width}x{spec.height} px (WxH){frames}, "
        + "".join(f"input image {width}x{height}, " for height, width in spec.image_sizes)
        + f"{units.steps(spec.steps)}, batch {spec.batch_size}, guidance {spec.guidance_scale:g}, "
        + (f"true CFG {spec.true_cfg_scale:g}, " if spec.true_cfg_scale is not None else "")
        + (f"ControlNet {spec.controlnet}, " if spec.controlnet else "")
        + (f"LoRA {spec.lora_text}, " if spec.lora_text else "")
        + spec.dtype
        + "".join(f", {name} {dtype}" for name, dtype in sorted(spec.component_dtypes.items()))
    )
    if result.status != "complete" or result.summary is None:
        return Group(Text(title, style="bold"), Text(f"failed: {result.error}", style="red"))
    summary = result.summary
    table = FittedTable(
        escape(title),
        [
            Column("stage", justify="left"),
            Column("median"),
            Column("interval", drop=4),
            Column("p90", drop=2),
            Column("share", drop=5),
            Column("FLOPs / call", drop=1),
            Column("achieved", drop=3),
            Column("MFU", drop=6),
        ],
    )
    shares = summary.stage_shares()
    for name, stats in summary.stages_s.items():
        if stats.max == 0 and not summary.flops.get(name):
            continue  # a stage this pipeline does not have (DiT encodes no text)
        steps = (result.profile.denoiser_steps if result.profile else None) or spec.steps  # PNDM: --steps + 1
        label = STAGE_LABELS[name] + (f" ({units.steps(steps)})" if name == "denoising" else "")
        share = f"{shares[name][1]:.1f}%"  # means add up, as the stages of every call do
        table.add_row(label, *_stats_cells(stats), share, *_compute(summary, name))
        if name == "denoising":
            table.add_row("  one step", *_stats_cells(summary.step_s), "", *_compute(summary, "step"), style="dim")
    table.add_row(
        "total", *_stats_cells(summary.latency_s), "100%", *_compute(summary, "total"), style="bold", section=True
    )
    latency = summary.latency_s
    table.caption = (
        f"times per call (one batch of {spec.batch_size}); interval: where the median lies, "
        f"{100 * latency.ci_level:.0f}% coverage with {units.counted(latency.n, 'call')} (95% from 6); "
        "share: of the mean call; "
        "FLOPs from the stored profile (1 MAC = 2 FLOPs)"
    )
    return Group(table, _facts(result))


def weights_text(weights: dict[str, int]) -> str:
    """ "4.31 GiB as stored (transformer 3.8 GiB, vae 0.16 GiB, ...)": the largest component first."""
    named = ", ".join(f"{name} {units.gib(bytes_)}" for name, bytes_ in sorted(weights.items(), key=lambda i: -i[1]))
    return f"{units.gib(sum(weights.values()))} as stored ({named})"


def _stats_cells(stats) -> list[str]:
    return [units.seconds(stats.median), _interval(stats.ci_low, stats.ci_high), units.seconds(stats.p90)]


def _interval(low: float, high: float) -> str:
    """Both ends in one unit: "61.52-75.80 ms"."""
    scale, unit = (1.0, "s") if high >= 1 else (1e3, "ms")
    return f"{low * scale:,.2f}-{high * scale:,.2f} {unit}"


def _compute(summary, stage: str) -> list[str]:
    flops, achieved, mfu = summary.flops.get(stage), summary.achieved_tflops.get(stage), summary.mfu.get(stage)
    return [
        units.flops(flops) if flops else "-",
        units.flop_rate(achieved * 1e12) if achieved else "-",
        f"{100 * mfu:.1f}%" if mfu is not None else "-",
    ]


def _facts(result: BenchResult) -> Text:
    summary = result.summary
    memory, energy = summary.peak_memory, summary.energy
    output = "video" if result.spec.num_frames else "image"
    rate = f"{summary.images_per_s:,.3f} {output}s/s"
    if result.spec.num_frames:
        frames = result.spec.num_frames
        rate += f" ({frames} frames each: {summary.images_per_s * frames:,.2f} frames/s)"
    throughput = (  # over every measured call's time: a mean, beside the table's medians
        f"throughput: {rate}, {units.seconds(summary.s_per_image)} per {output}: the mean over the "
        f"{summary.iterations} measured calls ({summary.images} {output}s); the table's times are medians"
    )
    lines = [
        throughput,
        f"load: {units.seconds(result.load_s)}; first call (cold): {units.seconds(result.first_call_s)} "
        f"vs median {units.seconds(summary.latency_s.median)} ({cold_start(summary)})",
    ]
    if memory.cuda_max_allocated_bytes is not None:
        lines.append(
            f"peak memory: {units.gib(memory.cuda_max_allocated_bytes)} allocated, "
            f"{units.gib(memory.cuda_max_reserved_bytes)} reserved (CUDA); "
            f"{units.gib(memory.cuda_loaded_bytes)} after load; "
            f"process peak RSS {units.gib(memory.process_peak_rss_bytes)} ({memory.process_peak_rss_scope})"
        )
    else:
        lines.append(
            f"peak memory: process peak RSS {units.gib(memory.process_peak_rss_bytes)} "
            f"({memory.process_peak_rss_scope})"
        )
    if memory.weights_bytes:
        lines.append(f"weights after loading: {weights_text(memory.weights_bytes)}")
    if energy.available:
        parts = []
        if energy.gpu_j_per_image is not None:
            parts.append(f"GPU {units.joules(energy.gpu_j_per_image)}/{output} at {energy.gpu_avg_power_w:,.0f} W")
        if energy.cpu_j_per_image is not None:
            parts.append(f"CPU {units.joules(energy.cpu_j_per_image)}/{output}")
        if energy.dram_j_per_image is not None:
            parts.append(f"DRAM {units.joules(energy.dram_j_per_image)}/{output}")
        lines.append(f"energy ({energy.source}, {energy.basis}): " + ", ".join(parts))
    else:
        lines.append(f"energy: not measured ({energy.reason})")
    lines.append(f"MFU against {summary.peak.description}" if summary.peak else f"MFU: {summary.mfu_note}")
    if result.parallel is not None:
        from diffmeter.distributed.merge import parallel_lines

        lines += parallel_lines(result.parallel)
    if result.optimizations:
        applied = ", ".join(f"{o.label} ({'lossless' if o.lossless else 'lossy'})" for o in result.optimizations)
        lines.append(f"optimizations: {applied}")
    if link := host_link_line(result):
        lines.append(link)
    if result.speedup is not None:
        lines.append(speedup_line(result))
    if result.quality is not None:
        word = "video" if result.spec.num_frames else "image"
        lines.append(quality_line(result.quality, word) + (RANDOM_QUALITY if result.weights_random else ""))
    if summary.conditions is not None:
        lines.append(conditions_line(summary.conditions))
    lines.append(f"weights: {result.weights}")
    lines += prediction_lines(result)
    if result.trace is not None:
        lines.append(
            f"traced: one extra call after the measured ones ({units.seconds(result.trace.total_s)} under "
            f"torch.profiler): {result.trace.trace_file} (Perfetto, chrome://tracing); operators: show --ops"
        )
    lines += [f"note: {note}" for note in result.notes]
    return Text("\n".join(lines))


def host_link_line(result: BenchResult) -> str | None:
    """An offloaded run's host link (the copy rates its time depends on); None for a run that offloads nothing."""
    if not any(o.name == "offload" for o in result.optimizations):
        return None
    return link_line(result.environment.host_link, result.spec.device.startswith("cuda"))


def cold_start(summary) -> str:
    """What the first call cost beyond the median, and what that is: compilation only where the run counted some."""
    if summary.cold_start_overhead_s <= 0:
        return "no cold-start overhead: the first call was not slower than the median"
    compiled = summary.first_call_compilation
    if compiled is None:
        why = "first-call allocation, lazy initialization, caches, and any compilation (not counted in this older run)"
    elif compiled.clean:
        why = "first-call allocation, lazy initialization, caches; nothing was compiled"
    else:
        why = f"compilation and autotuning ({compiled.text()}), first-call allocation, lazy initialization"
    return f"cold-start overhead {units.seconds(summary.cold_start_overhead_s)}: {why}"


def speedup_line(result: BenchResult) -> str:
    """The run against the unoptimized run its --compare-baseline named, by the rule of every speed-up."""
    folder = result.speedup.baseline
    try:
        baseline = read_result(folder)
    except DiffmeterError:
        return f"speed vs unoptimized: its run is no longer at {folder}, so no speed-up is shown"
    found = speedups.between(baseline, result)
    if found is None:
        return f"speed vs unoptimized: {folder} is not a complete run, so no speed-up is shown"
    word = "video" if result.spec.num_frames else "image"
    return f"speed vs unoptimized (same seeds, per {word}): {found.sentence()}"


def conditions_line(conditions) -> str:
    parts = []
    if conditions.other_processes_cores is not None:
        cores = units.counted(conditions.cpu_count, "core")
        parts.append(f"other processes {conditions.other_processes_cores.mean:.1f} of {cores}")
    if conditions.load_average is not None:
        parts.append(f"load average {conditions.load_average.mean:.1f}")
    if conditions.cpu_mhz is not None:
        parts.append(f"CPU {conditions.cpu_mhz.min:,.0f}-{conditions.cpu_mhz.max:,.0f} MHz")
    if conditions.gpu_sm_mhz is not None:
        parts.append(f"GPU SM {conditions.gpu_sm_mhz.min:,.0f}-{conditions.gpu_sm_mhz.max:,.0f} MHz")
    if conditions.gpu_temperature_c is not None:
        parts.append(f"GPU {conditions.gpu_temperature_c.max:.0f} C at most")
    return "machine during the measured calls: " + (", ".join(parts) or "not sampled (too short)")


#: said after a quality figure of random weights, wherever it is shown
RANDOM_QUALITY = (
    "; random weights: the images are noise, so this is how far the change moves an untrained network's output, "
    "not the model's quality"
)


def quality_line(quality, word: str = "image") -> str:
    """Images (or videos: ``word``) against the unoptimized run's at the same seeds."""
    differing = len(quality.images) - quality.identical  # an identical image's PSNR is infinite: not in the mean
    over = f" over the {differing} differing {word}{'s' if differing != 1 else ''}" if quality.identical else ""
    psnr = (
        f"PSNR mean {quality.mean_psnr_db:.2f} dB{over} (min {quality.min_psnr_db:.2f} dB)"
        if quality.mean_psnr_db is not None
        else "PSNR infinite (identical)"
    )
    clip = (
        f", CLIP score {quality.mean_clip_score:.2f} (baseline {quality.mean_baseline_clip_score:.2f})"
        if quality.mean_clip_score is not None
        else ""
    )
    return (
        f"quality vs unoptimized (same seeds): {psnr}, SSIM mean {quality.mean_ssim:.4f} "
        f"(min {quality.min_ssim:.4f}){clip}, {quality.identical} of {len(quality.images)} {word}s identical"
    )
