"""The fake CUDA device's dispatch mode: devices checked per operator, fake tensors' values kept where known."""

from __future__ import annotations

import torch

#: what ``.item()`` answers for a number (booleans answer True)
MADE_UP_SCALAR = 1
#: elements up to which a fake tensor also carries its real value (computed on the CPU beside it)
SHADOW_LIMIT = 1 << 27


def dispatch_checker(cuda, mode):
    """The dispatch mode above FakeTensorMode (``mode``), for ``cuda`` (a FakeCuda). Operators touching neither a
    fake tensor nor CUDA run for real on the CPU (weights' initialization, the scheduler's tables, CPU generators'
    noise). The others have their devices checked and run on fake tensors; a small fake tensor (``SHADOW_LIMIT``
    elements) whose inputs all have values also gets its real value, computed on the CPU beside it (its shadow),
    so that ``.item()``, ``nonzero``, masks and timestep lookups read what a real run reads. Reads of a fake
    tensor without a shadow get the made-up answers."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
    from torch.utils._mode_utils import no_dispatch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten
    from torch.utils.weak import WeakIdKeyDictionary

    shadows = cuda.shadows = WeakIdKeyDictionary()

    def value(t):
        return shadows.get(t) if isinstance(t, FakeTensor) else t

    def real(func, args, kwargs):
        """``func`` on the inputs' values on the CPU, or None when one has none (or it fails there)."""
        leaves, spec = tree_flatten((args, kwargs))
        values = [value(v) if isinstance(v, torch.Tensor) else v for v in leaves]
        if any(v is None and isinstance(leaf, torch.Tensor) for v, leaf in zip(values, leaves, strict=True)):
            return None
        args, kwargs = tree_unflatten(values, spec)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        try:
            with no_dispatch():
                return func(*args, **kwargs)
        except Exception:
            return None

    def faked(result, device):
        """A fake tensor on ``device`` per real one in ``result``, each with that value as its shadow."""

        def one(r):
            fake = torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=device)
            shadows[fake] = r
            return fake

        return tree_map_only(torch.Tensor, one, result)

    def fake(t):
        """A real CPU tensor as a fake one that keeps it as its value."""
        converted = mode.from_tensor(t, static_shapes=True)
        if t.numel() <= SHADOW_LIMIT:
            shadows[converted] = t
        return converted

    def nonzero(t):
        found = value(t)
        if found is not None:
            with no_dispatch():
                indices = torch.nonzero(found)
            return faked(indices, t.device)
        return _all_nonzero(t)

    def long_indices(indices):
        """Boolean masks in an index replaced by the long indices of their elements taken."""
        replaced = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                found = value(index)
                if found is None:
                    replaced += list(_all_nonzero(index).unbind(1))
                    continue
                with no_dispatch():
                    columns = [column.contiguous() for column in torch.nonzero(found).unbind(1)]
                replaced += [faked(column, index.device) for column in columns]
            else:
                replaced.append(index)
        return replaced

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func)
            tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
            device = torch.device(kwargs.get("device") or "cpu")
            if not any(isinstance(t, FakeTensor) for t in tensors) and device.type != "cuda":
                with no_dispatch():
                    return func(*args, **kwargs)
            cuda.check_tensors(name, tensors)
            # real inputs of a CUDA operator become fake first: the fake mode would run it for real
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: t if isinstance(t, FakeTensor) else fake(t), (args, kwargs)
            )
            if name in READS:
                found = [value(t) for t in tensors]
                if all(v is not None for v in found):
                    with no_dispatch():
                        return func(*found)
                return READS[name](args[0])
            if name == "aten.nonzero.default":
                return nonzero(args[0])
            if name in ("aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default"):
                args = (args[0], long_indices(args[1]), *args[2:])
            try:
                out = func(*args, **kwargs)
            except (DynamicOutputShapeException, DataDependentOutputException):
                result = real(func, args, kwargs)
                if result is None:
                    raise
                return faked(result, next(t.device for t in tensors if isinstance(t, FakeTensor)))
            outputs = [leaf for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)]
            cuda.check_tensors(name, outputs)
            result = real(func, args, kwargs) if sum(t.numel() for t in outputs) <= SHADOW_LIMIT else None
            if result is not None:
                for output, found in zip(outputs, tree_leaves(result), strict=False):
                    shadows[output] = found
            elif func._schema.is_mutable:  # a value it changed is no longer known
                for t in tensors:
                    shadows.pop(t, None)
            return out

    return Mode()


def _all_nonzero(tensor: torch.Tensor) -> torch.Tensor:
    """``nonzero`` of a tensor whose values are unknown, as if every element were nonzero."""
    grid = torch.meshgrid(*(torch.arange(n, device=tensor.device) for n in tensor.shape), indexing="ij")
    if not grid:
        return torch.zeros((1, 0), dtype=torch.long, device=tensor.device)
    return torch.stack([axis.reshape(-1) for axis in grid], dim=1)


#: reads of one value, answered from the shadow, else made up (``MADE_UP_SCALAR``; True for a boolean)
READS = {
    "aten._local_scalar_dense.default": lambda t: (
        True if t.dtype == torch.bool else (float(MADE_UP_SCALAR) if t.dtype.is_floating_point else MADE_UP_SCALAR)
    ),
    "aten.equal.default": lambda t: True,
    "aten.is_nonzero.default": lambda t: True,
}
