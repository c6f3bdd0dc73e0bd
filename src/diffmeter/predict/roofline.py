"""Seconds per generation on a device, from every operator's work (``operators``).

Two bounds, each saying what it bounds:
- lower bound, of the eager operators as dispatched: each operator takes at least max(FLOPs / peak, bytes moved /
  bandwidth), summed over every operator of every call, the peak being the dense peak of the dtype it runs at, its
  call's or its own (a float32 VAE in a bfloat16 run, SDXL's float32 decode, T5's ``wo`` kept in float32:
  float32's, or TF32's for the matmuls and convolutions that run on TF32 tensor cores, ``BENCH_FP32``); an
  operator whose bytes fit in the card's L2 cache is charged no memory time (its inputs may still be there; no L2
  bandwidth is assumed), so a small image on a card with a large L2 is not bounded by DRAM it may never touch; a
  call is never under its ideal bound.
- ideal bound, of any implementation at the dtypes the calls run at (compiled, fused): per call, max(its FLOPs / the
  dense peaks, its weights read once / bandwidth), weights no larger than L2 not charged (an fp8 run is bounded at
  the fp8 peak, not by this).
Expected: each operator kind's lower bound divided by the fraction of
it that kind achieves, plus a cost per attention score (its softmax exponential runs on the special-function units,
a few TFLOP/s on an H100 against the tensor cores' hundreds: attention with a small head dimension is slower per
FLOP than its FLOPs say; attention on a faster kernel than the calibration's, cuDNN's on Hopper, divided by its
measured ratio, ``attention_kernels``), plus a fixed cost per operator (launch, dispatch, Python), all as ranges
calibrated on measured runs (``expected_range``; ``data/efficiency.json``, written by ``benchmarks/roofline_cpu.py`` for
CPUs and ``benchmarks/calibrate_published.py``, from published runs, per GPU architecture). A device class without a
calibration gets the lower bound alone, and says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from diffmeter.errors import DiffmeterError
from diffmeter.predict.attention_kernels import (
    attention_speedup,
    installed_torch,
    sdpa_default,
    stack_kernel,
    with_default_kernel,
)
from diffmeter.predict.cache_time import time_range
from diffmeter.predict.calibration import Calibration, calibration_for, fitted_units, unfitted_peak
from diffmeter.predict.devices import Device, uncalibrated
from diffmeter.predict.energy import predict_energy, why_no_energy
from diffmeter.predict.expected_range import expected_s, host_share, outside, stage_range, whole_range
from diffmeter.predict.host_time import host_stage_s
from diffmeter.predict.peaks import PRECISION, conv_key
from diffmeter.predict.power_limit import power_limit, sustained
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork, StageTime, TimePrediction
from diffmeter.stages import STAGES

#: per operator group of a call, how much faster than the calibration's kernels it runs (``kernel_speedup``)
Speedup = Callable[[CallWork, OperatorGroup], float]
#: the operator kinds float32 work may run on TF32 tensor cores: cuBLAS matmuls and cuDNN convolutions
TF32_KINDS = ("matmul", "convolution")
#: how a diffmeter bench on CUDA runs float32 matmuls and convolutions: TF32 unless --no-tf32 (optimize/tf32.py)
BENCH_FP32 = {"matmul": "tf32", "convolution": "tf32"}
#: PyTorch's own defaults, what a published diffusers run had unless it says otherwise: float32 matmuls in IEEE
#: float32 (torch/backends/cuda/__init__.py: ``allow_tf32`` starts False), cuDNN convolutions in TF32
#: (torch/backends/cudnn/__init__.py: ``allow_tf32`` starts True; torch 2.13 reads "tf32" for cudnn.conv)
TORCH_FP32 = {"matmul": "ieee", "convolution": "tf32"}
#: a bench with --no-tf32: both in strict IEEE float32 (runs/lifecycle.py, optimize/tf32.py ``fp32_math(False)``)
STRICT_FP32 = {"matmul": "ieee", "convolution": "ieee"}


def bench_fp32_math(tf32: bool) -> Mapping[str, str]:
    """How a bench on CUDA runs float32 matmuls and convolutions, with TF32 (its default) or without."""
    return BENCH_FP32 if tf32 else STRICT_FP32


@dataclass(frozen=True)
class FlopRates:
    """The FLOP/s bounding each operator: ``default``, or ``by_call[(dtype, kind)]`` for an operator of ``kind`` in
    a call at ``dtype`` (None: the run's, ``dtype``) where that differs: a float32 VAE in a bfloat16 run, SDXL's
    float32 decode, float32 matmuls on TF32 tensor cores."""

    default: float
    dtype: str | None = None
    by_call: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def of(self, dtype: str | None, kind: str) -> float:
        return self.by_call.get((dtype or self.dtype, kind), self.default)

    def of_group(self, call: CallWork, group: OperatorGroup) -> float:
        """The FLOP/s bounding ``group``'s operators: at their own dtype where it differs from ``call``'s."""
        return self.of(group.dtype or call.dtype, group.kind)


def kind_peak(device: Device, dtype: str, kind: str, fp32_math: Mapping[str, str] = BENCH_FP32) -> float | None:
    """The dense peak (TFLOP/s) of an operator of ``kind`` at ``dtype``: convolutions at the rate measured on
    convolutions where the device has one (a CPU: oneDNN's kernels, not MKL's SGEMM, ``cpu_peaks``); float32 matmuls
    and convolutions at the TF32 peak where ``fp32_math`` runs them so ("tf32") and the card has one, else the
    dtype's."""
    if kind == "convolution" and (measured := device.tflops.get(conv_key(PRECISION.get(dtype, dtype)))):
        return measured
    if dtype == "float32" and kind in TF32_KINDS and fp32_math.get(kind) == "tf32" and "tf32" in device.tflops:
        return device.tflops["tf32"]
    return device.peak_tflops(dtype)


def kinds_of(work: OperatorWork) -> set[tuple[str, str, str]]:
    """(component, dtype, kind) of every operator that does FLOPs, at the dtype it runs at (its call's, or its own
    where that differs: ``OperatorGroup.dtype``)."""
    return {
        (call.component, group.dtype or call.dtype or work.dtype, group.kind)
        for call in work.calls
        for group in call.operators
        if group.flops
    }


def flop_rates(device: Device, work: OperatorWork, fp32_math: Mapping[str, str] = BENCH_FP32) -> FlopRates:
    """The FLOP/s bounding each of ``work``'s operators on ``device`` (every peak present: ``missing_figures``);
    the default is the peak of the run's matmuls."""
    default = kind_peak(device, work.dtype, "matmul", fp32_math)
    by_call = {
        (dtype, kind): peak * 1e12
        for _, dtype, kind in kinds_of(work)
        if (peak := kind_peak(device, dtype, kind, fp32_math)) != default
    }
    return FlopRates(default * 1e12, work.dtype, by_call)


def other_peaks(device: Device, work: OperatorWork, fp32_math: Mapping[str, str] = BENCH_FP32) -> list[str]:
    """What the operators not charged the run's own peak (its matmuls', ``TimePrediction.peak_tflops``) are charged,
    per component and dtype: every kind of the calls at another dtype than the run's ("vae in float32: convolution
    at 494.7 TFLOP/s (TF32), attention at 66.9 TFLOP/s"), and the run's kinds at another peak (a float32 run's
    attention beside its matmuls on TF32)."""
    title = kind_peak(device, work.dtype, "matmul", fp32_math)
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for component, dtype, kind in sorted(kinds_of(work)):
        peak = kind_peak(device, dtype, kind, fp32_math)
        if dtype != work.dtype or peak != title:
            mode = " (TF32)" if peak != device.peak_tflops(dtype) else ""
            if kind == "convolution" and peak == device.tflops.get(conv_key(PRECISION.get(dtype, dtype))):
                mode = " (measured on convolutions)"
            found[component, dtype].append(f"{kind} at {peak:,.4g} TFLOP/s{mode}")
    return [f"{component} in {dtype}: {', '.join(kinds)}" for (component, dtype), kinds in found.items()]


def stage_scores(work: OperatorWork, stage: str, kernel: Speedup | None = None) -> float:
    """The attention scores of ``stage``'s operators over one generation (``OperatorGroup.scores``), each divided
    by how much faster than the calibration's kernels its attention runs where ``kernel`` is given."""
    return sum(
        g.scores * g.calls * c.count / (kernel(c, g) if kernel else 1.0)
        for c in work.calls
        if c.stage == stage
        for g in c.operators
    )


def kernel_speedup(work: OperatorWork, architecture: str | None, attention: str) -> Speedup:
    """Per operator group, how much faster than the calibration's kernels it runs when SDPA's attention runs on
    ``attention`` (``attention_kernels.attention_speedup``)."""

    def speedup(call: CallWork, group: OperatorGroup) -> float:
        return attention_speedup(attention, architecture, group, group.dtype or call.dtype or work.dtype)

    return speedup


def operator_lower_s(flops: int, moved: int, peak_flops: float, bandwidth: float, l2_bytes: int | None = None) -> float:
    """One operator's least time; bytes that fit in ``l2_bytes`` cost none."""
    return max(flops / peak_flops, 0.0 if l2_bytes and moved <= l2_bytes else moved / bandwidth)


def lower_bounds(
    work: OperatorWork, rates: FlopRates, bandwidth: float, l2_bytes: int | None = None, kernel: Speedup | None = None
) -> dict[str, dict[str, list[float]]]:
    """Per stage, per operator kind: [lower-bound seconds, operators] over one generation; with ``kernel``, each
    group's seconds divided by how much faster than the calibration's kernels it runs (``kernel_speedup``): the
    expected time's input, in the calibration's units, no longer a bound."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for call in work.calls:
        for group in call.operators:
            total = found[call.stage][group.kind]
            peak = rates.of_group(call, group)
            seconds = operator_lower_s(group.flops, group.bytes, peak, bandwidth, l2_bytes)
            seconds /= kernel(call, group) if kernel else 1.0
            total[0] += seconds * group.calls * call.count
            total[1] += group.calls * call.count
    return found


def call_bounds(
    call: CallWork, read: int, rates: FlopRates, bandwidth: float, l2_bytes: int | None = None
) -> tuple[float, float]:
    """One call's (eager, ideal) seconds, times its count. Ideal: its FLOPs at the dense peaks or its weights
    (``read`` bytes) once, whichever takes longer. Eager: its operators' bounds summed, and never under the ideal
    (an operator's bytes may each fit in L2 while the call's weights do not)."""
    compute = sum(group.flops * group.calls / rates.of_group(call, group) for group in call.operators)
    ideal = max(compute, 0.0 if l2_bytes and read <= l2_bytes else read / bandwidth)
    eager = sum(
        operator_lower_s(group.flops, group.bytes, rates.of_group(call, group), bandwidth, l2_bytes) * group.calls
        for group in call.operators
    )
    return max(eager, ideal) * call.count, ideal * call.count


def stage_bounds(
    work: OperatorWork, weights: dict[str, int], rates: FlopRates, bandwidth: float, l2_bytes: int | None = None
) -> dict[str, tuple[float, float]]:
    """Per stage, (eager, ideal) seconds over one generation; ``weights``: the bytes each component's call reads
    of its weights at least."""
    found: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for call in work.calls:
        eager, ideal = call_bounds(call, weights.get(call.component, 0), rates, bandwidth, l2_bytes)
        found[call.stage][0] += eager
        found[call.stage][1] += ideal
    return {stage: (eager, ideal) for stage, (eager, ideal) in found.items()}


def missing_figures(device: Device, work: OperatorWork, fp32_math: Mapping[str, str] = BENCH_FP32) -> str | None:
    """Why ``device``'s figures cannot give ``work`` a time, naming each missing figure (a peak of a dtype it runs
    at, the memory bandwidth) and the option that gives a time; None where nothing is missing."""
    dtypes = {dtype for _, dtype, kind in kinds_of(work) if kind_peak(device, dtype, kind, fp32_math) is None}
    if kind_peak(device, work.dtype, "matmul", fp32_math) is None:
        dtypes.add(work.dtype)
    if not dtypes and device.bandwidth_bytes_per_s:
        return None
    cast = sorted({(c, d) for c, d, _ in kinds_of(work) if d in dtypes and d != work.dtype})
    because = f" ({'; '.join(f'its {c} runs in {d}' for c, d in cast)})" if cast else ""
    if device.given:  # one peak for every dtype, or none
        given = ["no TFLOPS"] * bool(dtypes) + ["no bandwidth"] * (not device.bandwidth_bytes_per_s)
        return f'--gpu-spec gives {" and ".join(given)}: add them, e.g. "80GB,989TFLOPS,3.35TB/s"'
    lacking = ([f"no {' or '.join(sorted(dtypes))} peak{because}"] if dtypes else []) + (
        [] if device.bandwidth_bytes_per_s else ["no memory bandwidth"]
    )
    has = [dtype for dtype in ("float16", "bfloat16", "float32") if kind_peak(device, dtype, "matmul") is not None]
    figures = 'give its figures with --gpu-spec (e.g. "80GB,989TFLOPS,3.35TB/s")'
    fixes = [] if device.bandwidth_bytes_per_s and has else [figures]
    if dtypes and has:
        flags = ([f"--dtype {has[0]}"] if work.dtype in dtypes else []) + [
            f"--component-dtype {c}={has[0]}" for c, _ in cast
        ]
        fixes.insert(0, f"to time it in {has[0]}, which it has: {' '.join(flags)}")
    return f"the table gives the {device.name} {' and '.join(lacking)}; {', or '.join(fixes)}"


def predict_time(
    work: OperatorWork,
    device: Device,
    calibration: Calibration | None = None,
    weights: dict[str, int] | None = None,
    outputs: int = 1,
    fp32_math: Mapping[str, str] = BENCH_FP32,
    attention: str | None = None,
    torch_version: str | None = None,
) -> TimePrediction:
    """The time of the generation ``work`` describes on ``device``, each call at the peak of the dtype it runs at;
    ``calibration`` the shipped one for the device's kind; ``weights``: the bytes each component's call reads of
    its weights at least (``MemoryPrediction.weight_read_bytes``), for the ideal bound; ``outputs``: the images (or
    videos) one generation makes, for the energy per output; ``fp32_math``: how float32 matmuls and convolutions
    run ("tf32" or "ieee" each; a bench's own default); ``attention``: the kernel SDPA runs on (None: its default
    on this card with ``torch_version`` at the run's dtype, ``sdpa_default``, its work priced as that kernel's);
    ``torch_version``: the run's (None: the installed one).
    A cached ``work`` is timed at both ends of its skipped share (``cache_time.time_range``)."""
    if work.cache is not None:
        return time_range(
            work, lambda w: predict_time(w, device, calibration, weights, outputs, fp32_math, attention, torch_version)
        )
    torch_version = torch_version or installed_torch()
    if attention is None and device.kind == "cuda":
        # the kernel the stack names is the one timed: SDPA's math path where it is the default (bfloat16 before sm80)
        work = with_default_kernel(work, device.architecture, torch_version)
    attention = attention or sdpa_default(device.architecture, torch_version, work.dtype)
    kernel = kernel_speedup(work, device.architecture, attention)
    lacking = missing_figures(device, work, fp32_math)
    if lacking:
        raise DiffmeterError(lacking)
    rates = flop_rates(device, work, fp32_math)
    calibration = calibration or calibration_for(device)
    if unfitted := unfitted_peak(device, calibration) or (calibration and calibration.missing_for(work)):
        calibration = None
    hosts = host_stage_s(work, calibration.host) if calibration and calibration.host else {}
    bounds = lower_bounds(work, rates, device.bandwidth_bytes_per_s, device.l2_bytes)
    ranges, per_operator = expected_ranges(work, device, calibration, kernel, fp32_math) if calibration else ({}, 0)
    both = stage_bounds(work, weights or {}, rates, device.bandwidth_bytes_per_s, device.l2_bytes)
    stages = []
    for stage in STAGES:
        if stage not in bounds:
            continue
        kinds = bounds[stage]
        flops = sum(g.flops * g.calls * c.count for c in work.calls if c.stage == stage for g in c.operators)
        moved = sum(g.bytes * g.calls * c.count for c in work.calls if c.stage == stage for g in c.operators)
        operators = int(sum(count for _, count in kinds.values()))
        gpu = ranges.get(stage)
        host = hosts.get(stage)
        expected = stage_range(gpu, host, both[stage][0]) if gpu else None
        stages.append(
            StageTime(
                stage=stage,
                operators=operators,
                flops=flops,
                bytes=moved,
                lower_s=both[stage][0],
                expected_s=expected,
                gpu_s=gpu if host else None,
                host_s=host,
                ideal_s=both[stage][1] if weights is not None else None,
            )
        )
    lower, operators = sum(stage.lower_s for stage in stages), sum(stage.operators for stage in stages)
    call = calibration.host.call_s if calibration and calibration.host else None
    whole = whole_range([stage.expected_s for stage in stages], calibration) if calibration else None
    # on the fit's own measure (sustained peaks, the kernel's speed-up): the datasheet's bound would call a
    # power-limited card's run smaller than the same run fitted
    launch_bound = outside(calibration, per_operator) if calibration and operators else None
    busy, host_bound = host_share(stages, whole)
    return TimePrediction(
        device=device.name,
        dtype=work.dtype,
        peak_tflops=rates.default / 1e12,
        peak_precision="tf32"
        if kind_peak(device, work.dtype, "matmul", fp32_math) != device.peak_tflops(work.dtype)
        else None,
        other_peaks=other_peaks(device, work, fp32_math),
        power_limit=limit.describe()
        if ranges and calibration and (limit := power_limit(device, calibration.power_exponent))
        else None,
        bandwidth_bytes_per_s=device.bandwidth_bytes_per_s,
        stages=stages,
        lower_s=lower,
        expected_s=whole,
        stack=f"torch {(torch_version or 'not installed').split('+')[0]}, SDPA on "
        f"{stack_kernel(attention, device.architecture)}"
        if device.kind == "cuda"
        else None,
        outside_calibration=launch_bound,
        outside_stages_s=call,
        host_bound=host_bound,
        busy_share=busy,
        energy=predict_energy(whole, device, outputs, calibration, busy) if calibration else None,
        energy_left_out=why_no_energy(device, calibration),
        ideal_s=sum(both[stage.stage][1] for stage in stages) if weights is not None else None,
        l2_bytes=device.l2_bytes,
        calibration=calibration.source_for(work, "" if device.given else device.name)
        if calibration
        else f"no expected range: {unfitted or uncalibrated(device)}; the lower bound is shown",
    )


def expected_ranges(
    work: OperatorWork, device: Device, calibration: Calibration, kernel: Speedup, fp32_math: Mapping[str, str]
) -> tuple[dict[str, tuple[float, float]], float]:
    """Per stage, the range ``calibration`` expects of ``work`` (``expected_s``), each call priced by the fit of its
    variant (``Calibration.fits_for``: a CPU's bfloat16 and compiled calls by their own), each fit's fractions of
    the peaks it was fitted on (``fitted_units``), each peak at the share of it the card's TDP sustains
    (``power_limit``, to the calibration's exponent); and the seconds per operator of those inputs, the measure
    the fit's ``least_bound_per_operator_s`` is of (``fit_published.PublishedRun.eager_s`` per kernel)."""
    found: dict[str, tuple[float, float]] = {}
    seconds, count = 0.0, 0
    for fit, calls in calibration.fits_for(work):
        part = work.model_copy(update={"calls": calls})
        rates = flop_rates(fitted_units(sustained(device, calibration.power_exponent), fit), part, fp32_math)
        for stage, kinds in lower_bounds(part, rates, device.bandwidth_bytes_per_s, device.l2_bytes, kernel).items():
            operators = int(sum(count for _, count in kinds.values()))
            low, high = expected_s(kinds, operators, fit, stage_scores(part, stage, kernel))
            before = found.get(stage, (0.0, 0.0))
            found[stage] = (before[0] + low, before[1] + high)
            seconds, count = seconds + sum(s for s, _ in kinds.values()), count + operators
    return found, seconds / count if count else 0.0
