"""Predicted peak memory against the real CPU run, at real size with random weights.

Cases (each in its own process, one at a time, every process under ~6 GB of RSS):
1. SD 1.5, the whole pipeline (text encoding, 1 denoising step with CFG batch 2, VAE decode) in
   float32 at 256 and 512 px: predicted peak per stage and for the whole generation
   (``diffmeter.predict.memory.predict_memory``) against torch.profiler's memory timeline of the real
   call (``diffmeter.measure.memory_timeline``), parameters resident included.
2. SD3-medium's MMDiT (2.0B parameters, bfloat16) alone, one CFG-batched call at 128 and 256 px.
3. Wan 2.1 1.3B's video DiT (bfloat16) alone, one call, 5 frames at 128 and 256 px; and its causal
   video VAE (float32) decoding the same latents.
Sizes are small because bfloat16 runs slowly on CPU (SD3's MMDiT at 256 px: about 5 minutes).
A component alone is compared on its own parameters, inputs and activations (the 4.7B-parameter
T5/UMT5 encoders of cases 2-3 would not fit the RSS budget). Random weights: sizes are real, images
are noise. The measured peaks are shown without and with CPU convolution scratch buffers (allocated and
freed inside a convolution kernel; no tensor holds them, so the prediction, which counts tensors, does
not include them).

Run from the repo root:  python benchmarks/memory_prediction_cpu.py   (about 20 minutes on 2 cores)
Writes benchmarks/results/memory_prediction_cpu.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "memory_prediction_cpu.md"
CASES = [
    ("pipeline", "sd15", None, 256, None, "float32"),
    ("pipeline", "sd15", None, 512, None, "float32"),
    ("component", "sd3-medium", "transformer", 128, None, "bfloat16"),
    ("component", "sd3-medium", "transformer", 256, None, "bfloat16"),
    ("component", "wan21-t2v-1.3b", "transformer", 128, 5, "bfloat16"),
    ("component", "wan21-t2v-1.3b", "transformer", 256, 5, "bfloat16"),
    ("component", "wan21-t2v-1.3b", "vae", 128, 5, "float32"),
    ("component", "wan21-t2v-1.3b", "vae", 256, 5, "float32"),
]


def run_pipeline(model: str, size: int, dtype: str) -> list[dict]:
    import torch

    from diffmeter.loading import random_pipeline
    from diffmeter.measure.memory_timeline import measure_stage_peaks
    from diffmeter.predict.memory import STAGE_OF_ROLE, predict_memory, settled_plan
    from diffmeter.spec import ProfileSpec

    spec = ProfileSpec(model=model, height=size, width=size, steps=1, dtype=dtype)
    started = time.perf_counter()
    predicted = predict_memory(spec, on_cuda=False)  # against the CPU run: no cuDNN convolution copies
    predict_s = time.perf_counter() - started
    entry, settled, plan = settled_plan(spec)
    pipe = random_pipeline(entry, torch.device("cpu"), getattr(torch, dtype))
    pipe.set_progress_bar_config(disable=True)
    components = {c.component: (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan}
    started = time.perf_counter()
    real = measure_stage_peaks(
        lambda: pipe(
            prompt="a photo of a cat",
            height=size,
            width=size,
            num_inference_steps=1,
            guidance_scale=settled.guidance_scale,
            output_type="np",
        ),
        components,
    )
    run_s = time.perf_counter() - started
    rows = [
        _row(
            f"{model} pipeline",
            size,
            None,
            dtype,
            s.stage,
            s.peak_bytes,
            real.stage_peak_bytes[s.stage],
            real.stage_peak_with_scratch_bytes[s.stage],
            predict_s,
            run_s,
        )
        for s in predicted.stages
    ]
    rows.append(
        _row(
            f"{model} pipeline",
            size,
            None,
            dtype,
            "whole generation",
            predicted.peak_bytes,
            real.peak_bytes,
            real.peak_with_scratch_bytes,
            predict_s,
            run_s,
        )
    )
    return rows


def run_component(model: str, component: str, size: int, frames: int | None, dtype: str) -> list[dict]:
    import torch

    from diffmeter.loading import keep_fp32_modules
    from diffmeter.measure.memory_timeline import measure_stage_peaks
    from diffmeter.pipelines import build_component
    from diffmeter.predict.memory import DTYPES, STAGE_OF_ROLE, cast_floating, fake_module, settled_plan, track_call
    from diffmeter.spec import ProfileSpec

    entry, _, plan = settled_plan(
        ProfileSpec(model=model, height=size, width=size, steps=1, dtype=dtype, num_frames=frames)
    )
    call = next(c for c in plan if c.component == component and c.count)
    torch_dtype = DTYPES[dtype]
    started = time.perf_counter()
    memory = track_call(fake_module(entry.components[component], torch_dtype), call, torch_dtype)
    predict_s = time.perf_counter() - started
    predicted = memory.param_bytes + memory.input_bytes + memory.activation_bytes
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        module = build_component(entry.components[component], "cpu")
    finally:
        torch.set_default_dtype(previous)
    module.to(torch_dtype)  # as bench loads it: every floating tensor cast, then the class's float32 modules
    keep_fp32_modules(module)  # (Wan keeps its norms and time embedder in float32)
    inputs = cast_floating(call.build(torch.device("cpu")), torch_dtype)
    stage = STAGE_OF_ROLE[call.role]
    started = time.perf_counter()
    real = measure_stage_peaks(
        lambda: getattr(module, call.method)(**inputs), {component: (module, call.method, stage)}
    )
    run_s = time.perf_counter() - started
    return [
        _row(
            f"{model} {component}",
            size,
            frames,
            dtype,
            f"{stage} (batch {call.batch})",
            predicted,
            real.stage_peak_bytes[stage],
            real.stage_peak_with_scratch_bytes[stage],
            predict_s,
            run_s,
        )
    ]


def _row(what, size, frames, dtype, stage, predicted, measured, with_scratch, predict_s, run_s) -> dict:
    import resource

    return {
        "what": what,
        "size": f"{size}x{size}" + (f", {frames} frames" if frames else ""),
        "dtype": dtype,
        "stage": stage,
        "predicted": predicted,
        "measured": measured,
        "with_scratch": with_scratch,
        "predict_s": predict_s,
        "run_s": run_s,
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    }


def mib(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def main() -> None:
    rows = []
    for case in CASES:
        env = {**os.environ, "DIFFMETER_CACHE_DIR": "off", "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run(
            [sys.executable, __file__, json.dumps(case)], capture_output=True, text=True, env=env, timeout=1800
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
        if done.returncode or not lines:
            print(f"{case} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        found = json.loads(lines[-1][5:])
        rows.extend(found)
        for row in found:
            print(row, flush=True)
        OUT.write_text(report(rows), encoding="utf-8")  # after every case: a long run keeps what it measured
    print(f"wrote {OUT}")


def report(rows: list[dict]) -> str:
    head = [
        "# Predicted vs measured peak memory on CPU (real-size random weights)",
        "",
        "`python benchmarks/memory_prediction_cpu.py`. Predicted: `diffmeter.predict.memory` (MemTracker on fake",
        "tensors, no weights). Measured: torch.profiler's memory timeline of the real CPU call",
        '(`diffmeter.measure.memory_timeline`), plus the parameters resident before it. "tensors" counts what',
        'tensors hold, as the prediction does; "with scratch" adds CPU convolution kernels\' internal buffers.',
        "MiB = 2^20 bytes. Random weights: sizes are real, outputs are noise. A component alone is compared on",
        "its own parameters, inputs and activations. Times are wall seconds on a 2-core machine shared with",
        "other jobs (the real runs include the profiler's overhead): they say nothing about the models' speed.",
        "",
        "| model / component | size | dtype | stage | predicted (MiB) | measured, tensors (MiB) | error | "
        "measured with scratch (MiB) | predict (s) | real run (s) | peak RSS (GB) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    body = [
        f"| {r['what']} | {r['size']} | {r['dtype']} | {r['stage']} | {mib(r['predicted'])} | {mib(r['measured'])} | "
        f"{100 * (r['predicted'] - r['measured']) / r['measured']:+.2f}% | {mib(r['with_scratch'])} | "
        f"{r['predict_s']:.1f} | {r['run_s']:.1f} | {r['rss_gb']:.1f} |"
        for r in rows
    ]
    return "\n".join(head + body) + "\n"


def _case(text: str) -> None:
    kind, model, component, size, frames, dtype = json.loads(text)
    found = (
        run_pipeline(model, size, dtype) if kind == "pipeline" else run_component(model, component, size, frames, dtype)
    )
    print("ROWS " + json.dumps(found))


if __name__ == "__main__":
    _case(sys.argv[1]) if len(sys.argv) > 1 else main()
