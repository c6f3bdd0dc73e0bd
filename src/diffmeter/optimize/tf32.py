"""TF32 tensor-core math for float32 matmuls and convolutions (Ampere and newer).

On by default for CUDA runs (``--no-tf32`` turns it off); it only changes float32 work.
"""

from __future__ import annotations

import contextlib

import torch

from diffmeter.optimize.base import Optimization, Target
from diffmeter.optimize.registry import register


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

    @contextlib.contextmanager
    def call_context(self):
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
