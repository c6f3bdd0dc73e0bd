"""Intel AutoRound folders (``--quantize autoround:TYPE --weights DIR``): a component folder whose config.json holds an
``AutoRoundConfig`` (``quant_method: auto-round``), loaded by the model class's ``from_pretrained(DIR)`` as users load
it; diffusers only loads such folders (quantizers/autoround/autoround_quantizer.py:52-64: ``pre_quantized`` or
ValueError). TYPE is the folder's integer weights, ``int{bits}`` (W2A16 to W8A16, groups of ``group_size``).

Where it runs, from diffusers 0.42.1 and auto-round 0.16.1 (auto_round/inference/): diffusers hands auto-round the
``device_map`` (None from ``from_pretrained`` without one: "cpu", convert_model.py:604-627), whose layers for that
device it picks by priority (backend.py:1241-1276). On CUDA the component is loaded with the run's device as its
``device_map``, as diffusers' AutoRound guide loads it (``device_map="cuda"``), so auto-round picks its CUDA layers
(Triton, Marlin with gptqmodel) rather than the CPU's moved to the GPU. On a CPU without auto-round-lib,
``auto_round:torch_zp`` for auto-round's default GPTQ packing and ``auto_round:torch`` otherwise
(backend.py:475-503: cpu, cuda and xpu; 2 to 8 bits; in and out features multiples of 32), plain torch that unpacks
and dequantizes each weight in every call (auto_round_extension/torch/qlinear_torch_zp.py:306-380). Those layers
compute in float16 or bfloat16 only: for any other dtype ``post_init`` casts the loaded model
(convert_model.py:801-816), which diffusers refuses for a quantized model (models/modeling_utils.py:1618, "Casting a
quantized model to a new `dtype` is unsupported": run here with float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizedFolder
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS
from diffmeter.quantized_loading import Folder

#: the dtypes auto-round's torch layers compute in (inference/backend.py:479, :494 ``compute_dtype``)
COMPUTE_DTYPES = ("bfloat16", "float16")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["autoround"].types] = "int4"
    #: the component's folder (--weights DIR)
    file: str | None = None
    #: the component the folder holds; empty means the denoiser
    components: list[str] = []


def folder_type(config: dict) -> str | None:
    """The type a folder's ``quantization_config`` holds: ``int{bits}`` for integer weights with 16-bit activations
    (None: not AutoRound's, or another scheme: float data types, quantized activations)."""
    if config.get("quant_method") != "auto-round":
        return None
    if config.get("data_type", "int") != "int" or (config.get("act_bits") or 16) < 16:
        return None
    return f"int{config.get('bits', 4)}"


@register
class AutoRound(QuantizedFolder):
    name = "autoround"
    summary = BACKENDS["autoround"].summary
    Config = Config
    package = ("auto_round", "autoround")
    one_byte_types = BACKENDS["autoround"].types
    folder, made_by = "an AutoRound folder", "auto-round's export"

    def supports(self, target: Target) -> str | None:
        reason = self.folder_refusal(target)
        if reason:
            return reason
        if target.dtype not in COMPUTE_DTYPES:
            return (
                f"auto-round's layers compute in bfloat16 or float16, and diffusers refuses the cast auto-round makes "
                f"from {target.dtype}: add --dtype bfloat16"
            )
        return super().supports(target)

    def folder_refusal(self, target: Target) -> str | None:
        """Why the folder cannot be this run's: none given, not a folder, not AutoRound's, another type."""
        found_folder = self.folder_config(target)
        if isinstance(found_folder, str):
            return found_folder
        path, quantization = found_folder
        if quantization.get("quant_method") != "auto-round":
            return f"{path}/config.json holds no AutoRound quantization_config (quant_method auto-round)"
        found = folder_type(quantization)
        if found not in self.backend().types:
            scheme = found or f"{quantization.get('data_type')} weights, {quantization.get('act_bits')}-bit activations"
            return f"{path.name} holds AutoRound {scheme}; autoround's types: {', '.join(self.backend().types)}"
        if found != self.config.type:
            return (
                f"{path.name} holds AutoRound {found} weights, not {self.config.type}: say --quantize autoround:{found}"
            )
        return None

    def config_for(self, target: Target, transformers: bool):
        """The folder, on the run's CUDA device where it runs on one (module docstring)."""
        on_gpu = str(target.device) if target.device.type == "cuda" else None
        return Folder(Path(self.config.file).expanduser(), device_map=on_gpu)
