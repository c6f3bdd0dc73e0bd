"""Wan 2.2 against the real WanPipeline: the switch between its two experts (A14B), the Wan 2.2 VAE
and the per-token timesteps of TI2V-5B, stage timing of both experts, and the closed forms."""

import dataclasses

import diffusers
import pytest
import torch
from tiny_runs import PROMPT, run_tiny

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.pipelines import build_component
from diffmeter.tiny import tiny_pipeline

EXPERTS = ("transformer", "transformer_2")


def _real_expert_calls(pipe, steps: int, **call) -> dict[str, int]:
    """Forward calls of each expert in one real generation (latents only: the VAE is not in question)."""
    calls = dict.fromkeys(EXPERTS, 0)
    handles = [
        getattr(pipe, name).register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
        for name in EXPERTS
    ]
    try:
        with torch.no_grad():
            pipe(
                PROMPT,
                num_inference_steps=steps,
                output_type="latent",
                generator=torch.Generator().manual_seed(0),
                **call,
            )
    finally:
        for handle in handles:
            handle.remove()
    return calls  # an expert given no step: 0 calls, as the profile lists it


def _counted_expert_calls(name: str, **settings) -> dict[str, int]:
    return {c.name: c.calls for c in profile(name, **settings).components if c.role == "denoiser"}


def _real_macs(pipe, names, **call) -> dict[str, int]:
    components = {name: getattr(pipe, name) for name in names}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(PROMPT, output_type="np", generator=torch.Generator().manual_seed(0), **call)
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in names}


@pytest.mark.parametrize("guidance_scale", [5.0, 1.0], ids=["cfg", "no-cfg"])
def test_tiny_expert_calls_equal_the_real_pipelines_at_several_step_counts(guidance_scale):
    entry = resolve("tiny-wan22")
    pipe = tiny_pipeline(entry)
    assert pipe.config.boundary_ratio == entry.extra["pipeline_init"]["boundary_ratio"]
    splits = set()
    for steps in (1, 2, 3, 5, 8):
        real = _real_expert_calls(
            pipe, steps, guidance_scale=guidance_scale, height=16, width=16, num_frames=9, max_sequence_length=16
        )
        counted = _counted_expert_calls(
            "tiny-wan22", steps=steps, guidance_scale=guidance_scale, max_sequence_length=16
        )
        assert counted == real, steps
        splits.add(real.get("transformer", 0) * 100 // sum(real.values()))
    assert len(splits) >= 3  # the boundary falls at different places: the split really moves with the step count


@pytest.mark.parametrize("steps", [10, 40, 50])
def test_a14b_experts_switch_where_the_real_pipeline_switches_with_its_shipped_scheduler(steps):
    """The tiny experts driven by the A14B entry's own scheduler config and boundary: the counted
    calls of the real entry (at its defaults, any size) equal the real pipeline's per-expert calls."""
    entry = resolve("wan22-t2v-a14b")
    pipe = tiny_pipeline(resolve("tiny-wan22"))
    scheduler = entry.extra["scheduler"]
    pipe.scheduler = getattr(diffusers, scheduler["class"]).from_config(scheduler["config"])
    pipe.register_to_config(boundary_ratio=entry.extra["pipeline_init"]["boundary_ratio"])
    call = get_family("wan").guidance_arguments(entry, entry.defaults.guidance_scale)
    assert call["guidance_scale_2"] == entry.extra["guidance_scale_2"]
    real = _real_expert_calls(pipe, steps, height=16, width=16, num_frames=5, max_sequence_length=16, **call)
    counted = _counted_expert_calls("wan22-t2v-a14b", steps=steps, height=256, width=256, num_frames=5)
    assert counted == real and set(real) == set(EXPERTS)


def test_guidance_scale_2_never_turns_cfg_on_or_off():
    """WanPipeline decides the uncond branch from guidance_scale alone, on both experts' steps."""
    entry = resolve("tiny-wan22")
    pipe = tiny_pipeline(entry)
    common = dict(height=16, width=16, num_frames=9, max_sequence_length=16)
    off = _real_expert_calls(pipe, 5, guidance_scale=1.0, guidance_scale_2=3.0, **common)
    on = _real_expert_calls(pipe, 5, guidance_scale=4.0, guidance_scale_2=1.0, **common)
    assert off == _counted_expert_calls("tiny-wan22", steps=5, guidance_scale=1.0)
    assert on == _counted_expert_calls("tiny-wan22", steps=5, guidance_scale=4.0)
    assert get_family("wan").guidance_arguments(resolve("wan21-t2v-14b"), 5.0) == {"guidance_scale": 5.0}


def test_tiny_two_experts_exact_where_the_split_differs_from_the_default():
    entry = resolve("tiny-wan22")
    _, real, settings = run_tiny(entry, steps=5)
    offline = profile(entry.name, **settings)
    assert {c.name: c.macs for c in offline.components} == real
    assert all(real[name] > 0 for name in EXPERTS)
    assert any("Wan 2.2 experts" in note for note in offline.notes)


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-wan22-5b"])
def test_vae_scale_and_latent_frames_follow_the_vae_config_the_pipeline_reads(name):
    entry = resolve(name)
    family, pipe = get_family(entry.family), tiny_pipeline(entry)
    assert family.vae_scale(entry) == pipe.vae_scale_factor_spatial
    assert family.latent_channels(entry) == pipe.vae.config.z_dim == pipe.transformer.config.in_channels


def test_the_real_wan22_vae_compresses_16x_and_the_wan21_vae_8x():
    for name, scale in (("wan22-ti2v-5b", 16), ("wan22-t2v-a14b", 8), ("wan21-t2v-14b", 8)):
        entry = resolve(name)
        vae = build_component(entry.components["vae"], "meta")
        assert get_family("wan").vae_scale(entry) == vae.config.scale_factor_spatial == scale
        result = profile(name, height=704, width=1280, num_frames=121, steps=1, guidance_scale=1.0)
        assert (result.height, result.width) == (704, 1280)


def test_ti2v_exact_off_its_default_size_frames_and_at_a_size_it_floors():
    """The Wan 2.2 VAE's 32-pixel tokens: 80x96 passes check_inputs (multiples of 16) and WanPipeline
    floors it to 64x96; 13 frames make 4 latent frames; one timestep per token (expand_timesteps)."""
    entry = resolve("tiny-wan22-5b")
    pipe = tiny_pipeline(entry)
    assert pipe.config.expand_timesteps
    real = _real_macs(
        pipe, entry.components, height=80, width=96, num_frames=13, num_inference_steps=2, guidance_scale=5.0
    )
    offline = profile(entry.name, height=80, width=96, num_frames=13, steps=2, guidance_scale=5.0)
    assert {c.name: c.macs for c in offline.components} == real
    assert (offline.height, offline.width) == (64, 96)
    assert any("at 96x64" in note for note in offline.notes)


def test_bench_times_both_experts_as_denoiser_steps(tmp_path):
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    result, _ = bench(BenchSpec(model="tiny-wan22", steps=5, iterations=1), out=tmp_path)
    counted = {c.name: c.calls for c in result.profile.components if c.role == "denoiser"}
    assert set(counted) == set(EXPERTS)
    for iteration in [result.first_call, *result.iterations]:
        assert iteration.denoiser_calls == sum(counted.values())
        assert len(iteration.stages.steps_s) == 5 and all(step > 0 for step in iteration.stages.steps_s)


def test_a_local_wan22_folder_switches_experts_with_its_own_scheduler(tmp_path):
    entry = resolve("tiny-wan22")
    folder = tmp_path / "wan22"
    tiny_pipeline(entry).save_pretrained(folder)
    local = resolve(str(folder))
    assert local.origin == "local" and local.extra["pipeline_init"]["boundary_ratio"] == 0.875
    pipe = diffusers.WanPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    call = dict(height=16, width=16, num_frames=9, max_sequence_length=16)
    real = _real_macs(pipe, local.components, num_inference_steps=5, guidance_scale=5.0, **call)
    offline = profile(str(folder), steps=5, guidance_scale=5.0, **call)
    assert {c.name: c.macs for c in offline.components} == real


@pytest.mark.parametrize("name,formula", [("wan22-t2v-a14b", "wan"), ("wan22-ti2v-5b", "wan_expand_timesteps")])
@pytest.mark.parametrize("size", [(480, 832, 9), (704, 1280, 121)])
def test_closed_form_matches_the_counted_expert_call(name, formula, size):
    height, width, frames = size
    entry = resolve(name)
    result = profile(name, height=height, width=width, num_frames=frames, guidance_scale=1.0, steps=2)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    scale = get_family("wan").vae_scale(entry)
    tokens = ((frames - 1) // 4 + 1) * (height // scale // 2) * (width // scale // 2)
    closed = FORMULAS[formula](entry.components["transformer"].config, tokens, entry.text_max_length["text_encoder"])
    assert abs(closed - counted) / counted < 0.01


def test_random_weights_use_the_scheduler_the_entry_ships():
    """--random-weights borrows tokenizers from the family's first tiny entry (tiny-wan, whose scheduler is
    FlowMatchEuler); an entry shipping its own scheduler keeps it, since Wan 2.2's expert split depends on it."""
    from diffmeter.loading import random_pipeline

    tiny = resolve("tiny-wan22")
    scheduler = resolve("wan22-t2v-a14b").extra["scheduler"]
    entry = tiny.model_copy(update={"extra": {**tiny.extra, "scheduler": scheduler}})
    pipe = random_pipeline(entry, torch.device("cpu"), torch.float32)
    assert type(pipe.scheduler).__name__ == scheduler["class"] == "UniPCMultistepScheduler"
    assert pipe.scheduler.config.flow_shift == scheduler["config"]["flow_shift"]
    assert pipe.config.boundary_ratio == tiny.extra["pipeline_init"]["boundary_ratio"]


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-wan22-5b"])
def test_the_frame_by_frame_decode_is_exact_over_many_frames(name):
    """The profile replays AutoencoderKLWan's per-frame decoder call once its caches are full: a real
    decode of 9 latent frames (run frame by frame, caches and all) costs exactly what is counted."""
    entry = resolve(name)
    vae = tiny_pipeline(entry).vae
    temporal = vae.config.scale_factor_temporal
    frames = 8 * temporal + 1
    counted = profile(name, num_frames=frames, steps=1)
    shapes = get_family("wan").shapes(entry, counted_spec(name, frames))
    latents = torch.randn(1, vae.config.z_dim, shapes.latent_frames, shapes.latent_height, shapes.latent_width)
    assert shapes.latent_frames == 9
    with torch.no_grad(), count_flops({"vae": vae}) as counts:
        vae.decode(latents, return_dict=False)
    (decoded,) = [c for c in counted.components if c.name == "vae"]
    assert decoded.macs == sum(counts.by_module["vae"].values()) // 2


def counted_spec(name, frames):
    from diffmeter.spec import ProfileSpec

    return ProfileSpec(model=name, num_frames=frames, steps=1).with_defaults(resolve(name).defaults)


@pytest.mark.parametrize("name", ["wan21-t2v-1.3b", "wan22-ti2v-5b"])
def test_replaying_the_decoder_counts_what_running_every_frame_counts(name):
    """On the real Wan 2.1 and 2.2 VAEs, replaying steady-state frames equals running each one."""
    from diffmeter.flops.profile import count_call, meta_inputs

    entry = resolve(name)
    family = get_family("wan")
    (call,) = family.decoder_calls(family.shapes(entry, counted_spec(name, 8 * 4 + 1)))
    assert call.replayed == ("decoder",)
    vae = build_component(entry.components["vae"], "meta")
    replayed = count_call(vae, "vae", call, meta_inputs(call), submodules=False)
    every_frame = count_call(vae, "vae", dataclasses.replace(call, replayed=()), meta_inputs(call), submodules=False)
    assert replayed.by_kind() == every_frame.by_kind() and replayed.total > 0


def test_an_expert_given_no_step_is_still_loaded_and_counted_in_the_parameters():
    """At one step WanPipeline runs only the high-noise expert, but loads both."""
    one = profile("wan22-t2v-a14b", steps=1)
    experts = {c.name: c for c in one.components if c.role == "denoiser"}
    assert experts["transformer"].calls == 2 and experts["transformer_2"].calls == 0
    assert experts["transformer_2"].macs == 0 and experts["transformer_2"].params > 0
    assert one.params == profile("wan22-t2v-a14b", steps=40).params
