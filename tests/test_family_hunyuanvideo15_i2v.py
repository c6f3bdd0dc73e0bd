"""HunyuanVideo 1.5 image-to-video (HunyuanVideo15ImageToVideoPipeline): the tiny pipeline run for real under the
counter equals the offline profile per component, the image's bucket sets the video's size, the transformer costs
what text-to-video's does; refusals."""

import pytest
from tiny_runs import TINY, counted_run, macs_by_name

from diffmeter import profile
from diffmeter.errors import DiffmeterError
from diffmeter.tiny import tiny_pipeline

NAME = "tiny-hunyuanvideo15-i2v"


@pytest.mark.parametrize(("batch", "guidance", "image"), [(1, None, (48, 64)), (2, 1.0, (70, 40))])
def test_image_to_video_is_counted_exactly(batch, guidance, image):
    entry = next(e for e in TINY if e.name == NAME)
    pipe, real, settings, encoded, video = counted_run(
        entry, batch_size=batch, guidance_scale=guidance, image_sizes=(image,)
    )
    offline = profile(NAME, **settings)
    assert macs_by_name(offline) == real
    assert real["image_encoder"] > 0
    height, width = pipe.video_processor.calculate_default_height_width(*image, 64)
    assert (offline.height, offline.width) == (height, width)
    said = f"output {width}x{height} (WxH): HunyuanVideo15ImageToVideoPipeline.__call__ takes no size"
    assert offline.notes[0].startswith(said)  # the size rule first, with its lines
    assert encoded == [(1, 3, 1, height, width)]  # once per call, at the video's size
    assert video.frames.shape[2:4] == (height, width)


def test_the_transformer_costs_what_text_to_video_costs():
    edit = profile("hunyuanvideo15-480p-i2v", image_sizes=["848x480"], steps=1)
    plain = profile("hunyuanvideo15-480p-t2v", steps=1)
    assert edit.denoiser_macs_per_step == plain.denoiser_macs_per_step
    assert (edit.height, edit.width) == (480, 848)
    square = profile("hunyuanvideo15-480p-i2v", image_sizes=["1024x1024"], steps=1)
    assert (square.height, square.width) == (640, 640)  # the square bucket of target size 640


def test_refusals(tmp_path, cli, capsys):
    """A local folder has no catalog image, and the image sets the video's size: without one, one line, exit 2."""
    tiny_pipeline(next(e for e in TINY if e.name == NAME)).save_pretrained(tmp_path / "i2v")
    capsys.readouterr()  # save_pretrained's own progress
    code, _, err = cli("profile", str(tmp_path / "i2v"))
    assert code == 2 and "animates an image, whose aspect ratio sets the video's size" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(DiffmeterError, match="animates one image"):
        profile(NAME, image_sizes=[(48, 64), (48, 64)])
    with pytest.raises(DiffmeterError, match="takes no input image"):
        profile("tiny-hunyuanvideo15", image_sizes=[(48, 64)])


def test_bench_refuses_a_size_the_pipeline_does_not_take(cli, tmp_path):
    """The pipeline makes the bucket nearest the image's aspect ratio whatever --height/--width say: bench ran, named
    the run 128x128 and stored 64x48 videos (a new user's trial). Refused in one line, nothing written; without
    them the run is named at the size it makes."""
    asked = ("--image-size", "96x64", "--steps", "1", "--iterations", "1", "--out", tmp_path / "out")
    code, _, err = cli("bench", NAME, *asked, "--height", "128", "--width", "128")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert "--height/--width: HunyuanVideo15ImageToVideoPipeline.__call__ takes no size" in err and "64x48" in err
    code, _, err = cli("bench", NAME, *asked)
    (folder,) = (tmp_path / "out").iterdir()
    assert code == 0 and "+width-64+height-48+" in folder.name


def test_profile_refuses_a_size_the_pipeline_does_not_take_as_bench_does(cli):
    """profile counted 848x480 for --height 720 --width 1280 with a note only (a new user's trial); the size the
    pipeline makes itself is still taken."""
    code, _, err = cli("profile", NAME, "--image-size", "96x64", "--height", "128", "--width", "128")
    assert code == 2 and "--height/--width: HunyuanVideo15ImageToVideoPipeline.__call__ takes no size" in err
    code, _, err = cli("profile", NAME, "--image-size", "96x64", "--height", "48", "--width", "64")
    assert code == 0, err
