"""Wan 2.1 I2V (WanImageToVideoPipeline checkpoints): the CLIP vision encoder, the VAE encoding a whole video and the
36-channel transformer with image cross-attention, run for real on the tiny pipeline under the counter and equal to
the offline profile per component; the real entries' sizes; a folder of such a pipeline without an image refused."""

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, TINY, counted_run, macs_by_name, tiny_call, token_settings

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.tiny import tiny_pipeline

ENTRY = next(e for e in TINY if e.name == "tiny-wan-i2v")


@pytest.mark.parametrize(("batch", "guidance"), [(1, None), (2, 1.0)])
def test_image_to_video_is_counted_exactly(batch, guidance):
    _, real, settings, encoded, _ = counted_run(
        ENTRY, batch_size=batch, guidance_scale=guidance, image_sizes=((24, 40),)
    )
    offline = profile("tiny-wan-i2v", **settings)
    assert macs_by_name(offline) == real
    frames, height, width = ENTRY.defaults.num_frames, ENTRY.defaults.height, ENTRY.defaults.width
    assert encoded == [(1, 3, frames, height, width)]  # the whole video, once per call: its latents repeated
    rows = {(c.name, c.role): c for c in offline.components}
    assert rows[("image_encoder", "image_encoder")].calls == 1  # the CLIP vision encoder, once per call


@pytest.mark.slow
def test_real_entries_hold_the_published_architecture():
    """Wan 2.1 I2V 14B: the T2V-14B transformer plus its image cross-attention (16.39B), CLIP ViT-H/14 (632M)."""
    low, high = profile("wan21-i2v-14b-480p"), profile("wan21-i2v-14b-720p")
    for found in (low, high):
        params = {c.name: c.params for c in found.components}
        assert params["transformer"] == 16_394_878_784 and params["image_encoder"] == 632_076_800
    assert (low.width, low.height, high.width, high.height) == (832, 480, 1280, 720)
    assert low.input_images == [(480, 832)]  # the catalog's image: any is resized to the video's size
    t2v = profile("wan21-t2v-14b", height=480, width=832)
    t2v_step = t2v.denoiser_macs_per_step
    assert low.denoiser_macs_per_step > t2v_step  # 257 image tokens in every cross-attention, 36 input channels
    assert low.denoiser_macs_per_step < 1.05 * t2v_step


def test_a_folder_without_an_image_is_refused(tmp_path, cli, capsys):
    """A local WanImageToVideoPipeline folder has no catalog image: without --image-size, one line, exit 2."""
    tiny_pipeline(ENTRY).save_pretrained(tmp_path / "i2v")
    capsys.readouterr()  # save_pretrained's own progress
    code, _, err = cli("profile", str(tmp_path / "i2v"))
    assert code == 2 and "animates an image: add --image-size" in err and len(err.strip().splitlines()) == 1
    for command in ("profile", "bench", "fit"):  # --no-image on a checkpoint that needs one: drop it, not add one
        code, _, err = cli(command, ENTRY.name, "--no-image", *(["--memory", "24GB"] if command == "fit" else []))
        said = f"{ENTRY.name} (WanImageToVideoPipeline) cannot run without an input image: drop --no-image"
        assert code == 2 and said in " ".join(err.split()) and len(err.strip().splitlines()) == 1, err
    tiny = {"height": 16, "width": 16, "num_frames": 9, "steps": 2}  # the folder's defaults are the pipeline's 832x480
    found = profile(str(tmp_path / "i2v"), image_sizes=["40x24"], **tiny)
    assert macs_by_name(found) == macs_by_name(profile("tiny-wan-i2v", image_sizes=["40x24"], **tiny))
    with pytest.raises(DiffmeterError, match="animates one image"):
        profile("tiny-wan-i2v", image_sizes=[(64, 64), (64, 64)])


def test_bench_times_the_image_encoding(tmp_path):
    result, folder = bench(BenchSpec(model="tiny-wan-i2v", iterations=2), out=tmp_path)
    assert result.status == "complete"
    assert all(iteration.stages.image_encoding_s > 0 for iteration in result.iterations)
    assert result.spec.image_sizes == [(ENTRY.defaults.height, ENTRY.defaults.width)]  # the catalog's default image
    assert resolve("tiny-wan-i2v").pipeline_class == result.model.pipeline_class


@pytest.mark.parametrize("name", ["tiny-wan-i2v", "tiny-wan22-i2v"])
def test_one_image_for_two_videos_is_encoded_once(name):
    """Two prompts and one image, called as a user does (one generator): WanImageToVideoPipeline encodes the image
    once and repeats its latents (pipeline_wan_i2v.py:457-459); the profile counts that, and bench's call (a
    generator per output, its noise handed over as ``latents`` by ``seeded_call``) runs the same and makes the same
    videos as the generator list would."""
    entry = next(e for e in TINY if e.name == name)
    pipe, call, settings = tiny_call(entry, batch_size=2, guidance_scale=1.0, image_sizes=((24, 40),))
    encode, encoded = pipe.vae.encode, []
    pipe.vae.encode = lambda x, *a, **k: encoded.append(tuple(x.shape)) or encode(x, *a, **k)
    image = Image.new("RGB", (40, 24), (90, 40, 160))
    user = dict(prompt=[PROMPT] * 2, image=image, height=settings["height"], width=settings["width"])
    user.update(num_frames=settings["num_frames"], num_inference_steps=settings["steps"], guidance_scale=1.0)
    components = {component: getattr(pipe, component) for component in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(**user, generator=torch.Generator().manual_seed(0), output_type="np")
    real = {component: sum(counts.by_module.get(component, {}).values()) // 2 for component in entry.components}
    offline = profile(name, **{**settings, **token_settings(entry, pipe)})
    assert macs_by_name(offline) == real
    assert len(encoded) == 1
    encode_row = next(c for c in offline.components if c.role == "image_encoder" and c.name == "vae")
    assert (encode_row.calls, encode_row.batch_per_call) == (1, 1)

    def generators():
        return [torch.Generator().manual_seed(k) for k in range(2)]

    with torch.no_grad():
        listed = pipe(**user, generator=generators(), output_type="np").frames
    encoded.clear()
    seeded = get_family(entry.family).seeded_call(pipe, {**user, "generator": generators(), "output_type": "np"})
    with torch.no_grad():
        assert len(encoded) == 0 and np.array_equal(pipe(**seeded).frames, listed)
    assert len(encoded) == 1  # bench's call: once, where the generator list alone encodes it twice


def test_wan22_experts_animate_without_an_image_encoder():
    """Wan 2.2 I2V A14B: two 36-channel experts, the image through its VAE latents alone (no CLIP)."""
    entry = next(e for e in TINY if e.name == "tiny-wan22-i2v")
    pipe, call, settings = tiny_call(entry, image_sizes=((24, 40),))
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in entry.components}) as counts:
        call()
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    offline = profile("tiny-wan22-i2v", **{**settings, **token_settings(entry, pipe)})
    assert macs_by_name(offline) == real and real["transformer"] > 0 and real["transformer_2"] > 0
    assert "image_encoder" not in macs_by_name(offline)
    real_entry = profile("wan22-i2v-a14b")
    params = {c.name: c.params for c in real_entry.components}
    assert params["transformer"] == params["transformer_2"] == 14_288_901_184


def test_wan22_i2v_takes_a_last_frame_as_diffusers_runs_it(cli):
    """Wan 2.2 I2V A14B has no CLIP: WanImageToVideoPipeline puts a ``last_image`` in the video its VAE encodes
    (pipeline_wan_i2v.py:435-440, diffusers 0.42.1) and runs; once refused ("animates one image"), counted now. More
    than two images is one line."""
    entry = next(e for e in TINY if e.name == "tiny-wan22-i2v")
    pipe, _, settings = tiny_call(entry, image_sizes=((24, 40),))
    encode, encoded = pipe.vae.encode, []
    pipe.vae.encode = lambda x, *a, **k: encoded.append(tuple(x.shape)) or encode(x, *a, **k)
    first, last = Image.new("RGB", (40, 24), (90, 40, 160)), Image.new("RGB", (32, 48), (10, 140, 60))
    call = {"prompt": PROMPT, "image": first, "last_image": last, "num_inference_steps": settings["steps"]}
    call.update({key: settings[key] for key in ("height", "width", "num_frames")})
    call.update(get_family(entry.family).guidance_arguments(entry, settings["guidance_scale"]))
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in entry.components}) as counts:
        pipe(**call, output_type="np")
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    settings.update(image_sizes=["40x24", "32x48"], **token_settings(entry, pipe))
    offline = profile("tiny-wan22-i2v", **settings)
    assert macs_by_name(offline) == real
    assert encoded == [(1, 3, settings["num_frames"], settings["height"], settings["width"])]
    code, _, err = cli("profile", "tiny-wan22-i2v", *["--image-size=40x24"] * 3)
    assert code == 2 and "pass --image-size once or twice" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("batch", "guidance"), [(1, 5.0), (2, 1.0)])
def test_first_and_last_frame_to_video_is_counted_exactly(batch, guidance, saved, cli):
    """An FLF2V checkpoint (a transformer whose image embedder joins two images' CLIP tokens, ``pos_embed_seq_len``),
    saved to a folder and called with ``image`` and ``last_image``: CLIP reads both at once (pipeline_wan_i2v.py:703),
    the VAE encodes one video with both frames (431-440), counted exactly; one image is one line."""
    from diffmeter.families.wan_images import image_tokens

    transformer = ENTRY.components["transformer"]
    joined = transformer.model_copy(
        update={"config": {**transformer.config, "pos_embed_seq_len": 2 * image_tokens(ENTRY)}}
    )
    flf2v = ENTRY.model_copy(update={"components": {**ENTRY.components, "transformer": joined}})
    folder, _, pipe = saved(tiny_pipeline(flf2v), "flf2v")
    encode, encoded = pipe.vae.encode, []
    pipe.vae.encode = lambda x, *a, **k: encoded.append(tuple(x.shape)) or encode(x, *a, **k)
    first, last = Image.new("RGB", (40, 24), (90, 40, 160)), Image.new("RGB", (32, 48), (10, 140, 60))
    size = {"height": ENTRY.defaults.height, "width": ENTRY.defaults.width, "num_frames": ENTRY.defaults.num_frames}
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            prompt=[PROMPT] * batch,
            image=first,
            last_image=last,
            num_inference_steps=2,
            guidance_scale=guidance,
            output_type="np",
            generator=torch.Generator().manual_seed(0),
            **size,
        )
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    settings = {**size, "steps": 2, "batch_size": batch, "guidance_scale": guidance, **token_settings(ENTRY, pipe)}
    offline = profile(str(folder), image_sizes=["40x24", "32x48"], **settings)
    assert macs_by_name(offline) == real
    assert encoded == [(1, 3, size["num_frames"], size["height"], size["width"])]
    clip = next(c for c in offline.components if c.name == "image_encoder")
    assert (clip.calls, clip.batch_per_call) == (1, 2)
    code, _, err = cli("profile", str(folder), "--image-size", "40x24")
    assert code == 2 and "pass --image-size twice" in err and len(err.strip().splitlines()) == 1, err


def test_the_flf2v_entry_is_the_i2v_model_with_the_two_images_position_embedding(cli):
    """wan21-flf2v-14b-720p: the I2V 720p components (the converter builds FLF2V with them), its transformer one
    (1, 514, 1280) position embedding more; its catalog call animates two images (CLIP reads both in one call, each
    image's 257 tokens in every cross-attention), and one image is one line."""
    flf2v, i2v = resolve("wan21-flf2v-14b-720p"), resolve("wan21-i2v-14b-720p")
    assert flf2v.pipeline_class == i2v.pipeline_class
    for name in ("text_encoder", "image_encoder", "vae"):
        assert flf2v.components[name] == i2v.components[name]
    assert flf2v.components["transformer"].config == {**i2v.components["transformer"].config, "pos_embed_seq_len": 514}
    both, one = profile("wan21-flf2v-14b-720p", steps=1), profile("wan21-i2v-14b-720p", steps=1, guidance_scale=5.5)
    params = {c.name: c.params for c in both.components}
    assert params["transformer"] - {c.name: c.params for c in one.components}["transformer"] == 514 * 1280
    assert both.input_images == [(720, 1280), (720, 1280)]
    clip = next(c for c in both.components if c.name == "image_encoder")
    assert (clip.calls, clip.batch_per_call) == (1, 2)
    assert both.denoiser_macs_per_step > one.denoiser_macs_per_step  # 514 image tokens in cross-attention, not 257
    code, _, err = cli("profile", "wan21-flf2v-14b-720p", "--image-size", "1280x720")
    assert code == 2 and "pass --image-size twice" in err and len(err.strip().splitlines()) == 1, err
