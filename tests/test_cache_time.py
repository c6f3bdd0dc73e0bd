"""Caches in the expected time (``predict.cache_time``): the exact counts (TaylorSeer's interval, DeepCache's shallow
calls and their multiply-accumulates) and the first call First-Block-Cache always computes, against real tiny
pipelines' calls with the caches applied; the threshold caches' rule on a drift fitted to published runs; the command
line's range and its JSON field."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from diffusers.hooks import FirstBlockCacheConfig
from tiny_runs import tiny_call, token_settings

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.flops.counter import count_flops
from diffmeter.predict.cache_exact import taylorseer_computed
from diffmeter.predict.cache_published import threshold_share
from diffmeter.predict.cache_threshold import kappas_of, sigmas, skipped
from diffmeter.predict.cache_time import HELD_OUT, cache_skip, module_macs
from diffmeter.predict.cache_time import label as cache_time_label
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.roofline import predict_time
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline

STEPS = 8


def macs_per_call(name: str, pipe, denoiser: str) -> tuple[list[int], ProfileSpec]:
    """The multiply-accumulates of each call of ``pipe``'s ``denoiser`` in a real run of tiny entry ``name`` (cache
    applied, diffmeter's counter), and the settings that profile the same run."""
    entry = resolve(name)
    pipe, call, settings = tiny_call(entry, steps=STEPS, pipe=pipe)
    module = getattr(pipe, denoiser)
    wrapped, macs = module.forward, []

    def counted(*args, **kwargs):
        with count_flops() as counts:
            output = wrapped(*args, **kwargs)
        macs.append(counts.total // 2)
        return output

    module.forward = counted
    with torch.no_grad():
        call()
    return macs, ProfileSpec(model=name, **settings, **token_settings(entry, pipe))


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
    skip = cache_skip(work, "first-block-cache", {"threshold": 1e9}, tuple(memory.denoisers), spec, FLUX_RUNS)
    assert skip.skipped_share == ((STEPS - tail) / STEPS,) * 2 == (7 / 8, 7 / 8)


def rows(*published):
    """Published runs of FLUX.1 at 1024x1024: (technique, threshold, skipped share, source, other params, steps)."""
    return [
        {"technique": technique, "params": {"threshold": t, **extra}, "threshold": t, "skipped_share": s, "source": src,
         "steps": steps, "height": 1024, "width": 1024}
        for technique, t, s, src, extra, steps in published
    ]  # fmt: skip


FLUX_RUNS = rows(("first-block-cache", 0.2, 19 / 28, "a", {}, 28), ("first-block-cache", 0.1, 11 / 28, "b", {}, 28))


def test_the_rule_accumulates_the_change_since_the_last_computing_call():
    """diffusers' hook stores the reference residual only when it computes (hooks/first_block_cache.py:122-125): at
    a constant change per call of a third of the threshold, two calls skip, the third computes, and so on."""
    flat = [1 - i / 10 for i in range(10)]  # sigma steps of 0.1: kappa 1 changes the residual by 0.1 a call
    assert skipped(1.0, 0.25, flat) == 6  # calls 1, 2 skip, 3 computes; 4, 5 skip, 6 computes; 7, 8 skip, 9 computes
    assert skipped(1.0, 0.05, flat) == 0 and skipped(1.0, 0.25, flat, always=4) == 4  # cache-dit's warm-up: 0 .. 3


def test_a_threshold_is_predicted_from_the_drift_the_published_runs_were_reproduced_with():
    spec = ProfileSpec(model="flux-dev", steps=28, height=1024, width=1024)
    one = rows(("first-block-cache", 0.2, 19 / 28, "a", {}, 28))
    low, high, how = threshold_share("first-block-cache", {"threshold": 0.2}, spec, one)
    assert low <= 19 / 28 <= high and high - low <= 3 / 28  # the run itself back, within its kappas' spread
    assert "threshold 0.2 at 28 steps" in how and "reproduces the skipped calls of 1 published run (a)" in how
    higher = threshold_share("first-block-cache", {"threshold": 0.4}, spec, one)
    assert higher[0] >= high  # a higher threshold skips at least as many calls
    more = threshold_share("first-block-cache", {"threshold": 0.2}, replace(spec, steps=56), one)
    assert more[0] > high  # twice the steps halve each call's change: more calls skip
    lent = threshold_share("cache-dit", {"threshold": 0.2, "fn": 8, "bn": 0}, spec, one)
    assert lent[:2] == (low, high) and lent[2].startswith("no published runs of cache-dit fn=8 bn=0")


def test_a_published_share_gives_the_kappas_that_reproduce_it():
    sigma = sigmas(28, 1024, 1024)
    assert sigma[0] == 1 and sigma[-1] < 0.11  # FLUX.1's 1024x1024 shift (exp(1.15)) of linspace(1, 1/28, 28)
    low, high = kappas_of(19 / 28, 0.2, sigma)
    assert skipped(low, 0.2, sigma) == skipped(high, 0.2, sigma) == 19
    assert skipped(low / 1.05, 0.2, sigma) > 19 and skipped(high * 1.05, 0.2, sigma) < 19


def test_a_cached_generation_is_timed_at_both_ends_of_its_share(planned):
    spec, memory, work = planned
    skip = cache_skip(work, "first-block-cache", {"threshold": 0.6}, tuple(memory.denoisers), spec, FLUX_RUNS)
    device = chosen_gpu("h100", None)
    plain = predict_time(work, device)
    cached = predict_time(work.model_copy(update={"cache": skip}), device)
    denoising = [{s.stage: s for s in t.stages}["denoising"] for t in (plain, cached)]
    assert cached.cache == skip and skip.skipped_share[0] < skip.skipped_share[1]
    assert denoising[1].expected_s[0] < denoising[1].expected_s[1] < denoising[0].expected_s[1]
    assert denoising[1].lower_s < denoising[0].lower_s
    # the work shown beside the bounds is the work they bound: at the most skipped share, its FLOPs at the peak
    # within the lower bound
    most = skip.model_copy(update={"skipped_share": (skip.skipped_share[1],) * 2})
    at_most = {s.stage: s for s in predict_time(work.model_copy(update={"cache": most}), device).stages}
    assert denoising[1].flops == at_most["denoising"].flops < denoising[0].flops
    assert denoising[1].flops / (cached.peak_tflops * 1e12) <= denoising[1].lower_s


def test_profile_gives_a_cached_range_and_says_how_its_share_was_obtained(cli):
    asked = ("profile", "tiny-flux", "--gpu", "h100", "--steps", STEPS)
    code, out, _ = cli(*asked, "--json")
    plain = json.loads(out)
    code, out, _ = cli(*asked, "--opt", "first-block-cache:threshold=0.6", "--json")
    assert code == 0
    found = json.loads(out)
    cache = found["time"]["cache"]
    assert found["time_techniques"] == ["first-block-cache threshold=0.6"] and found["time_left_out"] == []
    assert cache["how"].startswith("threshold 0.6 at 8 steps: the hook's rule") and cache["calls"] == STEPS
    assert found["time"]["expected_s"][1] < plain["time"]["expected_s"][1]
    code, out, _ = cli(*asked, "--opt", "first-block-cache")
    default = FirstBlockCacheConfig().threshold  # what diffusers runs when none is given
    said = f"of the 8 denoiser calls skipped (skipped share extrapolated: threshold {default} below the published"
    assert code == 0 and said in " ".join(out.split()) and f"; threshold {default} at 8 steps" in " ".join(out.split())
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--opt", "faster-cache", "--json")
    assert code == 0 and json.loads(out)["time_left_out"][0].startswith("faster-cache: in the calls that skip the")


def test_the_threshold_caches_default_to_their_librarys_own_threshold():
    """A cache asked for by name runs, and is predicted, at the threshold its library runs when given none."""
    from cache_dit import DBCacheConfig

    from diffmeter.optimize import OptimizationSpec, build

    library = {
        "first-block-cache": FirstBlockCacheConfig().threshold,
        "cache-dit": DBCacheConfig().residual_diff_threshold,
    }
    for name, threshold in library.items():
        (built,) = build([OptimizationSpec(name=name)])
        assert built.config.threshold == threshold
        assert cache_time_label(name, {}) == f"{name} threshold={threshold}"


def test_the_printed_claim_is_the_committed_held_out_figure():
    text = (Path(__file__).parents[1] / "benchmarks" / "results" / "calibration_caches.md").read_text()
    row = re.search(r"\| expected \| (\d+) \| (\d+%) \| ([\d.]+%) \| ([\d.]+) \|", text)
    runs, coverage, error, width = row.groups()
    assert f"of {runs} published cached runs ({coverage})" in HELD_OUT
    assert f"median error {error}, median hi/lo {width}" in HELD_OUT


def test_a_model_without_the_blocks_a_cache_skips_is_refused(cli, planned):
    code, _, err = cli("profile", "tiny-sd", "--gpu", "h100", "--opt", "first-block-cache")  # as bench refuses it
    assert code == 2 and "first-block-cache cannot be used with tiny-sd: UNet2DConditionModel has no" in err
    spec = ProfileSpec(model="tiny-sd", steps=STEPS)  # the prediction's own guard, for callers that skip bench's check
    _, work = predict_memory_and_work(spec, True, ())
    with pytest.raises(DiffmeterError, match="first-block-cache: the unet has none of the transformer blocks"):
        cache_skip(work, "first-block-cache", {"threshold": 0.1}, ("unet",), spec)
    spec, _, work = planned
    with pytest.raises(DiffmeterError, match="deep-cache: the transformer has none of the UNet down, mid and up"):
        cache_skip(work, "deep-cache", {"cache_interval": 3, "cache_branch_id": 0}, ("transformer",), spec)


@pytest.mark.parametrize("branch", [0, 1, 3])
def test_deep_cache_skips_exactly_the_calls_and_work_deepcache_skips(branch):
    """DeepCache's helper on a real tiny SD pipeline: which UNet calls run only the shallow branch, and that branch's
    multiply-accumulates counted on the real run (diffmeter's counter), against the prediction from the fake-tensor
    counts per module."""
    from DeepCache import DeepCacheSDHelper

    pipe = tiny_pipeline(resolve("tiny-sd"))
    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=3, cache_branch_id=branch)
    helper.enable()
    macs, spec = macs_per_call("tiny-sd", pipe, "unet")
    _, work = predict_memory_and_work(spec, True, ())
    skip = cache_skip(work, "deep-cache", {"cache_interval": 3, "cache_branch_id": branch}, ("unet",), spec)
    _, total = module_macs(spec, "unet", 4)
    full, shallow = total // STEPS, round(total / STEPS * skip.kept_share)
    assert macs == [full if call % 3 == 0 else shallow for call in range(STEPS)]  # calls 0, 3, 6 in full
    assert skip.skipped_share == (5 / 8, 5 / 8) and skip.overhead == [] and 0 < skip.kept_share < 1


def test_deep_cache_is_timed_and_refused_without_a_unet(cli):
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--steps", STEPS, "--opt", "deep-cache", "--json")
    found = json.loads(out)
    assert code == 0 and found["time_techniques"] == ["deep-cache interval=3 branch=0"]
    assert found["time_left_out"] == [] and found["time"]["cache"]["skipped_share"] == [5 / 8, 5 / 8]
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--steps", STEPS, "--opt", "deep-cache")
    assert code == 0 and "held out by source" not in out  # an exact count makes no held-out claim
    code, _, err = cli("profile", "tiny-flux", "--gpu", "h100", "--opt", "deep-cache")  # as bench refuses it
    assert code == 2 and "deep-cache cannot be used with tiny-flux: DeepCache caches Stable Diffusion UNet" in err


@pytest.mark.parametrize(("window", "reused"), [((-1, 1001), 4), ((2000, 3000), 0), ((100, 800), 3)])
def test_pab_reuses_attention_in_the_calls_and_work_diffusers_hook_skips(window, reused):
    """diffusers' PAB hook on a real tiny FLUX pipeline: the calls in which the hooked attention reuses its output lie
    in the predicted range, every one of them when the window holds every timestep, none when it holds none; and such a
    call's multiply-accumulates counted on the real run are the predicted kept share of a full call's."""
    from diffusers import PyramidAttentionBroadcastConfig

    pipe = tiny_pipeline(resolve("tiny-flux"))
    pipe.transformer.enable_cache(
        PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=window,
            current_timestep_callback=lambda: pipe.current_timestep,
        )
    )
    macs, spec = macs_per_call("tiny-flux", pipe, "transformer")
    _, work = predict_memory_and_work(spec, True, ())
    skip = cache_skip(work, "pab", {"block_skip_range": 2, "timestep_skip_range": window}, ("transformer",), spec)
    _, total = module_macs(spec, "transformer")
    full, light = total // STEPS, round(total / STEPS * skip.kept_share)
    assert sorted(set(macs)) == sorted({full, light} if reused else {full})
    assert macs.count(light) == reused  # tiny-flux's timesteps 1000, 875, ..., 125: calls 3, 5, 7 in (100, 800)
    assert skip.skipped_share == (0.0, 4 / 8) and skip.overhead == []  # calls 1, 3, 5, 7 may reuse


def test_each_cached_source_names_the_eager_run_whose_harness_its_held_out_refit_leaves_out():
    """calibrate_caches.py refits the eager calibration without the harness of each source's ``eager_figure``: that
    figure is the same generation on the same GPU, from the same repository, so the refit holds nothing of it."""
    import yaml

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from published_comparison import load_figures

    figures = {figure["id"]: figure for figure in load_figures()}
    cached = yaml.safe_load((Path(__file__).parents[1] / "benchmarks" / "published_caches.yaml").read_text())
    for source in cached["sources"]:
        eager = figures[source["eager_figure"]]
        assert eager["kind"] == "latency" and eager["usable"] and not eager["techniques"]
        assert [eager[k] for k in ("model", "gpu", "height", "width", "steps", "dtype")] == [
            source[k] for k in ("model", "gpu", "height", "width", "steps", "dtype")
        ]
        repository = "/".join(source["source"]["url"].split("/")[3:5])
        assert f"github.com/{repository}/" in eager["source"]["url"]


def test_taylorseer_counts_each_cache_context_of_a_pipeline_that_runs_cfg_apart():
    """QwenImagePipeline runs its uncond and cond calls in cache contexts of their own, each with its own TaylorSeer
    state: "exact: 13 of 20 calls" was counted over the 20 calls as one (a new user's trial measured 10)."""
    from diffusers.hooks import TaylorSeerCacheConfig

    entry = resolve("tiny-qwenimage")
    pipe, call, settings = tiny_call(entry, steps=STEPS, pipe=tiny_pipeline(entry))
    pipe.transformer.enable_cache(TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=2))
    computed, calls = [], []
    pipe.transformer.transformer_blocks[0].attn.to_q.register_forward_hook(lambda *_: computed.append(1))
    pipe.transformer.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        call()
    spec = ProfileSpec(model="tiny-qwenimage", **settings, **token_settings(entry, pipe))
    memory, work = predict_memory_and_work(spec, True, ())
    params = {"cache_interval": 3, "disable_cache_before_step": 2}
    skip = cache_skip(work, "taylorseer", params, tuple(memory.denoisers), spec)
    assert len(calls) == skip.calls == 2 * STEPS and len(computed) == 2 * taylorseer_computed(STEPS, 3, 2)
    assert skip.skipped_share == ((len(calls) - len(computed)) / len(calls),) * 2
    assert "in each of the 2 cache contexts" in skip.how


def test_a_cache_that_reuses_attention_alone_says_how_much_of_a_call_still_runs(planned):
    """PAB's prediction read "skips 0% to 50% of the denoiser calls" while its skipped calls reuse attention only."""
    spec, memory, work = planned
    skip = cache_skip(work, "pab", {}, tuple(memory.denoisers), spec)
    assert 0.05 < skip.kept_share < 1
    assert skip.skips_text().endswith(f", a skipped call still running {skip.kept_share:.0%} of its work")
