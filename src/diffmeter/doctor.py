"""What this machine can measure, found out before a user spends an hour: the torch build, each
GPU and the peak the table knows for it, the energy counters, the attention kernels and
backends that really run here (each one is called on a small input), the optional packages,
and which catalog models have weights in the Hugging Face cache.

Nothing here fails: every probe that cannot run says why.
"""

from __future__ import annotations

import importlib.util
import platform
from importlib import metadata

import torch
from pydantic import BaseModel

from diffmeter.errors import DiffmeterError
from diffmeter.predict.cpu_peaks import CpuPeaks

DTYPES = ("bfloat16", "float16", "float32")
#: diffusers attention backends always listed (others only when their requirements are met)
MAIN_BACKENDS = ("native", "flash", "_flash_3", "sage", "xformers", "flex", "_native_cudnn", "_native_efficient")
#: (distribution, import name, how to install, what diffmeter uses it for)
PACKAGES = (
    ("zeus", "zeus", "pip install 'diffmeter[energy]'", "energy per image"),
    ("torchao", "torchao", "pip install 'diffmeter[quant]'", "quantize (int8/fp8 weights), --quantize torchao:TYPE"),
    ("bitsandbytes", "bitsandbytes", "pip install 'diffmeter[bnb]'", "--quantize bnb:nf4|fp4|int8 (CUDA)"),
    ("gguf", "gguf", "pip install 'diffmeter[gguf]'", "--quantize gguf:TYPE --weights FILE.gguf"),
    ("optimum-quanto", "optimum", "pip install 'diffmeter[quanto]'", "--quantize quanto:int8|int4|float8"),
    ("sdnq", "sdnq", "pip install 'diffmeter[sdnq]'", "--quantize sdnq:TYPE"),
    ("DeepCache", "DeepCache", "pip install 'diffmeter[deepcache]'", "deep-cache"),
    ("cache-dit", "cache_dit", "pip install 'diffmeter[cache-dit]'", "cache-dit"),
    ("flash-attn", "flash_attn", "pip install flash-attn", "attention backend flash"),
    ("sageattention", "sageattention", "pip install sageattention", "attention backend sage"),
    ("xformers", "xformers", "pip install xformers", "attention backend xformers"),
    ("kernels", "kernels", "pip install 'diffmeter[nunchaku]'", "attention backends *_hub, --quantize nunchaku:TYPE"),
    ("accelerate", "accelerate", "pip install 'diffmeter[bfl]'", "offloading, --quantize bfl:TYPE --weights FILE"),
    ("auto-round", "auto_round", "pip install 'diffmeter[autoround]'", "--quantize autoround:TYPE --weights DIR"),
    ("nvidia-modelopt", "modelopt", "pip install 'diffmeter[modelopt]'", "--quantize modelopt:TYPE (CUDA)"),
    ("torchvision", "torchvision", "pip install torchvision", "LPIPS in quality comparisons"),
    ("ray", "ray", "pip install 'diffmeter[ray]'", "sweeps on Ray clusters"),
    ("plotly", "plotly", "pip install 'diffmeter[report]'", "diffmeter report's plots"),
    ("pyarrow", "pyarrow", "pip install 'diffmeter[parquet]'", "table --parquet"),
    ("onnxruntime", "onnxruntime", "pip install 'diffmeter[onnx]'", "onnxruntime (deployment runtime)"),
    ("onnx", "onnx", "pip install 'diffmeter[onnx]'", "onnxruntime: exporting the denoiser"),
    ("onnxscript", "onnxscript", "pip install 'diffmeter[onnx]'", "onnxruntime: torch's ONNX exporter"),
    ("peft", "peft", "pip install 'diffmeter[lora]'", "bench --lora / --lora-rank: LoRA adapters through diffusers"),
    ("torch-tensorrt", "torch_tensorrt", "pip install 'diffmeter[tensorrt]'", "tensorrt (CUDA only)"),
)


class GPU(BaseModel):
    index: int
    name: str
    memory_bytes: int
    compute_capability: str
    #: the peak table's row for this device, and its dense TFLOP/s per precision (empty: unknown)
    peak_row: str | None
    peak_tflops: dict[str, float]


class EnergyCounters(BaseModel):
    zeus: str | None
    #: None when usable, else why not
    gpu: str | None
    cpu: str | None


class Kernel(BaseModel):
    """An SDPA kernel or a diffusers attention backend: per dtype, None when it ran, else why not."""

    name: str
    dtypes: dict[str, str | None]
    #: whether it ran with an attention mask (None: not tried, it runs at no dtype)
    masks: bool | None


class Package(BaseModel):
    name: str
    version: str | None
    install: str
    purpose: str


class Doctor(BaseModel):
    diffmeter: str
    python: str
    platform: str
    cpu: str
    torch: str
    build: str
    cudnn: int | None
    nccl: str | None
    driver: str | None
    device: str
    gpus: list[GPU]
    energy: EnergyCounters
    sdpa_kernels: list[Kernel]
    attention_backends: list[Kernel]
    packages: list[Package]
    hf_cache: str
    cached_models: list[str]
    catalog_models: int
    #: this CPU's stored peaks (None: not measured yet); doctor reads them, measuring only with --remeasure-cpu
    cpu_peaks: CpuPeaks | None = None


def examine() -> Doctor:
    """Probe this machine; never raises for something the machine lacks."""
    from diffmeter import __version__
    from diffmeter.measure.environment import driver_version
    from diffmeter.predict.cpu_peaks import cpu_name, stored

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    from huggingface_hub.constants import HF_HUB_CACHE

    cached, total = _cached_models()
    return Doctor(
        diffmeter=__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        cpu=cpu_name(),
        torch=torch.__version__,
        build=_build(),
        cudnn=torch.backends.cudnn.version() if cuda else None,
        nccl=_nccl() if cuda else None,
        driver=driver_version() if cuda else None,
        device=str(device),
        gpus=[_gpu(index) for index in range(torch.cuda.device_count())] if cuda else [],
        **_probed(device, cuda),
        packages=[_package(*package) for package in PACKAGES],
        hf_cache=str(HF_HUB_CACHE),
        cached_models=cached,
        catalog_models=total,
        cpu_peaks=stored(),
    )


def _probed(device: torch.device, cuda: bool) -> dict:
    """The energy counters and the attention probes (seconds: diffusers, Zeus and a compiled flex attention): from
    the disk cache when this machine was probed before as it is now (its GPUs, driver, CPU, readable RAPL counters,
    the optional packages' versions; the cache's key adds torch, diffusers, transformers and diffmeter), else
    probed and stored."""
    import glob
    import os

    from diffmeter import cache
    from diffmeter.measure.environment import driver_version
    from diffmeter.predict.cpu_peaks import cpu_name

    key = {
        "device": str(device),
        "gpus": [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())] if cuda else [],
        "driver": driver_version() if cuda else None,
        "cpu": cpu_name(),
        "rapl": sorted(path for path in glob.glob("/sys/class/powercap/*/energy_uj") if os.access(path, os.R_OK)),
        "packages": {name: _version(name) for name in ["zeus", *(package[0] for package in PACKAGES)]},
    }
    stored = cache.load("doctor", key)
    if stored is not None:
        return {
            "energy": EnergyCounters.model_validate(stored["energy"]),
            "sdpa_kernels": [Kernel.model_validate(kernel) for kernel in stored["sdpa_kernels"]],
            "attention_backends": [Kernel.model_validate(kernel) for kernel in stored["attention_backends"]],
        }
    from diffmeter.quiet import load_libraries, quiet_libraries

    load_libraries()
    with quiet_libraries():
        found = {
            "energy": _energy(cuda),
            "sdpa_kernels": _sdpa_kernels(device),
            "attention_backends": _attention_backends(device),
        }
    kernels = {
        name: [kernel.model_dump(mode="json") for kernel in found[name]]
        for name in ("sdpa_kernels", "attention_backends")
    }
    cache.store("doctor", key, {"energy": found["energy"].model_dump(mode="json"), **kernels})
    return found


def _build() -> str:
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"ROCm (HIP {torch.version.hip})"
    return "CPU only"


def _nccl() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _gpu(index: int) -> GPU:
    from diffmeter.predict.peaks import find_device

    properties = torch.cuda.get_device_properties(index)
    peak = find_device(properties.name)
    return GPU(
        index=index,
        name=properties.name,
        memory_bytes=properties.total_memory,
        compute_capability=f"{properties.major}.{properties.minor}",
        peak_row=peak.name if peak else None,
        peak_tflops=dict(peak.tflops) if peak else {},
    )


def _energy(cuda: bool) -> EnergyCounters:
    from diffmeter.measure.energy import EnergyMeter

    zeus = _version("zeus")
    if zeus is None:
        reason = "the zeus package is not installed: pip install 'diffmeter[energy]'"
        return EnergyCounters(zeus=None, gpu=reason, cpu=reason)
    if cuda:
        meter = EnergyMeter(torch.device("cuda", 0))
        gpu = None if meter.gpu_indices else (meter.reason or "Zeus found no GPU energy counter")
    else:
        meter = EnergyMeter(torch.device("cpu"))
        gpu = "no CUDA GPU visible"
    cpu = None if meter.cpu_indices else "RAPL counters are not readable here (no Intel/AMD RAPL, or no permission)"
    return EnergyCounters(zeus=zeus, gpu=gpu, cpu=cpu)


def _sdpa_kernels(device: torch.device) -> list[Kernel]:
    """Each PyTorch SDPA kernel forced on a small attention call, per dtype, then with a mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from diffmeter.optimize.sdpa_kernel import CUDA_ONLY, KERNELS

    kernels = []
    for name, member in KERNELS.items():
        choice = getattr(SDPBackend, member)

        def attend(dtype: torch.dtype, masked: bool, name=name, choice=choice) -> None:
            if name in CUDA_ONLY and device.type != "cuda":
                raise DiffmeterError("CUDA only")
            query = torch.randn(1, 2, 128, 64, dtype=dtype, device=device)
            mask = torch.ones(1, 1, 128, 128, dtype=torch.bool, device=device) if masked else None
            with sdpa_kernel(choice):
                torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=mask)

        kernels.append(_probe(name, attend))
    return kernels


def _attention_backends(device: torch.device) -> list[Kernel]:
    """diffusers' backends: the package check, the dtypes its registry declares, then a real call."""
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _check_attention_backend_requirements,
        dispatch_attention_fn,
    )

    from diffmeter.optimize.attention import ANY_DEVICE, dtypes_accepted

    backends = []
    for backend in AttentionBackendName:
        name = backend.value
        try:
            _check_attention_backend_requirements(backend)
            missing = None
        except (RuntimeError, ImportError) as error:
            missing = _first_line(error)
        if missing and name not in MAIN_BACKENDS:
            continue
        if missing is None and name not in ANY_DEVICE and device.type != "cuda":
            missing = "for CUDA GPUs"
        accepted = dtypes_accepted(name)

        def attend(dtype: torch.dtype, masked: bool, name=name, missing=missing, accepted=accepted) -> None:
            if missing:
                raise DiffmeterError(missing)
            if accepted and str(dtype).removeprefix("torch.") not in accepted:
                raise DiffmeterError(f"takes {' or '.join(accepted)} only")
            query = torch.randn(1, 128, 2, 64, dtype=dtype, device=device)
            mask = torch.ones(1, 1, 128, 128, dtype=torch.bool, device=device) if masked else None
            dispatch_attention_fn(query, query, query, attn_mask=mask, backend=AttentionBackendName(name))

        backends.append(_probe(name, attend))
    return backends


def _probe(name: str, attend) -> Kernel:
    """Run ``attend(dtype, masked)`` for each dtype, then with a mask at the first dtype that ran."""
    import warnings

    dtypes, first = {}, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in DTYPES:
            try:
                attend(getattr(torch, dtype), False)
                dtypes[dtype] = None
                first = first or dtype
            except Exception as error:  # every kernel and library reports its refusal its own way
                dtypes[dtype] = _first_line(error)
        masks = None
        if first is not None:
            try:
                attend(getattr(torch, first), True)
                masks = True
            except Exception:  # the same: a refusal, whatever its type
                masks = False
    return Kernel(name=name, dtypes=dtypes, masks=masks)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _package(name: str, module: str, install: str, purpose: str) -> Package:
    version = _version(name) if importlib.util.find_spec(module) is not None else None
    return Package(name=name, version=version, install=install, purpose=purpose)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cached_models() -> tuple[list[str], int]:
    """Catalog models whose weights (every component) are in the local Hugging Face cache."""
    from diffmeter.catalog import all_entries
    from diffmeter.weights import locate_weights

    real = [entry for entry in all_entries() if entry.origin == "catalog"]
    cached = []
    for entry in real:
        try:
            locate_weights(entry, random_weights=False)
        except DiffmeterError:
            continue
        cached.append(entry.name)
    return cached, len(real)
