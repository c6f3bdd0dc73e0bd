"""Where a rank sits: its global rank, its device, its data-parallel index and its rank in its model-parallel
group, read from the launcher's environment (torchrun's variables)."""

from __future__ import annotations

import dataclasses
import os

import torch

from diffmeter.runs.placement import Placement
from diffmeter.runs.spec import BenchSpec, resolve_device


@dataclasses.dataclass(frozen=True)
class Place:
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

    @property
    def placement(self) -> Placement:
        """This rank's device; CPU ranks split the machine's cores between them (each would otherwise start one
        torch thread per core, oversubscribing it N times), unless OMP_NUM_THREADS says otherwise."""
        threads = None
        if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
            threads = max(1, len(os.sched_getaffinity(0)) // local)
        return Placement(self.device, threads)
