"""A frame count off a video VAE's ``tk+1`` is what each pipeline makes of it: WanPipeline rounds it (up or down, to
``n // t * t + 1``), CogVideoXPipeline floors it through its latents; the profile counts, titles and rates the frames
the real pipeline makes, where it refused them before."""

import pytest
from tiny_runs import counted_run

from diffmeter import profile
from diffmeter.catalog import resolve


@pytest.mark.parametrize(
    ("name", "asked", "made", "said"),
    [
        ("tiny-wan", 8, 9, "WanPipeline rounds 8 frames to 9"),  # up: 8 // 4 * 4 + 1
        ("tiny-wan", 11, 9, "WanPipeline rounds 11 frames to 9"),  # down
        ("tiny-cogvideox", 12, 9, "CogVideoXPipeline takes 12 frames as 3 latent frames, decoded to 9"),
    ],
)
def test_a_frame_count_off_4k_plus_1_is_what_the_pipeline_makes(name, asked, made, said):
    entry = resolve(name).model_copy(deep=True)
    entry.defaults.num_frames = asked
    _, real, settings, _, output = counted_run(entry)
    offline = profile(name, **settings)
    assert output.frames.shape[1] == offline.num_frames == made
    assert {c.name: c.macs for c in offline.components} == real
    assert any(said in note for note in offline.notes)
