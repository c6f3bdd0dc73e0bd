"""Peak memory: the CUDA caching allocator's high-water marks and the process's peak RSS.

On Linux the RSS high-water mark (VmHWM) is reset before the measured iterations, so the
peak is theirs; elsewhere it is the process's lifetime peak, and ``process_peak_rss_scope``
says which.
"""

from __future__ import annotations

import gc
import re
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

    from diffmeter.measure.stage_memory import StagePeaks


class PeakMemory(BaseModel):
    """Bytes. CUDA peaks cover the measured iterations only; RSS is the process's lifetime peak."""

    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None
    #: allocated right after loading (weights and buffers): what the model occupies at rest
    cuda_loaded_bytes: int | None = None
    #: per stage (text encoding, denoising step, VAE decode, outside components), CUDA max allocated in any
    #: measured call (``measure/stage_memory.py``)
    cuda_stage_max_allocated_bytes: dict[str, int] | None = None
    #: per model component: its weights as stored after loading and applying the techniques, wherever they sit
    #: (``measure/stored_weights.py``); None in results stored before it was measured
    weights_bytes: dict[str, int] | None = None
    process_peak_rss_bytes: int
    #: "measured iterations" (reset before them) or "process lifetime" (no reset possible)
    process_peak_rss_scope: str = "process lifetime"


def loaded_bytes(device: torch.device) -> int | None:
    import torch

    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def release(device: torch.device) -> None:
    """Free what a finished run left: diffusers' hooks tie a pipeline's modules into reference cycles, which
    only the cyclic collector frees; until it runs, the next run in the process finds them on the device."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peaks(device: torch.device) -> bool:
    """Reset the high-water marks; True when the RSS one could be reset too (Linux)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return False
    return _vm_hwm_bytes() is not None


def _vm_hwm_bytes() -> int | None:
    try:
        match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def peak_rss_bytes() -> int:
    """The process's lifetime peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def read_peaks(
    device: torch.device,
    loaded: int | None,
    rss_was_reset: bool,
    stage_peaks: StagePeaks | None = None,
    weights: dict[str, int] | None = None,
) -> PeakMemory:
    """The peaks since ``reset_peaks``; on CUDA, ``stage_peaks`` (which resets CUDA's marks at every stage)
    holds the whole peaks and each stage's. ``weights``: each component's as stored after loading."""
    import torch

    hwm = _vm_hwm_bytes() if rss_was_reset else None
    everywhere = {
        "weights_bytes": weights,
        "process_peak_rss_bytes": hwm if hwm is not None else peak_rss_bytes(),
        "process_peak_rss_scope": "measured iterations" if hwm is not None else "process lifetime",
    }
    if device.type == "cuda":
        allocated, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        stages = None
        if stage_peaks is not None:
            allocated, reserved, stages = stage_peaks.read()
        return PeakMemory(
            cuda_max_allocated_bytes=allocated,
            cuda_max_reserved_bytes=reserved,
            cuda_loaded_bytes=loaded,
            cuda_stage_max_allocated_bytes=stages,
            **everywhere,
        )
    return PeakMemory(**everywhere)


def out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's RuntimeError."""
    import torch

    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return "can't allocate memory" in str(error) or "not enough memory" in str(error).lower()
