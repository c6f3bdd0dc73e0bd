"""One command for the first GPU: checks what the CPU cannot, and writes what it found.

    python benchmarks/gpu_validation.py                    # every chunk
    python benchmarks/gpu_validation.py --chunk stages     # one chunk; each is under 10 minutes on one H100
    python benchmarks/gpu_validation.py --list             # the chunks

Chunks:
  peak          this card's achievable bf16 matmul TFLOP/s and device-to-device GB/s (CUDA events),
                the independent figures the pipeline's MFU and the roofline are held against
  stages        per-stage times add up to the device-timed total, which matches the host wall
                clock within 2% (CUDA events on the run's stream), for a UNet, an MMDiT, a DiT
  graph-runs    graph runs per pipeline call under torch.compile (a counting backend), alone and
                with model offload: every measured call runs the compiled graphs
  techniques-*  every registered technique but compile (and each variant) on a real-size
                random-weight UNet (sd15), dispatching MMDiT (flux-schnell) and SDPA DiT
                (pixart-sigma-1024): it runs (stages add up, no compilation inside measured
                calls) or is refused with its reason before anything loads
  compiling-*   the same for torch.compile's modes and options, and compile with offloading
  measures      0 < MFU < 100%, energy > 0 J per image (Zeus), CUDA memory peaks consistent
  trace         a --trace run of each model: stage lengths and operator tables against the stage
                timer; the stored prediction against the run: peak memory against CUDA's max
                allocated (10%), the roofline lower bound under every stage's fastest call; writes
                this GPU's achieved fractions per operator kind (for predict/data/efficiency.json)
  cuda1         a run on cuda:1 stays on cuda:1 (when a second GPU is visible)

Without CUDA it runs what a CPU can show, on tiny pipelines, and marks the rest SKIP. The
report goes to benchmarks/results/gpu_validation_<device>.md (one file per device name) and
is printed; commit it.
"""

from __future__ import annotations

import argparse
import re
import signal
import tempfile
import time
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

import diffusers
import torch
import transformers

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.optimize import REGISTRY, OptimizationSpec, Target, build
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.tiny import tiny_pipeline

RESULTS = Path(__file__).parent / "results"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
#: (family kind, real-size model, tiny stand-in on CPU, size, steps)
MODELS = {
    "unet": ("sd15", "tiny-sd", 512, 8),
    "mmdit": ("flux-schnell", "tiny-flux", 512, 4),
    "dit": ("pixart-sigma-1024", "tiny-pixart", 512, 8),
}
#: extra parameter sets worth running beyond each technique's variants
EXTRA = {
    "compile": [
        {"mode": "reduce-overhead"},
        {"mode": "default", "fullgraph": True},
        {"mode": "default", "regional": True},
        {"mode": "default", "components": None},  # None: the denoiser and the VAE (filled in below)
    ],
}
#: technique combinations that exercise rules between techniques (the last one is refused)
COMBOS = [
    [("compile", {}), ("offload", {"mode": "model"})],
    [("compile", {"fullgraph": True}), ("offload", {"mode": "model"})],
    [("compile", {"fullgraph": True}), ("offload", {"mode": "group"})],
]


class Report:
    """Rows of (chunk, check, outcome, detail); outcome is PASS, FAIL, REFUSED or SKIP."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

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
            "REFUSED: the technique does not apply and said why before loading anything (a correct outcome).",
            "SKIP: this machine cannot show it (no CUDA, one GPU).",
            "",
            "| chunk | check | outcome | detail |",
            "|---|---|---|---|",
        ]
        for chunk, check, outcome, detail in self.rows:
            lines.append(f"| {chunk} | {check} | {outcome} | {detail.replace('|', '/')} |")
        return "\n".join(lines) + "\n"


def run(spec: BenchSpec):
    """A real diffmeter bench run into a temporary folder; (result, None) or (None, refusal)."""
    with tempfile.TemporaryDirectory() as out:
        try:
            result, _ = bench(spec, out=out)
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


def stage_sums(result) -> tuple[bool, str]:
    """Stages add up to the device total (by construction) and the total matches the wall clock."""
    worst = max(abs(it.total_s - it.wall_s) / it.wall_s for it in result.iterations)
    added = max(
        abs(it.stages.text_encoding_s + it.stages.denoising_s + it.stages.vae_decode_s + it.stages.other_s - it.total_s)
        for it in result.iterations
    )
    return worst < 0.02 and added < 1e-6, f"device total vs wall clock within {100 * worst:.2f}% (limit 2%)"


# ---- chunks -------------------------------------------------------------------------------


def _event_seconds(work, repeats: int) -> float:
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


def _achievable() -> tuple[float, float]:
    """(bf16 matmul TFLOP/s on 8192^3, device-to-device copy GB/s read+written on 1 GiB)."""
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    tflops = 2 * n**3 / _event_seconds(lambda: a @ b, 20) / 1e12
    source = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    target = torch.empty_like(source)
    return tflops, 2 * 2**30 / _event_seconds(lambda: target.copy_(source), 20) / 1e9


def chunk_peak(report: Report) -> None:
    if not CUDA:
        report.add("peak", "bf16 matmul, copy bandwidth", "SKIP", "needs CUDA")
        return
    tflops, bandwidth = _achievable()
    torch.cuda.empty_cache()
    report.add("peak", "bf16 matmul 8192^3", "PASS", f"{tflops:.0f} TFLOP/s achieved (CUDA events)")
    report.add("peak", "device-to-device copy 1 GiB", "PASS", f"{bandwidth:.0f} GB/s read+written")


def chunk_stages(report: Report) -> None:
    for kind in MODELS:
        result, refusal = run(model_spec(kind))
        if result is None:
            report.add("stages", kind, "FAIL", refusal)
            continue
        ok, detail = stage_sums(result)
        clock = "CUDA events" if CUDA else "host clock"
        report.add("stages", f"{kind} ({result.model.name})", "PASS" if ok else "FAIL", f"{clock}: {detail}")


GRAPH_RUNS = {"n": 0}


def _counting_backend(graph_module, example_inputs):
    def counted(*args):
        GRAPH_RUNS["n"] += 1
        return graph_module.forward(*args)

    return counted


def chunk_graph_runs(report: Report) -> None:
    from torch._dynamo import register_backend

    register_backend(_counting_backend, name="gpu_validation_counting")
    entry = resolve("tiny-sd")
    target = Target(entry, get_family("sd"), torch.device(DEVICE), "float32", 4)
    for label, asked in (
        ("compile alone", [("compile", {"backend": "gpu_validation_counting"})]),
        ("compile + model offload", [("compile", {"backend": "gpu_validation_counting"}), ("offload", {})]),
    ):
        pipe = tiny_pipeline(entry)
        placed = any(name == "offload" for name, _ in asked)
        if not placed:
            pipe.to(DEVICE)
        for optimization in build([OptimizationSpec(name=name, params=params) for name, params in asked]):
            optimization.apply(pipe, target)  # on CPU, offload's hooks run with the CPU as their device
        runs = []
        for _ in range(3):
            GRAPH_RUNS["n"] = 0
            pipe("a cat", num_inference_steps=4, height=32, width=32, output_type="np", guidance_scale=1.0)
            runs.append(GRAPH_RUNS["n"])
        ok = runs[0] > 0 and len(set(runs)) == 1
        report.add("graph-runs", label, "PASS" if ok else "FAIL", f"compiled graph runs per call {runs} on {DEVICE}")
        torch._dynamo.reset()


def technique_specs(kind: str, compiling: bool) -> list[tuple[str, list[OptimizationSpec]]]:
    """Every variant of every registered technique but compile, or compile's variants, extra
    parameter sets and combinations with offloading."""
    family = get_family(resolve(MODELS[kind][0]).family)
    specs = []
    for name, cls in sorted(REGISTRY.items()):
        if name == "tf32" or (name == "compile") != compiling:
            continue  # tf32 is on for every CUDA run already
        for variant in cls.variants():
            specs.append((variant.label(), [variant.spec()]))
        for extra in EXTRA.get(name, []):
            if extra.get("components", "") is None:
                extra = {**extra, "components": [family.denoiser, family.decoder]}
            specs.append((_label(name, extra), [OptimizationSpec(name=name, params=extra)]))
    for combo in COMBOS if compiling else []:
        label = " + ".join(_label(name, params) for name, params in combo)
        specs.append((label, [OptimizationSpec(name=name, params=params) for name, params in combo]))
    return specs


def _label(name: str, params: dict) -> str:
    return name + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")


def chunk_techniques(kind: str, compiling: bool):
    def chunk(report: Report) -> None:
        name = f"{'compiling' if compiling else 'techniques'}-{kind}"
        for label, optimizations in technique_specs(kind, compiling):
            started = time.perf_counter()
            try:
                result, refusal = run(model_spec(kind, optimizations=optimizations))
            except Exception as error:  # a crash is the finding: record it and go on
                last = traceback.format_exception_only(type(error), error)[-1].strip()
                report.add(name, label, "FAIL", last[:300])
                continue
            if result is None:
                report.add(name, label, "REFUSED", refusal)
                continue
            ok, detail = stage_sums(result)
            clean = result.summary.compilation.clean
            outcome = "PASS" if ok and clean and result.status == "complete" else "FAIL"
            report.add(
                name,
                label,
                outcome,
                f"{result.summary.latency_s.median:.3f} s/call; {detail}; compilation inside measured calls: "
                f"{'none' if clean else result.summary.compilation}; {time.perf_counter() - started:.0f} s",
            )

    return chunk


def chunk_measures(report: Report) -> None:
    if not CUDA:
        for check in ("0 < MFU < 100%", "energy > 0 J per image", "CUDA memory peaks"):
            report.add("measures", check, "SKIP", "needs CUDA (datasheet peaks, NVML counters, the caching allocator)")
        return
    result, refusal = run(model_spec("mmdit", iterations=3, min_duration_s=10.0))
    if result is None:
        report.add("measures", "flux-schnell run", "FAIL", refusal)
        return
    summary = result.summary
    mfu = summary.mfu.get("total")
    report.add(
        "measures",
        "0 < MFU < 100%",
        "PASS" if mfu is not None and 0 < mfu < 1 else "FAIL",
        f"MFU {'-' if mfu is None else f'{100 * mfu:.1f}%'} against "
        f"{summary.peak.description if summary.peak else 'no known peak'}",
    )
    energy = summary.energy
    joules = energy.gpu_j_per_image
    report.add(
        "measures",
        "energy > 0 J per image",
        "PASS" if joules and joules > 0 else "FAIL",
        f"{joules} J/image ({energy.basis}), {energy.gpu_avg_power_w} W" if energy.available else energy.reason,
    )
    memory = summary.peak_memory
    loaded, allocated, reserved = (
        memory.cuda_loaded_bytes,
        memory.cuda_max_allocated_bytes,
        memory.cuda_max_reserved_bytes,
    )
    report.add(
        "measures",
        "CUDA memory peaks",
        "PASS" if reserved >= allocated >= loaded > 0 else "FAIL",
        f"loaded {loaded / 2**30:.2f} GiB <= max allocated {allocated / 2**30:.2f} GiB "
        f"<= reserved {reserved / 2**30:.2f} GiB",
    )


def _check_trace(report: Report, kind: str, result, table) -> None:
    """The traced call's stage lengths against the stage timer's, and no stage busier than its length."""
    from diffmeter.measure.trace import OUTSIDE

    timed = result.trace.stages.model_dump()
    total = result.trace.total_s
    worst, busiest = 0.0, 0.0
    for stage in table.stages:  # each stage's length against the stage timer's, as a share of the call
        worst = max(worst, abs(stage.range_s - timed[f"{stage.stage}_s"]) / total)
        busy = sum(row.self_s for row in stage.rows if row.name != OUTSIDE)
        busiest = max(busiest, busy / stage.range_s if stage.range_s > 0 else 0.0)
    steps = [abs(r - t) / t for r, t in zip(result.trace.ranges_s["steps"], result.trace.stages.steps_s, strict=True)]
    ok = worst < 0.05 and max(steps) < 0.1 and busiest <= 1.0
    report.add(
        "trace",
        f"{kind} stages",
        "PASS" if ok else "FAIL",
        f"{table.time_base} time: stage lengths within {100 * worst:.1f}% of the call of the stage timer's "
        f"(limit 5%), step ranges within {100 * max(steps):.1f}% (limit 10%), operators busy at most "
        f"{100 * busiest:.0f}% of their stage (limit 100%)",
    )


def chunk_trace(report: Report) -> None:
    """A --trace run of each model: its stage lengths and operators table against the stage timer
    (``_check_trace``); the stored prediction against the run: predicted peak memory against CUDA's max allocated, the
    roofline lower bound against every stage's fastest call; and this device's achieved fractions per
    operator kind from the traced calls, written for predict/data/efficiency.json."""
    import json

    from diffmeter.measure.trace import OpsTable
    from diffmeter.predict.calibrate import calibrate, stage_measurements
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import lower_bounds

    measured = []
    for kind in MODELS:
        with tempfile.TemporaryDirectory() as out:
            try:
                result, folder = bench(model_spec(kind, trace=True), out=out)
            except DiffmeterError as error:
                report.add("trace", kind, "FAIL", str(error))
                continue
            stages = stage_measurements(result)
            table = OpsTable.model_validate_json((folder / result.trace.ops_file).read_text())
            _check_trace(report, kind, result, table)
        if CUDA:  # each traced run's whole stored result: calibration data for predict/
            slug = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
            with open(RESULTS / f"gpu_runs_{slug}.jsonl", "a") as runs:
                runs.write(result.model_dump_json() + "\n")
        prediction = result.prediction
        if prediction is None or prediction.time is None:
            why = result.notes + (prediction.notes if prediction else [])
            report.add("trace", kind, "FAIL", f"no prediction stored: {why}")
            continue
        allocated = result.summary.peak_memory.cuda_max_allocated_bytes
        if allocated:
            off = prediction.peak_memory_bytes / allocated - 1
            report.add(
                "trace",
                f"{kind} peak memory",
                "PASS" if abs(off) <= 0.1 else "FAIL",
                f"predicted {prediction.peak_memory_bytes / 2**30:.3f} GiB, CUDA max allocated "
                f"{allocated / 2**30:.3f} GiB ({100 * off:+.1f}%, limit 10%)",
            )
        time = prediction.time
        above = [s.stage for s in time.stages if s.lower_s > result.summary.stages_s[s.stage].min]
        report.add(
            "trace",
            f"{kind} lower bound",
            "FAIL" if above else "PASS",
            f"lower bound {time.lower_s:.3f} s vs fastest call {result.summary.latency_s.min:.3f} s"
            + (f"; above the measured time in {', '.join(above)}" if above else ""),
        )
        work = operator_work(result.spec.profile_spec())
        measured.append((stages, lower_bounds(work, time.peak_tflops * 1e12, time.bandwidth_bytes_per_s)))
    if not CUDA or not measured:
        report.add("trace", "CUDA calibration", "SKIP", "needs CUDA runs")
        return
    name = re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name()).strip("_")
    models = ", ".join(f"{model} {size}px bf16" for model, _, size, _ in MODELS.values())
    calibration = calibrate(
        measured,
        f"benchmarks/gpu_validation.py --chunk trace on {torch.cuda.get_device_name()}: random weights, {models}",
    )
    target = RESULTS / f"efficiency_cuda_{name}.json"
    target.write_text(json.dumps({"cuda": calibration.model_dump(mode="json")}, indent=2) + "\n")
    report.add("trace", "CUDA calibration", "PASS", f"written to {target.name}: {calibration.fractions}")


def chunk_cuda1(report: Report) -> None:
    if torch.cuda.device_count() < 2:
        report.add("cuda1", "run on cuda:1", "SKIP", f"{torch.cuda.device_count()} GPU(s) visible")
        return
    before = torch.cuda.memory_allocated(0)
    result, refusal = run(model_spec("unet", device="cuda:1"))
    if result is None:
        report.add("cuda1", "run on cuda:1", "FAIL", refusal)
        return
    ok, detail = stage_sums(result)
    stray = torch.cuda.memory_allocated(0) - before
    ok = ok and stray == 0 and result.summary.peak_memory.cuda_max_allocated_bytes > 0
    report.add("cuda1", "run on cuda:1", "PASS" if ok else "FAIL", f"{detail}; {stray} bytes allocated on cuda:0")


CHUNKS = {
    "peak": chunk_peak,
    "stages": chunk_stages,
    "graph-runs": chunk_graph_runs,
    **{f"techniques-{kind}": chunk_techniques(kind, compiling=False) for kind in MODELS},
    **{f"compiling-{kind}": chunk_techniques(kind, compiling=True) for kind in MODELS},
    "measures": chunk_measures,
    "trace": chunk_trace,
    "cuda1": chunk_cuda1,
}


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk", action="append", choices=list(CHUNKS), help="run only these chunks (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the chunks and exit")
    arguments = parser.parse_args()
    if arguments.list:
        print("\n".join(CHUNKS))
        return
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    device_name = torch.cuda.get_device_name(0) if CUDA else "cpu (CPU-possible parts only)"
    report = Report()
    started = time.perf_counter()
    slug = re.sub(r"[^a-z0-9]+", "-", (torch.cuda.get_device_name(0) if CUDA else "cpu").lower()).strip("-")
    path = RESULTS / f"gpu_validation_{slug}.md"
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` stops it with the report still written
    try:
        for name in arguments.chunk or list(CHUNKS):
            try:
                CHUNKS[name](report)
            except Exception as error:  # a crash is the finding: record it with its place, run the next chunk
                frame = traceback.extract_tb(error.__traceback__)[-1]
                where = f"{Path(frame.filename).name}:{frame.lineno}"
                report.add(name, "chunk crashed", "FAIL", f"{type(error).__name__}: {error} ({where})"[:400])
    finally:  # what was found so far is written even when interrupted
        path.write_text(report.markdown(device_name, time.perf_counter() - started, arguments.chunk or []))
        print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
