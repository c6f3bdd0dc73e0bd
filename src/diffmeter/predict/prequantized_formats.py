"""The stored bytes of a component loaded from a pre-quantized BFL file or Nunchaku Lite or AutoRound folder
(diffusers 0.42.1), tensor by tensor, on a meta build of it (``footprints.meta_module``); the bytes of one layer are
``quantized_layouts.bfl_bytes`` / ``nunchaku_bytes``. Which layers are quantized is the checkpoint's:

* BFL: a linear layer whose weight comes with a ``weight_scale`` (bfl_quantizer.py:63-85), replaced unless a module on
  its path is named in ``_keep_in_fp32_modules`` (bfl/utils.py:406-419); such a layer's weight is dequantized to
  float32 (bfl_quantizer.py:116-122). Offline (no file) every linear weight is assumed quantized, for nvfp4 those
  whose rows split into blocks of 16 (the layout's own limit; which layers BFL's published files scale is not read).
  The dequantized weight at the compute dtype is materialized in each forward where no fused kernel runs
  (bfl/utils.py:345, :393), and counted so everywhere: an upper bound where fp8's ``torch._scaled_mm`` (CUDA 8.9+)
  or nvfp4's FlashInfer GEMM (Blackwell) runs instead.
* Nunchaku Lite: the targets its ``quantization_config`` lists, replaced by SVDQ W4A4 or AWQ W4A16 layers at the
  compute dtype (nunchaku/utils.py:379-420); the quantizer keeps nothing in float32 (no ``use_keep_in_fp32_modules``).
* AutoRound: the layers auto-round 0.16.1's own ``convert_hf_model`` replaces, run on a copy of the meta module
  (``autoround_tensors``); keeps nothing in float32 either (autoround_quantizer.py sets no
  ``use_keep_in_fp32_modules``).
"""

from __future__ import annotations

import torch

from diffmeter.predict import quantized_layouts as layouts
from diffmeter.quiet import quiet_import

#: auto-round's layers whose buffers are counted: its torch ones, the CPU's without auto-round-lib (inference/
#: backend.py:475-503; module docstring of optimize/quantize_autoround.py)
AUTOROUND_TORCH = ("auto_round:torch", "auto_round:torch_zp")


def bfl_file_types(path) -> dict[str, str]:
    """Each quantized weight of a BFL file and its type (a ``weight_scale_2`` beside it: nvfp4), from its keys."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        keys = set(handle.keys())
    prefixes = [key.removesuffix(".weight_scale") for key in keys if key.endswith(".weight_scale")]
    return {f"{p}.weight": "nvfp4" if f"{p}.weight_scale_2" in keys else "fp8" for p in prefixes}


def bfl_offline_types(module: torch.nn.Module, kind: str) -> dict[str, str]:
    """The quantized weights of a BFL file of ``module`` made as the module docstring says."""
    return {
        f"{name}.weight": kind
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Linear) and (kind == "fp8" or m.in_features % layouts.NVFP4_BLOCK == 0)
    }


def bfl_tensors(module: torch.nn.Module, kind: str, dtype: torch.dtype, types: dict[str, str] | None):
    """(name, bytes, quantized, dequantized bytes) of every parameter and buffer, tied ones once."""
    types = bfl_offline_types(module, kind) if types is None else types
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or [])
    found, seen = [], set()
    for owner_name, owner in module.named_modules():
        prefix = f"{owner_name}." if owner_name else ""
        for local, tensor in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            name = prefix + local
            stored = types.get(name) if isinstance(owner, torch.nn.Linear) and local == "weight" else None
            if stored is None:
                found.append((name, tensor.numel() * tensor.element_size(), False, 0))
            elif keep & set(owner_name.split(".")):
                found.append((name, tensor.numel() * 4, False, 0))
            else:
                size = layouts.bfl_bytes(stored, owner.out_features, owner.in_features)
                found.append((name, size, True, tensor.numel() * dtype.itemsize))
    return found


def nunchaku_tensors(module: torch.nn.Module, dtype: torch.dtype, config: dict):
    """(name, bytes, quantized, 0) of every parameter and buffer, the targets of ``config`` (a folder's
    ``quantization_config``) replaced; their kernels never dequantize a weight whole."""
    replaced = {}
    for section, kind in (("svdq_w4a4", None), ("awq_w4a16", "awq-int4")):
        part = config.get(section)
        for target in (part or {}).get("targets", []):
            replaced[target] = (kind or part["precision"], part.get("rank", 0))
    found, seen = [], set()
    for owner_name, owner in module.named_modules():
        if any(owner_name.startswith(f"{target}.") for target in replaced):
            continue
        prefix = f"{owner_name}." if owner_name else ""
        if owner_name in replaced:
            kind, rank = replaced[owner_name]
            size = layouts.nunchaku_bytes(kind, owner.out_features, owner.in_features, rank, dtype)
            found.append((f"{prefix}qweight", size, True, 0))
            if owner.bias is not None:
                found.append((f"{prefix}bias", owner.out_features * dtype.itemsize, False, 0))
            continue
        for local, tensor in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                found.append((prefix + local, tensor.numel() * tensor.element_size(), False, 0))
    return found


def autoround_tensors(module: torch.nn.Module, dtype: torch.dtype, config: dict):
    """(name, bytes, quantized, dequantized bytes) of every parameter and buffer as diffusers loads an AutoRound folder
    whose ``quantization_config`` is ``config``: auto-round's ``convert_hf_model`` run on a copy of ``module`` under
    the meta device picks the layers and their backend as loading does (the ``device_map`` diffmeter passes is None:
    "cpu"); a torch layer holds ``qweight`` (int32, in x bits / 32 rows by out), ``qzeros`` (int32, a row per group,
    out x bits / 32 columns) and ``scales`` (a row per group by out) and its bias
    (auto_round_extension/torch/qlinear_torch_zp.py:41-80, qlinear_torch.py:117-152), its float tensors loaded at the
    run's dtype like every other one; each call dequantizes the weight whole at that dtype (qlinear_torch_zp.py:372,
    qlinear_torch.py the same)."""
    import copy

    from diffusers.quantizers.quantization_config import AutoRoundConfig

    with quiet_import():
        from auto_round.inference.convert_model import convert_hf_model

        converted = copy.deepcopy(module)
        converted.register_to_config(quantization_config=AutoRoundConfig.from_dict(config))
        with torch.device("meta"):
            converted, used = convert_hf_model(converted, "cpu")
    other = [name for name in used if name not in AUTOROUND_TORCH]
    if other:
        raise ValueError(f"auto-round picks its {', '.join(other)} layers here, whose stored layout is not predicted")
    found, seen = [], set()
    for owner_name, owner in converted.named_modules():
        prefix = f"{owner_name}." if owner_name else ""
        layer = hasattr(owner, "qweight")
        for local, tensor in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            loaded = tensor.is_floating_point() and local not in owner._non_persistent_buffers_set
            size = tensor.numel() * (dtype.itemsize if loaded else tensor.element_size())
            if layer and local == "qweight":
                found.append((prefix + local, size, True, owner.infeatures * owner.outfeatures * dtype.itemsize))
            else:
                found.append((prefix + local, size, False, 0))
    return found
