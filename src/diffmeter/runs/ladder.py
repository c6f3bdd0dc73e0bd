"""The classic speed-up table, built for real: a baseline, then one technique added
per rung (faster sampler, compile, half precision, attention kernel, cache), every rung a
stored run, every image compared with the baseline's at the same seed."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from diffmeter import units
from diffmeter.catalog import entry_of
from diffmeter.errors import DiffmeterError, MissingPackage
from diffmeter.families import get_family
from diffmeter.measure.speedup import Drift
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.runs import speedups, storage
from diffmeter.runs.baseline import compare_with_baseline
from diffmeter.runs.calls import Progress
from diffmeter.runs.ladder_prediction import range_verdict
from diffmeter.runs.ladder_record import Ladder, LadderRow
from diffmeter.runs.lifecycle import bench, stored_or_run
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec

RUNGS = ("scheduler", "compile", "half", "attention", "cache", "runtime")
#: deployment runtimes tried in order for the runtime rung, per device type
RUNTIMES = {
    "cuda": [("tensorrt", {}), ("onnxruntime", {"provider": "tensorrt"}), ("onnxruntime", {"provider": "cuda"})],
    "cpu": [("onnxruntime", {"provider": "cpu"})],
}
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


def plan(spec: BenchSpec, rungs: tuple[str, ...], fast_steps: int | None, compile_mode: str) -> list[Rung]:
    """Every rung's spec, each the previous plus one technique; rungs that do not apply say why."""
    entry = entry_of(spec)
    base = spec.model_copy(update={"dtype": spec.dtype or "fp32", "tf32": False, "optimizations": []}).settle(entry)
    unknown = [rung for rung in rungs if rung not in RUNGS]
    if unknown:
        raise DiffmeterError(f"unknown ladder rung {', '.join(unknown)}: pick from {', '.join(RUNGS)}")
    if twice := sorted({rung for rung in rungs if rungs.count(rung) > 1}):
        raise DiffmeterError(f"--rungs: {', '.join(twice)} given twice; each rung adds its technique once")
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
        reasons, missing = [], []
        for adds, update, extra in candidates:
            candidate = current.model_copy(
                update={**update, "optimizations": [*current.optimizations, *([extra] if extra else [])]}
            )
            try:
                _check(candidate, entry, family)
            except MissingPackage as error:
                missing.append(str(error))
                continue
            except DiffmeterError as error:
                reasons.append(str(error))
                continue
            ladder.append(Rung(rung, adds, candidate))
            current = candidate
            break
        else:  # what would apply if installed says more than what does not apply
            skipped = "; ".join(missing + reasons) or NOTHING_TO_ADD.get(rung, "nothing to add")
            ladder.append(Rung(rung, "-", None, skipped=skipped))
    return ladder


def _candidates(rung: str, current: BenchSpec, entry, fast_steps: int | None, compile_mode: str):
    """(description, spec fields changed, optimization added) to try, best first."""
    device = torch.device(current.device)
    if rung == "scheduler":
        steps = fast_steps or min(20, current.steps)
        name = "flow-euler" if get_family(entry.family).flow_matching else "dpm++2m"
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
    if rung == "runtime":
        return [
            (" ".join([name, *(f"{k}={v}" for k, v in params.items())]), {}, OptimizationSpec(name=name, params=params))
            for name, params in RUNTIMES.get(device.type, [])
        ]
    return [(name, {}, OptimizationSpec(name=name)) for name in CACHES]


def _check(spec: BenchSpec, entry, family) -> None:
    """Raise what ``bench`` would refuse the spec for (MissingPackage when only a package is missing)."""
    settled = spec.settle(entry)
    target = Target(entry, family, torch.device(settled.device), settled.dtype, settled.steps)
    check(build(settled.optimizations), target)


#: called after each rung with (its name, its stored result or None when skipped, its folder or None)
Finished = Callable[[str, "BenchResult | None", "Path | None"], None]


def climb(
    rungs: list[Rung],
    out: str | Path,
    force: bool = False,
    progress: Progress | None = None,
    recheck: bool = True,
    finished: Finished | None = None,
) -> Ladder:
    """Run (or reuse from ``out``) every rung, compare each rung's images with the baseline's, and
    (``recheck``) measure the baseline again at the end, so drift in the machine's speed shows. Each rung is
    stored as it finishes (``finished`` hears of it): an interrupted ladder keeps them, and a rerun reuses them."""
    results: list[tuple[Rung, BenchResult | None, Path | None]] = []
    for rung in rungs:
        if rung.spec is None:
            results.append((rung, None, None))
        else:
            results.append((rung, *stored_or_run(rung.spec, out, progress, rerun=force)))
        if finished is not None:
            finished(rung.name, results[-1][1], results[-1][2])
    baseline, baseline_folder = results[0][1], results[0][2]
    base = baseline.summary.latency_s
    again, drift = None, None
    if recheck and len([folder for _, _, folder in results if folder]) > 1:
        again, drift = _recheck_baseline(rungs[0].spec, base, out, progress)
    rows = []
    for rung, result, folder in results:
        if result is None:
            rows.append(LadderRow(rung=rung.name, adds=rung.adds, skipped=rung.skipped))
            continue
        summary = result.summary
        memory = summary.peak_memory
        energy = summary.energy
        quality = None if rung.name == "baseline" else compare_with_baseline(result, folder, baseline, baseline_folder)
        found = None if rung.name == "baseline" else speedups.between(baseline, result, drift=drift)
        rows.append(
            LadderRow(
                rung=rung.name,
                adds=rung.adds,
                folder=str(folder),
                steps=result.spec.steps,
                dtype=result.spec.dtype,
                latency_s=summary.latency_s.median,
                latency_interval_s=(summary.latency_s.ci_low, summary.latency_s.ci_high),
                speedup=found.estimate if found else 1.0,
                speedup_interval=(found.low, found.high) if found else (1.0, 1.0),
                speedup_detail=found,
                measured_utc=result.created_utc,
                conditions=summary.conditions,
                cold_start_overhead_s=summary.cold_start_overhead_s,
                peak_memory_bytes=memory.cuda_max_allocated_bytes or memory.process_peak_rss_bytes,
                energy_j_per_image=energy.gpu_j_per_image if energy.available else None,
                quality=quality,
                **_expected(result),
            )
        )
    ladder = Ladder(
        model=baseline.model.id,
        device=baseline.spec.device,
        rows=rows,
        weights=baseline.weights,
        weights_random=baseline.weights_random,
    )
    if again is not None:
        ladder.baseline_recheck_s, ladder.baseline_recheck_interval_s = again
    ladder.notes += ([drift.note] if drift else []) + _trust_notes(rows)
    # named by its baseline and its rungs: a ladder of other rungs beside it is another file, not overwritten
    climbed = "-".join(rung.name for rung in rungs[1:])
    storage.write_json(
        Path(out).expanduser() / f"ladder-{Path(baseline_folder).name}+rungs-{climbed}.json",
        ladder.model_dump(mode="json"),
    )
    return ladder


def _recheck_baseline(
    spec: BenchSpec, base, out: str | Path, progress
) -> tuple[tuple[float, tuple[float, float]], Drift | None]:
    """Measure the baseline again (not stored): (its median and interval, seconds), and where its interval moved
    away from the first one's, the machine's change in speed that every rung's speed-up interval is widened by."""
    with tempfile.TemporaryDirectory(dir=Path(out).expanduser(), prefix=".ladder-recheck-") as scratch:
        again, _ = bench(spec.model_copy(update={"save_images": False}), out=scratch, force=True, progress=progress)
    latency = again.summary.latency_s
    measured = (latency.median, (latency.ci_low, latency.ci_high))
    if not (latency.ci_low > base.ci_high or latency.ci_high < base.ci_low):
        return measured, None
    change = latency.median / base.median
    return measured, Drift.of(
        [change],
        f"the machine's speed changed during the ladder: the baseline took {units.seconds(base.median)} at the "
        f"start and {units.seconds(latency.median)} at the end ({100 * (change - 1):+.0f}%, intervals apart); every "
        "speed-up's interval is widened by that: re-run with --force on a quieter machine",
    )


def _trust_notes(rows: list[LadderRow]) -> list[str]:
    """Rungs measured in other sessions (reused from --out), or while other processes were busy."""
    notes = []
    measured = [row for row in rows if row.measured_utc]
    times = sorted(datetime.fromisoformat(row.measured_utc) for row in measured)
    if times and (times[-1] - times[0]).total_seconds() > 3600:
        notes.append(
            f"rungs were measured {times[0]:%Y-%m-%d %H:%M} to {times[-1]:%Y-%m-%d %H:%M} UTC (some reused from "
            "--out): conditions may differ between them; --force measures every rung now"
        )
    busy = [row.rung for row in measured if row.conditions is not None and row.conditions.disturbed()]
    if busy:
        notes.append(f"other processes were busy during {', '.join(busy)}: those rungs may read slow")
    return notes


def _expected(result: BenchResult) -> dict:
    """The rung's stored expected range and its median against it, or why it has none."""
    prediction = result.prediction
    time = prediction.time if prediction is not None else None
    if time is None or time.expected_s is None or prediction.time_left_out:
        why = (
            f"the expected time leaves out {'; '.join(prediction.time_left_out)}"
            if prediction is not None and prediction.time_left_out
            else "no expected range stored"
        )
        return {"expected_s": None, "expected_verdict": f"not timed: {why}"}
    verdict = range_verdict(time.expected_s, result.summary.latency_s.median)
    return {"expected_s": time.expected_s, "expected_verdict": verdict}
