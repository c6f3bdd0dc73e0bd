"""The place phase of a measured run: the device it runs on made current before anything asks a device a
question (an index-less CUDA query, a stream, a workspace or a context made earlier lands on GPU 0)."""

from __future__ import annotations

import dataclasses

import torch

from diffmeter.optimize import Target
from diffmeter.runs.spec import BenchSpec, resolve_device


@dataclasses.dataclass(frozen=True)
class Placement:
    """This process's device, and on CPU the torch threads it may use (None: torch's default)."""

    device: torch.device
    cpu_threads: int | None = None

    @classmethod
    def alone(cls, spec: BenchSpec) -> Placement:
        """A run that has the machine to itself: the spec's device (CUDA when present unless told otherwise)."""
        return cls(resolve_device(spec.device))

    def enter(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif self.cpu_threads is not None:
            torch.set_num_threads(self.cpu_threads)

    def target(self, target: Target) -> Target:
        """The techniques' target on this device (a rank's own GPU, whatever index the spec names)."""
        return dataclasses.replace(target, device=self.device)
