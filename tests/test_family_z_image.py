"""Z-Image: what the generic tests do not reach, held to the real ZImagePipeline on the tiny variant.

The Qwen3 encoder always runs on the padded 512 tokens, but the transformer gets each prompt's real
chat-templated tokens (padded to 32 inside the model), and a CFG batch is padded to its longest
sample: the caption lengths, the template, the hidden layer read, truncation and the negative
prompt all change the count."""

import pytest
import torch

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.families.z_image import chat_prompt
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = resolve("tiny-z-image")
FAMILY = get_family("z_image")
#: 26 words: with the 8-token template, more than 32 tokens, so cond (64) and uncond (32) pad differently
LONG = (
    "a photo of a red robot riding a blue horse in the forest at night with a green castle on the mountain "
    "and a river of flower in the city"
)


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(ENTRY)


def run(pipe, prompt, **kwargs):
    """The real pipeline at the tiny defaults under the counter: per-component MACs and the caption
    lengths the transformer received on each call."""
    captions = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda module, args: captions.append([len(c) for c in args[2]]), with_kwargs=False
    )
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    arguments = dict(height=ENTRY.defaults.height, width=ENTRY.defaults.width, num_inference_steps=2, output_type="np")
    arguments.update(kwargs)
    try:
        with torch.no_grad(), count_flops(components) as counts:
            pipe(prompt, generator=torch.Generator().manual_seed(0), **arguments)
    finally:
        hook.remove()
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    return macs, captions


def offline(**settings):
    return {c.name: c.macs for c in profile("tiny-z-image", steps=2, **settings).components}


def test_prompt_settings_count_the_chat_template_with_the_pipelines_tokenizer(pipe):
    settings = FAMILY.prompt_settings(pipe, ["a cat", LONG])
    templated = len(pipe.tokenizer(chat_prompt(pipe.tokenizer, LONG)).input_ids)
    assert settings["prompt_tokens"] + settings["template_tokens"] == templated
    assert settings["prompt_tokens"] == len(pipe.tokenizer(LONG).input_ids)  # no merge across the template
    # the catalog's template count is what the tokenizer says for the default empty negative prompt
    assert settings["template_tokens"] == len(pipe.tokenizer(chat_prompt(pipe.tokenizer, "")).input_ids)
    assert settings["template_tokens"] == ENTRY.extra["template_tokens"]["value"]
    assert resolve("z-image-turbo").extra["template_tokens"]["value"] == settings["template_tokens"]
    # enable_thinking=True: no think block is added (Qwen3 adds one only when thinking is off)
    assert "<think>" not in chat_prompt(pipe.tokenizer, LONG)


@pytest.mark.parametrize("batch", [1, 2])
def test_cond_and_uncond_captions_of_different_lengths_in_one_cfg_call(pipe, batch):
    """The transformer gets [cond..., uncond...] real lengths; the batch pads to the longest (a mask)."""
    macs, captions = run(pipe, [LONG] * batch, guidance_scale=4.0)
    settings = FAMILY.prompt_settings(pipe, [LONG])
    cond = settings["prompt_tokens"] + settings["template_tokens"]
    assert captions == [[cond] * batch + [settings["template_tokens"]] * batch] * 2
    assert -(-cond // 32) > -(-settings["template_tokens"] // 32)  # they pad to different multiples of 32
    assert offline(batch_size=batch, guidance_scale=5.0, **settings) == macs
    assert FAMILY.guidance_arguments(ENTRY, 5.0) == {"guidance_scale": 4.0}


def test_without_cfg_only_the_prompt_is_encoded_and_one_caption_per_image(pipe):
    macs, captions = run(pipe, [LONG, LONG], guidance_scale=0.0)
    settings = FAMILY.prompt_settings(pipe, [LONG])
    assert captions == [[settings["prompt_tokens"] + settings["template_tokens"]] * 2] * 2
    result = profile("tiny-z-image", steps=2, batch_size=2, guidance_scale=1.0, **settings)
    assert not result.cfg and {c.name: c.macs for c in result.components} == macs
    assert FAMILY.guidance_arguments(ENTRY, 1.0) == {"guidance_scale": 0.0}


def test_a_small_pipeline_scale_still_guides(pipe):
    """ZImagePipeline guides whenever its w > 0: diffmeter's 1.5 is w = 0.5, CFG on."""
    macs, captions = run(pipe, "a cat", **FAMILY.guidance_arguments(ENTRY, 1.5))
    assert len(captions[0]) == 2
    settings = FAMILY.prompt_settings(pipe, ["a cat"])
    result = profile("tiny-z-image", steps=2, guidance_scale=1.5, **settings)
    assert result.cfg and {c.name: c.macs for c in result.components} == macs


def test_the_transformer_reads_the_second_to_last_hidden_state_of_the_real_tokens(pipe):
    captured = []
    hook = pipe.transformer.register_forward_pre_hook(lambda module, args: captured.append(args[2][0].clone()))
    try:
        run(pipe, LONG, guidance_scale=0.0)
    finally:
        hook.remove()
    inputs = pipe.tokenizer(
        [chat_prompt(pipe.tokenizer, LONG)], padding="max_length", max_length=512, truncation=True, return_tensors="pt"
    )
    mask = inputs.attention_mask.bool()
    with torch.no_grad():
        states = pipe.text_encoder(
            input_ids=inputs.input_ids, attention_mask=mask, output_hidden_states=True
        ).hidden_states
    assert len(states) == pipe.text_encoder.config.num_hidden_layers + 1
    torch.testing.assert_close(captured[0], states[-2][0][mask[0]])
    assert not torch.allclose(captured[0], states[-1][0][mask[0]])
    # reading hidden_states[-2] still runs every layer: the encoder costs all of them, at 512 tokens
    macs, _ = run(pipe, LONG, guidance_scale=0.0)
    assert offline(guidance_scale=1.0, **FAMILY.prompt_settings(pipe, [LONG]))["text_encoder"] == macs["text_encoder"]


@pytest.mark.parametrize("length", [12, 40])
def test_max_sequence_length_pads_the_encoder_and_truncates_the_caption(pipe, length):
    macs, captions = run(pipe, LONG, guidance_scale=4.0, max_sequence_length=length)
    settings = FAMILY.prompt_settings(pipe, [LONG])
    assert captions[0][0] == min(length, settings["prompt_tokens"] + settings["template_tokens"])
    assert offline(guidance_scale=5.0, max_sequence_length=length, **settings) == macs


def test_a_negative_prompt_is_counted_at_its_own_length(pipe):
    negative = (
        "a blue dog painting in the ocean at sunset with a robot and a castle and a horse in the red city "
        "at night with a green river"
    )
    macs, captions = run(pipe, "a cat", guidance_scale=4.0, negative_prompt=negative)
    settings = FAMILY.prompt_settings(pipe, ["a cat"])
    negative_tokens = FAMILY.prompt_settings(pipe, [negative])["prompt_tokens"]
    assert captions[0][1] == negative_tokens + settings["template_tokens"] > 32
    assert offline(guidance_scale=5.0, negative_prompt_tokens=negative_tokens, **settings) == macs
    assert offline(guidance_scale=5.0, **settings) != macs  # the default empty negative prompt costs less


@pytest.mark.parametrize(("height", "width"), [(80, 48), (48, 112)])
def test_image_tokens_pad_to_32_at_any_size(pipe, height, width):
    """15 or 21 image tokens: the model pads them to 32 with its learned pad token."""
    macs, _ = run(pipe, ["a cat", "a cat"], guidance_scale=4.0, height=height, width=width)
    settings = FAMILY.prompt_settings(pipe, ["a cat"])
    assert offline(height=height, width=width, batch_size=2, guidance_scale=5.0, **settings) == macs


def test_sizes_and_defaults_follow_the_pipeline():
    entry = resolve("z-image-turbo")
    assert FAMILY.default_size(entry) == (1024, 1024)
    assert FAMILY.size_multiple(entry) == 16
    result = profile("z-image-turbo")
    assert (result.height, result.width, result.steps, result.cfg) == (1024, 1024, 8, False)
    assert any("an upper bound" in note for note in result.notes)  # no prompt given: 512 caption tokens


@pytest.mark.parametrize(("size", "prompt_tokens"), [((1024, 1024), 100), ((768, 1344), 30)])
def test_closed_form_matches_the_counted_turbo_transformer(size, prompt_tokens):
    entry = resolve("z-image-turbo")
    result = profile("z-image-turbo", height=size[0], width=size[1], prompt_tokens=prompt_tokens)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    template = entry.extra["template_tokens"]["value"]
    closed = FORMULAS["z_image"](
        entry.components["transformer"].config, (size[0] // 16) * (size[1] // 16), prompt_tokens + template
    )
    assert abs(closed - counted) / counted < 0.01


def test_a_local_folder_is_counted_as_its_pipeline_runs_it_with_its_own_defaults(tmp_path):
    """1024x1024 and CFG (its __call__ guidance_scale 5.0) when called with a prompt alone."""
    import diffusers

    folder = tmp_path / "z-image"
    tiny_pipeline(ENTRY).save_pretrained(folder)
    local = resolve(str(folder))
    assert local.family == "z_image" and (local.defaults.height, local.defaults.width) == (1024, 1024)
    pipe = diffusers.ZImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    components = {name: getattr(pipe, name) for name in local.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe("a photo of a cat riding a horse", num_inference_steps=2, output_type="np")
    counted = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in local.components}
    result = profile(str(folder), steps=2, **FAMILY.prompt_settings(pipe, ["a photo of a cat riding a horse"]))
    assert result.cfg and {c.name: c.macs for c in result.components} == counted
