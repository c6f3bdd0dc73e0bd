"""LTX-2 (LTX2Pipeline): what the generic exactness tests do not reach. The pipeline's own defaults in a
local folder (1024 Gemma tokens, audio CFG 7, STG, modality isolation), a non-default max_sequence_length,
the connectors' register rule, the three transformer calls per step and the closed form."""

import diffusers
import pytest
import torch
from tiny_runs import PROMPT, counted_run, run_tiny

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.families.ltx2 import audio_frames
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

#: a small video for the tiny pipeline (its defaults are 512x768x121, slow on CPU); everything else default
SMALL = {"height": 64, "width": 96, "num_frames": 17}


def _macs(counts, names) -> dict[str, int]:
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in names}


def test_a_local_folder_is_counted_at_the_pipelines_own_defaults(tmp_path):
    """Called with a prompt and a size only: 1024-token Gemma prompts (left-padded), audio CFG 7, STG and
    modality isolation on, as LTX2Pipeline.__call__ defaults them."""
    tiny_pipeline(resolve("tiny-ltx2")).save_pretrained(tmp_path / "ltx2")
    local = resolve(str(tmp_path / "ltx2"))
    assert local.family == "ltx2" and local.text_max_length == {"text_encoder": 1024}
    pipe = diffusers.LTX2Pipeline.from_pretrained(tmp_path / "ltx2")
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in local.components}) as counts:
        pipe(PROMPT, num_inference_steps=2, output_type="np", **SMALL)
    offline = profile(str(tmp_path / "ltx2"), steps=2, **SMALL)
    assert {c.name: c.macs for c in offline.components} == _macs(counts, local.components)


def test_a_longer_max_sequence_length_is_counted_exactly():
    entry = resolve("tiny-ltx2")
    _, real, settings = run_tiny(entry, max_sequence_length=32)
    counted = profile("tiny-ltx2", **settings)
    assert {c.name: c.macs for c in counted.components} == real
    assert counted.components[0].invocations[0].note.startswith("32 tokens")  # Gemma, not the entry's 16


def test_a_length_the_connectors_cannot_split_into_registers_is_refused_by_both():
    with pytest.raises(ValueError, match="divisible by the number of learnable registers 8"):
        tiny_pipeline(resolve("tiny-ltx2"))(prompt="a cat", num_inference_steps=1, max_sequence_length=20, **SMALL)
    with pytest.raises(DiffmeterError, match="multiple of their 8 learnable registers; try 16 or 24"):
        profile("tiny-ltx2", max_sequence_length=20)
    with pytest.raises(DiffmeterError, match="multiple of their 128 learnable registers; try 128 or 256"):
        profile("ltx-2", max_sequence_length=200)


def test_each_step_calls_the_transformer_three_times_as_the_plan_says():
    """CFG on [negative, positive] (2B), STG on B, modality isolation on B: the batches of the real calls."""
    entry = resolve("tiny-ltx2")
    pipe = tiny_pipeline(entry)
    batches = []
    handle = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(
            (
                kwargs["hidden_states"].shape[0],
                kwargs["isolate_modalities"],
                bool(kwargs["spatio_temporal_guidance_blocks"]),
            )
        ),
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            pipe(
                prompt=[PROMPT] * 2, num_inference_steps=2, output_type="np", **entry.extra["runtime"]["call"], **SMALL
            )
    finally:
        handle.remove()
    assert batches == [(4, False, False), (2, False, True), (2, True, False)] * 2
    plan = profile("tiny-ltx2", batch_size=2).components
    (transformer,) = [c for c in plan if c.name == "transformer"]
    assert [(i.batch, i.count) for i in transformer.invocations] == [(4, 2), (2, 2), (2, 2)]


def test_guidance_one_alone_still_runs_audio_cfg_so_the_family_switches_every_guided_pass_off():
    entry = resolve("tiny-ltx2")
    calls = []
    pipe = tiny_pipeline(entry)
    handle = pipe.transformer.register_forward_pre_hook(
        lambda m, a, k: calls.append(k["hidden_states"].shape[0]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            pipe(prompt=PROMPT, num_inference_steps=1, guidance_scale=1.0, output_type="latent", **SMALL)
            assert calls == [2, 1, 1]  # audio_guidance_scale 7 keeps CFG on, STG and modality too
            calls.clear()
            arguments = get_family("ltx2").guidance_arguments(entry, 1.0)
            pipe(prompt=PROMPT, num_inference_steps=1, output_type="latent", **arguments, **SMALL)
            assert calls == [1]
    finally:
        handle.remove()
    assert not profile("tiny-ltx2", guidance_scale=1.0).cfg


@pytest.mark.slow
@pytest.mark.parametrize("size", [(512, 768, 121), (704, 1216, 161)])
def test_closed_form_matches_the_ltx2_transformer(size):
    height, width, frames = size
    entry = resolve("ltx-2")
    config = entry.components["transformer"].config
    video = ((frames - 1) // 8 + 1) * (height // 32) * (width // 32)
    audio = audio_frames(entry, frames)
    text = entry.text_max_length["text_encoder"]
    unguided = profile("ltx-2", height=height, width=width, num_frames=frames, guidance_scale=1.0)
    counted = next(c for c in unguided.components if c.role == "denoiser").macs_per_call
    closed = FORMULAS["ltx2"](config, video, text, audio)
    assert abs(closed - counted) / counted < 0.01
    guided = profile("ltx-2", height=height, width=width, num_frames=frames)
    isolated = next(c for c in guided.components if c.role == "denoiser").invocations[2]
    closed = FORMULAS["ltx2"](config, video, text, audio, isolate_modalities=True)
    assert abs(closed - isolated.macs_per_call) / isolated.macs_per_call < 0.01


@pytest.mark.slow
def test_bench_times_one_step_per_video_scheduler_step_though_the_pipeline_copies_its_scheduler(tmp_path):
    """LTX2Pipeline deep-copies its scheduler for the audio latents: the stage timer's wrapper must not go with
    the copy (the audio steps would step the video scheduler twice and run off its sigmas)."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    result, _ = bench(BenchSpec(model="tiny-ltx2", steps=3, iterations=1), out=tmp_path)
    denoiser_calls = sum(c.calls for c in result.profile.components if c.role == "denoiser")
    assert denoiser_calls == 9  # 3 steps x (CFG, STG, modality isolation)
    for iteration in [result.first_call, *result.iterations]:
        assert len(iteration.stages.steps_s) == 3 and all(step > 0 for step in iteration.stages.steps_s)
        assert iteration.denoiser_calls == denoiser_calls
        assert iteration.stages.text_encoding_s > 0


def test_frames_off_8k_plus_1_are_what_the_pipeline_makes_and_its_audio_is_as_long_as_asked():
    """20 frames asked: LTX2Pipeline makes 3 latent frames, decoded to 17, with the audio of 20 frames at 24 fps; the
    profile is headed with the 17 made and counts every component as the real call runs it."""
    entry = resolve("tiny-ltx2").model_copy(deep=True)
    entry.defaults.num_frames = 20
    _, real, settings, _, output = counted_run(entry)
    offline = profile("tiny-ltx2", **settings)
    assert {c.name: c.macs for c in offline.components} == real
    assert offline.num_frames == output.frames.shape[1] == 17
    assert any("takes 20 frames as 3 latent frames, decoded to 17" in note for note in offline.notes)
    assert any(f"{audio_frames(entry, 20)} audio latent frames (20 frames asked" in note for note in offline.notes)
