"""Qwen-Image: what the generic tests do not reach, each held to the real QwenImagePipeline run
under the counter: prompts of different lengths in one batch, the template and its dropped
prefix, true CFG only with a negative prompt, max_sequence_length and the tokenizer's truncation."""

import pytest
import torch
from tiny_runs import PROMPT

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = resolve("tiny-qwenimage")
FAMILY = get_family("qwenimage")
SIZE = dict(height=ENTRY.defaults.height, width=ENTRY.defaults.width)


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(ENTRY)


def real_macs(pipe, prompts, steps=2, **call):
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(prompt=prompts, num_inference_steps=steps, output_type="np", **SIZE, **call)
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}


def offline_macs(**settings):
    return {c.name: c.macs for c in profile("tiny-qwenimage", steps=2, **SIZE, **settings).components}


def test_template_tokens_are_the_pipelines_template_and_its_dropped_prefix(pipe):
    """prompt_settings reads the pipeline's own template: 34 dropped tokens before the prompt (the
    pipeline's prompt_template_encode_start_idx), 5 after it, and the prompt's own tokens."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    prefix = pipe.prompt_template_encode.split("{}")[0]
    assert len(pipe.tokenizer(prefix).input_ids) == pipe.prompt_template_encode_start_idx == 34
    assert settings["template_tokens"] == ENTRY.extra["template_tokens"]["value"] == 39
    assert settings["prompt_tokens"] == len(pipe.tokenizer(PROMPT).input_ids)


def test_a_batch_of_different_prompts_is_padded_to_its_longest(pipe):
    """Unequal prompts: the encoder runs at the longest, the transformer gets a padding mask and the
    longest prompt's length; with CFG the negative prompt is encoded and denoised on its own."""
    prompts = ["a cat", "a photo of a red cat riding a blue horse in the city at night"]
    settings = FAMILY.prompt_settings(pipe, prompts)
    for guidance in (4.0, 1.0):
        real = real_macs(pipe, prompts, **FAMILY.guidance_arguments(ENTRY, guidance))
        assert offline_macs(batch_size=2, guidance_scale=guidance, **settings) == real
    shorter = offline_macs(batch_size=2, guidance_scale=1.0, **FAMILY.prompt_settings(pipe, prompts[:1]))
    assert shorter["text_encoder"] < real["text_encoder"] and shorter["transformer"] < real["transformer"]


def test_true_cfg_runs_only_with_a_negative_prompt(pipe):
    """true_cfg_scale 4 alone (the __call__ default) runs no CFG: diffmeter's guidance 1.0; with a
    negative prompt it runs the uncond branch as separate calls, counted at that prompt's length."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    without = real_macs(pipe, [PROMPT], true_cfg_scale=4.0)
    assert offline_macs(guidance_scale=1.0, **settings) == without
    assert not profile("tiny-qwenimage", guidance_scale=1.0).cfg
    negative = PROMPT + " in the forest at sunset"
    negative_tokens = FAMILY.prompt_settings(pipe, [negative])["prompt_tokens"]
    with_negative = real_macs(pipe, [PROMPT], true_cfg_scale=4.0, negative_prompt=negative)
    counted = offline_macs(guidance_scale=4.0, negative_prompt_tokens=negative_tokens, **settings)
    assert counted == with_negative
    assert with_negative["transformer"] > 2 * without["transformer"]  # the longer negative costs more
    assert profile("tiny-qwenimage").cfg


def test_max_sequence_length_caps_the_transformers_text_tokens(pipe):
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    real = real_macs(pipe, [PROMPT, PROMPT], max_sequence_length=4, **FAMILY.guidance_arguments(ENTRY, 4.0))
    assert offline_macs(batch_size=2, max_sequence_length=4, **settings) == real
    with pytest.raises(DiffmeterError, match="at most 1024"):
        profile("tiny-qwenimage", max_sequence_length=1025)


def test_the_upper_bound_is_a_prompt_the_tokenizer_truncates(pipe):
    """Without --prompt-tokens the count is the longest the pipeline keeps: 1024 + 34 encoder tokens,
    512 of them for the transformer; a prompt longer than that costs exactly this."""
    long_prompt = " ".join(["cat"] * 1200)
    real = real_macs(pipe, [long_prompt], steps=1, true_cfg_scale=1.0)
    counted = profile("tiny-qwenimage", steps=1, guidance_scale=1.0, **SIZE)
    assert {c.name: c.macs for c in counted.components} == real
    assert any("upper bound" in note for note in counted.notes)


def test_default_size_is_the_pipelines(pipe):
    assert FAMILY.default_size(ENTRY) == (pipe.default_sample_size * pipe.vae_scale_factor,) * 2


@pytest.mark.parametrize("size", [512, 1328])
def test_closed_form_matches_the_counted_transformer_call(size):
    entry = resolve("qwen-image")
    counted = profile("qwen-image", height=size, width=size, guidance_scale=1.0, prompt_tokens=20)
    (call,) = [c for c in counted.components if c.role == "denoiser"]
    text = 20 + 39 - 34
    closed = FORMULAS["qwenimage"](entry.components["transformer"].config, (size // 16) ** 2, text)
    assert abs(closed - call.macs_per_call) / call.macs_per_call < 0.01
