"""What one GPU of a context-, tensor- and/or CFG-parallel group runs in each denoiser call, counted offline: the
denoiser on fake tensors with diffusers' own context parallelism (``context_parallel.enable``) and diffmeter's CFG layer
(``cfg_parallel``) applied over a fake process group, run once under the memory tracker and operator tally
the single-GPU prediction uses (``predict.memory.track_call``). The rank's activations are then what diffusers
0.42.1 allocates there: its sequence shard (``hooks/context_parallel.py:217``, ``ContextParallelSplitHook``), Ulysses'
all-to-all buffers (Q, K, V regrouped by heads over the whole sequence and the output back,
``models/attention_dispatch.py:2570,2597``), ring's gathered K/V (``attention_dispatch.py:2416``: every ring rank's K
and V, ``all_gather_tensor``), both for Ulysses x ring (``_templated_unified_attention``, line 2847), and the output
gathered back (``hooks/context_parallel.py:261``, ``ContextParallelGatherHook``). Weights are every rank's whole,
except under tensor parallelism: diffusers' ``_tp_plan`` shards the planned Linear layers (column-wise: Q, K, V and
the MLP's input; row-wise: the output projections, their bias whole), each rank runs its heads and its share of the
MLP's width, and torch's ``RowwiseParallel`` all-reduces each row-wise layer's output (``hooks/tensor_parallel.py``,
``apply_tensor_parallel``); norms, modulation and embeddings stay whole on every rank."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from diffmeter.distributed import context_parallel
from diffmeter.distributed.cfg_parallel import BATCHED, CfgParallel
from diffmeter.distributed.communication import parallel_spec, received, without_context_parallel
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
    replay of repeated blocks replays with the rest (``collectives_received``); ``operators`` leaves them out. A
    collective ends the open chain of fusible operators and reads what it sends from memory, as a library kernel
    does: inductor lowers each to an extern kernel of its own (torch 2.13 torch/_inductor/comm_lowering.py,
    ``ir._CollectiveKernel``), which no generated kernel fuses."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if DTensor in types:  # a sharded layer's operator: counted on the rank's own shards, as it runs there
            out = func(*args, **(kwargs or {}))
            self.record(func, *tree_map(local, (args, kwargs or {})), tree_map(local, out))
            return out
        if func.namespace not in COLLECTIVES:
            return super().__torch_dispatch__(func, types, args, kwargs)
        found = received(func, args)
        self.groups[(f"collective {found[0] if found else func._opname}", 0, found[1] if found else 0, 0, None)] += 1
        out = func(*args, **(kwargs or {}))
        self.chain_step(True, (args, kwargs or {}), out)  # a library kernel to inductor (comm_lowering.py)
        return out

    def operators(self):
        return [group for group in super().operators() if not group.kind.startswith("collective ")]

    def collectives_received(self) -> tuple[dict[str, int], dict[str, int]]:
        """Calls per collective (their waits left out) and the bytes received in each kind."""
        calls: Counter[str] = Counter()
        moved: Counter[str] = Counter()
        for (kind, _, nbytes, _, _), count in self.groups.items():
            if kind.startswith("collective ") and kind != "collective wait_tensor":
                calls[kind.removeprefix("collective ")] += count
                moved[kind.removeprefix("collective ")] += nbytes * count
        return dict(calls), dict(moved)


def local(value):
    """A DTensor's own shard on this rank; anything else as it is."""
    return value.to_local() if isinstance(value, DTensor) else value


def held_bytes(model: torch.nn.Module) -> int:
    """The parameters (a sharded one's local shard) and buffers of ``model`` this rank holds."""
    return context_parallel.resident_parameter_bytes([model]) + sum(buffer.nbytes for buffer in model.buffers())


def check(
    spec: ProfileSpec, ulysses: int, ring: int, cfg: int, tp: int = 1, attention: list[OptimizationSpec] | None = None
) -> str | None:
    """Refuse a split diffusers (or the CFG layer) refuses, in its words; the CFG mode ("batched" or "separate").
    ``attention``: the run's ``attention`` optimizations, checked as bench checks them (``profile --gpu``: ring
    attention on native SDPA refused); None: a run bench already checked, its ring on ``RING_BACKEND``."""
    from diffmeter.optimize.base import Target
    from diffmeter.runs.parallel_support import (
        check_cfg_parallel,
        check_context_parallel,
        check_tensor_parallel,
        guided_mode,
    )

    entry, settled, _ = settled_plan(spec)
    family = get_family(entry.family)
    if attention is None:
        attention = [OptimizationSpec(name="attention", params={"backend": RING_BACKEND})] if ring > 1 else []
    bench = parallel_spec(settled, ulysses, ring, cfg, attention, settled.max_sequence_length, tp=tp)
    target = Target(entry, family, torch.device("cuda"), settled.dtype, settled.steps)
    if ulysses * ring > 1 and tp > 1:
        raise DiffmeterError(
            "diffusers applies context parallelism or tensor parallelism to a model, not both (ParallelConfig refuses "
            "the pair): pick --ulysses-degree/--ring-degree or --tp-degree"
        )
    if ulysses * ring > 1:
        check_context_parallel(bench, target, instead=without_context_parallel(bench, target))
    if tp > 1:
        check_tensor_parallel(bench, target)
    if cfg > 1:
        check_cfg_parallel(bench, target)
        return guided_mode(bench, target)
    return None


def rank_calls(
    spec: ProfileSpec, ulysses: int, ring: int, cfg: int, tp: int = 1, on_cuda: bool = True
) -> tuple[list, int]:
    """Each denoiser call of ``spec``'s plan as one rank runs it (``RankCall``, in plan order), and the bytes a rank
    receives outside them (separate CFG calls: the other rank's prediction, once per pair). Under tensor parallelism
    (``tp``) the rank holds its shard of the denoiser (``RankCall.param_bytes``) and all-reduces each row-wise layer's
    output. Raises DiffmeterError where the split cannot run."""
    mode = check(spec, ulysses, ring, cfg, tp)
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
        dist.init_process_group("fake", rank=0, world_size=ulysses * ring * cfg * tp, store=FakeStore())
        group.callback(dist.destroy_process_group)
        mesh = context_parallel.device_mesh(torch.device("cpu"), 1, cfg, ring, ulysses, tp)
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
            if tp > 1:
                context_parallel.shard_counted(model, mesh)
            if layer is not None:
                layer.wrap(model)
            tally = RankTally(dtype)
            try:
                if tp > 1:  # a sharded model's first fake run holds tensors live that later runs do not (80,000 B
                    # on tiny FLUX; not identified; not DTensor's propagation caches), and a real rank's first call
                    # does not: counted from a second run, which a gloo rank's measured peaks match (tests)
                    track_call(model, call, dtype, on_cuda, also=RankTally(dtype))
                memory = track_call(model, call, dtype, on_cuda, also=tally)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise DiffmeterError(
                    f"{entry.name}: one GPU's share of its {call.component} cannot be run on fake tensors: {first}"
                ) from None
            collectives, by_kind = tally.collectives_received()
            count = call.count // 2 if mode not in (None, BATCHED) else call.count  # separate: a call of each pair
            extra += memory.output_bytes * count if mode not in (None, BATCHED) else 0
            found.append(
                RankCall(
                    activation_bytes=memory.activation_bytes,
                    layer_levels=memory.layer_levels,
                    operators=tally.operators(),
                    count=count,
                    received_bytes=sum(by_kind.values()),
                    collectives=collectives,
                    received_by_collective=by_kind,
                    param_bytes=held_bytes(model) if tp > 1 else None,
                    batch=call.batch // cfg if mode == BATCHED else call.batch,  # CfgParallel splits the batch
                    **tally.host_counts(),
                )
            )
    return found, extra
