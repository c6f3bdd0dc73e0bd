"""Qwen-Image-Edit-Plus (QwenImageEditPlusPipeline: Qwen-Image-Edit-2509 and -2511): several input images.

What QwenImageEditPlusPipeline (diffusers 0.42.1, pipeline_qwenimage_edit_plus.py) does beyond Qwen-Image-Edit:

- each image is resized twice (694-706): to its 384x384-area size for Qwen2.5-VL (``CONDITION_IMAGE_SIZE``) and to its
  1024x1024-area size for the VAE (``VAE_IMAGE_SIZE``), sides multiples of 32;
- the prompt is preceded by "Picture i: <|vision_start|><|image_pad|><|vision_end|>" per image (239-247), inside a
  template without an image of its own; the vision tower reads every image in one call per prompt encoding;
- every image is VAE-encoded once per generator and their packed latents follow the noisy ones, in order
  (``img_shapes`` lists each, 753-760).
"""

from __future__ import annotations

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Call, Shapes, register
from diffmeter.families.images import vae_encode_calls
from diffmeter.families.qwenimage_edit import QwenImageEdit
from diffmeter.spec import size_text

#: QwenImageEditPlusPipeline's CONDITION_IMAGE_SIZE and VAE_IMAGE_SIZE: the areas each image is resized to
CONDITION_AREA, VAE_AREA = 384 * 384, 1024 * 1024


@register
class QwenImageEditPlus(QwenImageEdit):
    name = "qwenimage_edit_plus"
    #: diffusers sets no limit; the model cards show one to three
    max_images = 8

    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions

        if not spec.image_sizes:
            raise DiffmeterError(f"{entry.name} ({entry.pipeline_class}) edits images: add --image-size WxH")
        if len(spec.image_sizes) > self.max_images:
            raise DiffmeterError(f"{len(spec.image_sizes)} input images: diffmeter counts at most {self.max_images}")
        self.refuse_batches(entry, spec)
        made = []
        for height, width in spec.image_sizes:
            made_width, made_height = calculate_dimensions(VAE_AREA, width / height)
            made.append((made_height, made_width))
        sizes = ", ".join(
            f"{size_text(given)} -> {w}x{h}" for given, (h, w) in zip(spec.image_sizes, made, strict=True)
        )
        notes.append(
            f"input images resized for the VAE to their 1024x1024-area sizes ({sizes}) and for Qwen2.5-VL's vision "
            "tower to their 384x384-area sizes, which it reads with every prompt encoding"
        )
        return made

    def size_from_images(self, entry, spec) -> tuple[int, int, str]:
        """pipeline_qwenimage_edit_plus.py:645-652 (diffusers 0.42.1): the last image's aspect ratio sets the output
        when no size is given (the same ``calculate_dimensions`` as -Edit's)."""
        return self.area_size(entry, spec.image_sizes[-1], "its last input image's")

    def condition_sizes(self, shapes: Shapes) -> list[tuple[int, int]]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions

        sizes = []
        for height, width in shapes.spec.image_sizes:
            made_width, made_height = calculate_dimensions(CONDITION_AREA, width / height)
            sizes.append((made_height, made_width))
        return sizes

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """_encode_vae_image per image, one encode per generator (prepare_latents, 456-480)."""
        return vae_encode_calls(self, shapes, per_output=True, video=True)

    def image_arguments(self, entry, images: list[list]) -> dict:
        return {"image": list(images[0])}  # the images in order, one call's

    def picture_tokens(self, shapes: Shapes) -> int:
        """The tokens of the images' placeholders beyond their patches: "Picture i: " and the three vision tokens,
        one of which the patches replace."""
        return len(shapes.images) * (shapes.entry.extra["picture_tokens"]["value"] - 1)
