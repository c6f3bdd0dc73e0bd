"""What a loaded pipeline's weights occupy as stored: the bytes of the storages behind each component's parameters
and buffers after loading and applying the techniques, a quantized tensor's inner tensors counted, wherever they sit
(the device, or the CPU under offload)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors holding ``tensor``'s data: itself, or a wrapper subclass's inner tensors (torchao's
    quantized weights: the int8 or float8 data and its scales), which own the storages; a DTensor's own shard (its
    flattened names also hold its device mesh, not a tensor)."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        inner = [getattr(tensor, name) for name in names]
        return [plain for part in inner if isinstance(part, torch.Tensor) for plain in plain_tensors(part)]
    return [tensor]


def storages_bytes(modules: list[torch.nn.Module]) -> int:
    """Bytes of the distinct storages behind the modules' parameters and buffers: what the loaded weights occupy."""
    seen = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            for plain in plain_tensors(tensor):
                storage = plain.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def component_weights_bytes(pipe) -> dict[str, int]:
    """Each of the pipeline's model components (``pipe.components``' modules) as stored."""
    return {name: storages_bytes([m]) for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
