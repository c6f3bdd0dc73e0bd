"""What the parallel-run tests share: a CPU spec, the images of a run compared with another's, and the
environment of a run with a fault planted in one rank (tests/rank_faults/sitecustomize.py)."""

import os

from diffmeter.measure.quality import compare
from diffmeter.runs.spec import BenchSpec


def cpu_spec(model: str = "tiny-flux", **settings) -> BenchSpec:
    return BenchSpec(**{"model": model, "device": "cpu", "warmup": 1, "iterations": 2, **settings})


def images_of(result) -> dict:
    return {image.seed: result.folder / image.path for image in result.images}


def assert_same_images(result, reference) -> None:
    mine, theirs = images_of(result), images_of(reference)
    assert mine.keys() == theirs.keys()
    for seed, path in mine.items():
        quality = compare(path, theirs[seed], seed)
        assert quality.identical or quality.psnr_db > 60, (seed, quality)


def with_a_rank_fault(rank: int, fault: str) -> dict:
    """The environment of a CLI run whose rank ``rank`` carries ``fault`` (tests/rank_faults/sitecustomize.py)."""
    here = os.path.join(os.path.dirname(__file__), "rank_faults")
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "RANK_FAULT": fault, "RANK_FAULT_RANK": str(rank)}


def rank_stage_peaks(model: str, ulysses: int, ring: int) -> dict:
    """One rank of a real context-parallel run on the CPU over gloo: the tiny pipeline at float32, diffusers' context
    parallelism on its denoiser, each stage's peak from torch.profiler's memory timeline; and the spec's settings."""
    import torch
    import torch.distributed as dist
    from tiny_runs import tiny_call, token_settings

    from diffmeter.catalog import resolve
    from diffmeter.distributed import context_parallel
    from diffmeter.distributed.rank_prediction import RING_BACKEND
    from diffmeter.measure.memory_timeline import measure_stage_peaks
    from diffmeter.predict.memory import STAGE_OF_ROLE, settled_plan
    from diffmeter.spec import ProfileSpec

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    entry = resolve(model)
    pipe, call, settings = tiny_call(entry)
    mesh = context_parallel.device_mesh(torch.device("cpu"), 1, 1, ring, ulysses, 1)
    if ring > 1:
        pipe.transformer.set_attention_backend(RING_BACKEND)
    context_parallel.enable(pipe.transformer, mesh, ring, ulysses, torch.device("cpu"))
    settings = {**settings, **token_settings(entry, pipe)}
    _, _, plan = settled_plan(ProfileSpec(model=model, **settings))
    components = {(c.component, c.method): (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan}
    measured = measure_stage_peaks(call, components)
    dist.destroy_process_group()
    return {"settings": settings, "stages": measured.stage_peak_bytes}


def tensor_parallel_rank(model: str, tp: int) -> dict:
    """One rank of a real tensor-parallel run on the CPU over gloo: the tiny pipeline at float32, its denoiser sharded
    as bench shards it (``context_parallel.enable_tensor_parallel``; diffusers' device list widened to the CPU, as
    tests/rank_faults/sitecustomize.py's TP_ON_CPU does): the denoiser's bytes it holds, each stage's peak from
    torch.profiler's memory timeline, and a second generation's collectives."""
    import diffusers.hooks.tensor_parallel as tensor_parallel
    import torch
    import torch.distributed as dist
    from tiny_runs import tiny_call, token_settings

    from diffmeter.catalog import resolve
    from diffmeter.distributed import context_parallel
    from diffmeter.distributed.communication import CollectiveBytes
    from diffmeter.measure.memory_timeline import measure_stage_peaks
    from diffmeter.predict.memory import STAGE_OF_ROLE, settled_plan
    from diffmeter.spec import ProfileSpec

    torch.set_num_threads(1)
    tensor_parallel._SUPPORTED_TP_DEVICES = (*tensor_parallel._SUPPORTED_TP_DEVICES, "cpu")
    dist.init_process_group("gloo")
    entry = resolve(model)
    pipe, call, settings = tiny_call(entry)
    mesh = context_parallel.device_mesh(torch.device("cpu"), 1, 1, 1, 1, tp)
    context_parallel.enable_tensor_parallel(pipe.transformer, mesh, torch.device("cpu"))
    held = context_parallel.resident_parameter_bytes([pipe.transformer])
    buffers = sum(buffer.nbytes for buffer in pipe.transformer.buffers())
    settings = {**settings, **token_settings(entry, pipe)}
    _, _, plan = settled_plan(ProfileSpec(model=model, **settings))
    components = {(c.component, c.method): (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan}
    measured = measure_stage_peaks(call, components)
    counter = CollectiveBytes()
    with counter:
        call()
    dist.destroy_process_group()
    return {
        "settings": settings,
        "held": held + buffers,
        "stages": measured.stage_peak_bytes,
        "bytes": counter.total,
        "calls": dict(counter.calls),
    }
