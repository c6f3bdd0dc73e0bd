"""benchmarks/reserved_memory.py: PyTorch's CUDA caching allocator replayed (its rounding, pools, splitting and
merging, as c10/cuda/CUDACachingAllocator.cpp has them) on allocations traced from fake-tensor runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from reserved_memory import Allocator, Traced  # noqa: E402

MiB = 2**20


def test_requests_round_to_512_bytes_and_take_their_pool_s_segment():
    allocator = Allocator()
    allocator.malloc("tiny", 100)  # 512 bytes, from a 2 MiB segment of the small pool
    assert (allocator.allocated, allocator.reserved) == (512, 2 * MiB)
    allocator.malloc("small", 3 * MiB)  # under 10 MiB: a 20 MiB segment of the large pool
    assert allocator.reserved == 22 * MiB
    allocator.malloc("fits", 15 * MiB)  # the 17 MiB left of that segment is the smallest block that fits: split
    assert allocator.reserved == 22 * MiB
    allocator.malloc("rest", 3 * MiB // 2)  # the 2 MiB left: 0.5 MiB would remain, not over 1 MiB: not split
    assert allocator.reserved == 22 * MiB and allocator.allocated == 512 + (3 + 15 + 2) * MiB
    allocator.malloc("large", 31 * MiB)  # 10 MiB or more: its own segment, rounded up to 2 MiB
    assert allocator.reserved == 22 * MiB + 32 * MiB


def test_freed_neighbours_merge_and_serve_a_larger_request():
    allocator = Allocator()
    allocator.malloc("a", 3 * MiB)
    allocator.malloc("b", 15 * MiB)
    allocator.release("a")
    allocator.release("b")
    allocator.malloc("c", 18 * MiB)  # a and b merged into one 18 MiB block (20 MiB with the rest): no new segment
    assert allocator.reserved == 20 * MiB


def test_a_block_too_small_for_a_later_request_stays_reserved():
    """What makes a reserved peak exceed the allocated one: a freed 64 MiB segment cannot hold 256 MiB."""
    allocator = Allocator()
    allocator.malloc("level 1", 64 * MiB)
    allocator.release("level 1")
    allocator.malloc("level 2", 256 * MiB)
    assert (allocator.peak_allocated, allocator.peak_reserved) == (256 * MiB, 320 * MiB)
    allocator.release("level 2")
    allocator.malloc("back", 64 * MiB)  # the smallest free block that fits: the 64 MiB one, not a split of 256
    assert allocator.reserved == 320 * MiB and allocator.pools[False][0][0] == 256 * MiB


def test_operators_allocate_new_storages_and_free_them_when_they_die():
    from torch._subclasses.fake_tensor import FakeTensorMode

    allocator = Allocator()
    with FakeTensorMode(), Traced(allocator):
        x = torch.empty(1024, 1024)  # 4 MiB
        y = x * 2
        view = y.view(-1)  # a view: no allocation
        assert allocator.allocated == 8 * MiB
        del y
        assert allocator.allocated == 8 * MiB  # the view keeps the storage
        del view
        assert allocator.allocated == 4 * MiB
        x.mul_(3)  # in place: none either
        assert allocator.allocated == 4 * MiB
    assert allocator.peak_allocated == 8 * MiB and allocator.reserved == 20 * MiB  # both in one 20 MiB segment


@pytest.mark.slow
def test_flux_dev_s_cached_blocks_match_the_h200_run():
    """FLUX.1-dev, 1024 px, bfloat16, three generations as bench ran them: 36.068 GiB reserved, 33.848 GiB allocated
    at most (benchmarks/results/gpu_calibration_nvidia-h200.jsonl): 2.22 GiB of cached blocks."""
    from reserved_memory import generation

    from diffmeter.spec import ProfileSpec

    spec = ProfileSpec(model="flux-dev", height=1024, width=1024, steps=28, batch_size=1, dtype="bfloat16")
    allocator = generation(spec, generations=3)
    slack = (allocator.peak_reserved - allocator.peak_allocated) / 2**30
    assert abs(slack - (36.068 - 33.848)) < 0.1, slack
