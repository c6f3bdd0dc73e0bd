"""HunyuanVideo 1.5: what the generic tests do not reach. ByT5 runs only on quoted text, the guider
component (not a __call__ argument) decides CFG, the distilled guider runs no uncond branch, a batch of
videos decodes one at a time, and the closed form of the transformer."""

import diffusers
import pytest
import torch

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

FAMILY = get_family("hunyuanvideo15")
ENTRY = resolve("tiny-hunyuanvideo15")
REAL = ["hunyuanvideo15-480p-t2v", "hunyuanvideo15-720p-t2v", "hunyuanvideo15-480p-t2v-distilled"]
QUOTED = 'a neon sign that reads "OPEN LATE" above a rainy street'
PLAIN = "a photo of a cat riding a horse"


def real_macs(pipe, prompts: list[str], guidance_scale: float) -> dict[str, int]:
    """Run the real pipeline as FAMILY.prepare_pipeline sets it up; MACs per component."""
    defaults = ENTRY.defaults
    FAMILY.prepare_pipeline(pipe, guidance_scale, len(prompts))
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            prompt=prompts,
            height=defaults.height,
            width=defaults.width,
            num_frames=defaults.num_frames,
            num_inference_steps=defaults.steps,
            output_type="np",
            generator=torch.Generator().manual_seed(0),
            **FAMILY.guidance_arguments(ENTRY, guidance_scale),
        )
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(ENTRY)


def offline(prompts: list[str], pipe, guidance_scale: float, **settings) -> dict[str, int]:
    settings = {**FAMILY.prompt_settings(pipe, prompts), **settings}
    counted = profile(ENTRY.name, batch_size=len(prompts), guidance_scale=guidance_scale, **settings)
    return {c.name: c.macs for c in counted.components}


def test_quoted_text_runs_byt5_once_per_prompt_and_not_for_the_empty_negative_prompt(pipe):
    assert FAMILY.prompt_settings(pipe, [QUOTED]) == {"glyph_text": True}
    assert FAMILY.prompt_settings(pipe, [PLAIN]) == {"glyph_text": False}
    real = real_macs(pipe, [QUOTED, QUOTED], 6.0)
    assert real["text_encoder_2"] > 0
    assert offline([QUOTED, QUOTED], pipe, 6.0) == real
    single = real_macs(pipe, [QUOTED], 6.0)
    assert real["text_encoder_2"] == 2 * single["text_encoder_2"]  # batch-1 calls, one per prompt


def test_unknown_prompts_count_byt5_as_an_upper_bound(pipe):
    mixed = real_macs(pipe, [QUOTED, PLAIN], 1.0)
    bound = profile(ENTRY.name, batch_size=2, guidance_scale=1.0)
    byt5 = next(c for c in bound.components if c.name == "text_encoder_2")
    assert byt5.macs == 2 * mixed["text_encoder_2"]  # the mixed batch encodes one glyph text, the bound two
    assert any("upper bound" in note for note in bound.notes)
    assert offline([PLAIN], pipe, 1.0)["text_encoder_2"] == 0


def test_the_distilled_guider_runs_no_uncond_branch(pipe):
    """The distilled repos ship ClassifierFreeGuidance(guidance_scale=1.0): a pipeline built with that
    guider and called with no guidance argument runs one transformer call per step and no negative prompt."""
    distilled = resolve("hunyuanvideo15-480p-t2v-distilled")
    guider = distilled.extra["pipeline_init"]["guider"]
    scale = FAMILY.called_guidance(distilled, {})
    assert scale == distilled.defaults.guidance_scale == 1.0
    assert FAMILY.called_guidance(resolve("hunyuanvideo15-480p-t2v"), {}) == 6.0
    local = tiny_pipeline(ENTRY)
    local.guider = getattr(diffusers, guider["class"]).from_config(guider["config"])
    components = {name: getattr(local, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        local(PLAIN, height=48, width=64, num_frames=9, num_inference_steps=2, output_type="np")
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    counted = profile(ENTRY.name, guidance_scale=scale, **FAMILY.prompt_settings(local, [PLAIN]))
    assert not counted.cfg
    assert {c.name: c.macs for c in counted.components} == real
    with_cfg = {c.name: c.macs for c in profile(ENTRY.name, glyph_text=False).components}
    assert with_cfg["transformer"] == 2 * real["transformer"] and with_cfg["text_encoder"] == 2 * real["text_encoder"]


def test_a_batch_of_videos_decodes_only_one_at_a_time():
    """diffusers 0.42.1's AutoencoderKLHunyuanVideo15 fails on two latents in one decode call (its
    mid-block attention mask broadcasts wrongly); with slicing it decodes them one by one, as counted."""
    vae = tiny_pipeline(ENTRY).vae
    latents = torch.zeros(2, 4, 3, 3, 4)
    vae.disable_slicing()
    with pytest.raises(RuntimeError):
        vae.decode(latents)
    vae.enable_slicing()
    with torch.no_grad(), count_flops({"vae": vae}) as counts:
        vae.decode(latents)
    counted = profile(ENTRY.name, batch_size=2, guidance_scale=1.0, glyph_text=False)
    decoder = next(c for c in counted.components if c.name == "vae")
    assert (decoder.calls, decoder.batch_per_call) == (2, 1)
    assert decoder.macs == counts.total // 2


@pytest.mark.parametrize("name", REAL)
def test_default_size_is_the_pipelines_16_9_bucket_of_target_size(name):
    entry = resolve(name)
    assert FAMILY.default_size(entry) == (entry.defaults.height, entry.defaults.width)


def test_a_local_folder_takes_its_guidance_from_its_guider(tmp_path):
    tiny_pipeline(ENTRY).save_pretrained(tmp_path / "hv15")
    local = resolve(str(tmp_path / "hv15"))
    assert (
        local.family == "hunyuanvideo15" and local.extra["pipeline_init"]["guider"]["class"] == "ClassifierFreeGuidance"
    )
    assert local.defaults.guidance_scale == 6.0 and local.defaults.num_frames == 121
    assert (local.defaults.height, local.defaults.width) == (480, 848)  # target_size 640, 16:9


@pytest.mark.parametrize("size", [(480, 848, 121), (720, 1280, 61)])
def test_closed_form_matches_the_counted_transformer_call(size):
    height, width, frames = size
    entry = resolve("hunyuanvideo15-720p-t2v")
    counted = profile(entry.name, height=height, width=width, num_frames=frames, guidance_scale=1.0)
    transformer = next(c for c in counted.components if c.name == "transformer")
    video_tokens = ((frames - 1) // 4 + 1) * (height // 16) * (width // 16)
    closed = FORMULAS["hunyuanvideo15"](entry.components["transformer"].config, video_tokens)
    assert closed == pytest.approx(transformer.macs_per_call, rel=0.01)
