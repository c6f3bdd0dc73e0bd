"""Stable Diffusion 3 / 3.5: MMDiT over CLIP-L + CLIP-G (77 tokens each) and T5 tokens."""

import torch

from diffmeter.families import lora
from diffmeter.families.base import Family, Shapes, latents, register, timesteps


@register
class StableDiffusion3(Family):
    name = "sd3"
    max_sequence_limit = 512  # the pipeline's check_inputs refuses longer prompts
    flow_matching = True
    text_encoders = ("text_encoder", "text_encoder_2", "text_encoder_3")
    sequence_encoder = "text_encoder_3"

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.SD3

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # StableDiffusion3Pipeline: vae_scale_factor * patch_size

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        # the pipeline concatenates the 77 CLIP tokens with the T5 tokens (zeros if T5 is absent)
        text_tokens = shapes.text_tokens["text_encoder"] + shapes.text_tokens["text_encoder_3"]
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, text_tokens, config["joint_attention_dim"]),
            "pooled_projections": torch.zeros(batch, config["pooled_projection_dim"]),
            "return_dict": False,
        }
