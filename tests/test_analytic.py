"""An independent closed form agrees with the operator-level count within 1%."""

import pytest

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.flops.analytic import FORMULAS

MODELS = [
    "flux-dev",
    "flux-schnell",
    "sd3-medium",
    "sd35-medium",
    "sd35-large",
    "pixart-alpha-512",
    "pixart-alpha-1024",
    "pixart-sigma-1024",
]
#: (model, size): DiT makes one size only (its sample_size), the others two each
CASES = [(name, size) for name in MODELS for size in (512, 1024)] + [("dit-xl-2-256", 256), ("dit-xl-2-512", 512)]


def _text_tokens(entry) -> int:
    lengths = entry.text_max_length
    return {
        "flux": lengths.get("text_encoder_2", 0),
        "sd3": 77 + lengths.get("text_encoder_3", 0),
        "pixart": lengths.get("text_encoder", 0),
        "dit": 0,
    }[entry.family]


@pytest.mark.parametrize(("name", "size"), CASES)
def test_closed_form_matches_counted_denoiser_call(name, size):
    entry = resolve(name)
    counted = next(
        c
        for c in profile(name, height=size, width=size, guidance_scale=1.0, resolution_binning=False).components
        if c.role == "denoiser"
    ).macs_per_call
    image_tokens = (size // 16) ** 2  # 8x VAE, 2x2 patches for every family here
    closed = FORMULAS[entry.family](entry.components["transformer"].config, image_tokens, _text_tokens(entry))
    assert abs(closed - counted) / counted < 0.01


@pytest.mark.parametrize("name", ["wan21-t2v-1.3b", "wan21-t2v-14b", "cogvideox-5b"])
@pytest.mark.parametrize("size", [(256, 256, 5), (480, 832, 9)])
def test_closed_form_matches_video_transformers(name, size):
    height, width, frames = size
    entry = resolve(name)
    result = profile(name, height=height, width=width, num_frames=frames, guidance_scale=1.0)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    tokens = ((frames - 1) // 4 + 1) * (height // 16) * (width // 16)  # 4x temporal, 8x spatial, 2x2 patches
    closed = FORMULAS[entry.family](
        entry.components["transformer"].config, tokens, entry.text_max_length["text_encoder"]
    )
    assert abs(closed - counted) / counted < 0.01


@pytest.mark.parametrize("size", [(1024, 1024), (768, 1280)])
def test_closed_form_matches_hunyuandit(size):
    entry = resolve("hunyuandit")
    result = profile("hunyuandit", height=size[0], width=size[1], guidance_scale=1.0)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    closed = FORMULAS["hunyuandit"](entry.components["transformer"].config, (size[0] // 16) * (size[1] // 16), 0)
    assert abs(closed - counted) / counted < 0.01


@pytest.mark.parametrize("size,caption", [(1024, 256), (512, 40), (768, 120)])
def test_closed_form_matches_lumina2_at_real_caption_lengths(size, caption):
    entry = resolve("lumina2")
    result = profile("lumina2", height=size, width=size, guidance_scale=1.0, prompt_tokens=caption)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    padded = entry.text_max_length["text_encoder"]
    closed = FORMULAS["lumina2"](entry.components["transformer"].config, (size // 16) ** 2, caption, padded)
    assert abs(closed - counted) / counted < 0.01
