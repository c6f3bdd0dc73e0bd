"""Image-conditioned pipelines saved to folders with ``save_pretrained``, loaded back and called for real under the
counter as their users call them, equal to `profile FOLDER` per component: the output size that follows the input
images when none is asked (FLUX.2, Qwen-Image-Edit), one image encoded once for two prompts (Wan 2.1 I2V), and the
default sizes of Wan I2V/FLF2V (480x832) and FLUX.1 Kontext (max_area) on folders whose tiny transformer and VAE
reach them. Elsewhere: -Edit-Plus's size from its last image in tests/test_family_qwenimage_edit.py, in memory (its
"Picture i:" tokens are counted with Qwen's real tokenizer, which a saved tiny folder lacks); Wan FLF2V's two images at
a size asked in tests/test_family_wan21_i2v.py."""

import json

import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, macs_by_name

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline


def counted(pipe, local, **call) -> tuple[dict[str, int], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """One real call of ``pipe`` at 2 steps: MACs per component, the shapes its VAE encoded and decoded."""
    seen = {"encode": [], "decode": []}
    for method in seen:
        own = getattr(pipe.vae, method)
        setattr(
            pipe.vae,
            method,
            lambda x, *a, own=own, log=seen[method], **k: log.append(tuple(x.shape)) or own(x, *a, **k),
        )
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in local.components}) as counts:
        pipe(**call, num_inference_steps=2, output_type="np")
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in local.components}
    return macs, seen["encode"], seen["decode"]


def pictures(sizes) -> list:
    return [Image.new("RGB", (w, h), (90, 40 * k % 256, 160)) for k, (h, w) in enumerate(sizes)]


@pytest.mark.parametrize(
    ("name", "images", "batch", "guidance", "size"),
    [
        ("tiny-flux2", [(72, 96)], 1, None, None),
        ("tiny-flux2-klein-base", [(66, 80), (64, 64)], 2, 4.0, None),
        ("tiny-flux2-klein-base", [(64, 64)], 2, 1.0, (32, 48)),
    ],
)
def test_a_saved_flux2_folder_generates_at_its_first_reference_size(name, images, batch, guidance, size, saved, cli):
    """Flux2Pipeline / Flux2KleinPipeline folders called without a size generate at the first reference's size as
    resized (pipeline_flux2.py:904-905, pipeline_flux2_klein.py:783-784), not the folder's default 256x256: `profile
    FOLDER` counts the same, per component, and says why; with a size asked, that size."""
    folder, local, pipe = saved(tiny_pipeline(resolve(name)), name)
    length = resolve(name).extra["runtime"]["call"]["max_sequence_length"]  # the tiny entry's, not __call__'s 512
    call = {"prompt": [PROMPT] * batch, "image": pictures(images), "max_sequence_length": length}
    call["generator"] = [torch.Generator().manual_seed(k) for k in range(batch)]
    settings = {"steps": 2, "batch_size": batch, "max_sequence_length": length}
    if guidance is not None:
        call["guidance_scale"] = settings["guidance_scale"] = guidance
    if size is not None:
        call.update(height=size[0], width=size[1])
        settings.update(height=size[0], width=size[1])
    real, encoded, decoded = counted(pipe, local, **call)
    offline = profile(str(folder), image_sizes=images, **settings)
    assert macs_by_name(offline) == real
    assert sum(real.values()) == offline.total_macs
    assert len(encoded) == len(images)  # each reference once, whatever the batch
    scale = get_family(local.family).vae_scale(local)
    assert (offline.height, offline.width) == (decoded[0][-2] * scale, decoded[0][-1] * scale)
    if size is None:
        assert (offline.height, offline.width) == offline.input_images[0] != (256, 256)
        code, out, err = cli("profile", str(folder), *[f"--image-size={w}x{h}" for h, w in images])
        line = " ".join(out.split())
        assert code == 0 and f"output {offline.width}x{offline.height} (WxH): called without a size" in line, err


@pytest.mark.parametrize(
    ("name", "images", "guidance", "size"),
    [
        ("tiny-qwenimage-edit", [(48, 80)], 1.0, None),
        ("tiny-qwenimage-edit", [(64, 64)], 4.0, (64, 96)),
    ],
)
def test_a_saved_qwen_image_edit_folder_generates_at_its_images_aspect_ratio(name, images, guidance, size, saved, cli):
    """QwenImageEditPipeline folders called without a size generate at the 1024x1024-area size of the image's
    aspect ratio (pipeline_qwenimage_edit.py:623-630); with true CFG the negative prompt's encoding reads the image
    again. Two outputs a call: one line (the pipeline pairs its processor's images with one prompt). The vision
    processor's pixel bounds are the folder's (processor/preprocessor_config.json), not the catalog's Qwen2.5-VL ones.
    The tiny processor cannot be saved whole (no video processor without torchvision): its image processor is, where
    a real folder keeps it."""
    made = tiny_pipeline(resolve(name))
    processor = made.processor
    made.register_modules(processor=None)
    folder, local, pipe = saved(made, name, processor=processor)
    processor.image_processor.save_pretrained(folder / "processor")
    local = resolve(str(folder))
    assert local.extra["processor"]["value"] == {"min_pixels": 3136, "max_pixels": 112 * 112}
    family = get_family(local.family)
    call = {"prompt": PROMPT, "image": pictures(images) if len(images) > 1 else pictures(images)[0]}
    call.update(family.guidance_arguments(resolve(name), guidance))
    call["generator"] = torch.Generator().manual_seed(0)
    settings = {"steps": 2, "guidance_scale": guidance, **family.prompt_settings(pipe, [PROMPT])}
    if "negative_prompt" in call:
        settings["negative_prompt_tokens"] = family.prompt_settings(pipe, [call["negative_prompt"]])["prompt_tokens"]
    if size is not None:
        call.update(height=size[0], width=size[1])
        settings.update(height=size[0], width=size[1])
    real, encoded, decoded = counted(pipe, local, **call)
    offline = profile(str(folder), image_sizes=images, **settings)
    assert macs_by_name(offline) == real
    assert sum(real.values()) == offline.total_macs
    assert [shape[-2:] for shape in encoded] == offline.input_images
    scale = family.vae_scale(local)
    assert (offline.height, offline.width) == (decoded[0][-2] * scale, decoded[0][-1] * scale)
    if size is None:
        assert offline.notes[0].startswith(f"output {offline.width}x{offline.height} (WxH): called without a size")
    code, _, err = cli("profile", str(folder), "--image-size", "64x64", "--batch-size", "2")
    assert code == 2 and "use --batch-size 1" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("batch", "guidance"), [(2, 5.0), (1, 1.0)])
def test_a_saved_wan_i2v_folder_encodes_one_image_once_for_every_prompt(batch, guidance, saved):
    """WanImageToVideoPipeline folder, one image and ``batch`` prompts with one generator, as a user calls it: the
    image read by CLIP and VAE-encoded once, its latents repeated (pipeline_wan_i2v.py:457-459), counted as
    `profile FOLDER` counts it, at a size asked (at the default size: the test below)."""
    tiny = resolve("tiny-wan-i2v")
    folder, local, pipe = saved(tiny_pipeline(tiny), "i2v")
    size = {"height": tiny.defaults.height, "width": tiny.defaults.width, "num_frames": tiny.defaults.num_frames}
    call = {"prompt": [PROMPT] * batch, "image": pictures([(24, 40)])[0], "guidance_scale": guidance, **size}
    real, encoded, _ = counted(pipe, local, generator=torch.Generator().manual_seed(0), **call)
    settings = {"steps": 2, "batch_size": batch, "guidance_scale": guidance, **size}
    settings.update(get_family(local.family).prompt_settings(pipe, [PROMPT]))
    offline = profile(str(folder), image_sizes=["40x24"], **settings)
    assert macs_by_name(offline) == real
    assert sum(real.values()) == offline.total_macs
    assert len(encoded) == 1
    rows = [c for c in offline.components if c.role == "image_encoder"]
    assert all((c.calls, c.batch_per_call) == (1, 1) for c in rows) and len(rows) == 2  # CLIP and the VAE


def retuned(entry, component: str, **config):
    """``entry`` with ``config`` over its ``component``'s (a saved folder's own config)."""
    part = entry.components[component]
    part = part.model_copy(update={"config": {**part.config, **config}})
    return entry.model_copy(update={"components": {**entry.components, component: part}})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "last", "batch", "guidance"),
    [
        ("tiny-wan-i2v", False, 1, 1.0),
        ("tiny-wan-i2v", False, 2, 5.0),
        ("tiny-wan-i2v-flf2v", True, 1, 1.0),
        ("tiny-wan-i2v-flf2v", True, 2, 5.0),
        ("tiny-wan22-i2v", False, 1, 1.0),
        ("tiny-wan22-i2v", False, 2, 5.0),
        ("tiny-wan22-i2v", True, 2, 5.0),
    ],
)
def test_a_saved_wan_i2v_folder_called_without_a_size_is_counted_at_its_default(name, last, batch, guidance, saved):
    """WanImageToVideoPipeline folders (Wan 2.1 I2V, FLF2V, Wan 2.2 I2V A14B) called without height and width make
    __call__'s 480x832 (pipeline_wan_i2v.py:517-518, diffusers 0.42.1), here of 5 frames to spare the CPU: one image
    (FLF2V, and Wan 2.2 if given: and a last frame) encoded once, counted as `profile FOLDER` counts it. The tiny
    transformers' RoPE tables hold 32 positions, 832 px makes 52 patches: the folders' reach 64 (the real ones' 1024).
    Wan 2.2 I2V (no CLIP) with a last frame was once refused; diffusers runs it (435-440)."""
    from diffmeter.families.wan_images import image_tokens

    entry = resolve(name.removesuffix("-flf2v"))
    for expert in ("transformer", "transformer_2")[: 1 + ("transformer_2" in entry.components)]:
        entry = retuned(entry, expert, rope_max_seq_len=64)
    if name.endswith("-flf2v"):  # the transformer's image embedder joins two images' CLIP tokens
        entry = retuned(entry, "transformer", pos_embed_seq_len=2 * image_tokens(entry))
    folder, local, pipe = saved(tiny_pipeline(entry), "i2v")
    images = [(24, 40), (48, 32)] if last else [(24, 40)]
    first, *rest = pictures(images)
    call = {"prompt": [PROMPT] * batch, "image": first, "guidance_scale": guidance, "num_frames": 5}
    if rest:
        call["last_image"] = rest[0]
    real, encoded, decoded = counted(pipe, local, generator=torch.Generator().manual_seed(0), **call)
    settings = {"steps": 2, "batch_size": batch, "guidance_scale": guidance, "num_frames": 5}
    settings.update(get_family(local.family).prompt_settings(pipe, [PROMPT]))
    offline = profile(str(folder), image_sizes=[f"{w}x{h}" for h, w in images], **settings)
    assert macs_by_name(offline) == real
    assert sum(real.values()) == offline.total_macs
    assert encoded == [(1, 3, 5, 480, 832)]  # one video, the first (and last) frame in it, at __call__'s size
    scale = get_family(local.family).vae_scale(local)
    assert (offline.height, offline.width) == (decoded[0][-2] * scale, decoded[0][-1] * scale) == (480, 832)
    assert decoded[0][0] == batch


@pytest.mark.parametrize(("batch", "true_cfg"), [(1, None), (2, None), (2, 2.0)])
def test_a_saved_kontext_folder_called_without_a_size_is_counted_at_its_max_area(batch, true_cfg, saved, cli):
    """FluxKontextPipeline folder called without height and width: the output is __call__'s default square
    (default_sample_size 128 x vae_scale_factor) re-fitted to max_area 1024x1024 (pipeline_flux_kontext.py:841-851),
    whatever the input's aspect ratio; the 600x800 (WxH) input is resized to the preferred Kontext resolution nearest
    its aspect ratio, floored to the multiple (936-944), and encoded once for both prompts (644-647). `profile FOLDER`
    counts the same per component, with true CFG too. The folder's VAE is the tiny one with four 8-channel levels:
    vae_scale_factor 8 as the real one's, so 1024x1024 is 4096 tokens (the tiny catalog VAE's 2 would make 65536)."""
    levels = {"down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4}
    entry = retuned(resolve("tiny-flux-kontext"), "vae", block_out_channels=[8] * 4, norm_num_groups=8, **levels)
    folder, local, pipe = saved(tiny_pipeline(entry), "kontext")
    call = {"prompt": [PROMPT] * batch, "image": Image.new("RGB", (600, 800), (90, 40, 160))}
    call["generator"] = [torch.Generator().manual_seed(k) for k in range(batch)]
    settings = {"steps": 2, "batch_size": batch}
    if true_cfg is not None:
        call.update(true_cfg_scale=true_cfg, negative_prompt=[""] * batch)
        settings["true_cfg_scale"] = true_cfg
    real, encoded, decoded = counted(pipe, local, **call)
    offline = profile(str(folder), image_sizes=["600x800"], **settings)
    assert macs_by_name(offline) == real
    assert sum(real.values()) == offline.total_macs
    assert [shape[-2:] for shape in encoded] == offline.input_images != [(800, 600)]  # once, resized
    scale = get_family(local.family).vae_scale(local)
    assert (offline.height, offline.width) == (decoded[0][-2] * scale, decoded[0][-1] * scale) == (1024, 1024)
    assert decoded[0][0] == batch
    assert any(note.startswith("FluxKontextPipeline resizes the 600x800 (WxH) input image") for note in offline.notes)
    if batch == 1:  # the command line as its user runs it: the same figures
        code, out, err = cli("profile", str(folder), "--image-size", "600x800", "--steps", "2", "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert shown["total_macs"] == sum(real.values()) and (shown["width"], shown["height"]) == (1024, 1024)
        by_name = {}
        for row in shown["components"]:
            by_name[row["name"]] = by_name.get(row["name"], 0) + row["macs"]
        assert by_name == real
