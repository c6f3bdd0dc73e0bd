"""GGUF single files (``--quantize gguf:TYPE --weights FILE.gguf``): the component's weights read from a
pre-quantized file by the model class's ``from_single_file`` with ``GGUFQuantizationConfig(compute_dtype=<the run's
dtype>)``, its config from the pipeline's folder. Blocks are dequantized in each matmul in PyTorch (diffusers'
gguf/utils.py), so it runs on a CPU, and so on CUDA too by default: diffusers uses the ggml CUDA kernels only with
``DIFFUSERS_GGUF_CUDA_KERNELS=true``, the ``kernels`` package and trusted remote kernels (gguf/utils.py:34-51).

TYPE names the file's quantization as its name says (Q4_K_M, Q8_0 ...); the file's most common quantized tensor
type must be TYPE's (Q4_K for Q4_K_M), or the run is refused before loading."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizeAtLoad
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quantized_loading import SingleFile
from diffmeter.quiet import quiet_import

#: tensor types that are not a quantization (biases, norms stored whole)
WHOLE = ("F32", "F16", "F64")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["gguf"].types] = "Q8_0"
    #: the .gguf file (--weights FILE)
    file: str | None = None
    #: the component the file holds; empty means the denoiser
    components: list[str] = []


def file_type(path: Path) -> str:
    """The most common quantized tensor type in a GGUF file (F32/F16 tensors aside), e.g. Q4_K; in a file of whole
    tensors, its weights' (the 2-D tensors': city96's F16 files hold their biases and norms in F32)."""
    with quiet_import():
        from gguf import GGUFReader

    tensors = GGUFReader(str(path)).tensors
    counts = collections.Counter(t.tensor_type.name for t in tensors)
    quantized = [(n, name) for name, n in counts.items() if name not in WHOLE]
    if quantized:
        return max(quantized)[1]
    weights = collections.Counter(t.tensor_type.name for t in tensors if len(t.shape) >= 2)
    return max((n, name) for name, n in (weights or counts).items())[1]


@register
class Gguf(QuantizeAtLoad):
    name = "gguf"
    summary = BACKENDS["gguf"].summary
    Config = Config
    package = ("gguf", "gguf")
    single_file = True
    # peft merges the adapter's product into the weight tensor, which GGUF keeps packed in blocks (Q8_0: 34 bytes a
    # 32 weights): "The size of tensor a (34) must match the size of tensor b (32)", a new user's trial
    unfusable = "peft cannot merge a LoRA into GGUF's packed blocks (diffusers keeps them quantized)"
    one_byte_types = tuple(t for t in BACKENDS["gguf"].types if t not in ("BF16", "F16"))

    def supports(self, target: Target) -> str | None:
        return self.file_refusal(target) or super().supports(target)

    def file_refusal(self, target: Target) -> str | None:
        """Why the file cannot be this run's: none given, missing, not GGUF, another type, or several components."""
        if self.config.file is None:
            return "gguf reads a pre-quantized single file: add --weights FILE.gguf"
        path = Path(self.config.file).expanduser()
        if not path.is_file():
            return f"no GGUF file {path}"
        if len(self.components(target)) != 1:
            return "a GGUF file holds one component's weights: name one (NAME=gguf:TYPE)"
        try:
            found = file_type(path)
        except (ValueError, OSError) as error:
            return f"{path} is not a GGUF file ({' '.join(str(error).split())[:120]})"
        if found != self.config.type.removesuffix("_S").removesuffix("_M"):
            return f"{path.name} holds {found} tensors, not {self.config.type}: say --quantize gguf:{found}"
        return None

    def config_for(self, target: Target, transformers: bool):
        from diffusers import GGUFQuantizationConfig

        config = GGUFQuantizationConfig(compute_dtype=getattr(torch, target.dtype))
        return SingleFile(Path(self.config.file).expanduser(), config)

    def label(self) -> str:
        return f"{super().label()}-{Path(self.config.file or 'none').stem}"
