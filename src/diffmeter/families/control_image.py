"""The control image's size (``--image-size`` with a ControlNet) and the output size it sets, as each diffusers 0.42.1
ControlNet pipeline's ``__call__`` does when called without a height and width.

Every ControlNet pipeline resizes the control image to the output size before the ControlNet sees it (its
``prepare_image``), so the image's own size changes no compute but through the output size it may set."""

from __future__ import annotations

from dataclasses import replace

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Shapes
from diffmeter.families.images import image_sized
from diffmeter.spec import size_text

#: pipelines whose output takes the control image's size when called without one: ``height, width =
#: image.shape[-2:]`` after ``prepare_image``, whose ``control_image_processor.preprocess(image, height=None,
#: width=None)`` keeps the image's size floored to a multiple of the VAE's scale (image_processor.py 602-604)
FOLLOWS_IMAGE = {
    "StableDiffusionControlNetPipeline": "pipeline_controlnet.py:1149-1160",
    "StableDiffusionXLControlNetPipeline": "pipeline_controlnet_sd_xl.py:1311-1322",
}
#: pipelines that generate at their own default size whatever the control image, and resize the image to it
KEEPS_DEFAULT = {
    "FluxControlNetPipeline": "pipeline_flux_controlnet.py:831-832, 917-926",
    "StableDiffusion3ControlNetPipeline": "pipeline_stable_diffusion_3_controlnet.py:975-976, 1064-1075",
    "QwenImageControlNetPipeline": "pipeline_qwenimage_controlnet.py:637-638, 713-722",
    "ZImageControlNetPipeline": "pipeline_z_image_controlnet.py:499-500, 553-562",
}


def control_image(entry, spec) -> tuple[int, int]:
    """The one control image's (height, width); more are refused: diffmeter runs one ControlNet (no
    MultiControlNetModel), which takes one image per call."""
    if len(spec.image_sizes) > 1:
        raise DiffmeterError(
            f"{entry.name} with its ControlNet takes one control image (diffmeter runs a single ControlNet, not a "
            "MultiControlNetModel): pass one --image or --image-size"
        )
    return spec.image_sizes[0]


class ControlImage:
    """A family whose pipeline diffusers runs with a ControlNet (mixed in before ``Family``): with one, the input
    image (``--image-size``, ``--image``) is the control image, and sets the output size where the class does."""

    def size_from_control_image(self, entry, spec) -> tuple[int, int, str]:
        """(height, width, why) the pipeline generates at when called with the control image and no size."""
        height, width = control_image(entry, spec)
        pipeline = entry.pipeline_class
        if pipeline in FOLLOWS_IMAGE:
            step = self.vae_scale(entry)
            made = (height // step * step, width // step * step)
            if 0 in made:
                raise DiffmeterError(
                    f"--image-size {size_text((height, width))}: {pipeline} floors the control image to a multiple of "
                    f"{step} px (its VAE's scale) and refuses the empty image left: give at least {step}x{step}"
                )
            floored = "" if made == (height, width) else f", floored to a multiple of {step} px (the VAE's scale)"
            why = (
                f"called without a size, {pipeline} generates at the control image's size"
                f"{floored} ({FOLLOWS_IMAGE[pipeline]}, diffusers 0.42.1)"
            )
            return *made, f"output {size_text(made)} (WxH): {why}; --height/--width set another"
        own = self.default_size(entry)
        rule = f"{pipeline} generates at its default {size_text(own)} whatever the control image, resized to it"
        if own == (spec.height, spec.width):
            why = f"called without a size, {rule}"
        else:
            why = f"{entry.name}'s default size, which bench passes (called without a size, {rule})"
        cited = f"{KEEPS_DEFAULT[pipeline]}, diffusers 0.42.1"
        return spec.height, spec.width, f"output {spec.width}x{spec.height} (WxH): {why} ({cited})"

    def shapes(self, entry, spec) -> Shapes:
        """The family's shapes at the size the control image sets where none was asked; the image itself taken
        out of the input images (the ControlNet's calls see it at the output size)."""
        if CONTROLNET not in entry.components or not spec.image_sizes:
            return super().shapes(entry, spec)
        image = control_image(entry, spec)
        made = image_sized(self, entry, spec)
        size = {"height": made[0], "width": made[1]} if made else {}
        shapes = super().shapes(entry, replace(spec, image_sizes=(), **size))
        if made:
            shapes.notes.insert(0, made[2])
        elif image != (shapes.spec.height, shapes.spec.width):
            shapes.note(
                f"the control image, {size_text(image)} (WxH), is resized by the pipeline to the output size "
                f"{shapes.spec.width}x{shapes.spec.height} before the ControlNet sees it"
            )
        return shapes
