"""cuDNN's copies of a convolution, the one CUDA transient the memory prediction adds (``memory.track_call``)."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

CPU, TOTAL = torch.device("cpu"), "Total"  # fake tensors' device; MemTracker's key for a device's total


class ConvolutionCopies(TorchDispatchMode):
    """The largest total live during a convolution on CUDA: cuDNN (9.19, torch 2.11+cu130, on an H200) holds a
    copy of a convolution's input, weight and output beside them while it runs, in PyTorch's allocator, so in
    ``max_memory_allocated``. Measured by benchmarks/cuda_overhead.py (results/cuda_overhead_nvidia-h200.json):
    1.00-1.04x their bytes for 3x3 and 3x3x3 convolutions in bfloat16, float16 and float32 on contiguous
    (NCHW) inputs; none for 1x1 convolutions or channels-last inputs (0-0.02x). Entered inside ``tracker``, so the
    output is tracked when the tracker's current total is read."""

    def __init__(self, tracker: MemTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.convolution.default and copied(args[0], args[1]):
            copies = sum(t.numel() * t.element_size() for t in (args[0], args[1], output))
            self.peak = max(self.peak, self._current() + copies)
        return output

    def _current(self) -> int:
        return self.tracker.get_tracker_snapshot("current")[CPU][TOTAL]

    # a replay recorder (``replay.Recorder``): the highest total inside a block, above the total at its entry
    def begin(self) -> tuple[int, int]:
        saved, self.peak = self.peak, 0
        return saved, self._current()

    def end(self, begun: tuple[int, int]) -> int | None:
        saved, entry = begun
        inside, self.peak = self.peak, max(saved, self.peak)
        return inside - entry if inside else None

    def apply(self, effect: int | None) -> None:
        if effect is not None:
            self.peak = max(self.peak, self._current() + effect)


def copied(inputs: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether cuDNN copies this convolution (see ``ConvolutionCopies``): a 2-D or 3-D convolution with a kernel
    wider than 1 (1-D convolutions were not measured). Layout is not read: fake tensors on the CPU come out
    channels-last where a CUDA run's stay contiguous, and diffusers runs contiguous inputs (channels-last is a
    compile option, whose memory is not predicted)."""
    return inputs.dim() in (4, 5) and any(size > 1 for size in weight.shape[2:])
