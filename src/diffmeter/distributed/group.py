"""What a parallel group adds to the one measured-run lifecycle (``runs.lifecycle``): joining the group,
the shared run folder, this rank's batches, the split of the model, the barriers, the merge of every rank's
result on rank 0, and the stop of every rank when one fails."""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from diffmeter.distributed import communication, context_parallel, scaling
from diffmeter.distributed.cfg_parallel import CfgParallel
from diffmeter.distributed.group_prediction import bench_split
from diffmeter.distributed.group_result import RANKS, group_result
from diffmeter.distributed.place import Place
from diffmeter.errors import DiffmeterError
from diffmeter.runs import storage
from diffmeter.runs.parallel_records import Parallel
from diffmeter.runs.parallel_support import guided_mode
from diffmeter.runs.prepared import PreparedRun, store_failure
from diffmeter.runs.results import BenchResult
from diffmeter.runs.run_directory import RunDirectory
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.workload import Workload

#: the longest any collective (or a rank's absence from one) may take before the run fails
COLLECTIVE_TIMEOUT_S = 600


class RankFailed(DiffmeterError):
    """This rank failed and said why; its process ends, and the launcher stops the others."""


class RankWorkload(Workload):
    """The group's workload seen by one data-parallel index: its call ``i`` is the group's batch
    ``i * data_parallel + data_rank``, so the ranks together make every image of a one-process run."""

    def __init__(self, spec: BenchSpec, entry, data_rank: int) -> None:
        super().__init__(spec, entry)
        self.data_rank = data_rank

    def batch(self, iteration: int):
        return super().batch(iteration * self.spec.data_parallel + self.data_rank)


@dataclasses.dataclass
class RankGroup:
    """This rank's part in a group of ``place.world`` processes (the lifecycle's ``Group``)."""

    place: Place
    out: Path
    launcher: str
    #: where a failing rank writes why (the launcher reads it); None under torchrun
    failures: Path | None = None
    run: PreparedRun | None = None
    parallel: Parallel | None = None
    mesh: object = None
    #: what the collectives moved in the first denoiser call (communication.count_first_call)
    measured: dict = dataclasses.field(default_factory=dict)
    #: rank 0's split for the stored prediction, or why none (``group_prediction.bench_split``)
    split: tuple = (None, None)

    def join(self, run: PreparedRun) -> None:
        """Count the offline communication (rank 0, over a fake group: before joining), then join."""
        spec, place = run.spec, self.place
        self.run = run
        self.parallel = Parallel(
            ulysses_degree=spec.ulysses_degree,
            ring_degree=spec.ring_degree,
            tp_degree=spec.tp_degree,
            cfg_degree=spec.cfg_degree,
            data_parallel=spec.data_parallel,
            world_size=place.world,
            backend="nccl" if place.device.type == "cuda" else "gloo",
            launcher=self.launcher,
        )
        counted = spec.ulysses_degree > 1 or spec.cfg_degree > 1
        if place.rank == 0 and counted and spec.ring_degree == 1:  # ring attention does not run on meta
            self.parallel.communication = communication.offline(
                run.entry, run.target.family, spec.profile_spec().with_defaults(run.entry.defaults),
                spec.ulysses_degree, spec.ring_degree, spec.cfg_degree,
            )  # fmt: skip
        if place.rank == 0 and spec.predict:  # counted over its own fake group: before joining the real one
            self.split = bench_split(spec, place.device.type == "cuda")
        dist.init_process_group(self.parallel.backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        degrees = (spec.data_parallel, spec.cfg_degree, spec.ring_degree, spec.ulysses_degree, spec.tp_degree)
        self.mesh = context_parallel.device_mesh(place.device, *degrees)

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def open(self, directory: RunDirectory, requests) -> tuple[Path, Path]:
        """Rank 0 opens the run folder and tells the others; each group's leader saves the images there."""
        place, spec = self.place, self.run.spec
        shared = [str(directory.open()) if place.rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        staging = Path(shared[0])
        own = staging if place.rank == 0 else staging / RANKS / f"rank-{place.rank}"
        saves = staging if place.group_rank == 0 else own
        for where in {own, saves}:  # made by the rank that writes there, not left to rank 0's timing
            (where / storage.IMAGES).mkdir(parents=True, exist_ok=True)
        if place.rank == 0:
            storage.write_json(staging / storage.REQUESTS, requests(spec.iterations * spec.data_parallel))
        return saves, own

    def workload(self, spec: BenchSpec, entry) -> Workload:
        return RankWorkload(spec, entry, self.place.data_rank)

    def copy_log(self, log) -> None:
        """A copy in the launcher's failures folder: a rank stopped by the launcher cannot hand its log over."""
        if self.failures is not None:
            self.failures.mkdir(parents=True, exist_ok=True)
            storage.add_log_file(log, self.failures / f"rank-{self.place.rank}.log")

    def describe(self) -> str:
        place, parallel = self.place, self.parallel
        return f"rank {place.rank} of {place.world} ({parallel.backend}, {parallel.launcher}), process {os.getpid()}"

    def holds_back(self, run: PreparedRun) -> tuple[str, ...]:
        """Under tensor parallelism the denoisers load on the CPU: ``apply`` moves each rank's shard only, so no
        GPU ever holds a whole denoiser (the reason to shard it)."""
        return tuple(run.target.family.denoisers(run.entry)) if run.spec.tp_degree > 1 else ()

    def apply(self, pipe) -> None:
        """The parallelisms as layers on every denoiser, innermost first: diffusers' context (or tensor)
        parallelism, then CFG parallelism around it; the first call's context-parallel collectives counted."""
        spec = self.run.spec
        names = self.run.target.family.denoisers(self.run.entry)
        models = [getattr(pipe, name) for name in names if getattr(pipe, name, None) is not None]
        for model in models:
            if spec.tp_degree > 1:
                context_parallel.enable_tensor_parallel(model, self.mesh, self.place.device)
                model.to(self.place.device)  # what the plan does not shard: norms, embeddings, buffers
            elif spec.context_degree > 1:
                context_parallel.enable(model, self.mesh, spec.ring_degree, spec.ulysses_degree, self.place.device)
        self.measured["parameter_bytes"] = context_parallel.resident_parameter_bytes(models)
        if spec.context_degree > 1:
            communication.count_first_call(models[0], self.measured)
        if spec.cfg_degree > 1:
            layer = CfgParallel(self.mesh["cfg"].get_group(), guided_mode(spec, self.run.target))
            for model in models:
                layer.wrap(model)

    def barrier(self) -> None:
        if self.place.device.type == "cuda":
            dist.barrier(device_ids=[self.place.device.index])
        else:
            dist.barrier()

    def combine(self, result: BenchResult, run: PreparedRun, staging: Path) -> BenchResult | None:
        """Every rank's result gathered on rank 0 and merged there; the others return None."""
        gathered = [None] * self.place.world if self.place.rank == 0 else None
        dist.gather_object((result.model_dump_json(), self.measured), gathered, dst=0)
        if self.place.rank != 0:
            return None
        results = [BenchResult.model_validate_json(text) for text, _ in gathered]
        spec = run.spec
        merged = group_result(spec, results, self.parallel, staging, [measured for _, measured in gathered])
        if merged.status == "complete":
            single = scaling.one_device_name(spec, run.entry, [o.label() for o in run.optimizations])
            merged.parallel.scaling = scaling.against_one_device(merged, self.out, single)
        return merged

    def prediction_split(self) -> tuple[object | None, str | None]:
        return self.split

    def abandon(self, reason: str) -> None:
        """Record why this rank failed where the launcher reads it (under torchrun, rank 0 stores it itself),
        then end this process: the launcher stops the others at once instead of leaving them in a collective."""
        said = f"rank {self.place.rank}: {reason}"
        if self.failures is not None:
            self.failures.mkdir(parents=True, exist_ok=True)
            storage.write_text(self.failures / f"rank-{self.place.rank}.error", said)
        elif self.place.rank == 0 and self.run is not None:  # joined: the run was checked
            store_failure(self.run, self.out, said)
        raise RankFailed(said)


def first_line(error: BaseException) -> str:
    return (str(error) or type(error).__name__).splitlines()[0]
