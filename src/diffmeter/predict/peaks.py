"""Peak dense tensor throughput per GPU and precision, for model FLOP utilization (MFU).

Figures are vendor datasheet numbers (NVIDIA's; AMD's for the MI300X) in TFLOP/s *without* structured
sparsity: datasheets headline the 2x sparse figure for tensor-core precisions, and MFU against it would halve
every result, so tensor figures here are half the headline where the sheet marks it sparse.
"fp32" is plain CUDA-core FP32; "tf32" applies when float32 matmuls may use TF32. GeForce
"bf16"/"fp16" are the FP32-accumulate rates (what PyTorch runs). Memory is in GB, memory
bandwidth in GB/s, both from the same sheets; None where a name covers several sizes.

A device name (``torch.cuda.get_device_name()``, as nvidia-smi spells it) matches a row when
it holds every token the row requires, and no token beyond those, the row's allowed ones and
neutral ones (vendor, brand, a memory size: the row's own, where the row has one): "NVIDIA L40" is not
an L4, "NVIDIA H200 NVL" not an H200 SXM, "RTX 4070 Ti" not an RTX 4070 nor a 4070 Ti Super, "RTX 4060 Ti
8GB" not the 16 GB row, and "NVIDIA GeForce RTX 4090 D" or a MIG slice match nothing. An unknown device
gets no MFU rather than a wrong one; ``--peak-tflops`` covers it. The GeForce and RTX workstation rows are
in ``predict.peaks_rtx``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from diffmeter.predict.device_peak import DevicePeak
from diffmeter.predict.peaks_rtx import RTX

HOPPER = "NVIDIA H100/H200 Tensor Core GPU datasheets (dense = half the sparse figure)"
AMPERE = "NVIDIA A100/A800 Tensor Core GPU datasheet (SXM and PCIe share the peaks; dense = half the sparse figure)"
GA100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}  # every A100 and A800 card, dense TFLOP/s
#: the A800's memory is the A100's of the same size and form; NVIDIA's A800 sheet was not found stored
A800 = (
    AMPERE + "; the A800 is the A100 with its NVLink cut to 400 GB/s, 'The core compute, memory, and Tensor Core "
    "capabilities were left unchanged; only the interconnect was throttled' (aiwiki.ai/wiki/nvidia_a800)"
)
DATA_CENTER = (
    DevicePeak(
        "H100 SXM",
        ("h100", "hbm3"),
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        HOPPER + ", SXM column",
        memory_gb=80,
        bandwidth_gb_s=3350,
    ),
    DevicePeak(
        "H100 PCIe",
        ("h100", "pcie"),
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
        HOPPER + ", PCIe column",
        memory_gb=80,
        bandwidth_gb_s=2000,
    ),
    DevicePeak(
        "H100 NVL",
        ("h100", "nvl"),
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        HOPPER + ", H100 NVL per-card column",
        memory_gb=94,
        bandwidth_gb_s=3900,
    ),
    DevicePeak(
        "H200 NVL",
        ("h200", "nvl"),
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        HOPPER + ", H200 NVL column",
        memory_gb=141,
        bandwidth_gb_s=4800,
    ),
    DevicePeak(
        "H200 SXM",
        ("h200",),
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        HOPPER + ", H200 SXM column",
        memory_gb=141,
        bandwidth_gb_s=4800,
    ),
    DevicePeak(
        "GH200",
        ("gh200",),
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        "NVIDIA GH200 Grace Hopper Superchip datasheet, GPU side",
    ),
    DevicePeak(
        "H800 PCIe",
        ("h800", "pcie"),
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
        "NVIDIA H800 PCIe datasheet (the H100 PCIe compute figures)",
        memory_gb=80,
        bandwidth_gb_s=2000,
    ),
    DevicePeak(
        "H800 SXM",
        ("h800",),
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        "NVIDIA H800 SXM datasheet (the H100 SXM compute figures)",
        memory_gb=80,
        bandwidth_gb_s=3350,
    ),
    DevicePeak(
        "H20",
        ("h20",),
        {"fp32": 44.0, "tf32": 74.0, "bf16": 148.0, "fp16": 148.0, "fp8": 296.0},
        "NVIDIA H20 specification sheet as reproduced (dense, the export-limited rates): zangshuxian.com, "
        "'INT8为296TFLOPS,FP16为148TFLOPS,TF32为74TFLOPS,FP32为44TFLOPS', '内存带宽为4.0TB/s'; willitrunai.com, "
        "'96 GB HBM3 — 4,000 GB/s bandwidth'",
        memory_gb=96,
        bandwidth_gb_s=4000,
    ),
    DevicePeak(
        "B200",
        ("b200",),
        {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        "NVIDIA HGX B200 specifications (dense = half the sparse figure)",
        memory_gb=180,
        bandwidth_gb_s=7700,
    ),
    DevicePeak(
        "GB200",
        ("gb200",),
        {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
        "NVIDIA GB200 NVL72 specifications, per GPU (dense = half the sparse figure)",
        memory_gb=186,
        bandwidth_gb_s=8000,
    ),
    DevicePeak(
        "B300",
        ("b300",),
        {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        "NVIDIA/exemplar-performance README, 'Peak Theoretical Throughput' (non-sparse BF16 2250, FP8 4500 per B300;"
        " 'Memory bandwidth 7.7 TB/s per GPU'); TF32, FP32 and FP16: the HGX B300 table as reproduced (sparse halved)",
        allows=("sxm6", "ac"),
        memory_gb=288,
        bandwidth_gb_s=7700,
    ),
    DevicePeak(
        "A100 80GB SXM",
        ("a100", "80gb"),
        GA100,
        AMPERE + ", A100 80GB SXM column: 'GPU Memory Bandwidth | 2,039GB/s'",
        allows=("sxm4", "sxm"),
        memory_gb=80,
        bandwidth_gb_s=2039,
    ),
    DevicePeak(
        "A100 80GB PCIe",
        ("a100", "80gb", "pcie"),
        GA100,
        AMPERE + ", A100 80GB PCIe column: 'GPU Memory Bandwidth | 1,935GB/s'",
        memory_gb=80,
        bandwidth_gb_s=1935,
    ),
    DevicePeak(
        "A100 40GB SXM",
        ("a100", "40gb"),
        GA100,
        AMPERE + ", the 40GB sheet's SXM column: 'GPU Memory Bandwidth | 1,555 GB/s'",
        allows=("sxm4", "sxm"),
        memory_gb=40,
        bandwidth_gb_s=1555,
    ),
    DevicePeak(
        "A100 40GB PCIe",
        ("a100", "40gb", "pcie"),
        GA100,
        AMPERE + ", the 40GB sheet's PCIe column: 'GPU Memory Bandwidth | 1,555 GB/s'",
        memory_gb=40,
        bandwidth_gb_s=1555,
    ),
    DevicePeak(
        "A800 80GB SXM",
        ("a800", "80gb"),
        GA100,
        A800 + ": the A100 80GB SXM's 2,039 GB/s",
        allows=("sxm4", "sxm"),
        memory_gb=80,
        bandwidth_gb_s=2039,
    ),
    DevicePeak(
        "A800 80GB PCIe",
        ("a800", "80gb", "pcie"),
        GA100,
        A800 + ": the A100 80GB PCIe's 1,935 GB/s",
        allows=("lc",),
        memory_gb=80,
        bandwidth_gb_s=1935,
    ),
    DevicePeak(
        "A800 40GB PCIe",
        ("a800", "40gb", "pcie"),
        GA100,
        A800 + "; cputronic.com's A800 PCIe 40 GB comparison: 'Higher Bandwidth: 1555 GB/s'",
        memory_gb=40,
        bandwidth_gb_s=1555,
    ),
    DevicePeak(
        "A800 40GB Active",
        ("a800", "40gb", "active"),
        GA100,
        "lamonoai/gpumap nvidia/GPU.md (commit 8d5e174), 'NVIDIA A800 40GB Active' column: 'FP32 (TFLOPS) | 19.5', "
        "'TF32 Tensor Core(TFLOPS) | 156', 'BFLOAT16 Tensor Core(TFLOPS) (FP32累计) | 312', '40GB HBM2', "
        "'内存带宽（GB/s） | 1,555'",
        memory_gb=40,
        bandwidth_gb_s=1555,
    ),
    DevicePeak(
        "A10G",
        ("a10g",),
        {"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},
        "NVIDIA A10G (AWS) datasheet: not the A10's figures",
        memory_gb=24,
        bandwidth_gb_s=600,
    ),
    DevicePeak(
        "A10",
        ("a10",),
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        "NVIDIA A10 datasheet (dense = half the sparse figure)",
        memory_gb=24,
        bandwidth_gb_s=600,
    ),
    DevicePeak(
        "A40",
        ("a40",),
        {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7},
        "NVIDIA A40 datasheet (dense = half the sparse figure)",
        memory_gb=48,
        bandwidth_gb_s=696,
    ),
    DevicePeak(
        "A30",
        ("a30",),
        {"fp32": 10.3, "tf32": 82.0, "bf16": 165.0, "fp16": 165.0},
        "NVIDIA A30 datasheet (dense = half the sparse figure)",
        memory_gb=24,
        bandwidth_gb_s=933,
    ),
    DevicePeak(
        "L4",
        ("l4",),
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
        "NVIDIA L4 datasheet (dense = half the sparse figure)",
        memory_gb=24,
        bandwidth_gb_s=300,
    ),
    DevicePeak(
        "L40",
        ("l40",),
        {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
        "NVIDIA L40 datasheet (dense = half the sparse figure)",
        memory_gb=48,
        bandwidth_gb_s=864,
    ),
    DevicePeak(
        "L40S",
        ("l40s",),
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
        "NVIDIA L40S datasheet (dense column)",
        memory_gb=48,
        bandwidth_gb_s=864,
    ),
    DevicePeak(
        "L20",
        ("l20",),
        {"fp32": 59.8, "tf32": 59.8, "bf16": 119.5, "fp16": 119.5, "fp8": 239.0},
        "NVIDIA's H20 / L20 / L2 table as Tom's Hardware reproduces it (dense: its 'total processing power' 1,912 is "
        "119.5 x 16, the export-control rating's dense rate; NVIDIA's own L20 page was not found)",
        memory_gb=48,
        bandwidth_gb_s=864,
    ),
    DevicePeak(
        "T4",
        ("t4",),
        {"fp32": 8.1, "fp16": 65.0},
        "NVIDIA T4 datasheet (no bfloat16 or TF32 tensor cores)",
        memory_gb=16,
        bandwidth_gb_s=320,
    ),
    DevicePeak(
        "V100 SXM2",
        ("v100", "sxm2"),
        {"fp32": 15.7, "fp16": 125.0},
        "NVIDIA V100 datasheet, SXM2 column (no bfloat16 or TF32 tensor cores)",
        bandwidth_gb_s=900,
    ),
    DevicePeak(
        "V100 PCIe",
        ("v100", "pcie"),
        {"fp32": 14.0, "fp16": 112.0},
        "NVIDIA V100 datasheet, PCIe column (no bfloat16 or TF32 tensor cores)",
        bandwidth_gb_s=900,
    ),
    DevicePeak(
        "V100S PCIe",
        ("v100s", "pcie"),
        {"fp32": 16.4, "fp16": 130.0},
        "NVIDIA V100S datasheet (no bfloat16 or TF32 tensor cores)",
        memory_gb=32,
        bandwidth_gb_s=1134,
    ),
    DevicePeak(
        "MI300X",
        ("mi300x",),
        {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
        "AMD Instinct MI300 series microarchitecture (ROCm docs, 'Peak-performance capabilities of the MI300X': "
        "dense matrix peaks; 5.3 TB/s) and ROCm's GPU specifications table (192 GiB)",
        allows=("amd", "instinct"),
        memory_gb=192,
        bandwidth_gb_s=5300,
    ),
)
MI300X = DATA_CENTER[-1]
#: every row, in the order a short ``--gpu`` name prefers among the rows it matches
PEAKS = (*DATA_CENTER[:-1], *RTX, MI300X)

PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}


def conv_key(precision: str) -> str:
    """The key of a precision's rate measured on convolutions ("conv-fp32", a CPU's: ``cpu_peaks``), beside its
    matmul peak ("fp32")."""
    return f"conv-{precision}"


#: tokens any device name may carry without changing what it is
NEUTRAL = frozenset({"nvidia", "tesla", "geforce", "hbm2", "hbm2e", "hbm3", "hbm3e"})
MEMORY_SIZE = re.compile(r"(\d+)g(b)?")
#: tokens that make another card of a model number: an "RTX 4070 Ti" is not an "RTX 4070"
VARIANTS = frozenset({"ti", "super", "d"})


class Peak(BaseModel):
    """The peak used for MFU and where the figure comes from."""

    tflops: float
    description: str


def tokens(device_name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", device_name.lower())


def find_device(device_name: str) -> DevicePeak | None:
    """The table's row for a device name, matched by whole tokens; None for an unknown device."""
    words = tokens(device_name)
    for peak in PEAKS:
        extra = [w for w in words if w not in peak.requires and w not in peak.allows and w not in NEUTRAL]
        if all(token in words for token in peak.requires) and all(other_size(peak, word) is False for word in extra):
            return peak
    return None


def other_size(peak: DevicePeak, word: str) -> bool | None:
    """Whether ``word``, a memory size ("16gb", "80g"), names another size than the row's; None for no size."""
    size = MEMORY_SIZE.fullmatch(word)
    if size is None:
        return None
    return peak.memory_gb is not None and int(size.group(1)) != peak.memory_gb


def device_peak(device_name: str, dtype: str, tf32: bool = False, override_tflops: float | None = None) -> Peak | None:
    """The peak for ``device_name`` at ``dtype``; an override wins; None when unknown.

    float32 matmuls run on TF32 tensor cores when the run allows it (``tf32``)."""
    if override_tflops is not None:
        return Peak(tflops=override_tflops, description=f"--peak-tflops {override_tflops:g}")
    key = PRECISION[dtype]
    if key == "fp32" and tf32:
        key = "tf32"
    peak = find_device(device_name)
    if peak is None or key not in peak.tflops:
        return None
    return Peak(tflops=peak.tflops[key], description=f"{peak.name} {key} dense, {peak.source}")
