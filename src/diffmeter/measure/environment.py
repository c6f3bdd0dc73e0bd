"""Where a measurement ran: library versions, devices, driver, CPU, settings, our commit."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from diffmeter.measure.host_link import HostLink

#: variables that change what a run measures
RELEVANT_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
)
RELEVANT_PREFIXES = ("TORCHINDUCTOR_", "TORCH_COMPILE", "DIFFMETER_")
LIBRARIES = ("torch", "diffusers", "transformers", "accelerate", "zeus", "numpy")
#: the variables above that change how fast a run runs (not where its weights are read from)
SPEED_VARIABLES = (
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
SPEED_PREFIXES = ("TORCHINDUCTOR_", "TORCH_COMPILE")


class Environment(BaseModel):
    python: str
    platform: str
    cpu: str
    cpu_count: int
    libraries: dict[str, str | None]
    cuda: str | None
    cudnn: int | None
    driver: str | None
    devices: list[str]
    device_memory_bytes: list[int]
    torch_threads: int
    variables: dict[str, str]
    diffmeter: str
    diffmeter_commit: str | None
    #: the run's host link (copy rates between host memory and its GPU), measured once per CUDA run before loading;
    #: None on a CPU run and in runs stored before it was measured
    host_link: HostLink | None = None


def device_name(environment: Environment, device: str) -> str:
    """The GPU a run on ``device`` used (``cuda:N``), or the CPU's name."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return environment.devices[index] if index < len(environment.devices) else device
    return environment.cpu


def speed_settings(environment: Environment, device: str) -> dict[str, str]:
    """What beside its spec changes how fast a run on ``device`` runs: the device's name, torch's CPU threads, the
    versions of torch, diffusers and transformers (and CUDA's on a GPU), the variables that change what runs."""
    settings = {"hardware": device_name(environment, device), "torch threads": str(environment.torch_threads)}
    settings.update({name: str(environment.libraries.get(name)) for name in ("torch", "diffusers", "transformers")})
    if device.startswith("cuda"):
        settings.update(cuda=str(environment.cuda), cudnn=str(environment.cudnn), driver=str(environment.driver))
    variables = environment.variables.items()
    settings.update({k: v for k, v in variables if k in SPEED_VARIABLES or k.startswith(SPEED_PREFIXES)})
    return settings


def speed_differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """``speed_settings`` that differ from ``a`` to ``b``, as "torch threads: 2 -> 1" (a variable set on one side
    only: "unset" on the other)."""
    keys = list(a) + [key for key in b if key not in a]
    return [f"{key}: {a.get(key, 'unset')} -> {b.get(key, 'unset')}" for key in keys if a.get(key) != b.get(key)]


def collect() -> Environment:
    import torch

    from diffmeter.predict.cpu_peaks import cpu_name

    cuda = torch.cuda.is_available()
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    memory = [torch.cuda.get_device_properties(i).total_memory for i in range(len(devices))]
    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        cpu=cpu_name(),
        cpu_count=os.cpu_count() or 1,
        libraries={name: _version(name) for name in LIBRARIES},
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if cuda else None,
        driver=driver_version() if cuda else None,
        devices=devices,
        device_memory_bytes=memory,
        torch_threads=torch.get_num_threads(),
        variables={
            k: v for k, v in sorted(os.environ.items()) if k in RELEVANT_VARIABLES or k.startswith(RELEVANT_PREFIXES)
        },
        diffmeter=_version("diffmeter") or "unknown",
        diffmeter_commit=_commit(),
    )


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # pynvml missing or NVML unusable: fall back to nvidia-smi
        return _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def _commit() -> str | None:
    """The git commit of the diffmeter source, with ``-dirty`` if it has local changes."""
    source = Path(__file__).resolve().parent
    commit = _run(["git", "-C", str(source), "rev-parse", "HEAD"])
    if commit is None:
        return None
    dirty = _run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"])
    return commit + ("-dirty" if dirty else "")


def _run(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
