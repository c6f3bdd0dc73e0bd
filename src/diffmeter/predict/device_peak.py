"""A row of the GPU table (``predict.peaks``): a card's dense peaks, memory and bandwidth, and the tokens its
device name is matched by."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    name: str
    #: lower-case tokens the device name must hold
    requires: tuple[str, ...]
    #: dense TFLOP/s per precision ("fp32", "tf32", "bf16", "fp16", "fp8")
    tflops: dict[str, float]
    source: str
    #: tokens the name may also hold (form factors with the same peaks)
    allows: tuple[str, ...] = ()
    #: GB as the datasheet prints it (read as GiB where no driver figure is known)
    memory_gb: float | None = None
    #: GB/s (10^9 bytes/s)
    bandwidth_gb_s: float | None = None
