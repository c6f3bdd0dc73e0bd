"""The roofline time prediction against real CPU runs, at real size with random weights; and the
calibration of the expected range for CPUs (``src/diffmeter/predict/data/efficiency.json``).

1. This CPU's peaks: the best float32 matmul and convolution rates and the best copy rate
   (``predict.cpu_peaks``), measured before and after the runs; the higher of each is the roofline's (a bound
   must use the most the machine can do), convolutions charged their own rate as every CPU prediction charges
   them (``roofline.kind_peak``). The fractions are of these figures, named in the calibration's source.
2. Each case: ``diffmeter bench`` (random weights, float32, 2 threads, one warm-up, 3 measured calls,
   ``--trace``), stage medians and every traced operator's self time by kind, against the prediction
   from the same settings (``predict.operators`` on fake tensors, ``predict.roofline``).
3. Calibration, per operator kind: achieved fraction = the kind's roofline lower bound / its measured
   time (the traced call's self time of that kind, scaled to the stage's measured median), summed over
   the run's stages; and the time outside operators per predicted operator. The shipped calibration is
   the lowest and highest of each over the runs (``measure/calibrate.py``). Not written when other processes
   used more than half a core during a run (its times, so its fractions, would be another machine's): then
   nothing is written.
4. Checks: the lower bound is at most the fastest measured call of each stage; the expected range,
   calibrated on the OTHER cases only (leave one case out), holds the measured median.

Run from the repo root:  python benchmarks/roofline_cpu.py [--no-write-calibration]  (about 20 minutes
on 2 cores). Writes benchmarks/results/roofline_cpu.md and the "cpu" calibration.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "roofline_cpu.md"
CALIBRATION = ROOT / "src" / "diffmeter" / "predict" / "data" / "efficiency.json"
RUNS = Path(os.environ.get("ROOFLINE_RUNS", "/work/scratch/roofline_runs"))
#: (model, px, steps): a UNet pipeline and a DiT pipeline, each at two sizes
CASES = [("sd15", 256, 4), ("sd15", 384, 3), ("dit-xl-2-256", 256, 4), ("dit-xl-2-512", 512, 2)]
STAGES = ("text_encoding", "denoising", "vae_decode")


def peaks():
    from diffmeter.predict.cpu_peaks import measure_cpu_peaks

    return measure_cpu_peaks(("fp32",), budget_s=1.0)


def fitted_device(before, after):
    """This CPU as the fit sees it: the higher of each figure measured before and after the runs."""
    from diffmeter.predict.devices import Device

    tflops = {key: max(before.tflops[key], after.tflops[key]) for key in before.tflops}
    bandwidth = max(before.bandwidth_bytes_per_s, after.bandwidth_bytes_per_s)
    return Device(
        name="this CPU",
        kind="cpu",
        memory_bytes=None,
        bandwidth_bytes_per_s=bandwidth,
        tflops=tflops,
        source="measured before and after the runs",
    )


def run_case(model: str, size: int, steps: int) -> dict:
    from diffmeter.measure.calibrate import stage_measurements
    from diffmeter.predict.operators import operator_work
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec(
        model=model,
        height=size,
        width=size,
        steps=steps,
        dtype="float32",
        device="cpu",
        random_weights=True,
        warmup=1,
        iterations=3,
        trace=True,
        save_images=False,
        predict=False,
    )
    result, _ = bench(spec, out=RUNS, force=True)
    others = result.summary.conditions.other_processes_cores if result.summary.conditions else None
    return {
        "model": model,
        "size": size,
        "steps": steps,
        "latency_s": result.summary.latency_s.median,
        "other_cores": others.mean if others else None,
        "stages": stage_measurements(result),
        "work": operator_work(result.spec.profile_spec()),
    }


def main() -> None:
    write = "--no-write-calibration" not in sys.argv
    import torch

    torch.set_num_threads(2)
    from diffmeter.predict.cpu_peaks import cpu_name
    from diffmeter.predict.peaks import conv_key

    started = time.time()
    before = peaks()
    cases = []
    for model, size, steps in CASES:
        print(f"{model} {size}px {steps} steps ...", flush=True)
        cases.append(run_case(model, size, steps))
        shutil.rmtree(RUNS, ignore_errors=True)  # traces are large; the figures are kept here
    after = peaks()
    device = fitted_device(before, after)
    matmul, convolution = device.tflops["fp32"] * 1e12, device.tflops[conv_key("fp32")] * 1e12
    bandwidth = device.bandwidth_bytes_per_s
    from diffmeter.measure.calibrate import MIN_SHARE, calibrate
    from diffmeter.measure.conditions import BUSY_CORES
    from diffmeter.predict.expected_range import expected_s
    from diffmeter.predict.roofline import flop_rates, lower_bounds

    lowers = [lower_bounds(case["work"], flop_rates(device, case["work"]), bandwidth) for case in cases]
    source = (
        f"benchmarks/roofline_cpu.py on {cpu_name()} (2 threads, float32): {len(cases)} real-size random-weight "
        f"runs ({', '.join(f'{c[0]} {c[1]}px' for c in CASES)}), {time.strftime('%Y-%m-%d')}; fractions of "
        f"{matmul / 1e9:,.0f} GFLOP/s matmul, {convolution / 1e9:,.0f} GFLOP/s convolution, {bandwidth / 1e9:,.0f} "
        "GB/s copy measured then, applied to the peaks measured on the machine predicted"
    )
    busy = [c for c in cases if c["other_cores"] is not None and c["other_cores"] > BUSY_CORES]
    shipped = calibrate([(case["stages"], lower) for case, lower in zip(cases, lowers, strict=True)], source)
    shipped = shipped.model_copy(update={"fitted_tflops": device.tflops})  # the peaks its fractions are of
    lines = [
        "# Roofline time prediction against real CPU runs",
        "",
        f"Machine: {cpu_name()}, 2 torch threads, float32, random weights at real size (sizes and operators "
        "are real; images are noise). Each run: 1 warm-up call, 3 measured calls, 1 traced call (`bench --trace`).",
        "",
        f"Peaks measured before / after the runs: matmul {before.tflops['fp32'] * 1e3:,.1f} / "
        f"{after.tflops['fp32'] * 1e3:,.1f} GFLOP/s, convolution {before.tflops[conv_key('fp32')] * 1e3:,.1f} / "
        f"{after.tflops[conv_key('fp32')] * 1e3:,.1f} GFLOP/s, copy {before.bandwidth_bytes_per_s / 1e9:,.1f} / "
        f"{after.bandwidth_bytes_per_s / 1e9:,.1f} GB/s. The roofline uses the higher of each: "
        f"{matmul / 1e9:,.1f} GFLOP/s for matmuls and attention, {convolution / 1e9:,.1f} GFLOP/s for convolutions "
        f"(PyTorch runs them on oneDNN, its float32 matmuls on MKL's SGEMM), {bandwidth / 1e9:,.1f} GB/s.",
        "",
        "## Each stage: lower bound, expected range (calibrated on the other cases), measured",
        "",
        "| run | stage | FLOPs | bytes moved | lower bound | fastest call | bound <= fastest | expected "
        "(leave-one-out) | measured median | in range |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    failures = 0
    inside = {"stages": [], "wholes": []}  # held out a run at a time: each stage's and each generation's verdict
    for index, (case, lower) in enumerate(zip(cases, lowers, strict=True)):
        held_out = calibrate(
            [(c["stages"], x) for i, (c, x) in enumerate(zip(cases, lowers, strict=True)) if i != index], "others"
        )
        ranges = {
            stage: expected_s(kinds, int(sum(count for _, count in kinds.values())), held_out)
            for stage, kinds in lower.items()
        }
        total_lower = total_low = total_high = total_measured = 0.0
        work = case["work"].calls
        for stage in STAGES:
            if stage not in lower or stage not in case["stages"]:
                continue
            measured = case["stages"][stage]
            seconds = sum(s for s, _ in lower[stage].values())
            flops = sum(g.flops * g.calls * c.count for c in work if c.stage == stage for g in c.operators)
            moved = sum(g.bytes * g.calls * c.count for c in work if c.stage == stage for g in c.operators)
            low, high = ranges[stage]
            bound_ok = seconds <= measured.min_s
            in_range = low <= measured.median_s <= high
            inside["stages"].append(in_range)
            failures += (not bound_ok) + (not in_range)
            total_lower, total_low, total_high = total_lower + seconds, total_low + low, total_high + high
            total_measured += measured.median_s
            lines.append(
                f"| {case['model']} {case['size']}px, {case['steps']} steps | {stage} | {flops / 1e12:,.3f} T | "
                f"{moved / 1e9:,.2f} GB | {seconds:,.2f} s | {measured.min_s:,.2f} s | "
                f"{'yes' if bound_ok else 'NO'} "
                f"| {low:,.2f}-{high:,.2f} s | {measured.median_s:,.2f} s | {'yes' if in_range else 'NO'} |"
            )
        inside["wholes"].append(total_low <= total_measured <= total_high)
        lines.append(
            f"| {case['model']} {case['size']}px | **three stages** | | | {total_lower:,.2f} s | | | "
            f"{total_low:,.2f}-{total_high:,.2f} s | {total_measured:,.2f} s (whole call {case['latency_s']:,.2f} s) "
            f"| {'yes' if total_low <= total_measured <= total_high else 'NO'} |"
        )
    wholes, stages = inside["wholes"], inside["stages"]
    claim = (
        f"; held out a run at a time: {sum(wholes)} of {len(wholes)} generations inside their range ({sum(stages)} "
        f"of {len(stages)} stages) (benchmarks/results/roofline_cpu.md)"
    )
    shipped = shipped.model_copy(update={"source": shipped.source + claim})  # the claim every CPU range prints
    lines += [
        "",
        f"## Calibration shipped for CPUs (all {len(cases)} runs)",
        "",
        "Achieved fraction of the roofline per operator kind (lower bound of the kind / its measured time), "
        f"summed over each run's stages, lowest and highest over the runs where the kind took at least {MIN_SHARE:.0%} "
        "of the run's time:",
        "",
        "| kind | lowest | highest |",
        "|---|---:|---:|",
        *[f"| {kind} | {low:.3f} | {high:.3f} |" for kind, (low, high) in shipped.fractions.items()],
        "",
        f"Time outside operators (Python, the pipeline's code, dispatch) per operator: "
        f"{shipped.overhead_s[0] * 1e6:,.1f} to {shipped.overhead_s[1] * 1e6:,.1f} µs.",
        "",
        f"Least eager lower bound per operator of any run: {shipped.least_bound_per_operator_s * 1e6:,.1f} µs; a "
        "prediction whose operators are smaller on average is said to be outside the fitted runs.",
        "",
        "Other processes during the measured calls (`bench`'s conditions), in cores of 2: "
        + "; ".join(
            f"{c['model']} {c['size']}px: {c['other_cores']:.1f}" if c["other_cores"] is not None else "not recorded"
            for c in cases
        ),
        "",
        f"Checks failed: {failures}. Took {(time.time() - started) / 60:,.1f} minutes.",
    ]
    print("\n".join(lines))
    busy = [f"{c['model']} {c['size']}px ({c['other_cores']:.1f})" for c in busy] + [
        f"the peaks {when} ({p.others_cores:.1f})" for when, p in (("before", before), ("after", after)) if p.busy
    ]
    if busy:
        print(
            f"NOTHING written: other processes used more than {BUSY_CORES} cores during {', '.join(busy)}; rerun on a"
            " quiet machine."
        )
        return
    OUT.write_text("\n".join(lines) + "\n")
    if write:
        stored = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {}
        kept = stored.get("cpu", {}).get("variants")  # the bfloat16 and compiled fits (roofline_cpu_variants.py)
        stored["cpu"] = shipped.model_dump(mode="json") | ({"variants": kept} if kept else {})
        CALIBRATION.write_text(json.dumps(stored, indent=2) + "\n")


if __name__ == "__main__":
    main()
