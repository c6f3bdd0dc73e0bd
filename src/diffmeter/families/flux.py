"""FLUX.1: MMDiT with 2x2-packed latents, CLIP pooled + T5 sequence, guidance-distilled."""

import torch

from diffmeter.families.base import Family, Shapes, register, timesteps


@register
class Flux(Family):
    name = "flux"
    flow_matching = True
    #: FluxPipeline warns and generates at the multiple of 16 just below a size it cannot take
    size_rounding = "down"
    text_encoders = ("text_encoder", "text_encoder_2")
    sequence_encoder = "text_encoder_2"
    cfg_mode = "never"  # FLUX.1 embeds guidance; true CFG only with an explicit negative prompt

    def patch(self, entry) -> int:
        return 2  # the pipeline packs latents in 2x2 patches

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # FluxPipeline: vae_scale_factor * 2

    def default_size(self, entry) -> tuple[int, int]:
        side = 128 * self.vae_scale(entry)  # FluxPipeline.default_sample_size = 128
        return side, side

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        image_tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2)
        text_tokens = shapes.text_tokens["text_encoder_2"]
        return {
            "hidden_states": torch.zeros(batch, image_tokens, config["in_channels"]),
            "encoder_hidden_states": torch.zeros(batch, text_tokens, config["joint_attention_dim"]),
            "pooled_projections": torch.zeros(batch, config["pooled_projection_dim"]),
            "timestep": timesteps(batch, device),
            "img_ids": torch.zeros(image_tokens, 3),
            "txt_ids": torch.zeros(text_tokens, 3),
            "guidance": torch.zeros(batch) if config.get("guidance_embeds") else None,
            "return_dict": False,
        }
