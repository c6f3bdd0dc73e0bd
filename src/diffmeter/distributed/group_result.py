"""Rank 0's one stored result of a parallel run, from every rank's own result."""

from __future__ import annotations

import shutil
from pathlib import Path

from diffmeter.distributed import merge
from diffmeter.runs import storage
from diffmeter.runs.parallel_records import Parallel
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.summary import measurement_notes, summarize_run

#: where ranks other than 0 keep their log (and, for a moment, their copies of the images)
RANKS = "ranks"


def group_result(
    spec: BenchSpec, results: list[BenchResult], parallel: Parallel, staging: Path, measured: list[dict]
) -> BenchResult:
    """Rank 0's result with the group's figures: calls as the slowest rank's, every data-parallel
    group's images, energy over all GPUs, FLOPs per GPU, and each rank's own figures kept."""
    first = results[0]
    failed = [(rank, result) for rank, result in enumerate(results) if result.status == "failed"]
    if failed:
        rank, result = failed[0]
        return first.model_copy(update={"status": "failed", "error": f"rank {rank}: {result.error}", "spec": spec})
    context = spec.model_parallel
    leaders = results[::context]

    def group_images(calls) -> int:
        return sum(call.images for call in calls)

    iterations = [
        merge.slowest(list(calls), group_images(calls[::context]))
        for calls in zip(*(r.iterations for r in results), strict=True)
    ]
    firsts = [r.first_call for r in results]
    first_call = merge.slowest(firsts, group_images(firsts[::context]))
    parallel.ranks = [
        merge.rank_record(rank, result, figures)
        for rank, (result, figures) in enumerate(zip(results, measured, strict=True))
    ]
    parallel.images_identical_across_ranks = _identical(results, context, staging) if context > 1 else None
    images = sorted((image for leader in leaders for image in leader.images), key=lambda image: image.seed)
    energy = merge.group_energy(results, sum(call.images for call in iterations))
    memory = max(
        (r.summary.peak_memory for r in results),
        key=lambda m: (m.cuda_max_allocated_bytes or 0, m.process_peak_rss_bytes),
    )
    summary = summarize_run(
        spec,
        iterations,
        memory,
        energy,
        first.profile,
        first_call.total_s,
        first.summary.compilation,
        first.summary.conditions,
        first.summary.first_call_compilation,
    )
    summary = _per_gpu(summary, context)
    video = bool(spec.num_frames)
    own = measurement_notes(first.summary, 0, video)  # rank 0's noise and load notes give way to the group's
    gpus = merge.unit(parallel) == "GPU"
    notes = [
        *(note for note in first.notes if note not in own),
        *measurement_notes(summary, 0, video),
        f"{merge.describe(parallel)}: each call is the slowest rank's, its stages whole (each rank's own under "
        "parallel.ranks); peak memory is the highest rank's"
        + ("; GPU energy is summed over the ranks' GPUs" if gpus else ""),
    ]
    if context > 1:
        notes.append(
            f"FLOPs, achieved TFLOP/s and MFU are per {merge.unit(parallel)}: the denoiser's work is split "
            f"over the {context} model-parallel ranks, the text encoders and the decoder run whole on every rank"
        )
    if parallel.images_identical_across_ranks is False:
        notes.append("the ranks of a model-parallel group produced different pixels: see ranks/rank-N/images")
    return first.model_copy(
        update={
            "spec": spec,
            "iterations": iterations,
            "first_call": first_call,
            "first_call_s": first_call.total_s,
            "warmup_s": [max(calls) for calls in zip(*(r.warmup_s for r in results), strict=True)],
            "summary": summary,
            "images": images,
            "parallel": parallel,
            "notes": notes,
        }
    )


def _identical(results: list[BenchResult], context: int, staging: Path) -> bool:
    """Whether every rank of each model-parallel group saved the pixels its leader saved; the
    copies are removed afterwards (the leader's are the run's images)."""
    identical = True
    for rank, result in enumerate(results):
        if rank % context == 0:
            continue
        copies = staging / RANKS / f"rank-{rank}"
        for image in result.images:
            identical &= merge.same_pixels(staging / image.path, copies / image.path)
        if identical:
            shutil.rmtree(copies / storage.IMAGES, ignore_errors=True)
    return identical


def _per_gpu(summary, context: int):
    """The summary's FLOPs, achieved TFLOP/s and MFU for one GPU of the group."""
    flops = merge.per_gpu_flops(summary.flops, context)
    seconds = {name: stats.median for name, stats in summary.stages_s.items()}
    seconds.update(step=summary.step_s.median, total=summary.latency_s.median)
    achieved = {name: flops[name] / seconds[name] / 1e12 for name in flops if seconds.get(name) and flops[name]}
    mfu = {name: value / summary.peak.tflops for name, value in achieved.items()} if summary.peak else {}
    return summary.model_copy(update={"flops": flops, "achieved_tflops": achieved, "mfu": mfu})
