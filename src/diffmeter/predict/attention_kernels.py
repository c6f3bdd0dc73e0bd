"""The attention kernel a run picks (``--opt sdpa-kernel:kernel=...``, ``--opt attention:backend=...``) as a change
of the attention operators' work, where published runs separate the kernels.

The eager calibration's runs went through SDPA's own choice (flash, memory-efficient or cuDNN by torch version and
dtype), the flash-attn package or xformers: the same FLOPs and the same kernels (xformers dispatches half precision
to FlashAttention-2 first and float32 to its cutlass kernel, which SDPA's memory-efficient kernel is), so those are
timed as the calibration's attention (``SAME_AS_SDPA``; held out on published xformers and flash-attn runs by
benchmarks/calibrate_techniques.py). PyTorch's math path materializes the score matrix: its two matmuls and the
softmax between them write it and read it back, four passes of batch x heads x queries x keys values
(``MATH_PASSES``) beyond the fused kernels' bytes. A kernel no published measurement times (sage, flex,
FlashAttention-4, ...) is not modelled: ``kernel_of`` returns None and the prediction names it as left out with
``why_untimed``'s reason.

Two kernels have a published measurement against SDPA's flash kernel at head dimension 128 in half precision
(``MEASURED``): cuDNN's attention runs 1.92x it on a Hopper card and 2.63x it on a B200, and from torch 2.11 SDPA
picks it by default on both (``sdpa_default``); FlashAttention-3 (diffusers' ``_flash_3`` backends) runs 1.92x it
on Hopper, in the same run as cuDNN's. The calibration's runs used the flash kernel (their stacks are older, or
their kernel is named): a run on either has those attention operators' calibrated time divided by the ratio of its
architecture (``attention_speedup``), nowhere else.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

from diffmeter.predict.schema import OperatorGroup, OperatorWork

#: the score matrix's passes on PyTorch's math path: Q K^T written, read and written by the softmax, read by P V
MATH_PASSES = 4
#: bytes per value of the dtypes attention runs at
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: kernels timed as the calibration's attention: SDPA's fused kernels, and the packages the eager runs used
SAME_AS_SDPA = ("flash", "efficient", "cudnn", "sdpa", "xformers", "flash-attn", "flash-attn-3")
#: diffusers' attention backends (``--opt attention:backend=NAME``) as the kernel they run
BACKENDS = {
    "native": "sdpa",
    "_native_flash": "flash",
    "_native_efficient": "efficient",
    "_native_cudnn": "cudnn",
    "_native_math": "math",
    "flash": "flash-attn",
    "flash_hub": "flash-attn",
    "flash_varlen": "flash-attn",
    "flash_varlen_hub": "flash-attn",
    "_flash_3": "flash-attn-3",
    "_flash_3_hub": "flash-attn-3",
    "_flash_varlen_3": "flash-attn-3",
    "_flash_3_varlen_hub": "flash-attn-3",
    "xformers": "xformers",
}
#: why a diffusers backend's attention is not timed: no published measurement against SDPA's kernels
UNTIMED = {
    "sage": "SageAttention's speeds are published as plots (its README and papers), no figure against SDPA's kernel "
    "on a named card to time it by",
    "flex": "no published run times flex_attention against SDPA's kernels at diffusion shapes",
    "flash_4": "no published run times FlashAttention-4 against SDPA's kernels",
    "aiter": "AMD's aiter kernels: no AMD card's attention is calibrated",
    "_native_npu": "Ascend NPUs are not in the GPU table",
    "_native_xla": "XLA devices are not in the GPU table",
}


#: cuDNN's attention and FlashAttention-3 over SDPA's flash kernel (FlashAttention-2) on an H100 at FLUX's shape
#: (batch 1, 24 heads, 4608 tokens, head dimension 128), bf16: 631.338 (cudnn_90100) and 631.827 (flash_v3) against
#: 329.483 TFLOP/s (sdpa), one tritonbench run reported in pytorch/pytorch#142132 (2024-12-05); measured at this head
#: dimension only
CUDNN_OVER_FLASH = 631.338 / 329.483
FLASH3_OVER_FLASH = 631.827 / 329.483
CUDNN_MEASURED_HEAD_DIMS = (128,)
#: cuDNN's attention over SDPA's flash kernel on a B200, one run timing both through torch's SDPA
#: (``SDPBackend.CUDNN_ATTENTION`` and ``FLASH_ATTENTION``): NVIDIA/cudnn-frontend commit bb37575 (v1.15, 2025-10-07),
#: benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv, NGC pytorch 25.09
#: (torch 2.9.0a0), cuDNN 9.13, bf16 forward, batch 1, 4096 tokens, head dimension 128: 855.7 against 324.9 TFLOP/s.
#: Its rows are causal with grouped queries (128 query, 8 key-value heads); at 8k-32k tokens the ratio is 3.1-3.5x
#: and on a GB300 3.1-4.1x: the shortest rows' ratio, the least of them, is the one taken
CUDNN_OVER_FLASH_BLACKWELL = 855.7 / 324.9
#: which kernel SDPA picks, from aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (pytorch/pytorch at commit
#: 001f694a): ``priority_order`` tries cuDNN, flash, memory-efficient, math where ``check_prefer_cudnn_attention``
#: holds (cuDNN newer than 9.15 on compute capability 9.x or 10.x: sm90 Hopper, sm100/sm103 datacenter Blackwell;
#: CUDA 12 wheels sm90, sm100 and sm103 only), else flash, memory-efficient, math; torch 2.11's wheels are the first
#: whose cuDNN passes it (huggingface/transformers#48163, 2026-08-31; diffmeter's H200 runs on torch 2.11.0 with
#: cuDNN 9.19 traced ``_cudnn_attention_forward``). ``check_flash_attention_hardware_support`` and
#: ``check_cudnn_hardware_support`` take sm80 to sm121 only, and both take float16/bfloat16 inputs only
#: (``check_dtypes_low_precision``); the memory-efficient kernel takes sm50 to sm121, in float16 or float32 below sm80
#: (``less_than_sm80_mem_efficient_dtypes``) and bfloat16 as well from sm80: a T4 (sm75) or V100 (sm70) runs
#: float16 attention on the memory-efficient kernel and bfloat16 on the math path; float32 runs memory-efficient
#: everywhere. The cuDNN ratio is measured on Hopper and on datacenter Blackwell (``attention_speedup``)
CUDNN_DEFAULT_FROM = (2, 11)
CUDNN_PREFERRED_ARCHITECTURES = ("hopper", "blackwell")
#: the architectures in the GPU table before sm80, where neither flash nor cuDNN attention runs
BEFORE_SM80 = ("turing", "volta")
HALF = ("float16", "bfloat16")
#: kernel -> ({architecture: its speed over SDPA's flash kernel there}, the head dimensions it was measured at): the
#: only kernels timed apart from the calibration's (FlashAttention-3 runs on Hopper alone, so nowhere else is it asked)
MEASURED = {
    "cudnn": ({"hopper": CUDNN_OVER_FLASH, "blackwell": CUDNN_OVER_FLASH_BLACKWELL}, CUDNN_MEASURED_HEAD_DIMS),
    "flash-attn-3": ({"hopper": FLASH3_OVER_FLASH}, (128,)),
}


def torch_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a torch version ("2.11.0+cu130" -> (2, 11)); None where unknown."""
    parts = (version or "").split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


@functools.cache
def installed_torch() -> str | None:
    """This environment's torch version, read once without importing it (``fit`` and the leaderboard time thousands
    of settings); None where torch is not installed."""
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def sdpa_default(architecture: str | None, torch_version: str | None, dtype: str | None = None) -> str:
    """The kernel SDPA runs attention at ``dtype`` (None: half precision) on by default (``CUDNN_DEFAULT_FROM``'s
    comment): float32 on the memory-efficient kernel; below sm80 (T4, V100) float16 on the memory-efficient kernel
    and bfloat16 on the math path; "cudnn" on Hopper and datacenter Blackwell from torch 2.11; else "flash" (a torch
    version not stated: "flash", the calibration's)."""
    if dtype is not None and dtype not in HALF:
        return "efficient"
    if architecture in BEFORE_SM80:
        return "math" if dtype == "bfloat16" else "efficient"
    minor = torch_minor(torch_version)
    if architecture in CUDNN_PREFERRED_ARCHITECTURES and minor is not None and minor >= CUDNN_DEFAULT_FROM:
        return "cudnn"
    return "flash"


def with_default_kernel(work: OperatorWork, architecture: str | None, torch_version: str | None) -> OperatorWork:
    """``work`` with each attention group SDPA runs on its math path by default (``sdpa_default`` at the group's
    dtype: bfloat16 before sm80) priced as the math path's (``with_kernel``); the fused kernels' work unchanged."""
    return with_kernel(
        work, "math", dtypes=tuple(d for d in ITEMSIZE if sdpa_default(architecture, torch_version, d) == "math")
    )


def stack_kernel(kernel: str, architecture: str | None) -> str:
    """``kernel`` as a time's stack names it, saying where it is timed as the calibration's flash kernel: a kernel
    with a measured ratio (``MEASURED``) on an architecture it was not measured on."""
    if kernel in MEASURED and architecture not in MEASURED[kernel][0]:
        return f"{kernel} (timed as flash: its ratio is measured on {', '.join(MEASURED[kernel][0])} only)"
    return kernel


def head_dim(group: OperatorGroup) -> float | None:
    """An attention group's head dimension: its FLOPs are two matmuls over every score (4 x scores x E)."""
    return group.flops / (4 * group.scores) if group.kind == "attention" and group.scores else None


def attention_speedup(kernel: str, architecture: str | None, group: OperatorGroup, dtype: str | None) -> float:
    """How much faster ``group`` runs on ``kernel`` than on the calibration's flash kernel: the ``MEASURED`` ratio
    for half-precision attention at its measured head dimension on its architecture, else 1."""
    dim = head_dim(group)
    if kernel not in MEASURED or dtype not in HALF or dim is None:
        return 1.0
    ratios, head_dims = MEASURED[kernel]
    return ratios.get(architecture, 1.0) if round(dim) in head_dims else 1.0


def kernel_of(name: str, params: dict) -> str | None:
    """The attention kernel an optimization runs (``sdpa-kernel`` or ``attention``), None where its time is not
    modelled."""
    kernel = params.get("kernel", "flash") if name == "sdpa-kernel" else BACKENDS.get(params.get("backend", "native"))
    return kernel if kernel == "math" or kernel in SAME_AS_SDPA else None


def why_untimed(backend: str) -> str:
    """Why a diffusers attention backend's time is not modelled (``UNTIMED``, by the backend's family)."""
    family = next((key for key in UNTIMED if backend.lstrip("_").startswith(key.lstrip("_"))), None)
    return UNTIMED[family] if family else "no published runs separate this kernel's time"


def asked_kernel(asked: list[tuple[str, dict]]) -> str | None:
    """The attention kernel a run's optimizations ((name, params)) name, None where they leave SDPA's own choice."""
    kernels = [kernel_of(name, params) for name, params in asked if name in ("sdpa-kernel", "attention")]
    named = [kernel for kernel in kernels if kernel and kernel != "sdpa"]
    return named[-1] if named else None


def with_kernel(
    work: OperatorWork, kernel: str, components: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None
) -> OperatorWork:
    """``work`` with the attention of ``components`` (None: every component) at ``dtypes`` (None: any) run by
    ``kernel``: the math path's materialized scores added to each attention operator's bytes; the fused kernels'
    work unchanged."""
    if kernel != "math" or dtypes == ():
        return work
    calls = []
    for call in work.calls:
        if components is not None and call.component not in components:
            calls.append(call)
            continue
        operators = []
        for group in call.operators:
            dtype = group.dtype or call.dtype or work.dtype
            if group.kind == "attention" and (dtypes is None or dtype in dtypes):
                group = group.model_copy(update={"bytes": group.bytes + MATH_PASSES * group.scores * ITEMSIZE[dtype]})
            operators.append(group)
        calls.append(call.model_copy(update={"operators": operators}))
    return work.model_copy(update={"calls": calls})
