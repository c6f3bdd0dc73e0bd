"""One extra, untimed pipeline call under torch.profiler (``bench --trace``): a Chrome trace
with diffmeter's stages as labelled ranges, and the operators that took each stage's time.

The stage ranges are ``record_function`` ranges opened and closed at the stage timer's own
marks (``StageTimer.listener``), so a range in the trace is the stage the run's figures
time. The operators table (``ops.json``) is built from the profiler's events by ``measure.ops``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from diffmeter.measure.ops import PREFIX, OpsTable, StageOps, ops_table, top_rows
from diffmeter.measure.stages import Stages, StageTimer
from diffmeter.quiet import native_stderr_to
from diffmeter.stages import STAGE_NAMES

if TYPE_CHECKING:
    import torch

TRACE_FILE = "trace.json.gz"
OPS_FILE = "ops.json"
#: what the profiler's native library printed while starting and stopping (not the terminal)
PROFILER_LOG = "profiler.log"


class TraceSummary(BaseModel):
    """The traced call (extra, untimed: never one of the measured iterations) as results.json
    records it: its files in the run folder, the stage timer's times of that call, and the top
    operators of each stage."""

    trace_file: str = TRACE_FILE
    ops_file: str = OPS_FILE
    time_base: str
    #: the stage timer's times of the traced call (slower than the measured calls: profiler overhead)
    total_s: float
    stages: Stages
    #: each stage's range in the trace, seconds ("steps": one per denoising step)
    ranges_s: dict[str, float | list[float]]
    top_ops: list[StageOps]


#: the stage timer's marks and the trace range each opens
RANGES = {
    "text": STAGE_NAMES["text_encoding"],
    "encode": STAGE_NAMES["image_encoding"],
    "decode": STAGE_NAMES["vae_decode"],
}


class StageRanges:
    """Opens and closes a ``record_function`` range at each of the stage timer's marks."""

    def __init__(self) -> None:
        self.open: dict[str, torch.autograd.profiler.record_function] = {}
        self.steps = 0

    def __call__(self, label: str) -> None:
        stage, edge = label[:-1], label[-1]
        if label == "begin":
            self._open("call", "pipeline call")
        elif label == "end":
            self._close("step")
            self._close("call")
        elif stage == "step" and edge == ">":
            self._open("step", "step 0")
        elif stage == "step":  # a scheduler step ended: the next step starts here (steps are contiguous)
            self._close("step")
            self.steps += 1
            self._open("step", f"step {self.steps}")
        elif edge == ">":
            self._close("step")  # decoding ends the tail after the last step
            self._open(stage, RANGES[stage])
        else:
            self._close(stage)

    def _open(self, key: str, name: str) -> None:
        import torch

        self.open[key] = torch.autograd.profiler.record_function(PREFIX + name)
        self.open[key].__enter__()

    def _close(self, key: str) -> None:
        if key in self.open:
            self.open.pop(key).__exit__(None, None, None)


def trace_call(timer: StageTimer, call, folder: Path, device: torch.device) -> TraceSummary:
    """Run ``call()`` (one pipeline call) once under torch.profiler with the stage timer's
    boundaries as ranges; write the Chrome trace and the operators table into ``folder``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    ranges = StageRanges()
    timer.listener = ranges
    profiler = profile(activities=activities, record_shapes=True, profile_memory=True)
    try:
        # the profiler's native start and stop lines, and what c10 warns while it records the call (CPUAllocator.cpp:
        # "Memory block of unknown size was allocated before the profiling started", freeing a tensor made before it)
        with native_stderr_to(folder / PROFILER_LOG):
            profiler.__enter__()
            try:
                timer.begin()
                call()
                times = timer.end()
            finally:
                profiler.__exit__(None, None, None)
    finally:
        timer.listener = None
    steps = len(times.stages.steps_s)
    tail = f"{PREFIX}step {steps}"  # opened by the last scheduler step, closed by decode or the call's end
    raw = folder / "trace.json"
    profiler.export_chrome_trace(str(raw))
    _write_trace(raw, folder / TRACE_FILE, tail)
    time_base = "cuda" if device.type == "cuda" else "cpu"
    table, ranges_s = ops_table(profiler.events(), steps, time_base)
    (folder / OPS_FILE).write_text(table.model_dump_json(indent=1))
    top = [stage.model_copy(update={"rows": top_rows(stage.rows)}) for stage in table.stages]
    return TraceSummary(time_base=time_base, total_s=times.total_s, stages=times.stages, ranges_s=ranges_s, top_ops=top)


def read_ops(result) -> OpsTable:
    """The operators table of a stored run (a ``BenchResult`` read from its folder)."""
    from diffmeter.errors import DiffmeterError

    if result.trace is None:
        raise DiffmeterError(f"{result.folder} holds no traced call; run `diffmeter bench` with --trace")
    file = result.folder / result.trace.ops_file
    if not file.is_file():
        raise DiffmeterError(f"{file} is missing; re-run the benchmark with --trace")
    return OpsTable.model_validate_json(file.read_text())


def _write_trace(raw: Path, target: Path, tail: str) -> None:
    """The profiler's Chrome trace, gzipped (Perfetto and chrome://tracing open it), with the range
    after the last step named for what it is: part of "other"."""
    trace = json.loads(raw.read_text())
    for event in trace.get("traceEvents", []):
        if event.get("name") == tail:
            event["name"] = PREFIX + "after the last step (other)"
    with gzip.open(target, "wt") as file:
        json.dump(trace, file)
    raw.unlink()
