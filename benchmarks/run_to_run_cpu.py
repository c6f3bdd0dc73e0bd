"""How far two runs of the same settings differ on this machine, against what their calls' interval says.

Why `diffmeter compare` has `--min-effect`: calls within one run share that run's conditions, so two
back-to-back runs of identical settings can differ by more than the interval over their calls allows.
For each configuration, PAIRS pairs of tiny-SD runs (batch 1 and 2, CPU) are measured back to back
and compared with `diffmeter.runs.compare` at 95%; the table gives each pair's speed-up (A's time /
B's; 1.0 for identical machines), its interval, and whether the interval excluded 1x.

Run from the repo root:  python benchmarks/run_to_run_cpu.py    (about 10 minutes on 2 cores)
Writes benchmarks/results/run_to_run_cpu.md.
"""

from __future__ import annotations

import math
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from diffmeter.runs.compare import Criteria, compare_paths
from diffmeter.runs.runner import bench
from diffmeter.runs.spec import BenchSpec

ROOT = Path(__file__).resolve().parents[1]
PAIRS = 4  # per configuration and batch size
CONFIGS = {
    "1 step, 1 warm-up call, torch threads: all": ({"steps": 1, "warmup": 1}, None),
    "10 steps, 2 warm-up calls, torch threads: all": ({"steps": 10, "warmup": 2}, None),
    "10 steps, 2 warm-up calls, 1 torch thread": ({"steps": 10, "warmup": 2}, 1),
}


def main() -> None:
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    threads = torch.get_num_threads()
    lines, deviations = [], {}
    for name, (settings, thread_count) in CONFIGS.items():
        torch.set_num_threads(thread_count or threads)
        deviations[name] = []
        for trial in range(PAIRS):
            with tempfile.TemporaryDirectory() as folder:
                for batch in (1, 2):
                    for side in ("a", "b"):
                        spec = BenchSpec(
                            model="tiny-sd", iterations=6, device="cpu", batch_size=batch, save_images=False, **settings
                        )
                        bench(spec, out=Path(folder) / side)
                comparison = compare_paths(Path(folder) / "a", Path(folder) / "b", images=False, criteria=Criteria())
            for pair in comparison.pairs:
                call = pair.stages[0]
                excluded = not call.ci_low <= 1 <= call.ci_high
                deviations[name].append((abs(math.log(call.speedup)), excluded))
                batch = "b2" if "batch-2" in pair.a else "b1"
                lines.append(
                    f"| {name} | {trial} | {batch} | {call.a_s_per_image * 1e3:.1f} | {call.b_s_per_image * 1e3:.1f} "
                    f"| {call.speedup:.3f}x | {call.ci_low:.3f}-{call.ci_high:.3f}x | {'yes' if excluded else 'no'} |"
                )
    torch.set_num_threads(threads)
    summary = []
    for name, values in deviations.items():
        percents = [math.exp(value) * 100 - 100 for value, _ in values]
        summary.append(
            f"| {name} | {len(values)} | {statistics.median(percents):.1f}% | {max(percents):.1f}% "
            f"| {sum(excluded for _, excluded in values)} |"
        )
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            "# Run-to-run variation on this CPU: two runs of the same settings",
            "",
            f"Run {now} by `python benchmarks/run_to_run_cpu.py` on {platform.machine()} "
            f"({torch.get_num_threads()} torch threads by default), torch {torch.__version__}. Tiny SD 1.5 "
            "(random weights), 32 px, 6 measured calls per run, each pair measured back to back; speed-up = A's "
            "per-image time / B's, interval: `diffmeter compare`'s exact Mann-Whitney one at 95%.",
            "",
            "| configuration | pairs | median difference | largest difference | intervals excluding 1x |",
            "|---|---:|---:|---:|---:|",
            *summary,
            "",
            "| configuration | trial | batch | A (ms / image) | B (ms / image) | speed-up | interval | excludes 1x |",
            "|---|---:|---|---:|---:|---:|---|---|",
            *lines,
            "",
        ]
    )
    out = ROOT / "benchmarks" / "results" / "run_to_run_cpu.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
