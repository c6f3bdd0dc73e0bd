"""Eager, real-size runs on a lent GPU at the settings people publish, as calibration data for the GPU time and
energy fit (issue 27): each a real ``diffmeter bench`` with random weights (times, memory and energy are real;
images are noise), one process, one run after another.

    python benchmarks/gpu_calibration_runs.py            # every run below; needs CUDA
    python benchmarks/gpu_calibration_runs.py --list     # the runs, without running them

Each run's whole stored result is appended to results/gpu_calibration_<device>.jsonl (and to --copy-to). The
prediction is left out here (``predict=False``, ``memory_check=False``): counting a real-size pipeline on fake
tensors costs a lent GPU's minutes and needs no GPU, so benchmarks/calibrate_published.py predicts each stored
run afterwards, on any machine, from its stored spec.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import diffusers
import torch
import transformers
from gpu_runs import RESULTS, device_slug

from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

#: (catalog model, settings): each model's own dtype and guidance; fewer steps than the default where a call
#: would take over ~10 s on an H100 (the fit is per operator, so steps only scale the denoising stage)
RUNS = [
    ("flux-dev", dict(height=1024, width=1024, steps=28)),
    ("sd35-large", dict(height=1024, width=1024, steps=28)),
    ("sdxl", dict(height=1024, width=1024, steps=30)),
    ("hunyuandit", dict(height=1024, width=1024, steps=25)),
    ("pixart-sigma-1024", dict(height=1024, width=1024, steps=20, batch_size=4)),
    ("sana15-1600m-1024", dict(height=1024, width=1024, steps=20, batch_size=4)),
    ("qwen-image", dict(height=1328, width=1328, steps=10)),
    ("wan21-t2v-1.3b", dict(height=480, width=832, num_frames=81, steps=10)),
]


def spec_of(model: str, settings: dict) -> BenchSpec:
    return BenchSpec(
        model=model,
        random_weights=True,
        device="cuda",
        warmup=1,
        iterations=2,
        save_images=False,
        predict=False,
        memory_check=False,
        **settings,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the runs and exit")
    parser.add_argument("--only", action="append", help="run only these models (repeatable)")
    parser.add_argument("--copy-to", type=Path, help="also copy the results file here")
    arguments = parser.parse_args()
    chosen = [(model, settings) for model, settings in RUNS if not arguments.only or model in arguments.only]
    if arguments.list:
        for model, settings in chosen:
            print(model, " ".join(f"{key}={value}" for key, value in settings.items()))
        return 0
    if not torch.cuda.is_available():
        print("needs CUDA: these are runs on a lent GPU (--list shows them)", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    target = RESULTS / f"gpu_calibration_{device_slug()}.jsonl"
    failed = 0
    for model, settings in chosen:
        started = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as out:
                result, _ = bench(spec_of(model, settings), out=out)
        except Exception as error:  # one run's failure (a refusal, out of memory, a crash) is reported; the next runs
            first = (str(error).strip().splitlines() or [""])[0]
            print(f"FAIL {model}: {type(error).__name__}: {first[:300]}", flush=True)
            failed += 1
            continue
        with open(target, "a") as runs:
            runs.write(result.model_dump_json() + "\n")
        if arguments.copy_to:
            shutil.copy(target, arguments.copy_to)
        summary = result.summary
        latency, energy = summary.latency_s, summary.energy.gpu_j_per_image if summary.energy else None
        print(
            f"{model} {settings}: median {latency.median:.3f} s per call (interval {latency.ci_low:.3f}-"
            f"{latency.ci_high:.3f} s, n={latency.n}), stages "
            + ", ".join(f"{stage} {stats.median:.3f} s" for stage, stats in summary.stages_s.items())
            + (f"; {energy:.0f} J per image (Zeus)" if energy is not None else "; no energy reading")
            + f"; max allocated {summary.peak_memory.cuda_max_allocated_bytes / 2**30:.2f} GiB"
            + f"; {time.perf_counter() - started:.0f} s in all",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
