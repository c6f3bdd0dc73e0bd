"""SeaCache (``--opt sea-cache``): diffusers' own defaults and parameter checks, its hook on a real tiny Wan pipeline
skipping the calls its rule allows, refused where it would run every call in full, listed, and left out of the time."""

import dataclasses
import json
import re

import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.optimize.options import from_flags
from diffmeter.tiny import tiny_pipeline

STEPS = 8


def target(model: str, images: bool = False) -> Target:
    entry = resolve(model)
    return Target(entry, get_family(entry.family), torch.device("cpu"), "float32", STEPS, images=images)


def sea(**params):
    (built,) = build([OptimizationSpec(name="sea-cache", params=params)])
    return built


def test_its_defaults_are_diffusers_own():
    from diffusers.hooks import SeaCacheConfig

    theirs = {f.name: getattr(SeaCacheConfig(), f.name) for f in dataclasses.fields(SeaCacheConfig)}
    theirs.pop("raw_vision_callback")  # an adapter for models diffusers has none for: not offered
    assert sea().config.model_dump() == theirs


BAD = [
    ("threshold", -0.1),
    ("threshold", float("nan")),
    ("threshold", float("inf")),
    ("residual_order", 2),
    ("retention_steps", -1),
    ("cache_end_steps", -1),
    ("max_consecutive_cached", -1),
    ("max_consecutive_cached", True),
    ("max_consecutive_cached", 1.5),
    ("power_exp", 0.0),
    ("power_exp", float("inf")),
]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_a_parameter_diffusers_refuses_is_one_line_before_loading(key, value):
    from diffusers.hooks import SeaCacheConfig

    with pytest.raises((ValueError, TypeError)):
        SeaCacheConfig(**{key: value})  # diffusers' __post_init__ refuses it
    with pytest.raises(DiffmeterError, match=re.escape(f"sea-cache: bad parameter {key} {value!r}: ")):
        sea(**{key: value})


def test_the_limits_diffusers_accepts_are_accepted():
    from diffusers.hooks import SeaCacheConfig

    edge = {"threshold": 0.0, "residual_order": 0, "retention_steps": 0, "cache_end_steps": 0}
    edge |= {"max_consecutive_cached": 0, "power_exp": 0.5}
    SeaCacheConfig(**edge)
    assert sea(**edge).label().startswith("sea-cache-")


def blocks_run(pipe, steps: int) -> int:
    """How many times the tail block's attention (the last of the cached stack) ran in one generation of the tiny
    pipeline (the block's own call is still made when skipped: its hook returns the input)."""
    runs = []
    pipe.transformer.blocks[-1].attn1.register_forward_hook(lambda *_: runs.append(1))
    with torch.no_grad():
        pipe(
            "a cat",
            height=16,
            width=16,
            num_frames=9,
            num_inference_steps=steps,
            guidance_scale=5.0,
            output_type="np",
            generator=torch.Generator().manual_seed(0),
        )
    return len(runs)


def test_the_real_hook_skips_the_blocks_as_often_as_its_rule_allows_on_tiny_wan():
    from diffusers.hooks import HookRegistry

    t = target("tiny-wan")
    optimization = sea(threshold=1e9)  # random weights: every call the rule allows skips
    check([optimization], t)
    plain = tiny_pipeline(t.entry)
    full = blocks_run(plain, STEPS)
    pipe = tiny_pipeline(t.entry)
    optimization.apply(pipe, t)
    assert "sea_cache_root" in HookRegistry.check_if_exists_or_initialize(pipe.transformer).hooks
    assert "sea_cache_leader_block" in HookRegistry.check_if_exists_or_initialize(pipe.transformer.blocks[0]).hooks
    ran = blocks_run(pipe, STEPS)
    # per CFG branch (its own cache context): step 0 retained, step 7 the cache's end, and after two skipped steps
    # one computed (max_consecutive_cached=2): 0 c, 1-2 s, 3 c, 4-5 s, 6 c, 7 c -> 4 of 8 skipped
    assert full == 2 * STEPS and ran == 2 * (STEPS - 4)


REFUSED = [
    ("tiny-flux", False, "on FluxTransformer2DModel it would run every call in full"),
    ("tiny-sd", False, "not a CacheMixin model"),
    ("tiny-wan-i2v", False, "takes 36 input channels and returns 16"),
    ("tiny-wan22-5b", True, "with input images the pipeline runs as its image-to-video pipeline"),
]


@pytest.mark.parametrize(("model", "images", "message"), REFUSED)
def test_it_is_refused_where_it_would_run_every_call_in_full(model, images, message):
    with pytest.raises(DiffmeterError, match=message):
        check([sea()], target(model, images))


def test_the_wan_text_to_video_models_take_it():
    for model in ("tiny-wan", "tiny-wan22", "tiny-wan22-5b", "wan21-t2v-1.3b", "wan22-t2v-a14b"):
        check([sea()], target(model))


def test_bench_refuses_it_with_an_input_image_in_one_line(cli, tmp_path):
    code, out, err = cli("bench", "tiny-wan22-5b", "--opt", "sea-cache", "--image-size", "64x64", "--out", tmp_path)
    assert code == 2 and "image-to-video pipeline" in err and "Traceback" not in out + err
    assert not any(tmp_path.iterdir())


def test_listed_by_optimizations_with_why_not(cli):
    code, out, _ = cli("optimizations", "tiny-wan", "--json")
    row = next(r for r in json.loads(out) if r["name"] == "sea-cache")
    assert code == 0 and row["applies"] and row["kind"] == "cache" and row["parameters"]["threshold"] == 0.25
    code, out, _ = cli("optimizations", "tiny-flux", "--json")
    row = next(r for r in json.loads(out) if r["name"] == "sea-cache")
    assert code == 0 and not row["applies"] and "Cosmos 3 and Wan text-to-video" in row["reason"]


def test_the_cache_flags_reach_its_threshold():
    (spec,) = from_flags(cache="sea-cache", cache_threshold=0.3)
    assert (spec.name, spec.params) == ("sea-cache", {"threshold": 0.3})
    assert build([spec])[0].label() == "sea-cache-threshold=0.3"
    with pytest.raises(DiffmeterError, match="--cache-interval does not apply to sea-cache"):
        from_flags(cache="sea-cache", cache_interval=3)


def test_profile_gpu_names_it_in_time_left_out(cli):
    code, out, _ = cli("profile", "tiny-wan", "--gpu", "h100", "--opt", "sea-cache", "--json")
    found = json.loads(out)
    assert code == 0 and found["time_left_out"][0].startswith("sea-cache: its skipped calls follow the drift")
    assert found["time"] is None  # it can make the run faster: no range or bound of the pipeline without it


def test_the_family_matrix_lists_wan_for_its_text_to_video_models():
    from diffmeter.catalog import all_entries
    from diffmeter.optimize.matrix import family_compatibility

    wan = [entry for entry in all_entries() if entry.origin == "catalog" and entry.family == "wan"]
    text_to_video = [entry.name for entry in wan if not entry.defaults.image_sizes]
    assert wan[0].defaults.image_sizes  # the family's first model takes an image: alone it would say "no"
    row = next(r for r in family_compatibility(wan, torch.device("cpu")) if r.name == "sea-cache")
    assert row.applies and row.models == text_to_video and len(text_to_video) < len(wan)
