"""Small host tensors a model reads for their values (attention masks it turns into lengths, a boolean token
reorder): made real on the CPU for the FLOPs counter's meta run and the memory prediction's fake run alike, and
moved where the modules that mix them with activations run."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily


def host_values(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A small tensor the model reads for its values (an attention mask it turns into lengths or a token order),
    made by ``make`` as a real CPU tensor: on the meta device (the FLOPs counter) and in the memory prediction's
    fake-tensor run too, which keeps its values (``predict/fake_run.py``)."""
    with unset_fake_temporarily(), torch.device("cpu"):  # not the meta device the FLOPs counter builds under
        return make()


def is_placeholder(tensor: torch.Tensor) -> bool:
    """A tensor without values: on the meta device, or fake without a constant (the memory prediction's run)."""
    return tensor.is_meta or (isinstance(tensor, FakeTensor) and tensor.constant is None)


def to_device_of(module: torch.nn.Module):
    """A forward pre-hook moving a family's host masks (``host_values``) to where ``module``'s parameters are, for
    the modules that mix them with activations: the meta device for the FLOPs counter; in the fake-tensor run
    they are already on the CPU, where they keep their values."""
    device = next(module.parameters()).device

    def hook(module, args, kwargs):
        def move(value):
            return value.to(device) if isinstance(value, torch.Tensor) and value.device.type == "cpu" else value

        return tuple(move(arg) for arg in args), {name: move(value) for name, value in kwargs.items()}

    return hook
