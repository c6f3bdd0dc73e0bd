"""Image-conditioned pipelines saved to folders with ``save_pretrained``, loaded back and called for real under the
counter as their users call them, equal to `profile FOLDER` per component: the output size that follows the input
images when none is asked (FLUX.2, Qwen-Image-Edit), and one image encoded once for two prompts (Wan 2.1 I2V).
Elsewhere: -Edit-Plus's size from its last image in tests/test_family_qwenimage_edit.py, in memory (its "Picture i:"
tokens are counted with Qwen's real tokenizer, which a saved tiny folder lacks); Wan FLF2V's two images in
tests/test_family_wan21_i2v.py; FLUX.1 Kontext's one encode for two prompts in tests/test_family_flux_kontext.py (a
saved Kontext folder generates at its __call__'s max_area, 1024x1024, too big for a tiny transformer on a CPU)."""

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
    `profile FOLDER` counts it. At a size asked: the tiny transformer's RoPE cannot reach the folder's __call__
    default, 832x480."""
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
