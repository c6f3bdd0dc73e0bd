"""How much does measuring cost? The runner's per-call time against a bare loop of pipe(...).

For each setting, one tiny pipeline object is called in interleaved pairs:
  bare:    t = perf_counter(); pipe(**arguments); perf_counter() - t
  runner:  diffmeter.runs.calls.timed_call: the exact code of one measured iteration
           (stage hooks on text encoders, denoiser, scheduler.step and vae.decode; the
           ``total_s`` it records, and the host ``wall_s`` around it)
Pairs alternate which call goes first, so drift, frequency changes and cache effects hit
both alike; the overhead is the median over pairs of runner wall_s / bare. Target: within 3%.

Run from the repo root:  python benchmarks/overhead.py    (about two minutes on 2 cores)
The report is printed and written to benchmarks/results/overhead.md.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import diffusers
import torch
import transformers

from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.measure.clock import HostClock
from diffmeter.measure.stages import StageTimer
from diffmeter.runs.calls import timed_call
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.workload import Workload
from diffmeter.tiny import tiny_pipeline

PAIRS, TARGET = 60, 0.03
SETTINGS = [  # (model, height, steps): a very short call first, the worst case for overhead
    ("tiny-sd", 32, 2),
    ("tiny-sd", 64, 20),
    ("tiny-flux", 64, 20),
]
RESULTS = Path(__file__).parent / "results" / "overhead.md"


def measure(name: str, size: int, steps: int) -> dict:
    entry = resolve(name)
    family = get_family(entry.family)
    spec = BenchSpec(model=name, height=size, width=size, steps=steps).settle(entry)
    workload = Workload(spec, entry)
    pipe = tiny_pipeline(entry)
    arguments = workload.call_arguments(pipe, workload.batch(0))
    timer = StageTimer(pipe, list(family.text_encoders), family.denoiser, family.decoder, HostClock())

    def bare() -> float:
        arguments["generator"][0].manual_seed(spec.seed)
        start = time.perf_counter()
        pipe(**arguments)
        return time.perf_counter() - start

    def runner() -> tuple[float, float]:
        arguments["generator"][0].manual_seed(spec.seed)
        with timer:
            iteration, _ = timed_call(pipe, timer, arguments, 0, None)
        return iteration.total_s, iteration.wall_s

    bare(), runner()  # warm-up
    bare_s, total_s, wall_s = [], [], []
    for pair in range(PAIRS):
        if pair % 2:
            bare_s.append(bare())
        total, wall = runner()
        total_s.append(total)
        wall_s.append(wall)
        if not pair % 2:
            bare_s.append(bare())
    return {
        "setting": f"{name} {size}x{size}, {steps} steps",
        "bare": statistics.median(bare_s),
        "total": statistics.median(total_s),
        "wall": statistics.median(wall_s),
        "ratio": statistics.median(w / b for w, b in zip(wall_s, bare_s, strict=True)),
    }


def main() -> None:
    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    load = os.getloadavg()[0]
    rows = [measure(*setting) for setting in SETTINGS]
    lines = [
        "# Measurement overhead: runner vs a bare `pipe(...)` loop",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
        f"torch {torch.__version__}, diffusers {diffusers.__version__}; device: CPU (host clock)",
        f"- {PAIRS} interleaved pairs per setting; medians; 1-minute load average {load:.2f}",
        "",
        "| setting | bare loop (ms) | runner total_s (ms) | runner wall_s (ms) | runner / bare, median of pairs "
        "| within 3% |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["ratio"]
        lines.append(
            f"| {row['setting']} | {1e3 * row['bare']:.2f} | {1e3 * row['total']:.2f} | {1e3 * row['wall']:.2f} "
            f"| {ratio:.4f} | {'PASS' if abs(ratio - 1) <= TARGET else 'FAIL'} |"
        )
    lines += [
        "",
        "runner / bare compares the host wall time around the runner's call (hooks, marks and",
        "the StageTimer's bookkeeping included) with the bare call next to it. total_s is what",
        "results.json stores; it excludes the bookkeeping after the last mark. The hooks cost",
        "microseconds per step, so what remains of the ratio's distance from 1 is this machine's noise.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    RESULTS.write_text(report)


if __name__ == "__main__":
    main()
