"""Nunchaku Lite folders (``--quantize nunchaku:TYPE --weights DIR``): a component folder made by
diffuse-compressor, whose config.json holds a ``NunchakuLiteQuantizationConfig`` (``quant_method: nunchaku_lite``),
loaded by the model class's ``from_pretrained(DIR)`` as users load it; diffusers cannot quantize at load
(quantization_config.py: ``pre_quantized = True``). TYPE is the folder's SVDQ W4A4 precision (int4 or nvfp4, its
AWQ W4A16 layers beside them), or awq-int4 for a folder of AWQ W4A16 layers only.

Where it runs, from diffusers 0.42.1 (quantizers/nunchaku/): the ``kernels`` package (nunchaku_quantizer.py:25-29),
a CUDA GPU (:32-34), not Hopper (:38-39), Blackwell for nvfp4 (:49-50), Turing or newer for int4 (:51-52); its
kernels are downloaded from the Hub (rootonchair/nunchaku-lite-kernels, utils.py:20-41), which diffusers allows
only with ``DIFFUSERS_TRUST_REMOTE_KERNELS=true`` and ``DIFFUSERS_DISABLE_REMOTE_CODE`` unset (utils.py:27-31, read once
at import into utils/constants.py:63-66): the refusal reads diffusers' own flag."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import Target
from diffmeter.optimize.quantize_at_load import QuantizedFolder
from diffmeter.optimize.registry import register
from diffmeter.quantization_spec import BACKENDS

#: the environment variable diffusers reads before it downloads the kernels (utils/constants.py:63-65)
TRUST = "DIFFUSERS_TRUST_REMOTE_KERNELS"


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[BACKENDS["nunchaku"].types] = "int4"
    #: the component's folder (--weights DIR)
    file: str | None = None
    #: the component the folder holds; empty means the denoiser
    components: list[str] = []


def folder_type(config: dict) -> str | None:
    """The type a folder's ``quantization_config`` holds (None: not Nunchaku Lite's)."""
    if config.get("quant_method") != "nunchaku_lite":
        return None
    svdq = config.get("svdq_w4a4")
    if svdq is not None:
        return svdq.get("precision")
    return "awq-int4" if config.get("awq_w4a16") is not None else None


@register
class Nunchaku(QuantizedFolder):
    name = "nunchaku"
    summary = BACKENDS["nunchaku"].summary
    Config = Config
    package = ("kernels", "nunchaku")
    one_byte_types = BACKENDS["nunchaku"].types
    folder, made_by = "a Nunchaku Lite folder", "diffuse-compressor's"

    def cannot_run(self, target: Target) -> str | None:
        if target.device.type != "cuda":
            return (
                f"diffusers loads Nunchaku Lite checkpoints only on a CUDA GPU (Turing or newer, not Hopper; "
                f"Blackwell for nvfp4), not on {target.device.type}: run it on one (bench --device cuda, profile "
                "--gpu NAME)"
            )
        capability = torch.cuda.get_device_capability(target.device)
        this = f"this is {capability[0]}.{capability[1]}"
        if capability[0] == 9:
            return (
                "diffusers does not load Nunchaku Lite checkpoints on Hopper GPUs: use an Ampere, Ada or Blackwell GPU"
            )
        if self.config.type == "nvfp4" and capability < (10, 0):
            return f"nunchaku:nvfp4 needs a Blackwell GPU (compute capability 10.0+), {this}"
        if capability < (7, 5):
            return f"nunchaku:{self.config.type} needs compute capability 7.5+ (Turing), {this}"
        return None

    def supports(self, target: Target) -> str | None:
        reason = self.cannot_run(target) or self.folder_refusal(target)
        if reason:
            return reason
        from diffusers.utils import constants

        if not constants.DIFFUSERS_TRUST_REMOTE_KERNELS:
            disabled = " and unset DIFFUSERS_DISABLE_REMOTE_CODE" if constants.DIFFUSERS_DISABLE_REMOTE_CODE else ""
            return (
                "diffusers downloads Nunchaku Lite's kernels from the Hub (rootonchair/nunchaku-lite-kernels, not a "
                f"trusted publisher) only when allowed: set {TRUST}=true{disabled}"
            )
        return super().supports(target)

    def folder_refusal(self, target: Target) -> str | None:
        """Why the folder cannot be this run's: none given, not a folder, not Nunchaku Lite, another type."""
        found_folder = self.folder_config(target)
        if isinstance(found_folder, str):
            return found_folder
        path, quantization = found_folder
        found = folder_type(quantization)
        if found is None:
            return f"{path}/config.json holds no Nunchaku Lite quantization_config (quant_method nunchaku_lite)"
        if found != self.config.type:
            return f"{path.name} holds nunchaku {found} layers, not {self.config.type}: say --quantize nunchaku:{found}"
        return None
