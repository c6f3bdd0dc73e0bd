"""Torch-TensorRT as the ``torch.compile`` backend of the denoiser (CUDA only).

``import torch_tensorrt`` registers the ``"torch_tensorrt"`` backend with dynamo; the denoiser's
``forward`` is compiled in place with it (``dynamic=False``: one TensorRT engine per input shape,
built in the first call that meets it, so engine building lands in the cold call like any
compilation). Operators TensorRT has no converter for stay in PyTorch, and subgraphs smaller
than ``min_block_size`` operators are not worth an engine. Hooks on the module (the stage
timer) stay outside the graph, as with ``compile``.

Written against Torch-TensorRT's documented API (the torch.compile backend guide and
``torch_tensorrt.dynamo.CompilationSettings``: ``enabled_precisions``, ``min_block_size``,
``optimization_level``); not yet run on a GPU by diffmeter's tests (see the README).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.base import Optimization, Target, denoisers
from diffmeter.optimize.registry import register

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: fewest operators in a subgraph TensorRT builds an engine for (the rest runs in PyTorch)
    min_block_size: int = Field(5, ge=1)
    #: TensorRT builder optimization level 0-5 (None: TensorRT's default, 3); higher builds longer
    optimization_level: int | None = Field(None, ge=0, le=5)


@register
class TensorRT(Optimization):
    name = "tensorrt"
    kind = "compile"
    lossless = True
    exclusive = True
    summary = "Torch-TensorRT as the torch.compile backend of the denoiser (CUDA)"
    package = ("torch_tensorrt", "tensorrt")
    Config = Config

    def supports(self, target: Target) -> str | None:
        if target.device.type != "cuda":
            return f"TensorRT builds engines for NVIDIA GPUs; this run is on {target.device.type}"
        return None

    def note(self, target: Target) -> str | None:
        return (
            "peak memory is read from PyTorch's allocator: GPU memory TensorRT allocates itself (its engines) is not "
            "in it; PyTorch's copy of the weights stays resident too"
        )

    def clashes(self, others: list[Optimization]) -> str | None:
        for other in others:
            if other.name == "offload":
                return (
                    "tensorrt and offload do not combine: a TensorRT engine holds its own copy of the weights on the "
                    "GPU, so offloading the PyTorch module saves nothing"
                )
            if other.kind == "quantization":
                return (
                    f"tensorrt and {other.name} do not combine: TensorRT has no converters for torchao's quantized "
                    "tensors"
                )
        return None

    def options(self, target: Target) -> dict:
        """The backend's CompilationSettings for this run."""
        options = {"enabled_precisions": {_DTYPES[target.dtype]}, "min_block_size": self.config.min_block_size}
        if self.config.optimization_level is not None:
            options["optimization_level"] = self.config.optimization_level
        return options

    def apply(self, pipe, target: Target) -> None:
        import torch_tensorrt  # noqa: F401  (registers the "torch_tensorrt" backend)

        for module in denoisers(pipe, target):
            module.forward = torch.compile(
                module.forward, backend="torch_tensorrt", dynamic=False, options=self.options(target)
            )

    def restore(self, pipe, target: Target) -> None:
        """Drop compiled code, so a later run in this process compiles afresh."""
        torch._dynamo.reset()
