"""Every operator of one generation with its work, from the same fake-tensor execution of the call
plan that ``memory`` tracks: per operator its kind (named as ``--trace`` names them), FLOPs (torch.utils.
flop_counter's formulas, attention's fused kernels included) and bytes moved, the bytes of its tensor
inputs read plus its outputs written. Views, allocations and queries (a tensor's device) move nothing and
are left out of the operators, but counted beside them with the module calls: the host issues every one of
them (``CallWork.dispatched``, ``CallWork.modules``), with the chains of fusible operators and the bytes they move
once each is fused (``CallWork.fused_chains``, ``fused_bytes``). The roofline time (``roofline``) is computed from
these figures for any device."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from diffmeter import cache
from diffmeter.errors import DiffmeterError
from diffmeter.families import VAE_DECODER, Call, get_family
from diffmeter.flops.counter import FORMULAS
from diffmeter.flops.kinds import kind_of
from diffmeter.predict.cached import cache_key, cached_memory, cached_work, work_key
from diffmeter.predict.compiled_time import EXTERN_KINDS
from diffmeter.predict.fused_bytes import FusedBytes
from diffmeter.predict.memory import (
    DTYPES,
    fake_module,
    predict_memory,
    predict_tracked,
    settled_plan,
    track_call,
)
from diffmeter.predict.replay import REBUILDING
from diffmeter.predict.schema import CallWork, MemoryPrediction, OperatorGroup, OperatorWork
from diffmeter.predict.vae_decode import VAE_MODES, switch_on
from diffmeter.spec import ProfileSpec
from diffmeter.stages import STAGE_OF_ROLE


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes an operator touches in ``tensor``: its elements, at most its storage (an expanded
    tensor reads its storage once)."""
    return min(tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


#: operators that return tensors without moving data: a view the schema does not mark, allocations
NO_TRAFFIC = {"aten::_unsafe_view", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty"}


def moves_nothing(func, out) -> bool:
    """A view (every output aliases an input without writing it: view, reshape, transpose), an
    allocation, or a query that returns no tensor (``prim::device``, sizes)."""
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return True
    return func._schema.name in NO_TRAFFIC or not any(isinstance(t, torch.Tensor) for t in tree_leaves(out))


def attention_scores(func, args) -> int:
    """The scores a scaled-dot-product attention kernel computes (every aten ``_scaled_dot_product_*`` variant
    takes query (..., L, E) and key (..., S, E) first, native/transformers/attention.cpp): the query's elements
    per head dimension times the keys; 0 for any other operator."""
    if not func._schema.name.startswith("aten::_scaled_dot_product"):
        return 0
    query, key = args[0], args[1]
    return math.prod(query.shape[:-1]) * key.shape[-2]


def operand_dtype(args, call_dtype: torch.dtype | None) -> str | None:
    """The dtype an operator's math runs at, named where it differs from its call's: its first floating input
    (matmuls, convolutions and attention take operands of one dtype), e.g. T5's ``wo`` kept in float32 in a float16
    run (``loading.fp32_module_names``); None at the call's dtype, or at a dtype no peak is stated for."""
    first = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    if first is None or first.dtype == call_dtype:
        return None
    return next((name for name, dtype in DTYPES.items() if dtype == first.dtype), None)


#: the tally's keys for what the host issues beside the operators: operators that move nothing, module calls
NO_TRAFFIC_KEY = ("dispatched without traffic", 0, 0, 0, None)
MODULE_KEY = ("module call", 0, 0, 0, None)
#: and the chains of fusible operators ended by a library kernel (``compiled_time``: a kernel each when compiled)
CHAIN_KEY = ("fusible chain", 0, 0, 0, None)


class OperatorTally(TorchDispatchMode):
    """Counts every operator run inside it: (kind, FLOPs, bytes, attention scores, operand dtype) -> calls; and,
    for the host's share, the operators that move nothing and the ``nn.Module`` calls (``host_counts``).
    ``dtype``: the call's, against which an operator's own dtype is named (``operand_dtype``)."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        self.groups: Counter[tuple[str, int, int, int, str | None]] = Counter()
        self.chained = False  # whether the last operator that moves data was a fusible one (a chain is open)
        self.firsts: list[bool | None] = []  # per block being recorded: whether its first operator is a library one
        self.flow = FusedBytes()  # the bytes the chains move once fused
        self.fused_bytes: int | None = None  # their total, once the call ends
        self.hook = None

    def __enter__(self):
        self.hook = torch.nn.modules.module.register_module_forward_pre_hook(self.count_module)
        return super().__enter__()

    def __exit__(self, *exc):
        self.hook.remove()
        self.fused_bytes = self.flow.finish()  # the call's outputs are still alive here
        return super().__exit__(*exc)

    def count_module(self, module, args) -> None:
        self.groups[MODULE_KEY] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.record(func, args, kwargs, out)
        return out

    def record(self, func, args, kwargs: dict, out) -> None:
        """Count one operator ``func`` run on ``args`` and ``kwargs`` that returned ``out``."""
        if moves_nothing(func, out):
            # a query returning no tensor (``prim::device``) is an attribute read in an eager run, not dispatched;
            # a replayed block's outputs allocated again are the replay's, not the model's
            issued = not REBUILDING.get() and any(isinstance(t, torch.Tensor) for t in tree_leaves(out))
            self.groups[NO_TRAFFIC_KEY] += issued
            if REBUILDING.get() and func._schema.name in NO_TRAFFIC:
                self.flow.allocated(out)
            return
        packet = func._overloadpacket
        flops = int(FORMULAS[packet](*args, **kwargs, out_val=out)) if packet in FORMULAS else 0
        inputs = (args[1],) if packet is torch.ops.aten.embedding else (*tree_leaves((args, kwargs)),)
        moved = {}
        for tensor in (*inputs, *tree_leaves(out)):
            if isinstance(tensor, torch.Tensor):
                moved[id(tensor)] = tensor_bytes(tensor)
        total = sum(moved.values())
        if packet is torch.ops.aten.embedding:  # reads the rows it returns, not the whole table
            total += tensor_bytes(out)
        dtype = operand_dtype(args, self.dtype) if flops else None
        kind = kind_of(func._schema.name)
        self.groups[(kind, flops, total, attention_scores(func, args), dtype)] += 1
        extra = tensor_bytes(out) if packet is torch.ops.aten.embedding else 0
        self.chain_step(kind in EXTERN_KINDS, inputs, out, extra)

    def chain_step(self, library: bool, inputs, out, extra_read: int = 0) -> None:
        """One operator that moves data, a library kernel or a fusible one, in the chains and their fused bytes:
        its tensor ``inputs`` and outputs ``out``; ``extra_read``: bytes it reads beside them (an embedding's rows)."""
        tensors = (
            [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)],
            [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)],
        )
        if library:
            self.flow.library(*tensors)
        else:
            self.flow.fused(*tensors, extra_read=extra_read)
        self.groups[CHAIN_KEY] += library and self.chained  # a library kernel ends the open chain
        self.chained = not library
        if self.firsts and self.firsts[-1] is None:  # the blocks begun since the last operator: this is their first
            self.firsts = [library if first is None else first for first in self.firsts]

    # a replay recorder (``replay.Recorder``): the operators a block ran
    def begin(self) -> tuple[Counter, bool, tuple]:
        self.firsts.append(None)
        return Counter(self.groups), self.chained, self.flow.begin()

    def end(self, begun: tuple[Counter, bool, tuple]) -> tuple[Counter, bool, bool | None, tuple]:
        """The block's operators, whether its first one is a library kernel, whether it ended inside a chain
        (None: it ran none), and its fused bytes (``FusedBytes.end``): a chain the block's first operator ends is
        the context's, counted on replay."""
        counts, entered, flow = begun
        first = self.firsts.pop()
        effect = self.groups - counts
        if first and entered:
            effect[CHAIN_KEY] -= 1
        return effect, bool(first), None if first is None else self.chained, self.flow.end(flow)

    def apply(self, effect: tuple[Counter, bool, bool | None, tuple]) -> None:
        counts, first, chained, flow = effect
        self.groups.update(counts)
        self.groups[CHAIN_KEY] += first and self.chained
        self.chained = self.chained if chained is None else chained
        self.flow.apply(flow)

    def host_counts(self) -> dict[str, int]:
        """What the host issues per call: every dispatched operator (those that move nothing too) and the module
        calls."""
        counts = self.groups
        return {
            "dispatched": sum(counts.values()) - counts[MODULE_KEY] - counts[CHAIN_KEY],
            "modules": counts[MODULE_KEY],
            "fused_chains": counts[CHAIN_KEY] + self.chained,  # and the chain still open at the end
            "fused_bytes": self.fused_bytes,
        }

    def operators(self) -> list[OperatorGroup]:
        counted = [item for item in self.groups.items() if item[0] not in (NO_TRAFFIC_KEY, MODULE_KEY, CHAIN_KEY)]
        in_order = sorted(counted, key=lambda item: (*item[0][:4], item[0][4] or ""))
        return [
            OperatorGroup(kind=kind, flops=flops, bytes=moved, calls=calls, scores=scores, dtype=dtype)
            for (kind, flops, moved, scores, dtype), calls in in_order
        ]


def tally_call(module: torch.nn.Module, call: Call, dtype: torch.dtype) -> OperatorTally:
    """Run ``call`` once on fake tensors and count its operators: repeated blocks, slices and tiles recorded once
    and replayed, as the memory pass runs them (``memory.track_call``; its figures are not needed here)."""
    tally = OperatorTally(dtype)
    track_call(module, call, dtype, on_cuda=False, also=tally)
    return tally


def operator_work(spec: ProfileSpec, decode_modes: tuple[str, ...] = ()) -> OperatorWork:
    """Every operator of one generation at ``spec``: from the disk cache (same configs, settings,
    libraries and diffmeter source) or counted on fake tensors and remembered. ``decode_modes``: the VAE
    decodes as ``vae.enable_tiling()`` / ``enable_slicing()`` make it (overlapping tiles, an image at a
    time), its operators counted as diffusers runs them; the other calls are the plain run's."""
    asked = decode_modes
    found = cached_work(spec, asked)  # stored under the modes asked too: a later lookup needs no torch
    if found is not None:
        return found
    decode_modes = modes_that_change_the_decode(spec, asked)
    found = cached_work(spec, decode_modes)
    if found is None:
        plain = cached_work(spec) if decode_modes else None
        if plain is not None:  # only the decode to count again
            found = _with_decode(plain, _count(spec, decode_modes, decode_only=True))
        else:
            found = _count(spec, decode_modes)
        cache.store("operators", work_key(spec, decode_modes), found.model_dump(mode="json"))
    if asked != decode_modes:
        cache.store("operators", work_key(spec, asked), found.model_dump(mode="json"))
    return found


def modes_that_change_the_decode(spec: ProfileSpec, decode_modes: tuple[str, ...]) -> tuple[str, ...]:
    """``decode_modes`` less slicing where every decode is of one latent: diffusers slices only a batch over one
    (diffusers 0.42.1 autoencoder_kl.py:231, autoencoder_kl_hunyuan_video.py:840), so such a run is counted (and
    cached) once, as the plain decode."""
    if "vae-slicing" not in decode_modes:
        return decode_modes
    entry, _, plan = settled_plan(spec)
    decoder = get_family(entry.family).decoder
    if any(call.role == VAE_DECODER and call.component == decoder and call.batch > 1 for call in plan):
        return decode_modes
    return tuple(mode for mode in decode_modes if mode != "vae-slicing")


def _with_decode(plain: OperatorWork, decoded: OperatorWork) -> OperatorWork:
    """``plain``'s calls with its VAE decode calls replaced by ``decoded``'s, in place."""
    replaced = {(c.stage, c.component) for c in decoded.calls}
    calls: list[CallWork] = []
    done: set[tuple[str, str]] = set()
    for call in plain.calls:
        pair = (call.stage, call.component)
        if pair not in replaced:
            calls.append(call)
        elif pair not in done:
            done.add(pair)
            calls.extend(c for c in decoded.calls if (c.stage, c.component) == pair)
    return OperatorWork(dtype=plain.dtype, calls=calls)


def predict_memory_and_work(
    spec: ProfileSpec, on_cuda: bool = True, vae_modes: tuple[str, ...] = VAE_MODES
) -> tuple[MemoryPrediction, OperatorWork]:
    """``predict_memory`` and ``operator_work`` of ``spec`` from one fake-tensor run of the call plan where
    neither is in the disk cache (the two passes run the same calls on the same modules), each stored."""
    memory, stored = cached_memory(spec, on_cuda, vae_modes), cached_work(spec)
    if stored is not None:
        return memory or predict_memory(spec, on_cuda, vae_modes), stored
    if memory is not None:
        return memory, operator_work(spec)
    _, settled, _ = settled_plan(spec)
    tallies: list[tuple[Call, OperatorTally]] = []

    def watch(call: Call) -> OperatorTally:
        tallies.append((call, OperatorTally(DTYPES[settled.dtype_of(call.component, call.dtype)])))
        return tallies[-1][1]

    memory = predict_tracked(spec, on_cuda, vae_modes, watch)
    calls = [
        CallWork(
            stage=STAGE_OF_ROLE[call.role],
            component=call.component,
            count=call.count,
            operators=tally.operators(),
            dtype=settled.dtype_of(call.component, call.dtype),
            **tally.host_counts(),
        )
        for call, tally in tallies
    ]
    work = OperatorWork(dtype=settled.dtype, calls=calls)
    cache.store("memory", cache_key(spec, on_cuda, vae_modes), memory.model_dump(mode="json"))
    cache.store("operators", work_key(spec), work.model_dump(mode="json"))
    return memory, work


def _count(spec: ProfileSpec, decode_modes: tuple[str, ...] = (), decode_only: bool = False) -> OperatorWork:
    entry, spec, plan = settled_plan(spec)
    decoder = get_family(entry.family).decoder
    modules: dict[tuple[str, torch.dtype], torch.nn.Module] = {}
    calls = []
    for call in plan:
        decodes = call.role == VAE_DECODER and call.component == decoder  # not LTX-2's audio decoder
        if not call.count or (decode_only and not decodes):
            continue
        dtype_name = spec.dtype_of(call.component, call.dtype)  # as the pipeline casts it for the call
        dtype = DTYPES[dtype_name]
        if (call.component, dtype) not in modules:
            modules[call.component, dtype] = fake_module(entry.components[call.component], dtype)
            if decodes:
                switch_on(entry, modules[call.component, dtype], decode_modes)
        if decodes and "vae-slicing" in decode_modes and call.batch > 1:
            call = _one_at_a_time(call)
        try:
            tally = tally_call(modules[call.component, dtype], call, dtype)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise DiffmeterError(
                f"{entry.name}: the operators of its {call.component} cannot be counted on fake tensors: {first}"
            ) from None
        calls.append(
            CallWork(
                stage=STAGE_OF_ROLE[call.role],
                component=call.component,
                count=call.count,
                operators=tally.operators(),
                dtype=dtype_name,
                **tally.host_counts(),
            )
        )
    return OperatorWork(dtype=spec.dtype, calls=calls)


def _one_at_a_time(call: Call) -> Call:
    """A sliced decode as diffusers' VAEs run it (``AutoencoderKL.decode``: ``self._decode(z_slice) for z_slice in
    z.split(1)``, the same in the video VAEs): a batch-1 decode, ``batch`` times, counted once and repeated; the
    concatenation of the slices (one operator, no FLOPs) is left out."""

    def build(device: torch.device) -> dict:
        inputs = call.build(device)
        return {
            name: value[:1]
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == call.batch
            else value
            for name, value in inputs.items()
        }

    return replace(call, batch=1, count=call.count * call.batch, build=build)
