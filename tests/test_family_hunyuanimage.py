"""HunyuanImage 2.1: what the generic tests do not reach. The ByT5 glyph encoder runs only for prompts that
quote text (and the pipeline then switches to its ocr_guider); the guidance scale is the guider's, set on
the pipeline, and any scale but 1 runs the uncond branch; the closed form of the real transformer."""

import pytest
import torch
from tiny_runs import TINY

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

FAMILY = get_family("hunyuanimage")
BASE = next(e for e in TINY if e.name == "tiny-hunyuanimage")
DISTILLED = next(e for e in TINY if e.name == "tiny-hunyuanimage-distilled")


def real_run(entry, prompts: list[str], guidance_scale: float):
    """Per-component MACs of the real pipeline, and the pipeline, at the tiny entry's defaults."""
    pipe = tiny_pipeline(entry)
    FAMILY.set_guidance(pipe, guidance_scale)
    components = {name: getattr(pipe, name) for name in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            prompt=prompts,
            height=entry.defaults.height,
            width=entry.defaults.width,
            num_inference_steps=entry.defaults.steps,
            output_type="np",
            generator=torch.Generator().manual_seed(0),
            **FAMILY.guidance_arguments(entry, guidance_scale),
        )
    return pipe, {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}


def offline(entry, pipe, prompts: list[str], guidance_scale: float, **settings):
    settings = {**FAMILY.prompt_settings(pipe, prompts), **settings}
    return profile(entry.name, batch_size=len(prompts), guidance_scale=guidance_scale, **settings)


def macs(result) -> dict[str, int]:
    return {c.name: c.macs for c in result.components}


@pytest.mark.parametrize("entry", [BASE, DISTILLED], ids=lambda e: e.name)
def test_quoted_text_runs_byt5_once_per_prompt_exactly(entry):
    prompts = ["a red sign that says 'open' in a city", 'a cat holding a card reading "hello"']
    pipe, real = real_run(entry, prompts, entry.defaults.guidance_scale)
    assert real["text_encoder_2"] > 0
    counted = offline(entry, pipe, prompts, entry.defaults.guidance_scale)
    assert macs(counted) == real
    (byt5,) = [c for c in counted.components if c.name == "text_encoder_2"]
    assert (byt5.calls, byt5.batch_per_call) == (2, 1)  # one batch-1 call per prompt, not one of batch 2


def test_a_prompt_with_quotes_switches_to_the_ocr_guider_which_runs_the_same_forwards():
    pipe, real = real_run(BASE, ["a poster with the word 'tiny'"], 3.5)
    assert pipe.ocr_guider is not None and pipe.ocr_guider.guidance_scale == 3.5
    counted = offline(BASE, pipe, ["a poster with the word 'tiny'"], 3.5)
    assert macs(counted) == real and counted.cfg


def test_without_a_prompt_count_byt5_is_counted_for_every_prompt_as_an_upper_bound():
    counted = profile("tiny-hunyuanimage", batch_size=2)
    (byt5,) = [c for c in counted.components if c.name == "text_encoder_2"]
    assert byt5.calls == 2 and any("upper bound" in note for note in counted.notes)
    assert next(c for c in profile("tiny-hunyuanimage", glyph_text=False).components if c.name == byt5.name).calls == 0
    # a batch mixing quoted and plain prompts: ByT5 runs for the quoted one only, the count stays an upper bound
    prompts = ["a sign saying 'hi'", "a photo of a dog"]
    pipe, real = real_run(BASE, prompts, 3.5)
    counted = macs(offline(BASE, pipe, prompts, 3.5))
    assert counted["text_encoder_2"] == 2 * real["text_encoder_2"] > 0
    assert {k: v for k, v in counted.items() if k != "text_encoder_2"} == {
        k: v for k, v in real.items() if k != "text_encoder_2"
    }


@pytest.mark.parametrize("guidance", [0.5, 1.0, 5.0])
def test_the_guider_runs_the_uncond_branch_for_every_scale_but_one(guidance):
    """AdaptiveProjectedMixGuidance._is_cfg_enabled: the scale is compared with 1, not required above it."""
    pipe, real = real_run(BASE, ["a photo of a cat"], guidance)
    assert pipe.guider.guidance_scale == guidance
    counted = offline(BASE, pipe, ["a photo of a cat"], guidance)
    assert macs(counted) == real
    assert counted.cfg == (guidance != 1.0)


def test_the_distilled_model_takes_its_scale_as_a_call_argument_and_never_runs_uncond():
    assert FAMILY.guidance_arguments(DISTILLED, 3.25) == {"distilled_guidance_scale": 3.25}
    assert FAMILY.guidance_arguments(BASE, 3.5) == {}
    assert FAMILY.called_guidance(resolve("hunyuanimage-2.1"), {"distilled_guidance_scale": 3.25}) == 3.5
    assert FAMILY.called_guidance(resolve("hunyuanimage-2.1-distilled"), {"distilled_guidance_scale": 3.25}) == 3.25
    pipe, real = real_run(DISTILLED, ["a photo of a cat"], 6.0)
    counted = offline(DISTILLED, pipe, ["a photo of a cat"], 6.0)
    assert macs(counted) == real and not counted.cfg
    assert resolve("hunyuanimage-2.1-distilled").components["transformer"].config["use_meanflow"]


def test_real_defaults_count_two_qwen_passes_and_two_forwards_per_step():
    counted = {c.name: c for c in profile("hunyuanimage-2.1").components}
    assert (counted["text_encoder"].calls, counted["transformer"].calls) == (2, 100)
    distilled = {c.name: c for c in profile("hunyuanimage-2.1-distilled").components}
    assert (distilled["text_encoder"].calls, distilled["transformer"].calls) == (1, 8)


@pytest.mark.parametrize("name", ["hunyuanimage-2.1", "hunyuanimage-2.1-distilled"])
@pytest.mark.parametrize("size", [(1024, 1024), (2048, 2048)])
def test_closed_form_matches_the_counted_transformer_call(name, size):
    height, width = size
    entry = resolve(name)
    counted = next(
        c
        for c in profile(name, height=height, width=width, guidance_scale=1.0, glyph_text=False).components
        if c.role == "denoiser"
    ).macs_per_call
    qwen = entry.text_max_length["text_encoder"] - 34  # the template prefix is dropped
    closed = FORMULAS["hunyuanimage"](
        entry.components["transformer"].config,
        (height // 32) * (width // 32),
        qwen,
        entry.text_max_length["text_encoder_2"],
    )
    assert abs(closed - counted) / counted < 0.01


@pytest.mark.parametrize("entry", [BASE, DISTILLED], ids=lambda e: e.name)
def test_a_local_folder_is_counted_as_its_pipeline_runs_it_with_just_a_prompt(entry, tmp_path):
    """The folder's guider (model_index.json) decides CFG; the distilled folder has none; 64 x the VAE's factor."""
    import diffusers

    folder = tmp_path / entry.name
    tiny_pipeline(entry).save_pretrained(folder)
    local = resolve(str(folder))
    assert ("guider" in local.extra["pipeline_init"]) == (entry is BASE)
    pipe = diffusers.HunyuanImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    components = {name: getattr(pipe, name) for name in local.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe("a photo of a cat", num_inference_steps=2, output_type="np")
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in local.components}
    counted = profile(str(folder), steps=2, **FAMILY.prompt_settings(pipe, ["a photo of a cat"]))
    assert (counted.height, counted.width) == (256, 256)
    assert macs(counted) == real


@pytest.mark.slow
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_bench_sets_the_guiders_scale_so_it_runs_what_it_counts(tmp_path, scale):
    """The guidance scale lives in the pipeline's guider, not in __call__: bench sets it there."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec(model="tiny-hunyuanimage", steps=2, iterations=1, guidance_scale=scale, save_images=False)
    result, _ = bench(spec, out=tmp_path)
    guided = scale != 1.0
    assert result.profile.cfg is guided
    assert result.iterations[0].denoiser_calls == 2 * (2 if guided else 1)
