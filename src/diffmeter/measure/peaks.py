"""Peak dense tensor throughput per GPU and precision, for model FLOP utilization (MFU).

Figures are NVIDIA datasheet numbers in TFLOP/s, *without* structured sparsity (the
datasheets headline the 2x sparse figure; MFU against it would halve every result).
"fp32" is plain CUDA-core FP32; "tf32" applies when float32 matmuls may use TF32.
Override with ``--peak-tflops`` for any device not listed or clocked differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel


@dataclass(frozen=True)
class DevicePeak:
    name: str
    #: lower-case substrings of ``torch.cuda.get_device_name()``, all of which must match
    match: tuple[str, ...]
    tflops: dict[str, float]
    source: str


PEAKS = (
    DevicePeak(
        "H200 SXM",
        ("h200",),
        {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        "NVIDIA H200 Tensor Core GPU datasheet (dense = half the sparse figure)",
    ),
    DevicePeak(
        "H100 NVL",
        ("h100", "nvl"),
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column",
    ),
    DevicePeak(
        "H100 PCIe",
        ("h100", "pcie"),
        {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column",
    ),
    DevicePeak(
        "H100 SXM",
        ("h100",),
        {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column",
    ),
    DevicePeak(
        "A100",
        ("a100",),
        {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet",
    ),
    DevicePeak(
        "L40S",
        ("l40s",),
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
        "NVIDIA L40S datasheet",
    ),
    DevicePeak(
        "L4",
        ("l4",),
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
        "NVIDIA L4 datasheet",
    ),
    DevicePeak(
        "A10",
        ("a10",),
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        "NVIDIA A10 datasheet",
    ),
    DevicePeak(
        "RTX 4090",
        ("4090",),
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
        "NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090 (FP16/BF16 with FP32 accumulate)",
    ),
)

PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class Peak(BaseModel):
    """The peak used for MFU and where the figure comes from."""

    tflops: float
    description: str


def device_peak(
    device_name: str, dtype: str, tf32: bool | None = None, override_tflops: float | None = None
) -> Peak | None:
    """The peak for ``device_name`` at ``dtype``; an override wins; None when unknown.

    float32 matmuls run on TF32 tensor cores when allowed (``tf32``; default: torch's
    current ``torch.backends.cuda.matmul.allow_tf32``)."""
    if override_tflops is not None:
        return Peak(tflops=override_tflops, description=f"--peak-tflops {override_tflops:g}")
    if tf32 is None:
        tf32 = torch.backends.cuda.matmul.allow_tf32
    key = PRECISION[dtype]
    if key == "fp32" and tf32:
        key = "tf32"
    lowered = device_name.lower()
    for peak in PEAKS:
        if all(part in lowered for part in peak.match) and key in peak.tflops:
            return Peak(tflops=peak.tflops[key], description=f"{peak.name} {key} dense, {peak.source}")
    return None
