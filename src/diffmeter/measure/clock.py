"""Timestamps that are honest on every device, and the device a run is pinned to.

On CUDA a mark is an event recorded on the run's device's current stream, so taking it
never waits for the GPU; elapsed times are read once, after one synchronization. On CPU
work is synchronous and the host clock is the truth.
"""

from __future__ import annotations

import contextlib
import time

import torch


class HostClock:
    """``time.perf_counter`` marks, for synchronous devices (CPU)."""

    def mark(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for: CPU work has finished when the call returns."""

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start


class CudaEventClock:
    """CUDA events recorded on ``device``'s current stream; read only after ``synchronize``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    @staticmethod
    def seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0


def clock_for(device: torch.device) -> HostClock | CudaEventClock:
    return CudaEventClock(device) if device.type == "cuda" else HostClock()


def device_scope(device: torch.device):
    """Make ``device`` the current CUDA device for the block, so that everything created without
    an explicit device (streams, events, offload buffers, library workspaces) lands on it and no
    context is opened on GPU 0 for a ``cuda:1`` run."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()
