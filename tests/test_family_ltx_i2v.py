"""LTX-Video animating an image: LTXImageToVideoPipeline (``from_pipe`` of an LTXPipeline checkpoint) and
LTXConditionPipeline's image at frame 0, run for real on the tiny pipelines under the counter, equal to the offline
profile per component; the per-token timestep counted; refusals."""

import pytest
from tiny_runs import TINY, counted_run, macs_by_name

from diffmeter import profile
from diffmeter.errors import DiffmeterError


def counted(name, batch, guidance):
    """The real run's MACs per component, the offline profile's, the shapes the VAE encoded and the pipeline."""
    entry = next(e for e in TINY if e.name == name)
    pipe, real, settings, encoded, _ = counted_run(
        entry, batch_size=batch, guidance_scale=guidance, image_sizes=((40, 72),)
    )
    offline = profile(name, **settings)
    text_only = profile(name, **{k: v for k, v in settings.items() if k != "image_sizes"})
    return entry, pipe, real, offline, text_only, encoded


@pytest.mark.parametrize(("batch", "guidance"), [(1, 1.0), (2, 3.0)])
def test_image_to_video_pipeline_is_counted_exactly(batch, guidance):
    entry, pipe, real, offline, text_only, encoded = counted("tiny-ltx", batch, guidance)
    assert type(pipe).__name__ == "LTXImageToVideoPipeline"
    assert macs_by_name(offline) == real
    height, width = entry.defaults.height, entry.defaults.width
    assert encoded == [(1, 3, 1, height, width)] * batch  # resized to the video, one encode per generator
    plain = {c.name: c.macs for c in text_only.components}
    # the transformer embeds one timestep per token rather than one per video: more, and only that
    assert macs_by_name(offline)["transformer"] > plain["transformer"]
    assert any("timestep per token" in note for note in offline.notes)


@pytest.mark.parametrize(("batch", "guidance"), [(1, 1.0), (2, 3.0)])
def test_condition_pipeline_image_is_counted_exactly(batch, guidance):
    entry, pipe, real, offline, text_only, encoded = counted("tiny-ltx-condition", batch, guidance)
    assert type(pipe).__name__ == "LTXConditionPipeline"
    assert macs_by_name(offline) == real
    assert encoded == [(1, 3, 1, entry.defaults.height, entry.defaults.width)]  # one condition for the whole batch
    assert not any("counted as text-to-video" in note for note in offline.notes)


def test_per_token_timestep_is_the_time_embedding_per_token():
    """The extra transformer MACs are exactly the AdaLN-single time embedding run per token instead of per video."""
    with_image = profile("ltx-video", image_sizes=[(1080, 1920)], steps=1, guidance_scale=1.0)
    text = profile("ltx-video", steps=1, guidance_scale=1.0)
    config = next(c for c in with_image.components if c.name == "transformer")
    plain = next(c for c in text.components if c.name == "transformer")
    dim = 32 * 64  # LTX-Video 2B: 32 heads of 64
    per_token = 256 * dim + dim * dim + dim * 6 * dim  # timestep MLP (256 -> dim -> dim), then 6 AdaLN vectors
    tokens = 21 * 15 * 22  # its default 161 frames at 704x480: 21 x 15 x 22 latent tokens
    assert config.macs - plain.macs == (tokens - 1) * per_token


def test_ltx_refuses_two_images():
    with pytest.raises(DiffmeterError, match="animates one image"):
        profile("tiny-ltx", image_sizes=[(64, 64), (64, 64)])


@pytest.mark.parametrize(("batch", "guidance"), [(1, None), (2, 1.0)])
def test_ltx2_image_to_video_is_counted_exactly(batch, guidance):
    """LTX2ImageToVideoPipeline on tiny LTX-2 (from_pipe): with guidance its CFG, STG and modality calls all take the
    per-token timestep; the image is encoded once per output."""
    entry, pipe, real, offline, text_only, encoded = counted("tiny-ltx2", batch, guidance)
    assert type(pipe).__name__ == "LTX2ImageToVideoPipeline"
    assert macs_by_name(offline) == real
    assert encoded == [(1, 3, 1, entry.defaults.height, entry.defaults.width)] * batch
    plain = {c.name: c.macs for c in text_only.components}
    assert macs_by_name(offline)["transformer"] > plain["transformer"]


def test_without_a_size_the_video_keeps_its_default_size_and_says_why():
    """LTX(-2) image-to-video without a size: the default size whatever the image, which the pipeline resizes to it
    (pipeline_ltx_image2video.py:603-604, 773; pipeline_ltx2_image2video.py:990-991, 1364); `profile` says whose
    default it is: the pipeline's own, or the model card's that bench passes where they differ (ltx-video: 704x480,
    LTXImageToVideoPipeline alone 704x512)."""
    card = profile("ltx-video", image_sizes=["800x600"], steps=1)
    assert (card.width, card.height) == (704, 480) and card.input_images == [(480, 704)]
    assert card.notes[0].startswith(
        "output 704x480 (WxH): ltx-video's default size, which bench passes (called without a size, "
        "LTXImageToVideoPipeline generates at its __call__ default 704x512 whatever the image)"
    )
    own = profile("ltx-2", image_sizes=["800x600"], steps=1)
    assert (own.width, own.height) == (768, 512)
    assert own.notes[0].startswith(
        "output 768x512 (WxH): called without a size, LTX2ImageToVideoPipeline generates at its __call__ default "
        "768x512 whatever the image, the image resized to it"
    )
    asked = profile("ltx-video", image_sizes=["800x600"], steps=1, height=256, width=256)
    assert not any(note.startswith("output") for note in asked.notes)
