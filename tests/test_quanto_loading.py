"""benchmarks/quanto_loading.py: ``pipe.to('cuda')`` of optimum-quanto weights replayed through the caching allocator
(benchmarks/reserved_memory.py), in ``nn.Module._apply``'s order, int4 weights repacked for tinygemm on the way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from quanto_loading import loaded, move_component, post_order, tinygemm_move  # noqa: E402
from reserved_memory import Allocator  # noqa: E402

MiB = 2**20


def test_a_tinygemm_repack_keeps_its_packed_weight_and_leaves_its_int32_temporaries_cached():
    """3072 x 3072 bfloat16 weights (W = 9 MiB of them), groups of 128: kept, the int4pack output (W / 2) and the
    scale-shift (2 x 2 bytes per group, W / 32); at most live together, the moved scale, data and shift (W / 64,
    W / 2, W / 64), the unpacked bytes (W), the int32 copy (4 W) and the shifted and or-ed halves (2 W each)."""
    weights = 3072 * 3072
    allocator = Allocator()
    tinygemm_move(allocator, "w", 3072, 3072, 2)
    assert list(allocator.live) == ["w", "w:scale_shift"]
    assert allocator.allocated == weights // 2 + weights // 32
    assert allocator.peak_allocated == weights // 64 * 2 + weights // 2 + weights + 4 * weights + 2 * 2 * weights
    # segments: 2 MiB of the small pool (the scales), 20 MiB for the 4.5 MiB data (under 10 MiB) that the 9 MiB
    # unpacked bytes then share, 36 MiB for the int32 copy, 18 MiB for each int32 half; nothing given back
    assert allocator.reserved == (2 + 20 + 36 + 18 + 18) * MiB
    tinygemm_move(allocator, "v", 3072, 3072, 2)  # the same shape again: served from the cached blocks
    assert allocator.reserved == 94 * MiB and allocator.allocated == 2 * (weights // 2 + weights // 32)


def test_a_kept_block_inside_a_cached_one_makes_the_next_repack_reserve_more():
    """3072 x 12288 (W = 36 MiB): the first weight's packed 18 MiB lands in the freed 72 MiB block of its shifted
    half, so the next weight's or-ed half (72 MiB) fits nowhere cached: a new segment, what loading leaves reserved."""
    allocator = Allocator()
    tinygemm_move(allocator, "w", 3072, 12288, 2)
    first = allocator.reserved  # 2 + 2 (the scales) + 18 + 36 + 144 + 72 + 72 MiB
    assert first == 346 * MiB
    tinygemm_move(allocator, "v", 3072, 12288, 2)
    assert allocator.reserved == first + 72 * MiB


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(8))  # the module's own: moved after its children
        self.proj = torch.nn.Linear(256, 128)
        self.register_buffer("steps", torch.zeros(4))


def test_a_module_moves_its_children_first_then_its_parameters_then_its_buffers():
    module = Block().to(device="meta", dtype=torch.bfloat16)
    assert list(post_order(module)) == ["proj", ""]
    allocator = Allocator()
    kept = move_component(allocator, module, None, torch.bfloat16)
    assert list(allocator.live) == ["proj.weight", "proj.bias", "scale", "steps"]
    assert kept == (256 * 128 + 128 + 8 + 4) * 2


def test_quanto_weights_move_as_their_layout_stores_them():
    """int8: a byte per weight, then a bfloat16 scale per row (qbytes.py:298-299); int4 at 128-wide groups in bfloat16:
    tinygemm's two tensors; the layer's activation scales (quanto's QLinear buffers) after its own tensors."""
    module = Block().to(device="meta", dtype=torch.bfloat16)
    allocator = Allocator()
    kept = move_component(allocator, module, "int8", torch.bfloat16)
    assert list(allocator.live)[:4] == ["proj.weight:0", "proj.weight:1", "proj.bias", "proj.input_scale"]
    assert [block.size for block, _ in list(allocator.live.values())[:2]] == [256 * 128, 512]  # 256 bytes, rounded
    assert kept == 256 * 128 + 128 * 2 + 128 * 2 + 2 * 2 + 8 * 2 + 4 * 2
    allocator = Allocator()
    kept = move_component(allocator, module, "int4", torch.bfloat16)
    assert list(allocator.live)[:2] == ["proj.weight", "proj.weight:scale_shift"]
    assert kept == 256 * 128 // 2 + 2 * (256 * 128 // 128) * 2 + 128 * 2 + 2 * 2 + 8 * 2 + 4 * 2


@pytest.mark.slow
def test_flux_dev_s_quanto_int8_pipeline_reserves_what_the_post_measured():
    """The post's quanto INT8 row: 17.330 'GB' of torch.cuda.max_memory_reserved() after pipe.to('cuda') (huggingface/
    blog diffusers-quantization.md at 0b53cb19); the replay keeps 16.975 GiB of tensors and reserves within 1% of it."""
    from diffmeter.spec import ProfileSpec

    spec = ProfileSpec(model="flux-dev", height=1024, width=1024, steps=50, max_sequence_length=512)
    allocator, kept = loaded(spec, {"transformer": "int8", "text_encoder_2": "int8"})
    assert allocator.allocated >= kept and allocator.reserved > allocator.allocated
    assert abs(allocator.peak_reserved / 2**30 / 17.330 - 1) < 0.01


def test_a_generation_continues_on_the_allocator_loading_left():
    """The loaded tensors stay live through the generation, whose allocations reuse the blocks loading left cached."""
    from reserved_memory import generation

    from diffmeter.spec import ProfileSpec

    spec = ProfileSpec(model="tiny-flux")
    allocator, kept = loaded(spec, {"transformer": "int4"})
    loading_keys, loading_reserved = set(allocator.live), allocator.reserved
    assert allocator.allocated >= kept > 0
    alone = generation(spec)
    assert generation(spec, allocator=allocator) is allocator
    assert loading_keys <= set(allocator.live)
    assert loading_reserved <= allocator.peak_reserved <= loading_reserved + alone.peak_reserved
