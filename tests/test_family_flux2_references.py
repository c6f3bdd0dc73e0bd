"""FLUX.2 [dev] and [klein] with reference images: the real tiny pipelines (diffusers, random weights, offline
tokenizers) run under the counter with 1 and 2 references, guided and not, equal the offline profile per
component; the pipeline's own resize rule and refusals."""

import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, TINY, encoded_size, macs_by_name

from diffmeter import profile
from diffmeter.catalog import resolve as resolve_entry
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline


def _tiny(name):
    return next(entry for entry in TINY if entry.name == name)


def referenced_run(entry, images, batch=1, guidance_scale=None, size=None):
    """The real pipeline with ``images`` ((height, width) each) as references shared by ``batch`` prompts, at ``size``
    ((height, width); None: called without one): MACs per component name and the input shapes its VAE encoded."""
    pipe = tiny_pipeline(entry)
    encode, encoded = pipe.vae.encode, []

    def spy(x, *args, **kwargs):
        encoded.append(tuple(x.shape))
        return encode(x, *args, **kwargs)

    pipe.vae.encode = spy
    references = [Image.new("RGB", (w, h), (30 * k, 120, 200)) for k, (h, w) in enumerate(images)]
    arguments = dict(entry.extra["runtime"].get("call", {}))
    if guidance_scale is not None:
        arguments["guidance_scale"] = guidance_scale
    if size is not None:
        arguments.update(height=size[0], width=size[1])
    components = {name: getattr(pipe, name) for name in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            prompt=[PROMPT] * batch,
            image=references,
            num_inference_steps=2,
            output_type="np",
            generator=[torch.Generator().manual_seed(k) for k in range(batch)],
            **arguments,
        )
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    return macs, encoded


@pytest.mark.parametrize(
    ("name", "images", "batch", "guidance", "size"),
    [
        ("tiny-flux2", [(64, 64)], 1, None, (32, 32)),
        ("tiny-flux2", [(72, 96), (64, 64)], 2, None, None),
        ("tiny-flux2", [(64, 64), (72, 96)], 2, None, (32, 48)),
        ("tiny-flux2-klein-base", [(64, 64)], 1, 4.0, (32, 32)),
        ("tiny-flux2-klein-base", [(66, 80), (64, 64)], 1, 1.0, None),
        ("tiny-flux2-klein-base", [(66, 80)], 2, 4.0, None),
        ("tiny-flux2-klein", [(64, 64), (64, 64)], 2, None, None),
        ("tiny-flux2-klein", [(64, 64)] * 65, 1, None, (32, 32)),  # no limit in the pipeline; diffmeter once had 64
    ],
)
def test_references_are_counted_exactly(name, images, batch, guidance, size):
    """One, two and 65 references, off the multiple of 4, at batch 2 (shared references), with and without CFG, at
    a size asked and without one (then the first reference's, as the pipeline resized it)."""
    entry = _tiny(name)
    real, encoded = referenced_run(entry, images, batch, guidance, size)
    settings = {} if guidance is None else {"guidance_scale": guidance}
    if size is not None:
        settings.update(height=size[0], width=size[1])
    offline = profile(name, steps=2, batch_size=batch, image_sizes=images, **settings)
    assert macs_by_name(offline) == real
    made = [(h // 4 * 4, w // 4 * 4) for h, w in images]  # tiny: vae_scale_factor 2, times 2
    assert encoded == [(1, 3, h, w) for h, w in made]  # each reference once, whatever the batch
    assert offline.input_images == made
    encode = next(c for c in offline.components if c.role == "image_encoder")
    assert encode.calls == len(images) and encode.batch_per_call == 1
    assert (offline.height, offline.width) == (size or made[0])


@pytest.mark.parametrize("size", [(1024, 1536), (2000, 900), (1100, 1000)])
def test_larger_references_are_shrunk_as_the_pipeline_does(size):
    """A reference over 1024 * 1024 pixels: the real pipeline's encoded size (the run stops at the encode)."""
    entry = _tiny("tiny-flux2")
    image = Image.new("RGB", size[::-1])
    made = encoded_size(tiny_pipeline(entry), prompt=PROMPT, image=[image], height=32, width=32, num_inference_steps=1)
    spec = ProfileSpec(model=entry.name, image_sizes=(size,)).with_defaults(entry.defaults)
    assert get_family(entry.family).input_images(entry, spec, []) == [made]


@pytest.mark.parametrize("size", [(32, 64), (64, 600)])
def test_references_the_pipeline_refuses_are_refused(size):
    pipe = tiny_pipeline(_tiny("tiny-flux2"))
    with pytest.raises(ValueError):
        pipe(prompt=PROMPT, image=[Image.new("RGB", size[::-1])], height=32, width=32, num_inference_steps=1)
    with pytest.raises(DiffmeterError, match="refuses reference images"):
        profile("tiny-flux2", image_sizes=[size])


def test_a_real_flux2_reference_adds_its_tokens():
    """flux2-dev with one 1024x1024 reference at 1024x1024: 4096 + 4096 image tokens, as FLUX.2 at 1024x2048."""
    edit = profile("flux2-dev", image_sizes=["1024x1024"], steps=1)
    wide = profile("flux2-dev", height=1024, width=2048, steps=1)
    per_call = {c.role: c.macs_per_call for c in edit.components}
    assert per_call["denoiser"] == next(c.macs_per_call for c in wide.components if c.role == "denoiser")
    assert any("4096 tokens beside the 4096 noisy-latent tokens" in note for note in edit.notes)


def test_the_first_reference_sets_the_size_when_none_is_asked(cli):
    """Called without a size, Flux2Pipeline takes the first reference's (``height = height or image_height`` keeps
    the first): counted there, and `profile` says so; a size asked is kept, and bench generates at the same."""
    from diffmeter.runs.spec import BenchSpec

    found = profile("tiny-flux2", image_sizes=[(64, 80), (96, 64)], steps=1)
    assert (found.height, found.width) == (64, 80) and found.requested_height is None
    code, out, err = cli("profile", "tiny-flux2", "--image-size", "80x64", "--image-size", "64x96")
    assert code == 0, err
    assert "output 80x64 (WxH): called without a size, Flux2Pipeline generates at its first reference" in out
    asked = profile("tiny-flux2", image_sizes=[(64, 80)], height=32, width=48, steps=1)
    assert (asked.height, asked.width) == (32, 48)
    settled = BenchSpec(model="tiny-flux2", image_sizes=["80x64"]).settle(resolve_entry("tiny-flux2"))
    assert (settled.height, settled.width) == (64, 80)
