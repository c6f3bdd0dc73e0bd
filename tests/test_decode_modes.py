"""The VAE decode's operators under diffusers' tiled and sliced decoding, counted on fake tensors, against the
real decoder of a tiny random-weight pipeline run with the same switch under the profile's FLOP counter."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import VAE_DECODER
from diffmeter.flops.counter import count_flops
from diffmeter.predict.memory import settled_plan
from diffmeter.predict.operators import operator_work
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline

#: tiny-sd's VAE tiles latents over 16 x 16 (sample_size 32, two blocks): 96 px latents of 48 tile with overlap
SPEC = ProfileSpec(model="tiny-sd", height=96, width=96, batch_size=2, steps=2)


def decode_flops(work) -> int:
    return sum(c.count * g.flops * g.calls for c in work.calls if c.stage == "vae_decode" for g in c.operators)


def decode_launches(work) -> int:
    return sum(c.count * g.calls for c in work.calls if c.stage == "vae_decode" for g in c.operators)


def real_decode_flops(spec: ProfileSpec, switch: str) -> int:
    """The real tiny VAE's decode of the plan's latents with ``switch`` on, counted as ``profile`` counts."""
    entry, _, plan = settled_plan(spec)
    (call,) = [c for c in plan if c.role == VAE_DECODER]
    vae = tiny_pipeline(resolve(spec.model)).vae
    getattr(vae, switch)()
    with torch.no_grad(), count_flops() as counts:
        for _ in range(call.count):
            getattr(vae, call.method)(**call.build(torch.device("cpu")))
    return counts.total


def test_a_tiled_decode_counts_its_overlapping_tiles_as_the_real_decoder_runs_them():
    plain, tiled = operator_work(SPEC), operator_work(SPEC, ("vae-tiling",))
    assert decode_flops(tiled) == real_decode_flops(SPEC, "enable_tiling")
    assert decode_flops(tiled) > decode_flops(plain)  # overlapping tiles decode some latents twice
    # the other stages are the plain run's, call for call
    assert [c for c in tiled.calls if c.stage != "vae_decode"] == [c for c in plain.calls if c.stage != "vae_decode"]


def test_a_sliced_decode_has_the_same_flops_in_one_launch_set_per_image():
    plain, sliced = operator_work(SPEC), operator_work(SPEC, ("vae-slicing",))
    assert decode_flops(sliced) == decode_flops(plain) == real_decode_flops(SPEC, "enable_slicing")
    one = operator_work(replace(SPEC, batch_size=1))
    # each image's own operators (the concatenation of the slices, AutoencoderKL.decode's torch.cat, left out)
    assert decode_launches(sliced) == SPEC.batch_size * decode_launches(one) > decode_launches(plain)


def test_a_vae_without_the_mode_is_named_in_one_line():
    with pytest.raises(DiffmeterError, match=r"tiny-kandinsky3: its VAE .* has no vae-tiling: drop --vae-tiling") as e:
        operator_work(ProfileSpec(model="tiny-kandinsky3"), ("vae-tiling",))
    assert "\n" not in str(e.value)


def test_weight_reads_from_configs_equal_the_memory_predictions():
    from diffmeter.predict.memory import predict_memory, weight_reads

    assert weight_reads(SPEC) == predict_memory(SPEC).weight_read_bytes


def test_slicing_one_latent_is_the_plain_decode_counted_once(tmp_path, monkeypatch):
    """diffusers slices only a batch over one: at batch 1 the sliced run is the plain run, counted once and stored
    under the modes asked too, so a later `fit --all` reads it back without torch (predict.cached)."""
    from diffmeter.predict.cached import cached_work

    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    one = replace(SPEC, batch_size=1)
    plain = operator_work(one)
    assert len(list((tmp_path / "operators").iterdir())) == 1
    assert operator_work(one, ("vae-slicing",)) == plain
    assert cached_work(one, ("vae-slicing",)) == plain  # the same count, under the modes asked
    assert len(list((tmp_path / "operators").iterdir())) == 2
    sliced = operator_work(SPEC, ("vae-slicing",))  # batch 2: sliced, its own count
    assert cached_work(SPEC, ("vae-slicing",)) == sliced
    assert len(list((tmp_path / "operators").iterdir())) == 3
