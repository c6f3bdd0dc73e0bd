"""Qwen-Image 2.1: what the generic tests do not reach, each held to the real QwenImage21Pipeline run
under the counter: the template and its dropped system turn, prompts of different lengths in one
batch, true CFG only with a negative prompt (and one per prompt at batch 2), the prefix KV cache,
the uncapped prompt's upper bound, the default size, and the closed form."""

import inspect

import pytest
import torch
from tiny_runs import PROMPT

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = resolve("tiny-qwenimage21")
FAMILY = get_family("qwenimage21")
SIZE = dict(height=ENTRY.defaults.height, width=ENTRY.defaults.width)


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(ENTRY)


def real_macs(pipe, prompts, steps=3, **call):
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(prompt=prompts, num_inference_steps=steps, output_type="np", **SIZE, **call)
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}


def offline_macs(steps=3, **settings):
    return {c.name: c.macs for c in profile("tiny-qwenimage21", steps=steps, **SIZE, **settings).components}


def test_template_tokens_are_the_pipelines_template_and_its_dropped_system_turn(pipe):
    """prompt_settings reads the pipeline's own template through its processor: 22 tokens around the
    prompt, the first 14 of them (the system turn, the pipeline's _drop_idx) dropped after encoding."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    assert settings["template_tokens"] == ENTRY.extra["template_tokens"]["value"] == 22
    assert pipe._drop_idx == ENTRY.extra["template_drop_tokens"]["value"] == 14
    assert settings["prompt_tokens"] == len(pipe.processor.tokenizer(PROMPT).input_ids)
    assert FAMILY.prompt_settings(pipe, [""]) == FAMILY.prompt_settings(pipe, [" "])  # "" is encoded as " "


def test_a_batch_of_different_prompts_is_padded_to_its_longest(pipe):
    prompts = ["a cat", "a photo of a red cat riding a blue horse in the city at night"]
    settings = FAMILY.prompt_settings(pipe, prompts)
    real = real_macs(pipe, prompts)
    assert offline_macs(batch_size=2, guidance_scale=1.0, **settings) == real
    shorter = offline_macs(batch_size=2, guidance_scale=1.0, **FAMILY.prompt_settings(pipe, prompts[:1]))
    assert shorter["text_encoder"] < real["text_encoder"] and shorter["transformer"] < real["transformer"]


def test_true_cfg_runs_only_with_a_negative_prompt(pipe):
    """true_cfg_scale 4 alone runs no CFG; with a negative prompt the uncond branch is encoded and
    denoised on its own (its own KV cache), at that prompt's length."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    without = real_macs(pipe, [PROMPT], true_cfg_scale=4.0)
    assert offline_macs(guidance_scale=1.0, **settings) == without
    assert FAMILY.called_guidance(ENTRY, {"true_cfg_scale": 4.0}) == 1.0
    guided = real_macs(pipe, [PROMPT], **FAMILY.guidance_arguments(ENTRY, 4.0))
    assert offline_macs(guidance_scale=4.0, **settings) == guided
    negative = PROMPT + " in the forest at sunset"
    negative_tokens = FAMILY.prompt_settings(pipe, [negative])["prompt_tokens"]
    with_negative = real_macs(pipe, [PROMPT], true_cfg_scale=4.0, negative_prompt=negative)
    assert offline_macs(guidance_scale=4.0, negative_prompt_tokens=negative_tokens, **settings) == with_negative
    assert with_negative["transformer"] > guided["transformer"] > without["transformer"]


def test_cfg_at_batch_two_takes_one_negative_prompt_per_prompt(pipe):
    """A single negative-prompt string is encoded at batch 1, which the transformer cannot join with a
    batch of 2; one negative prompt per prompt runs, and is what diffmeter counts."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    negative = ENTRY.extra["negative_prompt"]["value"]
    with pytest.raises(RuntimeError):
        real_macs(pipe, [PROMPT] * 2, steps=1, true_cfg_scale=4.0, negative_prompt=negative)
    real = real_macs(pipe, [PROMPT] * 2, true_cfg_scale=4.0, negative_prompt=[negative] * 2)
    counted = profile("tiny-qwenimage21", steps=3, batch_size=2, guidance_scale=4.0, **SIZE, **settings)
    assert {c.name: c.macs for c in counted.components} == real
    assert any("one negative prompt per prompt" in note for note in counted.notes)


def test_the_prefix_kv_cache_runs_the_text_through_the_blocks_once(pipe):
    """With the default use_kv_cache the first step is the whole joint sequence and every later step the
    image tokens alone: one step costs the prefill, each further step less; without the cache every
    step would cost the prefill."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    one, three = (real_macs(pipe, [PROMPT], steps=steps) for steps in (1, 3))
    assert offline_macs(steps=1, guidance_scale=1.0, **settings) == one
    assert offline_macs(steps=3, guidance_scale=1.0, **settings) == three
    uncached = real_macs(pipe, [PROMPT], steps=3, use_kv_cache=False)
    assert uncached["transformer"] == 3 * one["transformer"] > three["transformer"]
    (transformer,) = [c for c in profile("tiny-qwenimage21", **settings).components if c.role == "denoiser"]
    prefill, cached = transformer.invocations
    assert (prefill.count, cached.count) == (
        1,
        ENTRY.defaults.steps - 1,
    ) and cached.macs_per_call < prefill.macs_per_call


def test_the_upper_bound_is_the_longest_prompt_the_rope_table_places(pipe):
    """No truncation and no max_sequence_length: without --prompt-tokens diffmeter counts the longest
    text the transformer's RoPE table places (its positive positions, the image's frame last), and a
    prompt that long costs exactly that in the real pipeline."""
    limit = ENTRY.extra["text_token_limit"]["value"]
    negative_positions = 1024  # QwenImage21Rope: torch.arange(1024) negative indices after the positive ones
    assert len(pipe.transformer.pos_embed.freqs[0]) - negative_positions == limit + 1
    template, dropped = ENTRY.extra["template_tokens"]["value"], ENTRY.extra["template_drop_tokens"]["value"]
    long_prompt = " ".join(["cat"] * (limit - template + dropped))
    assert FAMILY.prompt_settings(pipe, [long_prompt])["prompt_tokens"] + template - dropped == limit
    counted = profile("tiny-qwenimage21", steps=2, guidance_scale=1.0, **SIZE)
    assert {c.name: c.macs for c in counted.components} == real_macs(pipe, [long_prompt], steps=2)
    assert any("upper bound" in note for note in counted.notes)


def test_default_size_is_the_pipelines(pipe):
    resolution = inspect.signature(type(pipe).__call__).parameters["output_resolution"].default
    assert FAMILY.default_size(ENTRY) == (resolution, resolution)
    assert FAMILY.vae_scale(ENTRY) == pipe.vae_scale_factor and FAMILY.size_multiple(ENTRY) == 2 * pipe.vae_scale_factor


@pytest.mark.parametrize("size", [1024, 2048])
def test_closed_form_matches_the_counted_transformer_calls(size):
    """Both calls of the real entry's transformer: the prefill (step 1) and a cached step."""
    entry = resolve("qwen-image-2.1")
    counted = profile("qwen-image-2.1", height=size, width=size, guidance_scale=1.0, prompt_tokens=20)
    (transformer,) = [c for c in counted.components if c.role == "denoiser"]
    prefill, cached = transformer.invocations
    text = 20 + entry.extra["template_tokens"]["value"] - entry.extra["template_drop_tokens"]["value"]
    config = entry.components["transformer"].config
    for call, is_cached in ((prefill, False), (cached, True)):
        closed = FORMULAS["qwenimage21"](config, (size // 16) ** 2, text, cached=is_cached)
        assert abs(closed - call.macs_per_call) / call.macs_per_call < 0.01


def _local_folder(pipe, folder, sample_sigmas=None):
    """A pipeline folder as from_pretrained reads it (the processor is runtime-only for diffmeter)."""
    import json

    for name in ("transformer", "text_encoder", "vae", "scheduler"):
        getattr(pipe, name).save_pretrained(folder / name)
    index = {
        "_class_name": "QwenImage21Pipeline",
        "processor": ["transformers", "Qwen3VLProcessor"],
        "sample_sigmas": sample_sigmas,
        **{
            name: list(type(getattr(pipe, name)).__module__.split(".")[:1]) + [type(getattr(pipe, name)).__name__]
            for name in ("scheduler", "text_encoder", "transformer", "vae")
        },
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    return str(folder)


@pytest.mark.slow
def test_a_local_folder_counts_a_bare_call_and_its_sample_sigmas(pipe, tmp_path):
    """A folder is counted as a bare call runs it (1024x1024, no guidance); a folder configured with
    sample_sigmas runs one step per sigma whatever num_inference_steps says."""
    settings = FAMILY.prompt_settings(pipe, [PROMPT])
    folder = _local_folder(pipe, tmp_path / "plain")
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(PROMPT, num_inference_steps=2, output_type="np")
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    counted = profile(folder, steps=2, **settings)
    assert (counted.height, counted.width, counted.cfg) == (1024, 1024, False)
    assert {c.name: c.macs for c in counted.components} == real

    sigmas = [1.0, 0.75, 0.5, 0.25]
    folder = _local_folder(pipe, tmp_path / "sigmas", sample_sigmas=sigmas)
    pipe.register_to_config(sample_sigmas=sigmas)
    try:
        real = real_macs(pipe, [PROMPT], steps=2)
    finally:
        pipe.register_to_config(sample_sigmas=None)
    counted = profile(folder, steps=2, guidance_scale=1.0, **SIZE, **settings)
    assert counted.steps == len(sigmas) and {c.name: c.macs for c in counted.components} == real
    assert real["transformer"] > real_macs(pipe, [PROMPT], steps=2)["transformer"]


def test_without_causal_condition_every_step_runs_the_whole_sequence(tmp_path):
    """The cache needs causal_condition: a transformer without it gets no KV cache from the pipeline,
    and every step is the full text + image prefill."""
    from diffmeter.catalog import ComponentEntry
    from diffmeter.pipelines import build_component
    from diffmeter.tiny import assemble

    torch.manual_seed(0)
    parts = {name: build_component(component, "cpu") for name, component in ENTRY.components.items()}
    config = {**ENTRY.components["transformer"].config, "causal_condition": False}
    parts["transformer"] = build_component(
        ComponentEntry(class_name="QwenImage21Transformer2DModel", config=config), "cpu"
    )
    uncausal = assemble(ENTRY.pipeline_class, parts, ENTRY.extra["runtime"])
    settings = FAMILY.prompt_settings(uncausal, [PROMPT])
    real = real_macs(uncausal, [PROMPT], steps=3)
    counted = profile(_local_folder(uncausal, tmp_path / "uncausal"), steps=3, guidance_scale=1.0, **SIZE, **settings)
    assert {c.name: c.macs for c in counted.components} == real
    (transformer,) = [c for c in counted.components if c.role == "denoiser"]
    assert [call.count for call in transformer.invocations] == [3]
