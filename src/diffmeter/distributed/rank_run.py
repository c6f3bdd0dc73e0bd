"""One process of a parallel run: join the group, measure its share, and on rank 0 merge every
rank's result into the one result folder.

Ranks are laid out on a (data, ring, ulysses, tp) mesh: ranks of one data-parallel index form a
model-parallel (context- or tensor-parallel) group that generates the same images together; each
data-parallel index takes every ``data_parallel``-th batch of the workload. Rank 0 owns the run
folder; the leader of each group saves its images there, the other ranks save theirs under
``ranks/rank-N/`` only to check they are the same pixels, and keep their log there.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from diffmeter.distributed import communication, context_parallel, merge, scaling
from diffmeter.errors import DiffmeterError
from diffmeter.runs import storage
from diffmeter.runs.parallel_records import Parallel
from diffmeter.runs.results import BenchResult
from diffmeter.runs.runner import measure_run, measurement_notes, prepare, store_failure, summarize_run
from diffmeter.runs.spec import BenchSpec, resolve_device
from diffmeter.runs.workload import Workload

#: the longest any collective (or a rank's absence from one) may take before the run fails
COLLECTIVE_TIMEOUT_S = 600
#: where ranks other than 0 keep their log (and, for a moment, their copies of the images)
RANKS = "ranks"


@dataclasses.dataclass(frozen=True)
class Place:
    """Where this process sits: global rank, its device, its data-parallel index and its rank in its
    model-parallel group."""

    rank: int
    world: int
    device: torch.device
    data_rank: int
    group_rank: int

    @classmethod
    def from_environment(cls, spec: BenchSpec) -> Place:
        """The launcher's environment and the spec's device kind (CUDA when present, unless told otherwise):
        a CUDA rank's device is its LOCAL_RANK, whatever index the spec names."""
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        cuda = resolve_device(spec.device).type == "cuda"
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
        return cls(rank, world, device, rank // spec.model_parallel, rank % spec.model_parallel)

    def enter(self) -> None:
        """Make this rank's device current before anything asks CUDA a question: an index-less query, a
        stream, a workspace or a context made earlier would land on GPU 0 (or split the cores, on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            share_cpu_threads()


class RankWorkload(Workload):
    """The group's workload seen by one data-parallel index: its call ``i`` is the group's batch
    ``i * data_parallel + data_rank``, so the ranks together make every image of a one-process run."""

    def __init__(self, spec: BenchSpec, entry, data_rank: int) -> None:
        super().__init__(spec, entry)
        self.data_rank = data_rank

    def batch(self, iteration: int):
        return super().batch(iteration * self.spec.data_parallel + self.data_rank)


@dataclasses.dataclass
class SplitDenoiser:
    """Applied by the runner after loading: diffusers' context (or tensor) parallelism on every denoiser."""

    names: list[str]
    mesh: object
    spec: BenchSpec
    device: torch.device
    #: what the collectives moved in the first denoiser call (communication.count_first_call)
    measured: dict = dataclasses.field(default_factory=dict)

    def apply(self, pipe) -> None:
        models = [getattr(pipe, name) for name in self.names if getattr(pipe, name, None) is not None]
        for model in models:
            if self.spec.tp_degree > 1:
                context_parallel.enable_tensor_parallel(model, self.mesh)
            else:
                context_parallel.enable(model, self.mesh, self.spec.ring_degree, self.spec.ulysses_degree, self.device)
        if self.spec.context_degree > 1:
            communication.count_first_call(models[0], self.measured)


def share_cpu_threads() -> None:
    """CPU ranks split the machine's cores between them (each would otherwise start one torch thread per
    core, oversubscribing it N times), unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" not in os.environ:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def run(spec: BenchSpec, out: str | Path, force: bool, launcher: str) -> Path | None:
    """This rank's part of ``spec``; rank 0 returns the run folder it wrote, the others None."""
    place = Place.from_environment(spec)
    if place.world != spec.world_size:
        raise DiffmeterError(
            f"this launch has {place.world} processes but the degrees (ulysses x ring x tp x data parallel) need "
            f"{spec.world_size}; match --nproc-per-node to them"
        )
    place.enter()
    prepared = prepare(spec, device=place.device)  # the memory check reads this rank's own GPU
    parallel = Parallel(
        ulysses_degree=spec.ulysses_degree,
        ring_degree=spec.ring_degree,
        tp_degree=spec.tp_degree,
        data_parallel=spec.data_parallel,
        world_size=place.world,
        backend="nccl" if place.device.type == "cuda" else "gloo",
        launcher=launcher,
    )
    # before joining: the count runs over a fake group; ring attention's backends do not run on meta
    if place.rank == 0 and spec.ulysses_degree > 1 and spec.ring_degree == 1:
        family, profile_spec = prepared.target.family, prepared.spec.profile_spec()
        parallel.communication = communication.offline(
            prepared.entry,
            family,
            profile_spec.with_defaults(prepared.entry.defaults),
            spec.ulysses_degree,
            spec.ring_degree,
        )
    dist.init_process_group(parallel.backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        return _run(prepared, out, force, place, parallel)
    finally:
        dist.destroy_process_group()


def _run(prepared, out, force: bool, place: Place, parallel: Parallel) -> Path | None:
    spec = prepared.spec
    entry, family = prepared.entry, prepared.target.family
    rank_spec = spec.model_copy(update={"device": str(place.device)})
    target = dataclasses.replace(prepared.target, device=place.device)
    degrees = (spec.data_parallel, spec.ring_degree, spec.ulysses_degree, spec.tp_degree)
    mesh = context_parallel.device_mesh(place.device, *degrees)
    folder = storage.RunDirectory(out, prepared.name, force, spec)
    shared = [str(folder.open()) if place.rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    staging = Path(shared[0])
    own = staging if place.rank == 0 else staging / RANKS / f"rank-{place.rank}"
    saves = staging if place.group_rank == 0 else own  # each group's leader saves the run's images
    for where in {own, saves}:  # made by the rank that writes there, not left to rank 0's timing
        (where / storage.IMAGES).mkdir(parents=True, exist_ok=True)
    log = storage.file_logger(own)
    try:
        log.info(
            "rank %d of %d on %s (%s, %s), process %d",
            place.rank,
            place.world,
            place.device,
            parallel.backend,
            parallel.launcher,
            os.getpid(),
        )
        if place.rank == 0:
            requests = Workload(spec, entry).requests(spec.iterations * spec.data_parallel)
            storage.write_json(staging / storage.REQUESTS, requests)
        split = None
        if spec.model_parallel > 1:
            split = SplitDenoiser(list(family.denoisers(entry)), mesh, spec, place.device)
        result = measure_run(
            rank_spec,
            entry,
            prepared.source,
            RankWorkload(spec, entry, place.data_rank),
            prepared.profile,
            saves,
            log,
            lambda *_: None,
            prepared.optimizations,
            target,
            split,
        )
        gathered = [None] * place.world if place.rank == 0 else None
        measured = split.measured.get("bytes") if split is not None else None
        dist.gather_object((result.model_dump_json(), measured), gathered, dst=0)
        if place.rank != 0:
            return None
        results = [BenchResult.model_validate_json(text) for text, _ in gathered]
        merged = group_result(spec, results, parallel, staging, [bytes_ for _, bytes_ in gathered])
        if merged.status == "complete":
            labels = [optimization.label() for optimization in prepared.optimizations]
            single = scaling.one_device_name(spec, entry, labels)
            merged.parallel.scaling = scaling.against_one_device(merged, out, single)
        log.info("done: %s", merged.status)
        storage.close_logger(log)
        return folder.commit(merged)
    except Exception as error:
        log.exception("failed")
        if place.rank != 0:
            raise
        storage.close_logger(log)
        folder.discard()
        reason = f"rank 0: {(str(error) or type(error).__name__).splitlines()[0]}"
        failed = store_failure(prepared, out, reason)
        raise DiffmeterError(f"{reason} (recorded as a failed result in {failed})") from error
    finally:
        storage.close_logger(log)


def group_result(
    spec: BenchSpec, results: list[BenchResult], parallel: Parallel, staging: Path, measured: list[int | None]
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
        merge.rank_record(rank, result, moved)
        for rank, (result, moved) in enumerate(zip(results, measured, strict=True))
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
    )
    summary = _per_gpu(summary, context)
    own = measurement_notes(first.summary, 0)  # rank 0's noise and load notes give way to the group's
    notes = [
        *(note for note in first.notes if note not in own),
        *measurement_notes(summary, 0),
        f"{merge.describe(parallel)}: each call's stages are the slowest rank's (each rank's own under "
        "parallel.ranks); peak memory is the highest rank's; GPU energy is summed over the ranks' GPUs",
    ]
    if context > 1:
        notes.append(
            "FLOPs, achieved TFLOP/s and MFU are per GPU: the denoiser's work is split over the "
            f"{context} model-parallel ranks, the text encoders and the decoder run whole on every rank"
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
