"""Wan 2.2 TI2V-5B animating an image: WanImageToVideoPipeline (``from_pipe`` of the same checkpoint) run for real
on the tiny pipeline under the counter, equal to the offline profile per component; refusals."""

import pytest
from tiny_runs import TINY, counted_run, macs_by_name

from diffmeter import profile
from diffmeter.errors import DiffmeterError


@pytest.mark.parametrize(("batch", "guidance"), [(1, None), (2, 1.0)])
def test_image_to_video_is_counted_exactly(batch, guidance):
    entry = next(e for e in TINY if e.name == "tiny-wan22-5b")
    pipe, real, settings, encoded, _ = counted_run(
        entry, batch_size=batch, guidance_scale=guidance, image_sizes=((40, 72),)
    )
    assert type(pipe).__name__ == "WanImageToVideoPipeline"
    offline = profile("tiny-wan22-5b", **settings)
    assert macs_by_name(offline) == real
    height, width = entry.defaults.height, entry.defaults.width
    assert encoded == [(1, 3, 1, height, width)]  # resized to the video, once per call: its latents repeated
    text_only = profile("tiny-wan22-5b", **{k: v for k, v in settings.items() if k != "image_sizes"})
    plain = {c.name: c.macs for c in text_only.components}
    assert macs_by_name(offline)["transformer"] == plain["transformer"]  # the transformer's calls are text-to-video's
    assert macs_by_name(offline)["vae"] > plain["vae"]


def test_text_only_wan_checkpoints_refuse_an_image():
    with pytest.raises(DiffmeterError, match="generates from text alone"):
        profile("tiny-wan", image_sizes=[(64, 64)])
    with pytest.raises(DiffmeterError, match="animates one image"):
        profile("tiny-wan22-5b", image_sizes=[(64, 64), (64, 64)])
