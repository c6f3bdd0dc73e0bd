"""Saved pipelines of the classes diffmeter runs through the catalog (LTX image-to-video, ControlNet pipelines) and
a saved ControlNet given to ``--controlnet``: each folder, loaded and called for real under the counter, equals
`diffmeter profile FOLDER` per component, at batch 1 and 2, with and without guidance."""

import diffusers
import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, macs_by_name

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.catalog.controlnets import CONTROLNET, find_controlnet, with_controlnet
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline


def counted(pipe, components, **call) -> dict[str, int]:
    """MACs per component of one real call of ``pipe`` (one generator unless ``call`` gives them)."""
    call.setdefault("generator", torch.Generator().manual_seed(0))
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in components}) as counts:
        pipe(**call, num_inference_steps=2, output_type="np")
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in components}


@pytest.mark.parametrize(("batch", "guidance"), [(1, 3.0), (2, 1.0)])
def test_a_saved_ltx_image_to_video_pipeline_is_counted_as_it_runs(batch, guidance, tmp_path, cli, capsys):
    """LTXImageToVideoPipeline saved to a folder (once refused: "no diffmeter family describes"), called as bench
    calls it (an image and a generator per output, which it encodes per output: pipeline_ltx_image2video.py:541-544),
    counted exactly; without an image, one line."""
    tiny = resolve("tiny-ltx")
    diffusers.LTXImageToVideoPipeline.from_pipe(tiny_pipeline(tiny)).save_pretrained(tmp_path / "i2v")
    local = resolve(str(tmp_path / "i2v"))
    assert (local.family, local.pipeline_class) == ("ltx", "LTXImageToVideoPipeline")
    pipe = diffusers.LTXImageToVideoPipeline.from_pretrained(tmp_path / "i2v")
    pipe.set_progress_bar_config(disable=True)
    size = {"height": tiny.defaults.height, "width": tiny.defaults.width, "num_frames": tiny.defaults.num_frames}
    image = Image.new("RGB", (40, 24), (90, 40, 160))
    generators = [torch.Generator().manual_seed(k) for k in range(batch)]
    call = {"prompt": [PROMPT] * batch, "image": [image] * batch, "generator": generators, **size}
    real = counted(pipe, local.components, guidance_scale=guidance, **call)
    prompt = get_family(local.family).prompt_settings(pipe, [PROMPT])
    settings = {**size, "steps": 2, "batch_size": batch, "guidance_scale": guidance, **prompt}
    offline = profile(str(tmp_path / "i2v"), image_sizes=["40x24"], **settings)
    assert macs_by_name(offline) == real and real["vae"] > 0
    encode = next(c for c in offline.components if c.role == "image_encoder")
    assert encode.calls == batch
    capsys.readouterr()  # the saving and loading's own progress
    code, _, err = cli("profile", str(tmp_path / "i2v"))
    assert code == 2 and "animates an image: add --image-size" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DiffmeterError, match="animates an image"):
        profile(str(tmp_path / "i2v"), **settings)


@pytest.mark.slow
def test_a_saved_ltx2_image_to_video_pipeline_is_counted_as_it_runs(tmp_path):
    """LTX2ImageToVideoPipeline saved to a folder (once refused), called with its own defaults and an image, counted
    exactly (video, audio and their guidance passes included)."""
    tiny = resolve("tiny-ltx2")
    diffusers.LTX2ImageToVideoPipeline.from_pipe(tiny_pipeline(tiny)).save_pretrained(tmp_path / "i2v")
    local = resolve(str(tmp_path / "i2v"))
    assert (local.family, local.pipeline_class) == ("ltx2", "LTX2ImageToVideoPipeline")
    pipe = diffusers.LTX2ImageToVideoPipeline.from_pretrained(tmp_path / "i2v")
    pipe.set_progress_bar_config(disable=True)
    size = {"height": tiny.defaults.height, "width": tiny.defaults.width, "num_frames": tiny.defaults.num_frames}
    call = dict(tiny.extra["runtime"]["call"])  # the tiny entry's sequence length and guidance blocks
    image = Image.new("RGB", (40, 24), (90, 40, 160))
    real = counted(pipe, local.components, prompt=[PROMPT], image=[image], image_crf=0, **size, **call)
    prompt = get_family(local.family).prompt_settings(pipe, [PROMPT])
    settings = {**size, "steps": 2, "max_sequence_length": call["max_sequence_length"], **prompt}
    offline = profile(str(tmp_path / "i2v"), image_sizes=["40x24"], **settings)
    assert macs_by_name(offline) == real and real["vae"] > 0


def saved_controlnet_pipeline(base: str, controlnet: str, folder):
    """The tiny ControlNet pipeline of ``base`` steered by ``controlnet``, saved to ``folder``: its catalog entry."""
    entry = with_controlnet(resolve(base), controlnet)
    published = find_controlnet(controlnet).component()  # the pipeline completes what it completes itself
    tiny_pipeline(entry.model_copy(update={"components": {**entry.components, CONTROLNET: published}})).save_pretrained(
        folder
    )
    return entry


@pytest.mark.parametrize(
    ("base", "controlnet"),
    [
        ("tiny-sdxl", "tiny-controlnet-sdxl"),
        pytest.param("tiny-flux", "tiny-controlnet-flux", marks=pytest.mark.slow),
        pytest.param("tiny-sd3", "tiny-controlnet-sd35", marks=pytest.mark.slow),
        pytest.param("tiny-qwenimage", "tiny-controlnet-qwenimage", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize(("batch", "guided"), [(1, True), (2, False)])
def test_a_saved_controlnet_pipeline_is_counted_as_it_runs(base, controlnet, batch, guided, tmp_path):
    """StableDiffusionXLControlNetPipeline, FluxControlNetPipeline, StableDiffusion3ControlNetPipeline and
    QwenImageControlNetPipeline saved to folders (once refused as local folders): the folder's own ControlNet,
    counted exactly, and as the catalog's ControlNet on its base counts it."""
    entry = saved_controlnet_pipeline(base, controlnet, tmp_path / "steered")
    local = resolve(str(tmp_path / "steered"))
    assert (local.family, local.pipeline_class) == (entry.family, entry.pipeline_class)
    pipe = getattr(diffusers, local.pipeline_class).from_pretrained(tmp_path / "steered")
    pipe.set_progress_bar_config(disable=True)
    family = get_family(local.family)
    guidance = entry.defaults.guidance_scale if guided else 1.0
    size = {"height": entry.defaults.height, "width": entry.defaults.width}
    control = [Image.new("RGB", (size["width"], size["height"]), (90, 40 * k, 160)) for k in range(batch)]
    name = "image" if "StableDiffusion" in entry.pipeline_class and "3" not in entry.pipeline_class else "control_image"
    call = {**entry.extra["runtime"].get("call", {}), **entry.extra[CONTROLNET]["call"], name: control}
    arguments = {**call, **family.guidance_arguments(entry, guidance), **size}
    real = counted(pipe, local.components, prompt=[PROMPT] * batch, **arguments)
    settings = {**size, "steps": 2, "batch_size": batch, "guidance_scale": guidance}
    settings.update(family.prompt_settings(pipe, [PROMPT]))
    if "max_sequence_length" in call:  # the tiny entry's, which the folder's __call__ default (512) is not
        settings["max_sequence_length"] = call["max_sequence_length"]
    if "negative_prompt" in arguments:  # the tiny entry's (Qwen-Image's true CFG), not the model card's
        settings["negative_prompt_tokens"] = family.prompt_settings(pipe, [arguments["negative_prompt"]])[
            "prompt_tokens"
        ]
    offline = profile(str(tmp_path / "steered"), **settings)
    assert macs_by_name(offline) == real and real[CONTROLNET] > 0
    assert macs_by_name(profile(base, controlnet=controlnet, **settings)) == real
    assert offline.controlnet == str(tmp_path / "steered" / CONTROLNET)


def test_a_saved_controlnet_is_taken_by_controlnet(tmp_path, cli, capsys):
    """`--controlnet FOLDER`: a ControlNet saved by diffusers counts as the catalog's of the same config; a folder
    without a ControlNet config, or of a class diffmeter runs in no pipeline, is one line."""
    saved_controlnet_pipeline("tiny-sdxl", "tiny-controlnet-sdxl", tmp_path / "steered")
    capsys.readouterr()  # the saving's own progress
    folder = tmp_path / "steered" / CONTROLNET
    settings = {"steps": 2, "batch_size": 2}
    own = profile("tiny-sdxl", controlnet=str(folder), **settings)
    assert macs_by_name(own) == macs_by_name(profile("tiny-sdxl", controlnet="tiny-controlnet-sdxl", **settings))
    code, out, err = cli("profile", "tiny-sdxl", "--controlnet", str(folder))
    assert code == 0, err
    with pytest.raises(DiffmeterError, match="steers"):
        profile("tiny-sd3", controlnet=str(folder))
    for wrong in (tmp_path, tmp_path / "steered" / "vae"):
        code, _, err = cli("profile", "tiny-sdxl", "--controlnet", str(wrong))
        assert code == 2 and len(err.strip().splitlines()) == 1, err


def test_the_controlnet_call_options_are_taken_and_change_no_macs(tmp_path, cli):
    """--control-guidance-start/-end and --controlnet-conditioning-scale: the real call with them costs what
    `profile` says, the same as without (the ControlNet runs every step: pipeline_controlnet_sd_xl.py 1486-1492),
    and the profile says so; bench passes them to the call; what the pipelines refuse is one line."""
    options = {"control_guidance_start": 0.5, "control_guidance_end": 0.75, "controlnet_conditioning_scale": 0.4}
    saved_controlnet_pipeline("tiny-sdxl", "tiny-controlnet-sdxl", tmp_path / "steered")
    pipe = diffusers.StableDiffusionXLControlNetPipeline.from_pretrained(tmp_path / "steered")
    pipe.set_progress_bar_config(disable=True)
    entry = resolve("tiny-sdxl")
    size = {"height": entry.defaults.height, "width": entry.defaults.width}
    control = Image.new("RGB", (size["width"], size["height"]), (90, 40, 160))
    local = resolve(str(tmp_path / "steered"))
    real = counted(pipe, local.components, prompt=PROMPT, image=control, guidance_scale=5.0, **size, **options)
    settings = {**size, "steps": 2, "guidance_scale": 5.0, **get_family(local.family).prompt_settings(pipe, [PROMPT])}
    steered = profile("tiny-sdxl", controlnet="tiny-controlnet-sdxl", **settings, **options)
    assert macs_by_name(steered) == real
    assert macs_by_name(profile("tiny-sdxl", controlnet="tiny-controlnet-sdxl", **settings)) == real
    assert any("controlnet_conditioning_scale 0.4: no MACs change" in note for note in steered.notes)
    flags = [
        "--control-guidance-start",
        "0.5",
        "--control-guidance-end",
        "0.75",
        "--controlnet-conditioning-scale",
        "0.4",
    ]
    code, out, err = cli("profile", "tiny-sdxl", "--controlnet", "tiny-controlnet-sdxl", *flags)
    assert code == 0 and "no MACs change" in " ".join(out.split()), err
    refused = [
        (["tiny-sdxl", "--control-guidance-start", "0.5"], "runs none: add --controlnet"),
        (
            [
                "tiny-sdxl",
                "--controlnet",
                "tiny-controlnet-sdxl",
                "--control-guidance-start",
                "0.8",
                "--control-guidance-end",
                "0.5",
            ],
            "0 <= start < end <= 1",
        ),
        (
            ["tiny-z-image", "--controlnet", "tiny-controlnet-z-image", "--control-guidance-end", "0.5"],
            "takes no control_guidance_end",
        ),
    ]
    for arguments, said in refused:
        code, _, err = cli("profile", *arguments)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_bench_passes_the_controlnet_call_options(tmp_path):
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec
    from diffmeter.runs.workload import Workload

    spec = BenchSpec(
        model="tiny-sdxl",
        controlnet="tiny-controlnet-sdxl",
        control_guidance_end=0.5,
        controlnet_conditioning_scale=0.4,
        iterations=1,
        steps=2,
    )
    result, _ = bench(spec, out=tmp_path)
    assert result.status == "complete", result.error
    pipe = diffusers.StableDiffusionXLControlNetPipeline  # the class bench ran: its __call__ takes both
    workload = Workload(result.spec, with_controlnet(resolve("tiny-sdxl"), "tiny-controlnet-sdxl"))
    arguments = workload.call_arguments(pipe.__new__(pipe), workload.batch(0))
    assert (arguments["control_guidance_end"], arguments["controlnet_conditioning_scale"]) == (0.5, 0.4)
    assert "control_guidance_start" not in arguments


def test_runs_differing_only_in_the_controlnet_call_options_get_their_own_folders():
    """The options change the images, so a run with them never shares (or reuses) the folder of a run without."""
    from diffmeter.runs.spec import BenchSpec
    from diffmeter.runs.storage import run_name

    entry = with_controlnet(resolve("tiny-sdxl"), "tiny-controlnet-sdxl")
    plain = BenchSpec(model="tiny-sdxl", controlnet="tiny-controlnet-sdxl", steps=2, device="cpu").settle(entry)
    names = {
        run_name(plain.model_copy(update=options), entry)
        for options in (
            {},
            {"control_guidance_end": 0.5},
            {"control_guidance_start": 0.5},
            {"controlnet_conditioning_scale": 0.4},
        )
    }
    assert len(names) == 4
    assert "+control---0.5+" in run_name(plain.model_copy(update={"control_guidance_end": 0.5}), entry)
