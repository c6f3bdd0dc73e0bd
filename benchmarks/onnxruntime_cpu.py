"""PyTorch eager vs ONNX Runtime (CPU provider) on Stable Diffusion 1.5, real size, random weights.

One run of this script measures both, side by side: `diffmeter bench sd15 --random-weights
--opt onnxruntime:release_weights=true --compare-baseline`, which first measures the PyTorch
pipeline (the baseline), then the same pipeline with its UNet exported to ONNX and run by ONNX
Runtime, and compares the images at the same seeds. The export goes to a fresh cache folder, so
its time is in the ONNX run's cold call. release_weights moves the PyTorch UNet's weights to the
meta device once exported, so that only ONNX Runtime's copy is meant to stay (the process's RSS
did not show it in the committed run: see its notes).

A small resolution and few steps (256x256, 5 steps, 3 calls each) are meant to keep it short; on
the shared 2-core machine of the committed run it took 16 minutes. The figures are for random
weights (images are noise, PSNR compares two runtimes computing the same noise).

Run from the repo root:  python benchmarks/onnxruntime_cpu.py
The report is printed and written to benchmarks/results/onnxruntime_cpu.md.
"""

from __future__ import annotations

import os
import platform
import resource
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import diffusers
import onnxruntime
import torch
import transformers

from diffmeter import units
from diffmeter.optimize import OptimizationSpec
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import read_result

SETTINGS = dict(model="sd15", random_weights=True, height=256, width=256, steps=5, iterations=3, warmup=1)
RESULTS = Path(__file__).parent / "results" / "onnxruntime_cpu.md"


def main() -> None:
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        os.environ["DIFFMETER_CACHE_DIR"] = cache  # a cold export, measured in the ONNX run's first call
        spec = BenchSpec(
            **SETTINGS,
            compare_baseline=True,
            optimizations=[OptimizationSpec(name="onnxruntime", params={"release_weights": True})],
        )
        ort, _ = bench(spec, out=out)
        baseline = read_result(ort.speedup.baseline)
        exported = sum(path.stat().st_size for path in Path(cache).rglob("*") if path.is_file())
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report = _report(baseline, ort, exported, peak_rss, time.perf_counter() - started)
    RESULTS.write_text(report)
    print(report)


def _row(name: str, result) -> str:
    summary = result.summary
    stages = summary.stages_s
    return (
        f"| {name} | {units.seconds(summary.latency_s.median)} "
        f"({units.seconds(summary.latency_s.ci_low)}-{units.seconds(summary.latency_s.ci_high)}) "
        f"| {units.seconds(summary.step_s.median)} | {units.seconds(stages['text_encoding'].median)} "
        f"| {units.seconds(stages['vae_decode'].median)} | {units.seconds(result.first_call_s)} "
        f"| {units.seconds(summary.cold_start_overhead_s)} "
        f"| {units.gib(summary.peak_memory.process_peak_rss_bytes)} ({summary.peak_memory.process_peak_rss_scope}) |"
    )


def _report(baseline, ort, exported: int, peak_rss: int, elapsed: float) -> str:
    quality, speedup = ort.quality, ort.speedup
    psnr = "identical 8-bit images" if quality.identical == len(quality.images) else f"{quality.min_psnr_db:.1f} dB"
    spec = ort.spec
    return "\n".join(
        [
            "# PyTorch eager vs ONNX Runtime on CPU: Stable Diffusion 1.5, real size, random weights",
            "",
            f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/onnxruntime_cpu.py` in "
            f"{elapsed / 60:.1f} min on {platform.processor() or platform.machine()} "
            f"({os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, shared with other work): "
            f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, diffusers {diffusers.__version__}.",
            "",
            f"Both runs in one process, one after the other: {spec.width}x{spec.height} px, {spec.steps} steps, "
            f"batch {spec.batch_size}, guidance {spec.guidance_scale:g} (CFG: the UNet runs on a batch of 2), "
            f"{spec.dtype}, {spec.warmup} warm-up and {spec.iterations} measured calls each. Small size and few steps "
            "keep the run to minutes on 2 cores; per-step figures are what carries over to longer runs. Random "
            "weights: the images are noise, and the comparison says the two runtimes compute the same noise.",
            "",
            "| runtime | median call (95% interval) | one step | text encoding | VAE decode | first call | "
            "cold start | peak RSS |",
            "|---|---|---|---|---|---|---|---|",
            _row("PyTorch eager", baseline),
            _row("ONNX Runtime (UNet), CPU provider", ort),
            "",
            f"- speed-up of ONNX Runtime over eager: x{speedup.factor:.2f} (interval x{speedup.ci_low:.2f}-"
            f"x{speedup.ci_high:.2f}, {100 * speedup.ci_level:.0f}% at least)",
            f"- images at the same seeds: {psnr}, mean SSIM {quality.mean_ssim:.4f}",
            f"- the ONNX run's cold start includes exporting the UNet with torch.onnx (dynamo) and building the "
            f"session; exported files: {units.gib(exported)}",
            f"- peak RSS of the whole script (both runs, export included): {units.gib(peak_rss)}",
            "- only the UNet runs in ONNX Runtime; text encoder, scheduler and VAE decode are PyTorch in both runs, "
            "so their columns should agree",
            "",
        ]
    )


if __name__ == "__main__":
    main()
