"""One GPU of a context- and/or CFG-parallel group: its peak memory and the generation's time, from the single-GPU
prediction with each denoiser call replaced by what one rank runs (``RankCall``: counted by running diffusers' own
parallel layers on fake tensors, ``distributed.rank_prediction``), plus the bytes it receives over the card's link.

Every rank runs the whole pipeline: its text encoders, its VAE and the denoiser's inputs are the single GPU's; only
the denoiser calls differ (diffusers 0.42.1 splits the transformer alone: ``hooks/context_parallel.py:129,220``).
Their collectives are timed apart, at the link's datasheet rate per direction: diffusers waits on each at once
(``models/attention_dispatch.py:2137``, ``_all_to_all_single``'s ``_wait_tensor``; ring's ``all_gather_tensor`` at
2416 is chunked and read right away), so no compute hides them."""

from __future__ import annotations

from pydantic import BaseModel

from diffmeter.predict.devices import Device, nvlinks
from diffmeter.predict.roofline import at_least, overlapped
from diffmeter.predict.schema import (
    DENOISING_STEP,
    CallWork,
    MemoryPrediction,
    OperatorGroup,
    OperatorWork,
    StageTime,
    TimePrediction,
)

#: the denoising stage as a memory prediction and an operator work name it
STAGES_OF_DENOISING = (DENOISING_STEP, "denoising")

#: what the predicted time leaves out, in ``time_left_out`` (``cli.profile_output``)
NOT_CALIBRATED = (
    "multi-GPU communication: timed at the link's datasheet rate, not calibrated on published multi-GPU runs "
    "(no per-collective latency, no achieved fraction)"
)


class RankCall(BaseModel):
    """One denoiser call of the plan as one rank runs it: its own activations (bytes), operators (collectives left
    out), host issue counts, how many times per generation it runs there, and the bytes it receives from the other
    ranks per call."""

    activation_bytes: int
    operators: list[OperatorGroup]
    dispatched: int
    modules: int
    count: int
    received_bytes: int
    collectives: dict[str, int] = {}


class Link(BaseModel):
    """The GPU-to-GPU link the ranks' collectives cross: its name, rate per direction (bytes/s) and source."""

    name: str
    bytes_per_s: float
    source: str


class ParallelPrediction(BaseModel):
    """What one GPU of the group holds and receives, and what the time assumes (bytes, seconds)."""

    ulysses_degree: int
    ring_degree: int
    cfg_degree: int
    gpus: int
    #: the same generation on one GPU, for comparison
    one_gpu_peak_memory_bytes: int
    per_gpu_peak_memory_bytes: int
    bytes_received_per_gpu: int
    collectives_per_generation: int
    link: Link | None
    #: the communication's time over ``link``, added to the denoising stage (None: no link known)
    communication_s: float | None
    communication_calibrated: bool = False
    assumptions: list[str] = []


def gpu_link(device: Device, gpus: int) -> Link | None:
    """The link between ``gpus`` cards of ``device``: NVLink where the table has it (a bridge joins two cards only),
    else the card's PCIe link (peer copies through a PCIe switch at most at the x16 rate); per direction."""
    row = nvlinks().get(device.name)
    if row and row.get("gb_s") and not ("bridge" in row["link"] and gpus > 2):
        return Link(
            name=f"{row['link']}, {row['gb_s'] / 2:g} GB/s per direction",
            bytes_per_s=row["gb_s"] / 2 * 1e9,
            source=row["source"],
        )
    if device.host_link_bytes_per_s:
        why = "no NVLink in the table" if not row or not row.get("gb_s") else f"the NVLink bridge joins 2, not {gpus}"
        return Link(
            name=f"{device.host_link}, {device.host_link_bytes_per_s / 1e9:g} GB/s per direction ({why})",
            bytes_per_s=device.host_link_bytes_per_s,
            source="data/host_links.json",
        )
    return None


def _denoiser_indexes(calls: list, denoisers: list[str]) -> list[int]:
    """Where the denoiser calls are among a memory prediction's or an operator work's calls (both in plan order)."""
    return [i for i, call in enumerate(calls) if call.stage in STAGES_OF_DENOISING and call.component in denoisers]


def per_gpu_memory(memory: MemoryPrediction, ranks: list[RankCall]) -> MemoryPrediction:
    """``memory`` as one rank holds it: each denoiser call's activations its rank's (weights and the pipeline's
    tensors are every rank's); each stage's peak its heaviest call."""
    calls = list(memory.calls)
    indexes = _denoiser_indexes(calls, memory.denoisers)
    if len(indexes) != len(ranks):
        raise ValueError(f"{len(ranks)} rank calls for {len(indexes)} denoiser calls")
    for index, rank in zip(indexes, ranks, strict=True):
        call = calls[index]
        peak = call.resident_param_bytes + call.carried_bytes + rank.activation_bytes
        calls[index] = call.model_copy(
            update={"activation_bytes": rank.activation_bytes, "count": rank.count, "peak_bytes": peak}
        )
    stages = {}
    for call in calls:
        if call.stage not in stages or call.peak_bytes > stages[call.stage].peak_bytes:
            stages[call.stage] = call
    ordered = [stages[stage.stage] for stage in memory.stages]
    top = max(ordered, key=lambda s: s.peak_bytes)
    return memory.model_copy(update={"calls": calls, "stages": ordered, "peak_bytes": top.peak_bytes,
                                     "peak_stage": top.stage})  # fmt: skip


def per_gpu_work(work: OperatorWork, denoisers: list[str], ranks: list[RankCall]) -> OperatorWork:
    """``work`` as one rank runs it: each denoiser call's operators and counts its rank's."""
    calls: list[CallWork] = list(work.calls)
    indexes = _denoiser_indexes(calls, denoisers)
    if len(indexes) != len(ranks):
        raise ValueError(f"{len(ranks)} rank calls for {len(indexes)} denoiser calls")
    for index, rank in zip(indexes, ranks, strict=True):
        update = {"operators": rank.operators, "count": rank.count, "dispatched": rank.dispatched}
        calls[index] = calls[index].model_copy(update={**update, "modules": rank.modules})
    return work.model_copy(update={"calls": calls})


def with_communication(time: TimePrediction, seconds: float) -> TimePrediction:
    """``time`` (one rank's work) with ``seconds`` of communication in its denoising stage: on the GPU's side (the
    stream waits for each collective; the host issues on), so the stage takes the longer of the GPU's time and
    communication and the host's; the lower bound with it too; the energy left out (one card's board power does not
    price a group)."""

    def plus(stage: StageTime) -> StageTime:
        if stage.stage not in STAGES_OF_DENOISING:
            return stage
        lower = stage.lower_s + seconds
        gpu = stage.gpu_s or stage.expected_s
        if gpu is None:
            return stage.model_copy(update={"lower_s": lower})
        gpu = (gpu[0] + seconds, gpu[1] + seconds)
        expected = at_least(overlapped(gpu, stage.host_s), lower)
        return stage.model_copy(
            update={"lower_s": lower, "expected_s": expected, "gpu_s": gpu if stage.host_s else None}
        )

    stages = [plus(stage) for stage in time.stages]
    expected = None
    if time.expected_s:
        before = sum(stage.expected_s[0] for stage in time.stages), sum(stage.expected_s[1] for stage in time.stages)
        after = sum(stage.expected_s[0] for stage in stages), sum(stage.expected_s[1] for stage in stages)
        expected = (time.expected_s[0] + after[0] - before[0], time.expected_s[1] + after[1] - before[1])
    return time.model_copy(
        update={
            "stages": stages,
            "lower_s": time.lower_s + seconds,
            "expected_s": expected,
            "energy": None,
            "energy_left_out": "several GPUs: the energy of a group is not predicted",
        }
    )


def summarize(
    degrees: tuple[int, int, int], peaks: tuple[int, int], ranks: list[RankCall], link: Link | None,
    extra_bytes: int = 0, assumptions: tuple[str, ...] = (),
) -> ParallelPrediction:  # fmt: skip
    """The group's figures: ``degrees`` (ulysses, ring, cfg); ``peaks``: one GPU's alone and each GPU's of the group,
    under the run's memory techniques; ``extra_bytes``: received outside the denoiser calls (the other CFG half's
    predictions)."""
    ulysses, ring, cfg = degrees
    received = sum(rank.received_bytes * rank.count for rank in ranks) + extra_bytes
    collectives = sum(sum(rank.collectives.values()) * rank.count for rank in ranks)
    return ParallelPrediction(
        ulysses_degree=ulysses,
        ring_degree=ring,
        cfg_degree=cfg,
        gpus=ulysses * ring * cfg,
        one_gpu_peak_memory_bytes=peaks[0],
        per_gpu_peak_memory_bytes=peaks[1],
        bytes_received_per_gpu=received,
        collectives_per_generation=collectives,
        link=link,
        communication_s=received / link.bytes_per_s if link else None,
        assumptions=list(assumptions),
    )
