"""cuDNN's copies of a convolution, the one CUDA transient the memory prediction adds (``memory.track_call``)."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

CPU, TOTAL = torch.device("cpu"), "Total"  # fake tensors' device; MemTracker's key for a device's total


#: below this many bytes of input, weight and output, cuDNN copies all three; from it on, input and weight only
#: (``copy_bytes``): 2**32 bytes, 4 GiB
FULL_COPY_BYTES = 2**32


class ConvolutionCopies(TorchDispatchMode):
    """The largest total live during a convolution on CUDA: cuDNN (9.19, torch 2.11+cu130, on an H200) holds
    copies of a convolution's tensors beside them while it runs, in PyTorch's allocator (its workspace), so in
    ``max_memory_allocated``: how much is ``copy_bytes``. Entered inside ``tracker``, so the output is tracked
    when the tracker's current total is read."""

    def __init__(self, tracker: MemTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.convolution.default:
            copies = copy_bytes(args[0], args[1], output)
            if copies:
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
    """Whether cuDNN copies this convolution (see ``copy_bytes``): a 2-D or 3-D convolution with a kernel
    wider than 1 (1-D convolutions were not measured). Layout is not read: fake tensors on the CPU come out
    channels-last where a CUDA run's stay contiguous, and diffusers runs contiguous inputs (channels-last is a
    compile option, whose memory is not predicted)."""
    return inputs.dim() in (4, 5) and any(size > 1 for size in weight.shape[2:])


def copy_bytes(inputs: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> int:
    """Bytes cuDNN holds beside a convolution while it runs. On NCHW tensors its tensor-core kernels read NHWC
    input and KRSC weight, so cuDNN writes transposed copies of them into its workspace ("NCHW-to-NHWC
    transformations", cuDNN developer guide, Legacy API: Data and Filter Formats); its kernels then either write
    NHWC output, transposed back from a third copy (``nhwckrsc_nhwc`` kernels, with ``nhwcToNchwKernel``), or
    NCHW output directly (``nhwckrsc_nchw`` kernels). Measured on an H200 (benchmarks/cuda_overhead.py,
    results/cuda_overhead_nvidia-h200.json): 1.00-1.04x input + weight + output for 3x3 and 3x3x3 convolutions of
    up to 0.38 GiB, none for 1x1 kernels or channels-last inputs. From 4 GiB of all three (``FULL_COPY_BYTES``),
    input + weight: the peaks of batched 1024 px decodes (PixArt-Sigma at batch 4 on the H200, FLUX.1-dev at 4 and
    16 on an H100: tests/test_convolution_copies.py) hold all three copies of a decoder's 256-to-128 convolution
    (3.0 GiB at batch 4) and not of its 256-to-256 one (4.0 GiB); the boundary lies between, not measured apart."""
    if not copied(inputs, weight):
        return 0
    transposed = inputs.numel() * inputs.element_size() + weight.numel() * weight.element_size()
    full = transposed + output.numel() * output.element_size()
    return full if full < FULL_COPY_BYTES else transposed
