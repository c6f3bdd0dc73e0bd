"""Peak memory: the CUDA caching allocator's high-water marks and the process's peak RSS."""

from __future__ import annotations

import resource
import sys

import torch
from pydantic import BaseModel


class PeakMemory(BaseModel):
    """Bytes. CUDA peaks cover the measured iterations only; RSS is the process's lifetime peak."""

    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None
    #: allocated right after loading (weights and buffers): what the model occupies at rest
    cuda_loaded_bytes: int | None = None
    process_peak_rss_bytes: int


def loaded_bytes(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_rss_bytes() -> int:
    """The process's peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def read_peaks(device: torch.device, loaded: int | None) -> PeakMemory:
    if device.type == "cuda":
        return PeakMemory(
            cuda_max_allocated_bytes=torch.cuda.max_memory_allocated(device),
            cuda_max_reserved_bytes=torch.cuda.max_memory_reserved(device),
            cuda_loaded_bytes=loaded,
            process_peak_rss_bytes=peak_rss_bytes(),
        )
    return PeakMemory(process_peak_rss_bytes=peak_rss_bytes())
