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
from diffmeter.families.control_image import FOLLOWS_IMAGE
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline


def counted(pipe, components, **call) -> dict[str, int]:
    """MACs per component of one real call of ``pipe`` (one generator unless ``call`` gives them)."""
    call.setdefault("generator", torch.Generator().manual_seed(0))
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in components}) as counts:
        pipe(**call, num_inference_steps=2, output_type="np")
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in components}


@pytest.mark.parametrize(
    ("batch", "guidance", "sized"),
    [(1, 3.0, True), (2, 1.0, True), pytest.param(1, 1.0, False, marks=pytest.mark.slow)],
)
def test_a_saved_ltx_image_to_video_pipeline_is_counted_as_it_runs(batch, guidance, sized, saved, cli):
    """LTXImageToVideoPipeline saved to a folder (once refused: "no diffmeter family describes"), called as bench
    calls it (an image and a generator per output, which it encodes per output: pipeline_ltx_image2video.py:541-544),
    counted exactly; called without a size it generates at its __call__ default 704x512 whatever the image
    (603-604, the image resized to it: 773), as `profile` without a size counts and says; without an image, one
    line."""
    tiny = resolve("tiny-ltx")
    folder, local, pipe = saved(diffusers.LTXImageToVideoPipeline.from_pipe(tiny_pipeline(tiny)), "i2v")
    assert (local.family, local.pipeline_class) == ("ltx", "LTXImageToVideoPipeline")
    size = {"height": tiny.defaults.height, "width": tiny.defaults.width} if sized else {}
    size["num_frames"] = tiny.defaults.num_frames
    image = Image.new("RGB", (40, 24), (90, 40, 160))
    generators = [torch.Generator().manual_seed(k) for k in range(batch)]
    call = {"prompt": [PROMPT] * batch, "image": [image] * batch, "generator": generators, **size}
    real = counted(pipe, local.components, guidance_scale=guidance, **call)
    prompt = get_family(local.family).prompt_settings(pipe, [PROMPT])
    settings = {**size, "steps": 2, "batch_size": batch, "guidance_scale": guidance, **prompt}
    offline = profile(str(folder), image_sizes=["40x24"], **settings)
    assert macs_by_name(offline) == real and real["vae"] > 0
    encode = next(c for c in offline.components if c.role == "image_encoder")
    assert encode.calls == batch
    if not sized:
        assert (offline.width, offline.height) == (704, 512)
        said = "called without a size, LTXImageToVideoPipeline generates at its __call__ default 704x512"
        assert offline.notes[0].startswith("output 704x512 (WxH): " + said)
    code, _, err = cli("profile", str(folder))
    assert code == 2 and "animates an image: add --image-size" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DiffmeterError, match="animates an image"):
        profile(str(folder), **settings)


@pytest.mark.slow
def test_a_saved_ltx2_image_to_video_pipeline_is_counted_as_it_runs(saved):
    """LTX2ImageToVideoPipeline saved to a folder (once refused), called with its own defaults and an image, counted
    exactly (video, audio and their guidance passes included)."""
    tiny = resolve("tiny-ltx2")
    folder, local, pipe = saved(diffusers.LTX2ImageToVideoPipeline.from_pipe(tiny_pipeline(tiny)), "i2v")
    assert (local.family, local.pipeline_class) == ("ltx2", "LTX2ImageToVideoPipeline")
    size = {"height": tiny.defaults.height, "width": tiny.defaults.width, "num_frames": tiny.defaults.num_frames}
    call = dict(tiny.extra["runtime"]["call"])  # the tiny entry's sequence length and guidance blocks
    image = Image.new("RGB", (40, 24), (90, 40, 160))
    real = counted(pipe, local.components, prompt=[PROMPT], image=[image], image_crf=0, **size, **call)
    prompt = get_family(local.family).prompt_settings(pipe, [PROMPT])
    settings = {**size, "steps": 2, "max_sequence_length": call["max_sequence_length"], **prompt}
    offline = profile(str(folder), image_sizes=["40x24"], **settings)
    assert macs_by_name(offline) == real and real["vae"] > 0


def controlnet_pipeline(base: str, controlnet: str):
    """The tiny ControlNet pipeline of ``base`` steered by ``controlnet``, and its catalog entry."""
    entry = with_controlnet(resolve(base), controlnet)
    published = find_controlnet(controlnet).component()  # the pipeline completes what it completes itself
    return entry, tiny_pipeline(entry.model_copy(update={"components": {**entry.components, CONTROLNET: published}}))


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
def test_a_saved_controlnet_pipeline_is_counted_as_it_runs(base, controlnet, batch, guided, saved):
    """StableDiffusionXLControlNetPipeline, FluxControlNetPipeline, StableDiffusion3ControlNetPipeline and
    QwenImageControlNetPipeline saved to folders (once refused as local folders): the folder's own ControlNet,
    counted exactly, and as the catalog's ControlNet on its base counts it."""
    entry, made = controlnet_pipeline(base, controlnet)
    folder, local, pipe = saved(made, "steered")
    assert (local.family, local.pipeline_class) == (entry.family, entry.pipeline_class)
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
    offline = profile(str(folder), **settings)
    assert macs_by_name(offline) == real and real[CONTROLNET] > 0
    assert macs_by_name(profile(base, controlnet=controlnet, **settings)) == real
    assert offline.controlnet == str(folder / CONTROLNET)


@pytest.mark.parametrize(
    ("base", "controlnet"),
    [
        ("tiny-sdxl", "tiny-controlnet-sdxl"),
        ("tiny-sd", "tiny-controlnet-sd"),
        pytest.param("tiny-flux", "tiny-controlnet-flux", marks=pytest.mark.slow),
        pytest.param("tiny-sd3", "tiny-controlnet-sd35", marks=pytest.mark.slow),
        pytest.param("tiny-qwenimage", "tiny-controlnet-qwenimage", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize(("batch", "guided", "sized"), [(1, True, False), (2, False, False), (1, False, True)])
def test_a_controlnet_pipeline_called_without_a_size_is_counted_as_it_runs(
    base, controlnet, batch, guided, sized, saved, cli
):
    """`--image-size` with a ControlNet is the control image's size. Called without height and width, the SD(XL)
    ControlNet pipelines generate at the control image's size (pipeline_controlnet_sd_xl.py:1322), the others at
    their default size, resizing the image to it (pipeline_flux_controlnet.py:831-832 ...); with a size given, the
    image is resized to it. A non-square 48x40 control image, unlike any default: `profile FOLDER --image-size 48x40`
    equals the real call per component, and says the output size and why."""
    entry, made = controlnet_pipeline(base, controlnet)
    folder, local, pipe = saved(made, "steered")
    family = get_family(local.family)
    guidance = entry.defaults.guidance_scale if guided else 1.0
    size = {"height": entry.defaults.height, "width": entry.defaults.width} if sized else {}
    control = [Image.new("RGB", (48, 40), (90, 40 * k, 160)) for k in range(batch)]
    name = "image" if "StableDiffusion" in entry.pipeline_class and "3" not in entry.pipeline_class else "control_image"
    call = {**entry.extra["runtime"].get("call", {}), **entry.extra[CONTROLNET]["call"], name: control}
    arguments = {**call, **family.guidance_arguments(entry, guidance), **size}
    real = counted(pipe, local.components, prompt=[PROMPT] * batch, **arguments)
    settings = {**size, "steps": 2, "batch_size": batch, "guidance_scale": guidance}
    settings.update(family.prompt_settings(pipe, [PROMPT]))
    if "max_sequence_length" in call:
        settings["max_sequence_length"] = call["max_sequence_length"]
    if "negative_prompt" in arguments:
        settings["negative_prompt_tokens"] = family.prompt_settings(pipe, [arguments["negative_prompt"]])[
            "prompt_tokens"
        ]
    offline = profile(str(folder), image_sizes=["48x40"], **settings)
    assert macs_by_name(offline) == real and real[CONTROLNET] > 0
    follows = local.pipeline_class in FOLLOWS_IMAGE
    if sized:
        assert (offline.height, offline.width) == (size["height"], size["width"])
        assert any("the control image, 48x40 (WxH), is resized by the pipeline" in note for note in offline.notes)
    elif follows:
        assert (offline.width, offline.height) == (48, 40)
        said = f"output 48x40 (WxH): called without a size, {local.pipeline_class} generates at the control image's"
        assert offline.notes[0].startswith(f"{said} size ({FOLLOWS_IMAGE[local.pipeline_class]}")
        steered = profile(base, controlnet=controlnet, image_sizes=["48x40"], **settings)  # the catalog's, the same
        assert macs_by_name(steered) == real
    else:
        assert (offline.height, offline.width) == family.default_size(local) != (40, 48)
        said = f"generates at its default {offline.width}x{offline.height} whatever the control image"
        assert said in offline.notes[0]
    if not sized and batch == 1 and guided:
        code, out, err = cli("profile", folder, "--image-size", "48x40", "--steps", "2")
        assert code == 0 and f"output {offline.width}x{offline.height} (WxH): called without a size" in out, err


def test_every_controlnet_pipeline_has_its_size_rule():
    """Each ControlNet pipeline class the catalog runs is sized by the control image or by its default, not both."""
    from diffmeter.catalog.controlnets import all_controlnets
    from diffmeter.families.control_image import KEEPS_DEFAULT

    classes = {pipeline for known in all_controlnets() for pipeline in known.pipelines.values()}
    assert classes == set(FOLLOWS_IMAGE) | set(KEEPS_DEFAULT) and not set(FOLLOWS_IMAGE) & set(KEEPS_DEFAULT)


def test_the_control_image_size_the_sdxl_pipeline_floors_and_refuses(saved, cli):
    """StableDiffusionXLControlNetPipeline floors the control image (and a size given) to its VAE's scale and checks
    no multiple of 8 (prepare_image: image_processor.py 602-604): a 45x41 image makes a 44x40 image, --height 45 a
    44-pixel one, each counted as the real call runs; an image floored to nothing, or two control images for one
    ControlNet, are one line each."""
    entry, made = controlnet_pipeline("tiny-sdxl", "tiny-controlnet-sdxl")
    folder, local, pipe = saved(made, "steered")
    step = get_family(local.family).vae_scale(local)
    assert step == 2 and pipe.vae_scale_factor == step  # the sizes below are off its multiple and off 8
    prompt = get_family(local.family).prompt_settings(pipe, [PROMPT])
    image = Image.new("RGB", (45, 41), (90, 40, 160))
    for size in ({}, {"height": 45, "width": 42}):
        real = counted(pipe, local.components, prompt=PROMPT, image=image, guidance_scale=1.0, **size)
        found = profile(str(folder), image_sizes=["45x41"], steps=2, guidance_scale=1.0, **prompt, **size)
        assert macs_by_name(found) == real
        assert (found.width, found.height) == ((44, 40) if not size else (42, 44))
    said = "floored to a multiple of 2 px (the VAE's scale)"
    assert said in profile(str(folder), image_sizes=["45x41"], steps=2).notes[0]
    for arguments, error in [
        (["--image-size", "1x1"], "refuses the empty image left: give at least 2x2"),
        (["--image-size", "48x40", "--image-size", "32x32"], "takes one control image"),
    ]:
        code, _, err = cli("profile", folder, *arguments)
        assert code == 2 and error in err and len(err.strip().splitlines()) == 1, err


def test_bench_makes_the_control_image_at_the_image_size(tmp_path):
    """bench --image-size with a ControlNet: the control image it passes is of that size, and with no size asked the
    SDXL ControlNet pipeline's images come out at it, as `profile` counts them."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec
    from diffmeter.runs.workload import Workload

    spec = BenchSpec(model="tiny-sdxl", controlnet="tiny-controlnet-sdxl", image_sizes=["48x40"], iterations=1, steps=2)
    result, folder = bench(spec, out=tmp_path)
    assert result.status == "complete", result.error
    assert (result.spec.width, result.spec.height) == (48, 40)
    made = [Image.open(path).size for path in sorted((folder / "images").glob("*.png"))]
    assert made and set(made) == {(48, 40)}
    workload = Workload(result.spec, with_controlnet(resolve("tiny-sdxl"), "tiny-controlnet-sdxl"))
    pipe = diffusers.StableDiffusionXLControlNetPipeline
    arguments = workload.call_arguments(pipe.__new__(pipe), workload.batch(0))
    assert [image.size for image in arguments["image"]] == [(48, 40)]
    from rich.console import Console

    from diffmeter.report.run_table import run_table

    console = Console(width=200, record=True)
    console.print(run_table(result))  # its title names the ControlNet, as profile's does (only the folder did)
    assert "ControlNet tiny-controlnet-sdxl" in console.export_text()


def test_a_saved_controlnet_is_taken_by_controlnet(saved, cli):
    """`--controlnet FOLDER`: a ControlNet saved by diffusers counts as the catalog's of the same config; a folder
    without a ControlNet config, or of a class diffmeter runs in no pipeline, is one line."""
    steered = saved(controlnet_pipeline("tiny-sdxl", "tiny-controlnet-sdxl")[1], "steered")[0]
    folder = steered / CONTROLNET
    settings = {"steps": 2, "batch_size": 2}
    own = profile("tiny-sdxl", controlnet=str(folder), **settings)
    assert macs_by_name(own) == macs_by_name(profile("tiny-sdxl", controlnet="tiny-controlnet-sdxl", **settings))
    code, out, err = cli("profile", "tiny-sdxl", "--controlnet", str(folder))
    assert code == 0, err
    with pytest.raises(DiffmeterError, match="steers"):
        profile("tiny-sd3", controlnet=str(folder))
    for wrong in (steered.parent, steered / "vae"):
        code, _, err = cli("profile", "tiny-sdxl", "--controlnet", str(wrong))
        assert code == 2 and len(err.strip().splitlines()) == 1, err


def test_the_controlnet_call_options_are_taken_and_change_no_macs(saved, cli):
    """--control-guidance-start/-end and --controlnet-conditioning-scale: the real call with them costs what
    `profile` says, the same as without (the ControlNet runs every step: pipeline_controlnet_sd_xl.py 1486-1492),
    and the profile says so; bench passes them to the call; what the pipelines refuse is one line."""
    options = {"control_guidance_start": 0.5, "control_guidance_end": 0.75, "controlnet_conditioning_scale": 0.4}
    _, local, pipe = saved(controlnet_pipeline("tiny-sdxl", "tiny-controlnet-sdxl")[1], "steered")
    entry = resolve("tiny-sdxl")
    size = {"height": entry.defaults.height, "width": entry.defaults.width}
    control = Image.new("RGB", (size["width"], size["height"]), (90, 40, 160))
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
        (  # a new user's trial: accepted, and nan scales the residuals into nan images
            ["tiny-sdxl", "--controlnet", "tiny-controlnet-sdxl", "--controlnet-conditioning-scale", "nan"],
            "must be a finite number, got nan",
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
