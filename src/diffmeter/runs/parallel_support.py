"""Whether a parallel run can happen, decided before any weight loads, each refusal with its reason."""

from __future__ import annotations

import inspect
import os
import re

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families import schedule
from diffmeter.flops.profile import meta_inputs
from diffmeter.pipelines import build_component


class _Seen(Exception):
    """Raised by the shape probe once every split input has been seen: the rest of the forward is not needed."""


#: the most CPU ranks a usable core takes
PER_CORE = 2


def check(spec, target, optimizations, here: bool = True) -> None:
    """Refuse a parallel ``spec`` (settled) that cannot run on ``target`` with ``optimizations``;
    the GPUs are counted only ``here`` (not for a run planned for another machine)."""
    check_engine(spec.engine, target.device)
    if spec.pipefusion_degree > 1:
        raise DiffmeterError(
            "--pipefusion-degree: PipeFusion (xDiT's patch pipeline parallelism) runs on xDiT's own patched models "
            "and stale-activation buffers, which diffusers does not have and diffmeter does not reimplement; run it "
            "with xDiT, or split with --ulysses-degree, --ring-degree, --cfg-degree or --data-parallel"
        )
    if spec.world_size == 1:
        return
    if spec.target_precision is not None:
        raise DiffmeterError(
            "--target-precision stops each process on its own timings; parallel ranks must make the same calls: "
            "use --iterations"
        )
    if spec.min_duration_s:
        raise DiffmeterError(
            "--min-duration stops each process on its own clock; parallel ranks must make the same calls: "
            "use --iterations"
        )
    if spec.compare_baseline:
        raise DiffmeterError(
            "--compare-baseline is not supported for parallel runs yet: run the baseline apart and compare with "
            "`diffmeter show`"
        )
    if any(o.places_pipeline for o in optimizations):
        raise DiffmeterError(
            "offloading moves the denoiser between devices; a parallel run keeps each rank's on its own GPU (diffusers "
            "refuses offloaded models for tensor parallelism too): drop the offload or the parallelism"
        )
    if target.device.type == "cuda":
        if target.device.index:
            raise DiffmeterError(
                f"--device {target.device}: a parallel run uses GPUs 0 to {spec.world_size - 1}, one per process; "
                "choose the GPUs with CUDA_VISIBLE_DEVICES and pass --device cuda"
            )
        visible = torch.cuda.device_count()
        if here and spec.world_size > visible:
            raise DiffmeterError(
                f"{spec.world_size} processes (ulysses {spec.ulysses_degree} x ring {spec.ring_degree} x tensor "
                f"parallel {spec.tp_degree} x CFG {spec.cfg_degree} x data parallel {spec.data_parallel}) need as "
                f"many GPUs, but {visible} are visible; lower the degrees"
            )
    _check_one_node()
    if spec.context_degree > 1 and spec.tp_degree > 1:
        raise DiffmeterError(
            "diffusers applies context parallelism or tensor parallelism to a model, not both "
            "(ParallelConfig refuses the pair): pick --ulysses-degree/--ring-degree or --tp-degree"
        )
    if spec.context_degree > 1:
        check_context_parallel(spec, target)
    if spec.tp_degree > 1:
        check_tensor_parallel(spec, target)
        _check_tensor_parallel_techniques(optimizations, target)
    if spec.cfg_degree > 1:
        check_cfg_parallel(spec, target)
    cores = len(os.sched_getaffinity(0))
    if here and target.device.type == "cpu" and spec.world_size > PER_CORE * cores:
        # each CPU rank takes a share of the cores (distributed/place.py) and holds its own pipeline: past two a core
        # they time each other's contention, not the run (two on one core still check a split's images, as the
        # multi-GPU guide's 4-process example does on a 2-core machine)
        raise DiffmeterError(
            f"{spec.world_size} processes on a CPU with {cores} cores this process may use: past {PER_CORE} a core "
            "the ranks time each other's contention, not the run, each holding its own pipeline; lower the degrees "
            f"to at most {PER_CORE * cores}"
        )


def check_cfg_parallel(spec, target) -> None:
    if spec.cfg_degree != 2:
        raise DiffmeterError(
            f"--cfg-degree {spec.cfg_degree}: a guided step has two halves (conditional and unconditional); use 2"
        )
    if spec.tp_degree > 1:
        raise DiffmeterError("--cfg-degree with --tp-degree is not supported yet: pair it with --ulysses-degree")
    if guided_mode(spec, target) is None:
        settled = spec.profile_spec().with_defaults(target.entry.defaults)
        if target.family.truncates_cfg and settled.guidance_scale > 1 and settled.cfg_trunc_ratio:
            raise DiffmeterError(
                f"--cfg-degree 2 splits each step's two calls, but {target.entry.name} runs the unconditional one on "
                "the first steps only (cfg_trunc_ratio): add --cfg-trunc-ratio 1 to guide every step, or drop it"
            )
        hint = "; its true CFG (--true-cfg-scale) has two" if target.family.true_cfg else ""
        raise DiffmeterError(
            f"--cfg-degree 2 splits a guided step's conditional and unconditional halves, but {target.entry.name} "
            "runs one denoiser call of its own batch per step here (guidance-distilled, or --guidance-scale 1 or "
            f"less): there is no half to split{hint}"
        )


def guided_mode(spec, target) -> str | None:
    """How ``spec`` guides on ``target``'s pipeline, from the offline plan of its denoiser calls: "batched"
    (one call of the unconditional and conditional batches stacked), "separate" (two calls per step), or None."""
    family, entry = target.family, target.entry
    profile = spec.profile_spec().with_defaults(entry.defaults)
    calls = [call for call in family.plan(family.shapes(entry, profile)) if call.component in family.denoisers(entry)]
    per_step = sum(call.count for call in calls) / schedule.denoiser_steps(entry, profile)  # PNDM: steps + 1
    batches = {call.batch for call in calls}
    if per_step == 1 and batches == {2 * spec.batch_size}:
        return "batched"
    if per_step == 2 and batches == {spec.batch_size}:
        return "separate"
    return None


def check_engine(engine: str, device: torch.device) -> None:
    """Only diffusers runs pipelines here; xDiT is refused with the reason that applies on this machine."""
    if engine == "diffusers":
        return
    if engine != "xdit":
        raise DiffmeterError(f"unknown engine '{engine}': use diffusers (or xdit, on CUDA)")
    if device.type != "cuda":
        raise DiffmeterError("--engine xdit: xDiT (xfuser) runs on CUDA GPUs only; use --device cuda, or drop it")
    raise DiffmeterError(
        "--engine xdit is not implemented: diffmeter measures diffusers' own context, tensor and data parallelism "
        "(--ulysses-degree, --ring-degree, --tp-degree, --data-parallel) and CFG parallelism (--cfg-degree); "
        "PipeFusion needs xDiT"
    )


def check_tensor_parallel(spec, target) -> None:
    from diffusers.hooks.tensor_parallel import _SUPPORTED_TP_DEVICES

    cls = target.denoiser_class
    # what else splits the work: context parallelism where the class has a plan for it, data parallelism (bench's)
    others = ("--ulysses-degree or " if getattr(cls, "_cp_plan", None) is not None else "") + "bench --data-parallel"
    if getattr(cls, "_tp_plan", None) is None:
        raise DiffmeterError(
            f"{cls.__name__} has no tensor-parallel plan (_tp_plan) in diffusers (FLUX, FLUX.2 and QwenImage have "
            f"one); use {others}"
        )
    if target.device.type not in _SUPPORTED_TP_DEVICES:
        raise DiffmeterError(
            f"diffusers' tensor parallelism runs on {', '.join(_SUPPORTED_TP_DEVICES)} devices, not "
            f"{target.device.type}; use {others} here"
        )
    heads = target.entry.components[target.family.denoiser].config.get("num_attention_heads")
    if heads is not None and heads % spec.tp_degree:
        raise DiffmeterError(
            f"{cls.__name__} has {heads} attention heads, not divisible by --tp-degree {spec.tp_degree}: "
            "each rank takes whole heads; pick a degree dividing it"
        )


def _check_tensor_parallel_techniques(optimizations, target) -> None:
    """What diffusers refuses only once the model is loaded (hooks/tensor_parallel.py, ``_check_tp_supported``:
    a quantized model's packed parameters cannot be sharded into DTensors), refused here before loading."""
    denoisers = set(target.family.denoisers(target.entry))
    for optimization in optimizations:
        if optimization.kind == "quantization" and denoisers & set(optimization.components(target)):
            raise DiffmeterError(
                f"{optimization.label()} quantizes the denoiser, and diffusers cannot shard quantized parameters "
                "for tensor parallelism: drop one, or quantize only other components (components=...)"
            )


def _check_one_node() -> None:
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if world is not None and local is not None and world != local:
        raise DiffmeterError(
            f"this launch spans several nodes (WORLD_SIZE {world}, LOCAL_WORLD_SIZE {local}); diffmeter's parallel "
            "runs share one result folder and run on one node: launch on one machine"
        )


#: the fix for a denoiser without a context-parallel plan, as bench takes it
USE_DATA_PARALLEL = "use --data-parallel"


def check_context_parallel(spec, target, instead: str = USE_DATA_PARALLEL) -> None:
    """Refuse context parallelism ``target`` cannot run; ``instead``: the fix for a denoiser without a plan, one the
    command that asks takes (bench: ``--data-parallel``)."""
    cls = target.denoiser_class
    name = cls.__name__
    plan = getattr(cls, "_cp_plan", None)
    if plan is None:
        raise DiffmeterError(
            f"{name} has no context-parallel plan (_cp_plan) in diffusers; --ulysses-degree/--ring-degree need one "
            f"(FLUX, Wan, QwenImage, LTX ... have it); {instead}"
        )
    backend = _backend(spec)
    _check_backend(backend, spec.ring_degree)
    heads = target.entry.components[target.family.denoiser].config.get("num_attention_heads")
    if heads is not None and heads % spec.ulysses_degree:
        raise DiffmeterError(
            f"{name} has {heads} attention heads, not divisible by --ulysses-degree {spec.ulysses_degree}: "
            "Ulysses gives each rank whole heads; pick a degree dividing it"
        )
    for where, length in split_lengths(target, spec).items():
        if length % spec.context_degree:
            raise DiffmeterError(
                f"{name}'s sequence at '{where}' has {length} tokens, not divisible by the context-parallel degree "
                f"{spec.context_degree} (ulysses x ring); change the size or the degree"
            )


def _backend(spec) -> str:
    for optimization in spec.optimizations:
        if optimization.name == "attention":
            return optimization.params.get("backend", "native")
    return "native"


def _check_backend(backend: str, ring_degree: int) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    name = AttentionBackendName(backend)
    if not _AttentionBackendRegistry._is_context_parallel_available(name):
        supported = ", ".join(sorted(b.value for b in _AttentionBackendRegistry._supports_context_parallel))
        raise DiffmeterError(
            f"attention backend '{backend}' has no context-parallel support in diffusers: use {supported}"
        )
    if ring_degree > 1 and not returns_lse(backend):
        raise DiffmeterError(
            f"ring attention merges partial results with the log-sum-exp, which the '{backend}' attention backend "
            "cannot return (diffusers raises on return_lse); use --opt attention:backend=flash (or _flash_3, sage) "
            "on CUDA, or --ulysses-degree instead of --ring-degree"
        )


def returns_lse(backend: str) -> bool:
    """Whether diffusers' function for ``backend`` can return the log-sum-exp (others raise on ``return_lse``)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    function = _AttentionBackendRegistry._backends[AttentionBackendName(backend)]
    source = inspect.getsource(function)
    if "return_lse" not in inspect.signature(function).parameters:
        return False
    return re.search(r"raise \w+\(\s*[\"'f][^\n]*return_lse", source) is None


def split_lengths(target, spec) -> dict[str, int]:
    """The length of every tensor diffusers' context-parallel plan splits, from the denoiser run on
    the meta device with the plan's real inputs (stopped once each split input was seen); a plan's "blocks.*"
    (every block of a ModuleList, diffusers' ``_find_submodule_by_name``) is read at its first block."""
    from diffusers.models._modeling_parallel import ContextParallelInput

    family = target.family
    shapes = family.shapes(target.entry, spec.profile_spec().with_defaults(target.entry.defaults))
    call = next(c for c in family.plan(shapes) if c.component == family.denoiser)
    model = build_component(target.entry.components[target.family.denoiser], "meta")
    plan = type(model)._cp_plan
    lengths, handles = {}, []
    wanted = {
        module: {key: value for key, value in entries.items() if isinstance(value, ContextParallelInput)}
        for module, entries in plan.items()
        if isinstance(entries, dict)
    }
    wanted = {module: entries for module, entries in wanted.items() if entries}

    def record(module_name, entries, args, kwargs, output):
        if output is None:  # inputs by name, however they were passed
            module = model.get_submodule(module_name.replace("*", "0")) if module_name else model
            kwargs = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        for key, split in entries.items():
            if split.split_output:
                value = output[key] if isinstance(key, int) else getattr(output, key, None)
            else:
                value = args[key] if isinstance(key, int) else kwargs.get(key)
            if isinstance(value, torch.Tensor) and value.dim() > split.split_dim:
                lengths[f"{module_name or 'input'}.{key}"] = value.shape[split.split_dim]
        if all(any(k.startswith(f"{m or 'input'}.") for k in lengths) for m in wanted):
            raise _Seen

    for module_name, entries in wanted.items():
        module = model.get_submodule(module_name.replace("*", "0")) if module_name else model
        if any(split.split_output for split in entries.values()):
            handles.append(
                module.register_forward_hook(
                    lambda m, a, k, out, n=module_name, e=entries: record(n, e, a, k, out), with_kwargs=True
                )
            )
        else:
            handles.append(
                module.register_forward_pre_hook(
                    lambda m, a, k, n=module_name, e=entries: record(n, e, a, k, None), with_kwargs=True
                )
            )
    try:
        with torch.no_grad():
            run = model if call.method == "forward" else getattr(model, call.method)  # hooks fire through __call__
            run(**meta_inputs(call))
    except _Seen:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return lengths
