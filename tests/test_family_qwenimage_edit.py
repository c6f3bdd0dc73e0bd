"""Qwen-Image-Edit (QwenImageEditPipeline): the tiny pipeline, vision tower included, run for real under the counter
equals the offline profile per component, with and without true CFG; the image's tokens in the prompt and beside
the latents; refusals."""

import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, TINY, counted_run, macs_by_name, tiny_call, token_settings

from diffmeter import profile
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops

NAME = "tiny-qwenimage-edit"


@pytest.mark.parametrize(("guidance", "image"), [(1.0, (64, 64)), (4.0, (48, 80))])
def test_an_edit_is_counted_exactly(guidance, image):
    entry = next(e for e in TINY if e.name == NAME)
    pipe, real, settings, encoded, _ = counted_run(entry, guidance_scale=guidance, image_sizes=(image,))
    offline = profile(NAME, **settings)
    assert macs_by_name(offline) == real
    vision = [i for c in offline.components if c.name == "text_encoder" for i in c.invocations if "vision" in i.note]
    assert len(vision) == (2 if guidance > 1 else 1) and all(i.macs_per_call > 0 for i in vision)
    assert len(encoded) == 1 and encoded[0][:3] == (1, 3, 1)
    assert offline.input_images == [encoded[0][3:]]  # the 1024x1024-area size of the image's aspect ratio


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "images"),
    [("tiny-qwenimage-edit", ((48, 80),)), ("tiny-qwenimage-edit-plus", ((64, 64), (80, 40)))],
)
def test_the_output_follows_the_input_image_when_no_size_is_asked(name, images):
    """Called without a size, QwenImageEditPipeline generates at the 1024x1024-area size of its image's aspect ratio
    (pipeline_qwenimage_edit.py:623-630), -Plus of its last image's (pipeline_qwenimage_edit_plus.py:645-652): the
    real call's decode and MACs equal `profile` without a size, which says why."""
    entry = next(e for e in TINY if e.name == name)
    pipe, _, settings = tiny_call(entry, guidance_scale=1.0, image_sizes=images)
    decode, decoded = pipe.vae.decode, []
    pipe.vae.decode = lambda z, *a, **k: decoded.append(tuple(z.shape[-2:])) or decode(z, *a, **k)
    pictures = [Image.new("RGB", (w, h), (90, 40, 160)) for h, w in images]
    call = dict(prompt=PROMPT, image=pictures if len(images) > 1 else pictures[0], num_inference_steps=1)
    with torch.no_grad(), count_flops({c: getattr(pipe, c) for c in entry.components}) as counts:
        pipe(**call, **entry.extra["runtime"].get("call", {}), output_type="np")
    real = {c: sum(counts.by_module.get(c, {}).values()) // 2 for c in entry.components}
    prompt = token_settings(entry, pipe)
    offline = profile(name, steps=1, guidance_scale=1.0, image_sizes=images, **prompt)
    assert macs_by_name(offline) == real
    scale = get_family(entry.family).vae_scale(entry)
    assert (offline.height, offline.width) == (decoded[0][0] * scale, decoded[0][1] * scale)
    assert any(
        note.startswith(f"output {offline.width}x{offline.height} (WxH): called without a size")
        for note in offline.notes
    )
    asked = profile(name, steps=1, guidance_scale=1.0, image_sizes=images, height=64, width=64, **prompt)
    assert (asked.height, asked.width) == (64, 64)


def test_qwen_image_edit_at_its_defaults():
    """A 1024x1024 edit: the vision tower reads 1036x1036 (74x74 patches, 1,369 tokens in the prompt), the transformer
    sees 4,096 noisy and 4,096 image tokens and 7 + 1,369 + the prompt's text tokens."""
    edit = profile("qwen-image-edit", prompt_tokens=20, guidance_scale=1.0, steps=1)
    assert edit.input_images == [(1024, 1024)]
    assert any("1369 image tokens" in note for note in edit.notes)
    assert any("4096 tokens beside the 4096 noisy-latent tokens" in note for note in edit.notes)
    text = {i.note: i for c in edit.components if c.name == "text_encoder" for i in c.invocations}
    assert any("vision tower over the 1036x1036 image" in note for note in text)
    plain = profile("qwen-image", prompt_tokens=20, guidance_scale=1.0, steps=1, height=1024, width=1024)
    assert edit.denoiser_macs_per_step > 2 * plain.denoiser_macs_per_step  # twice the image tokens, 1,376 more text


def test_refusals(cli):
    with pytest.raises(DiffmeterError, match="use --batch-size 1"):
        profile(NAME, batch_size=2)
    with pytest.raises(DiffmeterError, match="edits one input image"):
        profile(NAME, image_sizes=[(64, 64), (64, 64)])
    code, _, err = cli("profile", "qwen-image-edit", "--batch-size", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_bench_times_the_edit(tmp_path):
    """bench of the tiny edit: one output, the image encoding its own stage, the prompt encoding counting the vision
    tower."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    result, _ = bench(BenchSpec(model=NAME, image_sizes=["80x48"], iterations=1), out=tmp_path)
    assert result.status == "complete", result.error
    assert all(iteration.stages.image_encoding_s > 0 for iteration in result.iterations)
    assert result.profile.input_images[0][0] * result.profile.input_images[0][1] > 900_000  # the 1024x1024 area


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-qwenimage-edit-plus", "tiny-qwenimage-edit-2511"])
@pytest.mark.parametrize(("guidance", "images"), [(1.0, ((64, 64),)), (4.0, ((48, 80), (80, 48)))])
def test_an_edit_of_several_images_is_counted_exactly(name, guidance, images):
    """QwenImageEditPlusPipeline (Qwen-Image-Edit-2509, and 2511 whose transformer modulates the images' tokens at
    timestep 0): each image read by the vision tower at its 384x384-area size and VAE-encoded at its 1024x1024-area
    size, in order."""
    entry = next(e for e in TINY if e.name == name)
    pipe, real, settings, encoded, _ = counted_run(entry, guidance_scale=guidance, image_sizes=images)
    offline = profile(entry.name, **settings)
    assert type(pipe).__name__ == "QwenImageEditPlusPipeline"
    assert macs_by_name(offline) == real
    assert [shape[3:] for shape in encoded] == offline.input_images  # one encode per image, at the VAE's size
    vision = [i for c in offline.components if c.name == "text_encoder" for i in c.invocations if "vision" in i.note]
    assert len(vision) == (2 if guidance > 1 else 1)


def test_2511_modulates_the_input_images_apart():
    """zero_cond_t: the time embedding and every block's image modulation run on [t, 0], so 2511's step costs more
    than 2509's at the same sizes, by exactly those layers."""
    settings = {"image_sizes": ["1024x1024"], "prompt_tokens": 20, "guidance_scale": 1.0, "steps": 1}
    plus, zero = profile("qwen-image-edit-2509", **settings), profile("qwen-image-edit-2511", **settings)
    dim = 24 * 128
    extra = 256 * dim + dim * dim + 60 * dim * 6 * dim  # timestep MLP, then each block's img_mod, on one more row
    assert zero.denoiser_macs_per_step - plus.denoiser_macs_per_step == extra


@pytest.mark.parametrize(
    ("model", "args", "said"),
    [
        ("qwen-image-edit", ("--prompt-tokens", "2700"), "raised RuntimeError: Attempting to broadcast"),
        ("qwen-image-edit", ("--image-size", "10000x10"), "absolute aspect ratio must be smaller than 200"),
        ("qwen-image-edit-2511", ("--image-size", "10000x10"), "from input images 10000x10: its sizing raised"),
    ],
)
def test_settings_the_model_s_own_code_refuses_are_one_line(cli, model, args, said):
    """A prompt past the transformer's text positions and an image of aspect 1000:1 printed tracebacks (a new user's
    trial): the pipeline fails on them too, so one line saying what its code raised."""
    code, out, err = cli("profile", model, *args)
    assert code == 2 and said in err and "Traceback" not in out + err
