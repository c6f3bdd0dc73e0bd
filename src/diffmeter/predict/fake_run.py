"""The fake-tensor run the memory tracker and the operator tally share: ``FakeTensorMode`` (shapes, dtypes,
devices, no data), where the small integer and boolean tensors a model reads for their values (attention
masks it turns into sequence lengths, token reorderings) keep their values.

On the meta device (the FLOPs counter) a family hands such masks to the model as real CPU tensors
(``families.host_masks.host_values``). Under ``FakeTensorMode`` a real tensor would become a fake one without values,
and ``.tolist()`` or a boolean selection on it would fail. Here a real integer or boolean CPU tensor reaching
an operator becomes a *constant* fake tensor instead (FakeTensorConverter's ``make_constant``), and
FakeTensorMode computes an operator whose tensor inputs are all constants for real, keeping its outputs as
constants up to ``CONSTANT_NUMEL_LIMIT`` elements (torch/_subclasses/fake_tensor.py, ``_dispatch_impl``, the
"all_constant" branch, lines 2703-2744 in torch 2.13; the limit, 1 element by default, is line 85). The limit is
raised to ``HOST_VALUES_LIMIT`` for the run: masks of a few thousand tokens are computed for real, every other
tensor stays without data, and a constant's ``tolist()`` reads it at once. Memory and operators are counted alike for
constants and plain fake tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch._subclasses.fake_tensor as fake_tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

#: the most elements an operator's output computed on constants keeps as a constant (masks, token positions)
HOST_VALUES_LIMIT = 1 << 20


class HostValues(TorchDispatchMode):
    """Entered inside ``mode``: a real integer or boolean CPU tensor reaching an operator becomes a constant fake
    tensor holding its values (one per tensor, kept for the run)."""

    def __init__(self, mode: FakeTensorMode) -> None:
        super().__init__()
        self.mode = mode
        self.made: dict[int, tuple[torch.Tensor, FakeTensor]] = {}  # holding the real tensor: ids are not reused

    def constant(self, tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, FakeTensor) or tensor.is_floating_point() or tensor.device.type != "cpu":
            return tensor
        if id(tensor) not in self.made:
            made = self.mode.fake_tensor_converter.from_real_tensor(self.mode, tensor, make_constant=True)
            self.made[id(tensor)] = (tensor, made)
        return self.made[id(tensor)][1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.scalar_tensor.default:  # a Python number beside a mask: torch.where(mask, 4, 1)
            with unset_fake_temporarily():
                number = func(*args, **(kwargs or {}))
            return self.mode.fake_tensor_converter.from_real_tensor(self.mode, number, make_constant=True)
        args, kwargs = tree_map_only(torch.Tensor, self.constant, (args, kwargs or {}))
        return func(*args, **kwargs)


def constant_tolist(original):
    """``FakeTensor.tolist`` reading a constant at once: FakeTensor's own (a Python method, torch/_subclasses/
    fake_tensor.py line 1227, so no mode sees it) reads each element through every mode: 13 s for 4,600 tokens."""

    def tolist(self):
        return self.constant.tolist() if self.constant is not None else original(self)

    return tolist


@contextmanager
def fake_run(reads_values: bool = False) -> Iterator[FakeTensorMode]:
    """A fake-tensor run without gradients; ``reads_values`` (``Call.reads_values``): host masks keep their values
    (see the module docstring). Only where asked: constants are tracked as fresh storages, views of them too,
    a few bytes off where nothing needed them."""
    if not reads_values:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
            yield mode
        return
    limit, fake_tensor.CONSTANT_NUMEL_LIMIT = fake_tensor.CONSTANT_NUMEL_LIMIT, HOST_VALUES_LIMIT
    tolist = FakeTensor.tolist
    FakeTensor.tolist = constant_tolist(tolist)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad(), HostValues(mode):
            yield mode
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT, FakeTensor.tolist = limit, tolist
