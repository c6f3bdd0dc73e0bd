"""Compilation that happens inside measured calls: graphs torch.compile builds (a new input
shape, a guard that failed) and CUDA graphs recorded. Either one puts compile time into a
measurement that is meant to be steady state, so a run counts them and says so."""

from __future__ import annotations

import functools
from contextlib import contextmanager

from pydantic import BaseModel


class Compilation(BaseModel):
    """Counts over one window (the measured calls, or the first call)."""

    #: graphs torch.compile (dynamo) compiled: each is a recompilation of an already-warm model
    graphs_compiled: int = 0
    #: CUDA graphs recorded (torch.compile's CUDA-graph modes record one per new shape or address)
    cuda_graphs_recorded: int = 0

    @property
    def clean(self) -> bool:
        return not (self.graphs_compiled or self.cuda_graphs_recorded)

    def text(self) -> str:
        return f"{self.graphs_compiled} graphs compiled, {self.cuda_graphs_recorded} CUDA graphs recorded"


@contextmanager
def watch_compilation():
    """Count compilation inside the block; yields the ``Compilation`` it fills in."""
    import torch
    from torch._dynamo.utils import counters

    seen = Compilation()
    graph_class = torch.cuda.graphs.CUDAGraph
    capture_begin = graph_class.capture_begin

    @functools.wraps(capture_begin)
    def counted(self, *args, **kwargs):
        seen.cuda_graphs_recorded += 1
        return capture_begin(self, *args, **kwargs)

    before = counters["stats"]["unique_graphs"]
    graph_class.capture_begin = counted
    try:
        yield seen
    finally:
        graph_class.capture_begin = capture_begin
        seen.graphs_compiled = counters["stats"]["unique_graphs"] - before
