"""One GPU of a context-, tensor- and/or CFG-parallel group: its peak memory and the generation's time, from the
single-GPU prediction with each denoiser call replaced by what one rank runs (``RankCall``: counted by running
diffusers' own parallel layers on fake tensors, ``distributed.rank_prediction``), plus the bytes it receives over the
card's link.

Every rank runs the whole pipeline: its text encoders, its VAE and the denoiser's inputs are the single GPU's; only
the denoiser calls differ (diffusers 0.42.1 splits the transformer alone: ``hooks/context_parallel.py:129,220``),
and under tensor parallelism the denoiser's weights (each rank its shard). The collectives are timed apart
(``communication_seconds``): diffusers waits on each at once (``models/attention_dispatch.py:2137``,
``_all_to_all_single``'s ``_wait_tensor``; ring's ``all_gather_tensor`` at 2416 is chunked and read right away;
``RowwiseParallel``'s all-reduce before the next layer), so they add to the GPU's time; their price per collective
and per byte, and the share of ring attention's K/V passing the published ring implementations hide, are fitted on
published multi-GPU runs (``CommunicationFit``, benchmarks/calibrate_parallel.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from diffmeter.predict.devices import Device, nvlinks
from diffmeter.predict.expected_range import at_least, overlapped
from diffmeter.predict.schema import (
    DENOISING_STEP,
    CallWork,
    Link,
    MemoryPrediction,
    OperatorGroup,
    OperatorWork,
    ParallelPrediction,
    StageTime,
    TimePrediction,
)

#: the denoising stage as a memory prediction and an operator work name it
STAGES_OF_DENOISING = (DENOISING_STEP, "denoising")

#: what the predicted time leaves out, in ``time_left_out`` (``cli.profile_output``)
NOT_CALIBRATED = (
    "multi-GPU communication: timed at the link's datasheet rate (no per-collective latency, no achieved fraction, no "
    "host issue cost): fitted on published multi-GPU runs it did no better held out a source at a time "
    "(benchmarks/results/calibration_parallel.md), so the fit is not used"
)
#: what the multi-GPU time never models, in ``time_left_out`` beside the techniques
LEFT_OUT = (
    "several GPUs: PipeFusion, a parallel VAE decode and collectives compiled into a graph are not modelled; no "
    "communication but ring attention's K/V passing is overlapped with compute"
)
#: the communication model's fitted parameters (benchmarks/calibrate_parallel.py writes it)
COMMUNICATION_FIT = Path(__file__).parent / "data" / "parallel_communication.json"
#: the collectives ring attention passes K and V with: the published ring implementations (xDiT, ParaAttention)
#: overlap them with the attention of the block in hand
RING_COLLECTIVES = ("all_gather_into_tensor",)


class CommunicationFit(BaseModel):
    """The communication's cost beyond its bytes at the datasheet rate, fitted on published multi-GPU runs:
    ``bandwidth_fraction`` of the link's rate per direction the collectives achieve; ``latency_s`` each collective
    costs the GPU whatever its size (the ranks' synchronization); ``ring_overlap`` the share of ring attention's K/V
    passing hidden behind attention compute; ``host_s_per_collective`` the host's time to issue each collective with
    the reshapes around it (an eager run's host side, which splitting the work over more GPUs does not shorten)."""

    bandwidth_fraction: float
    latency_s: float
    ring_overlap: float
    host_s_per_collective: float = 0.0
    held_out: str = ""
    #: whether the prediction uses it: only where, held out a source at a time, it does better than the datasheet
    used: bool = False
    #: the held-out figure of the multi-GPU range the prediction gives (this fit's where used, else the datasheet
    #: rate's), with its misses' direction: what ``profile --gpu`` prints as the range's calibration
    claim: str = ""


def stored_communication_fit() -> CommunicationFit | None:
    """The fit benchmarks/calibrate_parallel.py stored, used or not; None before one was made."""
    if not COMMUNICATION_FIT.exists():
        return None
    return CommunicationFit.model_validate_json(COMMUNICATION_FIT.read_text())


def communication_fit() -> CommunicationFit | None:
    """The fit the prediction uses; None: the datasheet rate (no fit made, or one that did no better held out)."""
    fit = stored_communication_fit()
    return fit if fit is not None and fit.used else None


def communication_seconds(
    received: dict[str, int], calls: dict[str, int], link: Link, fit: CommunicationFit | None
) -> float:
    """Seconds one GPU spends in its collectives per generation: ``received`` bytes and ``calls`` per kind of
    collective; at the datasheet rate with no latency when ``fit`` is None."""
    if fit is None:
        return sum(received.values()) / link.bytes_per_s
    total = 0.0
    for kind in set(received) | set(calls):
        seconds = calls.get(kind, 0) * fit.latency_s + received.get(kind, 0) / (
            fit.bandwidth_fraction * link.bytes_per_s
        )
        total += seconds * (1 - fit.ring_overlap) if kind in RING_COLLECTIVES else seconds
    return total


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
    #: the bytes received per call in each kind of collective (they sum to ``received_bytes``)
    received_by_collective: dict[str, int] = {}
    #: its layers' activation levels (``StageMemory.layer_levels``), where a quantized layer's copies add
    layer_levels: dict[str, tuple[int, int, int]] = {}
    #: under tensor parallelism: the parameters and buffers of its denoiser this rank holds (its shard); None: whole
    param_bytes: int | None = None
    #: the batch this rank's call runs (batched CFG parallel: its half of the CFG-doubled batch); None: the call's
    batch: int | None = None
    #: the chains of fusible operators it runs and the bytes they move once each is one kernel (``CallWork``'s)
    fused_chains: int | None = None
    fused_bytes: int | None = None


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
    """``memory`` as one rank holds it: each denoiser call's activations its rank's; weights and the pipeline's
    tensors every rank's, but a tensor-parallel denoiser's weights its shard, in every stage (it stays loaded) and in
    the weights each call reads; each stage's peak its heaviest call."""
    calls = list(memory.calls)
    indexes = _denoiser_indexes(calls, memory.denoisers)
    if len(indexes) != len(ranks):
        raise ValueError(f"{len(ranks)} rank calls for {len(indexes)} denoiser calls")
    shards = {calls[i].component: rank.param_bytes for i, rank in zip(indexes, ranks, strict=True)}
    shards = {name: held for name, held in shards.items() if held is not None}
    saved = sum(memory.component_param_bytes[name] - held for name, held in shards.items())
    for index, call in enumerate(calls):
        calls[index] = call.model_copy(
            update={
                "resident_param_bytes": call.resident_param_bytes - saved,
                "component_param_bytes": shards.get(call.component, call.component_param_bytes),
                "peak_bytes": call.peak_bytes - saved,
            }
        )
    for index, rank in zip(indexes, ranks, strict=True):
        call = calls[index]
        peak = call.resident_param_bytes + call.carried_bytes + rank.activation_bytes
        calls[index] = call.model_copy(
            update={
                "activation_bytes": rank.activation_bytes,
                "layer_levels": rank.layer_levels,
                "count": rank.count,
                "batch": rank.batch or call.batch,
                "peak_bytes": peak,
            }
        )
    stages = {}
    for call in calls:
        if call.stage not in stages or call.peak_bytes > stages[call.stage].peak_bytes:
            stages[call.stage] = call
    ordered = [stages[stage.stage] for stage in memory.stages]
    top = max(ordered, key=lambda s: s.peak_bytes)
    reads = {
        name: read - (memory.component_param_bytes[name] - shards[name]) if name in shards else read
        for name, read in memory.weight_read_bytes.items()
    }
    return memory.model_copy(
        update={
            "calls": calls,
            "stages": ordered,
            "peak_bytes": top.peak_bytes,
            "peak_stage": top.stage,
            "component_param_bytes": {**memory.component_param_bytes, **shards},
            "weight_read_bytes": reads,
        }
    )


def per_gpu_work(work: OperatorWork, denoisers: list[str], ranks: list[RankCall]) -> OperatorWork:
    """``work`` as one rank runs it: each denoiser call's operators, counts, fused chains and bytes its rank's."""
    calls: list[CallWork] = list(work.calls)
    indexes = _denoiser_indexes(calls, denoisers)
    if len(indexes) != len(ranks):
        raise ValueError(f"{len(ranks)} rank calls for {len(indexes)} denoiser calls")
    for index, rank in zip(indexes, ranks, strict=True):
        update = {"operators": rank.operators, "count": rank.count, "dispatched": rank.dispatched}
        fused = {"fused_chains": rank.fused_chains, "fused_bytes": rank.fused_bytes}
        calls[index] = calls[index].model_copy(update={**update, "modules": rank.modules, **fused})
    return work.model_copy(update={"calls": calls})


def range_claim() -> str:
    """What the multi-GPU range's held-out test found (``CommunicationFit.claim``), or that none was made."""
    fit = stored_communication_fit()
    if fit is None or not fit.claim:
        return "the multi-GPU range: no held-out test on published multi-GPU runs (benchmarks/calibrate_parallel.py)"
    return fit.claim


def with_communication(time: TimePrediction, seconds: float, host_seconds: float = 0.0) -> TimePrediction:
    """``time`` (one rank's work) with ``seconds`` of communication in its denoising stage: on the GPU's side (the
    stream waits for each collective; the host issues on), and ``host_seconds`` of the host's issuing them on its
    side, so the stage takes the longer of the GPU's time and communication and the host's; the lower bound with
    the communication too; the energy left out (one card's board power does not price a group); the range's
    calibration its own held-out figure (``range_claim``), not the single GPU's."""

    def plus(stage: StageTime) -> StageTime:
        if stage.stage not in STAGES_OF_DENOISING:
            return stage
        lower = stage.lower_s + seconds
        gpu = stage.gpu_s or stage.expected_s
        if gpu is None:
            return stage.model_copy(update={"lower_s": lower})
        gpu = (gpu[0] + seconds, gpu[1] + seconds)
        host = (stage.host_s[0] + host_seconds, stage.host_s[1] + host_seconds) if stage.host_s else None
        expected = at_least(overlapped(gpu, host), lower)
        return stage.model_copy(
            update={"lower_s": lower, "expected_s": expected, "gpu_s": gpu if host else None, "host_s": host}
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
            "calibration": range_claim() if expected else time.calibration,
            "energy": None,
            "energy_left_out": "several GPUs: the energy of a group is not predicted",
        }
    )


def summarize(
    degrees: tuple[int, int, int, int], peaks: tuple[int, int], ranks: list[RankCall], link: Link | None,
    extra_bytes: int = 0, assumptions: tuple[str, ...] = (), fit: CommunicationFit | None = None,
) -> ParallelPrediction:  # fmt: skip
    """The group's figures: ``degrees`` (ulysses, ring, cfg, tp); ``peaks``: one GPU's alone and each GPU's of the
    group, under the run's memory techniques; ``extra_bytes``: received outside the denoiser calls (the other CFG
    half's predictions, an all-gather each); ``fit``: the communication's calibration (None: the datasheet rate)."""
    ulysses, ring, cfg, tp = degrees
    received: dict[str, int] = {}
    calls: dict[str, int] = {}
    for rank in ranks:
        for kind, nbytes in rank.received_by_collective.items():
            received[kind] = received.get(kind, 0) + nbytes * rank.count
        for kind, count in rank.collectives.items():
            calls[kind] = calls.get(kind, 0) + count * rank.count
    if extra_bytes:  # separate CFG calls: each rank call is one of a pair, whose predictions are exchanged once
        received["all_gather"] = received.get("all_gather", 0) + extra_bytes
        calls["all_gather"] = calls.get("all_gather", 0) + sum(rank.count for rank in ranks)
    return ParallelPrediction(
        ulysses_degree=ulysses,
        ring_degree=ring,
        cfg_degree=cfg,
        tp_degree=tp,
        gpus=ulysses * ring * cfg * tp,
        one_gpu_peak_memory_bytes=peaks[0],
        per_gpu_peak_memory_bytes=peaks[1],
        bytes_received_per_gpu=sum(received.values()),
        collectives_per_generation=sum(calls.values()),
        received_by_collective=received,
        calls_by_collective=calls,
        link=link,
        communication_s=communication_seconds(received, calls, link, fit) if link else None,
        communication_host_s=sum(calls.values()) * fit.host_s_per_collective if fit else 0.0,
        communication_calibrated=fit is not None,
        assumptions=list(assumptions),
    )
