"""CogView4: prompt lengths that depend on the prompt, held to the real pipeline.

CogView4Pipeline pads the GLM token ids on the left to a multiple of 16 (after truncating at
max_sequence_length) and encodes the negative prompt separately, at its own length; the transformer's
cond and uncond calls each see their own length. Each test runs the real tiny pipeline under the
counter, reads the lengths it really used, and compares with the offline profile."""

import math

import pytest
import torch
from tiny_runs import TINY

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = next(e for e in TINY if e.name == "tiny-cogview4")
FAMILY = get_family("cogview4")
#: one token per word in the tiny vocabulary, plus [gMASK]<sop>: 14 + 2 = 16 tokens (one group of 16);
#: 15 + 2 = 17 tokens (two groups)
SHORT = "a red cat riding a blue horse in the city with a robot dog"
LONG = "a red cat riding a blue horse in the green city with a robot dog"


def run(prompts, negative_prompt=None, guidance_scale=5.0, max_sequence_length=None):
    """The real pipeline's per-component MACs and the text lengths the encoder and transformer got."""
    pipe = tiny_pipeline(ENTRY)
    seen = {"text_encoder": [], "transformer": []}
    pipe.text_encoder.register_forward_pre_hook(
        lambda module, args, kwargs: seen["text_encoder"].append((args[0] if args else kwargs["input_ids"]).shape),
        with_kwargs=True,
    )
    pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen["transformer"].append(kwargs["encoder_hidden_states"].shape[1]),
        with_kwargs=True,
    )
    kwargs = {} if max_sequence_length is None else {"max_sequence_length": max_sequence_length}
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            prompts,
            negative_prompt=negative_prompt,
            height=ENTRY.defaults.height,
            width=ENTRY.defaults.width,
            num_inference_steps=ENTRY.defaults.steps,
            guidance_scale=guidance_scale,
            output_type="np",
            **kwargs,
        )
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    return pipe, macs, seen


def offline(pipe, prompts, negative_prompt=None, **settings):
    measured = FAMILY.prompt_settings(pipe, prompts)
    if negative_prompt is not None:
        measured["negative_prompt_tokens"] = len(pipe.tokenizer(negative_prompt).input_ids)
    result = profile("tiny-cogview4", batch_size=len(prompts), **measured, **settings)
    return {c.name: c.macs for c in result.components}, measured


@pytest.mark.parametrize("prompt,padded", [(SHORT, 16), (LONG, 32)], ids=["16-tokens", "17-tokens"])
def test_prompt_is_left_padded_to_a_multiple_of_16(prompt, padded):
    pipe, real, seen = run([prompt], guidance_scale=1.0)
    tokens = len(pipe.tokenizer(prompt).input_ids)
    assert math.ceil(tokens / 16) * 16 == padded  # the prompts straddle a multiple of 16
    assert [shape[1] for shape in seen["text_encoder"]] == [padded]
    assert set(seen["transformer"]) == {padded}
    counted, _ = offline(pipe, [prompt], guidance_scale=1.0)
    assert counted == real


def test_batch_pads_to_the_longest_prompt():
    prompts = ["a cat", LONG]
    pipe, real, seen = run(prompts)
    assert seen["text_encoder"][0] == (2, 32)
    counted, measured = offline(pipe, prompts, guidance_scale=5.0)
    assert measured["prompt_tokens"] == len(pipe.tokenizer(LONG).input_ids)
    assert counted == real


def test_negative_prompt_has_its_own_length():
    negative = "a blue dog in the forest with a red robot and a green flower on the mountain river"
    pipe, real, seen = run([SHORT], negative_prompt=negative)
    negative_tokens = len(pipe.tokenizer(negative).input_ids)
    assert negative_tokens > 16  # longer than the prompt's 16-token group
    assert [shape[1] for shape in seen["text_encoder"]] == [16, math.ceil(negative_tokens / 16) * 16]
    assert sorted(set(seen["transformer"])) == [16, math.ceil(negative_tokens / 16) * 16]
    counted, _ = offline(pipe, [SHORT], negative_prompt=negative, guidance_scale=5.0)
    assert counted == real


def test_default_empty_negative_prompt_is_two_tokens_padded_to_16():
    pipe, real, seen = run([LONG])
    assert len(pipe.tokenizer("").input_ids) == ENTRY.extra["empty_negative_prompt_tokens"]["value"] == 2
    assert [shape[1] for shape in seen["text_encoder"]] == [32, 16]
    # without measured prompts the catalog's empty-negative count is used for the uncond branch
    without = profile("tiny-cogview4", prompt_tokens=len(pipe.tokenizer(LONG).input_ids))
    assert {c.name: c.macs for c in without.components} == real
    assert any("negative prompt is the default empty one" in note for note in without.notes)


def test_max_sequence_length_truncates_then_pads():
    pipe, real, seen = run([LONG], guidance_scale=1.0, max_sequence_length=10)
    assert [shape[1] for shape in seen["text_encoder"]] == [16]  # truncated to 10, padded to 16
    counted, _ = offline(pipe, [LONG], guidance_scale=1.0, max_sequence_length=10)
    assert counted == real


def test_unknown_prompt_counts_the_upper_bound_and_says_so():
    result = profile("cogview4")
    assert any("upper bound" in note for note in result.notes)
    assert result.cfg
    short = profile("cogview4", prompt_tokens=30)
    macs = {c.name: c.macs for c in result.components}
    assert {c.name: c.macs for c in short.components}["text_encoder"] < macs["text_encoder"]


@pytest.mark.parametrize("size,prompt_tokens", [(1024, 100), (768, 300), (512, 1024)])
def test_closed_form_matches_counted_denoiser_call(size, prompt_tokens):
    entry = resolve("cogview4")
    result = profile("cogview4", height=size, width=size, guidance_scale=1.0, prompt_tokens=prompt_tokens)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    text = math.ceil(prompt_tokens / 16) * 16
    closed = FORMULAS["cogview4"](entry.components["transformer"].config, (size // 16) ** 2, text)
    assert abs(closed - counted) / counted < 0.01
