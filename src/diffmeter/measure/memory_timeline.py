"""Peak memory per stage of a real run, read from torch.profiler's memory timeline.

The pipeline's call runs under ``torch.profiler.profile(profile_memory=True)``; every allocation and
free the allocator reports is an event, so the live bytes at any moment are their running sum. Each
component's calls are marked with ``record_function`` and a stage's peak is the largest running sum
inside its marks. Tensors allocated before profiling (the loaded components' parameters and buffers)
are not in the timeline and are added as their storages' bytes.

Convolution kernels on CPU allocate scratch buffers inside the operator (``_slow_conv2d_forward``'s
im2col columns, oneDNN's reorders and scratchpad) and free them before it returns: no tensor holds
them, so no live-tensor count can see them. They are told apart here (an allocation freed before the
convolution kernel that made it ends) and reported both ways: the peak of tensors, and with scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from pydantic import BaseModel
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.profiler._memory_profiler import OpTree

from diffmeter.measure.stored_weights import storages_bytes

_MARK = "diffmeter-stage::"
#: CPU convolution kernels whose scratch buffers are allocated and freed inside the call
CONVOLUTION_KERNELS = frozenset(
    {
        "aten::_slow_conv2d_forward",
        "aten::mkldnn_convolution",
        "aten::slow_conv3d_forward",
        "aten::slow_conv_dilated2d",
        "aten::slow_conv_dilated3d",
        "aten::slow_conv_transpose2d",
        "aten::slow_conv_transpose3d",
    }
)


class MeasuredMemory(BaseModel):
    """Bytes: parameters resident before the call, and the peaks of live bytes (parameters included):
    of tensors, and of everything the allocator handed out (tensors plus convolution scratch)."""

    resident_param_bytes: int
    #: stage name -> the largest live bytes of tensors during that stage's calls
    stage_peak_bytes: dict[str, int]
    peak_bytes: int
    #: the same with convolution kernels' scratch buffers counted
    stage_peak_with_scratch_bytes: dict[str, int]
    peak_with_scratch_bytes: int


@contextmanager
def _marked(components: dict[str, tuple[torch.nn.Module, str, str]]):
    """Wrap each component's called method (``forward`` or ``decode``) in a ``record_function`` mark."""
    originals = []
    for module, method, stage in components.values():
        original = getattr(module, method)

        def marked(*args, _original=original, _stage=stage, **kwargs):
            with record_function(_MARK + _stage):
                return _original(*args, **kwargs)

        originals.append((module, method, vars(module).get(method)))
        setattr(module, method, marked)
    try:
        yield
    finally:
        for module, method, own in originals:
            if own is None:
                delattr(module, method)
            else:
                setattr(module, method, own)


def measure_stage_peaks(
    run: Callable[[], object], components: dict[str, tuple[torch.nn.Module, str, str]]
) -> MeasuredMemory:
    """Run ``run()`` under the profiler; ``components`` maps a name to (module, called method, stage)."""
    resident = storages_bytes([module for module, _, _ in components.values()])
    with _marked(components), torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    allocations, windows, scratch = [], [], set()
    for event in OpTree(prof.profiler.kineto_results).dfs():
        if event.typed[0] == _EventType.Allocation:
            fields = event.typed[1]
            allocations.append((event.start_time_ns, fields.alloc_size, fields.ptr, _kernel_end(event)))
        elif event.name.startswith(_MARK):
            windows.append((event.name[len(_MARK) :], event.start_time_ns, event.end_time_ns))
    allocations.sort(key=lambda item: item[0])
    opened: dict[int, tuple[int, int | None]] = {}
    for index, (time_ns, size, ptr, kernel_end) in enumerate(allocations):
        if size > 0:
            opened[ptr] = (index, kernel_end)
        elif ptr in opened:
            start, end = opened.pop(ptr)
            if end is not None and time_ns <= end:
                scratch.update((start, index))
    tensors = _running([(t, size) for i, (t, size, _, _) in enumerate(allocations) if i not in scratch])
    everything = _running([(t, size) for t, size, _, _ in allocations])
    return MeasuredMemory(
        resident_param_bytes=resident,
        stage_peak_bytes=_stage_peaks(tensors, windows, resident),
        peak_bytes=resident + max([0, *(live for _, live in tensors)]),
        stage_peak_with_scratch_bytes=_stage_peaks(everything, windows, resident),
        peak_with_scratch_bytes=resident + max([0, *(live for _, live in everything)]),
    )


def _kernel_end(event) -> int | None:
    """When the convolution kernel that made this allocation returns (None: not made inside one)."""
    parent = event.parent
    while parent is not None:
        if parent.name in CONVOLUTION_KERNELS:
            return parent.end_time_ns
        parent = parent.parent
    return None


def _running(changes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    live, series = 0, []
    for time_ns, size in changes:
        live += size
        series.append((time_ns, live))
    return series


def _stage_peaks(series: list[tuple[int, int]], windows, resident: int) -> dict[str, int]:
    peaks: dict[str, int] = {}
    for stage, start, end in windows:
        before = [live for time_ns, live in series if time_ns < start]
        inside = [live for time_ns, live in series if start <= time_ns <= end]
        peak = max([before[-1] if before else 0, *inside])
        peaks[stage] = max(peaks.get(stage, 0), resident + peak)
    return peaks
