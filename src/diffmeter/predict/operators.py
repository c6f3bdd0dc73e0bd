"""Every operator of one generation with its work, from the same fake-tensor execution of the call
plan that ``memory`` tracks: per operator its kind (named as ``--trace`` names them), FLOPs (torch.utils.
flop_counter's formulas, attention's fused kernels included) and bytes moved, the bytes of its tensor
inputs read plus its outputs written. Views move nothing and are left out. The roofline time
(``roofline``) is computed from these figures for any device."""

from __future__ import annotations

from collections import Counter

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from diffmeter import cache
from diffmeter.errors import DiffmeterError
from diffmeter.families import DENOISER, TEXT_ENCODER, VAE_DECODER, Call
from diffmeter.flops.counter import FORMULAS
from diffmeter.measure.trace import kind_of
from diffmeter.predict.memory import DTYPES, cache_key, cast_floating, fake_module, settled_plan
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork
from diffmeter.spec import ProfileSpec

#: the stage a component's calls are timed in, as ``bench`` names its stages
STAGE_KEY = {TEXT_ENCODER: "text_encoding", DENOISER: "denoising", VAE_DECODER: "vae_decode"}


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes an operator touches in ``tensor``: its elements, at most its storage (an expanded
    tensor reads its storage once)."""
    return min(tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


def is_view(func) -> bool:
    """An operator whose every output aliases an input without writing it (view, reshape, transpose)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


class OperatorTally(TorchDispatchMode):
    """Counts every operator run inside it: (kind, FLOPs, bytes) -> calls."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: Counter[tuple[str, int, int]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_view(func):
            return out
        packet = func._overloadpacket
        flops = int(FORMULAS[packet](*args, **kwargs, out_val=out)) if packet in FORMULAS else 0
        moved = {}
        for tensor in (*tree_leaves((args, kwargs)), *tree_leaves(out)):
            if isinstance(tensor, torch.Tensor):
                moved[id(tensor)] = tensor_bytes(tensor)
        self.groups[(kind_of(func._schema.name), flops, sum(moved.values()))] += 1
        return out


def tally_call(module: torch.nn.Module, call: Call, dtype: torch.dtype) -> list[OperatorGroup]:
    """Run ``call`` once on fake tensors and count its operators."""
    handle = call.prepare(module) if call.prepare else None
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            with torch.device("cpu"):
                inputs = cast_floating(call.build(torch.device("cpu")), dtype)
            with OperatorTally() as tally:
                getattr(module, call.method)(**inputs)
    finally:
        if handle is not None:
            handle.remove()
    return [
        OperatorGroup(kind=kind, flops=flops, bytes=moved, calls=calls)
        for (kind, flops, moved), calls in sorted(tally.groups.items())
    ]


def operator_work(spec: ProfileSpec) -> OperatorWork:
    """Every operator of one generation at ``spec``: from the disk cache (same configs, settings,
    libraries and diffmeter source) or counted on fake tensors and remembered."""
    stored = cache.load("operators", cache_key(spec))
    if stored is not None:
        return OperatorWork.model_validate(stored)
    found = _count(spec)
    cache.store("operators", cache_key(spec), found.model_dump(mode="json"))
    return found


def _count(spec: ProfileSpec) -> OperatorWork:
    entry, spec, plan = settled_plan(spec)
    dtype = DTYPES[spec.dtype]
    modules: dict[str, torch.nn.Module] = {}
    calls = []
    for call in plan:
        if not call.count:
            continue
        if call.component not in modules:
            modules[call.component] = fake_module(entry.components[call.component], dtype)
        try:
            operators = tally_call(modules[call.component], call, dtype)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise DiffmeterError(
                f"{entry.name}: the operators of its {call.component} cannot be counted on fake tensors: {first}"
            ) from None
        calls.append(
            CallWork(stage=STAGE_KEY[call.role], component=call.component, count=call.count, operators=operators)
        )
    return OperatorWork(dtype=spec.dtype, calls=calls)
