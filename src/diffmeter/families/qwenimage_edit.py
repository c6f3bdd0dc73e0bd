"""Qwen-Image-Edit (QwenImageEditPipeline): Qwen-Image's MMDiT editing one input image.

What QwenImageEditPipeline (diffusers 0.42.1, pipeline_qwenimage_edit.py) does, and this family with it:

- the image is resized to the 1024x1024-area size of its aspect ratio, sides multiples of 32
  (``calculate_dimensions``, 155-162 and 624), for both encoders;
- the prompt is encoded with the image: Qwen2.5-VL's processor resizes it again to multiples of 28 pixels
  (``smart_resize``) and the vision tower reads it, once per encoded prompt (the negative prompt's encoding reads it
  again); its merged patches replace the template's ``<|image_pad|>`` and the language model runs over template,
  image and prompt tokens; the first 64 (the system turn) are dropped, the image's stay in the transformer's text;
- the VAE encodes the image once per generator as a one-frame video; its packed latents follow the noisy ones in
  every transformer call (``img_shapes`` lists both), as FLUX.1 Kontext's do.

The pipeline resizes one PIL image (``image_processor.resize``) and its processor pairs one image with each prompt:
one output per call.
"""

from __future__ import annotations

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import TEXT_ENCODER, Call, Shapes, register, timesteps
from diffmeter.families.host_masks import host_values
from diffmeter.families.images import ImageConditioned, note_tokens, single_image, vae_encode_calls
from diffmeter.families.qwenimage import QwenImage
from diffmeter.spec import size_text

#: QwenImageEditPipeline.prompt_template_encode_start_idx: the system turn, dropped after encoding
EDIT_DROPPED_TOKENS = 64
#: calculate_dimensions(1024 * 1024, ratio): the area both encoders see the image at
CONDITION_AREA = 1024 * 1024
#: the prompt tokens assumed when none is given: check_inputs' tokenizer_max_length (the processor truncates nothing)
PROMPT_UPPER_BOUND = 1024


@register
class QwenImageEdit(ImageConditioned, QwenImage):
    name = "qwenimage_edit"
    max_images = 1
    #: one prompt per call (batch 1): its text mask is all ones, which encode_prompt drops
    masks_attention = False

    # ---- the input image -----------------------------------------------------------------
    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        if not spec.image_sizes:
            raise DiffmeterError(f"{entry.name} ({entry.pipeline_class}) edits an image: add --image-size WxH")
        height, width = single_image(entry, spec, "edits one input image")
        self.refuse_batches(entry, spec)
        made_width, made_height, _ = calculate_dimensions(CONDITION_AREA, width / height)
        notes.append(
            f"input image {size_text((height, width))} resized to {made_width}x{made_height} (the 1024x1024-area size "
            "of its aspect ratio) for the VAE and for Qwen2.5-VL, whose processor resizes it again to multiples of 28 "
            "pixels (smart_resize) for the vision tower, which reads it with every prompt encoding"
        )
        return [(made_height, made_width)]

    def size_from_images(self, entry, spec) -> tuple[int, int, str]:
        """pipeline_qwenimage_edit.py:623-630 (diffusers 0.42.1): called without a size, the output is the
        1024x1024-area size of the first image's aspect ratio (``calculate_dimensions``), floored to multiples of
        vae_scale_factor * 2."""
        return self.area_size(entry, spec.image_sizes[0], "its input image's")

    def area_size(self, entry, image: tuple[int, int], whose: str) -> tuple[int, int, str]:
        """(height, width, why) of the output at ``image``'s aspect ratio and CONDITION_AREA pixels."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        width, height = calculate_dimensions(CONDITION_AREA, image[1] / image[0])[:2]
        step = self.size_multiple(entry)
        height, width = height // step * step, width // step * step
        return (
            height,
            width,
            f"output {width}x{height} (WxH): called without a size, {entry.pipeline_class} generates at {whose} "
            f"aspect ratio ({size_text(image)}) over about {CONDITION_AREA} pixels, sides multiples of {step} "
            "(--height/--width set another)",
        )

    def refuse_batches(self, entry, spec) -> None:
        if spec.batch_size > 1:
            raise DiffmeterError(
                f"{entry.pipeline_class} (diffusers 0.42.1) edits one output per call (it resizes one call's images "
                "and its processor pairs them with a single prompt): use --batch-size 1"
            )

    def condition_sizes(self, shapes: Shapes) -> list[tuple[int, int]]:
        """The sizes the vision tower's processor is given: the VAE's here."""
        return list(shapes.images)

    def vision_grids(self, shapes: Shapes) -> list[tuple[int, int, int]]:
        """The vision tower's (t, h, w) patch grid of each image: Qwen2VLImageProcessor.smart_resize to multiples of
        patch x merge pixels within the processor's pixel bounds."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # no torchvision

        vision = shapes.config("text_encoder")["vision_config"]
        processor = shapes.entry.extra["processor"]["value"]
        patch, merge = vision["patch_size"], vision["spatial_merge_size"]
        grids = []
        for height, width in self.condition_sizes(shapes):
            height, width = smart_resize(
                height, width, patch * merge, min_pixels=processor["min_pixels"], max_pixels=processor["max_pixels"]
            )
            grids.append((1, height // patch, width // patch))
        return grids

    def image_tokens_in_text(self, shapes: Shapes) -> int:
        """The merged patches that replace the ``<|image_pad|>`` tokens in the prompt's tokens."""
        merge = shapes.config("text_encoder")["vision_config"]["spatial_merge_size"]
        return sum(height * width // merge**2 for _, height, width in self.vision_grids(shapes))

    def picture_tokens(self, shapes: Shapes) -> int:
        """Tokens the images' placeholders add to the template beyond their patches: minus the template's own
        ``<|image_pad|>``, which the patches replace."""
        return -1

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """_encode_vae_image: one encode per generator (bench gives one per output), a one-frame video."""
        return vae_encode_calls(self, shapes, per_output=True, video=True)

    def image_arguments(self, entry, images: list[list]) -> dict:
        return {"image": images[0][0]}  # one PIL image: the pipeline resizes a single one

    # ---- text ----------------------------------------------------------------------------
    def encoder_tokens(self, shapes: Shapes, negative: bool = False) -> int:
        """The language model's tokens: the template (72 with one ``<|image_pad|>``), the image's merged patches in
        its place, and the prompt (never truncated)."""
        own = shapes.spec.negative_prompt_tokens if negative else shapes.spec.prompt_tokens
        if own is None and negative:
            own = shapes.entry.extra["negative_prompt_tokens"]["value"]
        if own is None:
            own = PROMPT_UPPER_BOUND
            shapes.note(  # no bound: a longer prompt runs longer, up to the transformer's text positions
                f"the processor never truncates a prompt: assumed {own} tokens, a long prompt's length but no upper "
                "bound; --prompt-tokens N counts a real prompt"
            )
        return self._template(shapes) + self.picture_tokens(shapes) + self.image_tokens_in_text(shapes) + own

    def negative_prompt_tokens(self, shapes: Shapes) -> int:
        images = self.picture_tokens(shapes) + self.image_tokens_in_text(shapes)
        return self.encoder_tokens(shapes, True) - self._template(shapes) - images

    def transformer_tokens(self, shapes: Shapes, negative: bool = False) -> int:
        return self.encoder_tokens(shapes, negative) - EDIT_DROPPED_TOKENS

    def text_calls(self, shapes: Shapes) -> list[Call]:
        """Each prompt encoding (the prompt's, and the negative prompt's with true CFG) runs the vision tower on the
        image, then the language model over the whole sequence."""
        calls = []
        for call in super().text_calls(shapes):
            calls += [self.vision_call(shapes, call.note.split(":")[0]), call]
        tokens = self.image_tokens_in_text(shapes)
        shapes.note(
            f"image in the prompt: {tokens} image tokens in each prompt encoding and in the transformer's text "
            "(the template's system turn, 64 tokens, is dropped; the image's stay)"
        )
        note_tokens(self, shapes, "input image latents", "packed like the noisy latents, after them")
        return calls

    def vision_call(self, shapes: Shapes, label: str) -> Call:
        """Qwen2.5-VL's vision tower through ``get_image_features``, its window and segment layout computed on the
        host by transformers' own helpers and handed in (transformers/vision_utils.py): the meta device cannot read a
        grid."""
        from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

        vision = shapes.config("text_encoder")["vision_config"]
        grids = self.vision_grids(shapes)
        merge, side = vision["spatial_merge_size"], vision["patch_size"]
        width = vision.get("in_channels", 3) * vision["temporal_patch_size"] * side**2  # the config's default: 3

        def build(device):
            window, windows = host_values(
                lambda: get_vision_window_index(torch.tensor(grids), merge, vision["window_size"], side)
            )
            return {
                "pixel_values": torch.zeros(sum(t * h * w for t, h, w in grids), width, device=device),
                "image_grid_thw": host_values(lambda: torch.tensor(grids)),
                "position_ids": host_values(lambda: get_vision_position_ids(torch.tensor(grids), merge)).to(device),
                "cu_seqlens": host_values(lambda: get_vision_cu_seqlens(torch.tensor(grids))),
                "window_index": window.to(device),
                "cu_window_seqlens": windows,
            }

        seen = " and ".join(f"{w * side}x{h * side}" for _, h, w in grids)
        return Call(
            "text_encoder",
            TEXT_ENCODER,
            1,
            1,
            build,
            method="get_image_features",
            note=f"{label}: the vision tower over the {seen} image{'s' if len(grids) > 1 else ''}",
            reads_values=True,
            kept=lambda output: (),  # merged into the prompt's embeddings, not kept
        )

    # ---- the denoiser --------------------------------------------------------------------
    def _builder(self, shapes: Shapes, batch: int, text_batch: int, text_tokens: int):
        def build(device):
            config = shapes.config(self.denoiser)
            height, width = shapes.latent_height // 2, shapes.latent_width // 2
            scale = self.pixel_multiple(shapes.entry)
            image = [(1, h // scale, w // scale) for h, w in shapes.images]
            tokens = height * width + sum(h * w for _, h, w in image)
            return {
                "hidden_states": torch.zeros(batch, tokens, config["in_channels"], device=device),
                "timestep": timesteps(batch, device),
                "encoder_hidden_states": torch.zeros(
                    text_batch, text_tokens, config["joint_attention_dim"], device=device
                ),
                "encoder_hidden_states_mask": None,
                "img_shapes": [[(1, height, width), *image]] * batch,
                "guidance": None,
                "return_dict": False,
            }

        return build
