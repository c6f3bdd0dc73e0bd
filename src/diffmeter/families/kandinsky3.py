"""Kandinsky 3: UNet over FLAN-UL2 T5 tokens, decoded by a MoVQ VQ decoder."""

import torch

from diffmeter.families.base import Family, Shapes, latents, register


@register
class Kandinsky3(Family):
    name = "kandinsky3"
    reads_prompt_tokens = True
    masks_attention = True
    denoiser = "unet"
    decoder = "movq"
    text_encoders = ("text_encoder",)
    #: with no negative prompt the pipeline uses zero embeddings for the uncond half
    encodes_negative = False
    decoder_arg = "h"
    decoder_kwargs = {"force_not_quantize": True}

    def vae_scale(self, entry) -> int:
        return 8  # the pipeline's downscale_height_and_width uses a fixed factor of 8

    #: downscale_height_and_width rounds each side up to a multiple of 64 pixels
    size_rounding = "up"

    def size_multiple(self, entry) -> int:
        return 64

    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        return {"prompt_tokens": max(len(pipe.tokenizer(prompt).input_ids) for prompt in prompts)}

    def context_tokens(self, shapes: Shapes) -> int:
        """The pipeline cuts the context after the longest prompt's last token, plus one."""
        length = shapes.text_tokens["text_encoder"]
        if shapes.spec.prompt_tokens is None:
            shapes.note_prompt_upper_bound(
                f"the UNet context is cut after the prompt's tokens; assumed the full {length}"
            )
            return length
        return min(shapes.spec.prompt_tokens + 1, length)

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        tokens = self.context_tokens(shapes)
        return {
            "sample": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": torch.zeros(batch),
            "encoder_hidden_states": torch.zeros(batch, tokens, config["encoder_hid_dim"]),
            "encoder_attention_mask": torch.ones(batch, tokens),
            "return_dict": False,
        }
