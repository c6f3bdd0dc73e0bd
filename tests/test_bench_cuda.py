"""On a CUDA machine: event-timed stages, CUDA memory peaks and Zeus energy. Skipped without one."""

import pytest
import torch

from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_run_times_stages_with_events_and_reads_memory_peaks(tmp_path):
    result, _ = bench(BenchSpec(model="tiny-sd", steps=4, iterations=3, dtype="bf16", device="cuda"), out=tmp_path)
    summary = result.summary
    for iteration in result.iterations:
        stages = iteration.stages
        parts = stages.text_encoding_s + stages.denoising_s + stages.vae_decode_s + stages.other_s
        assert parts == pytest.approx(iteration.total_s) and parts == pytest.approx(iteration.wall_s, rel=0.05)
        assert len(stages.steps_s) == 4
    memory = summary.peak_memory
    assert memory.cuda_max_allocated_bytes >= memory.cuda_loaded_bytes > 0
    assert memory.cuda_max_reserved_bytes >= memory.cuda_max_allocated_bytes
    assert result.environment.devices and result.environment.cuda
    assert summary.energy.available or summary.energy.reason
    if summary.peak is not None:
        assert summary.mfu["total"] == pytest.approx(summary.achieved_tflops["total"] / summary.peak.tflops)


def test_cuda_precision_is_what_ran_and_the_mfu_peak_follows_it(tmp_path):
    """float32 with TF32 (the CUDA default) and strict float32 (--no-tf32): both switches set, the
    peak of the precision that ran used for MFU."""
    tf32, _ = bench(BenchSpec(model="tiny-sd", steps=2, iterations=1, dtype="fp32", device="cuda"), out=tmp_path)
    strict, _ = bench(
        BenchSpec(model="tiny-sd", steps=2, iterations=1, dtype="fp32", device="cuda", tf32=False), out=tmp_path
    )
    assert tf32.fp32_precision == {"matmul": "tf32", "convolution": "tf32"}
    assert strict.fp32_precision == {"matmul": "ieee", "convolution": "ieee"}
    if tf32.summary.peak is not None:
        assert tf32.summary.peak.tflops > strict.summary.peak.tflops  # tensor-core TF32 vs CUDA-core FP32
    assert tf32.summary.compilation.clean and strict.summary.compilation.clean
