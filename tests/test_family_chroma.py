"""Chroma (ChromaPipeline): what the generic tests do not reach, held to the real pipeline on the tiny
variant.

ChromaPipeline pads T5 to max_sequence_length and masks the padding (in T5 and in the transformer), so
the prompt's and the negative prompt's lengths change no count; real CFG encodes the negative prompt
and runs the transformer twice per step; max_sequence_length sets the text length and is capped at
512; a local folder is counted at the pipeline's own defaults."""

import diffusers
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

ENTRY = resolve("tiny-chroma")


def counted(pipe, entry=ENTRY, **arguments) -> dict[str, int]:
    components = {name: getattr(pipe, name) for name in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(output_type="np", generator=torch.Generator().manual_seed(0), **arguments)
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(ENTRY)


def test_prompt_and_negative_prompt_lengths_change_nothing(pipe):
    """Padding masks change no matmul shape: a one-word prompt, a long prompt and an explicit negative
    prompt all cost what diffmeter counts at the padded length."""
    offline = {c.name: c.macs for c in profile("tiny-chroma", steps=2, guidance_scale=3.0).components}
    call = dict(num_inference_steps=2, guidance_scale=3.0, height=32, width=32, max_sequence_length=32)
    assert counted(pipe, prompt="cat", **call) == offline
    long = " ".join([PROMPT] * 3)  # more than 32 tokens: truncated to the padded length
    assert counted(pipe, prompt=long, negative_prompt="blurry, low quality, deformed", **call) == offline


def test_cfg_switches_at_guidance_one(pipe):
    """do_classifier_free_guidance is guidance_scale > 1: at 1.0 one T5 pass and one transformer call per
    step; just above it, two of each."""
    call = dict(prompt=PROMPT, num_inference_steps=2, height=32, width=32, max_sequence_length=32)
    off = counted(pipe, guidance_scale=1.0, **call)
    on = counted(pipe, guidance_scale=1.5, **call)
    assert on["text_encoder"] == 2 * off["text_encoder"] and on["transformer"] == 2 * off["transformer"]
    for scale, real in ((1.0, off), (1.5, on)):
        result = profile("tiny-chroma", steps=2, guidance_scale=scale)
        assert {c.name: c.macs for c in result.components} == real
        assert result.cfg == (scale > 1)


@pytest.mark.parametrize("length", [7, 16])
def test_another_max_sequence_length_is_exact(pipe, length):
    call = dict(prompt=PROMPT, num_inference_steps=2, guidance_scale=3.0, height=32, width=32)
    real = counted(pipe, max_sequence_length=length, **call)
    offline = profile("tiny-chroma", steps=2, guidance_scale=3.0, max_sequence_length=length)
    assert {c.name: c.macs for c in offline.components} == real


def test_more_than_512_tokens_is_refused_like_the_pipeline(pipe):
    with pytest.raises(ValueError, match="cannot be greater than 512"):
        counted(pipe, prompt=PROMPT, num_inference_steps=1, max_sequence_length=513)
    with pytest.raises(DiffmeterError, match="refuses more than 512"):
        profile("chroma1-hd", max_sequence_length=513)
    assert profile("chroma1-hd", max_sequence_length=512).total_macs == profile("chroma1-hd").total_macs


def test_a_local_folder_is_counted_at_the_pipelines_own_defaults(tmp_path):
    """A saved ChromaPipeline folder: 1024-pixel default size scaled by the tiny VAE, 512 T5 tokens,
    guidance 5.0 (CFG), as ChromaPipeline.__call__ runs it with nothing but a prompt (steps aside)."""
    folder = tmp_path / "chroma"
    tiny_pipeline(ENTRY).save_pretrained(folder)
    local = resolve(str(folder))
    loaded = diffusers.ChromaPipeline.from_pretrained(folder)
    loaded.set_progress_bar_config(disable=True)
    real = counted(loaded, local, prompt=PROMPT, num_inference_steps=2)
    offline = profile(str(folder), steps=2)
    assert {c.name: c.macs for c in offline.components} == real
    assert offline.cfg and local.text_max_length["text_encoder"] == 512
    assert (offline.height, offline.width) == get_family("chroma").default_size(local)


@pytest.mark.parametrize("name", ["chroma1-hd", "chroma1-base"])
@pytest.mark.parametrize("size", [(1024, 1024), (768, 1360)])
def test_closed_form_matches_counted_denoiser_call(name, size):
    entry = resolve(name)
    result = profile(name, height=size[0], width=size[1], guidance_scale=1.0)
    counted_call = next(c for c in result.components if c.role == "denoiser").macs_per_call
    closed = FORMULAS["chroma"](
        entry.components["transformer"].config, (size[0] // 16) * (size[1] // 16), entry.text_max_length["text_encoder"]
    )
    assert abs(closed - counted_call) / counted_call < 0.01


def test_real_entries_run_cfg_as_two_transformer_calls_per_step():
    for name, steps in (("chroma1-hd", 40), ("chroma1-base", 35)):
        result = profile(name)
        by_name = {c.name: c for c in result.components}
        assert result.cfg and result.steps == steps
        assert by_name["transformer"].calls == 2 * steps and by_name["transformer"].batch_per_call == 1
        assert by_name["text_encoder"].calls == 2  # prompt + negative prompt
