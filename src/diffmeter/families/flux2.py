"""FLUX.2: an MMDiT over 2x2-patchified 128-channel latents, conditioned on stacked hidden states
of one LLM text encoder (FLUX.2 [dev]: Mistral Small 3.x; FLUX.2 [klein]: Qwen3).

Both pipelines pad the chat-formatted prompt to ``max_sequence_length`` (512) tokens and run the
whole ...ForConditionalGeneration / ...ForCausalLM forward (every layer and the ``lm_head`` logits),
then stack three intermediate hidden states ((10, 20, 30) for dev, (9, 18, 27) for klein) into
``3 * hidden_size`` = the transformer's ``joint_attention_dim``. Text compute therefore does not
depend on the prompt. [dev] is guidance-distilled (embedded guidance, one call per step); [klein]
runs real CFG (a second transformer call per step and the empty negative prompt encoded) unless
its ``model_index.json`` says ``is_distilled``.
"""

import math
from dataclasses import dataclass

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families import lora
from diffmeter.families.base import Call, Family, Shapes, register, timesteps
from diffmeter.families.images import ImageConditioned, note_tokens, packed_tokens, vae_encode_calls
from diffmeter.spec import size_text, sizes_text

#: Flux2ImageProcessor.check_image_input's limits, and the area Flux2Pipeline.__call__ shrinks a larger reference to
MIN_SIDE, MAX_ASPECT, MAX_AREA = 64, 8, 1024 * 1024


class _Flux2Base(ImageConditioned, Family):
    flow_matching = True
    #: reference images (``image``, a list shared by every prompt of the call): Flux2Pipeline and
    #: Flux2KleinPipeline.__call__ set no limit (diffusers 0.42.1), so neither does diffmeter
    max_images = None
    #: Flux2Pipeline / Flux2KleinPipeline warn and floor sides to multiples of vae_scale_factor * 2
    size_rounding = "down"
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    default_sample_size = 128  # Flux2Pipeline / Flux2KleinPipeline.default_sample_size
    # text calls: the base class's padded input_ids. The pipelines also pass the attention mask,
    # output_hidden_states=True and use_cache=False, none of which changes a matmul; passing use_cache=False
    # without a mask would make transformers probe for packed sequences with .item(), which meta cannot run.

    def patch(self, entry) -> int:
        return 2  # the pipeline patchifies latents 2x2 (32 -> 128 channels) before packing

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # vae_scale_factor * 2

    def guidance(self, batch: int, config: dict):
        return None

    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        """Flux2Pipeline / Flux2KleinPipeline.__call__ ("4. process images", diffusers 0.42.1): each reference is
        checked (Flux2ImageProcessor.check_image_input: sides of at least 64 px, aspect ratio at most 8), shrunk to
        1024 * 1024 pixels when larger (``_resize_to_target_area``: int() of each side times the square root of the
        area ratio), its sides floored to multiples of vae_scale_factor * 2, and centre-cropped there."""
        step, made = self.size_multiple(entry), []
        for height, width in spec.image_sizes:
            if min(height, width) < MIN_SIDE or max(width / height, height / width) > MAX_ASPECT:
                raise DiffmeterError(
                    f"--image-size {size_text((height, width))}: {entry.pipeline_class} refuses reference images with "
                    f"a side under {MIN_SIDE} px or an aspect ratio over {MAX_ASPECT}:1"
                )
            resized = (height, width)
            if width * height > MAX_AREA:
                scale = math.sqrt(MAX_AREA / (width * height))
                resized = (int(height * scale), int(width * scale))
            made.append((resized[0] // step * step, resized[1] // step * step))
        if made != list(spec.image_sizes):
            notes.append(
                f"{entry.pipeline_class} resizes the reference images {sizes_text(spec.image_sizes)} "
                f"(WxH) to {sizes_text(made)}: at most {MAX_AREA} pixels, sides floored to a multiple "
                f"of {step}"
            )
        return made

    def size_from_images(self, entry, spec) -> tuple[int, int, str]:
        """pipeline_flux2.py:904-905 and pipeline_flux2_klein.py:783-784 (diffusers 0.42.1): called without a size,
        the output takes the first reference's size as resized above (``height or image_height``)."""
        height, width = self.input_images(entry, spec, [])[0]
        return (
            height,
            width,
            f"output {width}x{height} (WxH): called without a size, {entry.pipeline_class} generates at its first "
            "reference image's size as it resizes it (--height/--width set another)",
        )

    def image_calls(self, shapes: Shapes) -> list[Call]:
        return vae_encode_calls(self, shapes, per_output=False)

    def image_arguments(self, entry, images: list[list]) -> dict:
        """The references go in once, a list shared by every prompt of the call: the first output's."""
        return {"image": images[0]}

    def shapes(self, entry, spec) -> Shapes:
        shapes = super().shapes(entry, spec)
        note_tokens(self, shapes, "reference images", "each image VAE-encoded once per call, shared by the batch")
        return shapes

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        image_tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2) + packed_tokens(self, shapes)
        text_tokens = shapes.text_tokens["text_encoder"]
        return {
            "hidden_states": torch.zeros(batch, image_tokens, config["in_channels"]),
            "encoder_hidden_states": torch.zeros(batch, text_tokens, config["joint_attention_dim"]),
            "timestep": timesteps(batch, device),
            "img_ids": torch.zeros(batch, image_tokens, 4),
            "txt_ids": torch.zeros(batch, text_tokens, 4),
            "guidance": self.guidance(batch, config),
            "return_dict": False,
        }


@register
class Flux2(_Flux2Base):
    """Flux2Pipeline (FLUX.2 [dev]): guidance embedded in the timestep embedding, never CFG."""

    name = "flux2"
    cfg_mode = "never"

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.flux2(48)

    def guidance(self, batch: int, config: dict):
        # the pipeline always passes guidance; the transformer embeds it when it has a guidance embedder
        # (Flux2Transformer2DModel's guidance_embeds defaults to True)
        return torch.zeros(batch) if config.get("guidance_embeds", True) else None


@dataclass
class _DistilledShapes(Shapes):
    """Shapes of a step-distilled klein: the pipeline ignores guidance_scale (no CFG at any scale)."""

    @property
    def cfg(self) -> bool:
        return False


@register
class Flux2Klein(_Flux2Base):
    """Flux2KleinPipeline: Qwen3 prompts, no guidance embedding; CFG as two sequential transformer calls
    per step (cond, then uncond on the encoded empty prompt) unless the pipeline is ``is_distilled``."""

    name = "flux2_klein"
    cfg_mode = "separate"

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.flux2(24)

    @staticmethod
    def is_distilled(entry) -> bool:
        return bool(entry.extra.get("pipeline_init", {}).get("is_distilled", False))

    def shapes(self, entry, spec):
        shapes = super().shapes(entry, spec)
        if not self.is_distilled(entry):
            return shapes
        if spec.guidance_scale > 1.0:
            shapes.note(
                f"{entry.name} is step-distilled (is_distilled): Flux2KleinPipeline ignores guidance_scale "
                f"{spec.guidance_scale:g} and runs no CFG"
            )
        return _DistilledShapes(**{name: getattr(shapes, name) for name in Shapes.__dataclass_fields__})
