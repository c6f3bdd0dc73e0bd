"""Bytes the context-parallel collectives move: counted at the dispatcher, offline (diffusers' plan
on the meta device over torch's fake process group) or in a real run (one denoiser call).

"Moved" is what one GPU receives from the others: an all-to-all over ``n`` ranks keeps ``1/n``
of its input and receives the rest; an all-gather receives ``n - 1`` times its input; an all-reduce (tensor
parallelism's row-wise layers), run as a ring (a reduce-scatter, then an all-gather), ``2 (n - 1) / n`` times it.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from diffmeter.families import schedule
from diffmeter.runs.parallel_records import Communication

ALL_TO_ALL = "all_to_all_single"
ALL_GATHER = ("all_gather_into_tensor", "allgather_")
ALL_REDUCE = "all_reduce"


def _group_size(name) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name).size()


def _rank_in(name) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return dist.get_rank(_resolve_process_group(name))


def received(func, args) -> tuple[str, int] | None:
    """The collective ``func`` is and the bytes this rank receives in it; None for any other operator."""
    name = func._opname
    if func.namespace == "_c10d_functional" and name == ALL_TO_ALL:
        tensor, output_splits, _, group = args[:4]
        row = tensor.numel() // max(tensor.shape[0], 1) * tensor.element_size()
        if output_splits is None:
            size = _group_size(group)
            got = tensor.shape[0] - tensor.shape[0] // size
        else:
            got = sum(output_splits) - output_splits[_rank_in(group)]
        return name, got * row
    if func.namespace == "_c10d_functional" and name == "all_gather_into_tensor":
        tensor, size = args[0], args[1]
        return name, tensor.numel() * tensor.element_size() * (size - 1)
    if func.namespace == "_c10d_functional" and name == ALL_REDUCE:
        tensor, group = args[0], args[2]
        size = _group_size(group)
        return name, 2 * (size - 1) * tensor.numel() * tensor.element_size() // size
    if func.namespace == "c10d" and name == "allgather_":
        outputs, inputs = args[0], args[1]
        return "all_gather", sum(t.numel() * t.element_size() for t in inputs[0]) * (len(outputs[0]) - 1)
    return None


class CollectiveBytes(TorchDispatchMode):
    """Counts, per collective, the calls and the bytes this rank receives while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        found = received(func, args)
        if found is not None:
            self._add(*found)
        return func(*args, **(kwargs or {}))

    def _add(self, name: str, nbytes: int) -> None:
        self.calls[name] += 1
        self.bytes[name] += nbytes

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def offline(entry, family, profile_spec, ulysses: int, ring: int, cfg: int = 1) -> Communication:
    """Bytes each GPU receives per denoising step: the denoiser built on the meta device, diffusers'
    context parallelism enabled over a fake process group of ``ulysses x ring`` ranks, one call run; with
    CFG parallelism (``cfg`` 2) each GPU runs half of the step's denoiser work and receives the other half's
    noise prediction for the step's images."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from diffmeter.distributed import context_parallel
    from diffmeter.flops.profile import meta_inputs
    from diffmeter.pipelines import build_component

    if dist.is_initialized():
        raise RuntimeError("the offline count needs its own (fake) process group; count it before joining one")
    shapes = family.shapes(entry, profile_spec)
    calls = [c for c in family.plan(shapes) if c.component in family.denoisers(entry)]
    call = calls[0]
    dtype = getattr(torch, profile_spec.dtype)
    model = build_component(entry.components[call.component], "meta").to(dtype)
    inputs = {  # activations at the run's dtype, as the pipeline passes them
        name: value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
        for name, value in meta_inputs(call).items()
    }
    counter = CollectiveBytes()
    with contextlib.ExitStack() as group:
        if ulysses * ring > 1:
            dist.init_process_group("fake", rank=0, world_size=ulysses * ring, store=FakeStore())
            group.callback(dist.destroy_process_group)
            mesh = context_parallel.device_mesh(torch.device("cpu"), 1, 1, ring, ulysses, 1)
            context_parallel.enable(model, mesh, ring, ulysses, torch.device("cpu"))
        if call.prepare:  # what makes the model runnable on meta, as the count runs it (flops.profile.count_call)
            group.callback(call.prepare(model).remove)
        with torch.no_grad(), counter:
            output = model(**inputs)
    prediction = output[0] if isinstance(output, tuple | list) else output
    per_image = prediction.numel() // call.batch * prediction.element_size()
    per_step = sum(c.count for c in calls) / schedule.denoiser_steps(entry, profile_spec)  # the scheduler's steps
    cfg_bytes = (cfg - 1) * profile_spec.batch_size * per_image
    return Communication(
        ulysses_degree=ulysses,
        ring_degree=ring,
        cfg_degree=cfg,
        denoiser_calls_per_step=per_step,
        bytes_per_denoiser_call=counter.total,
        cfg_bytes_per_step=cfg_bytes,
        bytes_per_step=round(counter.total * per_step / cfg) + cfg_bytes,  # each CFG rank runs 1/cfg of the step
        collectives_per_denoiser_call=dict(counter.calls),
    )


def count_first_call(model: torch.nn.Module, store: dict) -> None:
    """Count the bytes of ``model``'s first forward call into ``store["bytes"]`` (and the calls
    per collective into ``store["calls"]``): a warm-up call, so the measured ones run without the mode.

    That call runs eagerly (``torch.compiler.set_stance("force_eager")``): dynamo meeting a frame while a
    dispatch mode is active skips it and marks its code skipped for good (torch/_dynamo/convert_frame.py),
    so a compiled denoiser counted that way would run eager in every later call. Under ``force_eager`` dynamo
    is not entered at all (torch/_dynamo/eval_frame.py, ``_callback_from_stance``) and compiles the next call.
    """
    counter = CollectiveBytes()
    active = contextlib.ExitStack()

    def begin(module, args, kwargs):
        active.enter_context(torch.compiler.set_stance("force_eager"))  # set_stance acts when made
        active.enter_context(counter)

    def end(module, args, kwargs, output):
        active.close()
        store.update(bytes=counter.total, calls=dict(counter.calls))
        for handle in handles:
            handle.remove()

    handles = [
        model.register_forward_pre_hook(begin, with_kwargs=True, prepend=True),
        model.register_forward_hook(end, with_kwargs=True, always_call=True),
    ]


def parallel_spec(profile, ulysses: int, ring: int, cfg: int, optimizations=(), max_sequence_length=None, tp: int = 1):
    """The bench spec of ``profile``'s generation (a ``Profile`` or a settled ``ProfileSpec``) split ``ulysses`` x
    ``ring`` x ``cfg`` x ``tp`` ways: what the parallel layers' checks read."""
    from diffmeter.runs.spec import BenchSpec

    return BenchSpec(
        model=profile.model,
        height=profile.height,
        width=profile.width,
        steps=profile.steps,
        batch_size=profile.batch_size,
        guidance_scale=profile.guidance_scale,
        true_cfg_scale=profile.true_cfg_scale,
        cfg_trunc_ratio=profile.cfg_trunc_ratio,
        num_frames=profile.num_frames,
        dtype=profile.dtype,
        max_sequence_length=max_sequence_length,
        ulysses_degree=ulysses,
        ring_degree=ring,
        cfg_degree=cfg,
        tp_degree=tp,
        optimizations=list(optimizations),
    )


def without_context_parallel(bench, target) -> str:
    """The fix ``profile`` takes for a denoiser diffusers cannot split by context: without the degrees, or its CFG
    batch split (``--cfg-degree 2``) where the run has CFG; ``bench --data-parallel``'s runs are one GPU's each."""
    from diffmeter.runs.parallel_support import guided_mode

    cfg = " (--cfg-degree 2 splits its CFG batch instead)" if guided_mode(bench, target) else ""
    return (
        f"drop --ulysses-degree/--ring-degree{cfg} to predict it here; bench --data-parallel runs a whole generation "
        "per GPU, each as one GPU is predicted"
    )


def per_gpu_step(profile, asked, ulysses: int, ring: int, cfg: int = 1) -> dict:
    """One denoising step on one GPU of a context- and/or CFG-parallel group: its share of the compute (FLOPs) of
    ``profile``, and the bytes it receives in the run ``asked`` (the ``ProfileSpec`` counted, every setting as given:
    the text tokens, the images, the sizes), both offline. Raises DiffmeterError where the split cannot run."""
    from diffmeter.catalog import resolve
    from diffmeter.errors import DiffmeterError
    from diffmeter.families import get_family
    from diffmeter.optimize.base import Target
    from diffmeter.runs.parallel_support import check_cfg_parallel, check_context_parallel

    if ring > 1:
        raise DiffmeterError(
            "the offline count runs the denoiser's attention on the meta device, and ring attention needs a backend "
            "returning the log-sum-exp (flash, sage) that does not run there: count --ulysses-degree only, or add "
            "--gpu NAME --opt attention:backend=flash (each GPU's share, ring through PyTorch's flash kernel on fake "
            "tensors)"
        )
    entry = resolve(profile.model)
    family = get_family(entry.family)
    settled = asked.with_defaults(entry.defaults)
    spec = parallel_spec(settled, ulysses, 1, cfg, max_sequence_length=settled.max_sequence_length)
    target = Target(entry, family, torch.device("cpu"), profile.dtype, profile.steps)
    if ulysses > 1:
        check_context_parallel(spec, target, instead=without_context_parallel(spec, target))
    if cfg > 1:
        check_cfg_parallel(spec, target)
    moved = offline(entry, family, settled, ulysses, ring, cfg)
    return {
        "ulysses_degree": ulysses,
        "ring_degree": ring,
        "cfg_degree": cfg,
        "flops_per_step": 2 * profile.denoiser_macs_per_step,
        "flops_per_step_per_gpu": 2 * profile.denoiser_macs_per_step // (ulysses * ring * cfg),
        "bytes_received_per_step_per_gpu": moved.bytes_per_step,
        "cfg_bytes_per_step": moved.cfg_bytes_per_step,
        "collectives_per_denoiser_call": moved.collectives_per_denoiser_call,
        "denoiser_calls_per_step": moved.denoiser_calls_per_step,
    }
