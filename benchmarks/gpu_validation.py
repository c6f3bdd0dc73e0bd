"""One command for the first GPU: checks what the CPU cannot, each against an independent measurement so that
it can fail on a wrong number, and writes what it found.

    python benchmarks/gpu_validation.py                    # every chunk
    python benchmarks/gpu_validation.py --chunk stages     # one chunk; each is under 10 minutes on one H100
    python benchmarks/gpu_validation.py --self-test        # every check fed a wrong input must FAIL (any machine)

Chunks:
  peak           the table's dense bf16 peak against a bare 8192^3 matmul on the card (CUDA events): a
                 right dense peak is reached to 50-100%; device-to-device copy GB/s
  stages         each call's device-timed total (CUDA events) against the host wall clock around it, which
                 waits for the GPU (2%), for a UNet (sd15), an MMDiT (flux-schnell), a DiT (pixart-sigma)
  measures       flux-schnell: MFU below a bare matmul and in a plausible band; CUDA max allocated, whole and per
                 stage (each allocation given to the stage its Python stack was in), against the
                 allocator's own event trace replayed; diffmeter's energy meter against NVML's total-energy
                 counter of the run's GPU, read directly around the same window (5%)
  trace          a --trace run of each model: stage lengths against the stage timer (5% of the call), no stage
                 busier than its length; the stored prediction: peak memory, whole and per stage, against CUDA's
                 max allocated (10%), the roofline lower bound under every stage's fastest call, the measured
                 time inside the expected range and the energy (Zeus) inside its range; writes this GPU's achieved
                 fractions per operator kind (for predict/data/efficiency.json)
  two-process    data parallel 2 and Ulysses 2 on two GPUs (SKIP with one: tests/test_multigpu.py runs both on CPU)
  cuda1          a run on cuda:1 holds no context on another GPU (NVML's list of this process's GPUs)
  onnxruntime    ONNX Runtime's CUDA and TensorRT providers at float16 and float32: images against PyTorch's
  graph-runs     graph runs per pipeline call under torch.compile (a counting backend), alone and with model
                 offload: every measured call runs the compiled graphs
  techniques-*   every registered technique but compile and offload (and each variant) on the three models: it runs
                 (device total against the wall clock, no compilation inside measured calls) or is refused with
                 its reason before anything loads
  offloading-*   the same for offload's variants (model, sequential, group) and compile with offloading: every
                 call moves weights over the host link, minutes on a real-size model
  compiling-*    the same for torch.compile's modes and options

Without CUDA it runs what a CPU can show, on tiny pipelines, and marks the rest SKIP (CI runs it so). The
report goes to benchmarks/results/gpu_validation_<device>.md (one file per device name) and is printed;
commit it. Each chunk's runs are kept in benchmarks/results/gpu_validation_<device>_runs/<chunk>/ (ignored by git):
a run stopped by a time limit leaves its bench.log there as <run folder>.log.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import diffusers
import gpu_checks
import gpu_chunks as chunks
import torch
import transformers
from gpu_runs import CUDA, MODELS, RESULTS, RUNS, Report, device_slug
from gpu_technique_chunks import PARTS, chunk_graph_runs, chunk_techniques

CHUNKS = {
    "peak": chunks.chunk_peak,
    "stages": chunks.chunk_stages,
    "measures": chunks.chunk_measures,
    "trace": chunks.chunk_trace,
    "two-process": chunks.chunk_two_process,
    "cuda1": chunks.chunk_cuda1,
    "onnxruntime": chunks.chunk_onnxruntime,
    "graph-runs": chunk_graph_runs,
    **{f"{part}-{kind}": chunk_techniques(kind, part) for part in PARTS for kind in MODELS},
}


def self_test() -> int:
    """Every rule of gpu_checks fed a deliberately wrong input (see ``gpu_checks.self_test`` for what is faked and
    why): each must report FAIL. Exit 1 when one passes."""
    rows = gpu_checks.self_test()
    for name, wrong, (outcome, detail) in rows:
        print(f"{outcome:4s} {name} ({wrong}): {detail}")
    passed = [name for name, _, (outcome, _) in rows if outcome != "FAIL"]
    print(
        f"\n{len(rows) - len(passed)} of {len(rows)} checks failed on a wrong input, as they must"
        + (f"; {', '.join(passed)} did not" if passed else "")
    )
    return 1 if passed else 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="chunks: " + ", ".join(CHUNKS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--chunk", action="append", choices=list(CHUNKS), help="run only these chunks (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the chunks and exit")
    parser.add_argument("--self-test", action="store_true", help="feed every check a wrong input; each must FAIL")
    parser.add_argument(
        "--report", type=Path, help="where the report goes (default: results/gpu_validation_<device>.md)"
    )
    parser.add_argument(
        "--runs", type=Path, help="where each chunk's runs are kept (default: results/gpu_validation_<device>_runs)"
    )
    arguments = parser.parse_args()
    if arguments.list:
        print("\n".join(CHUNKS))
        return 0
    if arguments.self_test:
        return self_test()
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    device_name = torch.cuda.get_device_name(0) if CUDA else "cpu (CPU-possible parts only)"
    report = Report()
    started = time.perf_counter()
    path = arguments.report or RESULTS / f"gpu_validation_{device_slug()}.md"
    if arguments.runs:
        RUNS["root"] = arguments.runs
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` stops it with the report still written
    try:
        for name in arguments.chunk or list(CHUNKS):
            begun = time.perf_counter()
            try:
                CHUNKS[name](report)
            except KeyboardInterrupt as stop:  # a time limit: say where it stopped, then stop
                where = f" inside {report.doing}" if report.doing else ""
                seconds = time.perf_counter() - begun
                report.add(name, "chunk stopped", "FAIL", f"{stop} after {seconds:.0f} s{where}: not finished")
                raise
            except Exception as error:  # a crash is the finding: record it with its place, run the next chunk
                frame = traceback.extract_tb(error.__traceback__)[-1]
                where = f"{Path(frame.filename).name}:{frame.lineno}"
                report.add(name, "chunk crashed", "FAIL", f"{type(error).__name__}: {error} ({where})"[:400])
            finally:
                report.seconds[name] = time.perf_counter() - begun
                report.doing = ""
                path.write_text(report.markdown(device_name, time.perf_counter() - started, arguments.chunk or []))
    finally:  # written after every chunk and at the end: what was found survives a stop inside a chunk
        path.write_text(report.markdown(device_name, time.perf_counter() - started, arguments.chunk or []))
        print(f"\nwritten to {path}")
    return 1 if any(row[2] == "FAIL" for row in report.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
