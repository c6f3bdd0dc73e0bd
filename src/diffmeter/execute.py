"""Where a measured run executes: in this process (``runs.lifecycle.bench``), or over a group of processes started here
or joined under torchrun (``distributed.launch``). The choice is made here, above both, for the command line,
the Python API (``diffmeter.bench``) and sweep cells alike; the run's lifecycle is the same either way."""

from __future__ import annotations

from pathlib import Path

from diffmeter.distributed.launch import bench_parallel
from diffmeter.optimize import OptimizationSpec
from diffmeter.optimize.options import from_config
from diffmeter.runs import lifecycle
from diffmeter.runs.calls import Progress
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec


def bench(spec: BenchSpec, out: str | Path = "results", force: bool = False, progress: Progress | None = None):
    """Run ``spec`` and store it under ``out``; returns (BenchResult, run folder). Under torchrun every rank
    calls this; ranks other than 0 return (None, None)."""
    if spec.world_size > 1:
        return bench_parallel(spec, out, force, progress)
    return lifecycle.bench(spec, out, force, progress)


def measure(
    model: str,
    *,
    out: str | Path = "results",
    force: bool = False,
    optimizations: list[str | dict | OptimizationSpec] = (),
    progress: Progress | None = None,
    **settings,
) -> BenchResult:
    """Measure ``model`` (what ``diffmeter bench`` does) and return the stored result.

    ``settings`` are :class:`BenchSpec` fields (``steps``, ``batch_size``, ``height``, ``dtype``,
    ``iterations``, ``target_precision``, ...); ``optimizations`` are technique names,
    ``"name:key=value,..."`` strings, ``{"name": ..., "params": {...}}`` mappings or
    ``OptimizationSpec``s. The result's ``folder`` is where it was written.
    """
    techniques = [o if isinstance(o, OptimizationSpec) else from_config([o])[0] for o in optimizations]
    result, _ = bench(
        BenchSpec(model=model, optimizations=techniques, **settings), out=out, force=force, progress=progress
    )
    return result
