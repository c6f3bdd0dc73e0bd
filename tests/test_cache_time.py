"""Caches in the expected time (``predict.cache_time``): the exact interval counts and the first call First-Block-Cache
always computes, against a real tiny FLUX pipeline's calls with diffusers' hooks applied; the published shares at a
threshold; the command line's range and its JSON field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.predict.cache_time import HELD_OUT, cache_skip, taylorseer_computed, threshold_share
from diffmeter.predict.devices import chosen_gpu
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.roofline import predict_time
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline

STEPS = 8


def calls_of(pipe, *modules: torch.nn.Module) -> list[int]:
    """How many times each of ``modules`` really runs in one generation of ``pipe``."""
    seen = [[] for _ in modules]
    handles = [m.register_forward_hook(lambda *_, n=n: n.append(1)) for m, n in zip(modules, seen, strict=True)]
    with torch.no_grad():
        pipe("a cat", num_inference_steps=STEPS, height=32, width=32, output_type="latent")
    for handle in handles:
        handle.remove()
    return [len(n) for n in seen]


@pytest.fixture(scope="module")
def planned():
    spec = ProfileSpec(model="tiny-flux", steps=STEPS)
    memory, work = predict_memory_and_work(spec, True, ())
    return spec, memory, work


def test_taylorseer_skips_exactly_the_calls_diffusers_hooks_skip(planned):
    from diffusers.hooks import TaylorSeerCacheConfig

    spec, memory, work = planned
    pipe = tiny_pipeline(resolve("tiny-flux"))
    pipe.transformer.enable_cache(TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=2))
    (computed,) = calls_of(pipe, pipe.transformer.transformer_blocks[0].attn.to_q)  # runs only when attn computes
    params = {"cache_interval": 3, "disable_cache_before_step": 2}
    skip = cache_skip(work, "taylorseer", params, tuple(memory.denoisers), spec)
    assert computed == taylorseer_computed(STEPS, 3, 2) == 4  # calls 0, 1, 3, 6
    assert skip.skipped_share == ((STEPS - computed) / STEPS,) * 2 and skip.calls == STEPS
    assert 0 < skip.kept_share < 1  # the blocks' feed-forwards still run


def test_first_block_cache_always_computes_the_first_call(planned):
    """At a threshold nothing reaches, diffusers' hook runs the blocks after the first once: the share's cap."""
    from diffusers.hooks import FirstBlockCacheConfig

    spec, memory, work = planned
    pipe = tiny_pipeline(resolve("tiny-flux"))
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=1e9))
    blocks = pipe.transformer.transformer_blocks[0], pipe.transformer.single_transformer_blocks[0]
    head, tail = calls_of(pipe, blocks[0].attn.to_q, blocks[1].proj_mlp)  # layers inside: a skipped block's forward
    assert head == STEPS  # the head block computes in every call
    rows = [{"technique": "first-block-cache", "params": {"threshold": 0.5}, "threshold": 0.5, "skipped_share": 0.9,
             "source": "s"}]  # fmt: skip
    skip = cache_skip(work, "first-block-cache", {"threshold": 1e9}, tuple(memory.denoisers), spec, rows)
    assert skip.skipped_share[1] == (STEPS - tail) / STEPS == 7 / 8
    assert "the first 1 call(s) always compute" in skip.how


def rows(*published):
    return [
        {"technique": technique, "params": {"threshold": t, **extra}, "threshold": t, "skipped_share": s, "source": src}
        for technique, t, s, src, extra in published
    ]


def test_a_threshold_takes_the_published_shares_at_it_or_either_side():
    table = rows(
        ("first-block-cache", 0.1, 0.4, "a", {}),
        ("first-block-cache", 0.2, 0.6, "a", {}),
        ("cache-dit", 0.2, 0.7, "b", {"fn": 1, "bn": 0}),  # DBCache F1B0: First-Block-Cache
    )
    assert threshold_share("first-block-cache", {"threshold": 0.2}, table)[:2] == (0.6, 0.7)
    low, high, how = threshold_share("first-block-cache", {"threshold": 0.15}, table)
    assert (low, high) == (0.4, 0.7) and "between the published thresholds 0.1 and 0.2" in how
    assert threshold_share("first-block-cache", {"threshold": 0.05}, table)[:2] == (0.0, 0.4)
    assert threshold_share("first-block-cache", {"threshold": 0.3}, table)[:2] == (0.6, 1.0)
    low, high, how = threshold_share("cache-dit", {"threshold": 0.2, "fn": 8, "bn": 0}, table)
    assert (low, high) == (0.6, 0.7) and how.startswith("no published runs of cache-dit fn=8 bn=0")


def test_a_cached_generation_is_timed_at_both_ends_of_its_share(planned):
    spec, memory, work = planned
    table = rows(("first-block-cache", 0.2, 0.25, "a", {}), ("first-block-cache", 0.2, 0.75, "b", {}))
    skip = cache_skip(work, "first-block-cache", {}, tuple(memory.denoisers), spec, table)
    device = chosen_gpu("h100", None)
    plain = predict_time(work, device)
    cached = predict_time(work.model_copy(update={"cache": skip}), device)
    denoising = [{s.stage: s for s in t.stages}["denoising"] for t in (plain, cached)]
    assert cached.cache == skip and skip.skipped_share == (0.25, 0.75)
    assert denoising[1].expected_s[0] < denoising[1].expected_s[1] < denoising[0].expected_s[1]
    assert denoising[1].lower_s < denoising[0].lower_s


def test_profile_gives_a_cached_range_and_says_how_its_share_was_obtained(cli):
    asked = ("profile", "tiny-flux", "--gpu", "h100", "--steps", STEPS)
    code, out, _ = cli(*asked, "--json")
    plain = json.loads(out)
    code, out, _ = cli(*asked, "--opt", "first-block-cache", "--json")
    assert code == 0
    found = json.loads(out)
    cache = found["time"]["cache"]
    assert found["time_techniques"] == ["first-block-cache threshold=0.2"] and found["time_left_out"] == []
    assert cache["how"].startswith("published at threshold 0.2") and cache["calls"] == STEPS
    assert found["time"]["expected_s"][1] < plain["time"]["expected_s"][1]
    code, out, _ = cli(*asked, "--opt", "first-block-cache")
    assert code == 0 and "of the 8 denoiser calls skipped (published at threshold 0.2" in " ".join(out.split())
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--opt", "pab", "--json")
    assert code == 0 and json.loads(out)["time_left_out"] == [
        "pab: its skipped attention depends on the scheduler's timesteps, not predicted yet"
    ]


def test_the_printed_claim_is_the_committed_held_out_figure():
    text = (Path(__file__).parents[1] / "benchmarks" / "results" / "calibration_caches.md").read_text()
    row = re.search(r"\| expected \| (\d+) \| (\d+%) \| ([\d.]+%) \| ([\d.]+) \|", text)
    runs, coverage, error, width = row.groups()
    assert f"of {runs} published cached runs ({coverage})" in HELD_OUT
    assert f"median error {error}, median hi/lo {width}" in HELD_OUT


def test_a_model_without_the_blocks_a_cache_skips_is_refused(cli):
    code, _, err = cli("profile", "tiny-sd", "--gpu", "h100", "--opt", "first-block-cache")
    assert code != 0 and "first-block-cache: the unet has none of the transformer blocks" in " ".join(err.split())
