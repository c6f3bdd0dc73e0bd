"""A measured run as a terminal table: where the time went, how fast, how big, how hungry."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from diffmeter import units
from diffmeter.bench.results import BenchResult

STAGE_LABELS = {
    "text_encoding": "text encoding",
    "denoising": "denoising",
    "vae_decode": "VAE decode",
    "other": "other",
}


def run_table(result: BenchResult) -> Group:
    spec = result.spec
    device = f"CPU ({result.environment.cpu})"
    if spec.device.startswith("cuda"):
        device = result.environment.devices[int(spec.device.partition(":")[2] or 0)]
    frames = f"x{spec.num_frames}f" if spec.num_frames else ""
    title = (
        f"{result.model.name} ({result.model.id}) on {device}: {spec.width}x{spec.height}{frames}, "
        f"{spec.steps} steps, batch {spec.batch_size}, guidance {spec.guidance_scale:g}, {spec.dtype}"
    )
    if result.status != "complete" or result.summary is None:
        return Group(Text(title, style="bold"), Text(f"failed: {result.error}", style="red"))
    summary = result.summary
    table = Table(title=escape(title), title_justify="left")
    for column in ("stage", "median", "mean", "p90", "std", "share", "FLOPs / call", "achieved", "MFU"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    total_median = summary.latency_s.median
    for name, stats in summary.stages_s.items():
        if stats.max == 0 and not summary.flops.get(name):
            continue  # a stage this pipeline does not have (DiT encodes no text)
        label = STAGE_LABELS[name] + (f" ({spec.steps} steps)" if name == "denoising" else "")
        share = f"{100 * stats.median / total_median:.1f}%"
        table.add_row(label, *_stats_cells(stats), share, *_compute(summary, name))
        if name == "denoising":
            table.add_row("  one step", *_stats_cells(summary.step_s), "", *_compute(summary, "step"), style="dim")
    table.add_section()
    table.add_row("total", *_stats_cells(summary.latency_s), "100%", *_compute(summary, "total"), style="bold")
    table.caption = "times per call (one batch); FLOPs from the stored profile (1 MAC = 2 FLOPs)"
    return Group(table, _facts(result))


def _stats_cells(stats) -> list[str]:
    return [units.seconds(stats.median), units.seconds(stats.mean), units.seconds(stats.p90), units.seconds(stats.std)]


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
    lines = [
        f"throughput: {summary.images_per_s:,.3f} images/s, {units.seconds(summary.s_per_image)} per image "
        f"({summary.iterations} iterations, {summary.images} images)",
        f"load: {units.seconds(result.load_s)}; first call (cold): {units.seconds(result.first_call_s)} "
        f"vs median {units.seconds(summary.latency_s.median)} ({_cold_start(summary.cold_start_overhead_s)})",
    ]
    if memory.cuda_max_allocated_bytes is not None:
        lines.append(
            f"peak memory: {units.nbytes(memory.cuda_max_allocated_bytes)} allocated, "
            f"{units.nbytes(memory.cuda_max_reserved_bytes)} reserved (CUDA); "
            f"{units.nbytes(memory.cuda_loaded_bytes)} after load; "
            f"process peak RSS {units.nbytes(memory.process_peak_rss_bytes)} ({memory.process_peak_rss_scope})"
        )
    else:
        lines.append(
            f"peak memory: process peak RSS {units.nbytes(memory.process_peak_rss_bytes)} "
            f"({memory.process_peak_rss_scope})"
        )
    if energy.available:
        parts = []
        if energy.gpu_j_per_image is not None:
            parts.append(f"GPU {units.joules(energy.gpu_j_per_image)}/image at {energy.gpu_avg_power_w:,.0f} W")
        if energy.cpu_j_per_image is not None:
            parts.append(f"CPU {units.joules(energy.cpu_j_per_image)}/image")
        if energy.dram_j_per_image is not None:
            parts.append(f"DRAM {units.joules(energy.dram_j_per_image)}/image")
        lines.append(f"energy ({energy.source}, {energy.basis}): " + ", ".join(parts))
    else:
        lines.append(f"energy: not measured ({energy.reason})")
    lines.append(f"MFU against {summary.peak.description}" if summary.peak else f"MFU: {summary.mfu_note}")
    if result.optimizations:
        applied = ", ".join(f"{o.label} ({'lossless' if o.lossless else 'lossy'})" for o in result.optimizations)
        lines.append(f"optimizations: {applied}")
    if result.quality is not None:
        lines.append(quality_line(result.quality))
    lines.append(f"weights: {result.weights}")
    lines += [f"note: {note}" for note in result.notes]
    return Text("\n".join(lines))


def _cold_start(overhead_s: float) -> str:
    if overhead_s <= 0:
        return "no cold-start overhead: the first call was not slower than the median"
    return f"cold-start overhead {units.seconds(overhead_s)}: compilation, autotuning, lazy init"


def quality_line(quality) -> str:
    psnr = (
        f"PSNR mean {quality.mean_psnr_db:.2f} dB (min {quality.min_psnr_db:.2f} dB)"
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
        f"(min {quality.min_ssim:.4f}){clip}, {quality.identical} of {len(quality.images)} images identical"
    )
