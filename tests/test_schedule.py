"""Denoiser steps come from the scheduler the pipeline builds (families/schedule.py), not from --steps: the real
diffusers schedulers built from the catalog's shipped configs, profiles of them, and real runs that make the calls."""

import io
import json

import diffusers
import pytest
import torch
from rich.console import Console

from diffmeter.catalog import all_entries, resolve
from diffmeter.families import get_family, schedule
from diffmeter.families.base import Family
from diffmeter.loading import random_pipeline
from diffmeter.optimization_spec import OptimizationSpec
from diffmeter.predict.cache_exact import deep_cache_full
from diffmeter.report.run_table import run_table
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline

SD15 = resolve("sd15").extra["scheduler"]


def test_the_shipped_sd15_scheduler_is_pndm_and_gives_one_more_timestep_than_steps():
    """scheduling_pndm.py:213 (diffusers 0.42.1): with skip_prk_steps the second-to-last timestep is repeated."""
    scheduler = getattr(diffusers, SD15["class"]).from_config(SD15["config"])
    assert isinstance(scheduler, diffusers.PNDMScheduler) and scheduler.config.skip_prk_steps
    scheduler.set_timesteps(20)
    assert len(scheduler.timesteps) == 21 == schedule.timesteps(resolve("sd15"), 20)
    assert resolve("sd21-base").extra["scheduler"]["class"] == "PNDMScheduler"


def test_profile_sd15_counts_the_unet_calls_the_pipeline_makes(cli):
    code, out, _ = cli("profile", "sd15", "--steps", "20", "--json")
    found = json.loads(out)
    calls = {c["name"]: c["calls"] for c in found["components"]}
    assert code == 0 and calls["unet"] == 21 and found["steps"] == 20 and found["denoiser_steps"] == 21
    assert found["scheduler"].startswith("PNDMScheduler: 21 denoiser steps at --steps 20")
    unet = next(c for c in found["components"] if c["name"] == "unet")
    assert found["denoiser_macs_per_step"] == unet["macs"] // 21  # per scheduler step, as bench times a step
    code, out, _ = cli("profile", "sd15", "--steps", "20")
    assert code == 0 and "20 steps (21 denoiser steps)" in out and "PNDMScheduler: 21 denoiser steps" in out


def saved(name: str, config: dict, path):
    """A tiny SD pipeline saved with scheduler ``name`` (tiny-sd's config, then ``config``): a local folder."""
    pipe = tiny_pipeline(resolve("tiny-sd"))
    pipe.scheduler = getattr(diffusers, name).from_config({**pipe.scheduler.config, **config})
    pipe.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=[("PNDMScheduler", SD15["config"], 4), ("HeunDiscreteScheduler", {}, 5)])
def folder(request, tmp_path_factory):
    """A saved tiny SD pipeline whose scheduler gives other than --steps timesteps at 3 steps: the shipped sd15
    PNDM (3 + 1) and a Heun solver (2 x 3 - 1, scheduling_heun_discrete.py:364-367), with the calls expected."""
    name, config, expected = request.param
    return saved(name, config, tmp_path_factory.mktemp(name)), name, expected


def test_a_run_makes_the_denoiser_calls_its_profile_counts(folder, tmp_path):
    path, name, expected = folder
    result, _ = bench(BenchSpec(model=str(path), steps=3, iterations=1), out=tmp_path)
    counted = sum(c.calls for c in result.profile.components if c.role == "denoiser")
    assert counted == expected and result.profile.scheduler.startswith(f"{name}: {expected} denoiser steps")
    for iteration in [result.first_call, *result.iterations]:
        assert iteration.denoiser_calls == expected and len(iteration.stages.steps_s) == expected
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(run_table(result))
    assert f"denoising ({expected} steps)" in console.export_text()  # the steps it timed, not --steps 3


def test_a_random_weight_pipeline_runs_the_entry_s_scheduler():
    """loading.random_pipeline builds the entry's shipped scheduler, not the tiny template's DDIM: the UNet runs once
    per PNDM timestep, as the offline plan counts (tiny-sd's components, sd15's scheduler)."""
    tiny = resolve("tiny-sd")
    entry = tiny.model_copy(update={"extra": {**tiny.extra, "scheduler": SD15}})
    pipe = random_pipeline(entry, torch.device("cpu"), torch.float32)
    assert isinstance(pipe.scheduler, diffusers.PNDMScheduler)
    calls = []
    pipe.unet.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        pipe("a cat", num_inference_steps=3, height=32, width=32, output_type="latent")
    family = get_family(entry.family)
    spec = ProfileSpec(model=entry.name, steps=3, height=32, width=32).with_defaults(entry.defaults)
    (planned,) = [c for c in family.plan(family.shapes(entry, spec)) if c.component == "unet"]
    assert len(calls) == planned.count == 4


def test_deep_cache_runs_in_full_the_calls_whose_repeated_timestep_index_says_so(tmp_path):
    """DeepCache indexes a call by its timestep's first place (extension/deepcache.py:41): PNDM's repeated timestep
    gives two calls one index, so at interval 2 and 8 steps 4 of the 9 calls run the deep blocks, not 5."""
    from DeepCache import DeepCacheSDHelper

    path = saved("PNDMScheduler", SD15["config"], tmp_path)
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(path)
    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=2, cache_branch_id=0)
    helper.enable()
    deep = []
    pipe.unet.mid_block.resnets[0].register_forward_hook(lambda *_: deep.append(1))  # skipped with the mid block
    with torch.no_grad():
        pipe("a cat", num_inference_steps=8, height=32, width=32, output_type="latent")
    local = resolve(str(path))  # a saved folder's scheduler is its own, and so is what the entry says of it
    assert local.extra["scheduler"]["class"] == "PNDMScheduler" and "scheduler_note" not in local.extra
    places = schedule.first_places(local, 8)
    assert len(places) == 9 and deep_cache_full(places, 2) == len(deep) == 4


def test_the_families_that_count_steps_themselves_have_schedulers_that_give_steps():
    """Families with their own denoiser_calls count --steps (or split it): every entry of theirs whose scheduler is
    known gives exactly that many timesteps, as the pipeline calls set_timesteps."""
    own = [e for e in all_entries() if type(get_family(e.family)).denoiser_calls is not Family.denoiser_calls]
    checked = [e for e in own if schedule.scheduler_of(e) is not None]
    assert checked
    for entry in checked:
        for steps in (1, 2, entry.defaults.steps):
            assert schedule.timesteps(entry, steps) == steps, entry.name


def test_a_swapped_sampler_s_steps_are_counted_not_the_pipeline_s(folder, tmp_path):
    """--opt scheduler:name=ddim on a PNDM (or Heun) pipeline: the run makes DDIM's 3 calls at 3 steps, and its
    profile (BenchSpec.profile_spec, the prediction's too) counts the sampler's timesteps, not the pipeline's."""
    path, _, _ = folder
    swap = OptimizationSpec(name="scheduler", params={"name": "ddim"})
    result, _ = bench(BenchSpec(model=str(path), steps=3, iterations=1, optimizations=[swap]), out=tmp_path)
    counted = sum(c.calls for c in result.profile.components if c.role == "denoiser")
    assert counted == 3 and result.profile.scheduler == "DDIMScheduler: 3 denoiser steps"
    for iteration in [result.first_call, *result.iterations]:
        assert iteration.denoiser_calls == 3 and len(iteration.stages.steps_s) == 3


def test_profile_counts_a_sampler_swapped_in_and_refuses_one_that_does_not_fit(cli):
    """`profile --scheduler` counts what bench's --opt scheduler:name=... runs (a published run made with another
    sampler is counted as it ran), and refuses a sampler for the other kind of model as bench does."""
    code, out, _ = cli("profile", "sd15", "--steps", "8", "--scheduler", "euler-ancestral", "--json")
    assert code == 0 and json.loads(out)["denoiser_steps"] == 8  # PNDM's 9 by default
    assert "EulerAncestralDiscreteScheduler" in json.loads(out)["scheduler"]
    code, _, err = cli("profile", "flux-dev", "--scheduler", "ddim")
    assert (
        code != 0
        and "ddim is not a flow-matching sampler, and flux-dev is a flow model: use flow-euler" in err
        and "Traceback" not in err
    )
    code, _, err = cli("profile", "sd15", "--scheduler", "heun")
    assert code != 0 and "not a sampler diffmeter swaps in" in err
