"""diffusers' context parallelism (Ulysses all-to-all, ring attention) and tensor parallelism on a loaded denoiser."""

from __future__ import annotations

import torch
import torch.distributed as dist

#: names of the device mesh's dimensions, outermost first: rank = (((d * cfg + c) * ring + r) * ulysses + u) * tp + t
MESH_DIMS = ("data", "cfg", "ring", "ulysses", "tp")


def device_mesh(device: torch.device, data: int, cfg: int, ring: int, ulysses: int, tp: int):
    """The run's mesh; diffusers takes its ("ring", "ulysses") or ("tp",) part, the CFG layer its ("cfg",) part,
    the data dimension splits requests."""
    degrees = (data, cfg, ring, ulysses, tp)
    return dist.device_mesh.init_device_mesh(device.type, degrees, mesh_dim_names=MESH_DIMS)


def enable_tensor_parallel(model: torch.nn.Module, mesh, device: torch.device) -> None:
    """Shard ``model``'s weights over the mesh's tp ranks with diffusers' own plan (``_tp_plan``), each rank
    keeping its shard on ``device``: a model held back on the CPU is never whole on the GPU (``distribute_tensor``
    moves one parameter at a time and keeps the rank's slice). diffusers runs it on the accelerators it lists
    (``hooks.tensor_parallel._SUPPORTED_TP_DEVICES``), which ``parallel_support`` checked before loading.

    Without an accelerator ``enable_parallelism`` cannot run (``_resolve_parallel_config`` divides by
    ``torch.accelerator.device_count()``, diffusers 0.42.1): its steps are done here with ``device``, as
    ``enable`` does for context parallelism."""
    from diffusers.models._modeling_parallel import ParallelConfig, TensorParallelConfig

    config = TensorParallelConfig(mesh=mesh["tp"])
    if torch.accelerator.device_count() > 0:
        model.enable_parallelism(config=config)
        return
    from diffusers.hooks.tensor_parallel import apply_tensor_parallel

    _record_parallel_config(model, ParallelConfig(tensor_parallel_config=config), config.mesh, device)
    apply_tensor_parallel(model, config, model._tp_plan)


def shard_counted(model: torch.nn.Module, mesh) -> None:
    """``enable_tensor_parallel``'s sharding on fake CPU tensors over a fake process group, for the prediction: the
    same plan and ``apply_tensor_parallel``, with the CPU let into diffusers' device list while it shards (it names
    the accelerators only, ``hooks.tensor_parallel._SUPPORTED_TP_DEVICES``, diffusers 0.42.1)."""
    import diffusers.hooks.tensor_parallel as tensor_parallel
    from diffusers.models._modeling_parallel import ParallelConfig, TensorParallelConfig

    config = TensorParallelConfig(mesh=mesh["tp"])
    devices = tensor_parallel._SUPPORTED_TP_DEVICES
    tensor_parallel._SUPPORTED_TP_DEVICES = (*devices, "cpu")
    try:
        _record_parallel_config(model, ParallelConfig(tensor_parallel_config=config), config.mesh, torch.device("cpu"))
        tensor_parallel.apply_tensor_parallel(model, config, model._tp_plan)
    finally:
        tensor_parallel._SUPPORTED_TP_DEVICES = devices


def resident_parameter_bytes(models: list[torch.nn.Module]) -> int:
    """Bytes of the models' parameters this rank holds: its own shard of each tensor-parallel one."""
    from torch.distributed.tensor import DTensor

    return sum(
        (parameter.to_local() if isinstance(parameter, DTensor) else parameter).nbytes
        for model in models
        for parameter in model.parameters()
    )


def enable(model: torch.nn.Module, mesh, ring: int, ulysses: int, device: torch.device) -> None:
    """Split ``model``'s sequence over the mesh's ring x ulysses ranks with diffusers' own plan
    (``_cp_plan``): inputs sharded, attention exchanged, the output gathered back on every rank.

    On an accelerator this is ``ModelMixin.enable_parallelism``. Without one (CPU over gloo) that
    method cannot run: it places the rank at ``rank % torch.accelerator.device_count()``, a division
    by zero; the same steps are done here with ``device`` instead (diffusers 0.42.1,
    ``modeling_utils.enable_parallelism`` and ``_resolve_parallel_config``).
    """
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    config = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses, mesh=mesh["ring", "ulysses"])
    if torch.accelerator.device_count() > 0:
        model.enable_parallelism(config=config)
        return
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, MochiAttention

    parallel = _record_parallel_config(model, ParallelConfig(context_parallel_config=config), config.mesh, device)
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if isinstance(module, Attention | MochiAttention | AttentionModuleMixin) and hasattr(
            processor, "_parallel_config"
        ):
            processor._parallel_config = parallel
    apply_context_parallel(model, config, model._cp_plan)


def _record_parallel_config(model: torch.nn.Module, parallel, mesh, device: torch.device):
    """``_resolve_parallel_config``'s last steps (diffusers 0.42.1, modeling_utils.py) with ``device`` in place of
    ``rank % torch.accelerator.device_count()``: the config set up for this rank and recorded on the model."""
    parallel.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
    model._parallel_config = parallel
    return parallel
