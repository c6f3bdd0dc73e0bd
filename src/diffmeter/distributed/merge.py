"""The ranks' own results as the one stored result: each call as the slowest rank's, its stages whole,
images from every data-parallel group, energy summed over the GPUs, FLOPs per GPU."""

from __future__ import annotations

from diffmeter.measure.energy import Energy
from diffmeter.runs.parallel_records import Parallel, RankRecord
from diffmeter.runs.results import BenchResult, Iteration


def slowest(calls: list[Iteration], images: int) -> Iteration:
    """One call of the group: the slowest rank's call, its stages whole, so they add up to its time (the maximum
    per stage over the ranks counted a rank's wait on another's slower stage in both: a CFG group's stages summed to
    1.5x its call)."""
    call = max(calls, key=lambda call: call.total_s)
    return call.model_copy(update={"images": images, "wall_s": max(c.wall_s for c in calls)})


def group_energy(ranks: list[BenchResult], images: int) -> Energy:
    """GPU joules summed over every rank's GPU (each rank's Zeus window on its own index);
    CPU and DRAM from rank 0 alone, whose RAPL counters already cover the whole machine."""
    energies = [rank.summary.energy for rank in ranks]
    first = energies[0]
    if not all(energy.available for energy in energies):
        reasons = {energy.reason for energy in energies if not energy.available}
        return Energy.unavailable("; ".join(sorted(r for r in reasons if r)) or "a rank measured no energy")
    iterations = ranks[0].summary.iterations
    gpu = None
    if all(energy.gpu_j_per_iteration is not None for energy in energies):
        gpu = sum(energy.gpu_j_per_iteration for energy in energies) * iterations
    power = [energy.gpu_avg_power_w for energy in energies]
    cpu = None if first.cpu_j_per_iteration is None else first.cpu_j_per_iteration * iterations
    dram = None if first.dram_j_per_iteration is None else first.dram_j_per_iteration * iterations

    def per(value, count):
        return None if value is None else value / count

    return Energy(
        available=True,
        source=first.source,
        gpu_indices=sorted({index for energy in energies for index in energy.gpu_indices}),
        cpu_indices=first.cpu_indices,
        basis=first.basis,
        loop_s=max(energy.loop_s or 0.0 for energy in energies),
        gpu_j_per_iteration=per(gpu, iterations),
        gpu_j_per_image=per(gpu, images),
        gpu_avg_power_w=None if None in power else sum(power),
        cpu_j_per_iteration=first.cpu_j_per_iteration,
        cpu_j_per_image=per(cpu, images),
        dram_j_per_iteration=first.dram_j_per_iteration,
        dram_j_per_image=per(dram, images),
    )


def per_gpu_flops(flops: dict[str, int], model_parallel: int) -> dict[str, int]:
    """Each GPU's share of a call's FLOPs: the denoiser's work is split over the context- or
    tensor-parallel ranks; the text encoders and the decoder run whole on every rank."""
    shared = {name: flops[name] // model_parallel for name in ("denoising", "step") if name in flops}
    result = {**flops, **shared}
    result["total"] = flops["total"] - flops.get("denoising", 0) + shared.get("denoising", 0)
    return result


def same_pixels(first, second) -> bool:
    """Two saved outputs (images, or videos frame by frame) hold the same pixels."""
    import torch

    from diffmeter.measure.quality import load_frames

    return torch.equal(load_frames(first), load_frames(second))


def rank_record(rank: int, result: BenchResult, measured: dict) -> RankRecord:
    """One rank's own figures; ``measured``: what its group layer counted (bytes received in the first
    denoiser call, parameter bytes it holds)."""
    summary = result.summary
    return RankRecord(
        rank=rank,
        device=result.spec.device,
        first_call_s=result.first_call_s,
        latency_s=summary.latency_s,
        stages_s=summary.stages_s,
        peak_memory=summary.peak_memory,
        energy=summary.energy,
        measured_bytes_per_denoiser_call=measured.get("bytes"),
        denoiser_parameter_bytes=measured.get("parameter_bytes"),
        iterations=result.iterations,
    )


def describe(parallel: Parallel) -> str:
    return (
        f"{parallel.world_size} processes over {parallel.backend} (ulysses {parallel.ulysses_degree} x ring "
        f"{parallel.ring_degree} x tensor parallel {parallel.tp_degree} x CFG {parallel.cfg_degree} x data parallel "
        f"{parallel.data_parallel}, "
        f"started by {parallel.launcher})"
    )


def unit(parallel: Parallel) -> str:
    """What one rank holds: a GPU (NCCL), or a process sharing this machine's cores (gloo, CPU)."""
    return "GPU" if parallel.backend == "nccl" else "process"


def parallel_lines(parallel: Parallel) -> list[str]:
    """The run table's lines for a parallel run: the processes, each rank's median, communication."""
    from diffmeter import units

    medians = ", ".join(f"rank {r.rank} {units.seconds(r.latency_s.median)}" for r in parallel.ranks)
    lines = [f"parallel: {describe(parallel)}; each rank's median call: {medians}"]
    moved = parallel.communication
    if moved is not None:
        measured = {r.measured_bytes_per_denoiser_call for r in parallel.ranks} - {None}
        check = ", ".join(units.gib(value) for value in sorted(measured))
        parts = []
        if moved.ulysses_degree * moved.ring_degree > 1:
            parts.append(f"context parallel {units.gib(moved.bytes_per_denoiser_call)} per denoiser call")
        if moved.cfg_degree > 1:
            parts.append(f"CFG {units.gib(moved.cfg_bytes_per_step)} per step (the other half's prediction)")
        received = units.gib(moved.bytes_per_step)
        first = f"; measured: {check} received in the first denoiser call (counted at the collectives)"
        lines.append(
            f"communication per {unit(parallel)}: {received} received per denoising step (offline: "
            f"{'; '.join(parts)})" + (first if check else "")
        )
    if parallel.scaling is not None:
        from diffmeter.distributed.scaling import line

        lines.append(line(parallel.scaling))
    return lines
