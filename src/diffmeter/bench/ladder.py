"""The seed tutorial's results table, built for real: a baseline, then one technique added
per rung (faster sampler, compile, half precision, attention kernel, cache), every rung a
stored run, every image compared with the baseline's at the same seed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel

from diffmeter.bench import storage
from diffmeter.bench.results import BenchResult
from diffmeter.bench.runner import Progress, compare_with_baseline, stored_or_run
from diffmeter.bench.spec import BenchSpec
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.measure.quality import Quality
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.optimize.base import FLOW_FAMILIES

RUNGS = ("scheduler", "compile", "half", "attention", "cache")
#: why a rung with no candidate on this device is skipped
NOTHING_TO_ADD = {"attention": "on CPU, PyTorch's SDPA already runs its flash kernel; faster attention is a CUDA rung"}
#: caches tried in order for the cache rung
CACHES = ("first-block-cache", "deep-cache", "cache-dit", "taylorseer")


@dataclass
class Rung:
    name: str
    adds: str
    spec: BenchSpec | None
    skipped: str | None = None


class LadderRow(BaseModel):
    rung: str
    adds: str
    skipped: str | None = None
    folder: str | None = None
    steps: int | None = None
    dtype: str | None = None
    latency_s: float | None = None
    speedup: float | None = None
    cold_start_overhead_s: float | None = None
    peak_memory_bytes: int | None = None
    energy_j_per_image: float | None = None
    quality: Quality | None = None


class Ladder(BaseModel):
    model: str
    device: str
    rows: list[LadderRow]


def plan(spec: BenchSpec, rungs: tuple[str, ...], fast_steps: int | None, compile_mode: str) -> list[Rung]:
    """Every rung's spec, each the previous plus one technique; rungs that do not apply say why."""
    entry = resolve(spec.model)
    base = spec.model_copy(update={"dtype": spec.dtype or "fp32", "tf32": False, "optimizations": []}).settle(entry)
    unknown = [rung for rung in rungs if rung not in RUNGS]
    if unknown:
        raise DiffmeterError(f"unknown ladder rung {', '.join(unknown)}: pick from {', '.join(RUNGS)}")
    if fast_steps is not None and not 0 < fast_steps <= base.steps:
        raise DiffmeterError(
            f"--fast-steps {fast_steps} must be between 1 and the baseline's {base.steps} steps: "
            "the scheduler rung runs fewer steps than the baseline"
        )
    build([OptimizationSpec(name="compile", params={"mode": compile_mode})])  # a bad mode is one line now
    if fast_steps is not None and "scheduler" not in rungs:
        raise DiffmeterError("--fast-steps sets the scheduler rung's steps; add scheduler to --rungs or drop it")
    family = get_family(entry.family)
    ladder = [Rung("baseline", f"{base.dtype}, the pipeline's scheduler, {base.steps} steps, eager", base)]
    current = base
    for rung in rungs:
        candidates = _candidates(rung, current, entry, fast_steps, compile_mode)
        reasons = []
        for adds, update, extra in candidates:
            candidate = current.model_copy(
                update={**update, "optimizations": [*current.optimizations, *([extra] if extra else [])]}
            )
            reason = _refusal(candidate, entry, family)
            if reason is None:
                ladder.append(Rung(rung, adds, candidate))
                current = candidate
                break
            reasons.append(reason)
        else:
            ladder.append(
                Rung(rung, "-", None, skipped="; ".join(reasons) or NOTHING_TO_ADD.get(rung, "nothing to add"))
            )
    return ladder


def _candidates(rung: str, current: BenchSpec, entry, fast_steps: int | None, compile_mode: str):
    """(description, spec fields changed, optimization added) to try, best first."""
    device = torch.device(current.device)
    if rung == "scheduler":
        steps = fast_steps or min(20, current.steps)
        name = "flow-euler" if entry.family in FLOW_FAMILIES else "dpm++2m"
        return [
            (
                f"{name} sampler, {steps} steps",
                {"steps": steps},
                OptimizationSpec(name="scheduler", params={"name": name}),
            )
        ]
    if rung == "compile":
        return [
            (f"torch.compile mode={compile_mode}", {}, OptimizationSpec(name="compile", params={"mode": compile_mode}))
        ]
    if rung == "half":
        half = entry.defaults.dtype if entry.defaults.dtype != "float32" else "bfloat16"
        if device.type == "cpu":
            half = "bfloat16"  # CPU kernels for float16 are slow or missing
        return [(f"{half} weights and activations", {"dtype": half}, None)]
    if rung == "attention":
        if device.type != "cuda":
            return []  # PyTorch's CPU SDPA already runs its flash kernel: nothing faster to add
        options = [
            ("flash-attention backend", OptimizationSpec(name="attention", params={"backend": b}))
            for b in ("_flash_3", "flash", "sage")
        ]
        options.append(("SDPA flash kernel", OptimizationSpec(name="sdpa-kernel", params={"kernel": "flash"})))
        options.append(
            ("SDPA memory-efficient kernel", OptimizationSpec(name="sdpa-kernel", params={"kernel": "efficient"}))
        )
        return [(adds, {}, extra) for adds, extra in options]
    return [(name, {}, OptimizationSpec(name=name)) for name in CACHES]


def _refusal(spec: BenchSpec, entry, family) -> str | None:
    try:
        settled = spec.settle(entry)
        target = Target(entry, family, torch.device(settled.device), settled.dtype, settled.steps)
        check(build(settled.optimizations), target)
    except DiffmeterError as error:
        return str(error)
    return None


def climb(rungs: list[Rung], out: str | Path, force: bool = False, progress: Progress | None = None) -> Ladder:
    """Run (or reuse from ``out``) every rung, then compare each rung's images with the baseline's."""
    results: list[tuple[Rung, BenchResult | None, Path | None]] = []
    for rung in rungs:
        if rung.spec is None:
            results.append((rung, None, None))
            continue
        results.append((rung, *stored_or_run(rung.spec, out, progress, rerun=force)))
    baseline, baseline_folder = results[0][1], results[0][2]
    rows = []
    for rung, result, folder in results:
        if result is None:
            rows.append(LadderRow(rung=rung.name, adds=rung.adds, skipped=rung.skipped))
            continue
        summary = result.summary
        memory = summary.peak_memory
        energy = summary.energy
        quality = None if rung.name == "baseline" else compare_with_baseline(result, folder, baseline, baseline_folder)
        rows.append(
            LadderRow(
                rung=rung.name,
                adds=rung.adds,
                folder=str(folder),
                steps=result.spec.steps,
                dtype=result.spec.dtype,
                latency_s=summary.latency_s.median,
                speedup=baseline.summary.latency_s.median / summary.latency_s.median,
                cold_start_overhead_s=summary.cold_start_overhead_s,
                peak_memory_bytes=memory.cuda_max_allocated_bytes or memory.process_peak_rss_bytes,
                energy_j_per_image=energy.gpu_j_per_image if energy.available else None,
                quality=quality,
            )
        )
    ladder = Ladder(model=baseline.model.id, device=baseline.spec.device, rows=rows)
    storage.write_json(
        Path(out).expanduser() / f"ladder-{Path(baseline_folder).name}.json", ladder.model_dump(mode="json")
    )
    return ladder


def read_ladder(path: str | Path) -> Ladder:
    """A stored ladder-*.json; one clear line if it is not one."""
    return storage.read_model(Path(path).expanduser(), Ladder, "ladder", "re-run `diffmeter ladder`")
