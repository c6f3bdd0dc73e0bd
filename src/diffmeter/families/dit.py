"""DiT: class-conditional ImageNet transformer; no text encoder."""

import torch

from diffmeter.families.base import Family, Shapes, latents, register, timesteps


@register
class DiT(Family):
    name = "dit"

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": timesteps(batch, device),
            "class_labels": torch.zeros(batch, dtype=torch.long),
            "return_dict": False,
        }
