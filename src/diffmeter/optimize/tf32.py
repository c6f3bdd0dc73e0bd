"""TF32 tensor-core math for float32 matmuls and convolutions (Ampere and newer).

On by default for CUDA runs (``--no-tf32`` turns it off); it only changes float32 work.
A CUDA run without it sets strict float32 (IEEE) for both matmuls and cuDNN convolutions,
since PyTorch's own default leaves convolutions in TF32.

PyTorch 2.9+ has two APIs for these switches; reading the legacy ``allow_tf32`` after
anyone used the new ``fp32_precision`` raises. So settings are *written* with the legacy
setters (which keep both views in step, and which inductor still reads) and *read* through
the new getters when they exist (which never raise).
"""

from __future__ import annotations

import contextlib

import torch

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register


def fp32_precision() -> dict[str, str]:
    """How float32 matmuls and cuDNN convolutions run right now: "tf32" or "ieee"."""
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        generic = getattr(backends, "fp32_precision", "none")
        matmul = _inherit(backends.cuda.matmul.fp32_precision, generic)
        convolution = _inherit(backends.cudnn.conv.fp32_precision, backends.cudnn.fp32_precision, generic)
        return {"matmul": _name(matmul == "tf32"), "convolution": _name(convolution == "tf32")}
    return {"matmul": _name(backends.cuda.matmul.allow_tf32), "convolution": _name(backends.cudnn.allow_tf32)}


def _inherit(*levels: str) -> str:
    """The first setting that is not "none" (an op inherits its backend's, which inherits the generic one)."""
    return next((level for level in levels if level != "none"), "ieee")


def _name(tf32: bool) -> str:
    return "tf32" if tf32 else "ieee"


@contextlib.contextmanager
def fp32_math(tf32: bool):
    """Float32 matmuls and convolutions in TF32 (``tf32``) or strict IEEE float32 inside the block."""
    previous = fp32_precision()
    _write(tf32, tf32)
    try:
        yield
    finally:
        _write(previous["matmul"] == "tf32", previous["convolution"] == "tf32")


def _write(matmul: bool, convolution: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = convolution


@register
class TF32(Optimization):
    name = "tf32"
    kind = "precision"
    lossless = False
    summary = "float32 matmuls/convolutions on TF32 tensor cores (10-bit mantissa)"

    def supports(self, target: Target) -> str | None:
        if target.device.type != "cuda":
            return "TF32 is an NVIDIA tensor-core mode; this run is on " + target.device.type
        return None

    def apply(self, pipe, target: Target) -> None:
        """Nothing to change on the pipeline: the switch is per call (see ``call_context``)."""

    def call_context(self):
        return fp32_math(True)
