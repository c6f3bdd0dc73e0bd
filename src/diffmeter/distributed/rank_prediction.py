"""What one GPU of a context- and/or CFG-parallel group runs in each denoiser call, counted offline: the denoiser
on fake tensors with diffusers' own context parallelism (``context_parallel.enable``) and diffmeter's CFG layer
(``cfg_parallel``) applied over a fake process group, run once under the memory tracker and operator tally
the single-GPU prediction uses (``predict.memory.track_call``). The rank's activations are then what diffusers
0.42.1 allocates there: its sequence shard (``hooks/context_parallel.py:217``, ``ContextParallelSplitHook``), Ulysses'
all-to-all buffers (Q, K, V regrouped by heads over the whole sequence and the output back,
``models/attention_dispatch.py:2570,2597``), ring's gathered K/V (``attention_dispatch.py:2416``: every ring rank's K
and V, ``all_gather_tensor``), both for Ulysses x ring (``_templated_unified_attention``, line 2847), and the output
gathered back (``hooks/context_parallel.py:261``, ``ContextParallelGatherHook``). Weights are every rank's whole."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist

from diffmeter.distributed import context_parallel
from diffmeter.distributed.cfg_parallel import BATCHED, CfgParallel
from diffmeter.distributed.communication import parallel_spec, received
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.optimization_spec import OptimizationSpec
from diffmeter.predict.memory import DTYPES, fake_module, settled_plan, track_call
from diffmeter.predict.operators import OperatorTally
from diffmeter.predict.parallel import RankCall
from diffmeter.spec import ProfileSpec

#: the attention ring runs with in the prediction: ring attention merges partial results with the log-sum-exp,
#: which diffusers' default (native SDPA) cannot return; PyTorch's flash kernel can, and runs on fake tensors
RING_BACKEND = "_native_flash"
#: the operators of a collective (and its wait): timed as communication, not as the GPU's work
COLLECTIVES = ("_c10d_functional", "c10d")


class RankTally(OperatorTally):
    """The operator tally with collectives kept apart: the bytes this rank receives in each, under keys the
    replay of repeated blocks replays with the rest (``collective_counts``); ``operators`` leaves them out."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in COLLECTIVES:
            return super().__torch_dispatch__(func, types, args, kwargs)
        found = received(func, args)
        self.groups[(f"collective {found[0] if found else func._opname}", 0, found[1] if found else 0, 0, None)] += 1
        return func(*args, **(kwargs or {}))

    def operators(self):
        return [group for group in super().operators() if not group.kind.startswith("collective ")]

    def collective_counts(self) -> tuple[dict[str, int], int]:
        """Calls per collective (their waits left out) and the bytes received in all of them."""
        calls: Counter[str] = Counter()
        moved = 0
        for (kind, _, nbytes, _, _), count in self.groups.items():
            if kind.startswith("collective ") and kind != "collective wait_tensor":
                calls[kind.removeprefix("collective ")] += count
                moved += nbytes * count
        return dict(calls), moved


def check(spec: ProfileSpec, ulysses: int, ring: int, cfg: int) -> str | None:
    """Refuse a split diffusers (or the CFG layer) refuses, in its words; the CFG mode ("batched" or "separate")."""
    from diffmeter.optimize.base import Target
    from diffmeter.runs.parallel_support import check_cfg_parallel, check_context_parallel, guided_mode

    entry, settled, _ = settled_plan(spec)
    family = get_family(entry.family)
    attention = [OptimizationSpec(name="attention", params={"backend": RING_BACKEND})] if ring > 1 else []
    bench = parallel_spec(settled, ulysses, ring, cfg, attention, settled.max_sequence_length)
    target = Target(entry, family, torch.device("cuda"), settled.dtype, settled.steps)
    if ulysses * ring > 1:
        check_context_parallel(bench, target)
    if cfg > 1:
        check_cfg_parallel(bench, target)
        return guided_mode(bench, target)
    return None


def rank_calls(spec: ProfileSpec, ulysses: int, ring: int, cfg: int, on_cuda: bool = True) -> tuple[list, int]:
    """Each denoiser call of ``spec``'s plan as one rank runs it (``RankCall``, in plan order), and the bytes a rank
    receives outside them (separate CFG calls: the other rank's prediction, once per pair). Raises DiffmeterError
    where the split cannot run."""
    mode = check(spec, ulysses, ring, cfg)
    if dist.is_initialized():
        raise RuntimeError("the rank's count needs its own (fake) process group; count it before joining one")
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry as AttentionRegistry
    from torch.testing._internal.distributed.fake_pg import FakeStore

    entry, settled, plan = settled_plan(spec)
    family = get_family(entry.family)
    denoisers = family.denoisers(entry)
    found, extra = [], 0
    with contextlib.ExitStack() as group:
        # set_attention_backend also sets diffusers' process-wide active backend (modeling_utils.py:668, diffusers
        # 0.42.1), which every model without its own then dispatches to: put it back
        group.callback(AttentionRegistry.set_active_backend, AttentionRegistry._active_backend)
        dist.init_process_group("fake", rank=0, world_size=ulysses * ring * cfg, store=FakeStore())
        group.callback(dist.destroy_process_group)
        mesh = context_parallel.device_mesh(torch.device("cpu"), 1, cfg, ring, ulysses, 1)
        layer = CfgParallel(mesh["cfg"].get_group(), mode) if mode == BATCHED else None
        for call in plan:
            if not call.count or call.component not in denoisers:
                continue
            dtype = DTYPES[settled.dtype_of(call.component, call.dtype)]
            model = fake_module(entry.components[call.component], dtype)
            if ring > 1:
                model.set_attention_backend(RING_BACKEND)
            if ulysses * ring > 1:
                context_parallel.enable(model, mesh, ring, ulysses, torch.device("cpu"))
            if layer is not None:
                layer.wrap(model)
            tally = RankTally(dtype)
            try:
                memory = track_call(model, call, dtype, on_cuda, also=tally)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise DiffmeterError(
                    f"{entry.name}: one GPU's share of its {call.component} cannot be run on fake tensors: {first}"
                ) from None
            collectives, moved = tally.collective_counts()
            count = call.count // 2 if mode not in (None, BATCHED) else call.count  # separate: a call of each pair
            extra += memory.output_bytes * count if mode not in (None, BATCHED) else 0
            found.append(
                RankCall(
                    activation_bytes=memory.activation_bytes,
                    operators=tally.operators(),
                    count=count,
                    received_bytes=moved,
                    collectives=collectives,
                    **tally.host_counts(),
                )
            )
    return found, extra
