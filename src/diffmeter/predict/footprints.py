"""Parameter bytes of a component (on meta) as each memory technique stores it; see ``techniques``."""

from __future__ import annotations

import torch

from diffmeter.catalog import ComponentEntry
from diffmeter.loading import cast_as_loaded, default_dtype
from diffmeter.pipelines import FP8_SKIP_MODULES_PATTERN, build_component
from diffmeter.quiet import quiet_libraries

#: torchao weight-only layouts per nn.Linear (Int8Tensor: int8 data, float32 scale and int8 zero point per
#: output row; Float8Tensor: float8 data, float32 scale per row), held to torchao by the tests
_ROW_BYTES = {"int8": 4 + 1, "fp8": 4}
#: the dtype fp8-text-encoder stores its layers in (optimize/fp8_text_encoder.py's default)
FP8_STORAGE = torch.float8_e4m3fn


def meta_module(component: ComponentEntry, dtype: torch.dtype) -> torch.nn.Module:
    """The component on meta at ``dtype`` as bench loads it (``loading.cast_as_loaded``): built under ``dtype``,
    stored tensors cast, non-persistent buffers as the class made them, float32 modules kept."""
    with quiet_libraries(), default_dtype(dtype):  # diffusers' advice to load with torch_dtype: this is loading
        module = build_component(component, "meta")
    cast_as_loaded(module, dtype)
    return module


def tensor_bytes(tensors) -> int:
    """Bytes of distinct tensors (tied weights once), meta included."""
    unique = {id(tensor): tensor for tensor in tensors}
    return sum(tensor.numel() * tensor.element_size() for tensor in unique.values())


def stored_bytes(module: torch.nn.Module) -> int:
    return tensor_bytes([*module.parameters(), *module.buffers()])


def largest_layer_bytes(module: torch.nn.Module) -> int:
    """The most parameter and buffer bytes any single module holds itself (not its children's)."""
    return max(
        (tensor_bytes([*m.parameters(recurse=False), *m.buffers(recurse=False)]) for m in module.modules()),
        default=0,
    )


def weight_read_bytes(module: torch.nn.Module) -> int:
    """What one call must read of the component's weights at least: its parameters and buffers, embedding
    tables left out (a lookup reads only the rows it returns)."""
    tables = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    return tensor_bytes([t for t in (*module.parameters(), *module.buffers()) if id(t) not in tables])


def quantized_bytes(module: torch.nn.Module, kind: str) -> int:
    """Parameters and buffers with every nn.Linear weight stored as torchao's weight-only ``kind``."""
    linears = {id(m.weight): m.weight for m in module.modules() if isinstance(m, torch.nn.Linear)}
    full = tensor_bytes(linears.values())
    quantized = sum(weight.numel() + weight.shape[0] * _ROW_BYTES[kind] for weight in linears.values())
    return stored_bytes(module) - full + quantized


def fp8_stored(component: ComponentEntry, dtype: torch.dtype) -> torch.nn.Module:
    """The component on meta after diffusers' ``apply_layerwise_casting`` to float8 (``FP8_STORAGE``) with
    fp8-text-encoder's skip patterns, computing at ``dtype``: its hooked layers' parameters are float8."""
    from diffusers.hooks import apply_layerwise_casting

    module = meta_module(component, dtype)
    apply_layerwise_casting(
        module, storage_dtype=FP8_STORAGE, compute_dtype=dtype, skip_modules_pattern=FP8_SKIP_MODULES_PATTERN
    )
    return module


def fp8_storage_bytes(component: ComponentEntry, dtype: torch.dtype) -> int:
    """Parameters after diffusers' ``apply_layerwise_casting`` to float8 (``fp8_stored``)."""
    return stored_bytes(fp8_stored(component, dtype))
