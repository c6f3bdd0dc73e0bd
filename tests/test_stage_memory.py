"""CUDA's peak allocated bytes per stage (measure/stage_memory.py), read at the stage timer's marks.

CUDA cannot exist here: the caching allocator's counters are stood in for by ``Allocator`` below, which keeps
allocated bytes and their high-water mark the way ``torch.cuda.max_memory_allocated`` and
``reset_peak_memory_stats`` report them (a reset sets the mark to what is allocated now)."""

from __future__ import annotations

import pytest
import torch

from diffmeter.measure.memory import read_peaks
from diffmeter.measure.stage_memory import OUTSIDE_COMPONENTS, StagePeaks
from diffmeter.predict.schema import DENOISING_STEP, TEXT_ENCODING, VAE_DECODE


class Allocator:
    def __init__(self) -> None:
        self.allocated = self.peak = 0
        self.reserved = self.reserved_peak = 0

    def change(self, delta: int) -> None:
        self.allocated += delta
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def reset(self, device=None) -> None:
        self.peak, self.reserved_peak = self.allocated, self.reserved


@pytest.fixture
def allocator(monkeypatch):
    found = Allocator()
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: found.peak)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: found.reserved_peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", found.reset)
    return found


def one_call(peaks: StagePeaks, allocator: Allocator, steps: int = 2) -> None:
    """A pipeline call as the stage timer marks it: 100 bytes of latents, a text encoder peaking 700 bytes
    above them, steps peaking 500 above, the decode 900 above, and post-processing 300 above."""
    peaks.mark("begin")
    allocator.change(100)
    peaks.mark("text>")
    allocator.change(700)
    allocator.change(-700)
    peaks.mark("text<")
    peaks.mark("step>")
    for _ in range(steps):
        allocator.change(500)
        allocator.change(-500)
        peaks.mark("step<")
    peaks.mark("decode>")
    allocator.change(900)
    allocator.change(-900)
    peaks.mark("decode<")
    allocator.change(300)
    allocator.change(-300)
    peaks.mark("end")
    allocator.change(-100)


def test_each_stage_gets_the_peak_inside_its_marks_and_the_whole_peak_survives_the_resets(allocator):
    allocator.change(1000)  # weights
    peaks = StagePeaks(torch.device("cuda", 0))
    one_call(peaks, allocator)
    allocated, reserved, stages = peaks.read()
    assert stages == {
        OUTSIDE_COMPONENTS: 1400,  # post-processing after the decode; before text> only 1100
        TEXT_ENCODING: 1800,
        DENOISING_STEP: 1600,
        VAE_DECODE: 2000,
    }
    assert allocated == 2000 == max(stages.values())
    assert reserved == 2000
    assert allocator.peak < allocated  # what torch reports after the last reset is not the run's peak


def test_between_calls_counts_for_the_whole_peak_but_no_stage(allocator):
    allocator.change(1000)
    peaks = StagePeaks(torch.device("cuda", 0))
    one_call(peaks, allocator)
    allocator.change(5000)  # between calls (the loop saving images, say)
    allocator.change(-5000)
    one_call(peaks, allocator)
    allocated, _, stages = peaks.read()
    assert allocated == 6000
    assert max(stages.values()) == 2000


def test_reset_forgets_the_warm_up_calls(allocator):
    allocator.change(1000)
    peaks = StagePeaks(torch.device("cuda", 0))
    allocator.change(9000)  # a cold call's compilation, say
    allocator.change(-9000)
    one_call(peaks, allocator)
    peaks.reset()
    one_call(peaks, allocator, steps=3)
    allocated, _, stages = peaks.read()
    assert allocated == 2000 and stages[DENOISING_STEP] == 1600


def test_read_peaks_takes_the_whole_and_stage_peaks_from_the_marks(allocator):
    allocator.change(1000)
    peaks = StagePeaks(torch.device("cuda", 0))
    one_call(peaks, allocator)
    memory = read_peaks(torch.device("cuda", 0), 1000, rss_was_reset=False, stage_peaks=peaks)
    assert memory.cuda_max_allocated_bytes == 2000
    assert memory.cuda_stage_max_allocated_bytes[VAE_DECODE] == 2000
