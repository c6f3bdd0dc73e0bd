"""FLUX.1-dev from eager to its fastest lossless and lossy settings on a lent GPU, every rung predicted before it runs
(issue 51); then SDXL and Wan 2.1 1.3B the same way where the techniques apply.

The ladder (benchmarks/gpu_ladder_rungs.py), each rung the last one that ran plus one technique: eager (the model's
dtype: bf16 for FLUX.1-dev, batch 1, 1024 px, 28 steps, random real-size weights) -> SDPA backend choice
(FlashAttention 3 where installed, else cuDNN's, else flash) -> fused QKV -> torch.compile max-autotune-no-cudagraphs
(the repeated blocks) -> with CUDA graphs (max-autotune) -> --quantize fp8dq -> a first-block cache at ParaAttention's
published FLUX.1-dev threshold (0.12) -> FLUX.1-schnell at 4 steps. Each rung: its expected range printed before it
runs and the miss stored, time per stage, MFU, peak memory, energy, speed-up and image difference (PSNR/SSIM) against
the rung below. Rungs that do not apply are refused with their one-line reason, and recorded.

A GPU session runs, first thing (the run tool's timeout_s=600):

    python benchmarks/gpu_ladder.py --budget-minutes 9 --copy-to $OUT

Expected on the H200: about 9.5 minutes for the FLUX.1-dev ladder (chunk flux-1 about 4, flux-2 about 6; `--list`
prints each chunk's estimate and its basis: the eager calls from results/gpu_calibration_nvidia-h200.jsonl, load
0.59 s, first call 5.68 s, 5.03 s per call; the compile, CUDA-graph and fp8 costs were never measured on a GPU and are
allowances, so the 9-minute budget may stop flux-2 in its last rung). --copy-to $OUT brings the .jsonl, .md and logs
back after every chunk: put them in benchmarks/results/ and commit them. Whatever the budget leaves undone the same
command resumes in the next session (with those files in place): a finished chunk is not rerun, nor a rung that ended;
SDXL (chunks sdxl-1, sdxl-2) and Wan 2.1 1.3B (wan-1, wan-2) follow in the same order.

    python benchmarks/gpu_ladder.py --list               # the chunks, their rungs and estimates
    python benchmarks/gpu_ladder.py --chunk flux-2       # chunks by name
    python benchmarks/gpu_ladder.py --self-test          # any machine: the same code on tiny-flux and tiny-sdxl, CPU

Each chunk runs in its own process under --chunk-limit (470 s): at the limit it is stopped (SIGTERM), the rung it was
in is recorded as stopped with its bench.log kept beside its run folder, and its output is in <chunk>.log. Results:
results/gpu_ladder_<device>.jsonl (a line per rung and per chunk, with its length) and .md, commit both; the runs in
results/gpu_ladder_<device>_runs/ (ignored by git: copy them to $OUT to keep the images for the next session's image
differences). On a CPU the CUDA-only rungs (CUDA graphs, fp8 dynamic activations) are refused with their reasons.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def _stopped_early(signum, frame) -> None:
    print(f"chunk stopped while its libraries imported: signal {signum}", flush=True)
    sys.exit(3)


if "--run-chunk" in sys.argv:  # a chunk's process: a stop before its rungs begin is recorded too
    signal.signal(signal.SIGTERM, _stopped_early)

from gpu_ladder_rungs import CHUNKS, LADDERS, STOP, Journal, climb  # noqa: E402  (after the handler)
from gpu_runs import RESULTS  # noqa: E402

from diffmeter import units  # noqa: E402
from diffmeter.errors import DiffmeterError  # noqa: E402

#: seconds a chunk may run before it is stopped (under 8 minutes on the lent GPU)
CHUNK_LIMIT = 470
#: seconds a stopped chunk has to record where it stopped before it is killed
GRACE = 30
#: the chunks the self-test runs on CPU (tiny stand-ins)
SELF_TEST = ("flux-1", "flux-2", "sdxl-1", "sdxl-2")
#: allowances for what no GPU run has measured yet, seconds: a process's start and imports, the prediction before a
#: rung, the first compile (max-autotune's autotuning), a compile reusing inductor's cache, fp8's load (the denoiser
#: built on the CPU, saved and loaded quantized) and its first compile
ALLOW = {"start": 20, "predict": 5, "compile": 120, "recompile": 20, "fp8_load": 35, "fp8_compile": 90}
CALIBRATION = RESULTS / "gpu_calibration_nvidia-h200.jsonl"


def estimate(chunk: str) -> tuple[float, str]:
    """Seconds ``chunk`` should take on the H200, from the eager run of its model stored there plus ``ALLOW``."""
    ladder, rungs = CHUNKS[chunk]
    runs = [json.loads(line) for line in CALIBRATION.read_text().splitlines()]
    eager = next((r for r in runs if r["spec"]["model"] == ladder.model), None)
    if eager is None:
        return float("nan"), f"no eager {ladder.model} run in {CALIBRATION.name}"
    load, first, call = eager["load_s"], eager["first_call_s"], eager["summary"]["latency_s"]["median"]
    extra = {"compile": ALLOW["compile"], "cuda-graphs": ALLOW["recompile"] + 2 * call, "cache": ALLOW["fp8_load"]}
    extra |= {"fp8dq": ALLOW["fp8_load"] + ALLOW["fp8_compile"], "distilled": ALLOW["fp8_load"] + ALLOW["recompile"]}
    ran = [rung for rung in rungs if rung != "distilled" or ladder.distilled]  # no variant: refused, nothing loads
    seconds = ALLOW["start"] + sum(load + first + 2 * call + ALLOW["predict"] + extra.get(rung, 0) for rung in ran)
    basis = (
        f"eager {ladder.model}: load {load:.2f} s, first call {first:.2f} s, {call:.2f} s per call ({CALIBRATION.name})"
    )
    return seconds, basis


def listing() -> str:
    lines = []
    for ladder in LADDERS:
        for name, rungs in ladder.chunks:
            seconds, basis = estimate(name)
            lines.append(
                f"{name}: {ladder.model}, {' -> '.join(rungs)}; about {seconds / 60:.1f} min on the H200 ({basis})"
            )
    return "\n".join(lines)


def _interrupt(signum, frame) -> None:
    STOP.set()
    raise KeyboardInterrupt(f"signal {signum}")


def run_chunk(chunk: str, cpu: bool, journal_path: Path) -> int:
    """The child process of one chunk: its rungs in order; exit 3 when stopped, 2 when its rungs below have not run."""
    import warnings

    import diffusers
    import transformers

    signal.signal(signal.SIGTERM, _interrupt)
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    runs = journal_path.with_name(journal_path.stem + "_runs")
    try:
        climb(chunk, cpu, runs, Journal(journal_path), lambda line: print(line, flush=True))
    except KeyboardInterrupt as stop:
        print(f"chunk {chunk} stopped: {stop}", flush=True)
        return 3
    except DiffmeterError as error:  # a chunk whose rungs below have not run
        print(f"chunk {chunk} refused: {error}", flush=True)
        return 2
    return 0


def device_name(self_test: bool) -> str | None:
    """The GPU's name as nvidia-smi reads it (the first visible one), or None: this process opens no CUDA context, so
    the chunk's process is the only one on the GPU."""
    if self_test:
        return "cpu"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    command = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", f"--id={visible}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def spawn(chunk: str, limit: float, arguments, journal: Path, log: Path) -> tuple[str, float]:
    """``chunk`` in its own process, its output printed and kept in ``log``; stopped at ``limit`` seconds (SIGTERM,
    then SIGKILL ``GRACE`` seconds later). Returns (complete, stopped, refused or crashed, seconds)."""
    command = [sys.executable, __file__, "--run-chunk", chunk, "--journal", str(journal)]
    command += ["--self-test"] if arguments.self_test else []
    started, stopped = time.perf_counter(), threading.Event()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def stop() -> None:
        stopped.set()
        process.send_signal(signal.SIGTERM)
        killer = threading.Timer(GRACE, process.kill)
        killer.daemon = True
        killer.start()

    def pump(kept) -> None:
        for line in process.stdout:
            print(line, end="", flush=True)
            kept.write(line)
            kept.flush()

    timer = threading.Timer(limit, stop)
    timer.daemon = True
    timer.start()
    with open(log, "a") as kept:
        try:
            pump(kept)
        except KeyboardInterrupt:  # this process was stopped (the session's own limit): the chunk stops with it
            stop()
            pump(kept)
        finally:
            timer.cancel()
        process.wait()
    seconds = time.perf_counter() - started
    ended = {0: "complete", 2: "refused"}.get(process.returncode, "crashed")
    return ("stopped" if stopped.is_set() else ended), seconds


def copy(journal: Path, to: Path | None) -> None:
    """The journal, its report and every log of its chunks and stopped runs into ``to`` (a lent GPU's $OUT)."""
    if to is None:
        return
    to.mkdir(parents=True, exist_ok=True)
    runs = journal.with_name(journal.stem + "_runs")
    for path in [journal, journal.with_suffix(".md"), *runs.glob("*.log"), *runs.glob("*/*.log")]:
        if path.exists():
            shutil.copy(path, to / path.name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--chunk", action="append", choices=list(CHUNKS), help="run these chunks (repeatable)")
    parser.add_argument("--list", action="store_true", help="the chunks, their rungs and estimated minutes")
    parser.add_argument("--self-test", action="store_true", help="tiny stand-ins on the CPU, CUDA-only rungs refused")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the .jsonl, .md and runs go")
    parser.add_argument("--chunk-limit", type=float, default=CHUNK_LIMIT, help="seconds before a chunk is stopped")
    parser.add_argument("--budget-minutes", type=float, help="stop the last chunk by this many minutes in all")
    parser.add_argument("--copy-to", type=Path, help="copy the .jsonl, .md and logs here after every chunk ($OUT)")
    parser.add_argument("--run-chunk", help=argparse.SUPPRESS)
    parser.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.list:
        print(listing())
        return 0
    if arguments.run_chunk:
        return run_chunk(arguments.run_chunk, arguments.self_test, arguments.journal)
    name = device_name(arguments.self_test)
    if name is None:
        print(
            "no GPU here (nvidia-smi): the ladder runs on a lent GPU; --self-test runs it on tiny models",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # as gpu_runs.device_slug names results files
    arguments.results.mkdir(parents=True, exist_ok=True)
    journal = Journal(arguments.results / f"gpu_ladder_{slug}.jsonl")
    chunks = arguments.chunk or (list(SELF_TEST) if arguments.self_test else list(CHUNKS))
    budget = arguments.budget_minutes * 60 if arguments.budget_minutes else float("inf")
    began, outcome = time.perf_counter(), 0
    try:
        for chunk in chunks:
            done = journal.latest(kind="chunk", chunk=chunk, status="complete")
            if done is not None:
                print(
                    f"chunk {chunk}: finished at {done['utc']} in {units.seconds(done['seconds'])}, not rerun",
                    flush=True,
                )
                continue
            left = budget - (time.perf_counter() - began)
            if left < 60:
                print(f"chunk {chunk}: not started, {units.seconds(max(left, 0))} of the budget left", flush=True)
                outcome = 1
                continue
            limit = min(arguments.chunk_limit, left - GRACE)  # stopped and killed inside the budget
            log = arguments.results / f"gpu_ladder_{slug}_runs" / f"{chunk}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            print(f"chunk {chunk}: up to {units.seconds(limit)}, output also in {log}", flush=True)
            status, seconds = spawn(chunk, limit, arguments, journal.path, log)
            journal = Journal(journal.path)  # with the rungs the chunk's process recorded
            journal.add({"kind": "chunk", "chunk": chunk, "status": status, "seconds": seconds, "limit_s": limit})
            print(f"chunk {chunk}: {status} in {units.seconds(seconds)}", flush=True)
            outcome |= status != "complete"
            copy(journal.path, arguments.copy_to)
            if STOP.is_set():  # this process was stopped: no further chunk starts
                break
    finally:
        from gpu_ladder_report import write_report

        journal = Journal(journal.path)
        path = write_report(journal, name, arguments.self_test)
        copy(journal.path, arguments.copy_to)
        print(f"written to {path} and {journal.path}")
    ended = [line for line in journal.lines if line["kind"] == "rung" and line["status"] in ("failed", "crashed")]
    return 1 if outcome or ended else 0


if __name__ == "__main__":
    sys.exit(main())
