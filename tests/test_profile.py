"""Profile semantics on real catalog configs: CFG, steps, batch, sizes, units, errors."""

import pytest

from diffmeter import DiffmeterError, Profile, profile


def _component(result: Profile, name: str):
    return next(c for c in result.components if c.name == name)


def test_python_api_returns_typed_profile_with_units():
    result = profile("flux-dev", height=1024, width=1024)
    assert isinstance(result, Profile)
    assert result.total_flops == 2 * result.total_macs
    assert result.units["flops"].startswith("floating-point operations, 2 per MAC")
    assert {c.role for c in result.components} == {"denoiser", "text_encoder", "vae_decoder"}
    assert result.param_bytes == 2 * result.params  # bfloat16 by default for FLUX


def test_guidance_distilled_flux_runs_one_batch_and_no_negative_prompt():
    result = profile("flux-dev", steps=28)
    transformer = _component(result, "transformer")
    assert not result.cfg and transformer.calls == 28 and transformer.batch_per_call == 1
    assert all(c.calls == 1 for c in result.components if c.role == "text_encoder")


def test_flux_true_cfg_calls_the_transformer_twice_per_step_and_encodes_the_negative_prompt_with_both_encoders():
    """FluxPipeline.__call__ (diffusers 0.42.1): do_true_cfg encodes the negative prompt with CLIP and T5 and
    runs a second, separate transformer call per step; the embedded guidance stays."""
    plain, true_cfg = profile("flux-dev", steps=28), profile("flux-dev", steps=28, true_cfg_scale=3.5)
    transformer = _component(true_cfg, "transformer")
    assert true_cfg.cfg and true_cfg.true_cfg_scale == 3.5 and true_cfg.guidance_scale == plain.guidance_scale
    assert transformer.calls == 56 and transformer.batch_per_call == 1
    assert transformer.macs == 2 * _component(plain, "transformer").macs
    assert [c.calls for c in true_cfg.components if c.role == "text_encoder"] == [2, 2]
    assert _component(true_cfg, "vae").macs == _component(plain, "vae").macs


@pytest.mark.parametrize(
    "model,scale,message",
    [
        ("sd15", 3.0, "sd15 guides with --guidance-scale alone: drop --true-cfg-scale"),
        ("flux-dev", 1.0, "--true-cfg-scale must be above 1"),
        # QwenImagePipeline's one guidance is its true_cfg_scale, which --guidance-scale sets (a new user's trial:
        # "qwen-image guides with --guidance-scale alone")
        ("qwen-image", 6.0, "true_cfg_scale is what --guidance-scale sets for qwen-image .* --guidance-scale 6 "),
    ],
)
def test_true_cfg_is_refused_where_it_means_nothing(model, scale, message):
    with pytest.raises(DiffmeterError, match=message):
        profile(model, true_cfg_scale=scale)


def test_cfg_doubles_the_denoiser_batch_and_encodes_the_negative_prompt():
    guided, unguided = profile("sd15", guidance_scale=7.5), profile("sd15", guidance_scale=1.0)
    assert _component(guided, "unet").macs == 2 * _component(unguided, "unet").macs
    assert _component(guided, "text_encoder").calls == 2 and _component(unguided, "text_encoder").calls == 1
    assert _component(guided, "vae").macs == _component(unguided, "vae").macs


def test_sdxl_zeroes_the_empty_negative_prompt_instead_of_encoding_it():
    result = profile("sdxl")
    assert result.cfg and _component(result, "text_encoder").calls == 1


def test_separate_cfg_calls_for_wan():
    transformer = _component(profile("wan21-t2v-1.3b", steps=10, num_frames=5), "transformer")
    assert transformer.calls == 20 and transformer.batch_per_call == 1


def test_denoiser_scales_linearly_with_steps_and_batch_fixed_costs_do_not():
    base, more_steps, bigger_batch = (
        profile("sd3-medium", steps=10),
        profile("sd3-medium", steps=30),
        profile("sd3-medium", steps=10, batch_size=3),
    )
    assert _component(more_steps, "transformer").macs == 3 * _component(base, "transformer").macs
    assert _component(more_steps, "vae").macs == _component(base, "vae").macs
    assert _component(bigger_batch, "vae").macs == 3 * _component(base, "vae").macs
    assert base.denoiser_macs_per_step * 10 == _component(base, "transformer").macs


def test_vae_decodes_at_the_true_latent_size():
    # SANA's DC-AE compresses 32x: a 1024px image is a 32x32 latent; SD's KL VAE: 8x
    sana, sd = profile("sana-600m-1024"), profile("sdxl")
    assert sana.height == sd.height == 1024
    assert 0 < _component(sana, "vae").macs < 2 * _component(sd, "vae").macs


def test_text_encoders_see_the_padded_lengths_of_the_pipeline():
    pixart_alpha = _component(profile("pixart-alpha-1024"), "text_encoder").invocations[0]
    pixart_sigma = _component(profile("pixart-sigma-1024"), "text_encoder").invocations[0]
    assert "120 tokens" in pixart_alpha.note and "300 tokens" in pixart_sigma.note


def test_prompt_dependent_context_lengths():
    short, full = profile("kandinsky3", prompt_tokens=10), profile("kandinsky3")
    assert _component(short, "unet").macs < _component(full, "unet").macs
    lumina = _component(profile("lumina2", prompt_tokens=40, negative_prompt_tokens=1), "transformer")
    assert [i.note for i in lumina.invocations] == ["cond: 40 caption tokens", "uncond: 1 caption tokens"]


def test_module_breakdown_sums_to_the_component():
    result = profile("pixart-alpha-512", depth=1)
    transformer = _component(result, "transformer")
    assert sum(transformer.modules_macs.values()) == transformer.macs
    assert "transformer.transformer_blocks" in transformer.modules_macs


def test_json_contract_keys():
    data = profile("tiny-sd").to_json_dict()
    for key in (
        "model",
        "family",
        "height",
        "width",
        "steps",
        "batch_size",
        "guidance_scale",
        "components",
        "denoiser_macs_per_step",
        "total_macs",
        "total_flops",
    ):
        assert key in data
    for key in ("name", "role", "class", "params", "calls", "macs", "flops"):
        assert key in data["components"][0]


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"height": 1000}, "not a multiple of 16, which StableDiffusion3Pipeline requires"),
        ({"width": 1030}, "not a multiple of 16"),
        ({"steps": 0}, "--steps must be a positive integer"),
        ({"batch_size": -1}, "--batch-size must be a positive integer"),
        ({"dtype": "float8"}, "unknown dtype"),
        ({"height": 4096}, "cannot generate 4096x4096 .WxH.: its transformer .SD3Transformer2DModel. says: Height"),
        ({"height": 1048576}, "cannot generate|too large to count"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(settings, message):
    with pytest.raises(DiffmeterError, match=message):
        profile("sd3-medium", **settings)


@pytest.mark.slow
def test_a_batch_cogvideox_vae_cannot_decode_at_once_names_vae_slicing():
    """diffusers' CogVideoXSafeConv3d splits a tensor over 2 GiB along time into parts its kernel cannot span: the
    pipeline decodes 8 videos only one at a time (about a minute of fake-tensor counting)."""
    with pytest.raises(DiffmeterError, match=r"cannot run 8 at once .*vae.enable_slicing\(\) \(bench --vae-slicing\)"):
        profile("cogvideox-2b", batch_size=8, steps=1)


def test_video_frames_off_the_temporal_compression_are_rounded_as_the_pipeline_rounds_them():
    """WanPipeline rounds 80 frames to 81 (tests/test_video_frames.py holds the tiny pipeline's real run to it)."""
    found = profile("wan21-t2v-1.3b", num_frames=80, steps=1)
    assert found.num_frames == 81 and any("rounds 80 frames to 81" in note for note in found.notes)


def test_pipelines_that_round_sizes_are_counted_at_the_size_they_generate():
    kandinsky = profile("kandinsky3", height=1000, width=1000, steps=1)  # rounds up to multiples of 64
    flux = profile("flux-dev", height=1000, width=1000, steps=1)  # rounds down to multiples of 16
    assert (kandinsky.height, flux.height) == (1024, 992) and (kandinsky.requested_height, flux.requested_height) == (
        1000,
        1000,
    )
    assert profile("kandinsky3", height=1024, width=1024, steps=1).total_macs == kandinsky.total_macs


def test_committed_json_schema_is_current():
    import json
    from pathlib import Path

    from diffmeter.predict.predicted_profile import ProfileOutput

    committed = json.loads((Path(__file__).parents[1] / "docs" / "profile.schema.json").read_text())
    assert committed == ProfileOutput.model_json_schema(mode="serialization")
    one = committed["$defs"]["PredictedProfile"]["properties"]
    assert set(Profile.model_fields) < set(one)  # a plain profile's keys, and the prediction's


@pytest.mark.parametrize("name", ["pixart-sigma-1024", "sana-1600m-1024", "hunyuandit"])
def test_resolution_binning_counts_the_size_the_pipeline_generates(name):
    binned = profile(name, height=1000, width=600, steps=1)
    requested = profile(
        name, height=1024, width=608 if name != "sana-1600m-1024" else 608 + 32, steps=1, resolution_binning=False
    )
    assert (binned.height, binned.width) != (1000, 600) and binned.height % 64 == 0
    assert any("resolution binning: 600x1000 (WxH) requested" in note for note in binned.notes)
    assert requested.height == 1024 and not any("binning" in note for note in requested.notes)


def test_bin_sizes_are_left_alone():
    result = profile("pixart-sigma-1024", height=1024, width=1024)
    assert (result.height, result.width) == (1024, 1024) and not result.notes
    assert profile("sana-600m-1024").notes == [
        "the complex-human-instruction length (220 tokens) is an estimate; --instruction-tokens N sets the true "
        "Gemma token count"
    ]


def test_costliest_work_starts_first_and_results_keep_their_order():
    """profile --all starts video models first (they count longest); results come back in the order asked."""
    from diffmeter.parallel import parallel_map

    items = [("a", 0.0), ("b", 1.0), ("c", 0.5), ("d", 2.0)]
    started = parallel_map(_start_time, items, jobs=2, cost=lambda item: item[1])
    assert [item for item, _ in started] == ["a", "b", "c", "d"]
    by_start = [item for item, _ in sorted(started, key=lambda pair: pair[1])]
    assert set(by_start[:2]) == {"d", "b"}, by_start  # two workers: the two costliest go first


def _start_time(item):
    import time

    started = time.monotonic()
    time.sleep(0.2)
    return item[0], started
