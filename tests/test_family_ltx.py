"""LTX-Video beyond the generic tests: frame counts that are not 8k+1, the timestep-conditioned VAE decode,
the condition pipeline's precomputed video coordinates, another max_sequence_length, and the closed form."""

import diffusers
import pytest
import torch
from tiny_runs import TINY, run_tiny

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.pipelines import build_component
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import assemble, tiny_pipeline

PROMPT = "a photo of a cat riding a horse"


def _entry(name):
    return next(e for e in TINY if e.name == name)


def _run(pipe, components, **call):
    """The real pipeline under the counter: (per-component MACs, counts, output frames)."""
    parts = {name: getattr(pipe, name) for name in components}
    with torch.no_grad(), count_flops(parts) as counts:
        frames = pipe(prompt=PROMPT, output_type="np", generator=torch.Generator().manual_seed(0), **call).frames
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in components}
    return macs, counts, frames


def _offline(name, **settings):
    return {c.name: c.macs for c in profile(name, **settings).components}


@pytest.mark.parametrize("name", ["tiny-ltx", "tiny-ltx-condition"])
def test_a_frame_count_not_8k_plus_1_is_counted_at_the_latent_frames_the_pipeline_makes(name):
    entry = _entry(name)
    pipe = tiny_pipeline(entry)
    call = dict(height=64, width=64, num_frames=12, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16)
    real, _, frames = _run(pipe, entry.components, **call)
    assert frames.shape[1] == 9  # (12 - 1) // 8 + 1 = 2 latent frames, decoded to 8 * 1 + 1 frames
    result = profile(name, height=64, width=64, num_frames=12, steps=2, guidance_scale=3.0, max_sequence_length=16)
    assert {c.name: c.macs for c in result.components} == real
    assert any("takes 12 frames as 2 latent frames, decoded to 9 frames" in note for note in result.notes)
    nine = _offline(name, height=64, width=64, num_frames=9, steps=2, guidance_scale=3.0, max_sequence_length=16)
    assert nine == real  # the same work as asking for 9 frames
    assert not any("latent frames" in n for n in profile(name, num_frames=17, height=64, width=64).notes)


def test_decode_timestep_conditioning_runs_the_decoders_time_embedder_only_where_the_vae_has_one():
    """A 0.9.1+ VAE (timestep_conditioning) gets a decode timestep per video and runs its time embedder;
    the 0.9.0 VAE gets None. Both counted exactly, with a non-default decode_timestep and noise scale."""
    call = dict(
        height=64,
        width=96,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=3.0,
        max_sequence_length=16,
        decode_timestep=0.05,
        decode_noise_scale=0.025,
    )
    embedder = {}
    for name in ("tiny-ltx", "tiny-ltx-condition"):
        entry = _entry(name)
        real, counts, _ = _run(tiny_pipeline(entry), entry.components, **call)
        offline = _offline(name, height=64, width=96, num_frames=9, steps=2, guidance_scale=3.0, max_sequence_length=16)
        assert offline == real
        embedder[name] = sum(counts.by_module.get("vae.decoder.time_embedder", {}).values())
    assert embedder["tiny-ltx"] == 0 and embedder["tiny-ltx-condition"] > 0


def test_ltx_pipeline_with_a_timestep_conditioned_vae_is_counted_exactly(tmp_path):
    """LTXPipeline itself also passes the decode timestep when its VAE takes one (LTX-Video 0.9.1/0.9.5
    folders): the 0.9.5+ tiny VAE in an LTXPipeline folder, profiled as a local folder."""
    plain, conditioned = _entry("tiny-ltx"), _entry("tiny-ltx-condition")
    torch.manual_seed(0)
    parts = {name: build_component(c, "cpu") for name, c in plain.components.items()}
    parts["vae"] = build_component(conditioned.components["vae"], "cpu")
    assemble("LTXPipeline", parts, plain.extra["runtime"]).save_pretrained(tmp_path / "ltx")
    pipe = diffusers.LTXPipeline.from_pretrained(tmp_path / "ltx")
    pipe.set_progress_bar_config(disable=True)
    assert pipe.vae.config.timestep_conditioning
    call = dict(height=64, width=64, num_frames=9, guidance_scale=3.0, max_sequence_length=16, decode_timestep=0.05)
    real, counts, _ = _run(pipe, plain.components, num_inference_steps=2, **call)
    assert sum(counts.by_module.get("vae.decoder.time_embedder", {}).values()) > 0
    local = profile(
        str(tmp_path / "ltx"),
        height=64,
        width=64,
        num_frames=9,
        steps=2,
        guidance_scale=3.0,
        max_sequence_length=16,
    )
    assert local.family == "ltx" and {c.name: c.macs for c in local.components} == real


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0], ids=["no-cfg", "cfg"])
def test_condition_pipeline_gets_the_video_coords_the_family_builds(guidance_scale):
    """LTXConditionPipeline passes precomputed pixel coordinates (frames scaled by 1/frame_rate) and a (batch, 1)
    timestep instead of a grid size: the family's denoiser inputs are the very tensors the pipeline passes."""
    entry = _entry("tiny-ltx-condition")
    pipe = tiny_pipeline(entry)
    seen = []

    def spy(module, args, kwargs):
        seen.append({k: kwargs[k] for k in ("hidden_states", "timestep", "video_coords")})

    handle = pipe.transformer.register_forward_pre_hook(spy, with_kwargs=True)
    call = dict(height=64, width=128, num_frames=17, guidance_scale=guidance_scale, max_sequence_length=16)
    try:
        real, _, _ = _run(pipe, entry.components, num_inference_steps=2, **call)
    finally:
        handle.remove()
    settings = dict(height=64, width=128, num_frames=17, steps=2, guidance_scale=guidance_scale, max_sequence_length=16)
    assert _offline(entry.name, **settings) == real

    family = get_family("ltx")
    shapes = family.shapes(entry, ProfileSpec(model=entry.name, **settings).with_defaults(entry.defaults))
    (call_plan,) = family.denoiser_calls(shapes)
    built = call_plan.build(torch.device("cpu"))
    passed = seen[0]
    assert torch.equal(built["video_coords"], passed["video_coords"])
    assert built["timestep"].shape == passed["timestep"].shape == (call_plan.batch, 1)
    assert built["hidden_states"].shape == passed["hidden_states"].shape


def test_another_max_sequence_length_pads_t5_to_it():
    entry = _entry("tiny-ltx")
    _, real, settings = run_tiny(entry, max_sequence_length=24)
    assert settings["max_sequence_length"] == 24
    offline = profile(entry.name, **settings)
    assert {c.name: c.macs for c in offline.components} == real
    assert real["text_encoder"] > run_tiny(entry)[1]["text_encoder"]  # 24 tokens cost more than the default 16


@pytest.mark.parametrize("name", ["ltx-video", "ltx-video-0.9.7-dev"])
@pytest.mark.parametrize("size", [(480, 704, 161), (256, 384, 25)])
def test_closed_form_matches_counted_denoiser_call(name, size):
    height, width, frames = size
    entry = resolve(name)
    result = profile(name, height=height, width=width, num_frames=frames, guidance_scale=1.0)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    tokens = ((frames - 1) // 8 + 1) * (height // 32) * (width // 32)  # 8x temporal, 32x spatial, patch 1
    closed = FORMULAS["ltx"](entry.components["transformer"].config, tokens, entry.text_max_length["text_encoder"])
    assert abs(closed - counted) / counted < 0.01
