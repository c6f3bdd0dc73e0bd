"""A BFL fp8 or nvfp4 single file of a model's weights, quantized by diffusers' own functions (quantizers/bfl/utils.py
``quantize_fp8r``, ``quantize_nvfp4``) under the model's state-dict names (diffusers' format): each ``nn.Linear``
weight with its scales (nvfp4: rows that split into blocks of 16, a calibrated ``input_scale`` of 1), the rest as it
is. The tests load it through ``--quantize bfl:TYPE --weights FILE``."""

from __future__ import annotations

from pathlib import Path

import torch


def write_bfl(module: torch.nn.Module, path: Path, kind: str = "fp8") -> set[str]:
    """``module``'s weights as ``path`` in ``kind``; returns the names of the quantized weights."""
    from diffusers.quantizers.bfl.utils import quantize_fp8r, quantize_nvfp4
    from safetensors.torch import save_file

    linears = {f"{name}.weight" for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    tensors, quantized = {}, set()
    for name, tensor in module.state_dict().items():
        tensor = tensor.detach()
        prefix = name.removesuffix(".weight")
        if name in linears and kind == "fp8":
            tensors[name], tensors[f"{prefix}.weight_scale"] = quantize_fp8r(tensor)
        elif name in linears and kind == "nvfp4" and tensor.shape[1] % 16 == 0:
            weight, scale, scale_2 = quantize_nvfp4(tensor)
            tensors.update({name: weight, f"{prefix}.weight_scale": scale, f"{prefix}.weight_scale_2": scale_2})
            tensors[f"{prefix}.input_scale"] = torch.tensor(1.0)
        else:
            tensors[name] = tensor.contiguous()
            continue
        quantized.add(name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return quantized
