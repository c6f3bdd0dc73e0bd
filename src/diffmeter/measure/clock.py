"""Timestamps that are honest on every device.

On CUDA a mark is an event recorded on the current stream, so taking it never waits
for the GPU; elapsed times are read once, after one synchronization. On CPU work is
synchronous and the host clock is the truth.
"""

from __future__ import annotations

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
    """CUDA events recorded on the current stream; read only after ``synchronize``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    @staticmethod
    def seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0


def clock_for(device: torch.device) -> HostClock | CudaEventClock:
    return CudaEventClock(device) if device.type == "cuda" else HostClock()
