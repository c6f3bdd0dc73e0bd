"""CUDA's peak allocated bytes per stage of the measured calls, read at the stage timer's marks.

At each mark the caching allocator's high-water mark since the previous mark is read and the mark is reset
(``torch.cuda.max_memory_allocated`` / ``reset_peak_memory_stats``: host-side counters of the allocator,
kept in the order the host issues allocations, so no synchronization is needed). The segment between two
marks belongs to the stage its closing mark ends: a text encoder's, the VAE's encode, a scheduler step's, its decode,
else the pipeline's own code outside its components. Because the marks reset CUDA's high-water marks, the
run's whole peaks (allocated and reserved) are the largest of the segments' and are read from here too.
"""

from __future__ import annotations

import torch

from diffmeter.predict.schema import DENOISING_STEP, IMAGE_ENCODING, TEXT_ENCODING, VAE_DECODE

OUTSIDE_COMPONENTS = "outside components"
#: the stage timer's closing marks and the stage each closes; any other mark closes code outside the components
CLOSED_BY = {"text<": TEXT_ENCODING, "encode<": IMAGE_ENCODING, "step<": DENOISING_STEP, "decode<": VAE_DECODE}


class StagePeaks:
    """Per-stage and whole high-water marks of CUDA's allocated bytes, since ``reset()`` (bytes)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        self.stages: dict[str, int] = {}
        self.allocated = self.reserved = 0
        self._in_call = False

    def mark(self, label: str) -> None:
        """Close the segment that ``label`` ends; marks outside a pipeline call count for the whole peaks only."""
        allocated = torch.cuda.max_memory_allocated(self.device)
        self.allocated = max(self.allocated, allocated)
        self.reserved = max(self.reserved, torch.cuda.max_memory_reserved(self.device))
        if self._in_call:
            stage = CLOSED_BY.get(label, OUTSIDE_COMPONENTS)
            self.stages[stage] = max(self.stages.get(stage, 0), allocated)
        self._in_call = label != "end"
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> tuple[int, int, dict[str, int]]:
        """(max allocated, max reserved, stage -> max allocated) since ``reset()``, the time since the last mark
        included in the whole peaks."""
        self.allocated = max(self.allocated, torch.cuda.max_memory_allocated(self.device))
        self.reserved = max(self.reserved, torch.cuda.max_memory_reserved(self.device))
        return self.allocated, self.reserved, dict(self.stages)
