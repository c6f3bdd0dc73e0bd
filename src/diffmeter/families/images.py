"""Input images: the calls that encode them, shared by the image-conditioned families (editing, image-to-video)."""

from __future__ import annotations

from dataclasses import replace

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.errors import DiffmeterError
from diffmeter.families.base import IMAGE_ENCODER, Call, Family, Shapes
from diffmeter.spec import ProfileSpec

#: what a pipeline that takes a single image does with it, for the refusal of more
FIRST_FRAME = "animates one image (the first frame)"


def vae_encode_calls(
    family: Family,
    shapes: Shapes,
    per_output: bool = True,
    video: bool = False,
    frames: int = 1,
    keeps_input: bool = True,
) -> list[Call]:
    """The VAE encoding each input image at batch 1: once per output where the pipeline encodes it per output
    (``per_output``: LTXImageToVideoPipeline.prepare_latents encodes ``image[i]`` for each), once per call where it
    encodes it once and repeats its latents for the outputs (``per_output=False``: FluxKontextPipeline, Flux2Pipeline,
    WanImageToVideoPipeline; diffusers 0.42.1). An RGB image, as the pipelines preprocess it; ``video``: as a video of
    ``frames`` frames, the image first (the others zeros: Wan 2.1 I2V encodes the whole video). ``keeps_input``:
    whether the pipeline keeps the preprocessed image to the end."""
    calls = []
    for index, (height, width) in enumerate(shapes.images):

        def build(device: torch.device, height=height, width=width) -> dict:
            return {"x": torch.zeros(1, 3, *((frames,) if video else ()), height, width, device=device)}

        label = f"input image {index + 1}, " if len(shapes.images) > 1 else ""
        calls.append(
            Call(
                family.decoder,
                IMAGE_ENCODER,
                1,
                shapes.spec.batch_size if per_output else 1,
                build,
                method="encode",
                note=f"{label}{width}x{height} (WxH), " + ("one per output" if per_output else "shared by the batch"),
                keeps_input=keeps_input,
            )
        )
    return calls


def single_image(entry, spec, does: str = FIRST_FRAME) -> tuple[int, int]:
    """The one input image (height, width) a pipeline takes; more are refused in one line naming what it ``does``."""
    if len(spec.image_sizes) > 1:
        raise DiffmeterError(f"{entry.name} {does}: pass one --image or --image-size")
    return spec.image_sizes[0]


def packed_tokens(family: Family, shapes: Shapes) -> int:
    """The input images' latent tokens, packed as the noisy latents are (VAE scale x patch pixels a side)."""
    side = family.pixel_multiple(shapes.entry)
    return sum((height // side) * (width // side) for height, width in shapes.images)


def note_tokens(family: Family, shapes: Shapes, what: str, detail: str) -> None:
    """Say how many tokens the images add beside the noisy latents' in every denoiser call."""
    if shapes.images:
        patch = family.patch(shapes.entry)
        noisy = (shapes.latent_height // patch) * (shapes.latent_width // patch)
        shapes.note(
            f"{what}: {packed_tokens(family, shapes)} tokens beside the {noisy} noisy-latent tokens in every "
            f"transformer call ({detail})"
        )


class ImageConditioned:
    """A family whose pipeline takes input images (mixed in before ``Family``): how bench hands them over, and the
    output size they set when no size is asked."""

    def size_from_images(self, entry, spec) -> tuple[int, int, str] | None:
        """(height, width, why) the pipeline generates at when called with ``spec.image_sizes`` and no size; None:
        its default size, as without images."""
        return None

    def takes_no_size(self, entry) -> str | None:
        """Why the pipeline's ``__call__`` takes no height or width (its input image sets the output's size), so an
        asked one would name a run by a size it never made; None where it takes one."""
        return None

    def shapes(self, entry, spec) -> Shapes:
        """The family's shapes, at the size the input images set where no size was asked (``size_from_defaults``)."""
        made = image_sized(self, entry, spec)
        if made is None:
            return super().shapes(entry, spec)
        shapes = super().shapes(entry, replace(spec, height=made[0], width=made[1]))
        shapes.notes.insert(0, made[2])
        return shapes

    def image_arguments(self, entry, images: list[list]) -> dict:
        """The ``__call__`` arguments for each output's input images (a list per output, in the pipeline's order):
        one ``image`` per prompt, as a list the pipeline batches like its prompts."""
        return {"image": [own[0] for own in images]}

    def takes_images(self, entry) -> bool:
        """Whether this checkpoint takes input images at all (TI2V-5B does, Wan's text-to-video ones do not)."""
        return True

    def seeded_call(self, pipe, arguments: dict) -> dict:
        """The call's ``arguments`` (one CPU generator per output, as bench passes them), rewritten where the
        pipeline would otherwise encode the one input image once per generator: none here."""
        return arguments

    def conditioned_pipeline(self, pipe):
        """The pipeline that takes the images, from the loaded one: itself, unless the checkpoint's own pipeline
        is text-only and another class runs it on images (Wan 2.2 TI2V-5B)."""
        return pipe


def size_kept(entry, spec, pipeline: str, cited: str) -> tuple[int, int, str]:
    """(height, width, why) for a ``pipeline`` that, called without a size, generates at its ``__call__`` default
    whatever the image and resizes the image to it (``cited``: where diffusers 0.42.1 does): the default size counted,
    said to be the pipeline's own or the model card's (which bench passes as height and width)."""
    from diffmeter.catalog.pipeline_defaults import call_defaults

    called = call_defaults(pipeline)
    own = (called.get("height"), called.get("width"))
    rule = f"{pipeline} generates at its __call__ default {own[1]}x{own[0]} whatever the image"
    if own == (spec.height, spec.width):
        why = f"called without a size, {rule}, the image resized to it"
    else:
        why = (
            f"{entry.name}'s default size, which bench passes (called without a size, {rule}); the image resized to it"
        )
    return (
        spec.height,
        spec.width,
        f"output {spec.width}x{spec.height} (WxH): {why} ({cited}; --height/--width set another)",
    )


def image_sized(family: Family, entry, spec) -> tuple[int, int, str] | None:
    """(height, width, why) where ``spec`` asks no size and its input images set the output's (a ControlNet
    pipeline's control image: ``control_image.ControlImage``); else None."""
    if not (spec.size_from_defaults and spec.image_sizes):
        return None
    if CONTROLNET in entry.components:
        return family.size_from_control_image(entry, spec)
    return family.size_from_images(entry, spec) if isinstance(family, ImageConditioned) else None


def refuse_no_image(family: Family, entry) -> None:
    """``--no-image`` refused, as ``--image-size`` is (``Family.input_images``), where the checkpoint takes no input
    image and runs no ControlNet (whose control image it leaves to the output size)."""
    takes = isinstance(family, ImageConditioned) and family.takes_images(entry)
    if not takes and CONTROLNET not in entry.components:
        raise DiffmeterError(
            f"{entry.name} ({entry.pipeline_class}) generates from text alone and takes no input image: drop --no-image"
        )
    if entry.defaults.image_sizes:  # the checkpoint's own call takes one: does its pipeline run without?
        called = ProfileSpec(model=entry.name).with_defaults(entry.defaults)
        family.shapes(entry, called)
        try:
            family.shapes(entry, replace(called, image_sizes=()))
        except DiffmeterError as refused:  # its own line asks for --image-size, which --no-image contradicts
            raise DiffmeterError(
                f"{entry.name} ({entry.pipeline_class}) cannot run without an input image: drop --no-image"
            ) from refused


def refuse_ignored_size(family: Family, entry, asked: tuple, spec: ProfileSpec) -> None:
    """``--height/--width`` refused (bench and profile alike) where the pipeline's ``__call__`` takes no size
    (``ImageConditioned.takes_no_size``): ``asked`` (height, width, None where not given) would be ignored; the line
    names the size the pipeline makes of ``spec``."""
    why = isinstance(family, ImageConditioned) and family.takes_no_size(entry)
    if why and any(asked):
        made = family.shapes(entry, spec).spec
        raise DiffmeterError(
            f"--height/--width: {why} ({made.width}x{made.height}, WxH, here): drop them, the run is named and counted "
            "at the size it makes"
        )
