"""FLUX.1 Kontext (FluxKontextPipeline), text-to-image and editing: what the generic tests do not reach.

FluxKontextPipeline re-fits every requested size to ``max_area`` pixels at the requested aspect ratio
before it generates; these tests hold diffmeter to the real pipeline on sizes off the default, on its
own default size, at another max_sequence_length, and check the real catalog entry."""

import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, TINY, encoded_size, macs_by_name

from diffmeter import profile, units
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.spec import ProfileSpec
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


def test_real_entry_fits_sizes_to_a_megapixel_and_edits_its_default_image():
    """flux1-kontext-dev makes 1024x1024 for a 512x512 request; run as its model card runs it, on an input image
    (the catalog's: a square one, 1024x1024 once resized), its transformer call costs what FLUX.1-dev's does at
    1024x2048 (same architecture, the image's 4096 tokens beside the 4096 noisy ones)."""
    kontext = profile("flux1-kontext-dev", height=512, width=512)
    assert (kontext.height, kontext.width) == (1024, 1024) and kontext.input_images == [(1024, 1024)]
    dev = profile("flux-dev", height=1024, width=2048)
    per_call = {(c.name, c.role): c.macs_per_call for c in kontext.components if c.role != "image_encoder"}
    assert per_call == {(c.name, c.role): c.macs_per_call for c in dev.components if c.role != "vae_decoder"} | {
        ("vae", "vae_decoder"): next(c.macs_per_call for c in profile("flux-dev").components if c.role == "vae_decoder")
    }
    wide = profile("flux1-kontext-dev", height=768, width=1280)
    assert (wide.height, wide.width) == (784, 1312)  # round(sqrt(2**20 * 3/5)), round(sqrt(2**20 * 5/3)), floored to 16


@pytest.mark.parametrize("size", [(1024, 1024), (768, 1280)])
def test_flux_closed_form_covers_a_kontext_edit(size):
    entry = resolve("flux1-kontext-dev")
    result = profile("flux1-kontext-dev", height=size[0], width=size[1])
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    image_tokens = sum((h // 16) * (w // 16) for h, w in [(result.height, result.width), *result.input_images])
    closed = FORMULAS["flux"](
        entry.components["transformer"].config, image_tokens, entry.text_max_length["text_encoder_2"]
    )
    assert abs(closed - counted) / counted < 0.01


def edit_run(image_size: tuple[int, int], batch: int = 1, **arguments):
    """The real tiny FluxKontextPipeline editing one image with ``batch`` prompts (``image_size`` as (height, width)),
    one generator per output as bench calls it: MACs per component name, and the input shapes its VAE encoded."""
    pipe = tiny_pipeline(ENTRY)
    encode, encoded = pipe.vae.encode, []

    def spy(x, *args, **kwargs):
        encoded.append(tuple(x.shape))
        return encode(x, *args, **kwargs)

    pipe.vae.encode = spy
    image = Image.new("RGB", image_size[::-1], (40, 90, 160))
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    call = dict(ENTRY.extra["runtime"]["call"])
    call.update(arguments)
    generators = [torch.Generator().manual_seed(k) for k in range(batch)]
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            prompt=[PROMPT] * batch, image=image, num_inference_steps=2, output_type="np", generator=generators, **call
        )
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    return macs, encoded


@pytest.mark.parametrize(
    ("image", "batch", "arguments"),
    [((24, 40), 1, {}), ((32, 32), 2, {}), ((26, 18), 1, {"true_cfg_scale": 2.0, "negative_prompt": ""})],
)
def test_an_edit_is_counted_exactly(image, batch, arguments):
    """With an input image (off the multiple of 4, at batch 2, with true CFG) the tiny pipeline's real run
    equals the offline profile per component: the image encoded once per call (its latents repeated for the
    outputs: pipeline_flux_kontext.py:644-647), its tokens in every call."""
    negative = {"negative_prompt": [""] * batch} if arguments else {}
    real, encoded = edit_run(image, batch, **{**arguments, **negative}, guidance_scale=2.5)
    offline = profile(
        "tiny-flux-kontext",
        steps=2,
        batch_size=batch,
        guidance_scale=2.5,
        image_sizes=[image],
        true_cfg_scale=arguments.get("true_cfg_scale"),
    )
    assert macs_by_name(offline) == real
    step = 4  # tiny: vae_scale_factor 2, times 2
    made = (image[0] // step * step, image[1] // step * step)
    assert encoded == [(1, 3, *made)]
    assert offline.input_images == [made]
    assert (offline.requested_images is None) == (made == image)
    encode = next(c for c in offline.components if c.role == "image_encoder")
    assert (encode.name, encode.calls, encode.batch_per_call) == ("vae", 1, 1)
    text_only = profile("tiny-flux-kontext", steps=2, batch_size=batch, guidance_scale=2.5)
    assert offline.params == text_only.params  # the VAE's weights are counted once


@pytest.mark.parametrize("size", [(1000, 700), (500, 2000), (1024, 1024), (768, 1360), (540, 500)])
def test_the_preferred_kontext_resolution_is_the_pipelines(size):
    """``_auto_resize`` (the pipeline's default): the real pipeline's choice of input size, read where it
    encodes, equals the family's (the run stops there: a 1024-pixel image is too big for the tiny transformer)."""
    image = Image.new("RGB", size[::-1])
    made = encoded_size(tiny_pipeline(ENTRY), prompt=PROMPT, image=image, num_inference_steps=1, max_sequence_length=32)
    entry = ENTRY.model_copy(deep=True)
    entry.extra["runtime"]["call"]["_auto_resize"] = True
    spec = ProfileSpec(model=ENTRY.name, image_sizes=(size,)).with_defaults(entry.defaults)
    assert get_family(ENTRY.family).input_images(entry, spec, []) == [made]


def test_a_kontext_edit_adds_the_image_tokens_to_every_transformer_call():
    """flux1-kontext-dev editing a 1024x1024 image at 1024x1024: the transformer sees 4096 + 4096 image tokens,
    exactly what FLUX.1-dev's sees at 2048x1024; the VAE encodes the image once, at what its encoder costs."""
    edit = profile("flux1-kontext-dev", image_sizes=["1024x1024"])
    assert edit.input_images == [(1024, 1024)]
    transformer = next(c for c in edit.components if c.role == "denoiser")
    wide = next(c for c in profile("flux-dev", height=1024, width=2048).components if c.role == "denoiser")
    assert transformer.macs_per_call == wide.macs_per_call
    text_only = profile("flux-dev", steps=edit.steps, guidance_scale=edit.guidance_scale)  # Kontext's architecture
    added = edit.total_macs - text_only.total_macs
    encode = next(c for c in edit.components if c.role == "image_encoder")
    plain = next(c for c in text_only.components if c.role == "denoiser")
    assert added == encode.macs + transformer.macs - plain.macs
    assert transformer.macs > 2 * plain.macs  # attention grows with the square of the sequence
    noted = "editing, the input image: 4096 tokens beside the 4096 noisy-latent tokens"
    assert any(noted in note for note in edit.notes)


def test_image_sizes_the_pipeline_cannot_take_are_refused():
    with pytest.raises(DiffmeterError, match="edits one input image"):
        profile("tiny-flux-kontext", image_sizes=[(32, 32), (32, 32)])
    with pytest.raises(DiffmeterError, match="multiple of 4"):
        profile("tiny-flux-kontext", image_sizes=[(2, 32)])
    with pytest.raises(DiffmeterError, match="multiple of 16"):  # the pipeline would divide by the zero side
        profile("flux1-kontext-dev", image_sizes=[(8, 16)])
    with pytest.raises(DiffmeterError, match="takes no input image"):
        profile("tiny-flux", image_sizes=[(32, 32)])
    with pytest.raises(DiffmeterError, match="WIDTHxHEIGHT"):
        profile("tiny-flux-kontext", image_sizes=["32by32"])


def test_the_profile_shows_what_the_image_adds(cli):
    """`profile --image-size` prints the edit beside its text-to-image baseline: both totals, their ratio, and the
    image encoding's and denoising's extra MACs, each the profiles' own figures."""
    code, out, err = cli("profile", "tiny-flux-kontext", "--image-size", "40x24", "--json")
    assert code == 0, err
    code, out, err = cli("profile", "tiny-flux-kontext", "--image-size", "40x24")
    assert code == 0, err
    edit = profile("tiny-flux-kontext", image_sizes=["40x24"])
    plain = profile("tiny-flux-kontext")
    line = " ".join(out.split())
    assert f"this generation {units.macs(edit.total_macs)}, {edit.total_macs / plain.total_macs:.2f}x" in line
    encoding = next(c.macs for c in edit.components if c.role == "image_encoder")
    assert f"the input image adds {units.macs(encoding)} of image encoding" in line
    assert "input image 40x24" in line and "image_encoder" in line
    code, _, err = cli("profile", "tiny-flux", "--image-size", "40x24")
    assert code == 2 and "takes no input image: drop --image or --image-size" in err
    assert len(err.strip().splitlines()) == 1


def test_the_catalog_entry_profiles_text_only_with_no_image(cli):
    """flux1-kontext-dev's catalog call edits an image; `image_sizes=()` (`--no-image`) counts the text-to-image call
    FluxKontextPipeline also runs (once taken for "unset" and given the catalog's image back), and the edit's profile
    compares itself with it. An image-to-video checkpoint cannot go without one: one line."""
    edit, text = profile("flux1-kontext-dev", steps=1), profile("flux1-kontext-dev", steps=1, image_sizes=())
    assert edit.input_images == [(1024, 1024)] and not text.input_images
    assert "image_encoder" not in {c.role for c in text.components}
    assert text.denoiser_macs_per_step < edit.denoiser_macs_per_step
    code, out, err = cli("profile", "flux1-kontext-dev", "--steps", "1", "--no-image")
    assert code == 0 and "counted as text-to-image" in " ".join(out.split()), err
    code, out, err = cli("profile", "flux1-kontext-dev", "--steps", "1")
    line = " ".join(out.split())
    assert code == 0 and f"against text-to-image at the same settings ({units.macs(text.total_macs)})" in line, err
    for refused, said in (
        (["flux1-kontext-dev", "--no-image", "--image-size", "64x64"], "--no-image and --image-size contradict"),
        (["wan21-i2v-14b-480p", "--no-image"], "cannot run without an input image: drop --no-image"),
    ):
        code, _, err = cli("profile", *refused)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
