"""A real sweep on this CPU machine, its table, and what the sweep machinery costs per cell.

The sweep (benchmarks/sweep_cpu.yaml): tiny SD 1.5, PixArt and FLUX.1 pipelines at two batch
sizes with and without fused QKV projections, plus real-size SD 1.5 with random weights (860M
UNet) at 256 px with and without DeepCache, compared with the unoptimized images. The same cells
are then run again with `diffmeter bench` one by one (one process each, as a user would), and
the overhead per cell is the difference of the two wall-clock totals divided by the cells.

Run from the repo root:  python benchmarks/sweep_cpu.py    (about 10 minutes on 2 cores)
Writes benchmarks/results/sweep_cpu.md; the runs land in benchmarks/results/sweep_cpu_runs/
(ignored by git).
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from diffmeter.report.results_table import results_table
from diffmeter.runs.collect import load_results
from diffmeter.sweep.file import expand, read_sweep_file

HERE = Path(__file__).parent
SWEEP = HERE / "sweep_cpu.yaml"
RUNS = HERE / "results" / "sweep_cpu_runs"
REPORT = HERE / "results" / "sweep_cpu.md"


def diffmeter(*args: str) -> float:
    """Run the diffmeter command; return its wall-clock seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from diffmeter.cli import main; main()", *args], check=True)
    return time.perf_counter() - start


def bench_arguments(cell, out: Path) -> list[str]:
    """The `diffmeter bench` command line of a sweep cell."""
    spec = cell.spec
    args = ["bench", spec.model, "--out", str(out), "--quiet", "--steps", str(spec.steps)]
    args += ["--batch-size", str(spec.batch_size), "--iterations", str(spec.iterations), "--device", spec.device]
    if spec.height:
        args += ["--height", str(spec.height), "--width", str(spec.width)]
    if spec.random_weights:
        args.append("--random-weights")
    if spec.compare_baseline:
        args.append("--compare-baseline")
    for optimization in spec.optimizations:
        params = ",".join(f"{key}={value}" for key, value in optimization.params.items())
        args += ["--opt", optimization.name + (f":{params}" if params else "")]
    return args


def main() -> None:
    if len(sys.argv) > 1:  # no options: print what it does instead of deleting the last runs
        print(__doc__)
        return
    os.environ.setdefault("DIFFMETER_CACHE_DIR", "off")
    shutil.rmtree(RUNS, ignore_errors=True)
    cells = expand(read_sweep_file(SWEEP))
    sweep_s = diffmeter("sweep", str(SWEEP), "--out", str(RUNS / "sweep"), "--quiet")
    rerun_s = diffmeter("sweep", str(SWEEP), "--out", str(RUNS / "sweep"), "--quiet")
    bench_s = sum(diffmeter(*bench_arguments(cell, RUNS / "bench")) for cell in cells)
    frame = load_results(RUNS / "sweep")
    console = Console(file=io.StringIO(), width=150, force_terminal=False)
    console.print(results_table(frame.sort_values(["model", "batch", "optimizations"]), f"{len(frame)} runs"))
    table = console.file.getvalue()
    overhead = (sweep_s - bench_s) / len(cells)
    lines = [
        "# A sweep on this CPU machine",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {__import__('torch').__version__}, by `python benchmarks/sweep_cpu.py`.",
        "Tiny pipelines and random weights: the timings describe this machine and the tool, not the models.",
        "",
        f"The sweep file ([sweep_cpu.yaml](../sweep_cpu.yaml)) expands to {len(cells)} cells.",
        "",
        "| | wall clock |",
        "|---|---:|",
        f"| `diffmeter sweep` (every cell in its own process, baselines first) | {sweep_s:.1f} s |",
        f"| the same cells with `diffmeter bench`, one process each | {bench_s:.1f} s |",
        f"| sweep machinery per cell ((sweep - bench) / cells) | {overhead:+.2f} s |",
        f"| the sweep again (every cell stored: all skipped) | {rerun_s:.1f} s |",
        "",
        "The per-cell cost is planning (the offline profile and refusal checks of every cell, before",
        "anything loads), the record rewritten after each cell, and one process start per cell; the",
        "bench loop pays the process start too. A negative figure means the sweep was faster (its",
        "baselines are measured once and reused, where separate bench runs with --compare-baseline",
        "reuse them from the same --out as well).",
        "",
        "```",
        table.rstrip(),
        "```",
        "",
    ]
    REPORT.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
