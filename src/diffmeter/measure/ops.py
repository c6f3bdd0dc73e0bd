"""The operators table of a profiled pipeline call: each stage's operators by self time (CPU time on CPU
runs, kernel time on CUDA runs), their kinds, and their FLOPs from torch.utils.flop_counter's formulas applied
to the shapes the profiler recorded, counted once at the outermost operator that has a formula and credited
to the operator below it that did the work (``aten::addmm`` under ``aten::linear``, the CPU convolution kernel
under ``aten::convolution``). A stage's remaining time, spent outside any operator (Python, the pipeline's
own code, the profiler; on CUDA: no kernel running), is a row of its own, so a stage's rows add up to its
length. On CUDA a stage's length is its range on the GPU's timeline (kineto mirrors each ``record_function``
range there, from its first kernel to its last), as the stage timer's CUDA events measure it, and a kernel
belongs to the stage whose host range launched it (torch joins kernels to operators by correlation id): the
host runs ahead of the GPU, so its ranges are not the stages' lengths.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

from pydantic import BaseModel

from diffmeter.flops.kinds import KINDS, kind_of
from diffmeter.stages import STAGE_NAMES
from diffmeter.stages import STAGES as PIPELINE_STAGES

#: prefix of diffmeter's own ranges in the trace
PREFIX = "diffmeter: "
#: the stage tables, in pipeline order
STAGES = (*PIPELINE_STAGES, "other")
#: the stage of each range the stage timer opens in a trace (measure.trace.RANGES)
STAGE_OF_RANGE = {name: stage for stage, name in STAGE_NAMES.items()}
OUTSIDE = "(outside operators: Python, framework)"
#: operators per stage kept in results.json (ops.json holds them all)
TOP = 5


class OpRow(BaseModel):
    """One operator's share of a stage: its self time (seconds), calls and, where a formula knows
    them, FLOPs and the FLOP/s it achieved (TFLOP/s: 10^12 FLOP per second, 2 per multiply-add)."""

    name: str
    kind: str
    self_s: float
    share: float
    calls: int
    flops: int | None = None
    achieved_tflops: float | None = None


class KindTotal(BaseModel):
    """All operators of one kind in a stage."""

    self_s: float
    share: float
    calls: int
    flops: int | None = None
    achieved_tflops: float | None = None


class StageOps(BaseModel):
    """A stage of the traced call: its range in the trace (seconds) and its operators by self time,
    the time outside any operator last (``OUTSIDE``)."""

    stage: str
    range_s: float
    rows: list[OpRow]
    kinds: dict[str, KindTotal]


class OpsTable(BaseModel):
    """What ``ops.json`` holds: every operator of every stage of the traced call."""

    #: "cpu": self CPU time per operator; "cuda": self kernel time per operator
    time_base: str
    stages: list[StageOps]


def top_rows(rows: list[OpRow]) -> list[OpRow]:
    """A stage's first ``TOP`` operators and its outside-operators row: what results.json keeps."""
    ops = [row for row in rows if row.name != OUTSIDE]
    return ops[:TOP] + [row for row in rows if row.name == OUTSIDE]


def ops_table(events, steps: int, time_base: str) -> tuple[OpsTable, dict]:
    """Operators by stage from the profiler's events; also each stage range's length (seconds)."""
    from torch.autograd import DeviceType

    ranges = [event for event in events if event.name.startswith(PREFIX)]
    host = [event for event in ranges if event.device_type == DeviceType.CPU]
    stage_of = {event.id: _stage(event.name[len(PREFIX) :], steps) for event in host}  # who launched what
    timeline = host
    if time_base == "cuda":  # lengths on the GPU's clock, as the stage timer's CUDA events measure them
        timeline = [event for event in ranges if event.device_type != DeviceType.CPU] or host
    seconds = defaultdict(float)
    ends = {}  # each step range's end: steps are contiguous, a step runs from the previous one's end
    for event in timeline:
        name = event.name[len(PREFIX) :]
        if name.startswith("step ") and int(name.split()[1]) < steps:
            ends[int(name.split()[1])] = event
        elif name != "pipeline call":
            seconds[_stage(name, steps)] += (event.time_range.end - event.time_range.start) / 1e6
    step_seconds, previous = [], None
    for index in sorted(ends):
        start = ends[index].time_range.start if previous is None else previous
        step_seconds.append((ends[index].time_range.end - start) / 1e6)
        previous = ends[index].time_range.end
    if step_seconds:
        seconds["denoising"] = sum(step_seconds)
    call = next((event for event in timeline if event.name == PREFIX + "pipeline call"), None)
    if call is not None:  # "other" is the call minus its stages, as the stage timer defines it
        total = (call.time_range.end - call.time_range.start) / 1e6
        seconds["other"] = total - sum(seconds.get(stage, 0.0) for stage in STAGES if stage != "other")

    by_stage: dict[str, dict[str, list]] = {stage: defaultdict(lambda: [0.0, 0, 0, False]) for stage in STAGES}
    for event in events:
        if event.name.startswith(PREFIX):
            continue
        owner = _owner(event, stage_of)
        if owner is None:
            continue
        row = by_stage[owner][event.name]
        row[0] += _self_s(event, time_base)
        row[1] += 1
        flops = operator_flops(event)
        if flops is not None and not _counted_above(event):
            worker = _worker(event, time_base)
            cell = by_stage[owner][worker.name]
            cell[2] += flops
            cell[3] = True

    stages = []
    for stage in STAGES:
        rows = [
            _row(name, self_s, calls, flops if known else None, seconds[stage])
            for name, (self_s, calls, flops, known) in by_stage[stage].items()
            if self_s > 0 or known
        ]
        if stage in seconds:  # the rest of the stage: no operator of its own ran (on CUDA: no kernel)
            busy = sum(row.self_s for row in rows)
            rows.append(_row(OUTSIDE, max(0.0, seconds[stage] - busy), 1, None, seconds[stage], kind="other"))
        if stage not in seconds and not rows:
            continue
        rows.sort(key=lambda row: (row.name == OUTSIDE, -row.self_s))
        stages.append(StageOps(stage=stage, range_s=seconds[stage], rows=rows, kinds=_kinds(rows, seconds[stage])))
    ranges_s = {stage: seconds[stage] for stage in STAGES if stage in seconds}
    ranges_s["steps"] = step_seconds
    return OpsTable(time_base=time_base, stages=stages), ranges_s


def _stage(range_name: str, steps: int) -> str:
    if range_name in STAGE_OF_RANGE:
        return STAGE_OF_RANGE[range_name]
    if range_name.startswith("step ") and int(range_name.split()[1]) < steps:
        return "denoising"
    return "other"  # the whole call's range, and the tail after the last step


def _owner(event, stage_of: dict) -> str | None:
    """The stage of the innermost diffmeter range around ``event`` (None: outside the call)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.id in stage_of:
            return stage_of[parent.id]
        parent = parent.cpu_parent
    return None


def _self_s(event, time_base: str) -> float:
    if time_base == "cuda":
        return event.self_device_time_total / 1e6
    return event.self_cpu_time_total / 1e6


def _worker(event, time_base: str):
    """The operator of the same kind under ``event`` (itself included) with the most self time: the
    one that computes (the CPU convolution kernel under ``aten::convolution``)."""
    kind = kind_of(event.name)
    best, stack = event, [event]
    while stack:
        current = stack.pop()
        if kind_of(current.name) == kind and _self_s(current, time_base) > _self_s(best, time_base):
            best = current
        stack.extend(current.cpu_children)
    return best


def _counted_above(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if operator_flops(parent) is not None:
            return True
        parent = parent.cpu_parent
    return False


def operator_flops(event) -> int | None:
    """FLOPs of one operator call from torch.utils.flop_counter's formulas and its recorded shapes."""
    import torch
    from torch.utils import flop_counter

    name = event.name.removeprefix("aten::")
    if name == event.name or not event.input_shapes:
        return None
    shapes = event.input_shapes
    concrete = getattr(event, "concrete_inputs", None) or [None] * len(shapes)
    args = [value if value is not None else shape for shape, value in zip(shapes, concrete, strict=False)]
    try:
        if name == "scaled_dot_product_attention":  # composite: the kernel below differs per device
            return int(flop_counter.sdpa_flop_count(*args[:3]))
        packet = getattr(torch.ops.aten, name, None)
        formula = flop_counter.flop_registry.get(packet)
        if formula is None or not hasattr(formula, "__wrapped__"):
            # No formula, or one registered get_raw (torch/utils/flop_counter.py: the fused attention
            # kernels `_efficient_attention_forward`, `_flash_attention_forward`): those read tensors, not
            # recorded shapes, and always run inside the SDPA operator that is counted instead.
            return None
        out = _conv_output(args) if "conv" in name else None
        return int(formula(*args[: _positional(formula)], out_val=out))
    except (TypeError, ValueError, IndexError, AssertionError):
        return None  # shapes the formula cannot read (nested tensors, missing arguments)


def _positional(formula) -> int | None:
    """How many positional arguments the formula reads (addmm's ignores beta and alpha); None: all."""
    parameters = inspect.signature(formula).parameters.values()
    if any(parameter.kind is parameter.VAR_POSITIONAL for parameter in parameters):
        return None
    return sum(
        parameter.kind is parameter.POSITIONAL_OR_KEYWORD and parameter.name != "out_shape" for parameter in parameters
    )


def _conv_output(args: list) -> list[int]:
    """A (non-transposed) convolution's output shape from its input, weight, stride, padding, dilation."""
    x, w, _bias, stride, padding, dilation = args[:6]
    spatial = [
        (size + 2 * pad - dil * (kernel - 1) - 1) // step + 1
        for size, kernel, step, pad, dil in zip(x[2:], w[2:], stride, padding, dilation, strict=True)
    ]
    return [x[0], w[0], *spatial]


def _row(name: str, self_s: float, calls: int, flops: int | None, stage_s: float, kind: str | None = None) -> OpRow:
    return OpRow(
        name=name,
        kind=kind or kind_of(name),
        self_s=self_s,
        share=self_s / stage_s if stage_s > 0 else 0.0,
        calls=calls,
        flops=flops,
        achieved_tflops=flops / self_s / 1e12 if flops and self_s > 0 else None,
    )


def _kinds(rows: list[OpRow], stage_s: float) -> dict[str, KindTotal]:
    totals = {}
    for kind in KINDS:
        members = [row for row in rows if row.kind == kind and row.name != OUTSIDE]
        if not members:
            continue
        self_s = sum(row.self_s for row in members)
        counted = [row for row in members if row.flops is not None]
        flops = sum(row.flops for row in counted) if counted else None
        counted_s = sum(row.self_s for row in counted)  # the rate of the operators whose FLOPs are known
        totals[kind] = KindTotal(
            self_s=self_s,
            share=self_s / stage_s if stage_s > 0 else 0.0,
            calls=sum(row.calls for row in members),
            flops=flops,
            achieved_tflops=flops / counted_s / 1e12 if flops and counted_s > 0 else None,
        )
    return totals
