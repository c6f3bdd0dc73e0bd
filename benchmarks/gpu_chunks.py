"""The chunks of benchmarks/gpu_validation.py that hold diffmeter's figures to independent measurements: the
card's peaks, stage times, MFU, energy and memory, the traced call and the prediction, two processes, a run on
cuda:1, and ONNX Runtime on CUDA. Each check is a rule of ``gpu_checks`` and can fail on a wrong number."""

from __future__ import annotations

import json
import tempfile

import gpu_checks as checks
import torch
from gpu_runs import (
    CUDA,
    MODELS,
    RESULTS,
    Report,
    achievable,
    bench_kept,
    device_slug,
    model_spec,
    run,
    wall_clock,
)

from diffmeter.errors import DiffmeterError
from diffmeter.optimize import OptimizationSpec
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

SKIP_CUDA = "needs CUDA"


def chunk_peak(report: Report) -> None:
    from diffmeter.predict.peaks import device_peak

    if not CUDA:
        report.add("peak", "datasheet peak against a bare matmul", "SKIP", SKIP_CUDA)
        return
    rates = achievable()
    peak = device_peak(torch.cuda.get_device_name(), "bfloat16")
    report.add("peak", "copy 1 GiB device to device", "PASS", f"{rates['copy_gbs']:.0f} GB/s read + written")
    if peak is None:
        report.add("peak", "datasheet peak", "FAIL", f"no bf16 peak for {torch.cuda.get_device_name()} in the table")
        return
    report.add(
        "peak",
        "datasheet peak against a bare matmul",
        *checks.peak_table(peak.tflops, rates["matmul_tflops"], peak.description),
    )


def chunk_stages(report: Report) -> None:
    for kind in MODELS:
        result, refusal = run(model_spec(kind), "stages")
        if result is None:
            report.add("stages", kind, "FAIL", refusal)
            continue
        ok, detail = wall_clock(result)
        report.add("stages", f"{kind} ({result.model.name})", "PASS" if ok else "FAIL", detail)


def chunk_measures(report: Report) -> None:
    """MFU against a bare matmul, memory against the allocator's own event trace, energy against NVML."""
    if not CUDA:
        for check in ("MFU", "energy", "memory"):
            report.add("measures", check, "SKIP", f"{SKIP_CUDA} (NVML counters, the caching allocator)")
        return
    matmul = achievable()["matmul_tflops"]
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=4_000_000)
    before = torch.cuda.memory_allocated()
    result, refusal = run(model_spec("mmdit", iterations=3), "measures")
    snapshot = torch.cuda.memory._snapshot()
    replayed = _replayed_peak(snapshot, torch.cuda.current_device(), before)
    stages = replayed_stage_peaks(snapshot, torch.cuda.current_device(), before)
    torch.cuda.memory._record_memory_history(enabled=None)
    if result is None:
        report.add("measures", "flux-schnell run", "FAIL", refusal)
        return
    summary = result.summary
    if summary.peak is None:
        report.add("measures", "MFU", "FAIL", summary.mfu_note or "no peak")
    else:
        report.add("measures", "MFU", *checks.mfu(summary.achieved_tflops["total"], summary.peak.tflops, matmul))
    allocated = summary.peak_memory.cuda_max_allocated_bytes
    report.add(
        "measures",
        "peak memory",
        *checks.agree(
            "CUDA max allocated (measured calls), bytes",
            allocated,
            replayed,
            "the allocator's event trace replayed (whole run)",
            0.02,
        ),
    )
    measured = summary.peak_memory.cuda_stage_max_allocated_bytes or {}
    for stage, bytes_ in stages.items():
        if stage in measured:
            outcome = checks.agree(
                f"{stage}: CUDA max allocated in the stage (at its marks)",
                measured[stage],
                bytes_,
                "the event trace's allocations made inside that component (by their Python stack)",
                0.02,
            )
            report.add("measures", f"peak memory, {stage}", *outcome)
    report.add("measures", "energy", *_energy_window())


def _replayed_peak(snapshot: dict, device: int, start: int) -> int:
    """The most bytes allocated at once, replaying the allocator's recorded allocations and frees from ``start``."""
    allocated = peak = start
    for event in snapshot["device_traces"][device]:
        if event["action"] == "alloc":
            allocated += event["size"]
            peak = max(peak, allocated)
        elif event["action"] == "free_completed":
            allocated -= event["size"]
    return peak


#: where an allocation's Python stack says it was made (innermost match first), by the stage it belongs to
STAGE_FILES = (
    ("VAE decode", "diffusers/models/autoencoders/"),
    ("text encoding", "transformers/models/"),
    ("denoising step", "diffusers/models/transformers/"),
    ("denoising step", "diffusers/models/unets/"),
    ("denoising step", "diffusers/schedulers/"),
)


def replayed_stage_peaks(snapshot: dict, device: int, start: int) -> dict[str, int]:
    """Each stage's most bytes allocated at once, replaying the allocator's event trace and giving each allocation
    to the stage its recorded Python stack was in (the innermost frame of a text encoder's, denoiser's, scheduler's
    or VAE's source file): an attribution independent of the stage timer's marks."""
    allocated, peaks = start, {}
    for event in snapshot["device_traces"][device]:
        if event["action"] == "alloc":
            allocated += event["size"]
            files = [frame["filename"].replace("\\", "/") for frame in event.get("frames", [])]
            stage = next((name for path in files for name, part in STAGE_FILES if part in path), None)
            if stage is not None:
                peaks[stage] = max(peaks.get(stage, 0), allocated)
        elif event["action"] == "free_completed":
            allocated -= event["size"]
    return peaks


def _energy_window() -> tuple[str, str]:
    """diffmeter's energy meter around 3 s of matmuls, and NVML's total-energy counter of the same GPU read
    directly around the same window."""
    from diffmeter.measure.energy import EnergyMeter

    device = torch.device("cuda", torch.cuda.current_device())
    meter = EnergyMeter(device)
    if not meter.available:
        return "FAIL", f"diffmeter reads no energy here: {meter.reason}"
    nvml = checks.nvml_energy_j(device.index)
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    torch.cuda.synchronize()
    before = nvml()
    key = meter.begin()
    for _ in range(1500):
        a @ b
    reading = meter.end(key)  # Zeus synchronizes before reading
    return checks.energy(reading.gpu_j, nvml() - before)


def chunk_trace(report: Report) -> None:
    """A --trace run of each model: stage lengths and the operators table against the stage timer; the stored
    prediction against the run (peak memory, roofline bound); this GPU's achieved fractions per operator kind."""
    from diffmeter.measure.calibrate import calibrate, stage_measurements
    from diffmeter.measure.ops import OpsTable
    from diffmeter.predict.bench_prediction import run_device
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import BENCH_FP32, flop_rates, lower_bounds

    measured = []
    for kind in MODELS:
        try:
            result, folder = bench_kept(model_spec(kind, trace=True), "trace")
        except DiffmeterError as error:
            report.add("trace", kind, "FAIL", str(error))
            continue
        stages = stage_measurements(result)
        _check_trace(report, kind, result, OpsTable.model_validate_json((folder / result.trace.ops_file).read_text()))
        if CUDA:  # each traced run's whole stored result: calibration data for predict/
            with open(RESULTS / f"gpu_runs_{device_slug()}.jsonl", "a") as runs:
                runs.write(result.model_dump_json() + "\n")
        prediction = result.prediction
        if prediction is None or prediction.time is None:
            report.add("trace", kind, "FAIL", f"no prediction stored: {result.notes}")
            continue
        allocated = result.summary.peak_memory.cuda_max_allocated_bytes
        if allocated:
            report.add(
                "trace",
                f"{kind} peak memory",
                *checks.agree(
                    "predicted peak bytes",
                    prediction.peak_memory_bytes,
                    allocated,
                    "CUDA max allocated",
                    checks.PREDICTION_TOLERANCE,
                ),
            )
        _check_stage_memory(report, kind, prediction.stage_peak_memory_bytes, result.summary.peak_memory)
        time = prediction.time
        if CUDA and time.expected_s is not None:  # the GPU ranges are fitted on published runs
            median = result.summary.latency_s.median
            report.add("trace", f"{kind} expected range", *checks.in_range(median, time.expected_s, time.lower_s))
            measured_j = result.summary.energy.gpu_j_per_image
            if time.energy is not None and measured_j is not None:
                report.add("trace", f"{kind} energy", *checks.energy_in_range(measured_j, time.energy.per_output_j))
        above = [s.stage for s in time.stages if s.lower_s > result.summary.stages_s[s.stage].min]
        report.add(
            "trace",
            f"{kind} lower bound",
            "FAIL" if above else "PASS",
            f"lower bound {time.lower_s:.3f} s vs fastest call {result.summary.latency_s.min:.3f} s"
            + (f"; above the measured time in {', '.join(above)}" if above else ""),
        )
        if CUDA:  # the calibration below is of CUDA runs
            work = operator_work(result.spec.profile_spec())
            rates = flop_rates(run_device(torch.device("cuda"), work.dtype), work, result.fp32_precision or BENCH_FP32)
            measured.append((stages, lower_bounds(work, rates, time.bandwidth_bytes_per_s)))
    if not CUDA or not measured:
        report.add("trace", "CUDA calibration", "SKIP", "needs CUDA runs")
        return
    models = ", ".join(f"{model} {size}px bf16" for model, _, size, _ in MODELS.values())
    source = f"benchmarks/gpu_validation.py --chunk trace on {torch.cuda.get_device_name()}: random weights, {models}"
    calibration = calibrate(measured, source)
    target = RESULTS / f"efficiency_cuda_{device_slug()}.json"
    target.write_text(json.dumps({"cuda": calibration.model_dump(mode="json")}, indent=2) + "\n")
    outcome, detail = checks.fractions(calibration.fractions)
    report.add("trace", "CUDA calibration", outcome, f"{detail}; written to {target.name}")


def _check_stage_memory(report: Report, kind: str, predicted: dict[str, int], memory) -> None:
    """Each stage's predicted peak against CUDA's max allocated inside that stage (reset at every stage mark)."""
    measured = memory.cuda_stage_max_allocated_bytes
    if not measured:
        report.add("trace", f"{kind} peak memory per stage", "SKIP" if not CUDA else "FAIL", "no stage peaks stored")
        return
    for stage, bytes_ in predicted.items():
        if stage not in measured:
            report.add("trace", f"{kind} {stage} peak memory", "FAIL", f"the run stored no peak for {stage}")
            continue
        outcome = checks.agree("predicted", bytes_, measured[stage], "CUDA max allocated", checks.PREDICTION_TOLERANCE)
        report.add("trace", f"{kind} {stage} peak memory", *outcome)


def _check_trace(report: Report, kind: str, result, table) -> None:
    """Each traced stage's length against the stage timer's, as a share of the call; no stage busier than it."""
    from diffmeter.measure.ops import OUTSIDE

    timed, total = result.trace.stages.model_dump(), result.trace.total_s
    worst = max(abs(stage.range_s - timed[f"{stage.stage}_s"]) / total for stage in table.stages)
    busiest = max(
        sum(row.self_s for row in stage.rows if row.name != OUTSIDE) / stage.range_s
        for stage in table.stages
        if stage.range_s > 0
    )
    ranges, timed_steps = result.trace.ranges_s["steps"], result.trace.stages.steps_s
    steps = max(abs(r - t) / total for r, t in zip(ranges, timed_steps, strict=True))
    ok = worst < 0.05 and steps < 0.05 and busiest <= 1.0
    report.add(
        "trace",
        f"{kind} stages",
        "PASS" if ok else "FAIL",
        f"{table.time_base} time: stage lengths within {100 * worst:.1f}% of the call of the stage timer's "
        f"(limit 5%), each step within {100 * steps:.1f}% of the call (limit 5%), operators busy at most "
        f"{100 * busiest:.0f}% of their stage (limit 100%)",
    )


def chunk_two_process(report: Report) -> None:
    """Data parallel 2 and Ulysses 2 on two GPUs, each run's images and figures stored."""
    if torch.cuda.device_count() < 2:
        reason = f"{torch.cuda.device_count()} GPU(s) visible; tests/test_multigpu.py runs both over gloo on CPU"
        report.add("two-process", "data parallel 2, Ulysses 2", "SKIP", reason)
        return
    for label, settings in (("data parallel 2", {"data_parallel": 2}), ("Ulysses 2", {"ulysses_degree": 2})):
        result, refusal = run(
            BenchSpec(
                model="flux-schnell",
                random_weights=True,
                height=512,
                width=512,
                steps=4,
                dtype="bf16",
                device="cuda",
                iterations=2,
                **settings,
            ),
            "two-process",
        )
        if result is None:
            report.add("two-process", label, "FAIL", refusal)
            continue
        devices = sorted(rank.device for rank in result.parallel.ranks)
        ok = result.status == "complete" and devices == ["cuda:0", "cuda:1"]
        report.add("two-process", label, "PASS" if ok else "FAIL", f"ranks on {devices}, {result.status}")


def chunk_cuda1(report: Report) -> None:
    """A run on cuda:1 holds no context on any other GPU (NVML's list of the GPUs this process is on)."""
    if torch.cuda.device_count() < 2:
        report.add("cuda1", "run on cuda:1", "SKIP", f"{torch.cuda.device_count()} GPU(s) visible")
        return
    result, refusal = run(model_spec("unet", device="cuda:1"), "cuda1")
    if result is None:
        report.add("cuda1", "run on cuda:1", "FAIL", refusal)
        return
    report.add("cuda1", "no context on another GPU", *checks.stray_contexts(checks.gpus_with_process(), own=1))


def chunk_onnxruntime(report: Report) -> None:
    """ONNX Runtime's CUDA provider (and TensorRT's, where installed) at float16 and float32 on a tiny UNet,
    its images against the same run in PyTorch (on CPU: the CPU provider at float32)."""
    import onnxruntime

    from diffmeter.measure.quality import compare
    from diffmeter.optimize.onnxruntime_session import PROVIDERS

    for provider in ("cuda", "tensorrt") if CUDA else ("cpu",):
        if PROVIDERS[provider] not in onnxruntime.get_available_providers():
            report.add("onnxruntime", provider, "SKIP", f"this onnxruntime has no {PROVIDERS[provider]}")
            continue
        for dtype in ("float16", "float32") if CUDA else ("float32",):
            base = BenchSpec(model="tiny-sd", steps=4, iterations=2, dtype=dtype, device="cuda" if CUDA else "cpu")
            technique = OptimizationSpec(name="onnxruntime", params={"provider": provider})
            with tempfile.TemporaryDirectory() as out:
                try:
                    reference, theirs = bench(base, out=out)
                    result, mine = bench(base.model_copy(update={"optimizations": [technique]}), out=out)
                except DiffmeterError as error:  # TensorRT's libraries absent: "where installed" (SKIP)
                    absent = provider == "tensorrt" and "could not start TensorrtExecutionProvider" in str(error)
                    report.add("onnxruntime", f"{provider} {dtype}", "SKIP" if absent else "FAIL", str(error))
                    continue
                quality = [
                    compare(mine / image.path, theirs / other.path, image.seed)
                    for image, other in zip(result.images, reference.images, strict=True)
                ]
            worst = min(float("inf") if q.identical else q.psnr_db for q in quality)
            ok = result.status == "complete" and worst > 30
            said = "identical" if worst == float("inf") else f"worst PSNR {worst:.1f} dB"
            outcome = "PASS" if ok else "FAIL"
            report.add("onnxruntime", f"{provider} {dtype}", outcome, f"images against PyTorch's: {said} (limit 30 dB)")
