"""The parallel part of results.json: how the run was split and what each process measured."""

from __future__ import annotations

from pydantic import BaseModel

from diffmeter.measure.energy import Energy
from diffmeter.measure.memory import PeakMemory
from diffmeter.measure.speedup import Speedup
from diffmeter.measure.stats import Stats
from diffmeter.runs.iteration import Iteration


class Communication(BaseModel):
    """Bytes one GPU receives from the others through the context-parallel collectives (all-to-all
    for Ulysses, all-gather for ring attention and the output) and, with CFG parallelism, the other half's
    noise prediction once per step, counted offline."""

    ulysses_degree: int
    ring_degree: int
    cfg_degree: int = 1
    denoiser_calls_per_step: float
    #: the context-parallel collectives of one denoiser call
    bytes_per_denoiser_call: int
    #: CFG parallelism: the other rank's noise prediction for the step's images
    cfg_bytes_per_step: int = 0
    #: every collective of one denoising step
    bytes_per_step: int
    #: calls of each collective in one denoiser call
    collectives_per_denoiser_call: dict[str, int]


class RankRecord(BaseModel):
    """One process as it measured itself (seconds, bytes, joules); ``iterations`` are its own calls."""

    rank: int
    device: str
    first_call_s: float | None = None
    latency_s: Stats
    stages_s: dict[str, Stats]
    peak_memory: PeakMemory
    energy: Energy
    #: bytes this rank received through the collectives in its first denoiser call (a warm-up call)
    measured_bytes_per_denoiser_call: int | None = None
    #: bytes of the denoisers' parameters this rank holds after the parallel layers (its shards under tensor
    #: parallelism; the whole denoiser otherwise)
    denoiser_parameter_bytes: int | None = None
    #: each measured call as this rank timed it (BenchResult.iterations hold the maximum over ranks)
    iterations: list[Iteration] = []


class ScalingRule(Speedup):
    """The speed-up rule's figure (``measure.speedup.Speedup``) for a parallel run against its one-device run."""


#: why a scaling efficiency over 100% is not taken at its word, said wherever one is shown
SUPERLINEAR = (
    "superlinear: over 100% of the processes, which is usually noise or cache effects (each process's share of the "
    "work fitting caches the one-device run's did not), not a gain the parallelism itself makes"
)


def superlinear(efficiency: float) -> bool:
    """Whether a scaling efficiency reads over 100% as shown (to the percent)."""
    return round(efficiency * 100) > 100


class StageScaling(BaseModel):
    """One stage (the whole call, or denoising) against the one-device run: medians over the measured
    calls of each call's seconds per image made."""

    one_device_s_per_image: float
    parallel_s_per_image: float
    #: one_device_s_per_image / parallel_s_per_image
    speedup: float
    #: speedup / processes (for data parallelism: the images/s ratio over the degree)
    efficiency: float
    #: the same two runs by the rule every speed-up is shown with (``runs.speedups.between``: the Hodges-Lehmann
    #: estimate, its interval, the verdict and either run's noise notes); None in runs stored before
    rule: ScalingRule | None = None


class Scaling(BaseModel):
    """The run against the same spec on one device, stored under the same output folder; without one
    (or with one that cannot be compared) ``call`` and ``denoising`` are None and ``reason`` says why."""

    processes: int
    #: the one-device run folder, relative to the output folder
    one_device_run: str | None = None
    one_device_created_utc: str | None = None
    #: the two runs were stored more than an hour apart (conditions may differ)
    measured_apart: bool = False
    call: StageScaling | None = None
    denoising: StageScaling | None = None
    reason: str | None = None


class Parallel(BaseModel):
    """A multi-process run: the degrees, the processes, and whether their images agreed."""

    ulysses_degree: int
    ring_degree: int
    tp_degree: int = 1
    cfg_degree: int = 1
    data_parallel: int
    world_size: int
    #: torch.distributed backend: gloo (CPU) or nccl (CUDA)
    backend: str
    #: "diffmeter" (started its own processes) or "torchrun" (joined an existing launch)
    launcher: str
    #: every rank of a context- or tensor-parallel group produced the same pixels (None: data parallel only)
    images_identical_across_ranks: bool | None = None
    #: context parallelism: what each GPU receives per step, counted offline
    communication: Communication | None = None
    ranks: list[RankRecord] = []
    #: against the one-device run of the same spec under the same output folder, when there is one
    scaling: Scaling | None = None
