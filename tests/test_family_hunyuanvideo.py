"""HunyuanVideo (the 13B model): what the generic exactness tests do not reach, each held to the real
HunyuanVideoPipeline run under the counter: true CFG only with a negative prompt, and the Llama prompt read at
``max_sequence_length`` plus the template's cropped tokens."""

import pytest
import torch
from tiny_runs import PROMPT

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families.hunyuanvideo import CROP_START
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = resolve("tiny-hunyuanvideo")
SIZE = dict(height=ENTRY.defaults.height, width=ENTRY.defaults.width, num_frames=ENTRY.defaults.num_frames)


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(ENTRY)


def real_macs(pipe, **call):
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(prompt=[PROMPT], num_inference_steps=2, output_type="np", **SIZE, **call)
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}


def offline_macs(**settings):
    return {c.name: c.macs for c in profile("tiny-hunyuanvideo", steps=2, **SIZE, **settings).components}


def test_true_cfg_runs_a_second_transformer_call_only_with_a_negative_prompt(pipe):
    plain = real_macs(pipe, true_cfg_scale=2.0)  # no negative prompt: no true CFG (do_true_cfg)
    assert offline_macs() == plain
    guided = real_macs(pipe, true_cfg_scale=2.0, negative_prompt=[""])
    assert offline_macs(true_cfg_scale=2.0) == guided
    assert guided["transformer"] == 2 * plain["transformer"] and guided["text_encoder"] == 2 * plain["text_encoder"]


def test_the_llama_prompt_is_read_with_the_templates_cropped_tokens(pipe):
    """max_sequence_length sets the transformer's text length; Llama reads CROP_START more tokens before the crop."""
    real = real_macs(pipe, max_sequence_length=40)
    offline = profile("tiny-hunyuanvideo", steps=2, max_sequence_length=40, **SIZE)
    assert {c.name: c.macs for c in offline.components} == real
    (llama,) = [c for c in offline.components if c.name == "text_encoder"]
    assert llama.invocations[0].note.startswith(f"{40 + CROP_START} tokens ({CROP_START} template + 40 prompt")


def test_a_frame_count_not_4k_plus_1_is_the_frames_the_pipeline_makes_in_profile_and_bench(pipe):
    """HunyuanVideoPipeline floors any count to its VAE's 4k+1 without a word: asked for 10 frames, it makes 9.
    The profile counts and titles 9 and says why; bench settles on 9, so its frames/s is of the frames made (it
    rated 10)."""
    from diffmeter.runs.spec import BenchSpec

    asked = ENTRY.defaults.num_frames + 1
    with torch.no_grad():
        made = pipe(prompt=[PROMPT], num_inference_steps=2, output_type="np", **{**SIZE, "num_frames": asked}).frames
    result = profile("tiny-hunyuanvideo", steps=2, **{**SIZE, "num_frames": asked})
    assert made.shape[1] == result.num_frames == ENTRY.defaults.num_frames
    assert any(f"takes {asked} frames as" in note and f"rated as {made.shape[1]}" in note for note in result.notes)
    assert {c.name: c.macs for c in result.components} == offline_macs()  # the same work as asking for those
    settled = BenchSpec(model="tiny-hunyuanvideo", num_frames=asked, device="cpu").settle(ENTRY)
    assert settled.num_frames == made.shape[1]
