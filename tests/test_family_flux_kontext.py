"""FLUX.1 Kontext (FluxKontextPipeline) profiled as text-to-image: what the generic tests do not reach.

FluxKontextPipeline re-fits every requested size to ``max_area`` pixels at the requested aspect ratio
before it generates; these tests hold diffmeter to the real pipeline on sizes off the default, on its
own default size, at another max_sequence_length, and check the real catalog entry."""

import pytest
import torch
from tiny_runs import PROMPT, TINY

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = next(e for e in TINY if e.name == "tiny-flux-kontext")


def real_run(**arguments):
    """Run the real tiny FluxKontextPipeline (no input image) under the counter: per-component MACs
    and the latent size the VAE decoded."""
    pipe = tiny_pipeline(ENTRY)
    decode, seen = pipe.vae.decode, []

    def spy(z, *args, **kwargs):
        seen.append(tuple(z.shape[-2:]))
        return decode(z, *args, **kwargs)

    pipe.vae.decode = spy
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    call = dict(ENTRY.extra["runtime"]["call"])
    call.update(arguments)
    with torch.no_grad(), count_flops(components) as counts:
        pipe(prompt=PROMPT, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0), **call)
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    return macs, seen[0]


@pytest.mark.parametrize("size", [(64, 64), (24, 48), (40, 32), (16, 80)])
def test_refitted_sizes_are_counted_exactly(size):
    """A request off max_area (bigger, smaller, non-square, off the multiple) is counted at the size the
    pipeline re-fits it to, and says so."""
    height, width = size
    real, latent = real_run(height=height, width=width, guidance_scale=2.5)
    offline = profile("tiny-flux-kontext", height=height, width=width, steps=2, guidance_scale=2.5)
    assert {c.name: c.macs for c in offline.components} == real
    scale = get_family(ENTRY.family).vae_scale(ENTRY)
    assert (offline.height, offline.width) == (latent[0] * scale, latent[1] * scale)
    assert (offline.height, offline.width) != size  # every one of these sizes is re-fitted
    assert any("max_area" in note for note in offline.notes)


def test_default_size_is_the_pipelines_own():
    """Called with no size, the pipeline makes 128 * vae_scale per side, re-fitted to max_area."""
    real, latent = real_run()
    scale = get_family(ENTRY.family).vae_scale(ENTRY)
    assert get_family(ENTRY.family).default_size(ENTRY) == (latent[0] * scale, latent[1] * scale)
    offline = profile("tiny-flux-kontext", steps=2, guidance_scale=3.5)  # __call__'s own guidance default
    assert {c.name: c.macs for c in offline.components} == real


def test_another_max_sequence_length_is_exact():
    real, _ = real_run(max_sequence_length=16, guidance_scale=2.5)
    offline = profile("tiny-flux-kontext", steps=2, guidance_scale=2.5, max_sequence_length=16)
    assert {c.name: c.macs for c in offline.components} == real
    padded = {c.name: c.macs for c in profile("tiny-flux-kontext", steps=2).components}
    assert real["text_encoder_2"] < padded["text_encoder_2"]  # 16 tokens, not the entry's 32


def test_real_entry_fits_sizes_to_a_megapixel_and_runs_the_flux_dev_transformer():
    """flux1-kontext-dev makes 1024x1024 for a 512x512 request; its transformer call then costs what
    FLUX.1-dev's does at 1024x1024 (same architecture, text-to-image)."""
    kontext = profile("flux1-kontext-dev", height=512, width=512)
    assert (kontext.height, kontext.width) == (1024, 1024)
    dev = profile("flux-dev", height=1024, width=1024)
    per_call = {c.name: c.macs_per_call for c in kontext.components}
    assert per_call == {c.name: c.macs_per_call for c in dev.components}
    wide = profile("flux1-kontext-dev", height=768, width=1280)
    assert (wide.height, wide.width) == (784, 1312)  # round(sqrt(2**20 * 3/5)), round(sqrt(2**20 * 5/3)), floored to 16


@pytest.mark.parametrize("size", [(1024, 1024), (768, 1280)])
def test_flux_closed_form_covers_kontext_text_to_image(size):
    entry = resolve("flux1-kontext-dev")
    result = profile("flux1-kontext-dev", height=size[0], width=size[1])
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    image_tokens = (result.height // 16) * (result.width // 16)
    closed = FORMULAS["flux"](
        entry.components["transformer"].config, image_tokens, entry.text_max_length["text_encoder_2"]
    )
    assert abs(closed - counted) / counted < 0.01
