"""Sizes mean one thing everywhere: the pipeline's own rule decides (refuse, or round and say so),
width follows height when only one is given, and every size is printed width x height."""

import inspect
import json
import re

import diffusers
import pytest
import torch
from tiny_runs import default_images, quick_or_slow

from diffmeter.catalog import all_entries
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.profile import profile
from diffmeter.tiny import tiny_pipeline

TINY = [entry for entry in all_entries() if entry.is_tiny and entry.family != "dit"]


def generated_latent_size(entry, height: int, width: int):
    """What the real pipeline does with a size: the decoder's latent height and width, or the
    exception it raises."""
    family = get_family(entry.family)
    pipe = tiny_pipeline(entry)
    decoder = getattr(pipe, family.decoder)
    decode, seen = decoder.decode, []

    def spy(*args, **kwargs):
        seen.append((args[0] if args else next(iter(kwargs.values()))).shape[-2:])
        return decode(*args, **kwargs)

    decoder.decode = spy
    arguments = dict(
        prompt="a cat",
        height=height,
        width=width,
        num_inference_steps=1,
        output_type="np",
        **family.guidance_arguments(entry, 1.0),
        **entry.extra["runtime"].get("call", {}),
    )
    if "use_resolution_binning" in inspect.signature(type(pipe).__call__).parameters:
        arguments["use_resolution_binning"] = False
    if entry.defaults.num_frames:
        arguments["num_frames"] = entry.defaults.num_frames
    arguments.update(default_images(entry))
    try:
        with torch.no_grad():
            pipe(**arguments)
    except Exception as error:  # the pipeline's refusal, whatever it raises
        return error
    return tuple(seen[0])


def takes_a_size(entry) -> bool:
    """Whether the pipeline's ``__call__`` takes a height (HunyuanVideo 1.5 I2V's image sets its size: its rule is
    held by tests/test_family_hunyuanvideo15_i2v.py)."""
    return "height" in inspect.signature(getattr(diffusers, entry.pipeline_class).__call__).parameters


@pytest.mark.parametrize("entry", quick_or_slow([e for e in TINY if takes_a_size(e)]))
def test_each_family_applies_its_pipelines_own_size_rule(entry):
    """For sizes on, between and off the family's multiple: diffmeter refuses exactly what the
    real pipeline refuses, and counts the size the real pipeline generates at."""
    family = get_family(entry.family)
    step = family.size_multiple(entry)
    base = entry.defaults.height
    for height, width in ((base, base), (base + 8, base), (base, base + 4), (base + step // 2, base + step)):
        real = generated_latent_size(entry, height, width)
        try:
            made_height, made_width, _ = family.pipeline_size(entry, height, width)
        except DiffmeterError:
            assert isinstance(real, Exception), f"{height}x{width}: refused, but the pipeline ran"
            continue
        assert not isinstance(real, Exception), f"{height}x{width}: accepted, but the pipeline raised {real!r}"
        scale = family.vae_scale(entry)
        assert (real[0] * scale, real[1] * scale) == (made_height, made_width)


def test_dit_makes_one_size_only(cli):
    code, _, err = cli("profile", "dit-xl-2-256", "--height", "384", "--width", "256")
    assert code == 2 and "generates 256x256 images only" in err and "Traceback" not in err
    code, _, err = cli("bench", "tiny-dit", "--height", "64")
    assert code == 2 and "images only" in err


def test_one_side_given_sets_both_in_every_command(cli, tmp_path):
    code, out, _ = cli("profile", "tiny-sd", "--height", "48", "--json")
    assert code == 0 and (json.loads(out)["height"], json.loads(out)["width"]) == (48, 48)
    code, out, err = cli("bench", "tiny-sd", "--height", "48", "--steps", "1", "--iterations", "1", "--out", tmp_path)
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    result = json.loads((folder / "results.json").read_text())
    assert (result["spec"]["height"], result["spec"]["width"]) == (48, 48)
    assert "width-48+height-48" in folder.name
    from diffmeter import profile

    assert (profile("tiny-sd", width=40).height, profile("tiny-sd", width=40).width) == (40, 40)


@pytest.mark.parametrize("command", ["profile", "bench"])
@pytest.mark.parametrize("size", ["0", "-512"])
def test_zero_and_negative_sizes_are_refused(cli, tmp_path, command, size):
    code, _, err = cli(command, "tiny-sd", "--height", size, *(["--out", tmp_path] if command == "bench" else []))
    assert code == 2 and "--height must be a positive integer" in err


def test_a_size_the_pipeline_refuses_is_refused_by_profile_and_bench_alike(cli, tmp_path):
    for command in ("profile", "bench"):
        code, _, err = cli(command, "tiny-sd", "--height", "36", *(["--out", tmp_path] if command == "bench" else []))
        assert code == 2 and "not a multiple of 8, which StableDiffusionPipeline requires" in err
    assert not any(tmp_path.iterdir())


def test_a_rounding_pipeline_is_counted_at_the_size_it_makes(cli):
    code, out, _ = cli("profile", "flux-dev", "--height", "1000", "--json")
    profile = json.loads(out)
    assert code == 0 and (profile["height"], profile["width"]) == (992, 992)
    assert any("generates 1000x1000 (WxH) at 992x992" in note for note in profile["notes"])


def test_a_side_a_rounding_pipeline_makes_zero_is_refused_for_what_the_pipeline_does(cli):
    """FluxPipeline does not require a multiple of 16 (--height 1000 runs at 992): 8 rounds down to 0 rows."""
    code, _, err = cli("profile", "flux-dev", "--height", "8")
    assert code == 2 and "FluxPipeline rounds each side down to a multiple of 16 pixels (8 -> 0)" in err
    assert "requires" not in err and err.strip().endswith("try 16")


def test_binned_sizes_are_marked_in_the_summary_table(cli):
    code, out, _ = cli("profile", "pixart-sigma-1024", "sd15", "--height", "768", "--width", "512", "--json")
    pixart, sd = json.loads(out)["profiles"]
    assert code == 0 and (sd["width"], sd["height"]) == (512, 768) and sd["requested_width"] is None
    assert (pixart["requested_width"], pixart["requested_height"]) == (512, 768)
    assert (pixart["width"], pixart["height"]) != (512, 768)
    code, out, _ = cli("profile", "pixart-sigma-1024", "sd15", "--height", "768", "--width", "512")
    binned = f"{pixart['width']}x{pixart['height']}"
    assert code == 0 and f"{binned} (asked 512x768)" in out and "size (WxH px)" in out and "px (WxH)" not in out


def _pipeline_refuses_sequences_longer_than(pipeline_class: str) -> int | None:
    """The limit a pipeline's check_inputs puts on max_sequence_length, read from its source."""
    limits = re.findall(r"max_sequence_length > (\d+):", inspect.getsource(getattr(diffusers, pipeline_class)))
    return int(limits[0]) if limits else None


@pytest.mark.parametrize(
    "entry", list({e.pipeline_class: e for e in all_entries()}.values()), ids=lambda e: e.pipeline_class
)
def test_each_family_refuses_the_sequence_lengths_its_pipeline_refuses(entry):
    family = get_family(entry.family)
    assert family.max_sequence_limit == _pipeline_refuses_sequences_longer_than(entry.pipeline_class)


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-sd3", "tiny-lumina2"])
def test_one_token_over_the_limit_is_refused_by_the_pipeline_and_by_diffmeter(name):
    entry = next(e for e in all_entries() if e.name == name)
    limit = get_family(entry.family).max_sequence_limit
    with pytest.raises(ValueError, match=f"cannot be greater than {limit}"):
        tiny_pipeline(entry)(prompt="a cat", num_inference_steps=1, max_sequence_length=limit + 1)
    with pytest.raises(DiffmeterError, match=f"refuses more than {limit} tokens; use at most {limit}"):
        profile(name, max_sequence_length=limit + 1)


def test_a_bench_a_rounding_pipeline_runs_at_another_size_says_so(cli, tmp_path):
    """A new user's trial: ``bench tiny-flux --height 33`` ran at 32x32, said nowhere (the pipeline only warns)."""
    from diffmeter.runs.storage import read_result

    code, out, _ = cli("bench", "tiny-flux", "--height", "33", "--iterations", "1", "--out", tmp_path)
    said = "FluxPipeline generates 33x33 (WxH) at 32x32: it rounds each side down to a multiple of 4 pixels"
    assert code == 0 and said in " ".join(out.split())
    (folder,) = tmp_path.iterdir()
    result = read_result(folder)
    assert said in result.notes and (result.spec.width, result.spec.height) == (32, 32)
    code, out, _ = cli("bench", "tiny-flux", "--height", "32", "--iterations", "1", "--out", tmp_path / "b")
    assert code == 0 and "generates" not in out


def test_fit_names_the_size_and_frames_it_fitted_as_profile_does(cli):
    """A new user's trial: `fit wan22-t2v-a14b` said "(40 steps, batch 1)", no size nor frames, which drive a video
    model's memory; the header has the size the pipeline makes (its rounding applied), as profile's does."""
    code, out, _ = cli("fit", "tiny-wan", "--memory", "8GB")
    assert code == 0 and "tiny-wan (16x16 px (WxH), 9 frames, 2 steps, batch 1) on" in " ".join(out.split())
    code, out, _ = cli("fit", "tiny-flux", "--height", "33", "--memory", "8GB")  # FLUX rounds down to 32
    assert code == 0 and "tiny-flux (32x32 px (WxH), 2 steps" in " ".join(out.split())
