"""A local pipeline folder is counted as its own pipeline class runs it when called with just a
prompt: its __call__ defaults (steps aside), its sequence lengths, its default size."""

import diffusers
import pytest
import torch
from tiny_runs import quick_or_slow

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.catalog.pipeline_defaults import call_defaults
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

PROMPT = "a photo of a cat riding a horse"
#: PixArt-Sigma pads T5 to 300 tokens where PixArt-Alpha pads to 120: the case a shared template got wrong
#: Qwen-Image's __call__ has guidance_scale=None; Z-Image's guidance_scale is w in cond + w * (cond - uncond)
FOLDERS = [
    "tiny-pixart-sigma",
    "tiny-flux",
    "tiny-sd",
    "tiny-sd3",
    "tiny-sana",
    "tiny-cogvideox",
    "tiny-qwenimage",
    "tiny-z-image",
]


@pytest.mark.parametrize("name", quick_or_slow(FOLDERS))
def test_a_local_folder_is_counted_as_its_own_pipeline_runs_it(name, tmp_path):
    folder = tmp_path / name
    tiny_pipeline(resolve(name)).save_pretrained(folder)
    local = resolve(str(folder))
    assert local.origin == "local" and "__call__ defaults" in local.sources["defaults"]
    family = get_family(local.family)
    pipe = getattr(diffusers, local.pipeline_class).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    components = {component: getattr(pipe, component) for component in local.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(PROMPT, num_inference_steps=2, output_type="np")  # every other setting: the pipeline's default
    counted = {component: sum(counts.by_module.get(component, {}).values()) // 2 for component in local.components}
    settings = family.prompt_settings(pipe, [PROMPT])
    offline = profile(str(folder), steps=2, **settings)
    assert {c.name: c.macs for c in offline.components} == {k: v for k, v in counted.items() if v}


def test_a_folder_whose_pipeline_refuses_its_own_defaults_is_refused_in_one_line(tmp_path):
    """tiny-pixart's sample_size has no PixArt-Alpha bin table: the pipeline raises, so does diffmeter."""
    tiny_pipeline(resolve("tiny-pixart")).save_pretrained(tmp_path / "alpha")
    pipe = diffusers.PixArtAlphaPipeline.from_pretrained(tmp_path / "alpha")
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(ValueError, match="Invalid sample size"):
        pipe(PROMPT, num_inference_steps=1, output_type="np")
    with pytest.raises(DiffmeterError, match="no resolution bins for sample_size .*--no-resolution-binning"):
        profile(str(tmp_path / "alpha"), steps=1)
    assert profile(str(tmp_path / "alpha"), steps=1, resolution_binning=False).total_macs > 0


def test_the_pixart_sigma_folder_pads_t5_to_its_own_300_tokens(tmp_path):
    tiny_pipeline(resolve("tiny-pixart")).save_pretrained(tmp_path / "alpha")
    (tmp_path / "alpha" / "model_index.json").write_text(
        (tmp_path / "alpha" / "model_index.json").read_text().replace("PixArtAlphaPipeline", "PixArtSigmaPipeline")
    )
    assert resolve(str(tmp_path / "alpha")).text_max_length["text_encoder"] == 300  # PixArtSigmaPipeline's default


def test_a_local_z_image_folder_guides_with_the_scale_its_pipeline_uses(tmp_path):
    """ZImagePipeline's guidance_scale w means the usual CFG scale w + 1: a folder called with its defaults
    (w = 5) is shown as guidance 6 and run as w = 5."""
    tiny_pipeline(resolve("tiny-z-image")).save_pretrained(tmp_path / "z")
    local = resolve(str(tmp_path / "z"))
    w = call_defaults("ZImagePipeline")["guidance_scale"]
    assert local.defaults.guidance_scale == w + 1
    assert get_family(local.family).guidance_arguments(local, local.defaults.guidance_scale) == {"guidance_scale": w}
