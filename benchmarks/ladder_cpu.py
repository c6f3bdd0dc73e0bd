"""The optimization ladder on a real-size architecture, measured on this CPU machine.

Stable Diffusion 1.5 (860M-parameter UNet, CLIP-L, KL VAE) with random weights built from the
catalog config (no download), 256x256, batch 1, classifier-free guidance 7.5, float32:
baseline with the pipeline's scheduler at 20 steps, then + DPM++ 2M at 10 steps, + torch.compile
(inductor, default mode), + bfloat16, + DeepCache. The attention rung is skipped on CPU (flash
kernels are CUDA-only) and the table says so.

This is the tool working end to end at real size, not a statement about GPUs: CPU kernels,
compile gains and bf16 behave differently there. Images are noise (random weights), so PSNR/SSIM
say how far each rung moves the output, not how good it looks.

Run from the repo root:  python benchmarks/ladder_cpu.py    (15 to 25 minutes on 2 cores)
The report is printed and written to benchmarks/results/ladder_cpu.md; the runs land in
benchmarks/results/ladder_cpu_runs/ (ignored by git).
"""

from __future__ import annotations

import io
import os
import platform
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import diffusers
import torch
import transformers
from rich.console import Console

from diffmeter.bench.ladder import climb, plan
from diffmeter.bench.spec import BenchSpec
from diffmeter.report.ladder_table import ladder_table

HERE = Path(__file__).parent / "results"
RUNS = HERE / "ladder_cpu_runs"


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
    ladder = climb(rungs, RUNS)
    minutes = (time.perf_counter() - start) / 60
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
            f"1-minute load average at start {load:.2f}; whole ladder {minutes:.1f} min",
            "",
            "```",
            buffer.getvalue().rstrip(),
            "```",
            "",
        ]
    )
    print(report)
    (HERE / "ladder_cpu.md").write_text(report)


if __name__ == "__main__":
    main()
