"""Wan 2.1 I2V (WanImageToVideoPipeline checkpoints): the CLIP vision encoder, the VAE encoding a whole video and the
36-channel transformer with image cross-attention, run for real on the tiny pipeline under the counter and equal to
the offline profile per component; the real entries' sizes; a folder of such a pipeline without an image refused."""

import pytest
import torch
from tiny_runs import TINY, counted_run, macs_by_name, tiny_call, token_settings

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
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
    assert encoded == [(1, 3, frames, height, width)] * batch  # the whole video, once per generator
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
