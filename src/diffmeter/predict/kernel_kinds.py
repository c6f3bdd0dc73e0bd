"""The kinds of device a quantization backend picks its kernels for (``quantized_kernels``), named without torch, so
a cached answer (``fit``, ``profile --gpu``) can say which kind a table GPU is without loading it."""

from __future__ import annotations

#: the devices kernels are chosen for: a CPU; an NVIDIA GPU of compute capability 8.0 or later on CUDA 12.1 or
#: later (every GPU in the table but the Turing, Volta and AMD ones); another GPU (those, through CUDA or ROCm)
CPU, SM80, OTHER_GPU = "cpu", "cuda-sm80", "cuda"
#: the table's architectures older than sm_80, or not NVIDIA's (predict/devices.py ``ARCHITECTURES``)
OLDER = ("turing", "volta", "cdna3")


def of_architecture(architecture: str | None) -> str:
    """A table GPU's kernels by its architecture; one naming none (a ``--gpu-spec`` without ``arch=``) is taken
    for a current NVIDIA GPU."""
    return OTHER_GPU if architecture in OLDER else SM80
