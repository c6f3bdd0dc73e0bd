"""The predicted size of a published single-file checkpoint that community tools write from catalog components
(``rules: forge-bnb`` or ``comfy-cast`` in ``catalog.quantized_files``), as a range of bytes over the per-tensor
choices its source does not publish. Each file names its parts (``QuantizedFile.parts``: component -> how it is
stored); every part is the component's state dict as its class lists it (``module.state_dict()``: persistent tensors,
a tied weight under each of its names, as safetensors files of these layouts hold them).

Stored forms of a part:

* ``float8_e4m3fn``, ``float16``, ``bfloat16``: a cast. Where the source states the part's format (a Forge bundle's
  README: "T5xxl in fp8e4m3fn", "CLIP-L in fp16", "VAE in bf16") every tensor is at that width; in a ComfyUI file,
  whose small tensors' widths are published nowhere, the low end stores every tensor at that width, the high end
  only the ``nn.Linear`` weights, every other tensor (biases, norms, embeddings, convolutions) at float32.
* ``float8_e4m3fn-scaled``: ComfyUI's scaled fp8, the same cast with a float32 ``scale_weight`` scalar per Linear
  weight (ComfyUI comfy/ops.py ``scaled_fp8_ops``: ``torch.ones((), dtype=torch.float32)`` per layer; read as
  ``prefix + 'scale_weight'`` by Forge's backend/operations.py:141-142 at d6b1d188) and the ``scaled_fp8`` marker,
  an empty tensor of the fp8 type (ComfyUI comfy/model_base.py ``state_dict_for_saving``:
  ``torch.tensor([], dtype=self.model_config.scaled_fp8)``; read by comfy/model_detection.py
  ``model_config_from_unet`` at 006dd0ae), 0 bytes. Both ComfyUI functions are quoted from the code of that era
  (seen in copies of it); the stored ComfyUI files (ops.py 003124c1, model_base.py 003617c4) are its later
  mixed-precision layout, which no longer writes them.
* ``bnb-nf4`` / ``bnb-nf4-nested``: Forge's bitsandbytes NF4 layers (lllyasviel/stable-diffusion-webui-forge
  backend/operations_bnb.py): every ``nn.Linear`` of the model is a ``ForgeLoader4Bit`` (backend/operations.py:334-352
  at cfa5242a swaps ``torch.nn.Linear`` while the model is built; backend/nn/flux.py builds every layer of FLUX.1 with
  it), saved with the weight's ``quant_state.as_dict(packed=True)`` (operations_bnb.py:76-80): NF4 data, the absmax
  per block of 64 and the 16-value map (``quantized_layouts.bnb_bytes``); ``-nested`` is the double quantization
  Forge 2.0.0 used (``compress_statistics=True``, :108 at cfa5242a: the absmax quantized to a byte per block, a
  float32 absmax per 256 of those, bitsandbytes 0.50.2 functional.py:938-940), which also stores the 256-value
  float32 ``nested_quant_map`` per layer (bitsandbytes 0.50 functional.py ``QuantState.as_dict``: cloned per layer;
  its ``nested_offset`` goes into the packed JSON);
  ``bnb-nf4`` is its float32 absmax (``compress_statistics=False, blocksize=64``, :108-109 at bb28bc38). Biases and
  norms: the low end at 16 bits, the high end at 32. The packed JSON description per layer (a few hundred bytes)
  and the safetensors header are left out, as for the other files.

The parts are counted with diffusers' layer names; the original layouts Forge and ComfyUI write fuse some linears
(FLUX.1's ``qkv``, ``linear1``): the same weights and, every dimension being a multiple of 64, the same blocks; only
the per-layer maps differ (at most 190 layers x 1,088 bytes, 0.2 MB)."""

from __future__ import annotations

import torch

from diffmeter.catalog.quantized_files import QuantizedFile
from diffmeter.predict import quantized_layouts as layouts
from diffmeter.predict.quantized_files import component_module, error

#: the bytes per value of each cast
WIDTH = {"float8_e4m3fn": 1, "float8_e4m3fn-scaled": 1, "float16": 2, "bfloat16": 2}
#: the rule sets predicted here
RULES = ("forge-bnb", "comfy-cast")


def part_range(module: torch.nn.Module, stored: str, stated: bool = False) -> tuple[int, int]:
    """The bytes of one part's state dict in the stored form: (every choice narrowest, every choice widest);
    ``stated``: a cast whose every tensor is at the width its source states."""
    linears = {f"{name}.weight": m for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    tensors = module.state_dict(keep_vars=True)
    weights = [t for name, t in tensors.items() if name in linears]
    rest = sum(t.numel() for name, t in tensors.items() if name not in linears)
    if stored.startswith("bnb-nf4"):
        nested = stored == "bnb-nf4-nested"
        size = sum(layouts.bnb_bytes("nf4", *t.shape, double_quant=nested) for t in weights)
        # each layer's nested_quant_map; its float32 offset is a field of the packed JSON, not a tensor
        size += len(weights) * (256 * 4 - 4) if nested else 0
        return size + rest * 2, size + rest * 4
    if stored not in WIDTH:
        raise ValueError(f"{stored}: not a stored form of a single-file checkpoint ({', '.join(WIDTH)}, bnb-nf4)")
    width = WIDTH[stored]
    narrow = sum(t.numel() for t in weights) * width
    scales = len(weights) * 4 if stored.endswith("-scaled") else 0
    return narrow + rest * width + scales, narrow + rest * (width if stated else 4) + scales


def predicted_ranges(files: list[QuantizedFile]) -> list[tuple[int, int] | None]:
    """Each file's predicted (low, high) bytes, None for a file not predicted here."""
    found = []
    for file in files:
        if file.rules not in RULES or not file.parts:
            found.append(None)
            continue
        low = high = 0
        for component, stored in file.parts.items():
            part = part_range(component_module(file.model, component), stored, stated=file.rules == "forge-bnb")
            low, high = low + part[0], high + part[1]
        found.append((low, high))
    return found


def range_errors(predicted: tuple[int, int], file: QuantizedFile) -> tuple[float, float]:
    """Each end's error against the published figure's rounding range (0 inside it)."""
    return error(predicted[0], file), error(predicted[1], file)


def verdict(errors: tuple[float, float], limit: float = 0.005) -> str:
    """Whether the prediction holds whatever the unpublished choices, or which end misses."""
    missing = [f"the {end} end misses ({found:+.2%})" for end, found in zip(("low", "high"), errors, strict=True)
               if abs(found) >= limit]  # fmt: skip
    return " and ".join(missing) if missing else f"within {limit:.1%} whatever the unpublished choice"
