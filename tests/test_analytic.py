"""An independent closed form agrees with the operator-level count within 1%."""

import pytest

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.flops.analytic import FORMULAS

CASES = [
    "flux-dev",
    "flux-schnell",
    "sd3-medium",
    "sd35-medium",
    "sd35-large",
    "pixart-alpha-512",
    "pixart-alpha-1024",
    "pixart-sigma-1024",
    "dit-xl-2-256",
    "dit-xl-2-512",
]


def _text_tokens(entry) -> int:
    lengths = entry.text_max_length
    return {
        "flux": lengths.get("text_encoder_2", 0),
        "sd3": 77 + lengths.get("text_encoder_3", 0),
        "pixart": lengths.get("text_encoder", 0),
        "dit": 0,
    }[entry.family]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("size", [512, 1024])
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
