"""The CPU calibration's bfloat16 and compiled fits: achieved fractions of this CPU's peaks for bfloat16 eager calls,
and for the calls torch.compile (inductor, mode=default) runs, in float32 and bfloat16, fitted on real CPU runs
beside the float32 eager fit ``benchmarks/roofline_cpu.py`` ships (kept as it is).

1. This CPU's float32 and bfloat16 peaks (``predict.cpu_peaks``: matmul, convolution, copy) before and after the runs;
   the higher of each is the one the fractions are of, as ``roofline_cpu.py`` does for float32.
2. Each case (random weights at real size, 2 threads, one warm-up, 2 measured calls, ``--trace``) in each variant,
   in ``PASSES`` passes minutes apart:
   bfloat16 eager, compiled float32, compiled bfloat16 (the denoiser compiled, as ``--optimize compile`` does).
3. Fit per variant (``measure.calibrate.calibrate``: lowest and highest fraction per kind over the runs): bfloat16
   eager on every stage of its runs; a compiled variant on the denoising stage alone (the compiled calls), against
   the work as ``predict.compiled_time`` counts it, with the fused kinds pooled: inductor's generated C++ loops run
   inside one traced ``CompiledFxGraph`` call, so the trace cannot tell elementwise from normalization work there
   (``calibrate.pooled``).
4. Held out: SD 1.5 at 256 px is in none of these runs; ``benchmarks/ladder_cpu.py`` (its compile, half and cache
   rungs) is the held-out check. SD 2.1 base at 256 px, a sister UNet (SD 1.5's channels and resolutions, its own
   attention heads, cross-attention width and linear projections), and SD 1.5 at 320 px give the fit UNet calls
   near the ladder's size. Each case is also predicted from the other cases' fit (left out one at a time).

Run from the repo root:  python benchmarks/roofline_cpu_variants.py [--no-write-calibration]  (about 40 minutes on
2 cores). Each case's measurements are kept in $ROOFLINE_RUNS/variants/*.json and reused (delete them to rerun).
Writes benchmarks/results/roofline_cpu_variants.md and the "cpu" calibration's ``variants``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from roofline_cpu import fitted_device

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "roofline_cpu_variants.md"
CALIBRATION = ROOT / "src" / "diffmeter" / "predict" / "data" / "efficiency.json"
RUNS = Path(os.environ.get("ROOFLINE_RUNS", "/work/scratch/roofline_runs")) / "variants"
#: (model, px, steps): UNet and DiT pipelines at several sizes; SD 1.5 at 256 px (the ladder's) kept out
CASES = [("sd15", 384, 3), ("dit-xl-2-256", 256, 4), ("sd21-base", 256, 3), ("sd15", 320, 3)]
#: each case measured in this many passes, every case's first before any second (minutes apart): this shared host's
#: speed drifts more than its measured peaks over such spans (SD 2.1 base at 256 px, compiled bfloat16: denoising 2.60
#: s in the first pass, 3.00 s half an hour later, its pass's peaks 8% lower), and the fit's range holds every pass
PASSES = 2
#: variant (``calibration.variant_name``) -> (dtype, compiled)
VARIANTS = {"bfloat16": ("bfloat16", False), "compiled": ("float32", True), "compiled bfloat16": ("bfloat16", True)}


def stored_run(model: str, size: int, steps: int, dtype: str, compiled: bool, passed: int) -> Path:
    again = f"-pass{passed}" if passed > 1 else ""
    return RUNS / f"{model}-{size}-{steps}-{dtype}-{'compiled' if compiled else 'eager'}{again}.json"


def run_case(model: str, size: int, steps: int, dtype: str, compiled: bool, passed: int) -> dict:
    """One traced run's measurements in pass ``passed`` (stored as JSON, reused when present)."""
    stored = stored_run(model, size, steps, dtype, compiled, passed)
    if stored.exists():
        return json.loads(stored.read_text())
    from diffmeter.measure.calibrate import stage_measurements
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec, OptimizationSpec

    compile_ = [OptimizationSpec(name="compile", params={"mode": "default"})] if compiled else []
    spec = BenchSpec(
        model=model, height=size, width=size, steps=steps, dtype=dtype, device="cpu", random_weights=True, warmup=1,
        iterations=2, trace=True, save_images=False, predict=False, optimizations=compile_,
    )  # fmt: skip
    folder = RUNS / "runs"
    load = os.getloadavg()[0]
    result, _ = bench(spec, out=folder, force=True)
    others = result.summary.conditions.other_processes_cores if result.summary.conditions else None
    found = {
        "model": model, "size": size, "steps": steps, "dtype": dtype, "compiled": compiled, "pass": passed,
        "measured_utc": time.strftime("%H:%M", time.gmtime()),
        "latency_s": result.summary.latency_s.median, "other_cores": others.mean if others else None,
        "load_average": load, "stages": {k: v.model_dump() for k, v in stage_measurements(result).items()},
    }  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)  # traces are large; the figures are kept
    stored.write_text(json.dumps(found, indent=1))
    return found


def work_of(case: dict):
    """The case's operator work as the prediction counts it (compiled: ``compiled_time.compiled_work`` on the calls
    of the denoising stage, the denoiser ``--optimize compile`` compiles)."""
    from diffmeter.predict.compiled_time import compiled_work
    from diffmeter.predict.operators import operator_work
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec(model=case["model"], height=case["size"], width=case["size"], steps=case["steps"],
                     dtype=case["dtype"], device="cpu", random_weights=True)  # fmt: skip
    work = operator_work(spec.profile_spec())
    denoisers = tuple(sorted({call.component for call in work.calls if call.stage == "denoising"}))
    return compiled_work(work, denoisers, "default") if case["compiled"] else work


def main() -> None:
    write = "--no-write-calibration" not in sys.argv
    import torch

    torch.set_num_threads(2)
    from diffmeter.measure.calibrate import StageMeasurement, calibrate, pooled
    from diffmeter.measure.conditions import BUSY_CORES
    from diffmeter.predict.compiled_time import FUSED_KINDS
    from diffmeter.predict.cpu_peaks import CpuPeaks, cpu_name, measure_cpu_peaks
    from diffmeter.predict.expected_range import expected_s
    from diffmeter.predict.roofline import flop_rates, lower_bounds

    RUNS.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cases, peaks = {name: [] for name in VARIANTS}, []
    notes = []
    for passed in range(1, PASSES + 1):  # each pass's runs against the peaks measured beside them
        stored = RUNS / f"peaks-pass{passed}.json"
        runs = [stored_run(m, s, n, *how, passed) for how in VARIANTS.values() for m, s, n in CASES]
        record = json.loads(stored.read_text()) if stored.exists() else {}
        if not (record.get("after") and all(run.exists() for run in runs)):  # any run measured now: peaks now too
            record = {"before": measure_cpu_peaks(("fp32", "bf16"), budget_s=1.0).model_dump(mode="json")}
            stored.write_text(json.dumps(record))
        for name, how in VARIANTS.items():
            cases[name] += [run_case(model, size, steps, *how, passed) for model, size, steps in CASES]
        if "after" not in record:
            record["after"] = measure_cpu_peaks(("fp32", "bf16"), budget_s=1.0).model_dump(mode="json")
            stored.write_text(json.dumps(record))
        peaks.append((CpuPeaks.model_validate(record["before"]), CpuPeaks.model_validate(record["after"])))
        notes += [f"pass {passed}'s peaks: {record['note']}"] if record.get("note") else []
    devices = [fitted_device(before, after) for before, after in peaks]
    today = time.strftime("%Y-%m-%d")
    fits, lines, failures = {}, [], 0
    for name, runs in cases.items():
        compiled = VARIANTS[name][1]
        samples = []
        for case in runs:
            measured = {k: StageMeasurement(**v) for k, v in case["stages"].items()}
            work, device = work_of(case), devices[case.get("pass", 1) - 1]
            lower = lower_bounds(work, flop_rates(device, work), device.bandwidth_bytes_per_s)
            if compiled:  # the compiled calls alone, their generated loops' kinds as one
                measured, lower = pooled({"denoising": measured["denoising"]}, {"denoising": lower["denoising"]},
                                         FUSED_KINDS)  # fmt: skip
            samples.append((measured, lower))
        where = "the denoising stage (the compiled UNet or transformer)" if compiled else "every stage"
        source = (
            f"benchmarks/roofline_cpu_variants.py on {cpu_name()} (2 threads, {name}, inductor mode=default where "
            f"compiled): {len(runs)} real-size random-weight runs ({', '.join(f'{m} {s}px' for m, s, _ in CASES)}, "
            f"each in {PASSES} passes minutes apart), "
            f"{where}, {today}; fractions of the peaks measured beside each pass ("
            + "; ".join(f"pass {i}: {_rates(d)}" for i, d in enumerate(devices, 1))
            + "); "
            "held out: SD 1.5 at 256 px is in no run of this fit, benchmarks/results/ladder_cpu.md is its check"
        )
        fit = calibrate(samples, source)
        if compiled:
            fit = fit.model_copy(update={"fractions": _spread(fit.fractions, FUSED_KINDS)})
        fits[name] = fit.model_copy(update={"fitted_tflops": devices[0].tflops})  # which peaks were measured
        lines += _variant_section(name, runs, samples, fit, compiled)
        for index, (case, (measured, lower)) in enumerate(zip(runs, samples, strict=True)):
            same = index % len(CASES)  # the case left out in every pass
            other = calibrate([s for i, s in enumerate(samples) if i % len(CASES) != same], "the other cases")
            if compiled:
                other = other.model_copy(update={"fractions": _spread(other.fractions, FUSED_KINDS)})
            low = high = total = 0.0
            for stage, kinds in lower.items():
                if stage in measured:
                    a, b = expected_s(kinds, int(sum(c for _, c in kinds.values())), other)
                    low, high, total = low + a, high + b, total + measured[stage].median_s
            inside = low <= total <= high
            failures += not inside
            lines.append(
                f"- {_label(case)} predicted from the other cases' fit: {low:,.2f}-{high:,.2f} s, "
                f"measured {total:,.2f} s: {'inside' if inside else 'outside'}"
            )
        lines.append("")
    head = [
        "# The CPU calibration's bfloat16 and compiled fits",
        "",
        f"Machine: {cpu_name()}, 2 torch threads, random weights at real size (sizes and operators are real; images "
        "are noise). Each run: 1 warm-up call, 2 measured calls, 1 traced call (`bench --trace`); compiled: "
        "`--optimize compile` (inductor, mode=default, the denoiser). The float32 eager fit "
        "(benchmarks/results/roofline_cpu.md) is kept as it is.",
        "",
        "Peaks measured before / after each pass's runs (GFLOP/s; GB/s): "
        + "; ".join(
            f"pass {i} ({b.measured_at:%H:%M} to {a.measured_at:%H:%M} UTC) "
            + ", ".join(f"{k} {b.tflops[k] * 1e3:,.1f} / {a.tflops[k] * 1e3:,.1f}" for k in b.tflops)
            + f", copy {b.bandwidth_bytes_per_s / 1e9:,.1f} / {a.bandwidth_bytes_per_s / 1e9:,.1f}"
            for i, (b, a) in enumerate(peaks, 1)
        )
        + "; the higher of each is the one its pass's fractions are of."
        + "".join(f" {note}." for note in notes),
        "",
        "Held out: SD 1.5 at 256 px (the CPU ladder's model and size) is in none of these runs; "
        "benchmarks/results/ladder_cpu.md predicts its compile, half and cache rungs from this fit before they run.",
        f"Each case measured in {PASSES} passes, every case's first before any second: the range holds the host's "
        "drift between them. Each run predicted from the other cases' fit (below each table, a case left out in "
        "every pass): the range of their fractions per kind.",
        "",
    ]
    busy = [c for runs in cases.values() for c in runs if (c["other_cores"] or 0.0) > BUSY_CORES]
    tail = [
        f"Checks outside: {failures}. Took {(time.time() - started) / 60:,.1f} minutes (runs reused from "
        f"{RUNS} where stored).",
    ]
    report = "\n".join(head + lines + tail) + "\n"
    print(report)
    if busy or any(b.busy or a.busy for b, a in peaks):
        print(f"NOTHING written: other processes used more than {BUSY_CORES} cores; rerun on a quiet machine.")
        return
    OUT.write_text(report)
    if write:
        stored = json.loads(CALIBRATION.read_text())
        stored["cpu"]["variants"] = {name: fit.model_dump(mode="json", exclude_none=True) for name, fit in fits.items()}
        CALIBRATION.write_text(json.dumps(stored, indent=2) + "\n")


def _rates(device) -> str:
    t = device.tflops
    return (
        f"{t['bf16'] * 1e3:,.0f} GFLOP/s bfloat16 and {t['fp32'] * 1e3:,.0f} float32 matmul, "
        f"{t['conv-bf16'] * 1e3:,.0f} and {t['conv-fp32'] * 1e3:,.0f} convolution, "
        f"{device.bandwidth_bytes_per_s / 1e9:,.0f} GB/s copy"
    )


def _label(case: dict) -> str:
    passed = case.get("pass", 1)
    return f"{case['model']} {case['size']}px, pass {passed}" + (f" ({case['measured_utc']} UTC)" if passed > 1 else "")


def _spread(fractions: dict, kinds: tuple[str, ...]) -> dict:
    """The pooled fused fraction given to each of ``kinds`` (the pool's own key dropped)."""
    from diffmeter.measure.calibrate import POOL

    found = {kind: pair for kind, pair in fractions.items() if kind != POOL}
    return dict(sorted({**found, **dict.fromkeys(kinds, fractions[POOL])}.items())) if POOL in fractions else found


def _variant_section(name, runs, samples, fit, compiled) -> list[str]:
    from diffmeter.measure.calibrate import samples as fractions_of

    rows = []
    for case, (measured, lower) in zip(runs, samples, strict=True):
        found, outside = fractions_of(measured, lower)
        stages = ", ".join(f"{stage} {m.median_s:,.2f} s" for stage, m in measured.items())
        kinds = ", ".join(f"{kind} {value:.3f}" for kind, value in sorted(found.items()))
        rows.append(
            f"| {_label(case)}, {case['steps']} steps | {case['latency_s']:,.2f} s | {stages} | "
            f"{kinds} | {(outside or 0) * 1e6:,.1f} µs | {case['other_cores'] or 0:.1f} | {case['load_average']:.2f} |"
        )
    pooled_note = " (the fused kinds pooled: elementwise, normalization, other)" if compiled else ""
    return [
        f"## {name}",
        "",
        "| run | whole call (median) | stages fitted (median) | achieved fraction per kind | outside operators "
        "per operator | other processes (cores of 2) | 1-min load average at start |",
        "|---|---:|---|---|---:|---:|---:|",
        *rows,
        "",
        f"Shipped{pooled_note}: "
        + ", ".join(f"{kind} {low:.3f}-{high:.3f}" for kind, (low, high) in fit.fractions.items())
        + f"; outside operators {fit.overhead_s[0] * 1e6:,.1f}-{fit.overhead_s[1] * 1e6:,.1f} µs per operator.",
        "",
    ]


if __name__ == "__main__":
    main()
