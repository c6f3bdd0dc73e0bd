"""The optimization ladder on a real-size architecture, measured on this CPU machine.

Stable Diffusion 1.5 (860M-parameter UNet, CLIP-L, KL VAE) with random weights built from the
catalog config (no download), 256x256, batch 1, classifier-free guidance 7.5, float32:
baseline with the pipeline's scheduler at 20 steps, then + DPM++ 2M at 10 steps, + torch.compile
(inductor, default mode), + bfloat16, + DeepCache. The attention rung is skipped on CPU (flash
kernels are CUDA-only) and the table says so.

Before anything runs, every rung is predicted on this CPU (``runs.ladder_prediction``: the prediction bench stores
beside each run, from the rung's spec alone); after the ladder, each rung's measured median is placed inside or
outside its range, and a rung whose technique the expected time leaves out is "not timed" (no range invented).

This is the tool working end to end at real size, not a statement about GPUs: CPU kernels,
compile gains and bf16 behave differently there. Images are noise (random weights), so PSNR/SSIM
say how far each rung moves the output, not how good it looks.

Run from the repo root:  python benchmarks/ladder_cpu.py    (15 to 25 minutes on 2 cores)
The report is printed and written to benchmarks/results/ladder_cpu.md (the ladder as data in
ladder_cpu.json, the predictions beside the measured medians in predicted_ladder_cpu.json); the runs land in
benchmarks/results/ladder_cpu_runs/ (ignored by git).
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

# a fresh inductor cache, so the compile rung's cold start is a real compilation
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="diffmeter-inductor-")

import diffusers  # noqa: E402  (after the cache location is set)
import torch  # noqa: E402
import transformers  # noqa: E402
from rich.console import Console  # noqa: E402

from diffmeter import units  # noqa: E402
from diffmeter.measure.conditions import BUSY_CORES  # noqa: E402
from diffmeter.predict.cpu_peaks import remeasure  # noqa: E402
from diffmeter.report.ladder_table import ladder_table  # noqa: E402
from diffmeter.runs.ladder import climb, plan  # noqa: E402
from diffmeter.runs.ladder_prediction import RungPrediction, predict_rungs  # noqa: E402
from diffmeter.runs.spec import BenchSpec  # noqa: E402
from diffmeter.runs.storage import read_result  # noqa: E402

HERE = Path(__file__).parent / "results"
RUNS = HERE / "ladder_cpu_runs"
CALIBRATION_FILE = HERE.parent.parent / "src" / "diffmeter" / "predict" / "data" / "efficiency.json"


def main() -> None:
    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    spec = BenchSpec(
        model="sd15", height=256, width=256, steps=20, device="cpu", warmup=1, iterations=2, random_weights=True
    )
    start = time.perf_counter()
    load = os.getloadavg()[0]
    rungs = plan(spec, ("scheduler", "compile", "half", "attention", "cache"), fast_steps=10, compile_mode="default")
    peaks = remeasure(budget_s=1.0)  # the host's speed moves: the fractions apply to its peaks now, as fitted
    ranges = predict_rungs(rungs)  # before anything is loaded or measured
    predicted_at = datetime.now(timezone.utc).replace(microsecond=0)  # as a run's stored time (whole seconds)
    print("\n".join(["predicted before the ladder runs:", *(_predicted(p) for p in ranges)]), flush=True)
    ladder = climb(rungs, RUNS)
    verdicts = _verdicts(ranges, ladder, predicted_at)
    minutes = (time.perf_counter() - start) / 60
    load_end = os.getloadavg()[0]
    measured = {row.rung: row.latency_s for row in ladder.rows}
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(ladder_table(ladder))
    report = "\n".join(
        [
            "# Optimization ladder: SD 1.5 (random weights) on CPU",
            "",
            f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; device: CPU, "
            f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}); no GPU was lent to this task",
            f"- torch {torch.__version__}, diffusers {diffusers.__version__}; {torch.get_num_threads()} torch threads",
            f"- 256x256, batch 1, guidance 7.5, 1 warm-up + 2 measured calls per rung; "
            f"1-minute load average at start {load:.2f}, at the end {load_end:.2f} (2 cores, shared with other "
            f"work); whole ladder {minutes:.1f} min; inductor started from an empty cache",
            f"- this CPU's peaks measured again before the predictions (as `diffmeter doctor --remeasure-cpu`, 1 s "
            "per shape; the fits' fractions are of the higher of the peaks measured before and after their runs): "
            f"{_peaks_of(peaks)}",
            "",
            "```",
            "\n".join(line.rstrip() for line in buffer.getvalue().rstrip().splitlines()),
            "```",
            "",
            "Each rung against the one above it (latency ratio, > 1 is faster): " + _steps(ladder) + ".",
            "",
            *_prediction_section(ranges, measured, spec, ladder, verdicts),
            "",
            f"Reading it: on this 2-core CPU, torch.compile {_compile_effect(ladder)}, and every change of dtype",
            f"recompiles (the cold start of the half and cache rungs); bfloat16 is fast because {_bf16_units()}",
            f"({_peaks()}). With random weights the images are noise, so the PSNR/SSIM drop at bfloat16 measures",
            "how far rounding moves an untrained network's output, not visible quality. The seed tutorial's GPU",
            "table (DPM++ 2M 1.0 s, + compile 0.6 s, + fp16 0.4 s at 512x512) cannot be checked here: no GPU.",
            "",
        ]
    )
    print(report)
    (HERE / "ladder_cpu.md").write_text(report)
    (HERE / "ladder_cpu.json").write_text(ladder.model_dump_json(indent=2) + "\n")
    rows = [{**vars(p), "measured_s": measured.get(p.rung), "verdict": verdicts[p.rung]} for p in ranges]
    (HERE / "predicted_ladder_cpu.json").write_text(json.dumps(rows, indent=2) + "\n")
    record_held_out(rows)


def record_held_out(rows: list[dict]) -> None:
    """Each CPU variant fit's held-out figure, this ladder's verdicts on the rungs it priced (none of its runs is in
    that fit), written into the shipped calibration: its range then says how it held wherever it is shown."""
    stored = json.loads(CALIBRATION_FILE.read_text())
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    for variant in stored["cpu"].get("variants", {}).values():
        fitted = variant["source"].removesuffix(f"; {variant.get('held_out')}")
        priced = [
            row
            for row in rows
            if row["calibration"] and fitted in row["calibration"] and row["verdict"].startswith(("inside", "outside"))
        ]
        if not priced:
            continue
        inside = sum(row["verdict"] == "inside" for row in priced)
        verdicts = ", ".join(f"{row['rung']} {row['verdict'].removeprefix('outside: ')}" for row in priced)
        variant["held_out"] = (
            f"held out on the CPU ladder (SD 1.5, 256 px, {when}, benchmarks/results/ladder_cpu.md): {inside} of "
            f"{len(priced)} rungs inside ({verdicts})"
        )
        variant["source"] = f"{fitted}; {variant['held_out']}"
    CALIBRATION_FILE.write_text(json.dumps(stored, indent=2) + "\n")


def _compile_effect(ladder) -> str:
    """What compile did to the float32 UNet, against the eager rung; nothing where either was slowed by others."""
    rows = {row.rung: row for row in ladder.rows if row.latency_s}
    if "compile" not in rows or "scheduler" not in rows:
        return "did not run"
    eager, compiled = rows["scheduler"], rows["compile"]
    busy = [(row.rung, row.conditions.other_processes_cores) for row in (eager, compiled) if row.conditions]
    busy = [(rung, cores.mean) for rung, cores in busy if cores and cores.mean > BUSY_CORES]
    if busy:
        return (
            "cannot be judged in this run (other processes used "
            + ", ".join(f"{cores:.1f} cores during the {rung} rung" for rung, cores in busy)
            + f"; eager {eager.latency_s:.1f} s, compiled {compiled.latency_s:.1f} s)"
        )
    ratio = eager.latency_s / compiled.latency_s
    return f"made the float32 UNet {'faster' if ratio > 1 else 'slower'} ({ratio:.2f}x the eager rung's speed)"


def _peaks() -> str:
    from diffmeter.predict.devices import this_cpu
    from diffmeter.predict.peaks import conv_key

    tflops = this_cpu("float32", "bfloat16").tflops
    bf16, fp32, conv = tflops["bf16"] * 1e3, tflops["fp32"] * 1e3, tflops[conv_key("fp32")] * 1e3
    return (
        f"matmuls measured at {bf16:,.0f} GFLOP/s in bfloat16, {fp32:,.0f} GFLOP/s in float32; float32 "
        f"convolutions at {conv:,.0f} GFLOP/s"
    )


def _peaks_of(peaks) -> str:
    rates = ", ".join(f"{kind} {tflops * 1e3:,.0f}" for kind, tflops in sorted(peaks.tflops.items()))
    busy = f" (other processes used {peaks.others_cores:.1f} cores meanwhile)" if peaks.busy else ""
    return f"{rates} GFLOP/s, copy {peaks.bandwidth_bytes_per_s / 1e9:,.0f} GB/s{busy}"


def _bf16_units() -> str:
    """What runs this CPU's bfloat16 matmuls, from its flags (/proc/cpuinfo): AMX tiles, AVX512-BF16 or neither."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "of its bfloat16 units"
    words = set(flags.split(":", 1)[1].split())
    if "amx_bf16" in words:
        return "the CPU has AMX tiles"
    if "avx512_bf16" in words:
        return "the CPU has AVX512-BF16 instructions (no AMX tiles)"
    return "of how oneDNN runs bfloat16 here (no AMX nor AVX512-BF16 flag)"


def _range(p: RungPrediction) -> str:
    return f"{p.expected_s[0]:.1f} s to {p.expected_s[1]:.1f} s" if p.expected_s else "not timed"


def _predicted(p: RungPrediction) -> str:
    bound = f"; eager lower bound {p.lower_s:.1f} s" if p.lower_s is not None else ""
    return f"  {p.rung}: {_range(p)}{bound}" + (f" ({p.untimed})" if p.untimed else "")


def _recheck(baseline: RungPrediction, seconds: float) -> str:
    return f"- baseline measured again after the last rung: {seconds:.2f} s, {baseline.verdict(seconds)}"


def _stored_differs(predictions: list[RungPrediction], folders: dict) -> str:
    """Whether each rung's stored prediction gives the range predicted before it ran."""
    differ = []
    for p in predictions:
        if folders.get(p.rung) is None:
            continue
        prediction = read_result(folders[p.rung]).prediction
        stored = prediction.time.expected_s if prediction and prediction.time else None
        if p.expected_s is not None and (
            stored is None or any(abs(a / b - 1) > 1e-6 for a, b in zip(stored, p.expected_s, strict=True))
        ):
            differ.append(f"{p.rung} stored {stored}")
    return "differs: " + "; ".join(differ) if differ else "the same range for every timed rung"


def _verdicts(predictions: list[RungPrediction], ladder, predicted_at: datetime) -> dict[str, str]:
    """Each rung's verdict; a rung reused from a run stored before these predictions were made is no check of them."""
    measured = {row.rung: row for row in ladder.rows if row.latency_s}
    found = {}
    for p in predictions:
        row = measured.get(p.rung)
        earlier = row is not None and row.measured_utc and datetime.fromisoformat(row.measured_utc) < predicted_at
        found[p.rung] = (
            f"reused: measured before this prediction ({row.measured_utc[:16]} UTC), no check of it; delete "
            f"{RUNS.name}/ to measure it again"
            if earlier
            else p.verdict(row.latency_s if row else None)
        )
    return found


def _prediction_section(
    predictions: list[RungPrediction], measured: dict, spec: BenchSpec, ladder, verdicts: dict[str, str]
) -> list[str]:
    """Each rung's range, predicted before the ladder ran, beside its measured median, and where the ranges'
    fitted figures come from (held out or not)."""
    others = {row.rung: row.conditions.other_processes_cores for row in ladder.rows if row.conditions}
    ladder_folders = {row.rung: row.folder for row in ladder.rows}
    lines = [
        "## Each rung predicted before it ran (`profile --gpu cpu`, as bench stores it) against its measured median",
        "",
        "| rung | predicted per call | eager lower bound | measured median | other processes (cores of 2) | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for p in predictions:
        seconds = measured.get(p.rung)
        other = others.get(p.rung)
        lines.append(
            f"| {p.rung} | {_range(p)} | {units.seconds(p.lower_s) if p.lower_s is not None else '-'} | "
            f"{f'{seconds:.2f} s' if seconds is not None else '-'} | "
            f"{f'{other.mean:.1f} (up to {other.max:.1f})' if other else '-'} | {verdicts[p.rung]}"
            + (f": {', '.join(item.split(': ')[0] for item in p.left_out)}" if p.left_out else "")
            + (f" ({p.untimed})" if p.untimed and not p.left_out else "")
            + " |"
        )
    left_out = list(dict.fromkeys(item for p in predictions for item in p.left_out))
    lines += ["", *(f"- not timed, {item}" for item in left_out)]
    if ladder.baseline_recheck_s is not None and predictions and predictions[0].rung == "baseline":
        lines.append(_recheck(predictions[0], ladder.baseline_recheck_s))
    stored = _stored_differs(predictions, ladder_folders)
    lines += [f"- bench's stored prediction (results.json, made after each run): {stored}"]
    sources = list(dict.fromkeys(fit for p in predictions if p.calibration for fit in _fits(p.calibration)))
    fitted = f"{spec.model} {spec.height}px"
    lines += [f"- expected range's achieved fractions: {source}" for source in sources]
    if any(source.startswith("benchmarks/roofline_cpu.py") for source in sources):
        lines.append(
            "- the float32 fit's own held-out check (each of its runs predicted from the others' fractions): "
            "benchmarks/results/roofline_cpu.md"
        )
    if any(fitted in source for source in sources if source.startswith("benchmarks/roofline_cpu.py")):
        lines.append(
            "- not held out: the float32 eager fractions (the baseline and scheduler rungs, the compile rung's eager "
            f"text encoder and VAE decode) were fitted on runs that include {fitted} (4 steps, roofline_cpu.py's own "
            "run), the model and size of every rung here; no fraction was fitted on this ladder's runs"
        )
    if any(source.startswith("benchmarks/roofline_cpu_variants.py") for source in sources):
        lines.append(
            "- held out: the bfloat16 and compiled fractions (the compile rung's UNet, every call of the half and "
            f"cache rungs) were fitted on runs without {fitted} (benchmarks/results/roofline_cpu_variants.md): those "
            "rungs are their held-out check, their ranges written before the ladder ran and not changed after"
        )
    return lines


def _fits(calibration: str) -> list[str]:
    """The sources of the fits a rung's range used (``Calibration.source_for`` joins them)."""
    return re.split(r"; (?=benchmarks/)", calibration)


def _steps(ladder) -> str:
    rows = [row for row in ladder.rows if row.latency_s]
    return ", ".join(
        f"{row.rung} {previous.latency_s / row.latency_s:.2f}x" for previous, row in zip(rows, rows[1:], strict=False)
    )


if __name__ == "__main__":
    main()
