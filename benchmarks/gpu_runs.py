"""What every chunk of benchmarks/gpu_validation.py shares: the models it runs, the report it writes, a real
``diffmeter bench`` run kept in a folder per chunk, and this card's achievable matmul and copy rates (CUDA events)."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from pathlib import Path

import diffusers
import torch
import transformers
from gpu_checks import WALL_TOLERANCE

from diffmeter.errors import DiffmeterError
from diffmeter.execute import bench as bench_group
from diffmeter.runs.group import Alone
from diffmeter.runs.lifecycle import MeasuredRun
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS as RESULTS_JSON
from diffmeter.runs.storage import add_log_file

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
#: (family kind, real-size model, tiny stand-in on CPU, size, steps)
MODELS = {
    "unet": ("sd15", "tiny-sd", 512, 8),
    "mmdit": ("flux-schnell", "tiny-flux", 512, 4),
    "dit": ("pixart-sigma-1024", "tiny-pixart", 512, 8),
}
RESULTS = Path(__file__).parent / "results"
#: where each chunk's runs are kept, a folder per chunk (main sets it: --runs, or results/gpu_validation_<device>_runs,
#: which git ignores); a chunk stopped by its time limit keeps its load time and per-call lines there
RUNS: dict[str, Path] = {}
#: this card's bare bf16 matmul TFLOP/s and copy GB/s, measured once by whichever chunk needs them first
ACHIEVABLE: dict[str, float] = {}


class Report:
    """Rows of (chunk, check, outcome, detail); outcome is PASS, FAIL, REFUSED or SKIP."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        #: chunk -> seconds it took (each must stay under 10 minutes on one H100)
        self.seconds: dict[str, float] = {}
        #: what the running chunk is doing (a technique's label): named in the report when a time limit stops it
        self.doing = ""

    def add(self, chunk: str, check: str, outcome: str, detail: str) -> None:
        self.rows.append((chunk, check, outcome, detail))
        print(f"{outcome:8s} {chunk:18s} {check}: {detail}", flush=True)

    def markdown(self, device_name: str, seconds: float, chunks: list[str]) -> str:
        counts = {
            outcome: sum(row[2] == outcome for row in self.rows) for outcome in ("PASS", "FAIL", "REFUSED", "SKIP")
        }
        lines = [
            f"# GPU validation on {device_name}",
            "",
            f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/gpu_validation.py"
            + (f" --chunk {' --chunk '.join(chunks)}`" if chunks else "`")
            + f", {seconds / 60:.1f} min: torch {torch.__version__}, diffusers {diffusers.__version__}, "
            f"transformers {transformers.__version__}.",
            "",
            ", ".join(f"{count} {outcome}" for outcome, count in counts.items()) + ".",
            "",
            "Seconds per chunk: " + ", ".join(f"{chunk} {seconds:.0f}" for chunk, seconds in self.seconds.items()),
            "",
            "REFUSED: the technique does not apply and said why before loading anything (a correct outcome).",
            "SKIP: this machine cannot show it (no CUDA, one GPU).",
            "",
            "| chunk | check | outcome | detail |",
            "|---|---|---|---|",
        ]
        for chunk, check, outcome, detail in self.rows:
            lines.append(f"| {chunk} | {check} | {outcome} | {detail.replace('|', '/')} |")
        return "\n".join(lines) + "\n"


class KeptLog(Alone):
    """A run alone whose bench.log is also written beside its folder, as ``<run folder>.log``: a run stopped (a time
    limit's SIGTERM) or refused discards its staged folder, and that copy stays; a stored run's is removed."""

    def open(self, directory, requests):
        self.final, self.opened = directory.final, time.time()
        self.copy = directory.final.parent / f"{directory.final.name}.log"
        return super().open(directory, requests)

    def stored(self) -> bool:
        """Whether this run stored its results (a stop can come after that, while the run closes its log)."""
        if getattr(self, "final", None) is None:  # stopped before its folder was opened
            return False
        results = self.final / RESULTS_JSON
        return results.exists() and results.stat().st_mtime >= self.opened - 1

    def copy_log(self, log) -> None:
        add_log_file(log, self.copy)


def chunk_folder(chunk: str) -> Path:
    """Where ``chunk`` keeps its runs."""
    return RUNS.get("root", RESULTS / f"gpu_validation_{device_slug()}_runs") / chunk


def bench_kept(spec: BenchSpec, chunk: str):
    """A real diffmeter bench run stored in ``chunk``'s folder (replacing an earlier one); (result, run folder)."""
    out = chunk_folder(chunk)
    if spec.world_size > 1:  # started as `diffmeter bench` starts it: each rank's log kept by the launcher
        return bench_group(spec, out=out, force=True)
    group = KeptLog()
    stored = MeasuredRun(spec, out, force=True, group=group).run()
    group.copy.unlink(missing_ok=True)  # the run folder holds the same bench.log
    return stored


def run(spec: BenchSpec, chunk: str):
    """A real diffmeter bench run kept in ``chunk``'s folder; (result, None) or (None, refusal)."""
    try:
        result, _ = bench_kept(spec, chunk)
    except DiffmeterError as error:
        return None, str(error)
    return result, None


def model_spec(kind: str, **settings) -> BenchSpec:
    model, tiny, size, steps = MODELS[kind]
    base = dict(model=model if CUDA else tiny, random_weights=CUDA, steps=steps, iterations=2, warmup=1)
    if CUDA:
        base.update(height=size, width=size, dtype="bf16", device="cuda")
    if kind == "dit":
        base["resolution_binning"] = False
    return BenchSpec(**{**base, **settings})


def event_seconds(work, repeats: int) -> float:
    """Mean seconds per call of ``work`` over ``repeats`` calls, timed with CUDA events after 3 warm-ups."""
    for _ in range(3):
        work()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        work()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000 / repeats


def achievable() -> dict[str, float]:
    """{"matmul_tflops": bf16 8192^3, "copy_gbs": 1 GiB device-to-device, read + written}, measured once."""
    if not ACHIEVABLE:
        n = 8192
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ACHIEVABLE["matmul_tflops"] = 2 * n**3 / event_seconds(lambda: a @ b, 20) / 1e12
        source = torch.empty(2**30, device="cuda", dtype=torch.uint8)
        target = torch.empty_like(source)
        ACHIEVABLE["copy_gbs"] = 2 * 2**30 / event_seconds(lambda: target.copy_(source), 20) / 1e9
        del a, b, source, target
        torch.cuda.empty_cache()
    return ACHIEVABLE


def wall_clock(result) -> tuple[bool, str]:
    """Each measured call's device-timed total (CUDA events on the run's stream) against the host's wall clock
    around the same call, which waits for the GPU: an event on another stream or device, or a stage left out,
    shows as a difference."""
    worst = max(abs(it.total_s - it.wall_s) / it.wall_s for it in result.iterations)
    clock = "CUDA events" if CUDA else "host clock"
    limit = 100 * WALL_TOLERANCE
    return worst <= WALL_TOLERANCE, f"{clock} total vs host wall clock within {100 * worst:.2f}% (limit {limit:g}%)"


def device_slug() -> str:
    """This machine's device as the result files name it: nvidia-h200, or cpu."""
    return re.sub(r"[^a-z0-9]+", "-", (torch.cuda.get_device_name(0) if CUDA else "cpu").lower()).strip("-")
